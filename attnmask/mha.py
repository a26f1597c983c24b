"""Multi-head attention for self- and cross-attention.

Self-attention: queries, keys and values all come from ``x``.
Cross-attention: queries from the decoder ``x_q (B, Lq, D)``, keys and values
from the encoder ``x_kv (B, Lk, D)``; the scores are rectangular ``(Lq, Lk)``.
"""

from __future__ import annotations

import torch
from torch import nn

from .attention import attention

__all__ = ["MultiHeadAttention", "merge_heads", "multi_head_attention", "split_heads"]


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """``(B, L, D) -> (B, H, L, d)`` with ``d = D // H``."""
    B, L, D = x.shape
    return x.view(B, L, n_heads, D // n_heads).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """``(B, H, L, d) -> (B, L, H * d)``."""
    B, H, L, d = x.shape
    return x.transpose(1, 2).reshape(B, L, H * d)


def multi_head_attention(
    x_q: torch.Tensor,
    x_kv: torch.Tensor,
    w_q: torch.Tensor,
    w_k: torch.Tensor,
    w_v: torch.Tensor,
    w_o: torch.Tensor,
    n_heads: int,
    mask: torch.Tensor | None = None,
    *,
    need_weights: bool = True,
) -> torch.Tensor:
    """Functional multi-head attention.

    Args:
        x_q: queries' source ``(B, Lq, D)``; x_kv: keys'/values' source ``(B, Lk, D)``
            (pass the same tensor for self-attention).
        w_q, w_k, w_v, w_o: ``(D, D)`` weights, applied as ``x @ w.T``.
        n_heads: H, dividing D; each head has width ``d = D // H`` and scale ``1/sqrt(d)``.
        mask: bool, True = may attend, broadcastable to ``(B, H, Lq, Lk)``.
        need_weights: ``False`` takes the fused SDPA path.

    Returns:
        ``(B, Lq, D)``.
    """
    for name, x in (("x_q", x_q), ("x_kv", x_kv)):
        if x.dim() != 3:
            raise ValueError(f"{name} has shape {tuple(x.shape)}; expected (B, L, D). "
                             "Add a batch dimension with x[None] for a single sequence.")
    B, _, D = x_q.shape
    if x_kv.shape[0] != B or x_kv.shape[2] != D:
        raise ValueError(f"x_q (B, Lq, D) = {tuple(x_q.shape)} and x_kv (B, Lk, D) = "
                         f"{tuple(x_kv.shape)} must share B and D")
    for name, w in (("w_q", w_q), ("w_k", w_k), ("w_v", w_v), ("w_o", w_o)):
        if tuple(w.shape) != (D, D):
            raise ValueError(f"{name} has shape {tuple(w.shape)}; expected (D, D) = ({D}, {D}), "
                             "applied as x @ w.T")
    if D % n_heads:
        raise ValueError(f"model width D = {D} is not divisible by n_heads = {n_heads}")
    q = split_heads(x_q @ w_q.T, n_heads)  # (B, H, Lq, d)
    k = split_heads(x_kv @ w_k.T, n_heads)  # (B, H, Lk, d)
    v = split_heads(x_kv @ w_v.T, n_heads)  # (B, H, Lk, d)
    out, _ = attention(q, k, v, mask, need_weights=need_weights)  # (B, H, Lq, d)
    return merge_heads(out) @ w_o.T  # (B, Lq, D)


class MultiHeadAttention(nn.Module):
    """Multi-head attention module (bias-free projections, as in the functional form).

    ``forward(x_q, x_kv=None, mask=None, cache=None)``: ``x_kv=None`` means
    self-attention. With a :class:`attnmask.cache.KVCache` layer the module
    appends the new keys/values (self-attention) or computes the encoder's
    keys/values once and reuses them (cross-attention). The attention weights
    of the last call are kept in ``self.last_weights`` ``(B, H, Lq, Lk)``.
    """

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model = {d_model} is not divisible by n_heads = {n_heads}")
        self.n_heads = n_heads
        self.w_q = nn.Linear(d_model, d_model, bias=False)
        self.w_k = nn.Linear(d_model, d_model, bias=False)
        self.w_v = nn.Linear(d_model, d_model, bias=False)
        self.w_o = nn.Linear(d_model, d_model, bias=False)
        self.last_weights: torch.Tensor | None = None

    def forward(self, x_q, x_kv=None, mask=None, cache=None, *, cross: bool = False):
        """x_q ``(B, Lq, D)``, x_kv ``(B, Lk, D)`` or None; returns ``(B, Lq, D)``."""
        H = self.n_heads
        q = split_heads(self.w_q(x_q), H)  # (B, H, Lq, d)
        if cache is not None and cross and cache.k is not None:
            k, v = cache.k, cache.v  # the encoder's keys/values, computed once
        else:
            src = x_q if x_kv is None else x_kv
            k = split_heads(self.w_k(src), H)  # (B, H, Lk, d)
            v = split_heads(self.w_v(src), H)
            if cache is not None:
                k, v = cache.update(k, v, replace=cross)
        out, w = attention(q, k, v, mask)
        self.last_weights = w.detach()
        return self.w_o(merge_heads(out))
