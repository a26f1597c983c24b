"""Chapter 8, masks at speed: ``tiled_attention``, attention one key tile at a time
with the online softmax.

Besides the values (which any correct attention gives), two checks hold the
algorithm to what the chapter teaches: a key tile whose mask is all False is
skipped, so NaN keys and values there (an uninitialised cache) never reach the
output; and the floating tensors the call holds alive at once never reach half of
the B·H·Lq·Lk score matrix, which the worker records for the calls that ask it
(:attr:`grader.spec.Call.allocations`, :mod:`grader.checks.common.live_memory`).

``tiled_attention_backward``'s checks and mistakes (:data:`MISTAKES8`) are in :mod:`.backward`,
the capstone ``tiled_attention_fn``'s in :mod:`.capstone`; the inputs they draw in
:mod:`grader.checks.common.inputs`.
"""

from __future__ import annotations

import functools
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
from ..common import nan_reasons as NR
from ..common import properties as P
from ..common.inputs import MEMORY, exact_qkv, first_tile_blocked, last_only, qkv, skippable

M = MISTAKES
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


# --------------------------------------------------------------------------- the mistakes, computed

def online(q, k, v, mask, tile, *, rescale_sum=True, rescale_out=True, guard=True, skip=True):
    """The online softmax with one of its classic steps left out (in the inputs' dtype):
    no rescale of the running sum ``l`` or of the running output ``acc``, no guard
    against a row whose max is still -inf, no skip of fully masked tiles."""
    B, H, Lq, d = q.shape
    Lk = k.shape[-2]
    shape = (B, H, Lq, Lk)
    full = torch.ones(shape, dtype=torch.bool) if mask is None else torch.broadcast_to(mask, shape)
    m = torch.full((B, H, Lq, 1), float("-inf"), dtype=q.dtype)
    l = torch.zeros(B, H, Lq, 1, dtype=q.dtype)
    acc = torch.zeros(B, H, Lq, v.shape[-1], dtype=q.dtype)
    for c in range(0, Lk, tile):
        allowed = full[..., c:c + tile]
        if skip and not bool(allowed.any()):
            continue
        s = (q @ k[..., c:c + tile, :].mT / math.sqrt(d)).masked_fill(~allowed, float("-inf"))
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        shift = torch.where(torch.isfinite(m_new), m_new, 0.0) if guard else m_new
        rescale = torch.exp(m - shift)
        p = torch.exp(s - shift)
        l = (l * rescale if rescale_sum else l) + p.sum(dim=-1, keepdim=True)
        acc = (acc * rescale if rescale_out else acc) + p @ v[..., c:c + tile, :]
        m = m_new
    return acc / l.masked_fill(l == 0, 1.0)


def _keys(q, k, v, mask, n):
    """The reference over the first ``n`` keys only."""
    m = None if mask is None else torch.broadcast_to(mask, (*q.shape[:-1], k.shape[-2]))[..., :n]
    return am.tiled_attention(q, k[..., :n, :], v[..., :n, :], m, 1)


def _padded(q, k, v, mask, tile):
    """Keys and values padded with zeros up to a multiple of ``tile``, the padding left visible."""
    extra = -k.shape[-2] % tile
    pad = lambda t: torch.cat([t, t.new_zeros(*t.shape[:-2], extra, t.shape[-1])], dim=-2)  # noqa: E731
    shape = (*q.shape[:-1], k.shape[-2])
    m = torch.ones(shape, dtype=torch.bool) if mask is None else torch.broadcast_to(mask, shape)
    m = torch.cat([m, torch.ones(*shape[:-1], extra, dtype=torch.bool)], dim=-1)
    return am.attention(q, pad(k), pad(v), m)[0]


