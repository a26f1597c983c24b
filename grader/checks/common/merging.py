"""Judges of results put together from parts (chapter 11): attention over a partition of the
keys, merged by log-sum-exp, and the W steps of a ring, merged.

Both judge the student's outputs against each other or against attention computed here,
in float64: the template has no reference, so the few lines of attention and of the merge
they need are written out below (the course's own are :func:`attnmask.attention_lse` and
:func:`attnmask.merge_partials`).
"""

from __future__ import annotations

import math

import torch

from ... import diagnose as dg
from ... import errors
from ...spec import Call, Outcome, Verdict
from . import live_memory as _live_memory  # noqa: F401 -- registers its judge factory where merging is
from .default_device import then
from .judges import Recipe, float_dtype, inputs_of, raised, rebuildable

#: merge_partials' two numeric failures, named from where the NaN and inf sit (here, not in the
#: chapter's module, so that the student template names them too: :data:`nan_reasons.NAN_REASONS`).
MERGE_NAN_EMPTY = ("NaN where both parts are empty: with both lse minus infinity, exp(lse1 - lse) is "
                   "the exp of infinity minus infinity, NaN. Shift by zero where the larger lse is minus "
                   "infinity, and return out zero and lse minus infinity for such rows.")
MERGE_OVERFLOW = ("exp(lse) overflows to infinity (or underflows to zero) once |lse| passes a few dozen in "
                  "single precision: "
                  "subtract the larger lse first, m = max(lse1, lse2), "
                  "lse = m + log(exp(lse1 - m) + exp(lse2 - m)).")


def merge_nan_reason(args: tuple, kwargs: dict, got: torch.Tensor) -> str | None:
    """Why ``got`` (merge_partials' out or lse) is NaN or infinite where it must be finite, read off
    the rows where it is: rows with both parts empty, or rows with a large |lse|."""
    _, lse1, _, lse2 = args[:4]
    l1, l2 = lse1.double(), lse2.double()
    bad = ~torch.isfinite(got) if got.shape == lse1.shape else ~torch.isfinite(got).all(dim=-1)
    both_empty = torch.isneginf(l1) & torch.isneginf(l2)
    if got.shape == lse1.shape:
        bad = bad & ~(torch.isneginf(got) & both_empty)
    if not bool(bad.any()):
        return None
    if bool((bad <= both_empty).all()):
        return MERGE_NAN_EMPTY
    big = torch.maximum(l1.nan_to_num(neginf=0.0).abs(), l2.nan_to_num(neginf=0.0).abs()) > 80
    return MERGE_OVERFLOW if bool((bad <= (both_empty | big)).all()) else None


def attend64(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (..., Lq, dv), lse (..., Lq)) of masked attention in float64; 0 and -inf on empty rows."""
    s = (q.double() @ k.double().mT / math.sqrt(q.shape[-1])).masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # -inf on empty rows
    w = torch.exp(s - lse.nan_to_num(neginf=0.0)[..., None]).nan_to_num(0.0)
    return w @ v.double(), lse


def merge64(out1, lse1, out2, lse2) -> tuple[torch.Tensor, torch.Tensor]:
    """Two partial results over disjoint keys, merged in float64 (0 and -inf where both are empty)."""
    l1, l2 = lse1.double(), lse2.double()
    lse = torch.logaddexp(l1, l2)
    safe = lse.nan_to_num(neginf=0.0)
    w1, w2 = torch.exp(l1 - safe), torch.exp(l2 - safe)  # exp(-inf) = 0 where a part is empty
    return w1[..., None] * out1.double() + w2[..., None] * out2.double(), lse


def _pair(outcome: Outcome, recipe: Recipe) -> tuple[tuple | None, str]:
    got, msg = dg.unpack(outcome.output, recipe.out_names)
    if msg:
        return None, msg
    if not all(isinstance(t, torch.Tensor) and t.dtype.is_floating_point for t in got):
        return None, f"{recipe.name} must return two floating tensors (out, lse)"
    return got, ""


@rebuildable
def partition_judge(recipe: Recipe, what: str):
    """Calls come in triples (all keys, part A, part B) of ``attention_lse`` over the same
    queries, A and B a partition of the keys: the student's two partial results merged by
    their log-sum-exps must equal the student's result over all keys. ``what``: the message."""

    def judge(calls: list[Call], outcomes: list[Outcome]) -> Verdict:
        for i in range(0, len(calls) - 2, 3):
            inputs = inputs_of(recipe, calls[i])
            for o in outcomes[i:i + 3]:
                if o.error is not None:
                    return raised(o.error, inputs)
            parts = [_pair(o, recipe) for o in outcomes[i:i + 3]]
            for got, msg in parts:
                if got is None:
                    return dg.fail(msg, f"inputs: {inputs}")
            (full_out, full_lse), a, b = (p[0] for p in parts)
            try:
                out, lse = merge64(*a, *b)
            except RuntimeError as e:
                return dg.fail(f"the partial results cannot be merged: {e}"[:300], f"inputs: {inputs}")
            dtype = float_dtype(calls[i])
            for name, got, want in (("lse", lse, full_lse), ("out", out, full_out)):
                if not dg.close(got, want.double(), dtype):
                    return dg.fail(what, "your out and lse over two parts of the keys, merged "
                                   "(got), against yours over all keys (expected):\n"
                                   + dg.number_detail(got, want.double(), dtype, name, inputs))
        return dg.PASS

    return dg.judged(judge)


