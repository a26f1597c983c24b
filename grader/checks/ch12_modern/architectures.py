"""Chapter 12, masks in the architectures of 2025–26: ``sink_attention``,
``topk_selection_mask``, ``block_diffusion_mask`` and ``decay_mask``.

The hidden cases draw what breaks real code: for sinks, fully masked rows (output 0, finite
gradients, to the sinks too), sinks far above and below the scores, large scores in float16 (a
softmax in half precision loses them); for selection, tied and NaN scores, queries that see fewer
than k keys, decoding queries aligned bottom-right; for block diffusion, blocks of 1 and of L,
and block sizes that do not divide L (ValueError); for decay masks, sequences of a few hundred
positions whose cumulative log gate underflows ``exp``, closed gates (log a = -inf) and packed
documents in random places.
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
from ..common import properties as P
from ..common.inputs import exact_qkv, qkv
from .inputs import among, big_scores, closed, docs, gates, low_sinks, sinks_of, tied, with_nan
from .mistakes import MISTAKES12

M = MISTAKES
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
NINF = float("-inf")

X = MISTAKES12


# --------------------------------------------------------------------------- sink_attention

def _sink_parts(args, kwargs, wide: torch.dtype = torch.float64):
    q, k, v, sinks = (a.to(wide) for a in args[:4])
    mask = args[4] if len(args) > 4 else kwargs.get("mask")
    s = q @ k.mT / math.sqrt(q.shape[-1])  # (B, H, Lq, Lk)
    full = torch.ones(s.shape, dtype=torch.bool) if mask is None else torch.broadcast_to(mask, s.shape)
    return q, k, v, sinks.view(-1, 1, 1), s, full


def diagnose_sink(args, kwargs, got, index, dtype) -> str | None:
    q, k, v, sink, s, full = _sink_parts(args, kwargs)
    empty = ~full.any(dim=-1, keepdim=True)
    ref = am.sink_attention(q, k, v, sink.flatten(), full)

    def plain():
        w = torch.softmax(s.masked_fill(~full, NINF), dim=-1).nan_to_num(0.0)
        return w @ v

    def takes_value():  # [sink, scores] softmaxed, the last column dropped
        both = torch.cat([sink.expand(*s.shape[:-1], 1), s.masked_fill(~full, NINF)], dim=-1)
        return torch.softmax(both, dim=-1)[..., :-1] @ v

    def not_exp(shift: bool = True):
        blocked = s.masked_fill(~full, NINF)
        m = torch.maximum(blocked.amax(-1, keepdim=True), sink) if shift else 0.0
        e = torch.exp(blocked - m)
        return e / (sink + e.sum(-1, keepdim=True)) @ v

    def half():  # scores and softmax in the inputs' dtype
        qh, kh, vh, sh, sc, _ = _sink_parts(args, kwargs, dtype)
        both = torch.cat([sc.masked_fill(~full, NINF), sh.expand(*sc.shape[:-1], 1)], dim=-1)
        both = both - both.amax(-1, keepdim=True)
        return (torch.softmax(both, dim=-1)[..., :-1] @ vh).double()

    return dg.name_mistake(got, [
        (X["sink_ignored"], plain),
        (X["sink_value"], takes_value),
        (X["sink_not_exp"], not_exp),
        (X["sink_not_exp"], lambda: not_exp(shift=False)),
        (X["sink_max"], lambda: ref.masked_fill(empty, float("nan"))),
        (M["no_scale"], lambda: am.sink_attention(q * math.sqrt(q.shape[-1]), k, v, sink.flatten(), full)),
        (M["inverted"], lambda: am.sink_attention(q, k, v, sink.flatten(), ~full)),
        (X["sink_half"], half),
    ], dtype)


SINK = J.Recipe("sink_attention", am.sink_attention, ("q", "k", "v", "sinks", "mask"),
                (J.Out("out", "number", "(B, H, Lq, dv)"),), diagnose_sink)


@exercise(3, "sink_attention(q, k, v, sinks, mask=None): (B, H, Lq, dv) in q's dtype; weights exp(s_j - m) / "
          "(exp(sink_h - m) + sum of exp(s_k - m) over allowed k), s = q·k / sqrt(d), m the max over the "
          "allowed scores and the sink; the sink adds no value; a fully masked row gives 0.")
def sink_attention_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    R = SINK
    pub = cases.generator(cases.PUBLIC_SEED, R.name)
    heads = with_empty_row(cases.random_mask(pub, 1, 2, 3, 6), pub)
    checks = [
        J.values(R, "B=1, H=2, Lq=3, Lk=6, a fully masked row (output 0)",
                 [Call((*qkv(pub, 1, 2, 3, 6, 4, 3), sinks_of(pub, 2), heads))], public=True),
        J.values(R, "no mask; a causal (Lq, Lk) mask",
                 [Call((*qkv(pub, 1, 2, 3, 5, 4, 2), sinks_of(pub, 2))),
                  Call((*qkv(pub, 2, 1, 4, 4, 8, 2), sinks_of(pub, 1), am.causal_mask(4)))], public=True),
        J.values(R, "sinks of -30 (no effect), 0 and +3 (most weight to nothing)",
                 [Call((*qkv(pub, 1, 3, 4, 5, 4, 3), torch.tensor([-30.0, 0.0, 3.0])))], public=True),
        P.gradients(R, "finite gradients (q, k, v and sinks) with a fully masked row, match reference",
                    [Call((*qkv(pub, 1, 2, 3, 6, 4, 3), sinks_of(pub, 2), heads))], public=True),
    ]
    if not hidden:
        return checks
    gen = cases.generator(seed, R.name)
    B, H, d, dv = 2, cases.integer(gen, 2, 3), cases.integer(gen, 4, 8), cases.integer(gen, 2, 3)
    Lq, Lk = cases.integer(gen, 3, 5), cases.integer(gen, 6, 10)
    x = lambda dtype=F32, scale=1.0: (*qkv(gen, B, H, Lq, Lk, d, dv, dtype, scale), sinks_of(gen, H))  # noqa: E731
    per_head = lambda: with_empty_row(cases.random_mask(gen, B, H, Lq, Lk), gen)  # noqa: E731
    # query 0 of every head sees no key: each head's sink meets a fully masked row
    empty_in_every_head = lambda: per_head() & (torch.arange(Lq) != 0)[:, None]  # noqa: E731
    keys = (torch.arange(Lk) < cases.lengths(gen, B, Lk)[:, None])[:, None, None, :]  # (B, 1, 1, Lk)
    far = torch.tensor([float(cases.integer(gen, 20, 40)), -float(cases.integer(gen, 20, 40))]).repeat(H)[:H]
    return checks + [
        J.values(R, "matches reference (per-head masks with fully masked rows)",
                 [Call((*x(), per_head())), Call((*x(), per_head()))]),
        J.values(R, "mask broadcasts: (Lq, Lk), (B, 1, 1, Lk) padding with an empty sequence, no mask",
                 [Call((*x(), with_empty_row(cases.random_mask(gen, Lq, Lk), gen))), Call((*x(), keys)),
                  Call(x())]),
        J.values(R, "large scores (≈ 1e4) next to blocked keys, sinks among them",
                 [Call(among(*exact_qkv(gen, B, H, Lq, Lk, dv, "large"), per_head()))]),
        J.values(R, "sinks far above and below the scores (±20 .. ±40)",
                 [Call((*x()[:3], far, per_head()))]),
        J.values(R, "float16 with scores near ±1e3 (softmax in float32)",
                 [Call((*big_scores(gen, B, H, Lq, Lk, d, dv, F16), sinks_of(gen, H, scale=100.0),
                        per_head()))]),
        J.values(R, "bfloat16 with scores near ±1e3 (softmax in float32)",
                 [Call((*big_scores(gen, B, H, Lq, Lk, d, dv, BF16), sinks_of(gen, H, scale=100.0),
                        per_head()))]),
        # fills that stand in for -inf: a fully masked row beside a sink below -1e9 (or at float32's lowest)
        # must still give 0, and allowed scores below -2e9 must still outweigh blocked keys
        J.values(R, "sinks far below -1e9 (one at float32's lowest) beside fully masked rows",
                 [Call((*x()[:3], low_sinks(H), empty_in_every_head())),
                  Call((*exact_qkv(gen, B, H, Lq, Lk, dv, "negative"), low_sinks(H),
                        empty_in_every_head()))]),
        P.gradients(R, "a sink far above every score (a max without the sink overflows), match reference",
                    [Call((*x()[:3], torch.full((H,), 150.0), per_head()))]),
        J.values(R, "float16 (sinks float32)", [Call((*x(F16), per_head()))]),
        J.values(R, "bfloat16 (sinks float32)", [Call((*x(BF16), per_head()))]),
        P.gradients(R, "finite gradients with per-head empty rows and large sinks, match reference",
                    [Call((*x()[:3], far, per_head())), Call((*x(), per_head()))]),
        J.dtypes(R, "out in q's dtype", [Call((*x(dt), per_head())) for dt in cases.FLOATS]),
        *P.device_checks(R, "on the inputs' device (meta), with and without a mask",
                    [Call(x(), device="meta"), Call((*x(), per_head()), device="meta")]),
        P.unchanged(R, "does not modify inputs", [Call((*x(), per_head()))]),
        P.on_cuda(R, "matches on CUDA", [Call((*x(F16), per_head())), Call(x())]),
    ]


# --------------------------------------------------------------------------- topk_selection_mask

def _visible(scores: torch.Tensor, causal: bool, offset: int | None = None) -> torch.Tensor:
    _, Lq, Lk = scores.shape
    p = (Lk - Lq if offset is None else offset) + torch.arange(Lq)[:, None]
    seen = torch.arange(Lk) <= p if causal else torch.ones(Lq, Lk, dtype=torch.bool)
    return seen.expand(scores.shape)


def _ranked(scores: torch.Tensor, eligible: torch.Tensor, k: int, *, high: bool = False) -> torch.Tensor:
    """The top k of ``scores`` among ``eligible`` keys, ties to the lower index (``high``: higher)."""
    s = scores.flip(-1) if high else scores
    e = eligible.flip(-1) if high else eligible
    got = am.topk_selection_mask(s.masked_fill(~e, float("nan")), k, causal=False)
    return got.flip(-1) if high else got


def diagnose_topk(args, kwargs, got, index, dtype) -> str | None:
    scores, k = args[0], args[1]
    causal = kwargs.get("causal", True)
    nan = torch.isnan(scores)
    seen = _visible(scores, causal)
    ref = am.topk_selection_mask(scores, k, causal=causal)
    nan_high = scores.nan_to_num(nan=math.inf, posinf=math.inf)
    return dg.name_mistake(got, [
        (M["inverted"], lambda: ~ref),
        (X["sel_top_left"], lambda: _ranked(scores, _visible(scores, causal, 0) & ~nan, k)),
        (X["sel_ties"], lambda: _ranked(scores, seen & ~nan, k, high=True)),
        (X["sel_nan"], lambda: _ranked(nan_high, seen, k)),
        (X["sel_nan"], lambda: _ranked(nan_high, seen, k) & ~nan),
        (X["sel_future"], lambda: _ranked(scores.masked_fill(~seen, -1e30), ~nan, min(k, scores.shape[-1]))),
        # blocked keys (future or NaN) filled with -inf, ranked last with ties to the lower index, make up k
        (X["sel_future"], lambda: _ranked(scores.masked_fill(~(seen & ~nan), NINF), torch.ones_like(seen),
                                          min(k, scores.shape[-1]))),
        (X["sel_not_causal"], lambda: am.topk_selection_mask(scores, k, causal=False)),
    ], dtype)


TOPK = J.Recipe("topk_selection_mask", am.topk_selection_mask, ("index_scores", "k"),
                (J.Out("mask", "mask", "(B, Lq, Lk)"),), diagnose_topk)


@exercise(3.5, "topk_selection_mask(index_scores, k, *, causal=True): bool (B, Lq, Lk); query i at "
          "Lk - Lq + i keeps the k highest-scoring keys it may see (j <= its position when causal), all of "
          "them when fewer; ties to the lower index; NaN never selected; k >= 1.")
def topk_selection_mask_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    R = TOPK
    pub = cases.generator(cases.PUBLIC_SEED, R.name)
    s = lambda *shape: cases.randn(pub, *shape)  # noqa: E731
    checks = [
        J.values(R, "prefill, causal: B=2, Lq=Lk=8, k=3 (the first queries see fewer than 3 keys)",
                 [Call((s(2, 8, 8), 3))], public=True),
        J.values(R, "causal=False: every query ranks all 8 keys, k=2",
                 [Call((s(2, 5, 8), 2), {"causal": False})], public=True),
        J.values(R, "decoding: 3 queries after 7 keys (bottom-right), k=4", [Call((s(2, 3, 10), 4))],
                 public=True),
        J.values(R, "tied scores: ties go to the lower key index", [Call((tied(pub, 2, 6, 9), 3))],
                 public=True),
        J.values(R, "NaN scores are never selected",
                 [Call((with_nan(s(2, 6, 8), pub), 3)),
                  Call((with_nan(s(1, 4, 6), pub), 2), {"causal": False})],
                 public=True),
        J.values(R, "k larger than any query's visible keys: all visible keys",
                 [Call((s(1, 5, 7), 9)), Call((s(1, 5, 7), 7), {"causal": False})], public=True),
        J.raises(R.name, R.arg_names, "k < 1 raises ValueError",
                 [Call((s(1, 2, 3), 0)), Call((s(1, 2, 3), -1))], "each query keeps k >= 1 keys"),
        J.dtypes(R, "returns torch.bool", [Call((s(1, 4, 4), 2))]),
        *P.device_checks(R, "on the scores' device (meta), causal and not",
                    [Call((s(1, 4, 6), 2), device="meta"), Call((s(2, 3, 3), 1), {"causal": False}, "meta")]),
        P.unchanged(R, "does not modify the scores", [Call((with_nan(s(1, 4, 6), pub), 2))]),
    ]
    if not hidden:
        return checks
    gen = cases.generator(seed, R.name)
    B, Lk = 2, cases.integer(gen, 10, 16)
    Lq = cases.integer(gen, 2, Lk - 2)
    k = cases.integer(gen, 2, 5)
    r = lambda *shape: cases.randn(gen, *shape)  # noqa: E731
    return checks + [
        J.values(R, "random sizes, causal and not", [Call((r(B, Lq, Lk), k)), Call((r(B, Lk, Lk), k)),
                                                    Call((r(B, Lq, Lk), k), {"causal": False})]),
        J.values(R, "ties and NaN together", [Call((with_nan(tied(gen, B, Lq, Lk, 2), gen), k)),
                                             Call((with_nan(tied(gen, B, Lk, Lk, 3), gen, 0.1), k))]),
        J.values(R, "one decoding query (Lq = 1); k = 1", [Call((r(B, 1, Lk), k)), Call((r(B, Lq, Lk), 1))]),
        J.values(R, "k >= Lk: every visible, non-NaN key", [Call((with_nan(r(B, Lq, Lk), gen), Lk + 1))],
                 edge=True),
        J.values(R, "float16 and bfloat16 scores (rounding makes ties)",
                 [Call((with_nan(r(B, Lq, Lk), gen).to(torch.float16), k)),
                  Call(((r(B, Lk, Lk) * 4).round().div(4).to(torch.bfloat16), k))]),
        P.on_cuda(R, "matches on CUDA", [Call((with_nan(tied(gen, B, Lq, Lk), gen), k))]),
    ]


# --------------------------------------------------------------------------- block_diffusion_mask

def _bd_parts(L: int, block: int):
    t = torch.arange(2 * L)
    clean = t >= L
    blk = (t % L) // block
    qc, kc = clean[:, None], clean[None, :]
    qb, kb = blk[:, None], blk[None, :]
    return qc, kc, qb, kb


def _bd(L: int, block: int, *, noisy_noisy=None, noisy_clean=None, clean_clean=None, clean_noisy=None):
    """The mask from its four quarters, each a rule on (query block, key block)."""
    qc, kc, qb, kb = _bd_parts(L, block)
    rules = {"nn": noisy_noisy or (lambda a, b: a == b), "nc": noisy_clean or (lambda a, b: b < a),
             "cc": clean_clean or (lambda a, b: b <= a), "cn": clean_noisy or (lambda a, b: a != a)}
    return ((~qc & ~kc & rules["nn"](qb, kb)) | (~qc & kc & rules["nc"](qb, kb))
            | (qc & kc & rules["cc"](qb, kb)) | (qc & ~kc & rules["cn"](qb, kb)))


def diagnose_bd(args, kwargs, got, index, dtype) -> str | None:
    L, block = args[:2]
    ref = am.block_diffusion_mask(L, block)
    t = torch.arange(2 * L) % L
    pos_q, pos_k = t[:, None], t[None, :]
    return dg.name_mistake(got, [
        (M["inverted"], lambda: ~ref),
        (X["bd_own_clean"], lambda: _bd(L, block, noisy_clean=lambda a, b: b <= a)),
        (X["bd_clean_own_block"], lambda: _bd(L, block, clean_clean=lambda a, b: a == b)),
        (X["bd_noisy_causal"], lambda: ref & ~((pos_k > pos_q) & (torch.arange(2 * L)[:, None] < L)
                                               & (torch.arange(2 * L)[None, :] < L))),
        (X["bd_clean_sees_noisy"], lambda: _bd(L, block, clean_noisy=lambda a, b: b <= a)),
        (X["bd_clean_sees_noisy"], lambda: _bd(L, block, clean_noisy=lambda a, b: b < a)),
        (X["bd_clean_sees_noisy"], lambda: _bd(L, block, clean_noisy=lambda a, b: a == b)),
        (X["bd_no_context"], lambda: _bd(L, block, noisy_clean=lambda a, b: a != a)),
    ], dtype)


BD = J.Recipe("block_diffusion_mask", am.block_diffusion_mask, ("L", "block"),
              (J.Out("mask", "mask", "(2L, 2L)", lambda a, k: (2 * a[0], 2 * a[0])),), diagnose_bd)


@exercise(1.5, "block_diffusion_mask(L, block, *, device=None): bool (2L, 2L) over [x_noisy (L), "
          "x_clean (L)]; a noisy token sees the noisy tokens of its block and the clean tokens of earlier "
          "blocks; a clean token sees the clean tokens of its own and earlier blocks; block must divide L.")
def block_diffusion_mask_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    R = BD
    gen = cases.generator(seed, "block_diffusion_mask sizes")

    def draw(g):
        block = cases.integer(g, 2, 4)
        return (block * cases.integer(g, 2, 4), block)

    public = [("L = 8, blocks of 2", (8, 2)), ("block = L: one block", (3, 3))]
    edges = [("block = 1: one token per block", (cases.integer(gen, 3, 5), 1))]
    checks = P.int_mask_checks(R, seed, hidden, public, edges, draw) + [
        J.values(R, "L = 12, blocks of 3 and of 4", [Call((12, 3)), Call((12, 4))], public=True),
        J.raises(R.name, R.arg_names, "block not dividing L raises ValueError",
                 [Call((10, 4)), Call((6, 0)), Call((3, 5))], "block >= 1 must divide L"),
        # the size boundaries: one token is a sequence (a (2, 2) mask), no token is not
        J.values(R, "L = 1, block = 1: the (2, 2) mask", [Call((1, 1))], public=True, edge=True),
        J.raises(R.name, R.arg_names, "L = 0 raises ValueError", [Call((0, 1)), Call((0, 3))],
                 "L >= 1: a sequence has at least one token"),
    ]
    if not hidden:
        return checks
    return checks + [
        J.values(R, "more random sizes", [Call(draw(gen)), Call(draw(gen))]),
    ]


# --------------------------------------------------------------------------- decay_mask

def _segsum_range(g: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """(B, L, L): the sum of g over t = j + lo .. i + hi (empty: 0), for the range mistakes."""
    c = torch.cat([torch.zeros_like(g[:, :1]), g.cumsum(-1)], dim=-1)  # c[n] = g[0] + .. + g[n-1]
    L = g.shape[-1]
    i = torch.arange(L)[:, None]
    j = torch.arange(L)[None, :]
    hi_idx = (i + hi + 1).clamp(0, L).expand(L, L)
    lo_idx = (j + lo).clamp(0, L).expand(L, L)
    out = c[:, hi_idx] - c[:, lo_idx]
    return out.masked_fill(hi_idx <= lo_idx, 0.0)


def diagnose_decay(args, kwargs, got, index, dtype) -> str | None:
    g = args[0]
    ids = args[1] if len(args) > 1 else kwargs.get("doc_ids")
    ref = am.decay_mask(g, ids)
    L = g.shape[-1]
    keep = torch.ones(L, L, dtype=torch.bool).tril()
    if ids is not None:
        keep = keep & (ids[:, :, None] == ids[:, None, :])
    c = g.float().cumsum(-1)  # (B, L), as a float32 student has it
    diff = torch.exp(c[:, :, None] - c[:, None, :])  # NaN after a closed gate
    ratio = torch.exp(c)[:, :, None] / torch.exp(c)[:, None, :]  # 0/0 once exp(c) underflows
    ranged = lambda lo, hi: torch.exp(_segsum_range(g, lo, hi)) * keep  # noqa: E731
    return dg.name_mistake(got, [
        *[(X["decay_cumsum"], lambda d=d: torch.where(keep, d, 0.0).double()) for d in (diff, ratio)],
        *[(X["decay_cumsum"], lambda d=d: (d * keep).double()) for d in (diff, ratio)],
        (X["decay_range"], lambda: ranged(0, 0)),
        (X["decay_range"], lambda: ranged(0, -1)),
        (X["decay_range"], lambda: ranged(1, -1)),
        (X["decay_no_docs"], lambda: am.decay_mask(g)),
        (X["decay_transposed"], lambda: ref.mT),
    ], dtype)


DECAY = J.Recipe("decay_mask", am.decay_mask, ("log_gates", "doc_ids"),
                 (J.Out("D", "number", "(B, L, L)", dtype=lambda a, k: torch.float32),), diagnose_decay)


@exercise(3.5, "decay_mask(log_gates, doc_ids=None): float32 (B, L, L), D[b, i, j] = exp(sum of "
          "log_gates[b, t] for t = j+1 .. i) for j <= i in the same document, else 0; no overflow or NaN "
          "on long sequences; gradients flow to log_gates.")
def decay_mask_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    R = DECAY
    pub = cases.generator(cases.PUBLIC_SEED, R.name)
    checks = [
        J.values(R, "B=2, L=6, one document", [Call((gates(pub, 2, 6),))], public=True),
        J.values(R, "packed documents (B=2, L=9, 3 documents each)",
                 [Call((gates(pub, 2, 9), docs(pub, 2, 9)))], public=True),
        J.values(R, "a long sequence (L = 100, the cumulative log gate reaches about -125)",
                 [Call((gates(pub, 1, 100, 2.5),))], public=True),
        J.values(R, "closed gates (log a = -inf) beside open ones",
                 [Call((closed(gates(pub, 2, 8), pub),)),
                  Call((closed(gates(pub, 1, 9), pub), docs(pub, 1, 9)))],
                 public=True),
        P.gradients(R, "gradients reach log_gates, match reference",
                    [Call((gates(pub, 2, 7), docs(pub, 2, 7)))], public=True,
                    nan_why=X["decay_grad_overflow"]),
        # the meta check holds D to float32 too (a dtype check alone is passed by any float32 tensor)
        *P.device_checks(R, "float32 on the gates' device (meta), with and without doc_ids",
                    [Call((gates(pub, 2, 5),), device="meta"),
                     Call((gates(pub, 2, 5), docs(pub, 2, 5)), device="meta")]),
        P.unchanged(R, "does not modify inputs", [Call((gates(pub, 2, 6), docs(pub, 2, 6)))]),
    ]
    if not hidden:
        return checks
    gen = cases.generator(seed, R.name)
    B, L = 2, cases.integer(gen, 8, 16)
    n_docs = cases.integer(gen, 2, 4)
    long = cases.integer(gen, 300, 600)
    return checks + [
        J.values(R, "random gates and documents", [Call((gates(gen, B, L), docs(gen, B, L, n_docs))),
                                                  Call((gates(gen, B, L, 3.0),))]),
        J.values(R, "a long sequence with documents (the cumulative log gate far below -100)",
                 [Call((gates(gen, 1, long), docs(gen, 1, long, n_docs)))]),
        J.values(R, "closed gates, with and without documents",
                 [Call((closed(gates(gen, B, L), gen),)),
                  Call((closed(gates(gen, B, L), gen), docs(gen, B, L)))]),
        J.values(R, "float16 and bfloat16 gates, with documents (D in float32, from the gates as given)",
                 [Call((gates(gen, B, L, 3.0).to(dt), docs(gen, B, L, n_docs))) for dt in (F16, BF16)]),
        P.on_device(R, "D is float32 for float16 and bfloat16 gates too (meta)",
                    [Call((gates(gen, B, L).to(dt),), device="meta") for dt in (F16, BF16)]),
        J.values(R, "one document per position (D = identity)",
                 [Call((gates(gen, B, 5), torch.arange(5).expand(B, 5)))], edge=True),
        P.gradients(R, "gradients on a long sequence with documents, match reference",
                    [Call((gates(gen, 1, 200), docs(gen, 1, 200, n_docs)))],
                    nan_why=X["decay_grad_overflow"]),
        P.on_cuda(R, "matches on CUDA", [Call((gates(gen, B, L), docs(gen, B, L, n_docs)))]),
    ]
