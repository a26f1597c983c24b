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

from .. import diagnose as dg
from ..spec import Call, Outcome, Verdict
from .judges import Recipe, float_dtype, inputs_of, raised, rebuildable

#: merge_partials' two numeric failures, named from where the NaN and inf sit (here, not in the
#: chapter's module, so that the student template names them too: :data:`properties.NAN_REASONS`).
MERGE_NAN_EMPTY = ("NaN where both parts are empty: with both lse -inf, exp(lse1 - lse) is "
                   "exp(-inf - (-inf)) = NaN. Shift by 0 where the larger lse is -inf, and return out 0 "
                   "and lse -inf for such rows.")
MERGE_OVERFLOW = ("exp(lse) overflows to inf (or underflows to 0) once |lse| passes about 88 in float32: "
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