def tiled_mistakes(q, k, v, mask, tile) -> list[dg.Candidate]:
    Lk, d = k.shape[-2], q.shape[-1]
    ref = lambda m=mask, **kw: am.tiled_attention(q, k, v, m, tile, **kw)  # noqa: E731
    out = [
        (M["no_rescale"], lambda: online(q, k, v, mask, tile, rescale_sum=False)),
        (M["no_rescale"], lambda: online(q, k, v, mask, tile, rescale_out=False)),
        (M["no_rescale"], lambda: online(q, k, v, mask, tile, rescale_sum=False, rescale_out=False)),
        (M["tile_nan"], lambda: online(q, k, v, mask, tile, guard=False)),
        (M["tile_nan"], lambda: online(q, k, v, mask, tile, guard=False, skip=False)),
        (M["no_scale"], lambda: ref(scale=1.0)),
        (M["scale_1_over_d"], lambda: ref(scale=1.0 / d)),
    ]
    if Lk % tile:
        out += [(M["last_tile"], lambda: _keys(q, k, v, mask, Lk - Lk % tile)),
                (M["last_tile"], lambda: _padded(q, k, v, mask, tile))]
    elif Lk > tile:
        out.append((M["last_tile"], lambda: _keys(q, k, v, mask, Lk - tile)))
    if mask is not None:
        out += [(M["inverted"], lambda: ref(~mask)), (M["no_mask"], lambda: ref(None))]
    return out


def diagnose_tiled(args, kwargs, got, index, dtype) -> str | None:
    q, k, v, mask, tile = NR.tiled_parts(args, kwargs)
    # Where the NaN sit says more than any one candidate: NaN in the empty rows only is
    # the final 0 / 0, which a missing guard also gives when only empty rows lack one.
    return NR.tiled_nan_reason(args, kwargs, got) or dg.name_mistake(
        got, tiled_mistakes(q, k, v, mask, tile), dtype)


TILED = J.Recipe("tiled_attention", am.tiled_attention, ("q", "k", "v", "mask", "tile"),
                 (J.Out("out", "number", "(B, H, Lq, dv)"),), diagnose_tiled)


@exercise(3.5, "tiled_attention(q, k, v, mask=None, tile=64): attention's out (B, H, Lq, dv) computed one "
          "key tile at a time with a running max and sum; skips tiles whose mask is all False; the floating "
          "tensors it holds alive at once stay below half of the B·H·Lq·Lk score matrix.")
