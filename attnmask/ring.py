"""Ring attention: one sequence split over W devices (context parallelism), chapter 11.

Each rank holds 2c of the L = 2·W·c positions: its queries, keys and values. The
key/value shards travel round the ring: at step s, rank r holds the keys of rank
(r - s) mod W. It attends them with a mask built from *global* positions (query
position >= key position), and merges the W partial results with their
log-sum-exps (:func:`attnmask.merge_partials`). The result is full causal
attention, whatever the order in which the parts arrive.

Two ways to shard the positions, both cutting them into 2W chunks of c:

* ``"contiguous"``: rank r holds chunks 2r and 2r + 1. Under a causal mask the
  last rank sees every earlier key and the first rank almost none: unbalanced.
* ``"zigzag"``: rank r holds chunks r and 2W - 1 - r, one early and one late.
  Every rank does the same work (ring-flash-attention's zigzag variant; Llama 3's context
  parallelism cuts the sequence the same way but all-gathers K and V instead of a ring).

:func:`ring_attention` simulates the W ranks in one process; ``scripts/ring_attention.py``
runs the same algorithm on W processes with ``torch.distributed``.
"""

from __future__ import annotations

from typing import Literal

import torch

from .masks import _check_size
from .partials import attention_lse, merge_partials

__all__ = ["ring_attention", "ring_step_mask", "ring_work", "shard_positions", "zigzag_ring_mask"]

Layout = Literal["zigzag", "contiguous"]


def _check_ring(L: int, world: int, rank: int, step: int | None = None) -> None:
    _check_size("L", L, 1)
    _check_size("world", world, 1)
    _check_size("rank", rank, 0)
    if L % (2 * world):
        raise ValueError(f"L = {L} must be divisible by 2·world = {2 * world} (2·world chunks of equal size)")
    if rank >= world:
        raise ValueError(f"rank must be in 0 .. world - 1 = {world - 1}; got {rank}")
    if step is not None:
        _check_size("step", step, 0)
        if step >= world:
            raise ValueError(f"step must be in 0 .. world - 1 = {world - 1}; got {step}")


def shard_positions(L: int, world: int, rank: int, layout: Layout = "zigzag", *,
                    device: torch.device | str | None = None) -> torch.Tensor:
    """long ``(2c,)``, c = L / (2·world): the global positions of rank ``rank``'s local tokens.

    ``"zigzag"``: chunks ``rank`` and ``2·world - 1 - rank``; ``"contiguous"``: chunks
    ``2·rank`` and ``2·rank + 1``. Raises ValueError unless 2·world divides L and
    0 <= rank < world.
    """
    _check_ring(L, world, rank)
    if layout not in ("zigzag", "contiguous"):
        raise ValueError(f"layout must be 'zigzag' or 'contiguous'; got {layout!r}")
    c = L // (2 * world)
    first, second = (rank, 2 * world - 1 - rank) if layout == "zigzag" else (2 * rank, 2 * rank + 1)
    t = torch.arange(c, device=device)
    return torch.cat([first * c + t, second * c + t])


def ring_step_mask(L: int, world: int, rank: int, step: int, layout: Layout = "zigzag", *,
                   device: torch.device | str | None = None) -> torch.Tensor:
    """bool ``(2c, 2c)``, True = may attend: rank ``rank``'s local queries against the keys it
    holds at ring step ``step`` (those of rank ``(rank - step) mod world``), causal by global
    position. Raises ValueError as :func:`shard_positions` does, and unless 0 <= step < world."""
    _check_ring(L, world, rank, step)
    q_pos = shard_positions(L, world, rank, layout, device=device)  # (2c,)
    k_pos = shard_positions(L, world, (rank - step) % world, layout, device=device)  # (2c,)
    return q_pos[:, None] >= k_pos[None, :]


