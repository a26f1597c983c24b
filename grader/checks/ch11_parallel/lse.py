"""Chapter 11, masks across kernels and devices: ``attention_lse`` and ``merge_partials`` here;
``zigzag_ring_mask`` and ``ring_attention`` (:mod:`.ring`), ``chunked_local_mask`` and
``padded_chunked_mask`` (:mod:`.chunked`) and ``cascade_attention`` (:mod:`.cascade`) in the
chapter's other modules; its mistakes are :data:`MISTAKES11` (:mod:`.mistakes`).

Besides the values, two checks hold the pieces to what they are for: attention over a
partition of the keys, merged by log-sum-exp, equals attention over all keys (the student's
``attention_lse`` judged against itself, :func:`grader.checks.common.merging.partition_judge`, a
property: unmasked attention meets it too); and the W steps of a ring, masked by the
student's ``zigzag_ring_mask`` and merged, equal full causal attention
(:func:`grader.checks.common.merging.ring_judge`, rings of 2 ranks in public and 3 hidden). The
hidden cases draw what breaks real code: rows and parts with no allowed key, log-sum-exps
past float32's ``exp`` (±100 and more; ±1e4 with half-precision outputs, where float32's own
rounding of such an lse stays inside the tolerance), worlds of 3 to 5 ranks, chunks that do
not divide the sequence. Invalid sizes must raise ValueError (:func:`judges.raises`).
"""

from __future__ import annotations

import math

import torch

import attnmask as am

from ... import cases
from ... import diagnose as dg
from ...cases import with_empty_row
from ...mistakes import MISTAKES
from ...spec import Call, Check, exercise
from ..common import judges as J
from ..common import merging as MG
from ..common import properties as P
from ..common.inputs import exact_qkv, qkv
from .mistakes import MISTAKES11

M = MISTAKES
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
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


@exercise(2, "attention_lse(q, k, v, mask=None): (out (B, H, Lq, dv) in q's dtype, 0 on fully masked rows; "
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
        *P.device_checks(R, "on the inputs' device (meta), with and without a mask",
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


@exercise(3, "merge_partials(out1, lse1, out2, lse2): (out, lse) over the union of two disjoint key "
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
        *P.device_checks(R, "on the inputs' device (meta)", [Call(p(), device="meta")], vectorised=False),
        P.unchanged(R, "does not modify inputs", [Call(p())]),
        P.on_cuda(R, "matches on CUDA", [Call(p()), Call(p(F16))]),
    ]
