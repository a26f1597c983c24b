"""Reasons for a wrong output read off where its NaN sit, by exercise: functions of the inputs and
the output alone, so the student template (which has no reference) names them as the course does."""

from __future__ import annotations

import torch

from ...mistakes import MISTAKES
from .merging import merge_nan_reason


def _tiled_nan(q, k, v, mask, tile, got) -> str | None:
    """Why ``got`` holds NaN where the reference has none, read off where the NaN sit.

    A key tile read although its mask is all False brings its NaN keys and values into every
    row (0 · NaN = NaN); a missing guard brings NaN only into the rows that some visited tile
    blocks entirely (exp(-inf - (-inf))), and a missing final guard only into the empty rows."""
    bad = torch.isnan(got).any(dim=-1)  # (B, H, Lq)
    if not bool(bad.any()):
        return None
    nan_inputs = any(bool(torch.isnan(t).any()) for t in (q, k, v))
    if mask is None:
        return MISTAKES["tile_not_skipped"] if nan_inputs else None
    full = torch.broadcast_to(mask, (*q.shape[:-1], k.shape[-2]))
    empty = ~full.any(dim=-1)  # (B, H, Lq): rows with no allowed key
    # rows with a visited tile in which all of their keys are blocked
    blocked_tile = torch.zeros_like(empty)
    for c in range(0, full.shape[-1], tile):
        part = full[..., c:c + tile]
        if bool(part.any()):
            blocked_tile |= ~part.any(dim=-1)
    if nan_inputs and bool((bad & ~(empty | blocked_tile)).any()):
        return MISTAKES["tile_not_skipped"]
    if not bool((bad & ~empty).any()):
        return MISTAKES["nan_rows"] + (" Here such a row ends with l = 0 and acc = 0 (divide by 1 there), "
                                       "and its running max stays -inf, which exp(s - m) must not subtract "
                                       "(see the guard).")
    return MISTAKES["tile_nan"] if not bool((bad & ~(empty | blocked_tile)).any()) else None


def tiled_parts(args, kwargs):
    q, k, v = args[:3]
    mask = args[3] if len(args) > 3 else kwargs.get("mask")
    tile = args[4] if len(args) > 4 else kwargs.get("tile", 64)
    return q, k, v, mask, tile


def tiled_nan_reason(args: tuple, kwargs: dict, got: torch.Tensor) -> str | None:
    """Exercise 8.1: why ``got`` holds NaN, from where the NaN sit (the inputs and the output
    alone, so the student template names it as the course does)."""
    return _tiled_nan(*tiled_parts(args, kwargs), got)


#: Reasons for a wrong output read off its NaN, by exercise (before the classic mistakes are
#: compared): functions of the inputs and the output alone, which the template can run.
NAN_REASONS = {"tiled_attention": tiled_nan_reason, "merge_partials": merge_nan_reason}