def zigzag_positions(L: int, world: int, rank: int) -> torch.Tensor:
    """long (2c,): the global positions of ``rank``'s local tokens under zigzag sharding."""
    c = L // (2 * world)
    t = torch.arange(c)
    return torch.cat([rank * c + t, (2 * world - 1 - rank) * c + t])


@rebuildable
def ring_judge(recipe: Recipe, what: str):
    """The calls are ``f(L, world, rank, step)`` for every rank and step of one ring, rank by
    rank: the student's masks, used to attend the keys each rank holds at each step (those of
    rank (rank - step) mod world, zigzag sharded) and merged, must give full causal attention.
    ``what``: the message."""

    def judge(calls: list[Call], outcomes: list[Outcome]) -> Verdict:
        L, world = int(calls[0].args[0]), int(calls[0].args[1])
        c2 = L // world
        masks = {}
        for call, o in zip(calls, outcomes):
            if o.error is not None:
                return raised(o.error, inputs_of(recipe, call))
            got, msg = dg.unpack(o.output, recipe.out_names)
            if msg:
                return dg.fail(msg, f"inputs: {inputs_of(recipe, call)}")
            m = got[0]
            if m.dtype != torch.bool or tuple(m.shape) != (c2, c2):
                return dg.fail(f"mask is {dg.describe(m)}; expected bool (2c, 2c) = ({c2}, {c2})",
                               f"inputs: {inputs_of(recipe, call)}")
            masks[int(call.args[2]), int(call.args[3])] = m
        gen = torch.Generator().manual_seed(L * 97 + world)
        q, k, v = (torch.randn(1, 2, L, 4, generator=gen, dtype=torch.float64) for _ in range(3))
        pos = torch.arange(L)
        want, _ = attend64(q, k, v, pos[:, None] >= pos[None, :])
        for r in range(world):
            mine = zigzag_positions(L, world, r)
            out = lse = None
            seen = [[] for _ in range(c2)]
            for s in range(world):
                src = zigzag_positions(L, world, (r - s) % world)
                m = masks[r, s]
                part = attend64(q[..., mine, :], k[..., src, :], v[..., src, :], m)
                out, lse = part if out is None else merge64(out, lse, *part)
                for i in range(c2):
                    seen[i] += src[m[i]].tolist()
            bad = dg.bad_entries(out, want[..., mine, :], torch.float32).any(dim=-1).any(dim=(0, 1))
            if bool(bad.any()):
                i = int(bad.nonzero()[0])
                p = int(mine[i])
                keys = sorted(seen[i])
                return dg.fail(what, f"world = {world}, L = {L}: rank {r}'s local query {i} sits at global "
                               f"position {p}; over the {world} ring steps your masks let it see global key "
                               f"positions {keys[:24]}{' ...' if len(keys) > 24 else ''}; full causal "
                               f"attention sees 0 .. {p}, each once")
        return dg.PASS

    return dg.judged(judge)


