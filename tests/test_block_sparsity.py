"""attnmask.tile_lists (exercise 7.4): the tile lists of a dense mask agree with FlexAttention's own
BlockMask, tile by tile; boundary, empty and full tiles; and the shortcuts lose more than half."""

from __future__ import annotations

import pytest
import torch
from buggy import block_sparsity, correct, grade
from torch.nn.attention.flex_attention import create_block_mask

import attnmask as am
from grader.checks import EXERCISES
from grader.results import CheckResult, score_of


def listed(count: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """bool (B, H, nq, nk): the tiles the first ``count`` entries of each row name."""
    taken = torch.arange(indices.shape[-1]) < count[..., None]
    return torch.zeros(indices.shape, dtype=torch.long).scatter_add(-1, indices.long(), taken.long()) > 0


def dense(mask_mod, B: int, H: int, L: int) -> torch.Tensor:
    b, h = torch.arange(B)[:, None, None, None], torch.arange(H)[None, :, None, None]
    q, k = torch.arange(L)[:, None], torch.arange(L)[None, :]
    return torch.broadcast_to(mask_mod(b, h, q, k), (B, H, L, L))


DOCS = torch.tensor([[0] * 40 + [1] * 24 + [2] * 64, [5] * 100 + [6] * 28])  # (2, 128)
MASK_MODS = {
    "causal": lambda b, h, q, k: k <= q,
    "a window per head": lambda b, h, q, k: (k <= q) & (q - k < 8 + 20 * h),
    "documents per sequence": lambda b, h, q, k: (DOCS[b, q] == DOCS[b, k]) & (k <= q),
    "prefix-LM": lambda b, h, q, k: (k <= q) | (k < 40),
}


@pytest.mark.parametrize("block", [16, 32])
@pytest.mark.parametrize("kind", sorted(MASK_MODS))
def test_the_lists_are_flexattentions_blockmask(kind, block):
    """create_block_mask is the oracle: where L is a multiple of its block size, its kv_num_blocks,
    kv_indices and full_* name the same tiles, in the same increasing order."""
    B, H, L = 2, 3, 128
    fn = MASK_MODS[kind]
    theirs = create_block_mask(fn, B, H, L, L, device="cpu", BLOCK_SIZE=block)
    mine = am.tile_lists(dense(fn, B, H, L), block)
    expected = (theirs.kv_num_blocks, theirs.kv_indices, theirs.full_kv_num_blocks, theirs.full_kv_indices)
    for i in (0, 2):
        assert mine[i].dtype == mine[i + 1].dtype == torch.int32
        assert torch.equal(mine[i], expected[i].expand_as(mine[i]))
        first = torch.arange(mine[i + 1].shape[-1]) < mine[i][..., None]  # the entries that are read
        theirs = torch.where(first, expected[i + 1], -1).expand_as(first)
        assert torch.equal(torch.where(first, mine[i + 1], -1), theirs)


def _classes(mask, tile):
    n, idx, fn, fidx = am.tile_lists(mask, tile)
    return listed(n, idx).long() + 2 * listed(fn, fidx).long()


def test_boundary_tiles_hold_only_the_cells_inside_the_mask():
    every = torch.ones(2, 3, 6, 10, dtype=torch.bool)
    assert torch.equal(_classes(every, 4), torch.full((2, 3, 2, 3), 2))  # all full, the small ones too
    assert torch.equal(_classes(~every, 4), torch.zeros(2, 3, 2, 3, dtype=torch.long))  # nothing listed
    one = torch.zeros(1, 1, 6, 10, dtype=torch.bool)
    one[0, 0, 5, 9] = True  # the last cell: the corner tile (rows 4..5, keys 8..9) is partial
    assert _classes(one, 4)[0, 0].tolist() == [[0, 0, 0], [0, 0, 1]]
    one[0, 0, 4:, 8:] = True
    assert _classes(one, 4)[0, 0].tolist() == [[0, 0, 0], [0, 0, 2]]


def test_tile_one_and_tile_past_the_mask():
    mask = dense(MASK_MODS["a window per head"], 1, 2, 9)
    assert torch.equal(_classes(mask, 1), 2 * mask.long())  # each cell its own tile: no partial tile
    for tile in (9, 64):
        n, idx, fn, fidx = am.tile_lists(mask, tile)
        assert n.shape == (1, 2, 1) and idx.shape == (1, 2, 1, 1)
        assert n.flatten().tolist() == [1, 1] and fn.flatten().tolist() == [0, 0]


def test_on_the_masks_device_and_vectorised():
    outs = am.tile_lists(torch.ones(2, 1, 7, 5, dtype=torch.bool, device="meta"), 3)
    assert [(t.device.type, t.dtype, tuple(t.shape)) for t in outs] == [
        ("meta", torch.int32, (2, 1, 3)), ("meta", torch.int32, (2, 1, 3, 2))] * 2


def test_bad_input_says_what_was_expected():
    with pytest.raises(TypeError, match="torch.bool tensor"):
        am.tile_lists(torch.ones(1, 1, 4, 4), 2)
    with pytest.raises(ValueError, match="positive int"):
        am.tile_lists(torch.ones(1, 1, 4, 4, dtype=torch.bool), 0)


def _points(fn, seed: int) -> float:
    checks = EXERCISES["tile_lists"].make_checks(seed, hidden=True)
    verdicts = grade(fn, checks)
    return score_of([CheckResult(c.name, c.public, c.weight, verdicts[c.name].passed, kind=c.kind)
                     for c in checks if c.name in verdicts])


@pytest.mark.parametrize("seed", [0, 7])
def test_correct_lists_get_full_marks(seed):
    assert _points(correct.tile_lists, seed) == 1.0


@pytest.mark.parametrize("seed", [0, 7])
@pytest.mark.parametrize("shortcut", sorted(block_sparsity.SHORTCUTS))
def test_each_shortcut_loses_more_than_half(shortcut, seed):
    assert _points(block_sparsity.SHORTCUTS[shortcut], seed) < 0.5


@pytest.mark.parametrize("style", sorted(block_sparsity.TRIVIAL))
def test_lists_that_compute_nothing_score_zero(style):
    assert _points(block_sparsity.TRIVIAL[style], 3) == 0.0
