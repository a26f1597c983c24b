"""Learned attention sinks (gpt-oss, chapter 12).

Each head h has one learned logit ``sinks[h]`` that joins every row's softmax as an
extra "key" with no value: it takes weight in the denominator and gives nothing
back, so a row may put part (or all) of its weight on "nothing". The weights of
query i over the keys j it may attend are

    w[i, j] = exp(s[i, j] - m) / (exp(sink_h - m) + sum over allowed k of exp(s[i, k] - m))

with ``m`` the row's maximum over its allowed scores and the sink. A row with no
allowed key gives all its weight to the sink: output 0, finite gradients, and no
special case (chapter 2's NaN row has nothing to divide by zero here).

StreamingLLM's sink *tokens* (chapter 9) are real keys at the start of the cache
that a window keeps; this sink is a parameter, never a token, and no mask touches it.
"""

from __future__ import annotations

import math

import torch

from .attention import check_qkv
from .masks import broadcast_mask

__all__ = ["sink_attention", "sink_weights"]


def _wide(dtype: torch.dtype) -> torch.dtype:
    """float32 for float32/float16/bfloat16, float64 for float64: where the softmax runs."""
    return torch.promote_types(dtype, torch.float32)


def sink_weights(
    q: torch.Tensor, k: torch.Tensor, sinks: torch.Tensor, mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention weights with a learned sink, and the weight the sink took.

    Args:
        q: (B, H, Lq, d). k: (B, H, Lk, d). sinks: (H,), one logit per head.
        mask: bool broadcastable to (B, H, Lq, Lk), True = may attend; None: all.

    Returns:
        (weights (B, H, Lq, Lk), sink (B, H, Lq)), in float32 (float64 for float64
        inputs): each row's weights plus its sink weight add up to 1; blocked keys
        get exactly 0, and a fully masked row gives the sink all of it.
    """
    wide = _wide(q.dtype)
    scores = q.to(wide) @ k.to(wide).transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, Lq, Lk)
    if mask is not None:
        scores = scores.masked_fill(~broadcast_mask(mask, scores.shape), float("-inf"))
    sink = sinks.to(wide).view(-1, 1)  # (H, 1): broadcasts against (B, H, Lq)
    # The shift must include the sink: without it a sink far above the scores overflows exp.
    # It cancels in the ratio, so no gradient needs to flow through it.
    m = torch.maximum(scores.amax(dim=-1), sink).detach()  # (B, H, Lq), finite: the sink is
    e = torch.exp(scores - m[..., None])  # (B, H, Lq, Lk), 0 where blocked
    e_sink = torch.exp(sink - m)  # (B, H, Lq), > 0 for a finite sink
    total = e_sink + e.sum(dim=-1)  # (B, H, Lq), >= exp(0) = 1 at the row's maximum
    return e / total[..., None], e_sink / total


def sink_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Scaled dot-product attention with one learned sink logit per head (gpt-oss).

    Args:
        q: (B, H, Lq, d). k: (B, H, Lk, d). v: (B, H, Lk, dv).
        sinks: (H,), one learned logit per head.
        mask: bool broadcastable to (B, H, Lq, Lk), True = may attend; None: all.

    Returns:
        (B, H, Lq, dv) in q's dtype (the softmax runs in float32). The sink takes
        weight but adds no value; a fully masked row gives 0 with finite gradients.
        Gradients reach q, k, v and sinks.
    """
    check_qkv(q, k, v)
    if sinks.dim() != 1 or sinks.shape[0] != q.shape[-3]:
        raise ValueError(f"sinks has shape {tuple(sinks.shape)}; expected (H,) = ({q.shape[-3]},), "
                         "one logit per head of q (B, H, Lq, d)")
    weights, _ = sink_weights(q, k, sinks, mask)  # (B, H, Lq, Lk)
    return (weights @ v.to(weights.dtype)).to(q.dtype)  # (B, H, Lq, dv)