# --------------------------------------------------------------------------- ring_attention

#: The ring's own mistakes, named here (not in the chapter's module) so that the student
#: template's checks name them too.
RING_SOURCE_PLUS = ("the shard held at step s is taken from rank (r + s) mod world: the ring passes each "
                    "shard on to the next rank, so at step s rank r holds that of rank (r - s) mod world")
RING_EMPTY_STEPS = ("steps whose mask is all False are not skipped: a step in which no local query may "
                    "see any key of the shard held (under contiguous sharding, every shard after the "
                    "rank's own) must be left out of steps, as a kernel skips it")
RING_LAYOUT = ("the shards follow the other layout: contiguous gives rank r two neighbouring chunks, zigzag "
               "chunk r from the start and chunk r from the end (of the chunks of c positions each, two "
               "per rank)")
RING_LOCAL = ("each step's mask compares local indices (i >= j): the shard held comes from another rank, "
              "so compare the global positions of the local queries and of the shard's keys")
RING_SHARD_ORDER = ("each step's mask follows the order of the ranks (all of an earlier rank's keys, "
                    "a causal triangle on the rank's own, nothing of a later rank's): that is right for "
                    "contiguous sharding only. Under zigzag a rank holds an early chunk and a late one, so "
                    "its late queries see the early chunks of later ranks, and its early queries only part "
                    "of an earlier rank's keys: mask each step by the global positions of the queries and "
                    "keys")
RING_NO_MERGE = ("out is the last step's partial result alone: each step's (out_s, lse_s) must be merged "
                 "into the rank's running (out, lse) with merge_partials, not written over it")
RING_STALE_LSE = ("the running lse is not updated after a merge: merge_partials returns the merged lse "
                  "too, and the next step must merge with that, not with an earlier one")


def layout_positions(L: int, world: int, rank: int, layout: str) -> torch.Tensor:
    """long (2c,): the global positions of ``rank``'s local tokens under ``layout``."""
    if layout == "zigzag":
        return zigzag_positions(L, world, rank)
    c = L // (2 * world)
    return torch.arange(2 * rank * c, (2 * rank + 2) * c)


def _ring_partial(q, k, v, L, world, rank, src, layout, local: bool = False):
    mine, theirs = layout_positions(L, world, rank, layout), layout_positions(L, world, src, layout)
    if local:
        n = mine.numel()
        m = torch.ones(n, n, dtype=torch.bool).tril()
    else:
        m = mine[:, None] >= theirs[None, :]
    return attend64(q[..., mine, :], k[..., theirs, :], v[..., theirs, :], m), m


def _by_rank_order(q, k, v, L, world, r, src, layout):
    """Rank r's partial result at the step holding rank src's shard, masked by rank order: every key
    of an earlier rank, a causal triangle on its own, nothing of a later one (right for contiguous)."""
    mine, theirs = layout_positions(L, world, r, layout), layout_positions(L, world, src, layout)
    n = mine.numel()
    m = torch.ones(n, n, dtype=torch.bool).tril() if src == r else torch.full((n, n), src < r)
    return attend64(q[..., mine, :], k[..., theirs, :], v[..., theirs, :], m), m


def _ring_mistake(ran, q, k, v, L, world, r, layout, parts, dtype) -> str | None:
    """The classic mistake whose steps, for rank r, are exactly ``ran``; or None."""
    sources = [(r - s) % world for s in range(world)]
    other = "contiguous" if layout == "zigzag" else "zigzag"

    def nonempty(seq):
        return [p for p, m in seq if bool(m.any())]

    candidates = [
        (RING_EMPTY_STEPS, lambda: [parts[src][0] for src in sources]),
        (RING_SOURCE_PLUS, lambda: nonempty(parts[(r + s) % world] for s in range(world))),
        (RING_LAYOUT, lambda: nonempty(_ring_partial(q, k, v, L, world, r, src, other) for src in sources)),
        (RING_LOCAL, lambda: [_ring_partial(q, k, v, L, world, r, src, layout, local=True)[0]
                              for src in sources]),
        (RING_SHARD_ORDER, lambda: nonempty(_by_rank_order(q, k, v, L, world, r, src, layout)
                                            for src in sources)),
    ]
    for message, make in candidates:
        want = make()
        if len(want) == len(ran) and all(_same_pair(g, w, dtype) for g, w in zip(ran, want)):
            return message
    return None


