"""Predicates against FlexAttention, an implementation nobody here wrote.

The same predicate goes to ``materialize`` (ours) and to FlexAttention's own
``create_mask`` / ``create_block_mask``; the dense masks must agree, and
``flex_attention`` with the block mask must agree with our attention with the
dense mask.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.nn.attention.flex_attention import create_mask, flex_attention

import attnmask as am
import attnmask.predicates as P

B, H, LQ, LK = 3, 2, 37, 45  # all different, and not multiples of the block size


def _predicates():
    lengths = torch.tensor([0, 20, LK])  # an empty sequence gives fully masked rows
    doc_ids = torch.tensor([
        [0] * 10 + [1] * 20 + [2] * 15,
        [5, 3] * 22 + [5],  # interleaved ids: not sorted, not contiguous
        list(range(LK)),  # every token its own document
    ])
    return {
        "causal": P.causal(),
        "causal_bottom_right": P.causal(LK - LQ),
        "causal_negative_offset": P.causal(-5),  # first rows fully masked
        "sliding_window": P.sliding_window(4),
        "prefix_lm": P.prefix_lm(6),
        "key_padding": P.key_padding(lengths),
        "document": P.document(doc_ids),
        "causal_and_padding": P.and_masks(P.causal(LK - LQ), P.key_padding(lengths)),
        "window_or_prefix": P.or_masks(P.sliding_window(3), P.prefix_lm(2)),
    }


PREDICATES = _predicates()


@pytest.mark.parametrize("name", PREDICATES)
def test_materialize_equals_flex_create_mask(name):
    fn = PREDICATES[name]
    ours = am.materialize(fn, LQ, LK, B=B, H=H)
    theirs = create_mask(fn, B, H, LQ, LK, device="cpu")  # (B, H, Lq, Lk)
    assert ours.dtype == torch.bool
    assert torch.equal(torch.broadcast_to(ours, theirs.shape), theirs), name


@pytest.mark.parametrize("name", ["causal", "sliding_window", "prefix_lm"])
def test_materialize_keeps_batch_free_masks_two_dimensional(name):
    # A predicate that ignores b and h needs no (B, H) dimensions: (Lq, Lk) is enough.
    assert am.materialize(PREDICATES[name], LQ, LK, B=B, H=H).shape == (LQ, LK)


def test_materialize_shapes_follow_what_the_predicate_reads():
    assert am.materialize(PREDICATES["key_padding"], LQ, LK, B=B, H=H).shape == (B, 1, 1, LK)
    assert am.materialize(PREDICATES["document"], LQ, LK, B=B, H=H).shape == (B, 1, LQ, LK)
    per_head = am.materialize(lambda b, h, q, kv: (kv + h) % 2 == 0, LQ, LK, B=B, H=H)
    assert torch.broadcast_shapes(per_head.shape, (B, H, LQ, LK)) == (B, H, LQ, LK)
    assert not torch.equal(per_head[..., 0, :, :], per_head[..., 1, :, :])


def test_materialize_of_a_constant_predicate_fills_the_matrix():
    m = am.materialize(lambda b, h, q, kv: torch.tensor(True), 3, 4)
    assert m.shape == (3, 4) and m.all()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", ["causal_bottom_right", "causal_negative_offset", "document",
                                  "causal_and_padding", "window_or_prefix"])
def test_flex_attention_with_block_mask_equals_dense_attention(name, dtype, tol):
    fn = PREDICATES[name]
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, LQ, 8, generator=g, dtype=dtype)
    k = torch.randn(B, H, LK, 8, generator=g, dtype=dtype)
    v = torch.randn(B, H, LK, 8, generator=g, dtype=dtype)
    bm = am.block_mask(fn, LQ, LK, B=B, H=None, block_size=16)
    with warnings.catch_warnings():
        # Eager flex_attention on CPU warns that it is unfused; that is what we want here.
        warnings.simplefilter("ignore", UserWarning)
        theirs = flex_attention(q, k, v, block_mask=bm)
    ours, _ = am.attention(q, k, v, am.materialize(fn, LQ, LK, B=B))
    assert not ours.isnan().any()
    torch.testing.assert_close(ours, theirs, **tol(dtype))


def test_block_mask_records_empty_blocks():
    # A causal mask over 4 x 4 blocks has 6 empty tiles above the diagonal: the
    # kernel skips them, which is the point of the BlockMask.
    bm = am.block_mask(P.causal(), 64, 64, block_size=16)
    dense = bm.to_dense()  # (1, 1, 4, 4): 1 where a tile has at least one visible score
    assert dense.shape[-2:] == (4, 4)
    assert torch.equal(dense[0, 0].bool(), torch.ones(4, 4, dtype=torch.bool).tril())


@pytest.mark.parametrize("combine, op", [(P.and_masks, torch.logical_and), (P.or_masks, torch.logical_or)])
def test_and_or_combine_elementwise(combine, op):
    a, b, c = PREDICATES["sliding_window"], PREDICATES["key_padding"], PREDICATES["prefix_lm"]
    full = (B, H, LQ, LK)
    dense = [torch.broadcast_to(am.materialize(f, LQ, LK, B=B, H=H), full) for f in (a, b, c)]
    got = torch.broadcast_to(am.materialize(combine(a, b, c), LQ, LK, B=B, H=H), full)
    assert torch.equal(got, op(op(dense[0], dense[1]), dense[2]))
    assert torch.equal(am.materialize(combine(a), LQ, LK), am.materialize(a, LQ, LK))


@pytest.mark.parametrize("combine", [P.and_masks, P.or_masks])
def test_combining_nothing_is_an_error(combine):
    with pytest.raises(ValueError, match="at least one"):
        combine()


def test_sliding_window_rejects_an_empty_window():
    with pytest.raises(ValueError, match="window must be >= 1"):
        P.sliding_window(0)


def test_materialize_rejects_a_non_boolean_predicate():
    with pytest.raises(TypeError, match="torch.bool"):
        am.materialize(lambda b, h, q, kv: kv - q, 3, 3)


def test_materialize_on_meta_reads_no_values():
    lengths = torch.tensor([1, 3], device="meta")
    doc_ids = torch.zeros(2, 5, dtype=torch.long, device="meta")
    for fn in (P.causal(), P.key_padding(lengths), P.document(doc_ids)):
        m = am.materialize(fn, 5, 5, B=2, device="meta")
        assert m.device.type == "meta" and m.dtype == torch.bool


def test_materialize_on_device(device):
    lengths = torch.tensor([2, 4], device=device)
    m = am.materialize(P.and_masks(P.causal(), P.key_padding(lengths)), 4, 4, B=2, device=device)
    assert m.device.type == device
    assert torch.equal(m.cpu(), create_mask(P.and_masks(P.causal(), P.key_padding(lengths.cpu())),
                                            2, 1, 4, 4, device="cpu"))
