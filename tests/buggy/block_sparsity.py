"""Mistakes and shortcuts of chapter 7's ``tile_lists``, each otherwise correct: full tiles
listed as partial, empty tiles listed, the cells past Lq or Lk counted, indices in the wrong
order or dtype, one head's mask for all, and lists that are not computed at all."""

from __future__ import annotations

import torch

from . import correct as ok


def _counts(mask, tile, pad):
    """Allowed cells per tile with the cells past Lq, Lk padded by ``pad``, and the tile's area."""
    B, H, Lq, Lk = mask.shape
    nq, nk = -(-Lq // tile), -(-Lk // tile)
    grid = torch.full((B, H, nq * tile, nk * tile), pad, dtype=torch.int32, device=mask.device)
    grid[:, :, :Lq, :Lk] = mask.int()
    return grid.view(B, H, nq, tile, nk, tile).sum(dim=(3, 5)), tile * tile


def _lists(partial, full):
    nk = partial.shape[-1]
    out = []
    for chosen in (partial, full):
        key = torch.where(chosen, torch.arange(nk, device=chosen.device), nk)
        out += [chosen.sum(-1).int(), key.sort(dim=-1).values.clamp(max=nk - 1).int()]
    return tuple(out)


def tiles_full_as_partial(mask, tile=64):
    n, idx, fn, fidx = ok.tile_lists(mask, tile)
    any_ = _lists(mask_any(mask, tile), mask_any(mask, tile))[:2]
    return (*any_, fn, fidx)


def mask_any(mask, tile):
    allowed, _ = _counts(mask, tile, 0)
    return allowed > 0


def tiles_empty_listed(mask, tile=64):
    n, idx, fn, fidx = ok.tile_lists(mask, tile)
    full = torch.zeros(idx.shape, dtype=torch.bool, device=mask.device)
    full.scatter_(-1, fidx.long(), torch.arange(idx.shape[-1], device=mask.device) < fn[..., None])
    return (*_lists(~full, full)[:2], fn, fidx)


def tiles_boundary_cells(mask, tile=64):
    allowed, area = _counts(mask, tile, 0)  # the cells past L count as blocked
    return _lists((allowed > 0) & (allowed < area), allowed == area)


def tiles_descending(mask, tile=64):
    n, idx, fn, fidx = ok.tile_lists(mask, tile)
    nk = idx.shape[-1]
    ar = torch.arange(nk, device=mask.device)

    def flip(count, i):  # the first count entries, reversed
        back = i.gather(-1, (count[..., None] - 1 - ar).clamp(min=0).expand(i.shape).contiguous())
        return torch.where(ar < count[..., None], back, i)

    return n, flip(n, idx).int(), fn, flip(fn, fidx).int()


def tiles_int64(mask, tile=64):
    return tuple(t.long() for t in ok.tile_lists(mask, tile))


def tiles_first_head(mask, tile=64):
    B, H = mask.shape[:2]
    return ok.tile_lists(mask[:, :1].expand(B, H, -1, -1), tile)


def tiles_counts_only(mask, tile=64):
    """Right counts, indices 0, 1, 2, ... as if the listed tiles were always the first ones."""
    n, idx, fn, fidx = ok.tile_lists(mask, tile)
    ar = torch.arange(idx.shape[-1], dtype=torch.int32, device=mask.device).expand(idx.shape).contiguous()
    return n, ar, fn, ar.clone()


def tiles_nothing(mask, tile=64):
    B, H, Lq, Lk = mask.shape
    nq, nk = -(-Lq // tile), -(-Lk // tile)
    count, indices = torch.zeros(B, H, nq, dtype=torch.int32), torch.zeros(B, H, nq, nk, dtype=torch.int32)
    return count, indices, count.clone(), indices.clone()


def tiles_all_partial(mask, tile=64):
    B, H, Lq, Lk = mask.shape
    nq, nk = -(-Lq // tile), -(-Lk // tile)
    ar = torch.arange(nk, dtype=torch.int32).expand(B, H, nq, nk).contiguous()
    every = torch.full((B, H, nq), nk, dtype=torch.int32)
    return every, ar, torch.zeros(B, H, nq, dtype=torch.int32), ar.clone()


#: The shortcuts that must lose more than half of 7.4's points, by name.
SHORTCUTS = {"full as partial": tiles_full_as_partial, "empty listed": tiles_empty_listed,
             "boundary cells": tiles_boundary_cells, "descending": tiles_descending,
             "first head": tiles_first_head, "counts only": tiles_counts_only}
#: Code that does nothing: it must score 0.
TRIVIAL = {"nothing": tiles_nothing, "all partial": tiles_all_partial}