def _is_pair(x) -> bool:
    return (isinstance(x, tuple | list) and len(x) == 2
            and all(isinstance(t, torch.Tensor) and dg.plain(t) and t.dtype.is_floating_point for t in x))


def _same_pair(got, want, dtype) -> bool:
    return all(dg.close(g.double(), w, dtype) for g, w in zip(got, want))


@rebuildable
def ring_steps_judge(name: str, arg_names: tuple[str, ...]):
    """``ring_attention(q, k, v, world, layout)`` returns ``(out, lse, steps)``: out and lse are causal
    attention (float64 here), and ``steps[r]`` lists, in ring order, the partial result of each step
    of rank r whose mask has an allowed key, each equal to rank r's local queries attended over the
    shard it holds at that step alone. Computed here from the inputs: the template needs nothing
    recorded."""

    def judge(calls: list[Call], outcomes: list[Outcome]) -> Verdict:
        for call, o in zip(calls, outcomes):
            verdict = _judge_ring(call, o, name, arg_names)
            if verdict is not None:
                return verdict
        return dg.PASS

    return dg.judged(judge)


def _judge_ring(call: Call, o: Outcome, name: str, arg_names: tuple[str, ...]) -> Verdict | None:
    inputs = dg.describe_args(arg_names, call.args, dict(call.kwargs))
    if o.error is not None:
        return raised(o.error, inputs)
    q, k, v, world = call.args[:4]
    layout = call.args[4] if len(call.args) > 4 else call.kwargs.get("layout", "zigzag")
    B, H, L, _ = q.shape
    dv, c2 = v.shape[-1], L // world
    dtype = float_dtype(call)
    got = o.output
    if not isinstance(got, tuple | list) or len(got) != 3:
        return dg.fail(f"returned {dg.describe(got)}; expected a tuple (out, lse, steps)",
                       f"inputs: {inputs}")
    out, lse, steps = got
    at = f"inputs: {inputs}"
    if call.device != "cpu":
        devices = (*(o.devices if isinstance(o.devices, tuple | list) else (o.devices,)), None, None)
        for what, dev in zip(("out", "lse"), devices):
            if dev != call.device:
                return dg.fail(f"{what} is on {dev}; expected {call.device}: create the outputs on the "
                               "inputs' device (device=q.device)", f"inputs on {call.device}: {inputs}")
    wide = torch.promote_types(q.dtype, torch.float32)
    for what, t, shape, letters, want in (("out", out, (B, H, L, dv), "(B, H, L, dv)", q.dtype),
                                          ("lse", lse, (B, H, L), "(B, H, L)", wide)):
        if not (isinstance(t, torch.Tensor) and dg.plain(t) and t.dtype.is_floating_point):
            return dg.fail(f"{what} is {dg.describe(t)}; expected a floating torch.Tensor", at)
        if tuple(t.shape) != shape:
            return dg.fail(f"{what} has shape {dg.shape_str(t.shape)}; expected {letters} = "
                           f"{dg.shape_str(shape)}, in global order", at)
        if t.dtype != want:
            return dg.fail(f"{what} is {dg.dtype_str(t.dtype)}; expected {dg.dtype_str(want)}", at)
    if not isinstance(steps, tuple | list) or len(steps) != world:
        return dg.fail(f"steps is {dg.describe(steps)}; expected a list of world = {world} lists, one per "
                       "rank, each holding the (out_s, lse_s) of the steps that rank ran", at)
    pos = torch.arange(L)
    want_out, want_lse = attend64(q, k, v, pos[:, None] >= pos[None, :])
    for r in range(world):
        ran = steps[r]
        if not isinstance(ran, tuple | list) or not all(_is_pair(x) for x in ran):
            return dg.fail(f"steps[{r}] is {dg.describe(ran)}; expected a list of (out_s, lse_s) pairs of "
                           "floating tensors", at)
        for i, (so, sl) in enumerate(ran):
            if tuple(so.shape) != (B, H, c2, dv) or tuple(sl.shape) != (B, H, c2):
                return dg.fail(f"steps[{r}][{i}] holds out_s {dg.shape_str(so.shape)} and lse_s "
                               f"{dg.shape_str(sl.shape)}; expected (B, H, 2c, dv) = "
                               f"{dg.shape_str((B, H, c2, dv))} and (B, H, 2c) = {dg.shape_str((B, H, c2))}: "
                               f"rank {r}'s local queries only", at)
        verdict = _judge_rank(q, k, v, L, world, r, layout, ran, dtype, inputs)
        if verdict is not None:
            return verdict
        mine = layout_positions(L, world, r, layout)
        verdict = _judge_merged(q, k, v, L, world, r, layout, out[..., mine, :], lse[..., mine],
                                want_out[..., mine, :], want_lse[..., mine], dtype, inputs)
        if verdict is not None:
            return verdict
    return None


