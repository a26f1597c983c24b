"""Chapter 2, the mask goes in before the softmax: ``to_additive``,
``masked_softmax`` and ``attention``.

:func:`softmax_mistakes` and :func:`attention_mistakes` are the recognisers of
the classic softmax/attention mistakes; chapters 5 and 6 reuse them.
"""

from __future__ import annotations

import math

import torch

import attnmask as am

from .. import cases
from .. import diagnose as dg
from ..cases import with_empty_row
from ..mistakes import MISTAKES
from ..spec import Call, Check, exercise
from .common import judges as J
from .common import properties as P

M = MISTAKES
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


# --------------------------------------------------------------------------- to_additive

def diagnose_additive(args, kwargs, got, index, dtype) -> str | None:
    mask = args[0]
    target = kwargs.get("dtype", F32)
    lowest = torch.finfo(target).min
    inf = float("inf")

    def fill(allowed: float, blocked: float) -> torch.Tensor:
        return torch.where(mask, allowed, blocked).double()

    return dg.name_mistake(got, [
        (M["zero_times_inf"], lambda: fill(float("nan"), -inf)),
        (M["inverted"], lambda: fill(-inf, 0.0)),
        (M["inverted"], lambda: fill(lowest, 0.0)),
        ("this is a multiplicative mask of ones and zeros: an additive mask is zero where attention is "
         "allowed and −∞ where it is blocked, so that softmax(scores + bias) ignores blocked keys.",
         lambda: fill(1.0, 0.0)),
        *[("blocked positions hold a finite value that is not negative enough: use −∞ or at most "
           "torch.finfo(dtype).min, the most negative number of the bias's dtype, so that no real score "
           "can outweigh it.",
           lambda v=v: fill(0.0, v).to(target).double())
          for v in (-1e4, -1e5, -1e9, -65504.0, -1e30) if float(torch.tensor(v).to(target)) > lowest],
    ], target)


ADDITIVE = J.Recipe(
    "to_additive", am.to_additive, ("mask",),
    (J.Out("bias", "additive", "the mask's shape", dtype=lambda a, k: k.get("dtype", F32)),),
    diagnose_additive,
)


@exercise(1, "to_additive(mask, dtype=torch.float32): 0 where the mask is True, -inf (or <= "
          "finfo(dtype).min) where False; same shape, requested dtype, on the mask's device.")
def to_additive_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    R = ADDITIVE
    pub = am.causal_mask(3, n_keys=4, align="top_left")  # (3, 4): readable, with both values
    checks = [
        J.values(R, "0 where True, -inf where False (Lq=3, Lk=4)", [Call((pub,))], public=True),
        J.values(R, "dtype=float16 (B=2, 1, 1, Lk=4)",
                 [Call((torch.tensor([[True, True, False, False], [True] * 4])[:, None, None],),
                       {"dtype": F16})], public=True),
    ]
    if not hidden:
        return checks
    gen = cases.generator(seed, R.name)
    B, Lq, Lk = cases.integer(gen, 2, 3), cases.integer(gen, 2, 6), cases.integer(gen, 7, 12)
    m = lambda *s: cases.random_mask(gen, *s)  # noqa: E731
    return checks + [
        J.values(R, "matches reference (random masks)",
                 [Call((m(B, 1, Lq, Lk),)), Call((m(Lq, Lk),), {"dtype": BF16}),
                  Call((m(B, 1, 1, Lk),), {"dtype": F16})]),
        J.dtypes(R, "returns the requested dtype", [Call((m(Lq, Lk),), {"dtype": d}) for d in cases.FLOATS]),
        *P.device_checks(R, "stays on the mask's device (meta)",
                    [Call((m(B, 1, Lq, Lk),), {"dtype": F16}, "meta"), Call((m(Lq, Lk),), device="meta")]),
        P.unchanged(R, "does not modify the mask", [Call((m(Lq, Lk),))]),
        P.on_cuda(R, "matches on CUDA", [Call((m(B, 1, Lq, Lk),), {"dtype": F16})]),
        J.values(R, "a fully blocked row, dtype left at its default",
                 [Call((with_empty_row(m(B, 1, Lq, Lk), gen),))]),
    ]


# --------------------------------------------------------------------------- masked_softmax

