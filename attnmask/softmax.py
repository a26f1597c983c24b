"""Softmax with a boolean mask applied before normalising.

The mask enters as ``-inf`` *before* the softmax, so masked keys get weight
exactly 0 and the weights still sum to 1 over the allowed keys. A row with no
allowed key returns all zeros (not NaN) and has finite gradients.
"""

from __future__ import annotations

import torch

from .masks import broadcast_mask

__all__ = ["masked_softmax"]

_UPCAST = (torch.float16, torch.bfloat16)


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax over the last dimension of ``scores`` with ``mask`` applied first.

    Args:
        scores: float ``(..., Lq, Lk)``, finite.
        mask: bool, True = may attend, broadcastable to ``scores``; or ``None``.

    Returns:
        ``scores.shape`` and ``scores.dtype``. Each row sums to 1 over its
        allowed keys; a row with no allowed key is all zeros. float16/bfloat16
        are computed in float32 and rounded once at the end.
    """
    if not isinstance(scores, torch.Tensor) or not scores.dtype.is_floating_point:
        got = scores.dtype if isinstance(scores, torch.Tensor) else type(scores).__name__
        raise TypeError(f"scores must be a floating tensor (..., Lq, Lk); got {got}")
    x = scores.float() if scores.dtype in _UPCAST else scores
    if mask is None:
        return torch.softmax(x, dim=-1).to(scores.dtype)
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise TypeError(
            f"mask must be torch.bool (True = may attend); got {got}. "
            "Additive float masks are added to the scores instead."
        )
    if mask.device != scores.device:
        raise ValueError(
            f"mask is on {mask.device} but scores are on {scores.device}; "
            "build the mask on the scores' device"
        )
    mask = broadcast_mask(mask, scores.shape)
    x = x.masked_fill(~mask, float("-inf"))
    # Shift by the row max for stability. A fully masked row has max -inf; shift
    # it by 0 instead so exp gives exact zeros rather than exp(nan).
    row_max = x.amax(dim=-1, keepdim=True).detach()
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    e = torch.exp(x - row_max)
    denom = e.sum(dim=-1, keepdim=True)
    # 0 / 0 on a fully masked row: divide by 1 instead (not by where(...)
    # afterwards, whose backward would still multiply 0 by inf).
    denom = denom.masked_fill(denom == 0, 1.0)
    return (e / denom).to(scores.dtype)
