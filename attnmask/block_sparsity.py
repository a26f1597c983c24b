"""Which tiles of a mask are empty, partial or full: the tile lists a block-sparse kernel walks.

A kernel that computes attention tile by tile (chapter 8's ``tiled_attention``, FlexAttention)
needs, for each tile of queries, the tiles of keys it must visit: the PARTIAL ones, where the
mask is applied cell by cell, and the FULL ones, where it is not needed at all. EMPTY tiles are
skipped. :func:`tile_lists` computes those lists from a dense mask, in the layout of
FlexAttention's ``BlockMask`` (``kv_num_blocks``, ``kv_indices``, ``full_kv_num_blocks``,
``full_kv_indices``), with one tile size for queries and keys.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def tile_counts(mask: torch.Tensor, tile: int) -> tuple[torch.Tensor, torch.Tensor]:
    """How many cells of each tile may attend, and how many cells each tile has.

    Args:
        mask: bool ``(B, H, Lq, Lk)``, True = may attend.
        tile: the tile size for queries and keys alike (>= 1).

    Returns:
        ``(allowed, cells)``: long ``(B, H, nq, nk)`` and long ``(nq, nk)``, with
        ``nq = ceil(Lq / tile)``, ``nk = ceil(Lk / tile)``. Cells past Lq or Lk are in no tile.
    """
    B, H, Lq, Lk = mask.shape
    nq, nk = -(-Lq // tile), -(-Lk // tile)
    # padding with False adds no allowed cell; the cell count below leaves the padding out
    padded = F.pad(mask, (0, nk * tile - Lk, 0, nq * tile - Lq), value=False)  # (B, H, nq*t, nk*t)
    allowed = padded.view(B, H, nq, tile, nk, tile).sum(dim=(3, 5))  # (B, H, nq, nk)
    rows = (torch.arange(nq, device=mask.device) * tile - Lq).neg().clamp(max=tile)  # (nq,)
    cols = (torch.arange(nk, device=mask.device) * tile - Lk).neg().clamp(max=tile)  # (nk,)
    return allowed, rows[:, None] * cols[None, :]  # (B, H, nq, nk), (nq, nk)


def listed(selected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A boolean table of tiles as (count, indices): for each row of ``selected`` (bool
    ``(..., nk)``), how many are True (int32 ``(...)``) and their column indices in increasing
    order, first (int32 ``(..., nk)``; the entries after the count are the other columns)."""
    order = torch.argsort((~selected).to(torch.uint8), dim=-1, stable=True)  # selected first, in order
    return selected.sum(dim=-1, dtype=torch.int32), order.to(torch.int32)


def tile_lists(mask: torch.Tensor, tile: int = 64
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The partial and full key tiles of every query tile of ``mask``, as FlexAttention's
    ``BlockMask`` holds them.

    Args:
        mask: bool ``(B, H, Lq, Lk)``, True = may attend.
        tile: the tile size for queries and keys alike (a positive int). Tile ``(i, j)`` covers
            queries ``[i*tile, min((i+1)*tile, Lq))`` and keys ``[j*tile, min((j+1)*tile, Lk))``.

    Returns:
        ``(kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices)`` on ``mask.device``:
        int32 ``(B, H, nq)``, int32 ``(B, H, nq, nk)``, and the same for full tiles, with
        ``nq = ceil(Lq / tile)`` and ``nk = ceil(Lk / tile)``. A tile is EMPTY when none of its
        cells may attend (in neither list), FULL when all may, PARTIAL otherwise. The first
        ``kv_num_blocks[b, h, i]`` entries of ``kv_indices[b, h, i]`` are the partial key tiles
        of query tile i in increasing order; the entries after them are unspecified.
    """
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.dim() != 4:
        got = f"{mask.dtype} {tuple(mask.shape)}" if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise TypeError(f"mask must be a torch.bool tensor (B, H, Lq, Lk), True = may attend; got {got}")
    if type(tile) is not int or tile < 1:
        raise ValueError(f"tile must be a positive int; got {tile!r}")
    allowed, cells = tile_counts(mask, tile)  # (B, H, nq, nk), (nq, nk)
    full = allowed == cells
    partial = (allowed > 0) & ~full
    return (*listed(partial), *listed(full))
