"""attnmask.kernels: the course's Triton kernels against attnmask's dense attention, in Triton's
CPU interpreter. Skipped where triton is not installed (the ``[kernels]`` extra)."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: CPU tensors, no GPU
pytest.importorskip("triton")

import attnmask as am  # noqa: E402
from attnmask.kernels import block_sparse_backward, block_sparse_forward, tile_lists_of  # noqa: E402

TILE = 16


def _case(seed, B=1, H=2, Lq=40, Lk=56, d=8, dv=4, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Lq, d, generator=g)
    k = torch.randn(B, H, Lk, d, generator=g)
    v = torch.randn(B, H, Lk, dv, generator=g)
    mask = torch.rand(B, H, Lq, Lk, generator=g) < 0.6
    mask[..., 16:32] = False  # an empty key tile for every query tile
    mask[..., 32:48] = True  # a full one
    mask[0, 0, 5] = False  # a fully masked row
    return q.to(dtype), k.to(dtype), v.to(dtype), mask


def _poisoned(k, v, mask):
    """k and v with NaN in every key that only empty tiles hold (never to be read)."""
    lists = tile_lists_of(mask, TILE)
    read = torch.zeros(mask.shape[:2] + (k.shape[2],), dtype=torch.bool)
    for num, idx in ((lists[0], lists[1]), (lists[2], lists[3])):
        for b, h, i in torch.cartesian_prod(*(torch.arange(n) for n in num.shape)).tolist():
            for j in idx[b, h, i, :num[b, h, i]].tolist():
                read[b, h, j * TILE:(j + 1) * TILE] = True
    nan = float("nan")
    return k.masked_fill(~read[..., None], nan), v.masked_fill(~read[..., None], nan), lists


def test_tile_lists_classify_tiles():
    mask = torch.zeros(1, 1, 20, 40, dtype=torch.bool)
    mask[..., :16, :16] = True  # full
    mask[..., 16:, 0] = True  # partial (query tile 1 holds 4 rows only)
    mask[..., :, 32:] = True  # full in both query tiles: keys 32..39 are the last tile's only cells
    num, idx, fnum, fidx = tile_lists_of(mask, 16)
    assert num.tolist() == [[[0, 1]]] and idx[0, 0, 1, 0].item() == 0
    assert fnum.tolist() == [[[2, 1]]]
    assert fidx[0, 0, 0, :2].tolist() == [0, 2] and fidx[0, 0, 1, 0].item() == 2


@pytest.mark.parametrize("seed", [0, 1])
def test_forward_matches_attention_and_skips_empty_tiles(seed):
    q, k, v, mask = _case(seed)
    kn, vn, lists = _poisoned(k, v, mask)
    out, lse = block_sparse_forward(q, kn, vn, mask, *lists, tile=TILE)
    ref, ref_lse = am.attention_lse(q, k, v, mask)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-5)
    assert out[0, 0, 5].abs().sum() == 0 and lse[0, 0, 5] == float("-inf")


def test_forward_float16_and_lq_equal_one_tile():
    q, k, v, mask = _case(2, Lq=9, Lk=33, dtype=torch.float16)
    out, lse = block_sparse_forward(q, k, v, mask, *tile_lists_of(mask, TILE), tile=TILE)
    ref, ref_lse = am.attention_lse(q.float(), k.float(), v.float(), mask)
    assert out.dtype == torch.float16 and lse.dtype == torch.float32
    torch.testing.assert_close(out.float(), ref, atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(lse, ref_lse, atol=2e-3, rtol=2e-3)


def test_backward_matches_autograd_from_saved_lse():
    q, k, v, mask = _case(3)
    kn, vn, lists = _poisoned(k, v, mask)
    out, lse = block_sparse_forward(q, kn, vn, mask, *lists, tile=TILE)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    ref, _ = am.attention_lse(*leaves, mask)
    d_out = torch.randn_like(ref)
    ref.backward(d_out)
    got = block_sparse_backward(q, kn, vn, out, lse, d_out, mask, *lists, tile=TILE)
    for g, leaf in zip(got, leaves):
        torch.testing.assert_close(g, leaf.grad, atol=1e-5, rtol=1e-5)


def test_launcher_rejects_a_tile_that_is_not_a_power_of_two():
    q, k, v, mask = _case(0)
    with pytest.raises(ValueError, match="power of two"):
        block_sparse_forward(q, k, v, mask, *tile_lists_of(mask, 12), tile=12)
