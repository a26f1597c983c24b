"""Chapter 9, masks in real models: ``left_padding_position_ids``,
``packed_labels``, ``gqa_attention`` and ``alibi_bias``.

Position ids and labels are integer outputs ("integer" kind: compared exactly,
judged as long). Every value check mixes any degenerate case (one token, all
padding, a single head) with cases that only the right computation passes, so
that constant or copied outputs earn nothing.
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
from .ch2_softmax import attention_mistakes
from .common import judges as J
from .common import properties as P

M = MISTAKES
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
LONG = lambda a, k: torch.long  # noqa: E731

#: The chapter's classic mistakes, in plain words (one definition each).
MISTAKES9: dict[str, str] = {
    "counts_padding": "the position ids count the padding: a row's first real token is position zero, as "
                      "if the row were alone. Count the real tokens only: a running count of keep along the "
                      "row, minus one.",
    "positions_from_1": "the position ids start at one: the first real token is position zero (the running "
                        "count of real tokens, minus one).",
    "padding_not_zero": "padding positions must be zero: the running count minus one leaves minus one before "
                        "the first real token. Fill the padding with zero (masked_fill where keep is False).",
    "pads_subtracted": "the positions are arange(L) minus the number of padding tokens: that numbers the "
                       "real tokens right only when all the padding is on the left, and it gives the padding "
                       "itself negative positions. Count the real tokens (a running count of keep along the "
                       "row, minus one) and put zero at padding.",
    "not_restarted": "the position ids do not restart at each row: the count runs across the batch. "
                     "Count along each row: a cumulative sum over the last axis.",
    "not_shifted": "the labels are not shifted: position t is trained to predict the *next* token, so its "
                   "label is the token at the next position.",
    "shifted_back": "the labels are shifted the wrong way: the label of position t is the token at the next "
                    "position, not the previous one.",
    "cross_document": "the labels leak across documents: the last token of a document must not learn to "
                      "predict the first token of the next one. Put ignore_index wherever "
                      "the next position's doc_id differs from this one's.",
    "border_late": "ignore_index sits one position late: it belongs at the last token of a document (whose "
                   "next token starts another), not at the first token of the next document.",
    "ids_step": "a document ends wherever doc_ids changes, by any amount: ids may skip values. Compare each "
                "id with the next one for inequality, not their difference with one.",
    "last_column": "the last column must be ignore_index: there is no next token to predict "
                   "(torch.roll wraps the first token around).",
    "ignore_constant": "ignore_index is ignored: fill with the argument, not PyTorch's default constant.",
    "gqa_repeat": "key/value heads are tiled (first, second, first, second, ...), as .repeat does: query "
                  "head h must use key/value head h // G, each key/value head repeated G times in place "
                  "(first, first, second, second, ...: repeat_interleave over the head axis).",
    "scale_dv": "the scores are scaled by one over sqrt(dv), the value width; the scale is one over sqrt(d), "
                "d the width of q and k.",
    "alibi_top_left": "the ALiBi bias is aligned top-left: with Lk > Lq (a KV cache), query i sits at "
                      "position Lk - Lq + i: it sees the keys up to Lk - Lq + i, and distances count from "
                      "there.",
    "alibi_slopes_pow2": "the slopes are wrong when n_heads is not a power of two: take the slopes of m = "
                         "the largest power of two below n_heads, then the first n_heads - m of the "
                         "even-indexed slopes of 2m, counting from zero (the ones that fall between m's).",
    "alibi_odd_slopes": "the extra slopes come from the odd indices of 2m's slopes: those are the slopes of "
                        "m over again. Take the even indices, counting from zero: the slopes of 2m that fall "
                        "between m's.",
    "alibi_sign": "the bias has the wrong sign: farther keys must score *lower*, -slope_h * (pos_q - j).",
    "alibi_not_causal": "the future is not masked: keys j > pos_q must be −∞ (this ALiBi bias is causal).",
    "alibi_key_form": "the bias is slope_h * j (BLOOM's form), which differs from the contract by a constant "
                      "per row: equal after the softmax, but the contract asks for -slope_h * (pos_q - j), "
                      "zero on the diagonal.",
    "alibi_reversed": "the slopes are in reverse order: the first head must get the largest slope, the last "
                      "the smallest.",
    "alibi_finite": "blocked entries must be −∞, not a large finite number.",
}
X = MISTAKES9


# --------------------------------------------------------------------------- left_padding_position_ids

def diagnose_positions(args, kwargs, got, index, dtype) -> str | None:
    (keep,) = args
    B, L = keep.shape
    count = keep.long().cumsum(-1)
    t = torch.arange(L).expand(B, L)
    flat = keep.long().flatten().cumsum(0).view(B, L)
    return dg.name_mistake(got, [
        (X["counts_padding"], lambda: torch.where(keep, t, 0)),
        (X["counts_padding"], lambda: t),
        (X["positions_from_1"], lambda: count.masked_fill(~keep, 0)),
        (X["padding_not_zero"], lambda: count - 1),
        (X["padding_not_zero"], lambda: (count - 1).masked_fill(~keep, 1)),
        (X["pads_subtracted"], lambda: t - (~keep).sum(-1, keepdim=True)),
        (X["pads_subtracted"], lambda: (t - (~keep).sum(-1, keepdim=True)).masked_fill(~keep, 0)),
        (X["pads_subtracted"], lambda: (t - (~keep).sum(-1, keepdim=True)).clamp(min=0)),
        (X["not_restarted"], lambda: (flat - 1).masked_fill(~keep, 0)),
        (X["not_restarted"], lambda: (keep.long().cumsum(0) - 1).masked_fill(~keep, 0)),
    ], torch.float64)


POSITIONS = J.Recipe("left_padding_position_ids", am.left_padding_position_ids, ("keep",),
                     (J.Out("positions", "integer", "(B, L)", lambda a, k: tuple(a[0].shape), LONG),),
                     diagnose_positions)


def left_padded(gen: torch.Generator, B: int, L: int) -> torch.Tensor:
    """bool (B, L) keep mask, left padded: row lengths from 1 to L, one row full."""
    lengths = cases.positive_lengths(gen, B, L)
    lengths[0] = max(1, L // 2)  # at least one row with padding (and one full, from positive_lengths)
    return torch.arange(L)[None, :] >= (L - lengths)[:, None]


@exercise(1.5, "left_padding_position_ids(keep): int64 (B, L), each row's real tokens (keep True) "
          "numbered 0, 1, 2, ... in order; 0 at padding.")
def left_padding_position_ids_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    R = POSITIONS
    rows = lambda *r: torch.tensor(r, dtype=torch.bool)  # noqa: E731
    checks = [
        J.values(R, "left padding [0 0 1 1 1], [1 1 1 1 1]",
                 [Call((rows([0, 0, 1, 1, 1], [1, 1, 1, 1, 1]),))], public=True),
        J.values(R, "right padding and gaps [1 1 0 0], [0 1 0 1]",
                 [Call((rows([1, 1, 0, 0], [0, 1, 0, 1]),))], public=True),
    ]
    if not hidden:
        return checks
    gen = cases.generator(seed, R.name)
    B, L = cases.integer(gen, 3, 5), cases.integer(gen, 6, 12)
    anywhere = cases.random_mask(gen, B, L, p=0.6)
    anywhere[0, 0], anywhere[0, -1] = False, True  # a gap-starting row, never all padding
    edge = rows([0, 0, 0], [0, 1, 1])  # a row of padding only, beside a left-padded one
    keep = left_padded(gen, B, L)
    return checks + [
        J.values(R, "left padding (random B, L)", [Call((left_padded(gen, B, L),)), Call((keep,))]),
        J.values(R, "any pattern: padding anywhere", [Call((anywhere,))]),
        J.values(R, "a row of padding only; one token", [Call((edge,)), Call((rows([1]),)),
                                                         Call((left_padded(gen, 2, 5),))]),
        J.dtypes(R, "returns int64", [Call((keep,))]),
        *P.device_checks(R, "on keep's device, vectorised (meta)", [Call((keep,), device="meta")]),
        P.unchanged(R, "does not modify keep", [Call((keep,))]),
        P.on_cuda(R, "matches on CUDA", [Call((anywhere,))]),
    ]


# --------------------------------------------------------------------------- packed_labels

def diagnose_labels(args, kwargs, got, index, dtype) -> str | None:
    tokens, doc_ids = args[:2]
    L = tokens.shape[1]
    ignore = args[2] if len(args) > 2 else kwargs.get("ignore_index", -100)
    same = torch.zeros_like(doc_ids, dtype=torch.bool)
    same[:, :-1] = doc_ids[:, 1:] == doc_ids[:, :-1]  # (B, L): t and t+1 in one document
    nxt = torch.roll(tokens, -1, dims=1)
    prev = torch.roll(tokens, 1, dims=1)
    starts = torch.ones_like(same)
    starts[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    last = torch.zeros_like(same)
    last[:, -1] = True
    return dg.name_mistake(got, [
        (X["ignore_constant"], lambda: am.packed_labels(tokens, doc_ids)),
        (X["not_shifted"], lambda: torch.where(same, tokens, ignore)),
        (X["not_shifted"], lambda: tokens),
        (X["shifted_back"], lambda: torch.where(starts, ignore, prev)),
        (X["cross_document"], lambda: torch.where(last, ignore, nxt)),
        (X["ids_step"], lambda: torch.where(last | (torch.roll(doc_ids, -1, dims=1) - doc_ids == 1),
                                            ignore, nxt)),
        (X["border_late"], lambda: torch.where(starts | last, ignore, nxt)),
        (X["border_late"], lambda: torch.where((starts & (torch.arange(L) > 0)) | last, ignore, nxt)),
        (X["last_column"], lambda: torch.where(same | last, nxt, ignore)),
        (X["last_column"], lambda: nxt),
    ], torch.float64)


LABELS = J.Recipe("packed_labels", am.packed_labels, ("tokens", "doc_ids", "ignore_index"),
                  (J.Out("labels", "integer", "(B, L)", lambda a, k: tuple(a[0].shape), LONG),),
                  diagnose_labels)


def sorted_doc_ids(gen: torch.Generator, B: int, L: int) -> torch.Tensor:
    """long (B, L), non-decreasing runs: 2 to 4 documents per row (L >= 4),
    starting ids that differ per row. In even rows the ids jump by 2 to 5 from one
    document to the next (ids need not be consecutive), in odd rows by 1."""
    rows = []
    for b in range(B):
        n = cases.integer(gen, 2, min(4, L))
        cuts = sorted(torch.randperm(L - 1, generator=gen)[: n - 1].add(1).tolist())
        start = torch.zeros(L, dtype=torch.long)
        for cut in cuts:
            start[cut] = cases.integer(gen, 2, 5) if b % 2 == 0 else 1
        rows.append(start.cumsum(0) + cases.integer(gen, 0, 5))
    return torch.stack(rows)


@exercise(1.5, "packed_labels(tokens, doc_ids, ignore_index=-100): int64 (B, L), tokens[b, t + 1] where "
          "t + 1 is in t's document, else ignore_index; the last column is ignore_index.")
def packed_labels_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    R = LABELS
    checks = [
        J.values(R, "three documents [0 0 0 1 1 2]",
                 [Call((torch.tensor([[5, 6, 7, 8, 9, 10]]), torch.tensor([[0, 0, 0, 1, 1, 2]])))],
                 public=True),
        J.values(R, "two rows, ignore_index=-1",
                 [Call((torch.tensor([[3, 1, 4, 1], [5, 9, 2, 6]]),
                        torch.tensor([[0, 0, 1, 1], [4, 4, 4, 4]]), -1))], public=True),
    ]
    if not hidden:
        return checks
    gen = cases.generator(seed, R.name)
    B, L = cases.integer(gen, 2, 4), cases.integer(gen, 6, 12)
    tok = lambda b=B, n=L: torch.randint(0, 50, (b, n), generator=gen)  # noqa: E731
    ids = sorted_doc_ids(gen, B, L)
    singles = torch.arange(4)[None].expand(2, 4).contiguous()  # every token its own document
    return checks + [
        J.values(R, "matches reference (random B, L, documents)",
                 [Call((tok(), ids)), Call((tok(), sorted_doc_ids(gen, B, L)))]),
        J.values(R, "ignore_index from the argument", [Call((tok(), sorted_doc_ids(gen, B, L), -1)),
                                                       Call((tok(), ids), {"ignore_index": 0})]),
        J.values(R, "one document per row; one-token documents; L = 1",
                 [Call((tok(2, 5), torch.tensor([[2] * 5, [7] * 5]))), Call((tok(2, 4), singles)),
                  Call((tok(1, 1), torch.tensor([[0]])))]),
        J.dtypes(R, "returns int64", [Call((tok(), ids))]),
        *P.device_checks(R, "on tokens' device, vectorised (meta)",
                    [Call((tok(), ids), device="meta"), Call((tok(), ids, -1), device="meta")]),
        P.unchanged(R, "does not modify tokens or doc_ids", [Call((tok(), ids))]),
        P.on_cuda(R, "matches on CUDA", [Call((tok(), ids))]),
    ]


# --------------------------------------------------------------------------- gqa_attention

def diagnose_gqa(args, kwargs, got, index, dtype) -> str | None:
    q, k, v = args[:3]
    mask = args[3] if len(args) > 3 else None
    G = q.shape[1] // k.shape[1]
    ki, vi = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
    kt, vt = k.repeat(1, G, 1, 1), v.repeat(1, G, 1, 1)
    out = lambda q_, k_, v_, scale=None: am.attention(q_, k_, v_, mask, scale=scale)[0]  # noqa: E731
    dv = v.shape[-1]
    return dg.name_mistake(got, [
        (X["gqa_repeat"], lambda: out(q, kt, vt)),
        (X["scale_dv"], lambda: out(q, ki, vi, 1 / math.sqrt(dv))),
        *[(m, lambda t=t: t()[0]) for m, t in attention_mistakes(q, ki, vi, mask)],
        *([(M["no_mask"], lambda: am.attention(q, ki, vi)[0])] if mask is not None else []),
    ], dtype)


GQA = J.Recipe("gqa_attention", am.gqa_attention, ("q", "k", "v", "mask"),
               (J.Out("out", "number", "(B, Hq, Lq, dv)"),), diagnose_gqa)


@exercise(2, "gqa_attention(q, k, v, mask=None): (B, Hq, Lq, dv); query head h attends with key/value "
          "head h // G (Hq = G * Hkv), scale 1/sqrt(d), zeros for fully masked rows.")
def gqa_attention_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    R = GQA
    pub = cases.generator(cases.PUBLIC_SEED, R.name)
    r = lambda *s: cases.randn(pub, *s)  # noqa: E731
    blocked = torch.tensor([[True, False, True, False], [False] * 4, [True, True, True, False]])
    checks = [
        J.values(R, "4 query heads, 2 kv heads, causal (L=3, d=4, dv=2)",
                 [Call((r(1, 4, 3, 4), r(1, 2, 3, 4), r(1, 2, 3, 2), am.causal_mask(3)))], public=True),
        J.values(R, "multi-query (1 kv head), fully masked row",
                 [Call((r(2, 3, 3, 2), r(2, 1, 4, 2), r(2, 1, 4, 3), blocked))], public=True),
    ]
    if not hidden:
        return checks
    gen = cases.generator(seed, R.name)
    B, Hkv, G = 2, cases.integer(gen, 2, 3), cases.integer(gen, 2, 3)
    Hq, Lq, Lk = G * Hkv, cases.integer(gen, 3, 5), cases.integer(gen, 6, 9)
    d, dv = cases.integer(gen, 4, 8), cases.integer(gen, 2, 3)

    def qkv(dtype=F32, scale=1.0, hkv=Hkv, g=G):
        return (cases.randn(gen, B, g * hkv, Lq, d, dtype=dtype, scale=scale),
                cases.randn(gen, B, hkv, Lk, d, dtype=dtype, scale=scale),
                cases.randn(gen, B, hkv, Lk, dv, dtype=dtype))

    def exact(kind):  # head width 4, scores exact in float32 however large (grader.cases.exact_qk)
        q, k = cases.exact_qk(gen, (B, Hq, Lq, cases.EXACT_D), (B, Hkv, Lk, cases.EXACT_D), kind)
        return q, k, cases.randn(gen, B, Hkv, Lk, dv)

    heads = lambda: with_empty_row(cases.random_mask(gen, B, Hq, Lq, Lk), gen)  # noqa: E731
    shared = lambda: with_empty_row(cases.random_mask(gen, B, 1, Lq, Lk), gen)  # noqa: E731
    square = lambda: with_empty_row(cases.random_mask(gen, Lq, Lk), gen)  # noqa: E731
    return checks + [
        J.values(R, "matches reference (G, Hkv > 1, per-head mask)", [Call((*qkv(), heads())),
                                                                       Call((*qkv(), shared()))]),
        J.values(R, "mask broadcasts: (Lq, Lk), and no mask", [Call((*qkv(), square())), Call(qkv())]),
        J.values(R, "multi-query and multi-head (Hkv = 1, Hkv = Hq)",
                 [Call((*qkv(hkv=1), shared())), Call((*qkv(hkv=Hq, g=1), heads()))]),
        J.values(R, "large scores next to masked keys (≈ 1e5)", [Call((*exact("large"), heads()))]),
        J.values(R, "scores of ±1e10, and rows whose every score is below -2e9",
                 [Call((*exact("huge"), heads())), Call((*exact("negative"), shared()))]),
        J.values(R, "float16, with a fully masked row", [Call((*qkv(F16), shared()))]),
        J.values(R, "bfloat16, with a fully masked row", [Call((*qkv(BF16), heads()))]),
        P.gradients(R, "finite gradients with fully masked rows, match reference",
                    [Call((*qkv(), cases.two_keys_or_none(heads()))),
                     Call((*qkv(hkv=1), cases.two_keys_or_none(square())))]),
        J.dtypes(R, "keeps the inputs' dtype", [Call((*qkv(dt), square())) for dt in cases.FLOATS]),
        *P.device_checks(R, "on the inputs' device (meta), with and without a mask",
                    [Call((*qkv(), shared()), device="meta"), Call(qkv(), device="meta")]),
        P.unchanged(R, "does not modify inputs", [Call((*qkv(), heads()))]),
        P.on_cuda(R, "matches on CUDA", [Call((*qkv(F16), heads())), Call(qkv())]),
    ]


# --------------------------------------------------------------------------- alibi_bias

def _bias(slopes: torch.Tensor, Lq: int, Lk: int, offset: int, causal: bool = True) -> torch.Tensor:
    pos_q = torch.arange(Lq)[:, None] + offset
    j = torch.arange(Lk)[None, :]
    bias = slopes.double()[:, None, None] * (j - pos_q)  # (H, Lq, Lk)
    return bias.masked_fill(j > pos_q, float("-inf")) if causal else bias


def diagnose_alibi(args, kwargs, got, index, dtype) -> str | None:
    n, Lq, Lk = args
    slopes = am.alibi_slopes(n, dtype=torch.float64)
    naive = torch.exp2(-8.0 * torch.arange(1, n + 1, dtype=torch.float64) / n)
    up = 2 ** math.ceil(math.log2(n))
    j = torch.arange(Lk)[None, :]
    pos_q = torch.arange(Lq)[:, None] + Lk - Lq
    ref = _bias(slopes, Lq, Lk, Lk - Lq)
    return dg.name_mistake(got, [
        (X["alibi_top_left"], lambda: _bias(slopes, Lq, Lk, 0)),
        (X["alibi_slopes_pow2"], lambda: _bias(naive, Lq, Lk, Lk - Lq)),
        (X["alibi_slopes_pow2"], lambda: _bias(am.alibi_slopes(up)[:n], Lq, Lk, Lk - Lq)),
        (X["alibi_odd_slopes"], lambda: _bias(odd_indexed(n), Lq, Lk, Lk - Lq)),
        (X["alibi_sign"], lambda: _bias(-slopes, Lq, Lk, Lk - Lq)),
        (X["alibi_not_causal"], lambda: -slopes.double()[:, None, None] * (pos_q - j).abs()),
        (X["alibi_not_causal"], lambda: _bias(slopes, Lq, Lk, Lk - Lq, causal=False)),
        (X["alibi_key_form"],
         lambda: (slopes.double()[:, None, None] * j).masked_fill(j > pos_q, float("-inf"))),
        (X["alibi_reversed"], lambda: _bias(slopes.flip(0), Lq, Lk, Lk - Lq)),
        *[(X["alibi_finite"], lambda fill=fill: ref.clamp(min=fill)) for fill in FINITE_FILLS],
        (X["alibi_finite"], lambda: torch.where(torch.isinf(ref) & (got.double() < -1e3), got.double(), ref)),
    ], dtype)


def odd_indexed(n: int) -> torch.Tensor:
    """The slopes (H,) of the mistake: m's slopes, then the odd-indexed ([1::2]) slopes of 2m."""
    m = 2 ** int(math.floor(math.log2(n)))
    return torch.cat([am.alibi_slopes(m, dtype=torch.float64),
                      am.alibi_slopes(2 * m, dtype=torch.float64)[1::2][: n - m]])


