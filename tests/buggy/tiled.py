"""The classic mistakes of chapter 8's ``tiled_attention``, each in otherwise correct
code: the online softmax with one step left out or off by one, and attention that
is right but not tiled."""

from __future__ import annotations

import math

import torch

from . import correct as ok


def _online(q, k, v, mask, tile, *, rescale_sum=True, guard=True, skip=True, stop=None, final_guard=True):
    B, H, Lq, d = q.shape
    Lk = k.shape[2]
    if mask is not None:
        mask = torch.broadcast_to(mask, (B, H, Lq, Lk))
    x = q.float() / math.sqrt(d)
    m = torch.full((B, H, Lq, 1), float("-inf"), device=q.device)
    total = torch.zeros(B, H, Lq, 1, device=q.device)
    acc = torch.zeros(B, H, Lq, v.shape[-1], device=q.device)
    for c in range(0, Lk if stop is None else stop(Lk, tile), tile):
        keep = None if mask is None else mask[..., c:c + tile]
        if skip and keep is not None and not keep.any():
            continue
        s = x @ k[:, :, c:c + tile].float().mT
        if keep is not None:
            s = s.masked_fill(~keep, float("-inf"))
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True)).detach()
        shift = torch.where(torch.isinf(m_new), 0.0, m_new) if guard else m_new
        alpha = torch.exp(m - shift)
        p = torch.exp(s - shift)
        total = (total * alpha if rescale_sum else total) + p.sum(dim=-1, keepdim=True)
        acc = acc * alpha + p @ v[:, :, c:c + tile].float()
        m = m_new
    out = acc / total.clamp(min=1.0) if final_guard else acc / total
    return out.to(q.dtype)


def tiled_no_rescale(q, k, v, mask=None, tile=64):
    return _online(q, k, v, mask, tile, rescale_sum=False)


def tiled_no_guard(q, k, v, mask=None, tile=64):
    return _online(q, k, v, mask, tile, guard=False)


def tiled_drops_last_tile(q, k, v, mask=None, tile=64):
    return _online(q, k, v, mask, tile, stop=lambda Lk, t: Lk - t + 1)  # only whole tiles


def tiled_pads_keys(q, k, v, mask=None, tile=64):
    """Pads k and v with zeros to a multiple of tile, and forgets to block the padding."""
    B, H, Lq, _ = q.shape
    Lk, extra = k.shape[2], -k.shape[2] % tile
    full = torch.ones(B, H, Lq, Lk, dtype=torch.bool, device=q.device) if mask is None else \
        torch.broadcast_to(mask, (B, H, Lq, Lk))
    k = torch.cat([k, k.new_zeros(B, H, extra, k.shape[-1])], dim=2)
    v = torch.cat([v, v.new_zeros(B, H, extra, v.shape[-1])], dim=2)
    full = torch.cat([full, torch.ones(B, H, Lq, extra, dtype=torch.bool, device=q.device)], dim=-1)
    return _online(q, k, v, full, tile)


def tiled_no_skip(q, k, v, mask=None, tile=64):
    return _online(q, k, v, mask, tile, skip=False)


def tiled_nan_rows(q, k, v, mask=None, tile=64):
    return _online(q, k, v, mask, tile, final_guard=False)


def tiled_full_scores(q, k, v, mask=None, tile=64):
    """Right values the chapter 2 way: the whole (B, H, Lq, Lk) score matrix at once."""
    return ok.attention(q, k, v, mask)[0]


def tiled_one_tile(q, k, v, mask=None, tile=64):
    """Right values, but every key in one tile: the whole score matrix again."""
    return ok.tiled_attention(q, k, v, mask, k.shape[2])
