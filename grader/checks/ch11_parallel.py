"""Chapter 11, masks across kernels and devices: ``attention_lse``, ``merge_partials``,
``zigzag_ring_mask`` and ``chunked_local_mask``.

Besides the values, two checks hold the pieces to what they are for: attention over a
partition of the keys, merged by log-sum-exp, equals attention over all keys (the student's
``attention_lse`` judged against itself, :func:`grader.checks.merging.partition_judge`, a
property: unmasked attention meets it too); and the W steps of a ring, masked by the
student's ``zigzag_ring_mask`` and merged, equal full causal attention
(:func:`grader.checks.merging.ring_judge`, rings of 2 ranks in public and 3 hidden). The
hidden cases draw what breaks real code: rows and parts with no allowed key, log-sum-exps
past float32's ``exp`` (±100 and more; ±1e4 with half-precision outputs, where float32's own
rounding of such an lse stays inside the tolerance), worlds of 3 to 5 ranks, chunks that do
not divide the sequence. Invalid sizes must raise ValueError (:func:`judges.raises`).
"""

from __future__ import annotations

import math

import torch

import attnmask as am

from .. import cases
from .. import diagnose as dg
from ..mistakes import MISTAKES
from ..spec import Call, Check, exercise
from . import judges as J
from . import merging as MG
from . import properties as P
from .ch2_softmax import with_empty_row
from .ch8_speed import exact_qkv, qkv

M = MISTAKES
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16

#: The chapter's classic mistakes, in plain words (one definition each).
MISTAKES11: dict[str, str] = {
    "lse_unscaled": "lse is the log-sum-exp of the unscaled scores q·k: take it over the scores the "
                    "softmax uses, q·k / sqrt(d).",
    "lse_unmasked": "lse sums over every key, the blocked ones too: take it over the allowed keys only "
                    "(blocked scores filled with -inf first), or merged parts weigh keys they never "
                    "attended.",
    "lse_empty": "a fully masked row's lse must be -inf (the log of an empty sum), not a finite number or "
                 "NaN: a merge then gives that part the weight exp(-inf) = 0.",
    "merge_nan_empty": MG.MERGE_NAN_EMPTY,
    "merge_overflow": MG.MERGE_OVERFLOW,
    "merge_average": "the two outputs are averaged with equal weights: weigh each by its share of the "
                     "total, exp(lse1 - lse) and exp(lse2 - lse).",
    "merge_lse_max": "the merged lse is the larger of the two: it is log(exp(lse1) + exp(lse2)), larger "
                     "than both.",
    "merge_swapped": "the weights are swapped: out1 is weighed by exp(lse1 - lse), out2 by exp(lse2 - lse).",
    "merge_unnormalised": "the weights do not add up to 1: divide by the total, i.e. use exp(lse_i - lse) "
                          "with lse the merged log-sum-exp, not exp(lse_i - max).",
    "ring_contiguous": "contiguous sharding: rank r holds chunks 2r and 2r + 1 here. Zigzag sharding gives "
                       "rank r chunks r and 2·world - 1 - r, one early and one late, so that causal work "
                       "is balanced.",
    "ring_source_plus": "the keys at step s are taken from rank (r + s) mod world: the ring passes keys on "
                        "to the next rank, so at step s rank r holds those of rank (r - s) mod world.",
    "ring_local": "local indices are compared (i >= j): the keys come from another rank, so compare the "
                  "global positions of query i and key j.",
    "chunk_window": "this is a sliding window, not a chunk: chunked attention sees keys j <= p of its own "
                    "chunk (j // chunk == p // chunk), so the first query of a chunk sees only itself.",
    "chunk_not_causal": "the chunk is bidirectional: query p must not see the keys after it in its chunk "
                        "(j <= p).",
    "chunk_top_left": "query i is placed at position i: the queries are the last Lq of the Lk positions, "
                      "query i at p = Lk - Lq + i (bottom-right).",
    "padchunk_from_zero": "the chunks are counted from position 0 of the buffer: a left-padded row's "
                          "chunks start at its first real token, so compare (j - pad) // chunk with "
                          "(p - pad) // chunk, pad the row's number of leading False.",
    "padchunk_pad_keys": "padding keys are attended: AND the chunked causal mask with the row's "
                         "attention_mask (a key that is padding is never seen).",
    "padchunk_all_false": "every False of the row is counted as left padding: only the leading False shift "
                          "the chunks (transformers counts the positions before the first real token); a "
                          "False after it is a masked key that shifts nothing.",
    "ring_source_plus_steps": MG.RING_SOURCE_PLUS,
    "ring_empty_steps": MG.RING_EMPTY_STEPS,
    "ring_layout": MG.RING_LAYOUT,
    "ring_local_steps": MG.RING_LOCAL,
    "ring_no_merge": MG.RING_NO_MERGE,
    "ring_stale_lse": MG.RING_STALE_LSE,
    "cascade_suffix_unmasked": "the suffix's padding keys are attended: sequence n has suffix_lengths[n] "
                               "real keys; mask the rest (a sequence with none has an all-False suffix "
                               "row, lse -inf).",
    "cascade_pairs_mixed": "the partial results are mixed up: merge_partials takes (out1, lse1, out2, lse2), "
                           "each output beside its own lse (the prefix's out with the prefix's lse).",
    "cascade_reshape": "the queries were reshaped from (N, H, d) to (1, H, N, d) with reshape/view: that "
                       "mixes sequences and heads; move the head dimension first with transpose(0, 1), then "
                       "add the batch dimension (and transpose back after).",
    "cascade_per_sequence": "the prefix is attended one sequence at a time: its keys are read N times. "
                            "Put the N queries side by side as the rows of one (1, H, N, d) query block "
                            "and attend the prefix once for all of them.",
    "cascade_prefix_copied": "the prefix is copied per sequence (expanded and concatenated with each "
                             "suffix, or repeated N times): its keys are read N times. Attend it once with "
                             "the N queries as one block of rows, and each suffix alone.",
}
X = MISTAKES11