def zigzag_ring_mask(L: int, world: int, rank: int, step: int, *,
                     device: torch.device | str | None = None) -> torch.Tensor:
    """The mask of ring step ``step`` on rank ``rank`` under zigzag sharding: bool ``(2c, 2c)``,
    c = L / (2·world), True where the global position of local query i is >= that of local
    key j of rank ``(rank - step) mod world``. Local index t < c is global position
    ``rank·c + t``; t >= c is ``(2·world - 1 - rank)·c + (t - c)``. ValueError unless 2·world
    divides L, world >= 1, 0 <= rank < world and 0 <= step < world."""
    return ring_step_mask(L, world, rank, step, "zigzag", device=device)


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, world: int, layout: Layout = "zigzag"
                   ) -> tuple[torch.Tensor, torch.Tensor, list[list[tuple[torch.Tensor, torch.Tensor]]]]:
    """Causal attention computed as W ranks would: shard, pass the key/value shards round, mask, merge.

    Args:
        q: ``(B, H, L, d)``; k: ``(B, H, L, d)``; v: ``(B, H, L, dv)``, with 2·world dividing L.
        world: the number of simulated ranks W.
        layout: ``"zigzag"`` or ``"contiguous"`` sharding (:func:`shard_positions`).

    Returns:
        ``(out, lse, steps)``. ``out (B, H, L, dv)`` in q's dtype and ``lse (B, H, L)`` float32
        (float64 for float64 inputs), in global order, equal to
        ``attention_lse(q, k, v, causal_mask(L))``. ``steps``: one list per rank r; at ring
        step s = 0 .. W - 1 rank r holds the shard of rank (r - s) mod W and, unless the
        step's mask is all False (then the step is skipped and appears nowhere), appends
        ``(out_s (B, H, 2c, dv), lse_s (B, H, 2c))``: its local queries (in local order)
        attended over that shard alone, causal by global position. Merging ``steps[r]`` in
        order gives rank r's rows of ``out`` and ``lse``. Raises ValueError unless
        2·world divides L and layout is one of the two.
    """
    L = q.shape[-2]
    _check_ring(L, world, 0)
    shards = [shard_positions(L, world, r, layout, device=q.device) for r in range(world)]  # (2c,) each
    held = list(range(world))  # held[r]: whose key/value shard rank r holds now
    acc: list = [None] * world  # rank r's running (out, lse)
    steps: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in range(world)]
    for _ in range(world):
        for r in range(world):
            src = shards[held[r]]
            mask = shards[r][:, None] >= src[None, :]  # (2c, 2c), by global position
            if not bool(mask.any()):
                continue
            part = attention_lse(q[..., shards[r], :], k[..., src, :], v[..., src, :], mask)
            steps[r].append(part)
            acc[r] = part if acc[r] is None else merge_partials(*acc[r], *part)
        held = held[-1:] + held[:-1]  # every rank passes its shard on to rank r + 1
    out = torch.empty(*q.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:-1], dtype=torch.promote_types(q.dtype, torch.float32), device=q.device)
    for r in range(world):  # the diagonal step always has allowed keys, so acc[r] exists
        out[..., shards[r], :], lse[..., shards[r]] = acc[r]
    return out, lse, steps


def ring_work(L: int, world: int, layout: Layout = "zigzag", tile: int | None = None) -> torch.Tensor:
    """long ``(world,)``: how many ``tile x tile`` blocks of scores each rank computes over
    its W ring steps, a block whose mask is all False being skipped (default tile: the chunk
    size c = L / (2·world))."""
    tile = L // (2 * world) if tile is None else tile
    work = torch.zeros(world, dtype=torch.long)
    for r in range(world):
        for s in range(world):
            m = ring_step_mask(L, world, r, s, layout)  # (2c, 2c)
            n = m.shape[0] // tile
            blocks = m[: n * tile, : n * tile].reshape(n, tile, n, tile).any(dim=(1, 3))
            work[r] += int(blocks.sum())
    return work
