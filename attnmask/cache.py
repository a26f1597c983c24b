"""KV cache for incremental decoding.

At step t the new query needs keys/values of positions 0..t. Recomputing them
every step costs O(t) projections per step; caching them costs one projection.
The causal rule becomes implicit for a single new token (the cache holds only
the past), and explicit, *bottom-right aligned*, when n > 1 new tokens arrive
together (chunked prefill).
"""

from __future__ import annotations

import torch

from .attention import attention
from .masks import causal_mask

__all__ = ["KVCache", "kv_cache_attention"]


def kv_cache_attention(
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention of n new tokens over the cache plus themselves.

    Args:
        q, k_new, v_new: ``(B, H, n, d)`` for the n new positions T .. T+n-1.
        k_cache, v_cache: ``(B, H, T, d)``, ``T >= 0`` past positions.

    Returns:
        ``(out (B, H, n, d), k_all (B, H, T+n, d), v_all (B, H, T+n, d))`` with
        ``k_all = cat(k_cache, k_new, dim=2)``. New query i attends keys
        ``0 .. T + i``: the causal mask aligned bottom-right.
    """
    for name, t in (("q", q), ("k_new", k_new), ("v_new", v_new), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dim() != 4:
            raise ValueError(f"{name} has shape {tuple(t.shape)}; expected 4 dimensions (B, H, n, d) "
                             "for the new tokens and (B, H, T, d) for the caches")
    if not (q.shape[:3] == k_new.shape[:3] == v_new.shape[:3]):
        raise ValueError(f"q {tuple(q.shape)}, k_new {tuple(k_new.shape)} and v_new "
                         f"{tuple(v_new.shape)} must share (B, H, n): one key and value per new query")
    for name, new, cache in (("k", k_new, k_cache), ("v", v_new, v_cache)):
        if cache.shape[:2] != new.shape[:2] or cache.shape[3] != new.shape[3]:
            raise ValueError(f"{name}_cache (B, H, T, d) = {tuple(cache.shape)} does not match "
                             f"{name}_new (B, H, n, d) = {tuple(new.shape)} in B, H or d")
    k_all = torch.cat([k_cache, k_new], dim=2)  # (B, H, T+n, d)
    v_all = torch.cat([v_cache, v_new], dim=2)
    n, total = q.shape[-2], k_all.shape[-2]
    mask = causal_mask(n, n_keys=total, align="bottom_right", device=q.device)  # (n, T+n)
    out, _ = attention(q, k_all, v_all, mask)
    return out, k_all, v_all


class KVCache:
    """Per-layer cache of keys and values ``(B, H, T, d)``.

    Self-attention appends (``update(k, v)``); cross-attention stores the
    encoder's keys/values once (``update(k, v, replace=True)``) and reuses them.
    """

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def update(self, k: torch.Tensor, v: torch.Tensor, *, replace: bool = False):
        """Append (or, with ``replace``, set) ``k, v (B, H, n, d)``; return the full cache."""
        if self.k is None or replace:
            self.k, self.v = k, v
        else:
            self.k = torch.cat([self.k, k], dim=2)
            self.v = torch.cat([self.v, v], dim=2)
        return self.k, self.v