def _blocked_rows(mask: torch.Tensor, shape) -> torch.Tensor:
    return ~torch.broadcast_to(mask, shape).any(dim=-1, keepdim=True)  # (..., Lq, 1)


def softmax_mistakes(scores: torch.Tensor, mask: torch.Tensor | None) -> list[dg.Candidate]:
    """What the classic masked-softmax mistakes return on ``scores``/``mask`` (float64)."""
    ref = lambda: am.masked_softmax(scores, mask)  # noqa: E731
    if mask is None:
        return [(M["wrong_dim"], lambda: torch.softmax(scores, dim=-2))]
    full = torch.broadcast_to(mask, scores.shape)
    empty = _blocked_rows(mask, scores.shape)
    Lk = scores.shape[-1]

    def filled(value, zero_empty=False):
        w = torch.softmax(scores.masked_fill(~full, value), dim=-1)
        return w.masked_fill(empty, 0.0) if zero_empty else w

    return [
        (M["nan_rows"], lambda: ref().masked_fill(empty, float("nan"))),
        (M["uniform_rows"], lambda: torch.where(empty, torch.full_like(scores, 1.0 / Lk), ref())),
        (M["inverted"], lambda: am.masked_softmax(scores, ~full)),
        (M["inverted"], lambda: torch.softmax(scores.masked_fill(full, float("-inf")), dim=-1)),
        (M["after_softmax"], lambda: torch.softmax(scores, dim=-1) * full),
        (M["multiply_logits"], lambda: torch.softmax(scores * full, dim=-1)),
        (M["wrong_dim"], lambda: am.masked_softmax(scores.mT, full.mT).mT),
        (M["wrong_dim"], lambda: torch.softmax(scores.masked_fill(~full, float("-inf")), dim=-2)),
        (M["zero_times_inf"], lambda: torch.softmax(scores + (~full).double() * float("-inf"), dim=-1)),
        (M["zero_times_inf"], lambda: torch.zeros_like(scores)),
        (M["global_max"], lambda: global_max(scores, full)),
        (M["global_max"], lambda: global_max(scores, full).nan_to_num(0.0)),
        *[(M["fill_not_negative"], lambda v=v, z=z: filled(v, z))
          for v in (-1e4, -1e5, -1e9, -65504.0) for z in (False, True)],
    ]


def global_max(scores: torch.Tensor, full: torch.Tensor) -> torch.Tensor:
    """Softmax stabilised by the max over every entry, blocked ones included,
    computed in float32 so that the allowed entries underflow where they would
    for the student (float64 reaches exp(-700) before it does)."""
    x = scores.float()
    e = (x - x.amax(dim=-1, keepdim=True)).exp() * full
    return (e / e.sum(dim=-1, keepdim=True)).to(scores.dtype)


def diagnose_softmax(args, kwargs, got, index, dtype) -> str | None:
    scores, mask = args[0], args[1]
    return dg.name_mistake(got, softmax_mistakes(scores, mask), dtype)


SOFTMAX = J.Recipe("masked_softmax", am.masked_softmax, ("scores", "mask"),
                   (J.Out("weights", "number", "(..., Lq, Lk)"),), diagnose_softmax)