def _judge_rank(q, k, v, L, world, r, layout, ran, dtype, inputs) -> Verdict | None:
    """None when rank r's steps are the partial results of the steps it must run, in ring order."""
    sources = [(r - s) % world for s in range(world)]
    parts = {src: _ring_partial(q, k, v, L, world, r, src, layout) for src in sources}
    kept = [src for src in sources if bool(parts[src][1].any())]
    want = [parts[src][0] for src in kept]
    if len(ran) == len(kept) and all(_same_pair(g, w, dtype) for g, w in zip(ran, want)):
        return None
    where = f"world = {world}, L = {L}, {layout}, rank {r}"
    said = _ring_mistake(ran, q, k, v, L, world, r, layout, parts, dtype)
    if said:
        return dg.fail(said, f"{where}: the steps with an allowed key hold the shards of ranks {kept}, in "
                       f"this order; steps[{r}] has {len(ran)} entries; inputs: {inputs}")
    if len(ran) != len(kept):
        return dg.fail(f"rank {r} ran {len(ran)} steps; expected {len(kept)}: one for each step whose mask "
                       f"has an allowed key (those holding the shards of ranks {kept}, in ring order)",
                       f"{where}; inputs: {inputs}")
    i = next(i for i, (g, w) in enumerate(zip(ran, want)) if not _same_pair(g, w, dtype))
    src, (so, sl), (wo, wl) = kept[i], ran[i], want[i]
    which, g, w = ("out_s", so, wo) if not dg.close(so.double(), wo, dtype) else ("lse_s", sl, wl)
    return dg.fail(f"steps[{r}][{i}] (rank {r} at step {sources.index(src)}, holding the shard of rank "
                   f"{src}) is not rank {r}'s queries attended over that shard alone, causal by global "
                   "position", f"{where}:\n" + dg.number_detail(g, w, dtype, which, inputs))


def _judge_merged(q, k, v, L, world, r, layout, out, lse, want_out, want_lse, dtype, inputs
                  ) -> Verdict | None:
    """None when rank r's rows of out and lse are causal attention; else what went wrong in the merge."""
    sources = [(r - s) % world for s in range(world)]
    parts = [p for p, m in (_ring_partial(q, k, v, L, world, r, src, layout) for src in sources)
             if bool(m.any())]
    stale = parts[0]
    for p in parts[1:]:
        stale = (merge64(*stale, *p)[0], stale[1])
    for index, (what, g, w) in enumerate((("out", out, want_out), ("lse", lse, want_lse))):
        if dg.close(g.double(), w, dtype):
            continue
        said = next((msg for msg, cand in ((RING_NO_MERGE, parts[-1]), (RING_STALE_LSE, stale))
                     if len(parts) > 1 and dg.close(g.double(), cand[index], dtype)), None)
        mine = layout_positions(L, world, r, layout).tolist()
        return dg.fail(said or f"{what} at rank {r}'s positions is not its steps merged: causal attention "
                       "over all keys", f"world = {world}, L = {L}, {layout}, rank {r} (global positions "
                       f"{mine}):\n" + dg.number_detail(g, w, dtype, what, inputs))
    return None


