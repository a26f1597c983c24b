"""Chapter 13, masks inside a kernel: launchers of the course's Triton kernels.

:func:`block_sparse_forward` and :func:`block_sparse_backward` run the kernels of
:mod:`attnmask.triton_kernels` over a block-sparse mask's tile lists (the contract of
exercise 7.4, FlexAttention's BlockMask with one tile size for queries and keys). Triton
is the optional ``[kernels]`` extra: it is imported when a launcher first runs, and
:func:`triton_available` says whether it can be. Without a GPU, set
``TRITON_INTERPRET=1`` before triton is imported: the kernels then run on CPU tensors.
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys

import torch

__all__ = ["block_sparse_backward", "block_sparse_forward", "tile_lists_of", "triton_available"]

#: What to install when triton is missing (one line, shown as it is).
INSTALL = "install the kernels extra: pip install -r requirements-kernels.txt (triton)"


def triton_available() -> bool:
    """Whether ``import triton`` would find the package (without importing it)."""
    return importlib.util.find_spec("triton") is not None


def _kernels():
    if not triton_available():
        raise ModuleNotFoundError(f"triton is not installed; {INSTALL}")
    if "triton" not in sys.modules and not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # no GPU: run the kernels in the interpreter
    from . import triton_kernels

    return triton_kernels


Lists = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def tile_lists_of(mask: torch.Tensor, tile: int) -> Lists:
    """The tile lists of a bool ``mask (B, H, Lq, Lk)`` (True = may attend) with square tiles.

    Returns ``(kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices)``: int32
    counts ``(B, H, nq)`` and lists ``(B, H, nq, nk)`` of the PARTIAL and of the FULL key
    tiles of each query tile, in increasing order (exercise 7.4's contract; cells past
    Lq or Lk belong to no tile).
    """
    B, H, Lq, Lk = mask.shape
    nq, nk = -(-Lq // tile), -(-Lk // tile)
    padded = mask.new_zeros(B, H, nq * tile, nk * tile)
    inside = torch.zeros_like(padded)
    padded[..., :Lq, :Lk] = mask
    inside[..., :Lq, :Lk] = True
    tiles = lambda t: t.reshape(B, H, nq, tile, nk, tile).sum(dim=(3, 5))  # noqa: E731 -- (B, H, nq, nk)
    allowed, cells = tiles(padded), tiles(inside)
    full = allowed == cells
    partial = (allowed > 0) & ~full
    order = torch.arange(nk, device=mask.device)

    def listed(which: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # Listed tiles first, in increasing order: sort by (not listed, index).
        key = (~which).to(torch.int64) * nk + order
        return which.sum(-1).to(torch.int32), key.argsort(dim=-1).to(torch.int32)

    return (*listed(partial), *listed(full))


def _sizes(q, k, v, mask, tile) -> tuple[int, ...]:
    """(B, H, Lq, Lk, d, dv), after checking the shapes, the mask and the tile."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v have shapes {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}; "
                         "expected (B, H, Lq, d), (B, H, Lk, d), (B, H, Lk, dv)")
    B, H, Lq, d = q.shape
    Lk, dv = k.shape[2], v.shape[3]
    if mask.shape != (B, H, Lq, Lk) or mask.dtype != torch.bool:
        raise ValueError(f"mask is {mask.dtype} {tuple(mask.shape)}; expected torch.bool (B, H, Lq, Lk) = "
                         f"{(B, H, Lq, Lk)}, True = may attend")
    if isinstance(tile, bool) or not isinstance(tile, int) or tile < 1 or tile & (tile - 1):
        raise ValueError(f"tile must be a power of two (Triton's block sizes are); got {tile!r}")
    return B, H, Lq, Lk, d, dv


def _contiguous(*lists: torch.Tensor) -> list[torch.Tensor]:
    """The tile lists, each contiguous (the kernels index them as flat arrays)."""
    return [t.contiguous() for t in lists]


def _block(n: int) -> int:
    """A power of two >= n and >= 16 (tl.arange needs a power of two, tl.dot on a GPU 16 or more)."""
    return max(16, 1 << max(0, n - 1).bit_length())


def block_sparse_forward(q, k, v, mask, kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices,
                         tile=16):
    """Attention over a block-sparse mask, computed by :func:`attnmask.triton_kernels.forward_kernel`.

    Args:
        q: ``(B, H, Lq, d)``; k: ``(B, H, Lk, d)``; v: ``(B, H, Lk, dv)``, one dtype.
        mask: bool ``(B, H, Lq, Lk)``, True = may attend; read only inside PARTIAL tiles.
        kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices: the tile lists
            (int32 ``(B, H, nq)`` and ``(B, H, nq, nk)``), as :func:`tile_lists_of` gives.
        tile: the tile size of the lists, a power of two.

    Returns:
        ``(out, lse)``: ``out (B, H, Lq, dv)`` in q's dtype, 0 on a row with no allowed key;
        ``lse (B, H, Lq)`` float32, the natural log of the row's sum of ``exp(q·k / sqrt(d))``,
        ``-inf`` on a row with no allowed key.
    """
    B, H, Lq, Lk, d, dv = _sizes(q, k, v, mask, tile)
    kern = _kernels()
    nq, nk = -(-Lq // tile), -(-Lk // tile)
    out = q.new_empty(B, H, Lq, dv)
    lse = q.new_empty(B, H, Lq, dtype=torch.float32)
    lists = _contiguous(kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices)
    kern.forward_kernel[(nq, B * H)](
        q.contiguous(), k.contiguous(), v.contiguous(), mask.contiguous(), *lists, out, lse,
        Lq, Lk, d, dv, nq, nk, 1.0 / math.sqrt(d), TILE=tile, BD=_block(d), BDV=_block(dv))
    return out, lse


def block_sparse_backward(q, k, v, out, lse, d_out, mask, kv_num_blocks, kv_indices, full_kv_num_blocks,
                          full_kv_indices, tile=16):
    """The gradients of :func:`block_sparse_forward`, by :func:`attnmask.triton_kernels.backward_kernel`.

    Args:
        q, k, v, mask, the tile lists and tile: as for the forward.
        out: ``(B, H, Lq, dv)`` and lse: float32 ``(B, H, Lq)``, what the forward returned.
        d_out: ``(B, H, Lq, dv)``, the gradient of the loss with respect to out.

    Returns:
        ``(dq, dk, dv)`` shaped and typed like ``q``, ``k``, ``v``; 0 for rows and keys no
        allowed cell reaches.
    """
    B, H, Lq, Lk, d, dv = _sizes(q, k, v, mask, tile)
    kern = _kernels()
    nq, nk = -(-Lq // tile), -(-Lk // tile)
    dq = q.new_empty(B, H, Lq, d)
    # Every query tile adds to the key rows it reads: float32 buffers, summed atomically.
    dk = q.new_zeros(B, H, Lk, d, dtype=torch.float32)
    dvv = q.new_zeros(B, H, Lk, dv, dtype=torch.float32)
    lists = _contiguous(kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices)
    kern.backward_kernel[(nq, B * H)](
        q.contiguous(), k.contiguous(), v.contiguous(), out.contiguous(), lse.contiguous(),
        d_out.contiguous(), mask.contiguous(), *lists, dq, dk, dvv, Lq, Lk, d, dv, nq, nk, 1.0 / math.sqrt(d),
        TILE=tile, BD=_block(d), BDV=_block(dv))
    return dq, dk.to(dtype=k.dtype), dvv.to(dtype=v.dtype)