def lowest_allowed(scores: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(scores, mask)`` with every allowed score of every other row at float32's lowest finite value
    (finite, as the contract asks): the row's weights are uniform over its allowed keys, and a fill of
    ``torch.finfo(torch.float32).min`` makes its blocked keys tie with them."""
    low = torch.finfo(torch.float32).min
    rows = (torch.arange(scores.shape[-2]) % 2 == 0)[:, None]  # (Lq, 1)
    return torch.where(rows & mask, low, scores), mask


@exercise(2.5, "masked_softmax(scores, mask): softmax over the last dim with the bool mask applied "
          "before normalising; fully masked rows give zeros, never NaN.")
def masked_softmax_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    R = SOFTMAX
    pub = cases.generator(cases.PUBLIC_SEED, R.name)
    causal = am.causal_mask(3, n_keys=4)
    blocked = torch.tensor([[True, False, True, False], [False] * 4, [True, True, True, False]])
    checks = [
        J.values(R, "matches reference (Lq=3, Lk=4)", [Call((cases.randn(pub, 3, 4), causal))], public=True),
        J.values(R, "fully masked row → zeros", [Call((cases.randn(pub, 2, 3, 4), blocked))], public=True),
        # an answer right in the forward pass can still send NaN back from the empty row (the additive route)
        P.gradients(R, "finite gradients with a fully masked row, match reference",
                    [Call((cases.randn(pub, 3, 4), blocked))], public=True),
    ]
    if not hidden:
        return checks
    gen = cases.generator(seed, R.name)
    # B != Lq != Lk, so that a transposed or mis-broadcast result cannot pass
    B, H, Lq, Lk = 2, cases.integer(gen, 2, 3), cases.integer(gen, 3, 5), cases.integer(gen, 6, 9)
    s = lambda dtype=F32, scale=1.5: cases.randn(gen, B, H, Lq, Lk, dtype=dtype, scale=scale)  # noqa: E731
    full = lambda: with_empty_row(cases.random_mask(gen, B, H, Lq, Lk), gen)  # noqa: E731
    keys = lambda: cases.random_mask(gen, B, 1, 1, Lk) | (torch.arange(Lk) == 0)  # noqa: E731
    square = lambda: with_empty_row(cases.random_mask(gen, Lq, Lk), gen)  # noqa: E731
    very_negative = cases.randn(gen, B, H, Lq, Lk, scale=3.0) - 1e5
    return checks + [
        J.values(R, "matches reference (B=2, H, Lq, Lk)", [Call((s(), full()))]),
        J.values(R, "mask broadcasts: (B, 1, 1, Lk), (Lq, Lk)", [Call((s(), keys())), Call((s(), square()))]),
        J.values(R, "float16, with a fully masked row", [Call((s(F16), full())), Call((s(F16), keys()))]),
        J.values(R, "bfloat16, with a fully masked row",
                 [Call((s(BF16), full())), Call((s(BF16), square()))]),
        J.values(R, "very negative scores (≈ -1e5)", [Call((very_negative, full()))]),
        # a -1e9 fill passes the case above; it outweighs allowed scores of -1e10
        J.values(R, "scores of ±1e10, and rows whose every score is about -1e10",
                 [Call((cases.exact_scores(gen, B, H, Lq, Lk, kind="huge"), full())),
                  Call((cases.exact_scores(gen, B, H, Lq, Lk, kind="negative"), full()))]),
        # a finfo(float32).min fill ties with allowed scores at float32's lowest: blocked keys take weight
        J.values(R, "allowed scores at float32's lowest beside blocked keys",
                 [Call(lowest_allowed(s(), full()))]),
        J.dtypes(R, "keeps the scores' dtype", [Call((s(d), full())) for d in cases.FLOATS]),
        P.gradients(R, "finite gradients, match reference",
                    [Call((s(), cases.two_keys_or_none(full()))),
                     Call((s(BF16), cases.two_keys_or_none(square())))]),
        P.unchanged(R, "does not modify inputs", [Call((s(), full()))]),
        P.on_cuda(R, "matches on CUDA", [Call((s(F16), full())), Call((s(), keys()))]),
        J.values(R, "large scores at blocked keys (≈ +1e4), with a fully masked row",
                 [Call(large_blocked(s(), full())), Call(large_blocked(s(F16), full()))]),
        *P.device_checks(R, "runs on the inputs' device (meta)", [Call((s(), full()), device="meta")],
                    vectorised=False),
    ]


def large_blocked(scores: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(scores, mask)`` with the blocked scores of every other query row raised by
    1e4: a softmax whose stabilising max also reads blocked entries underflows the
    allowed ones there (the other rows keep ordinary scores, so that this case
    tells that mistake apart from masking after the softmax)."""
    loud = (~mask) & (torch.arange(scores.shape[-2]) % 2 == 0)[:, None]
    return scores.masked_fill(loud, 0.0) + loud.to(scores.dtype) * 1e4, mask


# --------------------------------------------------------------------------- attention

def attention_with(q, k, v, weights_fn, scale) -> tuple[torch.Tensor, torch.Tensor]:
    w = weights_fn(q @ k.transpose(-2, -1) * scale)
    return w @ v, w


def attention_mistakes(q, k, v, mask) -> list[dg.Candidate]:
    """What the classic attention mistakes return: a wrong scale, or any of the
    masked-softmax mistakes inside an otherwise correct attention."""
    d = q.shape[-1]
    ref_weights = lambda s: am.masked_softmax(s, mask)  # noqa: E731
    out = [
        (M["no_scale"], lambda: attention_with(q, k, v, ref_weights, 1.0)),
        (M["scale_1_over_d"], lambda: attention_with(q, k, v, ref_weights, 1.0 / d)),
    ]
    scores = q @ k.transpose(-2, -1) / math.sqrt(d)
    for message, thunk in softmax_mistakes(scores, mask):
        out.append((message, lambda thunk=thunk: (thunk() @ v, thunk())))
    return out


def diagnose_attention(args, kwargs, got, index, dtype) -> str | None:
    q, k, v = args[:3]
    mask = args[3] if len(args) > 3 else None
    return dg.name_mistake(got, attention_mistakes(q, k, v, mask), dtype, index)


ATTENTION = J.Recipe("attention", am.attention, ("q", "k", "v", "mask"),
                     (J.Out("out", "number", "(..., Lq, dv)"), J.Out("weights", "number", "(..., Lq, Lk)")),
                     diagnose_attention)


def future_rows(call: Call) -> torch.Tensor:
    """The query rows before t = Lq // 2, where :func:`causal_pairs` starts changing tokens."""
    q = call.args[0]
    Lq = q.shape[-2]
    return torch.arange(Lq) < Lq // 2


def causal_pairs(gen: torch.Generator, shape_q, dtype=F32) -> list[Call]:
    """Two self-attention calls with a causal mask, differing from t = L // 2 on."""
    *lead, L, d = shape_q
    q, k, v = (cases.randn(gen, *shape_q, dtype=dtype) for _ in range(3))
    q2, k2, v2 = (t.clone() for t in (q, k, v))
    for t in (q2, k2, v2):
        t[..., L // 2:, :] = cases.randn(gen, *lead, L - L // 2, d, dtype=dtype) * 3
    mask = am.causal_mask(L)
    return [Call((q, k, v, mask)), Call((q2, k2, v2, mask))]


def padding_pairs(gen: torch.Generator, B: int, L: int, d: int, dtype=F32) -> list[Call]:
    """Two self-attention calls with a key padding mask (B, 1, 1, L), differing
    only at padded positions."""
    lengths = cases.positive_lengths(gen, B, L)
    lengths[0] = max(1, L - 2)  # at least one sequence with padding
    real = am.padding_mask(lengths, L)  # (B, L)
    q, k, v = (cases.randn(gen, B, 1, L, d, dtype=dtype) for _ in range(3))
    noise = lambda: cases.randn(gen, B, 1, L, d, dtype=dtype) * 3  # noqa: E731
    pad = ~real[:, None, :, None]
    q2, k2, v2 = (torch.where(pad, noise(), t) for t in (q, k, v))
    mask = real[:, None, None, :]
    return [Call((q, k, v, mask)), Call((q2, k2, v2, mask))]


def real_rows(call: Call) -> torch.Tensor:
    """Query rows that are real tokens: the key padding mask (B, 1, 1, L) read as rows."""
    mask = call.args[-1]
    return mask[:, :, 0, :]  # (B, 1, L)



@exercise(2.5, "attention(q, k, v, mask=None): scaled dot-product attention with scale 1/sqrt(d); "
          "returns (out (..., Lq, dv), weights (..., Lq, Lk)), zeros for fully masked rows.")
def attention_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    R = ATTENTION
    pub = cases.generator(cases.PUBLIC_SEED, R.name)
    r = lambda *s, dtype=F32: cases.randn(pub, *s, dtype=dtype)  # noqa: E731
    checks = [
        J.values(R, "no mask (Lq=3, Lk=3, d=4)", [Call((r(3, 4), r(3, 4), r(3, 4)))], public=True),
        J.values(R, "causal mask (L=4, d=2)", [Call((r(4, 2), r(4, 2), r(4, 2), am.causal_mask(4)))],
                 public=True),
        J.values(R, "fully masked row → zero weights and output",
                 [Call((r(2, 3, 2), r(2, 4, 2), r(2, 4, 3),
                        torch.tensor([[True, False, True, True], [False] * 4, [True, True, False, False]])))],
                 public=True),
    ]
    if not hidden:
        return checks
    gen = cases.generator(seed, R.name)
    # B != Lq != Lk, so that a transposed or mis-broadcast result cannot pass
    B, H, Lq, Lk = 2, cases.integer(gen, 2, 3), cases.integer(gen, 3, 5), cases.integer(gen, 6, 9)
    d, dv = cases.integer(gen, 4, 8), cases.integer(gen, 2, 5)

    def qkv(dtype=F32, lead=(B, H)):
        return (cases.randn(gen, *lead, Lq, d, dtype=dtype), cases.randn(gen, *lead, Lk, d, dtype=dtype),
                cases.randn(gen, *lead, Lk, dv, dtype=dtype))

    def exact(kind):  # head width 4, scores exact in float32 however large (grader.cases.exact_qk)
        q, k = cases.exact_qk(gen, (B, H, Lq, cases.EXACT_D), (B, H, Lk, cases.EXACT_D), kind)
        return q, k, cases.randn(gen, B, H, Lk, dv)

    full = lambda: with_empty_row(cases.random_mask(gen, B, H, Lq, Lk), gen)  # noqa: E731
    keys = lambda: cases.random_mask(gen, B, 1, 1, Lk) | (torch.arange(Lk) == 0)  # noqa: E731
    square = lambda: with_empty_row(cases.random_mask(gen, Lq, Lk), gen)  # noqa: E731
    return checks + [
        J.values(R, "matches reference (B=2, H, Lq ≠ Lk, d ≠ dv)",
                 [Call((*qkv(), full())), Call(qkv()), Call((*qkv(lead=()), square()))]),
        J.values(R, "mask broadcasts: (B, 1, 1, Lk), (Lq, Lk)",
                 [Call((*qkv(), keys())), Call((*qkv(), square()))]),
        J.values(R, "float16, with a fully masked row", [Call((*qkv(F16), full()))]),
        J.values(R, "bfloat16, with a fully masked row", [Call((*qkv(BF16), full()))]),
        J.dtypes(R, "keeps the inputs' dtype", [Call((*qkv(d_), square())) for d_ in cases.FLOATS]),
        Check("future tokens do not change earlier outputs", causal_pairs(gen, (B, H, 6, d)),
              P.pair_judge(R, future_rows, M["future_leak"]), kind="property"),
        Check("padded tokens do not change real outputs", padding_pairs(gen, B + 1, 6, d),
              P.pair_judge(R, real_rows, M["padding_leak"]), kind="property"),
        P.gradients(R, "finite gradients, match reference",
                    [Call((*qkv(), cases.two_keys_or_none(full()))),
                     Call((*qkv(BF16), cases.two_keys_or_none(keys())))]),
        J.values(R, "rows whose every score is below -2e9 (a -1e9 fill outweighs them)",
                 [Call((*exact("negative"), full())), Call((*exact("huge"), keys()))]),
        P.unchanged(R, "does not modify inputs", [Call((*qkv(), full()))]),
        P.on_cuda(R, "matches on CUDA", [Call((*qkv(F16), full())), Call((*qkv(), keys()))]),
        J.values(R, "large scores at blocked keys, with a fully masked row",
                 [Call(large_blocked_qkv(*qkv(), keys())), Call(large_blocked_qkv(*qkv(), keys()))]),
        *P.device_checks(R, "mask omitted or given: made on the inputs' device (meta)",
                    [Call(qkv(), device="meta"), Call((*qkv(), full()), device="meta")], vectorised=False),
    ]


def large_blocked_qkv(q, k, v, keys):
    """``(q, k, v, mask)`` for a key-padding mask ``keys (B, 1, 1, Lk)``: padded keys
    score hundreds of times more than real ones in every other query row (q >= 0,
    padded keys' entries raised by 300; the other rows' q scaled by 1e-3 keep
    ordinary scores), and one query row has every key blocked."""
    Lq = q.shape[-2]
    mask = keys.expand(*keys.shape[:-2], Lq, keys.shape[-1]).clone()
    mask[..., Lq // 2, :] = False
    quiet = (torch.arange(Lq) % 2 == 1)[:, None]
    q = torch.where(quiet, q.abs() * 1e-3, q.abs())
    k = torch.where((~keys).mT, k.abs() + 300.0, k)
    return q, k, v, mask
