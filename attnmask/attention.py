"""Scaled dot-product attention with a boolean mask: the explicit path that
returns the weights, and the fast path through PyTorch's fused kernels.

    scores  = q @ k^T * scale          # (..., Lq, Lk)
    weights = masked_softmax(scores)   # masked keys -> 0, fully masked rows -> 0
    out     = weights @ v              # (..., Lq, dv)

Both paths give the same results, including zeros for fully masked rows.

The mask may also be a mask function from :mod:`attnmask.predicates`
(``causal()``, ``sliding_window(w)``, ...). The explicit path materialises it;
the fast path lets :mod:`attnmask.dispatch` pick a kernel that often needs no
``(Lq, Lk)`` mask at all, and :func:`attention_plan` says which one and why.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from . import dispatch
from .dispatch import Plan
from .masks import broadcast_mask
from .predicates import MaskFn
from .softmax import masked_softmax

__all__ = ["Plan", "attention", "attention_plan", "check_qkv"]


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Raise a clear error unless q (..., Lq, d), k (..., Lk, d), v (..., Lk, dv)
    agree on leading dims, widths, dtype and device."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or not t.dtype.is_floating_point:
            raise TypeError(f"{name} must be a floating tensor; got {getattr(t, 'dtype', type(t))}")
        if t.dim() < 2:
            raise ValueError(f"{name} has shape {tuple(t.shape)}; expected (..., L, d)")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q (..., Lq, d) = {tuple(q.shape)} and k (..., Lk, d) = "
                         f"{tuple(k.shape)} must share the last dimension d")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must have the same Lk")
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]):
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} "
                         "must share their leading dimensions (..., e.g. B, H)")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v devices differ: {q.device}, {k.device}, {v.device}")


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | MaskFn | None = None,
    *,
    scale: float | None = None,
    need_weights: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Scaled dot-product attention.

    Args:
        q: ``(..., Lq, d)``; k: ``(..., Lk, d)``; v: ``(..., Lk, dv)``, same
            leading dims (e.g. ``(B, H)``), dtype and device.
        mask: bool, True = may attend, broadcastable to ``(..., Lq, Lk)``; or
            ``None`` for full attention; or a mask function from
            :mod:`attnmask.predicates`, which needs q ``(B, H, Lq, d)``.
        scale: multiplier of the scores, default ``1 / sqrt(d)``.
        need_weights: ``True`` runs the explicit path and returns the weights.
            ``False`` dispatches to ``F.scaled_dot_product_attention`` (fused,
            never materialises the weights) and returns ``(out, None)``; with
            a mask function, to the kernel :func:`attention_plan` names.

    Returns:
        ``(out (..., Lq, dv), weights (..., Lq, Lk) or None)``. A fully masked
        query row gets zero weights and a zero output on both paths.
    """
    check_qkv(q, k, v)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    chosen = dispatch.plan(q, k, mask, need_weights=need_weights)
    if chosen.kernel not in ("explicit", "sdpa"):
        return dispatch.run(chosen, q, k, v, mask, scale), None
    if callable(mask):
        mask = dispatch.dense_mask(mask, q, k)  # (B, 1 or H, Lq, Lk) or smaller
    scores_shape = (*q.shape[:-1], k.shape[-2])
    if mask is not None:
        if mask.dtype != torch.bool:
            raise TypeError(f"mask must be torch.bool (True = may attend); got {mask.dtype}")
        if mask.device != q.device:
            raise ValueError(f"mask is on {mask.device} but q is on {q.device}; "
                             "build the mask on the inputs' device")
        broadcast_mask(mask, scores_shape)
    if not need_weights:
        # SDPA's boolean mask uses our convention (True = may attend) and
        # returns 0 for a fully masked row, like the explicit path.
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale), None
    scores = (q @ k.transpose(-2, -1)) * scale  # (..., Lq, Lk)
    weights = masked_softmax(scores, mask)  # (..., Lq, Lk)
    return weights @ v, weights  # (..., Lq, dv)


def attention_plan(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | MaskFn | None = None,
    *,
    need_weights: bool = False,
) -> Plan:
    """Which kernel ``attention(q, k, v, mask, need_weights=need_weights)`` runs, and why.

    Returns:
        a frozen :class:`Plan` with ``kernel`` (e.g. ``"sdpa_is_causal"``) and
        ``reason`` (the rule that chose it, in words). Reads shapes, dtypes and
        devices only: nothing is computed.
    """
    check_qkv(q, k, v)
    return dispatch.plan(q, k, mask, need_weights=need_weights)