def tiled_attention_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    R = TILED
    pub = cases.generator(cases.PUBLIC_SEED, R.name)
    heads = with_empty_row(cases.random_mask(pub, 1, 2, 3, 8), pub)
    checks = [
        J.values(R, "matches attention (B=1, H=2, Lq=3, Lk=8, tile=4), a fully masked row",
                 [Call((*qkv(pub, 1, 2, 3, 8, 4, 2), heads), {"tile": 4})], public=True),
        J.values(R, "tile=3 does not divide Lk=7; rows whose first tile is fully masked",
                 [Call((*qkv(pub, 1, 1, 4, 7, 4, 2), first_tile_blocked(pub, 1, 1, 4, 7, 3)), {"tile": 3})],
                 public=True),
        J.values(R, "tile=1 with no mask; tile > Lk", [Call(qkv(pub, 1, 2, 3, 5, 4, 2), {"tile": 1}),
                                                      Call((*qkv(pub, 1, 1, 2, 5, 3, 3), None, 8))],
                 public=True),
        J.values(R, "skips fully masked tiles: their NaN keys and values never reach out",
                 [Call(skippable(pub, 1, 2, 3, 10, 3), {"tile": 3})], public=True, weight=2.0),
    ]
    if not hidden:
        return checks
    gen = cases.generator(seed, R.name)
    B, H, d, dv = 2, cases.integer(gen, 2, 3), cases.integer(gen, 4, 8), cases.integer(gen, 2, 3)
    Lq, Lk = cases.integer(gen, 3, 5), cases.integer(gen, 9, 13)
    tile = cases.integer(gen, 2, 4)
    if Lk % tile == 0:
        Lk += 1  # a partial last tile
    x = lambda dtype=F32, scale=1.0: qkv(gen, B, H, Lq, Lk, d, dv, dtype, scale)  # noqa: E731
    exact = functools.partial(exact_qkv, gen)
    per_head = lambda: with_empty_row(cases.random_mask(gen, B, H, Lq, Lk), gen)  # noqa: E731
    shared = lambda: with_empty_row(cases.random_mask(gen, B, 1, Lq, Lk), gen)  # noqa: E731
    keys = (torch.arange(Lk) < cases.lengths(gen, B, Lk)[:, None])[:, None, None, :]  # (B, 1, 1, Lk)
    big = cases.random_mask(gen, 1, 1, *MEMORY[2:4], p=0.8)  # shared by the heads
    return checks + [
        J.values(R, "matches reference (B=2, per-head and shared masks, tile not dividing Lk)",
                 [Call((*x(), per_head()), {"tile": tile}), Call((*x(), shared(), tile))]),
        J.values(R, "mask broadcasts: (Lq, Lk), (B, 1, 1, Lk) padding, and no mask",
                 [Call((*x(), with_empty_row(cases.random_mask(gen, Lq, Lk), gen)), {"tile": tile}),
                  Call((*x(), keys), {"tile": tile}), Call(x(), {"tile": tile})]),
        J.values(R, "tile = 1, tile = Lk - 1, tile = Lk",
                 [Call((*x(), per_head(), 1)), Call((*x(), shared()), {"tile": Lk - 1}),
                  Call((*x(), per_head()), {"tile": Lk})]),
        J.values(R, "rows that see only the last, partial tile",
                 [Call((*x(), last_only(gen, B, H, Lq, Lk, tile)), {"tile": tile}),
                  Call((*x(), last_only(gen, B, H, Lq, Lk, Lk - 2)), {"tile": Lk - 2})]),
        J.values(R, "rows whose first tile is fully masked (other rows see it)",
                 [Call((*x(), first_tile_blocked(gen, B, H, Lq, Lk, tile)), {"tile": tile}),
                  Call((*x(), first_tile_blocked(gen, B, H, Lq, Lk, 1)), {"tile": 1})]),
        J.values(R, "skips fully masked tiles, the first one included (random sizes)",
                 [Call(skippable(gen, B, H, Lq, 3 * tile + 1, tile), {"tile": tile})]),
        J.values(R, "large scores next to masked keys (≈ 1e5)", [Call((*exact(B, H, Lq, Lk, dv, "large"),
                                                                       per_head()), {"tile": tile})]),
        J.values(R, "scores of ±1e10, and rows whose every score is below -2e9",
                 [Call((*exact(B, H, Lq, Lk, dv, "huge"), per_head()), {"tile": tile}),
                  Call((*exact(B, H, Lq, Lk, dv, "negative"), per_head()), {"tile": tile})]),
        J.values(R, "float16, with a fully masked row", [Call((*x(F16), shared()), {"tile": tile})]),
        J.values(R, "bfloat16, with a fully masked row", [Call((*x(BF16), per_head()), {"tile": tile})]),
        P.gradients(R, "finite gradients with fully masked rows, match reference",
                    [Call((*x(), cases.two_keys_or_none(per_head())), {"tile": tile}),
                     Call((*x(), cases.two_keys_or_none(first_tile_blocked(gen, B, H, Lq, Lk, tile))),
                          {"tile": tile})]),
        J.dtypes(R, "keeps the inputs' dtype",
                 [Call((*x(dt), shared()), {"tile": tile}) for dt in cases.FLOATS]),
        *P.device_checks(R, "on the inputs' device (meta), with and without a mask",
                    [Call(x(), device="meta"), Call((*x(), shared()), {"tile": tile}, device="meta")],
                    vectorised=False),
        P.unchanged(R, "does not modify inputs", [Call((*x(), per_head()), {"tile": tile})]),
        P.on_cuda(R, "matches on CUDA",
                  [Call((*x(F16), per_head()), {"tile": tile}), Call(x(), {"tile": tile})]),
        # Right values from the whole score matrix are chapter 2's attention, not this exercise: what
        # the call holds alive at once stays below half of that matrix, and the rule outweighs every
        # other check together (such code, or autograd keeping every tile's weights, loses over half).
        Check(f"holds less than half of the score matrix alive at once (B=1, H=2, Lq={MEMORY[2]}, "
              f"Lk={MEMORY[3]}, tile=4)",
              [Call((*qkv(gen, *MEMORY), big), {"tile": 4}, allocations=True),
               Call(qkv(gen, *MEMORY), {"tile": 4}, allocations=True)],
              LM.live_memory_judge(TILED, M["full_scores"]), kind="property", weight=24.0),
    ]
