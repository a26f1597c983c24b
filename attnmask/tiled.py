"""Attention one key tile at a time: the online softmax of chapter 8.

For each query row it keeps a running max ``m`` of the scores seen so far, a
running sum ``l`` of ``exp(score - m)`` and a running sum ``acc`` of
``exp(score - m) * value``. A tile that raises the max rescales ``l`` and
``acc`` by ``exp(m_old - m_new)`` first; after the last tile ``acc / l`` is the
softmax-weighted average of the values. Only one ``(B, H, Lq, tile)`` block of
scores exists at a time, and a key tile whose mask is all False is skipped
without reading its keys or values: it would only add zeros.

:func:`tiled_attention_backward` is the backward pass from the saved
log-sum-exp, as FlashAttention's kernels do it: each key tile's weights are
recomputed as ``exp(score - lse)`` instead of being kept from the forward pass,
so the backward too holds one ``(B, H, Lq, tile)`` block at a time.
"""

from __future__ import annotations

import math

import torch

from .attention import check_qkv
from .masks import broadcast_mask
from .softmax import _UPCAST

__all__ = ["TiledAttentionFunction", "tiled_attention", "tiled_attention_backward", "tiled_attention_fn"]


def _sizes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tile: int) -> tuple[int, ...]:
    """(B, H, Lq, d, Lk, dv) of four-dimensional q, k, v; ValueError for other shapes or a tile < 1."""
    check_qkv(q, k, v)
    if q.dim() != 4:
        raise ValueError(f"q has shape {tuple(q.shape)}; expected (B, H, Lq, d)")
    if isinstance(tile, bool) or not isinstance(tile, int) or tile < 1:
        raise ValueError(f"tile must be an int >= 1; got {tile!r}")
    B, H, Lq, d = q.shape
    return B, H, Lq, d, k.shape[-2], v.shape[-1]


def tiled_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    tile: int = 64,
    *,
    scale: float | None = None,
) -> torch.Tensor:
    """Scaled dot-product attention over key tiles with the online softmax.

    Args:
        q: ``(B, H, Lq, d)``; k: ``(B, H, Lk, d)``; v: ``(B, H, Lk, dv)``, one
            dtype and device.
        mask: bool, True = may attend, broadcastable to ``(B, H, Lq, Lk)``; or
            ``None`` for full attention.
        tile: keys per tile, any ``tile >= 1``; the last tile holds the
            ``Lk % tile`` keys left over when ``tile`` does not divide ``Lk``.
        scale: multiplier of the scores, default ``1 / sqrt(d)``.

    Returns:
        ``(B, H, Lq, dv)`` in q's dtype: the output of
        :func:`attnmask.attention`, zeros for a query row with no allowed key.
        float16/bfloat16 are accumulated in float32. Tiles whose mask is all
        False are skipped: their keys and values are never read.
    """
    return _online(q, k, v, mask, tile, scale)[0]


