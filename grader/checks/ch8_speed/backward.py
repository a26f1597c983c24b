"""Chapter 8's ``tiled_attention_backward``: (dq, dk, dv) one key tile at a time from the saved
lse. Its checks and mistakes, in chapter 8's package (:mod:`grader.checks.ch8_speed`).

Besides the values, the checks hold it to the algorithm: tiles whose mask is all False are
skipped (their NaN keys and values never reach a gradient), tiles blocked for one head, batch
row or query only are not, and no floating tensor of Lq·Lk entries is ever created.
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
from ..common import live_memory as LM
from ..common import properties as P
from ..common.inputs import MEMORY, first_tile_blocked, last_only, qkv

M = MISTAKES
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


#: The backward's classic mistakes, in plain words (one definition each).
MISTAKES8: dict[str, str] = {
    "bwd_no_D": "the row term D is missing: the softmax's backward subtracts, from each row of "
                "dp = d_out·v^T, that row's D = the sum over dv of d_out * out (one number per query, "
                "computed once before the loop), then multiplies by p.",
    "bwd_unscaled_scores": "the weights are recomputed from unscaled scores: the lse was taken over "
                           "q·k / sqrt(d), so scale the scores the same way before subtracting it.",
    "bwd_grad_unscaled": "dq and dk lack the scale: the scores are q·k divided by sqrt(d), so the chain "
                         "rule carries that division from ds to q and to k.",
    "bwd_nan_empty": "NaN from a fully masked row: its lse is minus infinity and so are its scores, and "
                     "the exp of their difference is NaN. Where the lse is minus infinity, subtract zero "
                     "instead: the row's weights are then exactly zero, and so are its gradients.",
    "bwd_tile_not_skipped": "a key tile whose mask is all False is still read: its keys and values reach "
                            "the gradients (here they hold NaN, and zero times NaN is NaN). Skip such a tile "
                            "before touching k and v; its dk and dv stay zero.",
    "bwd_skip_wrong": "a key tile is skipped although some query may attend one of its keys: skip a tile "
                      "only when its mask is False for every batch, head and query.",
    "bwd_half": "half-precision inputs are computed in their own dtype: exp(s - lse) and the sums over "
                "queries and keys lose digits there. Compute in single precision (torch.float) and cast dq, "
                "dk, dv back to the inputs' dtypes at the end.",
    "bwd_tile_softmax": "each tile's weights are a softmax over that tile alone (or an exp shifted by the "
                        "tile's own max): the forward's weights are normalised over every allowed key of "
                        "the row, which exp(s - lse) with the saved lse gives directly.",
    "bwd_full_scores": "the whole (Lq, Lk) matrix is held: at one moment the floating tensors the call "
                       "created and still held added up to half of the B·H·Lq·Lk weights or more (autograd "
                       "through a forward keeps every tile's weights for its backward; so does a list). "
                       "Recompute one key tile's weights at a time from the given lse, use them, and let "
                       "them go.",
    "bwd_recomputed": "the gradients follow the lse and out that a forward pass would give, not the ones "
                      "given: here some rows' lse was raised and some rows' out scaled, and the "
                      "backward from the saved lse uses them as they are (weights exp(s - lse), "
                      "D = rowsum(d_out * out)). Do not recompute them, and do not differentiate a forward.",
}
X8 = MISTAKES8


def backward(q, k, v, out, lse, d_out, mask, tile, *, row_term=True, scaled_scores=True, grad_scale=True,
             guard=True, skip="all", work=None, tile_softmax=False):
    """The backward from the lse with one of its steps left out or wrong (see :data:`MISTAKES8`):
    no row term D, unscaled scores in exp(s - lse), no 1/sqrt(d) on dq and dk, no guard for an lse
    of -inf, tiles skipped never ("none") or on head 0's mask alone ("head0"), the work done in
    ``work`` (the inputs' dtype: half precision), each tile's weights normalised alone."""
    B, H, Lq, d = q.shape
    Lk = k.shape[-2]
    work = work or torch.promote_types(q.dtype, torch.float32)
    full = None if mask is None else torch.broadcast_to(mask, (B, H, Lq, Lk))
    scale = 1.0 / math.sqrt(d)
    qw, do = q.to(work), d_out.to(work)
    D = (do * out.to(work)).sum(-1, keepdim=True) if row_term else torch.zeros(B, H, Lq, 1, dtype=work)
    lse = lse.to(work)[..., None]
    if guard:
        lse = torch.where(torch.isfinite(lse), lse, 0.0)
    dq = torch.zeros(B, H, Lq, d, dtype=work)
    dk, dv = torch.zeros(B, H, Lk, d, dtype=work), torch.zeros(B, H, Lk, v.shape[-1], dtype=work)
    for c in range(0, Lk, tile):
        allowed = None if full is None else full[..., c:c + tile]
        if allowed is not None and (skip == "all" and not bool(allowed.any())
                                    or skip == "head0" and not bool(allowed[:, :1].any())):
            continue
        kc, vc = k[..., c:c + tile, :].to(work), v[..., c:c + tile, :].to(work)
        s = qw @ kc.mT * (scale if scaled_scores else 1.0)
        if allowed is not None:
            s = s.masked_fill(~allowed, float("-inf"))
        if tile_softmax:
            p = torch.softmax(s, dim=-1).nan_to_num(0.0)
        else:
            p = torch.exp(s - lse)
        dv[..., c:c + tile, :] = p.mT @ do
        ds = p * (do @ vc.mT - D)
        g = scale if grad_scale else 1.0
        dq = dq + ds @ kc * g
        dk[..., c:c + tile, :] = ds.mT @ qw * g
    return dq, dk, dv


BWD_ARGS = ("q", "k", "v", "out", "lse", "d_out", "mask", "tile")


def bwd_parts(args, kwargs):
    """The call's arguments by name, the defaults filled in."""
    named = dict(zip(BWD_ARGS, args))
    named.update(kwargs)
    return [named.get(n, {"mask": None, "tile": 64}.get(n)) for n in BWD_ARGS]


def bwd_mistakes(args, kwargs, dtype) -> list[dg.Candidate]:
    q, k, v, out, lse, d_out, mask, tile = bwd_parts(args, kwargs)
    low = lambda t: t.to(dtype) if t.dtype.is_floating_point else t  # noqa: E731
    bug = lambda **kw: lambda: backward(q, k, v, out, lse, d_out, mask, tile, **kw)  # noqa: E731
    out_ = [
        (X8["bwd_nan_empty"], bug(guard=False)),
        (X8["bwd_tile_not_skipped"], bug(skip="none")),
        (X8["bwd_no_D"], bug(row_term=False)),
        (X8["bwd_unscaled_scores"], bug(scaled_scores=False)),
        (X8["bwd_grad_unscaled"], bug(grad_scale=False)),
        (X8["bwd_tile_softmax"], bug(tile_softmax=True)),
        (X8["bwd_skip_wrong"], bug(skip="head0")),
    ]
    recomputed = lambda: backward(q, k, v, *am.attention_lse(q, k, v, mask), d_out, mask, tile)  # noqa: E731
    out_.append((X8["bwd_recomputed"], recomputed))
    if dtype in (F16, BF16):
        out_.append((X8["bwd_half"], lambda: backward(
            *(low(t) for t in (q, k, v, out)), lse.float(), low(d_out), mask, tile, work=dtype)))
    if mask is not None:
        out_ += [(M["inverted"], lambda: backward(q, k, v, out, lse, d_out, ~mask, tile)),
                 (M["no_mask"], lambda: backward(q, k, v, out, lse, d_out, None, tile))]
    return out_


def diagnose_backward(args, kwargs, got, index, dtype) -> str | None:
    return dg.name_mistake(got, bwd_mistakes(args, kwargs, dtype), dtype, index)


BACKWARD = J.Recipe("tiled_attention_backward", am.tiled_attention_backward, BWD_ARGS,
                    (J.Out("dq", "number", "(B, H, Lq, d)"), J.Out("dk", "number", "(B, H, Lk, d)"),
                     J.Out("dv", "number", "(B, H, Lk, dv)")), diagnose_backward)


def saved(gen, q, k, v, mask, *, nan_tiles: tuple[slice, ...] = ()) -> tuple:
    """(q, k, v, out, lse, d_out, mask): what a forward pass saved for these inputs (out in their
    dtype, lse float32, from :func:`attnmask.attention_lse`) and a random d_out; keys and values
    of the ``nan_tiles`` (blocked for every query) are then set to NaN, as an uninitialised cache."""
    out, lse = am.attention_lse(q, k, v, mask)
    d_out = cases.randn(gen, *out.shape, dtype=out.dtype)
    if nan_tiles:
        k, v = k.clone(), v.clone()
        for s in nan_tiles:
            k[..., s, :] = float("nan")
            v[..., s, :] = float("nan")
    return q, k, v, out, lse, d_out, mask


def given(gen, q, k, v, mask) -> tuple:
    """:func:`saved`, then what no forward would save: lse + log 2 on about half the rows (those
    with an allowed key) and out times 1.5 on about half. The backward from the saved lse follows
    them: its weights exp(s - lse) halve on the first rows, and D = rowsum(d_out * out) grows
    on the others."""
    q, k, v, out, lse, d_out, mask = saved(gen, q, k, v, mask)
    shifted = cases.random_mask(gen, *lse.shape) & torch.isfinite(lse)
    scaled = cases.random_mask(gen, *lse.shape)
    lse = torch.where(shifted, lse + math.log(2), lse)
    out = torch.where(scaled[..., None], out * 1.5, out)
    return q, k, v, out, lse, d_out, mask


def skippable_saved(gen, B, H, Lq, Lk, tile) -> tuple:
    """:func:`skippable`'s case for the backward: the first and last key tiles blocked for every
    query, their keys and values NaN; a fully masked row among ordinary ones."""
    q, k, v = qkv(gen, B, H, Lq, Lk, 4, 3)
    mask = with_empty_row(cases.random_mask(gen, B, 1, Lq, Lk, p=0.7), gen)
    last = Lk - Lk % tile if Lk % tile else Lk - tile
    tiles = (slice(0, tile), slice(last, last + tile))
    for s in tiles:
        mask[..., s] = False
    return saved(gen, q, k, v, mask, nan_tiles=tiles)


def negative_saved(gen, B, H, Lq, Lk, dv, mask) -> tuple:
    """:func:`saved` for scores exact in float32 and below -2e9 (:func:`grader.cases.exact_qk`, head
    width 4) with small integer v and d_out: each row's weights are one-hot and every product is
    exact, so dq = dk = 0 and dv sums rows of d_out, exactly, whatever the route. A blocked key
    filled with -1e9 instead of -inf weighs exp(s - lse) = inf there."""
    q, k = cases.exact_qk(gen, (B, H, Lq, cases.EXACT_D), (B, H, Lk, cases.EXACT_D), "negative")
    v = cases.randint_(gen, (B, H, Lk, dv), -4, 4).float()
    out, lse = am.attention_lse(q, k, v, mask)
    return q, k, v, out, lse, cases.randint_(gen, tuple(out.shape), -4, 4).float(), mask


def big_scores(gen, B, H, Lq, Lk, dv) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q (B, H, Lq, 4) and k (B, H, Lk, 4) of integers up to about ±20, so that q·k / sqrt(4) is
    exact in float32 and often beyond 88, where exp overflows float32; v (B, H, Lk, dv) normal."""
    q, k, v = qkv(gen, B, H, Lq, Lk, 4, dv, scale=7.0)
    return q.round(), k.round(), v


def partly_blocked(gen, B, H, Lq, Lk, tile) -> torch.Tensor:
    """(B, H, Lq, Lk), B and H >= 2, Lk >= 3 tiles: key tile 0 blocked for head 0 only, tile 1 for
    batch row 0 only, tile 2 for query row 0 only; none of them may be skipped."""
    mask = cases.random_mask(gen, B, H, Lq, Lk, p=0.7)
    mask[:, 0, :, :tile] = False
    mask[:, 1:, :, 0] = True
    mask[0, :, :, tile:2 * tile] = False
    mask[1:, :, :, tile] = True
    mask[:, :, 0, 2 * tile:3 * tile] = False
    mask[:, :, 1:, 2 * tile] = True
    return mask


@exercise(6, "tiled_attention_backward(q, k, v, out, lse, d_out, mask=None, tile=64): (dq, dk, dv) of "
          "attention, one key tile at a time, each tile's weights recomputed as exp(q·k / sqrt(d) - lse) "
          "from the given lse (-inf on fully masked rows) and D = rowsum(d_out * out) from the given out, "
          "whatever a forward would give; zero gradients for fully masked rows, all-False tiles skipped; "
          "grads in the inputs' dtypes (computed in float32); the floating tensors it holds alive at once "
          "stay below half of the B·H·Lq·Lk weights.")
def tiled_attention_backward_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    R = BACKWARD
    pub = cases.generator(cases.PUBLIC_SEED, R.name)
    heads = with_empty_row(cases.random_mask(pub, 1, 2, 3, 8), pub)
    checks = [
        J.values(R, "matches autograd (B=1, H=2, Lq=3, Lk=8, tile=4), a fully masked row",
                 [Call(saved(pub, *qkv(pub, 1, 2, 3, 8, 4, 2), heads), {"tile": 4})], public=True),
        J.values(R, "tile=3 does not divide Lk=7; rows whose first tile is fully masked",
                 [Call(saved(pub, *qkv(pub, 1, 1, 4, 7, 4, 2), first_tile_blocked(pub, 1, 1, 4, 7, 3)),
                       {"tile": 3})], public=True),
        J.values(R, "Lq=3 < Lk=6 with a bottom-right causal mask; no mask",
                 [Call(saved(pub, *qkv(pub, 1, 1, 3, 6, 4, 2), am.causal_mask(3, n_keys=6)), {"tile": 4}),
                  Call(saved(pub, *qkv(pub, 1, 2, 2, 5, 3, 3), None), {"tile": 2})], public=True),
        J.values(R, "skips fully masked tiles: their NaN keys and values never reach dq, dk, dv",
                 [Call(skippable_saved(pub, 1, 2, 3, 10, 3), {"tile": 3})], public=True, weight=2.0),
        J.values(R, "follows the given lse and out (lse + log 2 on some rows, out scaled on others)",
                 [Call(given(pub, *qkv(pub, 1, 2, 4, 9, 4, 2),
                             with_empty_row(cases.random_mask(pub, 1, 2, 4, 9), pub)), {"tile": 4})],
                 public=True, weight=2.0),
    ]
    if not hidden:
        return checks
    gen = cases.generator(seed, R.name)
    B, H, d, dv = 2, cases.integer(gen, 2, 3), cases.integer(gen, 4, 8), cases.integer(gen, 2, 3)
    Lq, Lk = cases.integer(gen, 3, 5), cases.integer(gen, 9, 13)
    tile = cases.integer(gen, 2, 4)
    if Lk % tile == 0:
        Lk += 1  # a partial last tile
    x = lambda dtype=F32, scale=1.0, Lq=Lq, Lk=Lk: qkv(gen, B, H, Lq, Lk, d, dv, dtype, scale)  # noqa: E731
    per_head = lambda Lq=Lq: with_empty_row(cases.random_mask(gen, B, H, Lq, Lk), gen)  # noqa: E731
    shared = lambda: with_empty_row(cases.random_mask(gen, B, 1, Lq, Lk), gen)  # noqa: E731
    keys = (torch.arange(Lk) < cases.lengths(gen, B, Lk)[:, None])[:, None, None, :]  # (B, 1, 1, Lk)
    S = lambda *a: saved(gen, *a)  # noqa: E731
    long_q = Lk + cases.integer(gen, 1, 3)  # more queries than keys
    big = cases.random_mask(gen, 1, 1, *MEMORY[2:4], p=0.8)  # shared by the heads
    return checks + [
        J.values(R, "matches autograd (B=2, per-head and shared masks, tile not dividing Lk)",
                 [Call(S(*x(), per_head()), {"tile": tile}), Call((*S(*x(), shared()), tile))]),
        J.values(R, "mask broadcasts: (Lq, Lk), (B, 1, 1, Lk) padding, and no mask",
                 [Call(S(*x(), with_empty_row(cases.random_mask(gen, Lq, Lk), gen)), {"tile": tile}),
                  Call(S(*x(), keys), {"tile": tile}), Call(S(*x(), None), {"tile": tile})]),
        J.values(R, "Lq < Lk bottom-right causal; Lq > Lk with an arbitrary mask",
                 [Call(S(*x(), am.causal_mask(Lq, n_keys=Lk)), {"tile": tile}),
                  Call(S(*x(Lq=long_q), per_head(long_q)), {"tile": tile})]),
        J.values(R, "tile = 1, tile = Lk, tile > Lk",
                 [Call((*S(*x(), per_head()), 1)), Call(S(*x(), per_head()), {"tile": Lk}),
                  Call(S(*x(), shared()), {"tile": Lk + 3})]),
        J.values(R, "rows that see only the last, partial tile; rows whose first tile is fully masked",
                 [Call(S(*x(), last_only(gen, B, H, Lq, Lk, tile)), {"tile": tile}),
                  Call(S(*x(), first_tile_blocked(gen, B, H, Lq, Lk, tile)), {"tile": tile})]),
        J.values(R, "skips fully masked tiles, the first one included (random sizes)",
                 [Call(skippable_saved(gen, B, H, Lq, 3 * tile + 1, tile), {"tile": tile})], weight=2.0),
        J.values(R, "tiles blocked for one head, one batch row or one query only are not skipped",
                 [Call(S(*x(Lk=3 * tile + 1), partly_blocked(gen, B, H, Lq, 3 * tile + 1, tile)),
                       {"tile": tile})]),
        # Integer q and k with d = 4: the scores are exact in float32, so what is judged is the
        # recomputation from the lse, not float32's rounding of scores near 1e2.
        J.values(R, "large scores (≈ 1e2, past exp in float32) next to masked keys",
                 [Call(S(*big_scores(gen, B, H, Lq, Lk, dv), per_head()), {"tile": tile})]),
        J.values(R, "allowed scores below -2e9 (exact) beside blocked keys: a finite fill outweighs them",
                 [Call(negative_saved(gen, B, H, Lq, Lk, dv, per_head()), {"tile": tile})]),
        J.values(R, "float16, with a fully masked row", [Call(S(*x(F16), shared()), {"tile": tile})]),
        J.values(R, "bfloat16, with a fully masked row", [Call(S(*x(BF16), per_head()), {"tile": tile})]),
        J.values(R, "float16 and bfloat16 with sharp weights (Lq=32, Lk=48, d=16)",
                 [Call(S(*qkv(gen, 1, 2, 32, 48, 16, 3, dt, 3.0), cases.random_mask(gen, 1, 2, 32, 48)),
                       {"tile": 8}) for dt in (F16, BF16)]),
        J.dtypes(R, "dq, dk, dv keep the inputs' dtype",
                 [Call(S(*x(dt), shared()), {"tile": tile}) for dt in cases.FLOATS]),
        # meta inputs with a mask, CPU inputs without one under a meta default device: a tensor made
        # without device= fails one or the other, the mask made for mask=None the second
        P.on_device(R, "on the inputs' device (meta), with a mask",
                    [Call(S(*x(), shared()), {"tile": tile}, device="meta")], vectorised=False),
        P.made_on_inputs_device(R, P.MADE_ON_INPUTS + " (mask left out)", [Call(S(*x(), None)[:6])]),
        P.unchanged(R, "does not modify inputs", [Call(S(*x(), per_head()), {"tile": tile})]),
        P.on_cuda(R, "matches on CUDA",
                  [Call(S(*x(F16), per_head()), {"tile": tile}), Call(S(*x(), None), {"tile": tile})]),
        # The given lse and out are the contract: a backward that recomputes them (autograd through a
        # forward, or a second tiled forward) follows what the forward would save, not what it was
        # given, and loses more than half the points here alone.
        J.values(R, "follows the given lse and out (random sizes, a per-head mask and none, long keys)",
                 [Call(given(gen, *x(), per_head()), {"tile": tile}),
                  Call(given(gen, *x(Lk=3 * tile + 1), None), {"tile": tile})], weight=20.0),
        # Right gradients from the whole weight matrix are autograd's, not this exercise's: what the call
        # holds alive at once stays below half of that matrix, and the rule outweighs every other check.
        Check(f"holds less than half of the weight matrix alive at once (B=1, H=2, Lq={MEMORY[2]}, "
              f"Lk={MEMORY[3]}, tile=4)",
              [Call(given(gen, *qkv(gen, *MEMORY), big), {"tile": 4}, allocations=True),
               Call(S(*qkv(gen, *MEMORY), None), {"tile": 4}, allocations=True)],
              LM.live_memory_judge(R, X8["bwd_full_scores"]), kind="property", weight=46.0),
    ]
