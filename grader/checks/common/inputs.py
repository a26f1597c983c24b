"""Inputs of attention checks, first drawn for chapter 8 (:mod:`grader.checks.ch8_speed`) and shared by
chapters 11 and 12: random (q, k, v), (q, k, v) whose scores are exact in float32, and
masks that block the first tile, leave a row only the last one, or make whole tiles skippable.
Every draw comes from a :func:`grader.cases.generator`."""

from __future__ import annotations

import torch

from ... import cases
from ...cases import with_empty_row

F32 = torch.float32
#: (B, H, Lq, Lk, d, dv) of the memory checks: the score matrix has 16,384 entries, one
#: (B, H, Lq, 4) tile 512 and the gradients of q, k and v 1,280 together.
MEMORY = (1, 2, 64, 128, 2, 2)


def qkv(gen, B, H, Lq, Lk, d, dv, dtype=F32, scale=1.0):
    return (cases.randn(gen, B, H, Lq, d, dtype=dtype, scale=scale),
            cases.randn(gen, B, H, Lk, d, dtype=dtype, scale=scale),
            cases.randn(gen, B, H, Lk, dv, dtype=dtype))


def exact_qkv(gen, B, H, Lq, Lk, dv, kind) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q, k, v) with head width 4 whose scores are exact in float32 (:func:`grader.cases.exact_qk`)."""
    q, k = cases.exact_qk(gen, (B, H, Lq, cases.EXACT_D), (B, H, Lk, cases.EXACT_D), kind)
    return q, k, cases.randn(gen, B, H, Lk, dv)


def first_tile_blocked(gen, B, H, Lq, Lk, tile) -> torch.Tensor:
    """(B, H, Lq, Lk): query rows 1.. of every head blocked in the whole first tile (the
    last row sees the last key only), beside row 0, which sees every key, so that no tile
    is skipped whole and the running max of those rows starts at -inf."""
    mask = cases.random_mask(gen, B, H, Lq, Lk, p=0.7)
    mask[..., 0, :] = True  # a row that needs the first tile
    mask[..., 1:, :tile] = False
    mask[..., -1, : Lk - 1] = False  # the last key only: in the last, partial tile
    mask[..., -1, -1] = True
    return mask


def last_only(gen, B, H, Lq, Lk, tile) -> torch.Tensor:
    """(B, H, Lq, Lk) with query row 0 of every head allowed only keys of the last, partial tile."""
    mask = cases.random_mask(gen, B, H, Lq, Lk)
    mask[..., 0, : Lk - Lk % tile] = False
    mask[..., 0, -1] = True
    return mask


def skippable(gen, B, H, Lq, Lk, tile):
    """Inputs whose first and last key tiles are blocked for every query and hold NaN
    keys and values; the tiles between keep a fully masked row beside ordinary ones."""
    q, k, v = qkv(gen, B, H, Lq, Lk, 4, 3)
    mask = with_empty_row(cases.random_mask(gen, B, 1, Lq, Lk, p=0.7), gen)
    for c in (0, Lk - Lk % tile if Lk % tile else Lk - tile):
        mask[..., c:c + tile] = False
        k[..., c:c + tile, :] = float("nan")
        v[..., c:c + tile, :] = float("nan")
    return q, k, v, mask

