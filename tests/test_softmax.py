"""masked_softmax against PyTorch's SDPA, which computes the same weights.

With ``k = I`` and ``scale = 1`` the SDPA scores are the given ``scores``; with
``v = I`` its output is the weight matrix itself. So
``sdpa(scores, I, I, mask, scale=1)`` is a masked softmax nobody here wrote,
fully masked rows (zeros) included.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attnmask as am

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def reference_weights(sdpa64, scores, mask):
    eye = torch.eye(scores.shape[-1], dtype=torch.float64).expand(*scores.shape[:-2], -1, -1)
    return sdpa64(scores, eye, eye, attn_mask=mask, scale=1.0)


def random_mask(g, shape, p_true=0.6):
    mask = torch.rand(shape, generator=g) < p_true
    mask[..., 1, :] = False  # a fully masked row in every matrix
    return mask


@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_sdpa_weights(dtype, device, sdpa64, tol):
    g = torch.Generator().manual_seed(0)
    scores = (3 * torch.randn(2, 3, 5, 7, generator=g)).to(dtype).to(device)
    mask = random_mask(g, (2, 1, 5, 7)).to(device)
    got = am.masked_softmax(scores, mask)
    assert got.shape == scores.shape and got.dtype == dtype and got.device == scores.device
    torch.testing.assert_close(got.double(), reference_weights(sdpa64, scores, mask), **tol(dtype))


@settings(max_examples=40, deadline=None)
@given(shape=st.tuples(st.integers(1, 3), st.integers(1, 6), st.integers(1, 6)), seed=st.integers(0, 2**16),
       p=st.floats(0.0, 1.0))
def test_rows_are_distributions_or_zeros(shape, seed, p):
    g = torch.Generator().manual_seed(seed)
    scores = 5 * torch.randn(shape, generator=g, dtype=torch.float64)
    mask = torch.rand(shape, generator=g) < p
    w = am.masked_softmax(scores, mask)
    assert not w.isnan().any()
    assert (w[~mask] == 0).all(), "a masked key must get weight exactly 0"
    sums = w.sum(-1)
    has_key = mask.any(-1)
    torch.testing.assert_close(sums[has_key], torch.ones_like(sums[has_key]))
    assert (sums[~has_key] == 0).all(), "a row with no allowed key must be all zeros"


def test_without_mask_is_softmax():
    scores = torch.randn(3, 4, 5, dtype=torch.float64)
    torch.testing.assert_close(am.masked_softmax(scores), torch.softmax(scores, -1))
    torch.testing.assert_close(am.masked_softmax(scores, None), torch.softmax(scores, -1))


def test_mask_goes_in_before_normalising():
    # Masking after the softmax would leave the row summing to less than 1.
    w = am.masked_softmax(torch.zeros(1, 4), torch.tensor([[True, True, False, False]]))
    assert w.tolist() == [[0.5, 0.5, 0.0, 0.0]]


@pytest.mark.parametrize("dtype", DTYPES)
def test_large_scores_stay_finite(dtype):
    big = torch.finfo(dtype).max / 4
    scores = torch.tensor([[big, -big, 0.0], [big, big, big]], dtype=dtype)
    mask = torch.tensor([[True, True, False], [False, True, True]])
    w = am.masked_softmax(scores, mask)
    assert torch.isfinite(w).all()
    torch.testing.assert_close(w.float(), torch.tensor([[1.0, 0, 0], [0, 0.5, 0.5]]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_fully_masked_rows_have_finite_gradients(dtype, device):
    scores = torch.randn(2, 4, 5, dtype=dtype, device=device, requires_grad=True)
    mask = torch.rand(2, 4, 5, device=device) < 0.5
    mask[0, 2] = False
    w = am.masked_softmax(scores, mask)
    assert (w[0, 2] == 0).all() and not w.isnan().any()
    (w * torch.randn_like(w)).sum().backward()
    assert torch.isfinite(scores.grad).all()
    assert (scores.grad[~mask] == 0).all(), "masked scores must not receive gradient"


def test_gradcheck_float64():
    scores = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[True, False, True, True], [False] * 4, [True] * 4])
    assert torch.autograd.gradcheck(lambda s: am.masked_softmax(s, mask), (scores,))


def test_inputs_are_not_modified():
    scores = torch.randn(2, 3, 4, requires_grad=True)
    scores.grad = torch.full_like(scores, 7.0)
    mask = torch.rand(2, 3, 4) < 0.5
    before = (scores.detach().clone(), scores.grad.clone(), mask.clone())
    am.masked_softmax(scores, mask)
    assert torch.equal(scores, before[0]) and torch.equal(scores.grad, before[1])
    assert torch.equal(mask, before[2]) and scores.requires_grad
    plain = torch.randn(2, 3)
    am.masked_softmax(plain, torch.ones(2, 3, dtype=torch.bool))
    assert not plain.requires_grad and plain.grad is None


def test_meta_device():
    mask = torch.ones(3, 4, dtype=torch.bool, device="meta")
    w = am.masked_softmax(torch.empty(2, 3, 4, device="meta"), mask)
    assert w.device.type == "meta" and w.shape == (2, 3, 4)


@pytest.mark.parametrize("call, exc, words", [
    (lambda: am.masked_softmax(torch.arange(4), None), TypeError, ["floating", "int64"]),
    (lambda: am.masked_softmax(torch.randn(3, 4), torch.ones(3, 4)), TypeError, ["torch.bool", "float32"]),
    (lambda: am.masked_softmax(torch.randn(3, 4), torch.ones(3, 5, dtype=torch.bool)), ValueError,
     ["(3, 5)", "(3, 4)", "broadcast"]),
    (lambda: am.masked_softmax(torch.randn(3, 4), torch.ones(3, 4, dtype=torch.bool, device="meta")),
     ValueError, ["meta", "cpu", "device"]),
])
def test_errors_are_clear(call, exc, words):
    with pytest.raises(exc) as info:
        call()
    for word in words:
        assert word in str(info.value), f"{word!r} missing from: {info.value}"
