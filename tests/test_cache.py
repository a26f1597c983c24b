"""Incremental decoding with kv_cache_attention equals the full causal pass,
checked against SDPA(is_causal=True) in float64, for any way of cutting the
sequence into chunks (T = 0 and chunked prefill n > 1 included)."""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.attention.bias import causal_lower_right

import attnmask as am

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
B, H, L, D = 2, 3, 11, 4


def qkv(dtype=torch.float64, device="cpu", *, n=L, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, n, D, generator=g).to(dtype=dtype, device=device).requires_grad_(requires_grad)
            for _ in range(3)]


def decode_in_chunks(q, k, v, sizes):
    """Feed positions in chunks of the given sizes through kv_cache_attention,
    starting from an empty cache (T = 0)."""
    k_cache = k.new_zeros(B, H, 0, k.shape[-1])
    v_cache = v.new_zeros(B, H, 0, v.shape[-1])
    outs, start = [], 0
    for n in sizes:
        s = slice(start, start + n)
        out, k_cache, v_cache = am.kv_cache_attention(q[:, :, s], k[:, :, s], v[:, :, s], k_cache, v_cache)
        assert out.shape == (B, H, n, v.shape[-1])
        outs.append(out)
        start += n
    return torch.cat(outs, dim=2), k_cache, v_cache


def chunks(L_: int):
    return st.lists(st.integers(1, L_), min_size=1).map(lambda xs: _cut(xs, L_))


def _cut(xs, total):
    sizes, left = [], total
    for x in xs:
        if left == 0:
            break
        sizes.append(min(x, left))
        left -= sizes[-1]
    if left:
        sizes.append(left)
    return sizes


@pytest.mark.parametrize("sizes", [[L], [1] * L, [4, 1, 1, 5], [1, 6, 4]], ids=["prefill", "tokens", "mixed",
                                                                               "one_then_chunks"])
def test_chunked_decoding_equals_full_causal_pass(sizes, sdpa64):
    q, k, v = qkv()
    out, k_all, v_all = decode_in_chunks(q, k, v, sizes)
    torch.testing.assert_close(out, sdpa64(q, k, v, is_causal=True))
    torch.testing.assert_close(out, am.attention(q, k, v, am.causal_mask(L))[0])
    assert torch.equal(k_all, k) and torch.equal(v_all, v)


@settings(max_examples=25, deadline=None)
@given(sizes=chunks(L), seed=st.integers(0, 2**16))
def test_any_chunking_equals_full_causal_pass(sizes, seed, sdpa64):
    q, k, v = qkv(seed=seed)
    torch.testing.assert_close(decode_in_chunks(q, k, v, sizes)[0], sdpa64(q, k, v, is_causal=True))


@pytest.mark.parametrize("T, n", [(0, 1), (0, 4), (5, 1), (5, 3)])
def test_new_query_i_sees_keys_up_to_T_plus_i(T, n, sdpa64):
    q, k_new, v_new = qkv(n=n)
    k_cache, v_cache, _ = qkv(n=T, seed=1)
    out, k_all, v_all = am.kv_cache_attention(q, k_new, v_new, k_cache, v_cache)
    assert torch.equal(k_all, torch.cat([k_cache, k_new], dim=2))
    assert torch.equal(v_all, torch.cat([v_cache, v_new], dim=2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        bias = causal_lower_right(n, T + n)  # PyTorch's own bottom-right causal mask
    torch.testing.assert_close(out, sdpa64(q, k_all, v_all, attn_mask=bias))


@pytest.mark.parametrize("dtype", DTYPES)
def test_dtypes_and_devices(dtype, device, sdpa64, tol):
    q, k, v = qkv(dtype, device)
    out, k_all, v_all = decode_in_chunks(q, k, v, [3, 1, 7])
    assert out.dtype == dtype and out.device == q.device and k_all.dtype == dtype
    torch.testing.assert_close(out.double(), sdpa64(q, k, v, is_causal=True), **tol(dtype))


def test_gradients_are_finite_and_inputs_untouched():
    q, k_new, v_new = qkv(torch.float32, n=2, requires_grad=True)
    k_cache, v_cache, _ = qkv(torch.float32, n=4, seed=1)
    before = [t.detach().clone() for t in (q, k_new, v_new, k_cache, v_cache)]
    out, k_all, _ = am.kv_cache_attention(q, k_new, v_new, k_cache, v_cache)
    (out.sum() + k_all.sum()).backward()
    after = (q, k_new, v_new, k_cache, v_cache)
    assert all(torch.equal(a.detach(), b) for a, b in zip(after, before))
    assert all(torch.isfinite(t.grad).all() for t in (q, k_new, v_new))
    assert not k_cache.requires_grad and k_cache.grad is None


def test_mask_is_built_on_the_inputs_device():
    q, k, v = (torch.empty(B, H, 2, D, device="meta") for _ in range(3))
    kc, vc = (torch.empty(B, H, 5, D, device="meta") for _ in range(2))
    out, k_all, _ = am.kv_cache_attention(q, k, v, kc, vc)
    assert out.device.type == "meta" and out.shape == (B, H, 2, D) and k_all.shape == (B, H, 7, D)


def test_kvcache_appends_and_replaces():
    cache = am.KVCache()
    assert len(cache) == 0
    k1, v1, _ = qkv(n=3)
    k2, v2, _ = qkv(n=2, seed=1)
    cache.update(k1, v1)
    k, v = cache.update(k2, v2)
    assert len(cache) == 5
    assert torch.equal(k, torch.cat([k1, k2], 2)) and torch.equal(v, torch.cat([v1, v2], 2))
    cache.update(k2, v2, replace=True)
    assert len(cache) == 2 and torch.equal(cache.k, k2)


@pytest.mark.parametrize("shapes, words", [
    (dict(k_cache=(B, H, 4, D + 1)), ["k_cache", "(2, 3, 4, 5)", "(B, H, T, d)"]),
    (dict(v_cache=(B, H + 1, 4, D)), ["v_cache", "(2, 4, 4, 4)", "B, H or d"]),
    (dict(q=(H, 1, D)), ["q", "(3, 1, 4)", "(B, H, n, d)"]),
    (dict(k_new=(B, H, 2, D)), ["k_new", "(2, 3, 2, 4)", "(B, H, n)"]),
])
def test_errors_are_clear(shapes, words):
    base = dict(q=(B, H, 1, D), k_new=(B, H, 1, D), v_new=(B, H, 1, D), k_cache=(B, H, 4, D),
                v_cache=(B, H, 4, D))
    args = {name: torch.randn(shapes.get(name, shape)) for name, shape in base.items()}
    with pytest.raises(ValueError) as info:
        am.kv_cache_attention(**args)
    for word in words:
        assert word in str(info.value), f"{word!r} missing from: {info.value}"