# --------------------------------------------------------------------------- cascade_attention

@rebuildable
def prefix_once_judge(name: str, arg_names: tuple[str, ...], per_sequence: str, copied: str):
    """``cascade_attention(q (N, H, d), prefix_k (H, P, d), ...)`` reads the prefix once, as the worker's
    record of the largest floating tensor a call creates shows (:attr:`grader.spec.Call.allocations`):
    the N queries' scores against the prefix come from one product, a tensor of N·P entries or more
    (one per head, or all heads at once), and no copy of the prefix per sequence (N·P·d entries or
    more) is made. ``per_sequence``, ``copied``: the two messages."""

    def judge(calls: list[Call], outcomes: list[Outcome]) -> Verdict:
        for call, o in zip(calls, outcomes):
            inputs = dg.describe_args(arg_names, call.args, dict(call.kwargs))
            if o.error is not None:
                return raised(o.error, inputs)
            if o.largest is None:
                return dg.fail("the tensors created during the call were not recorded")
            N, (_, P, d) = call.args[0].shape[0], call.args[1].shape
            entries = math.prod(o.largest)
            shown = f"the largest floating tensor created has shape {dg.shape_str(o.largest)} ({entries})"
            if entries < N * P:
                return dg.fail(per_sequence, f"{shown}; one product of the N = {N} queries with the P = {P} "
                               f"prefix keys has N·P = {N * P} per head; inputs: {inputs}")
            if entries >= N * P * d:
                return dg.fail(copied, f"{shown}; N·P·d = {N}·{P}·{d} = {N * P * d} is the prefix's keys "
                               f"once per sequence; inputs: {inputs}")
        return dg.PASS

    return dg.judged(judge)


@rebuildable
def ring_device_judge(name: str, arg_names: tuple[str, ...]):
    """``ring_attention`` on a device without values (meta): out and lse come back on the inputs'
    device with the contract's shapes, or the call stops where it reads a value back (a ring
    reads whether a step's mask has an allowed key, which meta cannot say: allowed)."""

    def judge(calls: list[Call], outcomes: list[Outcome]) -> Verdict:
        for call, o in zip(calls, outcomes):
            inputs = dg.describe_args(arg_names, call.args, dict(call.kwargs))
            if o.error is not None:
                if errors.reads_values(o.error):
                    continue
                return raised(o.error, inputs, call.device)
            got = o.output
            if not isinstance(got, tuple | list) or len(got) != 3:
                return dg.fail(f"returned {dg.describe(got)}; expected a tuple (out, lse, steps)")
            devices = (*(o.devices if isinstance(o.devices, tuple | list) else (o.devices,)), None, None)
            q, v = call.args[0], call.args[2]
            for what, t, dev, shape in (("out", got[0], devices[0], (*q.shape[:-1], v.shape[-1])),
                                        ("lse", got[1], devices[1], tuple(q.shape[:-1]))):
                if dev != call.device:
                    return dg.fail(f"{what} is on {dev}; expected {call.device}: create it on the inputs' "
                                   "device (device=q.device)", f"inputs on {call.device}: {inputs}")
                if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(shape):
                    return dg.fail(f"{what} is {dg.describe(t)}; expected shape {dg.shape_str(shape)}",
                                   f"inputs on {call.device}: {inputs}")
        return dg.PASS

    return dg.judged(judge)


@rebuildable
def ring_default_device_judge(name: str, arg_names: tuple[str, ...]):
    """``ring_attention`` with CPU inputs and the default device moved (:mod:`.default_device`): nothing
    of out, lse or the steps off the CPU, and out and lse with the contract's shapes."""
    return then(("out", "lse", "steps"), lambda c: dg.describe_args(arg_names, c.args, dict(c.kwargs)),
                ring_device_judge(name, arg_names))