# --------------------------------------------------------------------------- attention_lse

def half_exact(gen, B, H, Lq, Lk, dv) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """float16 (q, k, v), head width 4, q and k integers in 46 .. 64: every score q·k / 2 lies in
    4232 .. 8192 and is exact in float32, while float16 rounds it to a multiple of 4 (or 8)."""
    q = cases.randint_(gen, (B, H, Lq, cases.EXACT_D), 46, 64).half()
    k = cases.randint_(gen, (B, H, Lk, cases.EXACT_D), 46, 64).half()
    return q, k, cases.randn(gen, B, H, Lk, dv, dtype=F16)


def _lse_parts(args, kwargs):
    q, k, v = args[:3]
    mask = args[3] if len(args) > 3 else kwargs.get("mask")
    scores = q.double() @ k.double().mT  # (B, H, Lq, Lk), unscaled
    shape = scores.shape
    full = torch.ones(shape, dtype=torch.bool) if mask is None else torch.broadcast_to(mask, shape)
    return q, k, v, mask, scores, full


def diagnose_lse(args, kwargs, got, index, dtype) -> str | None:
    q, k, v, mask, scores, full = _lse_parts(args, kwargs)
    d = q.shape[-1]
    empty = ~full.any(dim=-1)  # (B, H, Lq)
    lse_of = lambda s, fill=float("-inf"): torch.logsumexp(s.masked_fill(~full, fill), dim=-1)  # noqa: E731
    ref = am.attention_lse(q, k, v, mask)
    att = lambda m=mask, scale=None: am.attention(q, k, v, m, scale=scale)[0]  # noqa: E731
    if index == 1:
        return dg.name_mistake(got, [
            (X["lse_unscaled"], lambda: lse_of(scores)),
            (X["lse_unmasked"], lambda: torch.logsumexp(scores / math.sqrt(d), dim=-1)),
            (X["lse_empty"], lambda: ref[1].masked_fill(empty, 0.0)),
            (X["lse_empty"], lambda: ref[1].masked_fill(empty, float("nan"))),
            (X["lse_empty"], lambda: lse_of(scores / math.sqrt(d), fill=-1e9)),
            (X["lse_empty"], lambda: lse_of(scores / math.sqrt(d), fill=torch.finfo(dtype).min)),
            (M["scale_1_over_d"], lambda: lse_of(scores / d)),
        ], dtype)
    candidates = [(M["no_scale"], lambda: att(scale=1.0)), (M["scale_1_over_d"], lambda: att(scale=1.0 / d))]
    if mask is not None:
        candidates += [(M["inverted"], lambda: att(~mask)), (M["no_mask"], lambda: att(None)),
                       (M["nan_rows"], lambda: ref[0].masked_fill(empty[..., None], float("nan")))]
    return dg.name_mistake(got, candidates, dtype)


LSE = J.Recipe("attention_lse", am.attention_lse, ("q", "k", "v", "mask"),
               (J.Out("out", "number", "(B, H, Lq, dv)"), J.Out("lse", "logsumexp", "(B, H, Lq)")),
               diagnose_lse)


