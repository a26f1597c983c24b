"""multi_head_attention against torch.nn.MultiheadAttention (bias-free, batch
first) and against SDPA on heads split as the contract says."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import attnmask as am
from attnmask.cache import KVCache

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
B, LQ, LK, D, H = 3, 5, 7, 12, 4  # d = D // H = 3


def inputs(dtype=torch.float32, device="cpu", *, Lq=LQ, Lk=LK, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    x_q = torch.randn(B, Lq, D, generator=g)
    x_kv = torch.randn(B, Lk, D, generator=g)
    ws = [torch.randn(D, D, generator=g) / D**0.5 for _ in range(4)]
    return [t.to(dtype=dtype, device=device).requires_grad_(requires_grad) for t in (x_q, x_kv, *ws)]


def torch_mha(x_q, x_kv, w_q, w_k, w_v, w_o, mask):
    """nn.MultiheadAttention with our weights. Its boolean attn_mask means True = *blocked*
    and must be (Lq, Lk) or (B * H, Lq, Lk)."""
    mha = nn.MultiheadAttention(D, H, bias=False, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.cat([w_q, w_k, w_v]).double())
        mha.out_proj.weight.copy_(w_o.double())
    blocked = None
    if mask is not None:
        Lq, Lk = x_q.shape[1], x_kv.shape[1]
        blocked = ~torch.broadcast_to(mask, (B, H, Lq, Lk)).reshape(B * H, Lq, Lk)
    out, _ = mha(x_q.double(), x_kv.double(), x_kv.double(), attn_mask=blocked, need_weights=False)
    return out


def contract_oracle(sdpa64, x_q, x_kv, w_q, w_k, w_v, w_o, mask):
    """The contract written out with SDPA: x @ w.T, view(B, L, H, d).transpose(1, 2)."""
    def split(x):
        return x.view(B, x.shape[1], H, D // H).transpose(1, 2)
    x_q, x_kv, w_q, w_k, w_v, w_o = (t.detach().double() for t in (x_q, x_kv, w_q, w_k, w_v, w_o))
    out = sdpa64(split(x_q @ w_q.T), split(x_kv @ w_k.T), split(x_kv @ w_v.T), attn_mask=mask)
    return out.transpose(1, 2).reshape(B, x_q.shape[1], D) @ w_o.T


def cross_masks(device="cpu"):
    per_head = torch.rand(B, H, LQ, LK, generator=torch.Generator().manual_seed(3)) < 0.6
    per_head[..., 0] = True  # nn.MultiheadAttention gives NaN for empty rows: keep one key
    return {
        "none": None,
        "causal_bottom_right": am.causal_mask(LQ, n_keys=LK, device=device),
        "source_padding": am.padding_mask(torch.tensor([LK, 3, 1], device=device), LK)[:, None, None, :],
        "per_head": per_head.to(device),
    }


@pytest.mark.parametrize("mask_name", list(cross_masks()))
def test_cross_attention_matches_nn_multihead_attention(mask_name):
    args = inputs(torch.float64)
    mask = cross_masks()[mask_name]
    expected = torch_mha(*args, mask)
    for need_weights in (True, False):
        got = am.multi_head_attention(*args, H, mask, need_weights=need_weights)
        assert got.shape == (B, LQ, D)
        torch.testing.assert_close(got, expected)


def test_self_attention_matches_nn_multihead_attention():
    x, _, *ws = inputs(torch.float64)
    padding = am.padding_mask(torch.tensor([5, 2, 4]), LQ)[:, None, None, :]
    mask = am.combine_masks(am.causal_mask(LQ), padding)
    torch.testing.assert_close(am.multi_head_attention(x, x, *ws, H, mask), torch_mha(x, x, *ws, mask))


@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_the_contract_in_every_dtype(dtype, device, sdpa64, tol):
    args = inputs(dtype, device)
    lengths = torch.tensor([0, 3, LK], device=device)  # sequence 0 has no keys: fully masked rows
    mask = am.padding_mask(lengths, LK)[:, None, None, :]
    expected = contract_oracle(sdpa64, *args, mask)
    for need_weights in (True, False):
        got = am.multi_head_attention(*args, H, mask, need_weights=need_weights)
        assert got.dtype == dtype and got.device == args[0].device and not got.isnan().any()
        torch.testing.assert_close(got.double(), expected, **tol(dtype))
    assert (got[0] == 0).all(), "an empty source gives zero attention output, projected to zero"


@pytest.mark.parametrize("need_weights", [True, False])
def test_gradients_are_finite_and_inputs_untouched(need_weights):
    args = inputs(requires_grad=True)
    before = [t.detach().clone() for t in args]
    mask = am.padding_mask(torch.tensor([0, 3, LK]), LK)[:, None, None, :]
    out = am.multi_head_attention(*args, H, mask, need_weights=need_weights)
    assert all(torch.equal(a.detach(), b) for a, b in zip(args, before))
    out.square().sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in args)


def test_module_equals_functional_and_keeps_weights():
    torch.manual_seed(0)
    mod = am.MultiHeadAttention(D, H).double()
    x_q, x_kv, *_ = inputs(torch.float64)
    mask = am.causal_mask(LQ, n_keys=LK)
    ws = [mod.w_q.weight, mod.w_k.weight, mod.w_v.weight, mod.w_o.weight]
    torch.testing.assert_close(mod(x_q, x_kv, mask=mask), am.multi_head_attention(x_q, x_kv, *ws, H, mask))
    assert mod.last_weights.shape == (B, H, LQ, LK)
    assert (mod.last_weights[..., ~mask] == 0).all()
    torch.testing.assert_close(mod(x_q), am.multi_head_attention(x_q, x_q, *ws, H))


def test_module_with_cache_equals_full_causal_pass():
    torch.manual_seed(0)
    mod = am.MultiHeadAttention(D, H).double()
    x = torch.randn(B, 9, D, dtype=torch.float64)
    full = mod(x, mask=am.causal_mask(9))
    cache, outs, start = KVCache(), [], 0
    for n in (4, 1, 3, 1):  # chunked prefill, then single tokens
        chunk = x[:, start:start + n]
        outs.append(mod(chunk, mask=am.causal_mask(n, n_keys=start + n), cache=cache))
        start += n
        assert len(cache) == start
    torch.testing.assert_close(torch.cat(outs, dim=1), full)


def test_module_cross_cache_computes_encoder_keys_once():
    torch.manual_seed(0)
    mod = am.MultiHeadAttention(D, H).double()
    x_q, memory, *_ = inputs(torch.float64)
    cache = KVCache()
    first = mod(x_q[:, :2], memory, cache=cache, cross=True)
    k_first = cache.k
    second = mod(x_q[:, 2:], memory * 0, cache=cache, cross=True)  # memory ignored: the cache is used
    assert cache.k is k_first and len(cache) == LK
    torch.testing.assert_close(torch.cat([first, second], dim=1), mod(x_q, memory))


@pytest.mark.parametrize("call, exc, words", [
    (lambda a: am.multi_head_attention(*a, 5), ValueError, ["D = 12", "n_heads = 5", "divisible"]),
    (lambda a: am.multi_head_attention(a[0][0], a[1][0], *a[2:], H), ValueError,
     ["x_q", "(5, 12)", "(B, L, D)"]),
    (lambda a: am.multi_head_attention(a[0], a[1], a[2][:8], *a[3:], H), ValueError,
     ["w_q", "(8, 12)", "(D, D) = (12, 12)"]),
    (lambda a: am.multi_head_attention(a[0], a[1][:1], *a[2:], H), ValueError, ["x_q", "x_kv", "B and D"]),
    (lambda a: am.multi_head_attention(*a, H, torch.ones(LQ, LK + 1, dtype=torch.bool)), ValueError,
     ["mask", f"({LQ}, {LK + 1})", f"({B}, {H}, {LQ}, {LK})"]),
    (lambda a: am.MultiHeadAttention(10, 4), ValueError, ["10", "4", "divisible"]),
])
def test_errors_are_clear(call, exc, words):
    with pytest.raises(exc) as info:
        call(inputs())
    for word in words:
        assert word in str(info.value), f"{word!r} missing from: {info.value}"