def _online(q, k, v, mask, tile, scale=None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`tiled_attention`'s loop: ``(out (B, H, Lq, dv)`` in q's dtype, ``lse (B, H, Lq))`` in
    the working dtype (float32 for float16/bfloat16), ``m + log(l)``, -inf on a row with no allowed key."""
    B, H, Lq, d, Lk, dv = _sizes(q, k, v, tile)
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            got = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
            raise TypeError(f"mask must be torch.bool (True = may attend); got {got}")
        if mask.device != q.device:
            raise ValueError(f"mask is on {mask.device} but q is on {q.device}; "
                             "build the mask on the inputs' device")
        mask = broadcast_mask(mask, (B, H, Lq, Lk))  # a view: nothing is copied
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    work = torch.float32 if q.dtype in _UPCAST else q.dtype
    qs = q.to(work) * scale  # (B, H, Lq, d)
    m = torch.full((B, H, Lq, 1), float("-inf"), dtype=work, device=q.device)  # running max
    l = torch.zeros(B, H, Lq, 1, dtype=work, device=q.device)  # running sum of exp(s - m)
    acc = torch.zeros(B, H, Lq, dv, dtype=work, device=q.device)  # running sum of exp(s - m) v
    for c in range(0, Lk, tile):  # slicing stops at Lk: the last tile may be partial
        allowed = None if mask is None else mask[..., c:c + tile]  # (B, H, Lq, t)
        if allowed is not None and not bool(allowed.any()):
            continue  # every weight in this tile is 0: skip it, keys and values unread
        s = qs @ k[..., c:c + tile, :].to(work).transpose(-2, -1)  # (B, H, Lq, t)
        if allowed is not None:
            s = s.masked_fill(~allowed, float("-inf"))
        # The max is a shift that cancels in acc / l: no gradient flows through it.
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True)).detach()
        # A row with no allowed key so far has m_new = -inf, and exp(-inf - (-inf))
        # is NaN: shift such rows by 0 instead, so their terms are exp(-inf) = 0.
        shift = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
        rescale = torch.exp(m - shift)  # moves the old sums to the new max
        p = torch.exp(s - shift)  # (B, H, Lq, t)
        l = l * rescale + p.sum(dim=-1, keepdim=True)
        acc = acc * rescale + p @ v[..., c:c + tile, :].to(work)
        m = m_new
    # A row with no allowed key has l = 0 and acc = 0: divide by 1, not by 0.
    out = acc / l.masked_fill(l == 0, 1.0)  # (B, H, Lq, dv)
    lse = torch.where(l > 0, m + torch.log(l.masked_fill(l == 0, 1.0)), float("-inf"))[..., 0]  # (B, H, Lq)
    return out.to(q.dtype), lse


def tiled_attention_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    d_out: torch.Tensor,
    mask: torch.Tensor | None = None,
    tile: int = 64,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of attention's output, one key tile at a time, from the saved lse.

    With ``s = q·k / sqrt(d)`` over the allowed keys and ``p = exp(s - lse)`` (each
    tile's weights, recomputed), ``D = rowsum(d_out * out)``:
    ``dv = p^T d_out``, ``ds = p * (d_out v^T - D)``, ``dq = ds k / sqrt(d)``,
    ``dk = ds^T q / sqrt(d)``.

    Args:
        q: ``(B, H, Lq, d)``; k: ``(B, H, Lk, d)``; v: ``(B, H, Lk, dv)``.
        out: ``(B, H, Lq, dv)``, attention's output for these inputs (0 on fully
            masked rows); d_out: ``(B, H, Lq, dv)``, the gradient of the loss
            with respect to ``out``.
        lse: ``(B, H, Lq)`` float32 (float64 for float64 inputs), the log of the
            sum of ``exp(s)`` over the allowed keys, -inf on a fully masked row
            (as :func:`attnmask.attention_lse` returns it).
        mask: bool, True = may attend, broadcastable to ``(B, H, Lq, Lk)``; or None.
        tile: keys per tile, any ``tile >= 1`` (the last tile may be partial).

    Returns:
        ``(dq, dk, dv)`` with the shapes and dtypes of ``q``, ``k`` and ``v``,
        computed in float32 for float16/bfloat16 inputs. A fully masked row gives
        zero gradients, and a key tile whose mask is all False is skipped (its keys
        and values are never read; their gradients are 0).
    """
    B, H, Lq, d, Lk, dv = _sizes(q, k, v, tile)
    for name, t, shape in (("out", out, (B, H, Lq, dv)), ("d_out", d_out, (B, H, Lq, dv)),
                           ("lse", lse, (B, H, Lq))):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} has shape {got}; expected {shape}")
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            got = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
            raise TypeError(f"mask must be torch.bool (True = may attend); got {got}")
        mask = broadcast_mask(mask, (B, H, Lq, Lk))  # a view: nothing is copied
    scale = 1.0 / math.sqrt(d)
    work = torch.float32 if q.dtype in _UPCAST else q.dtype
    qw = q.to(work)  # (B, H, Lq, d)
    do = d_out.to(work)  # (B, H, Lq, dv)
    D = (do * out.to(work)).sum(dim=-1, keepdim=True)  # (B, H, Lq, 1)
    # A fully masked row has lse = -inf and every score -inf: exp(-inf - 0) = 0, not NaN.
    lse = lse.to(work)[..., None]
    lse = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))  # (B, H, Lq, 1)
    dq = torch.zeros(B, H, Lq, d, dtype=work, device=q.device)
    dks, dvs = [], []
    for c in range(0, Lk, tile):
        kc, vc = k[..., c:c + tile, :], v[..., c:c + tile, :]
        t = kc.shape[-2]
        allowed = None if mask is None else mask[..., c:c + tile]  # (B, H, Lq, t)
        if allowed is not None and not bool(allowed.any()):
            # every weight of the tile is 0: so are its gradients, keys and values unread
            dks.append(torch.zeros(B, H, t, d, dtype=work, device=q.device))
            dvs.append(torch.zeros(B, H, t, dv, dtype=work, device=q.device))
            continue
        kc, vc = kc.to(work), vc.to(work)
        s = (qw @ kc.transpose(-2, -1)) * scale  # (B, H, Lq, t)
        if allowed is not None:
            s = s.masked_fill(~allowed, float("-inf"))
        p = torch.exp(s - lse)  # (B, H, Lq, t): the forward's weights, recomputed
        dvs.append(p.transpose(-2, -1) @ do)  # (B, H, t, dv)
        ds = p * (do @ vc.transpose(-2, -1) - D)  # (B, H, Lq, t)
        dq = dq + (ds @ kc) * scale
        dks.append((ds.transpose(-2, -1) @ qw) * scale)  # (B, H, t, d)
    dk = torch.cat(dks, dim=-2) if dks else torch.zeros(B, H, 0, d, dtype=work, device=q.device)
    dv_ = torch.cat(dvs, dim=-2) if dvs else torch.zeros(B, H, 0, dv, dtype=work, device=q.device)
    return dq.to(q.dtype), dk.to(k.dtype), dv_.to(v.dtype)


class TiledAttentionFunction(torch.autograd.Function):
    """Chapter 8's two halves as one autograd operation: the forward is :func:`tiled_attention`'s
    loop, which saves only ``out`` and the row's ``lse`` (no weights), and the backward is
    :func:`tiled_attention_backward` from them. ``apply(q, k, v, mask, tile)``."""

    @staticmethod
    def forward(ctx, q, k, v, mask, tile):
        out, lse = _online(q, k, v, mask, tile)
        ctx.save_for_backward(q, k, v, out, lse, mask)
        ctx.tile = tile
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, out, lse, mask = ctx.saved_tensors
        dq, dk, dv = tiled_attention_backward(q, k, v, out, lse, d_out, mask, ctx.tile)
        return dq, dk, dv, None, None


def tiled_attention_fn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    tile: int = 64,
) -> torch.Tensor:
    """:func:`tiled_attention` whose gradients come from :func:`tiled_attention_backward`
    (:class:`TiledAttentionFunction`): between the passes only ``out`` and ``lse`` are kept.

    Args and returns as :func:`tiled_attention`; the gradients in q, k and v are attention's."""
    return TiledAttentionFunction.apply(q, k, v, mask, tile)