def split(gen, Lk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A random partition of the Lk keys into two interleaved parts (a, b), long, sorted."""
    part = torch.randperm(Lk, generator=gen)
    return part[: Lk // 2].sort().values, part[Lk // 2:].sort().values


def parted_mask(gen, B, H, Lq, Lk, parts, empty: bool = True) -> torch.Tensor:
    """(B, H, Lq, Lk) random mask; with ``empty`` (Lq >= 3), query 0 sees no key of part a, query 1
    none of part b and query 2 none at all (rows 3.. are general); else every query sees a key in
    each part."""
    a, b = parts
    mask = cases.random_mask(gen, B, H, Lq, Lk, p=0.7)
    if not empty:
        mask[..., a[0]] = mask[..., b[0]] = True
        return mask
    mask[..., 0, a] = False
    mask[..., 0, b[0]] = True
    mask[..., 1, b] = False
    mask[..., 1, a[0]] = True
    mask[..., 2, :] = False
    return mask


def partition(q, k, v, mask, parts) -> list[Call]:
    """Three calls: all keys, then each of the two ``parts`` of them."""
    full = torch.broadcast_to(mask, (*q.shape[:-1], k.shape[-2]))
    return [Call((q, k, v, mask))] + [Call((q, k[..., s, :], v[..., s, :], full[..., s].clone()))
                                      for s in parts]


def parted(gen, q, k, v, empty: bool = True) -> list[Call]:
    """:func:`partition` of a random split with a :func:`parted_mask`."""
    B, H, Lq, _ = q.shape
    parts = split(gen, k.shape[-2])
    return partition(q, k, v, parted_mask(gen, B, H, Lq, k.shape[-2], parts, empty), parts)


#: What the partition check says when the student's parts do not merge into the whole.
MERGES_NOT = ("your out and lse over two parts of the keys, merged by their lse, differ from yours over all "
              "keys: the lse must be over the same scaled, masked scores as the weights")


@exercise(3.0, "attention_lse(q, k, v, mask=None): (out (B, H, Lq, dv) in q's dtype, 0 on fully masked rows; "
          "lse (B, H, Lq) float32, log of the sum of exp(q·k / sqrt(d)) over the allowed keys, -inf on fully "
          "masked rows).")
def attention_lse_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    R = LSE
    pub = cases.generator(cases.PUBLIC_SEED, R.name)
    heads = with_empty_row(cases.random_mask(pub, 1, 2, 3, 6), pub)
    checks = [
        J.values(R, "out and lse (B=1, H=2, Lq=3, Lk=6), a fully masked row",
                 [Call((*qkv(pub, 1, 2, 3, 6, 4, 3), heads))], public=True),
        J.values(R, "no mask; a causal (Lq, Lk) mask",
                 [Call(qkv(pub, 1, 1, 3, 5, 4, 2)), Call((*qkv(pub, 2, 1, 4, 4, 8, 2), am.causal_mask(4)))],
                 public=True),
    ]
    if not hidden:
        return checks
    gen = cases.generator(seed, R.name)
    B, H, d, dv = 2, cases.integer(gen, 2, 3), cases.integer(gen, 4, 8), cases.integer(gen, 2, 3)
    Lq, Lk = cases.integer(gen, 3, 5), cases.integer(gen, 6, 10)
    x = lambda dtype=F32, scale=1.0: qkv(gen, B, H, Lq, Lk, d, dv, dtype, scale)  # noqa: E731
    per_head = lambda: with_empty_row(cases.random_mask(gen, B, H, Lq, Lk), gen)  # noqa: E731
    keys = (torch.arange(Lk) < cases.lengths(gen, B, Lk)[:, None])[:, None, None, :]  # (B, 1, 1, Lk)
    return checks + [
        J.values(R, "matches reference (per-head masks with fully masked rows)",
                 [Call((*x(), per_head())), Call((*x(), per_head()))]),
        J.values(R, "mask broadcasts: (Lq, Lk), (B, 1, 1, Lk) padding with an empty row, no mask",
                 [Call((*x(), with_empty_row(cases.random_mask(gen, Lq, Lk), gen))), Call((*x(), keys)),
                  Call(x())]),
        J.values(R, "large scores (≈ 1e4) next to blocked keys",
                 [Call((*exact_qkv(gen, B, H, Lq, Lk, dv, "large"), per_head()))]),
        J.values(R, "float16 inputs whose scores (4096 .. 8192) float16 cannot hold: scores in float32",
                 [Call((*half_exact(gen, B, H, Lq, Lk, dv), per_head()))]),
        J.values(R, "rows whose every score is below -2e9 (lse ≈ -1e10)",
                 [Call((*exact_qkv(gen, B, H, Lq, Lk, dv, "negative"), per_head()))]),
        J.values(R, "float16 (lse in float32)", [Call((*x(F16), per_head()))]),
        J.values(R, "bfloat16 (lse in float32)", [Call((*x(BF16), per_head()))]),
        # A necessary condition, not a value: unmasked attention (or constants) merge consistently too.
        Check("two random halves of the keys (one empty for some rows), merged, equal all keys",
              parted(gen, *x()) + parted(gen, *x(), empty=False),
              MG.partition_judge(R, MERGES_NOT), kind="property"),
        P.gradients(R, "finite gradients with fully masked rows, match reference",
                    [Call((*x(), cases.two_keys_or_none(per_head())))]),
        J.dtypes(R, "out in the inputs' dtype, lse float32",
                 [Call((*x(dt), per_head())) for dt in cases.FLOATS]),
        P.on_device(R, "on the inputs' device (meta), with and without a mask",
                    [Call(x(), device="meta"), Call((*x(), per_head()), device="meta")], vectorised=False),
        P.unchanged(R, "does not modify inputs", [Call((*x(), per_head()))]),
        P.on_cuda(R, "matches on CUDA", [Call((*x(F16), per_head())), Call(x())]),
    ]


# --------------------------------------------------------------------------- merge_partials

def diagnose_merge(args, kwargs, got, index, dtype) -> str | None:
    reason = MG.merge_nan_reason(args, kwargs, got)
    if reason:
        return reason
    out1, lse1, out2, lse2 = (t.double() for t in args[:4])
    ref_out, ref_lse = am.merge_partials(out1, lse1, out2, lse2)
    m = torch.maximum(lse1, lse2).nan_to_num(neginf=0.0)
    w1, w2 = torch.exp(lse1 - ref_lse).nan_to_num(0.0), torch.exp(lse2 - ref_lse).nan_to_num(0.0)
    u1, u2 = torch.exp(lse1 - m), torch.exp(lse2 - m)
    return dg.name_mistake(got, [
        (X["merge_average"], lambda: ((out1 + out2) / 2, ref_lse)),
        (X["merge_lse_max"], lambda: (ref_out, torch.maximum(lse1, lse2))),
        (X["merge_swapped"], lambda: (w2[..., None] * out1 + w1[..., None] * out2, ref_lse)),
        (X["merge_unnormalised"], lambda: (u1[..., None] * out1 + u2[..., None] * out2, ref_lse)),
    ], dtype, index)


MERGE = J.Recipe("merge_partials", am.merge_partials, ("out1", "lse1", "out2", "lse2"),
                 (J.Out("out", "number", "(..., Lq, dv)"), J.Out("lse", "logsumexp", "(..., Lq)")),
                 diagnose_merge)


def partials(gen, B, H, Lq, Lk, d, dv, dtype=F32, empty_rows: bool = True) -> tuple:
    """(out1, lse1, out2, lse2) of the reference's attention_lse over a random partition of Lk keys,
    with a row whose first part is empty, one whose second part is, and (``empty_rows``) one
    with no allowed key at all."""
    q, k, v = qkv(gen, B, H, Lq, Lk, d, dv, dtype)
    calls = parted(gen, q, k, v, empty_rows)[1:]
    (o1, l1), (o2, l2) = (am.attention_lse(*c.args) for c in calls)
    return o1, l1, o2, l2


def extreme(gen, shape: tuple[int, ...], dv: int, at: float, dtype=F32) -> tuple:
    """(out1, lse1, out2, lse2) with every lse near ``at`` (e.g. ±1e4), the two within a few units."""
    lse1 = at + cases.randn(gen, *shape, scale=2.0)
    lse2 = at + cases.randn(gen, *shape, scale=2.0)
    return cases.randn(gen, *shape, dv, dtype=dtype), lse1, cases.randn(gen, *shape, dv, dtype=dtype), lse2


@exercise(3.0, "merge_partials(out1, lse1, out2, lse2): (out, lse) over the union of two disjoint key "
          "sets, lse = log(exp(lse1) + exp(lse2)), out = exp(lse1 - lse)·out1 + exp(lse2 - lse)·out2 in "
          "out1's dtype; 0 and -inf where both are empty; stable for any finite lse.")
def merge_partials_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    R = MERGE
    pub = cases.generator(cases.PUBLIC_SEED, R.name)
    t = lambda *x: torch.tensor(x)  # noqa: E731
    ninf = float("-inf")
    checks = [
        J.values(R, "two halves of the keys (B=1, H=2, Lq=4), a part empty in some rows, a row with no key",
                 [Call(partials(pub, 1, 2, 4, 8, 4, 3))], public=True),
        J.values(R, "both parts empty: out 0 and lse -inf, not NaN (beside a row with one part empty)",
                 [Call((torch.zeros(2, 3), t(ninf, ninf), torch.zeros(2, 3), t(ninf, 0.5))),
                  Call((torch.zeros(2, 3), t(ninf, 0.5), torch.zeros(2, 3), t(ninf, ninf)))],
                 public=True, edge=True),
        # float32 rounds an lse of 1e4 to 1e-3, which moves exp(lse1 - lse) by as much in an exact
        # merge: such lse go with float16 outputs; float32 ones are tested at ±120 (exp(120) = inf).
        J.values(R, "lse of ±120 (exp overflows float32) and of ±1e4 (float16 outputs)",
                 [Call(extreme(pub, (1, 3), 2, 120.0)), Call(extreme(pub, (1, 3), 2, -120.0)),
                  Call(extreme(pub, (2, 3), 2, 1e4, F16)), Call(extreme(pub, (2, 3), 2, -1e4, F16))],
                 public=True),
        J.raises(R.name, R.arg_names, "mismatched shapes raise ValueError",
                 [Call((torch.zeros(3, 2), torch.zeros(3), torch.zeros(4, 2), torch.zeros(4))),
                  Call((torch.zeros(3, 2), torch.zeros(3), torch.zeros(3, 2), torch.zeros(2)))],
                 "out1, out2 (..., Lq, dv) and lse1, lse2 (..., Lq) must agree"),
    ]
    if not hidden:
        return checks
    gen = cases.generator(seed, R.name)
    B, H, d, dv = 2, cases.integer(gen, 2, 3), cases.integer(gen, 4, 8), cases.integer(gen, 2, 3)
    Lq, Lk = cases.integer(gen, 4, 6), cases.integer(gen, 6, 10)  # rows 0-2 are degenerate
    p = lambda dtype=F32, empty_rows=True: partials(gen, B, H, Lq, Lk, d, dv, dtype, empty_rows)  # noqa: E731
    big = float(cases.integer(gen, 2, 5) * 10 ** cases.integer(gen, 3, 4))
    over = float(cases.integer(gen, 100, 140))
    with_empty = list(extreme(gen, (B, Lq), dv, over))
    with_empty[1][0, 0] = with_empty[3][0, 0] = float("-inf")  # a row with both parts empty
    with_empty[0][0, 0] = with_empty[2][0, 0] = 0.0
    return checks + [
        J.values(R, "partials of a random partition of the keys (random sizes) equal attention over all keys",
                 [Call(p()), Call(p(empty_rows=False))]),
        J.values(R, "lse of ±100 .. ±140 (a row with both parts empty) and of ±2e3 .. ±5e4 (float16)",
                 [Call(tuple(with_empty)), Call(extreme(gen, (B, H, Lq), dv, -over)),
                  Call(extreme(gen, (B, H, Lq), dv, big, F16)), Call(extreme(gen, (B, Lq), dv, -big, BF16))]),
        J.values(R, "no leading dimensions: out (Lq, dv), lse (Lq,)",
                 [Call(tuple(x[0, 0] for x in p()))]),
        J.values(R, "float16 outputs, float32 lse", [Call(p(F16))]),
        J.values(R, "bfloat16 outputs, float32 lse", [Call(p(BF16))]),
        P.gradients(R, "finite gradients where one or both parts are empty, match reference", [Call(p())]),
        J.dtypes(R, "out in out1's dtype, lse float32", [Call(p(dt)) for dt in cases.FLOATS]),
        P.on_device(R, "on the inputs' device (meta)", [Call(p(), device="meta")], vectorised=False),
        P.unchanged(R, "does not modify inputs", [Call(p())]),
        P.on_cuda(R, "matches on CUDA", [Call(p()), Call(p(F16))]),
    ]


# --------------------------------------------------------------------------- zigzag_ring_mask

def step_mask(L: int, world: int, rank: int, src: int, layout: str = "zigzag") -> torch.Tensor:
    """bool (2c, 2c): rank ``rank``'s queries against the keys of rank ``src``, by global position."""
    q = am.shard_positions(L, world, rank, layout)
    k = am.shard_positions(L, world, src, layout)
    return q[:, None] >= k[None, :]


def diagnose_ring(args, kwargs, got, index, dtype) -> str | None:
    L, world, rank, step = args[:4]
    c2 = L // world
    ref = am.zigzag_ring_mask(L, world, rank, step)
    return dg.name_mistake(got, [
        (M["inverted"], lambda: ~ref),
        (X["ring_contiguous"], lambda: step_mask(L, world, rank, (rank - step) % world, "contiguous")),
        (X["ring_source_plus"], lambda: step_mask(L, world, rank, (rank + step) % world)),
        (X["ring_contiguous"], lambda: step_mask(L, world, rank, (rank + step) % world, "contiguous")),
        (X["ring_local"], lambda: am.causal_mask(c2)),
        (M["wrong_triangle"], lambda: step_mask(L, world, (rank - step) % world, rank).T),
    ], dtype)


RING = J.Recipe("zigzag_ring_mask", am.zigzag_ring_mask, ("L", "world", "rank", "step"),
                (J.Out("mask", "mask", "(2c, 2c)", lambda a, k: (a[0] // a[1], a[0] // a[1])),),
                diagnose_ring)


def ring_calls(L: int, world: int) -> list[Call]:
    return [Call((L, world, r, s)) for r in range(world) for s in range(world)]


def ring_check(L: int, world: int, public: bool = False) -> Check:
    return Check(f"the {world} ring steps of every rank (L = {L}), masked and merged, equal causal attention",
                 ring_calls(L, world),
                 MG.ring_judge(RING, "the ring steps, masked with your masks and merged, are not full causal "
                                     "attention"), public=public)


@exercise(2.5, "zigzag_ring_mask(L, world, rank, step, *, device=None): bool (2c, 2c), c = L / (2·world); "
          "rank r holds chunks r and 2·world - 1 - r; at step s the keys of rank (r - s) mod world; True "
          "where the query's global position >= the key's.")
def zigzag_ring_mask_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    R = RING
    gen = cases.generator(seed, "zigzag_ring_mask sizes")
    world = cases.integer(gen, 3, 5)
    L = 2 * world * cases.integer(gen, 1, 3)

    def draw(g):
        return (L, world, cases.integer(g, 0, world - 1), cases.integer(g, 1, world - 1))

    public = [("world = 2, L = 12: rank 0 at step 1", (12, 2, 0, 1)),
              ("world = 1 (one rank: plain causal)", (6, 1, 0, 0))]
    edges = [("step 0 (the rank's own keys)", (L, world, 1, 0))]
    checks = P.int_mask_checks(R, seed, hidden, public, edges, draw) + [
        J.values(R, "world = 4, L = 16: rank 1 at steps 1, 2, 3", [Call((16, 4, 1, s)) for s in (1, 2, 3)],
                 public=True),
        ring_check(8, 2, public=True),
        J.raises(R.name, R.arg_names, "bad sizes raise ValueError",
                 [Call((10, 2, 0, 0)), Call((8, 2, 2, 0)), Call((8, 2, 0, 2)), Call((8, 2, -1, 0))],
                 "2·world must divide L, and 0 <= rank, step < world"),
    ]
    if not hidden:
        return checks
    far = 2**20  # world: chunks of 16 whose late halves lie past 2**24, where float32 skips integers
    return checks + [
        J.values(R, "every step of the last rank (random world and L)",
                 [Call((L, world, world - 1, s)) for s in range(world)]),
        ring_check(2 * 3 * cases.integer(gen, 1, 2), 3),
        J.values(R, "positions past 2**24 (L = 2**25, world = 2**20): integer positions, not float32",
                 [Call((32 * far, far, cases.integer(gen, 0, far - 1), 0)),
                  Call((32 * far, far, cases.integer(gen, 0, far - 1), 1))]),
        J.raises(R.name, R.arg_names, "a negative step, L < 1 and world < 1 raise ValueError",
                 [Call((L, world, 0, -1)), Call((0, world, 0, 0)), Call((-L, world, 0, 0)),
                  Call((L, 0, 0, 0))],
                 "L >= 1, world >= 1, and 0 <= rank, step < world"),
    ]


# --------------------------------------------------------------------------- chunked_local_mask

def diagnose_chunked(args, kwargs, got, index, dtype) -> str | None:
    Lq, Lk, chunk = args[:3]
    p = (Lk - Lq + torch.arange(Lq))[:, None]  # (Lq, 1)
    j = torch.arange(Lk)[None, :]  # (1, Lk)
    i = torch.arange(Lq)[:, None]
    ref = am.chunked_local_mask(Lq, Lk, chunk)
    return dg.name_mistake(got, [
        (M["inverted"], lambda: ~ref),
        (X["chunk_window"], lambda: (j <= p) & (p - j < chunk)),
        (X["chunk_window"], lambda: (j <= p) & (p - j <= chunk)),
        (X["chunk_top_left"], lambda: (j <= i) & (j // chunk == i // chunk)),
        (X["chunk_top_left"], lambda: (j <= i) & (i - j < chunk)),
        (X["chunk_not_causal"], lambda: j // chunk == p // chunk),
        (M["no_causal"], lambda: (j // chunk == p // chunk) & (j >= p)),
    ], dtype)


CHUNKED = J.Recipe("chunked_local_mask", am.chunked_local_mask, ("Lq", "Lk", "chunk"),
                   (J.Out("mask", "mask", "(Lq, Lk)", lambda a, k: (a[0], a[1])),), diagnose_chunked)


@exercise(1.5, "chunked_local_mask(Lq, Lk, chunk, *, device=None): bool (Lq, Lk), query i at p = Lk - Lq + i "
          "sees key j iff j <= p and j // chunk == p // chunk.")
def chunked_local_mask_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    R = CHUNKED
    gen = cases.generator(seed, "chunked_local_mask sizes")
    chunk = cases.integer(gen, 3, 5)
    Lk = cases.integer(gen, 3 * chunk + 1, 4 * chunk - 1)  # chunk does not divide Lk

    def draw(g):
        n = cases.integer(g, 2 * chunk + 1, 5 * chunk)
        return (cases.integer(g, 2, n), n, chunk)

    public = [("prefill: Lq = Lk = 10, chunk 4 (a partial last chunk)", (10, 10, 4)),
              ("chunk = 1: each query sees only itself", (6, 6, 1))]
    edges = [("decode: one query at the first position of a chunk", (1, 2 * chunk + 1, chunk)),
             ("chunk >= Lk: plain causal", (4, 7, 9))]
    checks = P.int_mask_checks(R, seed, hidden, public, edges, draw) + [
        J.values(R, "3 queries after 9 keys, chunk 4", [Call((3, 12, 4))], public=True),
        J.raises(R.name, R.arg_names, "bad sizes raise ValueError",
                 [Call((0, 4, 2)), Call((5, 4, 2)), Call((3, 4, 0))], "Lq >= 1, Lq <= Lk and chunk >= 1"),
    ]
    if not hidden:
        return checks
    return checks + [
        J.values(R, "decode steps across a chunk border (Lq = 1)",
                 [Call((1, n, chunk)) for n in range(2 * chunk - 1, 2 * chunk + 3)]),
        J.values(R, "prefill of Lk keys, chunk not dividing Lk; queries across two chunks",
                 [Call((Lk, Lk, chunk)), Call((chunk + 2, Lk, chunk))]),
    ]


# --------------------------------------------------------------------------- padded_chunked_mask

def _chunked_with(attention_mask, Lq, chunk, pad, keys=True):
    """bool (B, 1, Lq, Lk): chunks counted from ``pad`` (B,), keys masked by ``attention_mask`` or not."""
    Lk = attention_mask.shape[-1]
    p = torch.arange(Lk - Lq, Lk)[:, None]
    j = torch.arange(Lk)[None, :]
    off = pad[:, None, None, None]
    same = (j - off).div(chunk, rounding_mode="floor") == (p - off).div(chunk, rounding_mode="floor")
    m = (j <= p) & same
    return m & attention_mask[:, None, None, :] if keys else m


def diagnose_padded(args, kwargs, got, index, dtype) -> str | None:
    mask, Lq, chunk = args[:3]
    mask = mask.bool()
    pad = (~mask).long().cumprod(dim=-1).sum(dim=-1)
    zero = torch.zeros_like(pad)
    ref = am.padded_chunked_mask(mask, Lq, chunk)
    Lk = mask.shape[-1]
    i = torch.arange(Lq)[:, None]
    j = torch.arange(Lk)[None, :]
    off = pad[:, None, None, None]
    return dg.name_mistake(got, [
        (M["inverted"], lambda: ~ref),
        (X["padchunk_from_zero"], lambda: _chunked_with(mask, Lq, chunk, zero)),
        (X["padchunk_pad_keys"], lambda: _chunked_with(mask, Lq, chunk, pad, keys=False)),
        (X["padchunk_from_zero"], lambda: _chunked_with(mask, Lq, chunk, zero, keys=False)),
        (X["padchunk_all_false"], lambda: _chunked_with(mask, Lq, chunk, (~mask).long().sum(dim=-1))),
        (X["chunk_top_left"], lambda: ((j <= i) & ((j - off).div(chunk, rounding_mode="floor")
                                                   == (i - off).div(chunk, rounding_mode="floor"))
                                       & mask[:, None, None, :])),
    ], dtype)


PADDED = J.Recipe("padded_chunked_mask", am.padded_chunked_mask, ("attention_mask", "Lq", "chunk"),
                  (J.Out("mask", "mask", "(B, 1, Lq, Lk)",
                         lambda a, k: (a[0].shape[0], 1, a[1], a[0].shape[-1])),), diagnose_padded)


def left_padded(gen, B: int, Lk: int, pads: list[int] | None = None, holes: bool = False) -> torch.Tensor:
    """bool (B, Lk), True = a real token: row b starts with pads[b] False (random when None); with
    ``holes``, one real row also gets a False after its first real token (a masked key, not padding)."""
    pads = pads if pads is not None else [cases.integer(gen, 0, Lk - 2) for _ in range(B)]
    m = torch.arange(Lk)[None, :] >= torch.tensor(pads)[:, None]
    if holes:
        b = int(torch.argmin(torch.tensor(pads)))
        m[b, cases.integer(gen, pads[b] + 1, Lk - 1)] = False
    return m


@exercise(3, "padded_chunked_mask(attention_mask, Lq, chunk): bool (B, 1, Lq, Lk), True = may attend: "
          "query i of row b at p = Lk - Lq + i sees key j iff attention_mask[b, j], j <= p and "
          "(j - pad_b) // chunk == (p - pad_b) // chunk, pad_b = the number of leading False of row b "
          "(transformers' chunked overlay with left padding).")
def padded_chunked_mask_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    R = PADDED
    pub = cases.generator(cases.PUBLIC_SEED, R.name)
    checks = [
        J.values(R, "prefill, chunk 3, left padding of 0, 2 and 5 (B=3, Lk=10)",
                 [Call((left_padded(pub, 3, 10, [0, 2, 5]), 10, 3))], public=True),
        J.values(R, "decode: one query after 8 keys, chunk 4, left padding of 1 and 3",
                 [Call((left_padded(pub, 2, 9, [1, 3]), 1, 4))], public=True),
        J.values(R, "a masked key after the first real token shifts nothing (B=2, Lk=9, chunk 3)",
                 [Call((left_padded(pub, 2, 9, [2, 0], holes=True), 9, 3))], public=True),
        J.raises(R.name, R.arg_names, "bad sizes raise ValueError",
                 [Call((left_padded(pub, 2, 6, [0, 1]), 0, 2)), Call((left_padded(pub, 2, 6, [0, 1]), 7, 2)),
                  Call((left_padded(pub, 2, 6, [0, 1]), 3, 0))], "1 <= Lq <= Lk and chunk >= 1"),
    ]
    if not hidden:
        return checks
    gen = cases.generator(seed, R.name)
    chunk = cases.integer(gen, 2, 4)
    B, Lk = cases.integer(gen, 3, 4), cases.integer(gen, 3 * chunk + 1, 4 * chunk + 2)
    x = lambda holes=False: left_padded(gen, B, Lk, holes=holes)  # noqa: E731
    return checks + [
        J.values(R, "prefill of random left-padded rows (random chunk, Lk)", [Call((x(), Lk, chunk))]),
        J.values(R, "the last Lq queries (a chunk of queries after a cache), random padding",
                 [Call((x(), cases.integer(gen, 2, chunk + 2), chunk)), Call((x(True), Lk - 1, chunk))]),
        J.values(R, "decode steps across a chunk border of a padded row",
                 [Call((left_padded(gen, 2, n, [cases.integer(gen, 1, 3), 0]), 1, chunk))
                  for n in range(2 * chunk + 2, 2 * chunk + 6)]),
        J.values(R, "a row that is all padding beside a real one; chunk >= Lk (plain causal over real keys)",
                 [Call((left_padded(gen, 2, Lk, [Lk, 1]), Lk, chunk)),
                  Call((left_padded(gen, 2, Lk, [2, 0]), Lk, Lk + 1))], edge=True),
        J.dtypes(R, "bool (True = may attend)", [Call((x(), Lk, chunk))]),
        P.on_device(R, "on attention_mask's device (meta)", [Call((x(), Lk, chunk), device="meta")],
                    vectorised=False),
        P.unchanged(R, "does not modify attention_mask", [Call((x(), Lk, chunk))]),
        P.on_cuda(R, "matches on CUDA", [Call((x(True), Lk - 2, chunk))]),
    ]


# --------------------------------------------------------------------------- ring_attention

RING_ATT = J.Recipe("ring_attention", am.ring_attention, ("q", "k", "v", "world", "layout"),
                    (J.Out("out", "number", "(B, H, L, dv)"), J.Out("lse", "logsumexp", "(B, H, L)")))


def ring_case(gen, world: int, layout: str, B: int = 1, c: int = 1, dtype=F32) -> Call:
    L = 2 * world * c
    return Call((*qkv(gen, B, 2, L, L, 4, 3, dtype), world, layout))


def ring_steps(name: str, calls: list[Call], public: bool = False, edge: bool = False) -> Check:
    """``edge``: one rank, whose one step is plain causal attention (one pass passes it)."""
    return Check(name, calls, MG.ring_steps_judge(RING_ATT.name, RING_ATT.arg_names), public=public,
                 kind="edge" if edge else "value")


@exercise(6, "ring_attention(q, k, v, world, layout='zigzag'): (out (B, H, L, dv), lse (B, H, L), steps): "
          "causal attention computed on a simulated ring of `world` ranks; steps[r] lists, in ring order, "
          "the (out_s, lse_s) of each step rank r ran (its local queries over the shard it held alone; "
          "all-False steps skipped), merged with your merge_partials.")
def ring_attention_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    R = RING_ATT
    pub = cases.generator(cases.PUBLIC_SEED, R.name)
    checks = [
        ring_steps("world = 2, L = 8, zigzag: out, lse and every rank's steps",
                   [ring_case(pub, 2, "zigzag", c=2)], public=True),
        ring_steps("world = 2, L = 8, contiguous: rank 0 skips the step holding rank 1's shard",
                   [ring_case(pub, 2, "contiguous", c=2)], public=True),
        ring_steps("world = 4, both layouts (B = 2, L = 8)",
                   [ring_case(pub, 4, "zigzag", B=2), ring_case(pub, 4, "contiguous", B=2)], public=True),
        J.raises(R.name, R.arg_names, "bad sizes or layout raise ValueError",
                 [Call((*qkv(pub, 1, 1, 6, 6, 2, 2), 2, "zigzag")),
                  Call((*qkv(pub, 1, 1, 8, 8, 2, 2), 2, "diagonal"))],
                 "2·world must divide L, and layout is 'zigzag' or 'contiguous'"),
    ]
    if not hidden:
        return checks
    gen = cases.generator(seed, R.name)
    c = cases.integer(gen, 1, 2)
    B = cases.integer(gen, 1, 2)
    return checks + [
        ring_steps("world = 3, zigzag and contiguous (random B, L)",
                   [ring_case(gen, 3, "zigzag", B, c), ring_case(gen, 3, "contiguous", B, c)]),
        ring_steps("world = 5, zigzag and contiguous (random B, L)",
                   [ring_case(gen, 5, "zigzag", B, c), ring_case(gen, 5, "contiguous", B, c)]),
        ring_steps("world = 5, layout left out (zigzag by default)",
                   [Call((*qkv(gen, B, 2, 10 * c, 10 * c, 4, 3), 5))]),
        ring_steps("world = 1: one rank, one step (plain causal)", [ring_case(gen, 1, "zigzag", B, 2)],
                   edge=True),
        P.unchanged(R, "does not modify inputs", [ring_case(gen, 3, "zigzag", B, c)]),
        Check("on the inputs' device (meta), layout left out",
              [Call(ring_case(gen, 3, "zigzag", B, c).args[:4], device="meta")],
              MG.ring_device_judge(R.name, R.arg_names), kind="property"),
        Check("matches on CUDA (world = 3, both layouts)",
              [Call(x.args, device=dev)
               for x in (ring_case(gen, 3, "zigzag", B, c), ring_case(gen, 3, "contiguous"))
               for dev in ("cuda", "cpu")],
              MG.ring_steps_judge(R.name, R.arg_names), requires="cuda"),
    ]


# --------------------------------------------------------------------------- cascade_attention

def _cascade_parts(args):
    """(prefix (out, lse), suffix masked (out, lse), suffix unmasked (out, lse)), float64, (N, H, .)."""
    q, pk, pv, sk, sv, n = args[:6]
    S = sk.shape[2]
    qq = q.double().transpose(0, 1)[None]  # (1, H, N, d)
    P_ = MG.attend64(qq, pk.double()[None], pv.double()[None], torch.ones(1, dtype=torch.bool))
    prefix = (P_[0][0].transpose(0, 1), P_[1][0].transpose(0, 1))
    real = (torch.arange(S)[None, :] < n[:, None])[:, None, None, :]  # (N, 1, 1, S)
    own = MG.attend64(q.double()[:, :, None], sk, sv, real)
    loose = MG.attend64(q.double()[:, :, None], sk, sv, torch.ones_like(real))
    return prefix, (own[0][:, :, 0], own[1][:, :, 0]), (loose[0][:, :, 0], loose[1][:, :, 0])


def diagnose_cascade(args, kwargs, got, index, dtype) -> str | None:
    prefix, own, loose = _cascade_parts(args)
    q = args[0]
    N, H, d = q.shape

    def reshaped():
        qq = q.double().reshape(1, H, N, d)
        everything = torch.ones(1, dtype=torch.bool)
        o, s = MG.attend64(qq, args[1].double()[None], args[2].double()[None], everything)
        return MG.merge64(o[0].reshape(N, H, -1), s[0].reshape(N, H), *own)

    return dg.name_mistake(got, [
        (X["cascade_suffix_unmasked"], lambda: MG.merge64(*prefix, *loose)),
        (X["cascade_pairs_mixed"], lambda: MG.merge64(prefix[0], own[1], own[0], prefix[1])),
        (X["cascade_reshape"], reshaped),
        (X["merge_average"], lambda: ((prefix[0] + own[0]) / 2, MG.merge64(*prefix, *own)[1])),
    ], dtype, index)


CASCADE = J.Recipe("cascade_attention", am.cascade_attention,
                   ("q", "prefix_k", "prefix_v", "suffix_k", "suffix_v", "suffix_lengths"),
                   (J.Out("out", "number", "(N, H, dv)"), J.Out("lse", "logsumexp", "(N, H)")),
                   diagnose_cascade)


def cascade_case(gen, N: int, H: int, P_: int, S: int, d: int = 4, dv: int = 3, dtype=F32,
                 lengths: torch.Tensor | None = None) -> tuple:
    return (cases.randn(gen, N, H, d, dtype=dtype), cases.randn(gen, H, P_, d, dtype=dtype),
            cases.randn(gen, H, P_, dv, dtype=dtype), cases.randn(gen, N, H, S, d, dtype=dtype),
            cases.randn(gen, N, H, S, dv, dtype=dtype),
            cases.lengths(gen, N, S) if lengths is None else lengths)


@exercise(4, "cascade_attention(q, prefix_k, prefix_v, suffix_k, suffix_v, suffix_lengths): (out (N, H, dv), "
          "lse (N, H)): one decoding query per sequence (q (N, H, d)) over a shared prefix (H, P, d) "
          "attended once for all N queries and its own suffix (N, H, S, d) whose first suffix_lengths[n] "
          "keys are real, merged with your merge_partials.")
def cascade_attention_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    R = CASCADE
    pub = cases.generator(cases.PUBLIC_SEED, R.name)
    checks = [
        J.values(R, "N = 3 sequences, H = 2, prefix of 5, suffixes of 2, 0 and 4 real keys (of S = 4)",
                 [Call(cascade_case(pub, 3, 2, 5, 4, lengths=torch.tensor([2, 0, 4])))], public=True),
        J.raises(R.name, R.arg_names, "shapes that do not fit, or lengths outside 0 .. S, raise ValueError",
                 [Call(cascade_case(pub, 2, 2, 3, 2, lengths=torch.tensor([1, 3]))),
                  Call((*cascade_case(pub, 2, 2, 3, 2)[:3], *cascade_case(pub, 3, 2, 3, 2)[3:]))],
                 "q (N, H, d), prefix (H, P, d|dv), suffix (N, H, S, d|dv), 0 <= suffix_lengths <= S"),
    ]
    if not hidden:
        return checks
    gen = cases.generator(seed, R.name)
    N, H = cases.integer(gen, 3, 6), cases.integer(gen, 1, 3)
    P_, S = cases.integer(gen, 4, 9), cases.integer(gen, 2, 5)
    x = lambda dtype=F32, scale=1.0: cascade_case(gen, N, H, P_, S, dtype=dtype)  # noqa: E731
    big = cascade_case(gen, 12, 2, 32, 3)
    return checks + [
        J.values(R, "random N, H, P, S; a sequence with no suffix key and one with all S",
                 [Call(x()), Call(x())]),
        J.values(R, "every suffix full; dv != d", [Call(cascade_case(gen, N, H, P_, S, d=4, dv=6,
                                                                     lengths=torch.full((N,), S)))]),
        J.values(R, "large scores (≈ 1e3) in the prefix and the suffixes",
                 [Call(tuple(t * 12 if t.dtype.is_floating_point and i in (0, 1, 3) else t
                             for i, t in enumerate(x())))]),
        J.values(R, "float16 (lse in float32)", [Call(x(F16))]),
        J.values(R, "bfloat16 (lse in float32)", [Call(x(BF16))]),
        J.dtypes(R, "out in q's dtype, lse float32", [Call(x(dt)) for dt in cases.FLOATS]),
        P.unchanged(R, "does not modify inputs", [Call(x())]),
        P.on_cuda(R, "matches on CUDA", [Call(x()), Call(x(F16))]),
        # The prefix read once is the exercise: it weighs as much as the values (a per-sequence loop keeps
        # about half the points).
        Check("reads the prefix once: N = 12 queries, P = 32 prefix keys, d = 4",
              [Call(big, allocations=True)],
              MG.prefix_once_judge(R.name, R.arg_names, X["cascade_per_sequence"],
                                   X["cascade_prefix_copied"]),
              kind="property", weight=8.0),
    ]
