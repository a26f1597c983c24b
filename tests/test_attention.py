"""attention() against PyTorch's math-backend SDPA in float64, on both paths
(explicit, need_weights=True, and fused, need_weights=False)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.attention.bias import causal_lower_right

import attnmask as am

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
B, H, LQ, LK, D, DV = 3, 2, 5, 7, 8, 6  # B != Lq != Lk, d != dv


def qkv(dtype=torch.float32, device="cpu", *, shape=(B, H), Lq=LQ, Lk=LK, d=D, dv=DV, seed=0,
        requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*shape, Lq, d, generator=g)
    k = torch.randn(*shape, Lk, d, generator=g)
    v = torch.randn(*shape, Lk, dv, generator=g)
    return [t.to(dtype=dtype, device=device).requires_grad_(requires_grad) for t in (q, k, v)]


def masks(device="cpu"):
    """Masks of every broadcast shape the contract allows, some with fully masked rows."""
    g = torch.Generator().manual_seed(1)
    random = torch.rand(B, H, LQ, LK, generator=g) < 0.5
    random[0, 1, 2] = False
    random[2, 0, 4] = False
    lengths = torch.tensor([0, 3, LK])
    return {
        "none": None,
        "causal_bottom_right": am.causal_mask(LQ, n_keys=LK, device=device),
        "causal_top_left": am.causal_mask(LQ, n_keys=LK, align="top_left", device=device),
        "padding": am.padding_mask(lengths.to(device), LK)[:, None, None, :],
        "padding_and_causal": am.combine_masks(am.causal_mask(LQ, n_keys=LK, device=device),
                                               am.padding_mask(lengths.to(device), LK)[:, None, None, :]),
        "random_per_head": random.to(device),
        "row_mask": (torch.arange(LQ) % 2 == 0)[:, None].to(device),  # (Lq, 1): odd rows fully masked
    }


MASK_NAMES = list(masks())


@pytest.mark.parametrize("mask_name", MASK_NAMES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_both_paths_match_sdpa_math_float64(mask_name, dtype, device, sdpa64, tol):
    q, k, v = qkv(dtype, device)
    mask = masks(device)[mask_name]
    ref = sdpa64(q, k, v, attn_mask=mask)  # (B, H, Lq, dv)
    out, w = am.attention(q, k, v, mask)
    fast, none = am.attention(q, k, v, mask, need_weights=False)
    assert none is None
    for got in (out, fast):
        assert got.shape == (B, H, LQ, DV) and got.dtype == dtype and got.device == q.device
        assert not got.isnan().any()
        torch.testing.assert_close(got.double(), ref, **tol(dtype))
    torch.testing.assert_close(fast.double(), out.double(), **tol(dtype))
    assert w.shape == (B, H, LQ, LK) and w.dtype == dtype


@pytest.mark.parametrize("mask_name", MASK_NAMES)
def test_weights_are_masked_distributions(mask_name):
    q, k, v = qkv(torch.float64)
    mask = masks()[mask_name]
    full = torch.ones(B, H, LQ, LK, dtype=torch.bool)
    if mask is not None:
        full = torch.broadcast_to(mask, full.shape)
    _, w = am.attention(q, k, v, mask)
    assert (w[~full] == 0).all()
    sums = w.sum(-1)
    torch.testing.assert_close(sums, full.any(-1).double())


def test_fully_masked_rows_are_zero_on_both_paths():
    q, k, v = qkv(torch.float64)
    mask = masks()["random_per_head"]
    for need_weights in (True, False):
        out, w = am.attention(q, k, v, mask, need_weights=need_weights)
        assert (out[0, 1, 2] == 0).all() and (out[2, 0, 4] == 0).all()
        if w is not None:
            assert (w[0, 1, 2] == 0).all()


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gradients_are_finite_with_fully_masked_rows(dtype, need_weights, device):
    q, k, v = qkv(dtype, device, requires_grad=True)
    out, _ = am.attention(q, k, v, masks(device)["padding_and_causal"], need_weights=need_weights)
    (out.float() * torch.randn(out.shape, device=device)).sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert (q.grad[0] == 0).all(), "queries of an empty sequence see nothing and get no gradient"


@pytest.mark.parametrize("need_weights", [True, False])
def test_gradcheck_float64(need_weights):
    q, k, v = qkv(torch.float64, shape=(2,), Lq=3, Lk=4, d=3, dv=2, requires_grad=True)
    mask = torch.tensor([[True, False, True, True], [False] * 4, [True, True, False, False]])
    fn = lambda *t: am.attention(*t, mask, need_weights=need_weights)[0]  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, v))


def test_bottom_right_causal_matches_pytorch_causal_lower_right(sdpa64):
    q, k, v = qkv(torch.float64, Lq=4, Lk=9)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        bias = causal_lower_right(4, 9)
    out, _ = am.attention(q, k, v, am.causal_mask(4, n_keys=9))
    torch.testing.assert_close(out, sdpa64(q, k, v, attn_mask=bias))


def test_top_left_causal_matches_sdpa_is_causal(sdpa64):
    q, k, v = qkv(torch.float64, Lq=4, Lk=9)
    out, _ = am.attention(q, k, v, am.causal_mask(4, n_keys=9, align="top_left"))
    torch.testing.assert_close(out, sdpa64(q, k, v, is_causal=True))


def test_default_scale_is_one_over_sqrt_d_and_can_be_changed(sdpa64):
    q, k, v = qkv(torch.float64)
    torch.testing.assert_close(am.attention(q, k, v)[0], sdpa64(q, k, v, scale=1 / math.sqrt(D)))
    for need_weights in (True, False):
        out, _ = am.attention(q, k, v, scale=0.3, need_weights=need_weights)
        torch.testing.assert_close(out, sdpa64(q, k, v, scale=0.3))


@pytest.mark.parametrize("shape", [(), (4,), (2, 3, 2)])
def test_any_leading_dimensions(shape, sdpa64):
    q, k, v = qkv(torch.float64, shape=shape)
    mask = am.causal_mask(LQ, n_keys=LK)
    for need_weights in (True, False):
        out, _ = am.attention(q, k, v, mask, need_weights=need_weights)
        assert out.shape == (*shape, LQ, DV)
        torch.testing.assert_close(out, sdpa64(q, k, v, attn_mask=mask))


@settings(max_examples=30, deadline=None)
@given(B_=st.integers(1, 3), H_=st.integers(1, 3), Lq=st.integers(1, 9), Lk=st.integers(1, 9),
       d=st.integers(1, 6), p=st.floats(0.0, 1.0), seed=st.integers(0, 2**16))
def test_random_shapes_and_masks_match_sdpa(B_, H_, Lq, Lk, d, p, seed, sdpa64):
    q, k, v = qkv(torch.float64, shape=(B_, H_), Lq=Lq, Lk=Lk, d=d, dv=d + 1, seed=seed)
    mask = torch.rand(B_, 1, Lq, Lk, generator=torch.Generator().manual_seed(seed)) < p
    ref = sdpa64(q, k, v, attn_mask=mask)
    for need_weights in (True, False):
        torch.testing.assert_close(am.attention(q, k, v, mask, need_weights=need_weights)[0], ref)


@pytest.mark.parametrize("need_weights", [True, False])
def test_inputs_are_not_modified(need_weights):
    q, k, v = qkv(requires_grad=True)
    frozen = torch.randn(B, H, LK, DV)  # a v that does not require grad
    for t in (q, k):
        t.grad = torch.full_like(t, 3.0)
    mask = masks()["padding_and_causal"]
    before = [t.detach().clone() for t in (q, k, v, frozen, mask)] + [q.grad.clone(), k.grad.clone()]
    am.attention(q, k, frozen, mask, need_weights=need_weights)
    am.attention(q, k, v, mask, need_weights=need_weights)
    after = [q, k, v, frozen, mask, q.grad, k.grad]
    assert all(torch.equal(a.detach(), b) for a, b in zip(after, before))
    assert q.requires_grad and k.requires_grad and v.requires_grad and not frozen.requires_grad
    assert v.grad is None and frozen.grad is None


def test_meta_device():
    q, k, v = (torch.empty(2, 3, n, 4, device="meta") for n in (5, 7, 7))
    out, w = am.attention(q, k, v, am.causal_mask(5, n_keys=7, device="meta"))
    assert out.device.type == "meta" and out.shape == (2, 3, 5, 4) and w.shape == (2, 3, 5, 7)


@pytest.mark.parametrize("call, exc, words", [
    (lambda q, k, v: am.attention(q, k, v, torch.ones(LQ, LK + 2, dtype=torch.bool)), ValueError,
     [f"({LQ}, {LK + 2})", f"({B}, {H}, {LQ}, {LK})", "(B, H, Lq, Lk)", "broadcast"]),
    (lambda q, k, v: am.attention(q, k, v, torch.ones(LQ, LK)), TypeError, ["torch.bool", "float32"]),
    (lambda q, k, v: am.attention(q, k, v, torch.ones(LQ, LK, dtype=torch.bool, device="meta")), ValueError,
     ["meta", "cpu"]),
    (lambda q, k, v: am.attention(q, k[..., :3], v), ValueError, ["(..., Lq, d)", "(..., Lk, d)", "d"]),
    (lambda q, k, v: am.attention(q, k, v[..., :4, :]), ValueError, ["k", "v", "Lk"]),
    (lambda q, k, v: am.attention(q, k[:1], v[:1]), ValueError, ["leading", "(1, 2, 7, 8)"]),
    (lambda q, k, v: am.attention(q.double(), k, v), TypeError, ["float64", "float32"]),
    (lambda q, k, v: am.attention(q.long(), k, v), TypeError, ["q", "floating", "int64"]),
    (lambda q, k, v: am.attention(q[0, 0, 0], k, v), ValueError, ["q", "(8,)", "(..., L, d)"]),
])
def test_errors_are_clear(call, exc, words):
    with pytest.raises(exc) as info:
        call(*qkv())
    for word in words:
        assert word in str(info.value), f"{word!r} missing from: {info.value}"