#: The finite "minus infinity"s people use instead of -inf: each dtype's lowest, -1e9, -1e4.
FINITE_FILLS = (torch.finfo(F32).min, torch.finfo(F16).min, torch.finfo(BF16).min, -1e9, -1e4)


ALIBI = J.Recipe("alibi_bias", am.alibi_bias, ("n_heads", "Lq", "Lk"),
                 (J.Out("bias", "number", "(H, Lq, Lk)", None, lambda a, k: k.get("dtype", F32)),),
                 diagnose_alibi)


@exercise(2, "alibi_bias(n_heads, Lq, Lk, *, device=None, dtype=torch.float32): (H, Lq, Lk) causal "
          "ALiBi bias, bottom-right aligned: -slope_h * (pos_q - j), -inf for j > pos_q.")
def alibi_bias_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    R = ALIBI
    checks = [
        J.values(R, "4 heads, Lq = Lk = 4", [Call((4, 4, 4))], public=True),
        J.values(R, "6 heads (not a power of two), under a cache (Lq=2, Lk=5)", [Call((6, 2, 5))],
                 public=True),
    ]
    if not hidden:
        return checks
    gen = cases.generator(seed, R.name)

    def sizes(heads):
        Lk = cases.integer(gen, 4, 10)
        return heads, cases.integer(gen, 1, Lk - 1), Lk

    odd = [sizes(n) for n in (cases.integer(gen, 3, 3), cases.integer(gen, 5, 7), cases.integer(gen, 9, 15))]
    pow2 = [sizes(2 ** cases.integer(gen, 1, 4)) for _ in range(2)]
    return checks + [
        J.values(R, "powers of two (random sizes, Lq < Lk)", [Call(a) for a in pow2]),
        J.values(R, "not powers of two: 3, 5..7, 9..15 heads", [Call(a) for a in odd]),
        J.values(R, "one head; one query; Lq = Lk = 1",
                 [Call((1, 3, 3)), Call((odd[1][0], 1, 6)), Call((5, 1, 1))]),
        J.values(R, "dtype=float16 and bfloat16",
                 [Call(odd[0], {"dtype": F16}), Call(pow2[0], {"dtype": BF16})]),
        J.dtypes(R, "returns the requested dtype", [Call(odd[2], {"dtype": dt}) for dt in cases.FLOATS]),
        P.on_device(R, "honours device= (meta), dtype left at its default",
                    [Call(odd[1], {"device": "meta"}), Call(pow2[1], {"device": "meta", "dtype": F16})]),
        P.on_cuda(R, "matches on CUDA", [Call(odd[2]), Call(pow2[1], {"dtype": F16})], cuda_kwargs=True),
    ]
