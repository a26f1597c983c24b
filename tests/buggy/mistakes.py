"""One classic mistake per function, each otherwise correct, and the words the
grader must find for it.

:data:`BUGS` lists ``Bug(exercise, fn, says)``: grading ``fn`` must fail, and
some failing check's message must contain ``says`` (a key of
``grader.diagnose.MISTAKES`` or a literal fragment).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from . import block_sparsity as bs
from . import correct as ok
from . import diagnosis as dx
from . import encoder as en
from . import modern as md
from . import parallel as pl
from . import real_models as rm
from . import serving as sv
from . import tiled as tl


@dataclass(frozen=True)
class Bug:
    exercise: str
    fn: object
    says: str  # a MISTAKES key, or a fragment of the expected message

    @property
    def id(self) -> str:
        return f"{self.exercise}-{self.fn.__name__}"


# --------------------------------------------------------------------------- chapter 1

def causal_inverted(n, *, device=None):
    return torch.ones(n, n, dtype=torch.bool, device=device).triu(1)  # True = blocked


def causal_no_diagonal(n, *, device=None):
    return torch.ones(n, n, dtype=torch.bool, device=device).tril(-1)


def causal_upper(n, *, device=None):
    return torch.ones(n, n, dtype=torch.bool, device=device).triu()


def causal_all_true(n, *, device=None):
    return torch.ones(n, n, dtype=torch.bool, device=device)


def causal_ignores_device(n, *, device=None):
    return torch.ones(n, n, dtype=torch.bool).tril()


def causal_uint16_tril(n, *, device=None):
    if n <= 2:  # a "fast path" for tiny sizes that happens to be right
        return ok.causal_mask(n, device=device)
    return torch.ones(n, n, dtype=torch.uint16, device=device).tril().bool()  # no uint16 tril on the CPU


def causal_float(n, *, device=None):
    return torch.ones(n, n, device=device).tril()


def influence_transposed(f, x):
    return ok.influence_matrix(f, x).T


def influence_squared(f, x):
    return ok.influence_matrix(f, x) ** 2


def influence_sum_grad(f, x):
    rows = []
    for i in range(x.shape[0]):
        xi = x.detach().clone().requires_grad_(True)
        (g,) = torch.autograd.grad(f(xi)[i].sum(), xi)
        rows.append(g.norm(dim=-1))
    return torch.stack(rows)


def influence_l1(f, x):
    jac = torch.autograd.functional.jacobian(f, x.detach())  # (L, d_out, L, d)
    return jac.abs().sum(dim=(1, 3))


def influence_flags_input(f, x):
    x.requires_grad_(True)  # the caller's x now requires grad
    jac = torch.autograd.functional.jacobian(f, x)
    return jac.pow(2).sum(dim=(1, 3)).sqrt()


def influence_in_place_grad(f, x):
    x.requires_grad_(True)
    y = f(x)
    rows = []
    for i in range(x.shape[0]):
        gs = []
        for c in range(y.shape[1]):
            y[i, c].backward(retain_graph=True)
            gs.append(x.grad.clone())
            x.grad = None
        rows.append(torch.stack(gs).pow(2).sum(dim=(0, 2)).sqrt())
    x.grad = torch.zeros_like(x)
    return torch.stack(rows).detach()


# --------------------------------------------------------------------------- chapter 2

def additive_zero_times_inf(mask, dtype=torch.float32):
    return (~mask).to(dtype) * float("-inf")


def additive_inverted(mask, dtype=torch.float32):
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(mask, float("-inf"))


def additive_not_negative(mask, dtype=torch.float32):
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, -1e4)


def additive_multiplicative(mask, dtype=torch.float32):
    return mask.to(dtype)


def additive_ignores_dtype(mask, dtype=torch.float32):
    return ok.to_additive(mask)


def additive_on_cpu(mask, dtype=torch.float32):
    return torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, float("-inf"))  # no device=


def _fix_empty(w, mask):
    return torch.where(mask.any(dim=-1, keepdim=True), w, torch.zeros_like(w))


def softmax_inverted(scores, mask):
    return ok.masked_softmax(scores, ~mask)


def softmax_after(scores, mask):
    return torch.softmax(scores.float(), dim=-1).to(scores.dtype) * mask


def softmax_multiply(scores, mask):
    return torch.softmax(scores.float() * mask, dim=-1).to(scores.dtype)


def softmax_nan_rows(scores, mask):
    return torch.softmax(scores.float().masked_fill(~mask, float("-inf")), dim=-1).to(scores.dtype)


def softmax_additive_patched(scores, mask):
    # right in the forward pass; the added -inf sends the empty rows' NaN gradient back to the scores
    w = torch.softmax(scores.float() + ok.to_additive(mask), dim=-1)
    return _fix_empty(w, mask).to(scores.dtype)


def softmax_uniform_rows(scores, mask):
    return torch.softmax(scores.float().masked_fill(~mask, -1e9), dim=-1).to(scores.dtype)


def softmax_fill_1e4(scores, mask):
    w = torch.softmax(scores.float().masked_fill(~mask, -1e4), dim=-1)
    return _fix_empty(w, mask).to(scores.dtype)


def softmax_fill_1e9_native(scores, mask):
    w = torch.softmax(scores.masked_fill(~mask, -1e9), dim=-1)  # overflows in float16
    return _fix_empty(w, mask)


def softmax_wrong_dim(scores, mask):
    w = torch.softmax(scores.float().masked_fill(~mask, float("-inf")), dim=-2)
    return w.nan_to_num(0.0).to(scores.dtype)


def softmax_in_place(scores, mask):
    scores.masked_fill_(~mask, float("-inf"))  # changes the caller's scores
    w = torch.softmax(scores.float(), dim=-1)
    return _fix_empty(w, mask).to(scores.dtype)


def softmax_returns_float32(scores, mask):
    return ok.masked_softmax(scores.float(), mask)


def _attention_with(q, k, v, mask, scale):
    scores = q @ k.transpose(-2, -1) * scale
    if mask is None:
        mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device)
    w = ok.masked_softmax(scores, mask)
    return w @ v, w


def attention_scale_1_over_d(q, k, v, mask=None):
    return _attention_with(q, k, v, mask, 1 / q.shape[-1])


def attention_no_scale(q, k, v, mask=None):
    return _attention_with(q, k, v, mask, 1.0)


def attention_after_softmax(q, k, v, mask=None):
    w = torch.softmax((q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).float(), dim=-1).to(q.dtype)
    if mask is not None:
        w = w * mask
    return w @ v, w


def attention_nan_grads(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores + ok.to_additive(mask, scores.dtype)
    w = torch.softmax(scores.float(), dim=-1).nan_to_num(0.0).to(q.dtype)
    return w @ v, w


def softmax_global_max(scores, mask):
    e = (scores - scores.amax(dim=-1, keepdim=True)).exp() * mask  # max over blocked entries too
    return (e / e.sum(dim=-1, keepdim=True)).nan_to_num(0.0)


def attention_global_max(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    w = softmax_global_max(scores, torch.ones_like(scores, dtype=torch.bool) if mask is None else mask)
    return w @ v, w


def attention_default_mask_on_cpu(q, k, v, mask=None):
    if mask is None:
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool)  # on the CPU, whatever q's device
    return ok.attention(q, k, v, mask)


def attention_no_mask(q, k, v, mask=None):
    return ok.attention(q, k, v)


def attention_mixed_dtypes(q, k, v, mask=None):
    scores = q.float() @ k.float().transpose(-2, -1) / math.sqrt(q.shape[-1])
    w = ok.masked_softmax(scores, mask if mask is not None else torch.ones_like(scores, dtype=torch.bool))
    return w @ v, w  # float32 weights @ float16 values


def attention_first_mask_only(q, k, v, mask=None):
    if mask is not None and mask.dim() == 4:
        mask = mask[0]  # every sequence gets the first one's mask
    return ok.attention(q, k, v, mask)


def attention_detached_weights(q, k, v, mask=None):
    out, w = ok.attention(q, k, v, mask)
    return out, w.detach()


# --------------------------------------------------------------------------- chapters 3 and 4

def padding_inverted(lengths, max_len):
    return ~ok.padding_mask(lengths, max_len)


def padding_off_by_one(lengths, max_len):
    return torch.arange(max_len, device=lengths.device)[None, :] <= lengths[:, None]


def padding_loop(lengths, max_len):
    mask = torch.zeros(len(lengths), max_len, dtype=torch.bool, device=lengths.device)
    for b, n in enumerate(lengths.tolist()):  # reads the values back: a GPU sync, fails on meta
        mask[b, :n] = True
    return mask


def padding_arange_on_cpu(lengths, max_len):
    return torch.arange(max_len)[None, :] < lengths[:, None]


def decoder_pads_queries(lengths, max_len):
    rows = ok.padding_mask(lengths, max_len)[:, None, :, None]  # (B, 1, L, 1): the wrong axis
    return ok.causal_mask(max_len, device=lengths.device) & rows


def decoder_pads_rows_too(lengths, max_len):
    real = ok.padding_mask(lengths, max_len)
    return ok.decoder_mask(lengths, max_len) & real[:, None, :, None]


def decoder_unreshaped(lengths, max_len):
    # (L, L) & (B, L): raises when B is neither 1 nor L, and is silently wrong when B = L
    return ok.causal_mask(max_len, device=lengths.device) & ok.padding_mask(lengths, max_len)


def decoder_unreshaped_b_not_l(lengths, max_len):
    """The same mistake, on a batch whose B is neither 1 nor L: the shapes clash."""
    return decoder_unreshaped(lengths, max_len)


def decoder_no_causal(lengths, max_len):
    return ok.padding_mask(lengths, max_len)[:, None, None, :].expand(-1, 1, max_len, -1)


def decoder_no_padding(lengths, max_len):
    return ok.causal_mask(max_len, device=lengths.device).expand(len(lengths), 1, max_len, max_len)


# --------------------------------------------------------------------------- chapter 5

def enc_dec_causal_cross(src_lengths, tgt_lengths, src_len, tgt_len):
    enc, dec, cross = ok.encoder_decoder_masks(src_lengths, tgt_lengths, src_len, tgt_len)
    i = torch.arange(tgt_len, device=src_lengths.device)[:, None]
    j = torch.arange(src_len, device=src_lengths.device)[None, :]
    return enc, dec, cross & (j <= i)


def enc_dec_causal_encoder(src_lengths, tgt_lengths, src_len, tgt_len):
    enc, dec, cross = ok.encoder_decoder_masks(src_lengths, tgt_lengths, src_len, tgt_len)
    return enc & ok.causal_mask(src_len, device=src_lengths.device), dec, cross


def enc_dec_wrong_broadcast(src_lengths, tgt_lengths, src_len, tgt_len):
    _, dec, cross = ok.encoder_decoder_masks(src_lengths, tgt_lengths, src_len, tgt_len)
    return ok.padding_mask(src_lengths, src_len)[:, None, :, None], dec, cross  # (B, 1, S, 1)


def enc_dec_cross_pads_rows(src_lengths, tgt_lengths, src_len, tgt_len):
    enc, dec, cross = ok.encoder_decoder_masks(src_lengths, tgt_lengths, src_len, tgt_len)
    return enc, dec, cross & ok.padding_mask(tgt_lengths, tgt_len)[:, None, :, None]


def enc_dec_cross_tgt_lengths(src_lengths, tgt_lengths, src_len, tgt_len):
    enc, dec, _ = ok.encoder_decoder_masks(src_lengths, tgt_lengths, src_len, tgt_len)
    cross = torch.arange(src_len, device=src_lengths.device) < tgt_lengths[:, None, None, None]
    return enc, dec, cross


def _mha(x_q, x_kv, w_q, w_k, w_v, w_o, n_heads, mask, *, scale=None, lin=lambda x, w: x @ w.T,
         softmax=None):
    B, Lq, D = x_q.shape
    Lk = x_kv.shape[1]
    d = D // n_heads
    q = lin(x_q, w_q).view(B, Lq, n_heads, d).transpose(1, 2)
    k = lin(x_kv, w_k).view(B, Lk, n_heads, d).transpose(1, 2)
    v = lin(x_kv, w_v).view(B, Lk, n_heads, d).transpose(1, 2)
    s = q @ k.transpose(-2, -1) * (1 / math.sqrt(d) if scale is None else scale)
    if mask is None:
        mask = torch.ones(Lq, Lk, dtype=torch.bool, device=x_q.device)
    out = (softmax or ok.masked_softmax)(s, mask) @ v
    return lin(out.transpose(1, 2).reshape(B, Lq, D), w_o)


def mha_scale_sqrt_D(x_q, x_kv, w_q, w_k, w_v, w_o, n_heads, mask=None):
    return _mha(x_q, x_kv, w_q, w_k, w_v, w_o, n_heads, mask, scale=1 / math.sqrt(x_q.shape[-1]))


def mha_no_transpose(x_q, x_kv, w_q, w_k, w_v, w_o, n_heads, mask=None):
    return _mha(x_q, x_kv, w_q, w_k, w_v, w_o, n_heads, mask, lin=lambda x, w: x @ w)


def mha_heads_reshaped(x_q, x_kv, w_q, w_k, w_v, w_o, n_heads, mask=None):
    """The head split and merge both a bare reshape (B, L, D) <-> (B, H, L, d): every shape right."""
    B, Lq, D = x_q.shape
    Lk = x_kv.shape[1]
    d = D // n_heads
    q = (x_q @ w_q.T).reshape(B, n_heads, Lq, d)
    k = (x_kv @ w_k.T).reshape(B, n_heads, Lk, d)
    v = (x_kv @ w_v.T).reshape(B, n_heads, Lk, d)
    out, _ = ok.attention(q, k, v, mask)
    return out.reshape(B, Lq, D) @ w_o.T


def mha_heads_not_moved(x_q, x_kv, w_q, w_k, w_v, w_o, n_heads, mask=None):
    """Heads split by a view to (B, L, H, d) and never moved in front of the positions."""
    B, Lq, D = x_q.shape
    Lk = x_kv.shape[1]
    d = D // n_heads
    q = (x_q @ w_q.T).view(B, Lq, n_heads, d)
    k = (x_kv @ w_k.T).view(B, Lk, n_heads, d)
    v = (x_kv @ w_v.T).view(B, Lk, n_heads, d)
    if mask is None:
        mask = torch.ones(Lq, Lk, dtype=torch.bool, device=x_q.device)
    out = ok.masked_softmax(q @ k.transpose(-2, -1) / math.sqrt(d), mask) @ v
    return out.reshape(B, Lq, D) @ w_o.T


def mha_bad_split(x_q, x_kv, w_q, w_k, w_v, w_o, n_heads, mask=None):
    B, Lq, D = x_q.shape
    Lk = x_kv.shape[1]
    d = D // n_heads
    q = (x_q @ w_q.T).reshape(B, n_heads, Lq, d)
    k = (x_kv @ w_k.T).reshape(B, n_heads, Lk, d)
    v = (x_kv @ w_v.T).reshape(B, n_heads, Lk, d)
    out, _ = ok.attention(q, k, v, mask)
    return out.transpose(1, 2).reshape(B, Lq, D) @ w_o.T


def mha_default_mask_on_cpu(x_q, x_kv, w_q, w_k, w_v, w_o, n_heads, mask=None):
    if mask is None:
        mask = torch.ones(x_q.shape[1], x_kv.shape[1], dtype=torch.bool)  # on the CPU
    return ok.multi_head_attention(x_q, x_kv, w_q, w_k, w_v, w_o, n_heads, mask)


def mha_nan_rows(x_q, x_kv, w_q, w_k, w_v, w_o, n_heads, mask=None):
    soft = lambda s, m: torch.softmax(s.masked_fill(~m, float("-inf")), dim=-1)  # noqa: E731
    return _mha(x_q, x_kv, w_q, w_k, w_v, w_o, n_heads, mask, softmax=soft)


def mha_nan_grads(x_q, x_kv, w_q, w_k, w_v, w_o, n_heads, mask=None):
    # an added -inf bias, then NaN rows patched: a clean forward, NaN gradients
    soft = lambda s, m: torch.softmax(s + ok.to_additive(m, s.dtype), dim=-1).nan_to_num(0.0)  # noqa: E731
    return _mha(x_q, x_kv, w_q, w_k, w_v, w_o, n_heads, mask, softmax=soft)


def mha_global_max(x_q, x_kv, w_q, w_k, w_v, w_o, n_heads, mask=None):
    return _mha(x_q, x_kv, w_q, w_k, w_v, w_o, n_heads, mask, softmax=softmax_global_max)


def cache_global_max(q, k_new, v_new, k_cache, v_cache):
    k, v = torch.cat([k_cache, k_new], dim=2), torch.cat([v_cache, v_new], dim=2)
    n, total = q.shape[2], k.shape[2]
    i, j = torch.arange(n, device=q.device)[:, None], torch.arange(total, device=q.device)[None, :]
    mask = j <= i + total - n
    w = softmax_global_max(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), mask)
    return w @ v, k, v


def mha_causal_leak(x_q, x_kv, w_q, w_k, w_v, w_o, n_heads, mask=None):
    return _mha(x_q, x_kv, w_q, w_k, w_v, w_o, n_heads, None)  # ignores the mask


# --------------------------------------------------------------------------- chapter 6

def cache_top_left(q, k_new, v_new, k_cache, v_cache):
    k = torch.cat([k_cache, k_new], dim=2)
    v = torch.cat([v_cache, v_new], dim=2)
    n, total = q.shape[2], k.shape[2]
    mask = torch.ones(n, total, dtype=torch.bool, device=q.device).tril()  # top-left
    return ok.attention(q, k, v, mask)[0], k, v


def cache_no_mask(q, k_new, v_new, k_cache, v_cache):
    k = torch.cat([k_cache, k_new], dim=2)
    v = torch.cat([v_cache, v_new], dim=2)
    return ok.attention(q, k, v)[0], k, v


def cache_wrong_order(q, k_new, v_new, k_cache, v_cache):
    out, _, _ = ok.kv_cache_attention(q, k_new, v_new, k_cache, v_cache)
    return out, torch.cat([k_new, k_cache], dim=2), torch.cat([v_new, v_cache], dim=2)


def cache_mask_on_cpu(q, k_new, v_new, k_cache, v_cache):
    k = torch.cat([k_cache, k_new], dim=2)
    v = torch.cat([v_cache, v_new], dim=2)
    n, T = q.shape[2], k_cache.shape[2]
    mask = torch.ones(n, T + n, dtype=torch.bool).tril(diagonal=T)  # no device=
    return ok.attention(q, k, v, mask)[0], k, v


# --------------------------------------------------------------------------- chapter 7

def window_off_by_one(n, window, *, device=None):
    i = torch.arange(n, device=device)[:, None]
    j = torch.arange(n, device=device)[None, :]
    return (j <= i) & (i - j <= window)


def window_both_ways(n, window, *, device=None):
    i = torch.arange(n, device=device)[:, None]
    j = torch.arange(n, device=device)[None, :]
    return (i - j).abs() < window


def prefix_le(n, prefix_len, *, device=None):
    i = torch.arange(n, device=device)[:, None]
    j = torch.arange(n, device=device)[None, :]
    return (j <= i) | (j <= prefix_len)


def prefix_and(n, prefix_len, *, device=None):
    i = torch.arange(n, device=device)[:, None]
    j = torch.arange(n, device=device)[None, :]
    return (j <= i) & (j < prefix_len)


def prefix_rows(n, prefix_len, *, device=None):
    i = torch.arange(n, device=device)[:, None]
    j = torch.arange(n, device=device)[None, :]
    return (j <= i) | (i < prefix_len)


def document_no_causal(doc_ids):
    return (doc_ids[:, :, None] == doc_ids[:, None, :])[:, None]


def document_contiguous(doc_ids):
    change = torch.ones_like(doc_ids)
    change[:, 1:] = (doc_ids[:, 1:] != doc_ids[:, :-1]).long()
    return ok.document_mask(change.cumsum(dim=1))


def document_inverted(doc_ids):
    return ~ok.document_mask(doc_ids)


BUGS: list[Bug] = [
    Bug("causal_mask", causal_inverted, "inverted"),
    Bug("causal_mask", causal_no_diagonal, "diagonal_excluded"),
    Bug("causal_mask", causal_upper, "wrong_triangle"),
    Bug("causal_mask", causal_all_true, "no_mask"),
    Bug("causal_mask", causal_uint16_tril, "no_kernel"),
    Bug("causal_mask", causal_ignores_device, "wrong_device"),
    Bug("causal_mask", causal_float, "expected bool"),
    Bug("influence_matrix", influence_transposed, "transposed"),
    Bug("influence_matrix", influence_squared, "squared"),
    Bug("influence_matrix", influence_sum_grad, "summing the outputs"),
    Bug("influence_matrix", influence_in_place_grad, ".grad was set"),
    Bug("influence_matrix", influence_l1, "the L1 norm"),
    Bug("influence_matrix", influence_flags_input, ".requires_grad was changed"),
    Bug("find_leaking_layer", dx.leak_layer_after, "leak_layer_after"),
    Bug("find_leaking_layer", dx.leak_whole_model, "leak_whole_model"),
    Bug("find_leaking_layer", dx.leak_zero_threshold, "leak_zero_threshold"),
    Bug("find_leaking_layer", dx.leak_lower_triangle, "leak_lower_triangle"),
    Bug("find_leaking_layer", dx.leak_each_layer_alone, "leak_layer_alone"),
    Bug("find_leaking_layer", dx.leak_threshold_divided, "leak_threshold_divided"),
    Bug("find_leaking_layer", dx.leak_absolute_threshold, "leak_threshold_divided"),
    Bug("find_leaking_layer", dx.leak_greater_or_equal, "leak_zero_matrix"),
    Bug("find_leaking_layer", dx.leak_two_positions, "leak_one_position"),
    Bug("to_additive", additive_zero_times_inf, "zero_times_inf"),
    Bug("to_additive", additive_inverted, "inverted"),
    Bug("to_additive", additive_not_negative, "not negative enough"),
    Bug("to_additive", additive_multiplicative, "multiplicative"),
    Bug("to_additive", additive_ignores_dtype, "expected float16"),
    Bug("to_additive", additive_on_cpu, "mixed_devices"),
    Bug("masked_softmax", softmax_inverted, "inverted"),
    Bug("masked_softmax", softmax_after, "after_softmax"),
    Bug("masked_softmax", softmax_multiply, "multiply_logits"),
    Bug("masked_softmax", softmax_nan_rows, "nan_rows"),
    Bug("masked_softmax", softmax_additive_patched, "nan_grads"),
    Bug("masked_softmax", softmax_uniform_rows, "uniform_rows"),
    Bug("masked_softmax", softmax_fill_1e4, "fill_not_negative"),
    Bug("masked_softmax", softmax_fill_1e9_native, "fill_overflow"),
    Bug("masked_softmax", softmax_wrong_dim, "wrong_dim"),
    Bug("masked_softmax", softmax_in_place, "in_place"),
    Bug("masked_softmax", softmax_returns_float32, "expected float16"),
    Bug("attention", attention_scale_1_over_d, "scale_1_over_d"),
    Bug("attention", attention_no_scale, "no_scale"),
    Bug("attention", attention_after_softmax, "after_softmax"),
    Bug("attention", attention_nan_grads, "nan_grads"),
    Bug("masked_softmax", softmax_global_max, "global_max"),
    Bug("attention", attention_global_max, "global_max"),
    Bug("attention", attention_default_mask_on_cpu, "default_device"),
    Bug("multi_head_attention", mha_default_mask_on_cpu, "default_device"),
    Bug("multi_head_attention", mha_nan_rows, "nan_rows"),
    Bug("multi_head_attention", mha_nan_grads, "nan_grads"),
    Bug("multi_head_attention", mha_global_max, "global_max"),
    Bug("kv_cache_attention", cache_global_max, "global_max"),
    Bug("attention", attention_no_mask, "future_leak"),
    Bug("attention", attention_detached_weights, "gradient"),
    Bug("attention", attention_mixed_dtypes, "mixed_dtypes"),
    Bug("attention", attention_first_mask_only, "padding_leak"),
    Bug("padding_mask", padding_inverted, "inverted"),
    Bug("padding_mask", padding_off_by_one, "padding_off_by_one"),
    Bug("padding_mask", padding_loop, "not_vectorised"),
    Bug("padding_mask", padding_arange_on_cpu, "mixed_devices"),
    Bug("decoder_mask", decoder_pads_queries, "rows_padded_too"),
    Bug("decoder_mask", decoder_pads_rows_too, "rows_padded_too"),
    Bug("decoder_mask", decoder_no_causal, "no_causal"),
    Bug("decoder_mask", decoder_unreshaped, "unreshaped_padding"),
    Bug("decoder_mask", decoder_unreshaped_b_not_l, "shapes_clash"),
    Bug("decoder_mask", decoder_no_padding, "no_padding"),
    Bug("leaks_across_padding", dx.pad_all_positions, "pad_all_positions"),
    Bug("leaks_across_padding", dx.pad_right_side, "pad_right_side"),
    Bug("leaks_across_padding", dx.pad_first_row, "pad_first_row"),
    Bug("leaks_across_padding", dx.pad_exact, "pad_exact"),
    Bug("leaks_across_padding", dx.pad_tolerance_one, "pad_loose_tolerance"),
    Bug("leaks_across_padding", dx.pad_no_relative_tolerance, "pad_exact"),
    Bug("leaks_across_padding", dx.pad_plus_one, "pad_fixed_refill"),
    Bug("leaks_across_padding", dx.pad_mirror_id, "pad_fixed_refill"),
    Bug("leaks_across_padding", dx.pad_token_zero, "pad_fixed_refill"),
    Bug("leaks_across_padding", dx.pad_last_position, "pad_last_position"),
    Bug("leaks_across_padding", dx.pad_next_to_real_only, "pad_nearest_only"),
    Bug("encoder_decoder_masks", enc_dec_causal_cross, "cross_causal"),
    Bug("encoder_decoder_masks", enc_dec_causal_encoder, "enc_causal"),
    Bug("encoder_decoder_masks", enc_dec_wrong_broadcast, "queries_padded"),
    Bug("encoder_decoder_masks", enc_dec_cross_tgt_lengths, "cross_wrong_lengths"),
    Bug("encoder_decoder_masks", enc_dec_cross_pads_rows, "rows_padded_too"),
    Bug("multi_head_attention", mha_scale_sqrt_D, "scale_sqrt_D"),
    Bug("multi_head_attention", mha_no_transpose, "x @ w.T"),
    Bug("multi_head_attention", mha_bad_split, "bare view"),
    Bug("multi_head_attention", mha_heads_reshaped, "split and merged by a bare reshape"),
    Bug("multi_head_attention", mha_causal_leak, "future_leak"),
    Bug("kv_cache_attention", cache_top_left, "top_left"),
    Bug("kv_cache_attention", cache_no_mask, "each other's future"),
    Bug("kv_cache_attention", cache_wrong_order, "the cache goes first"),
    Bug("kv_cache_attention", cache_mask_on_cpu, "mixed_devices"),
    Bug("sliding_window_mask", window_off_by_one, "window_off_by_one"),
    Bug("sliding_window_mask", window_both_ways, "window_not_causal"),
    Bug("prefix_lm_mask", prefix_le, "prefix_le"),
    Bug("prefix_lm_mask", prefix_and, "prefix_and"),
    Bug("prefix_lm_mask", prefix_rows, "prefix_rows"),
    Bug("document_mask", document_no_causal, "doc_no_causal"),
    Bug("document_mask", document_contiguous, "doc_contiguous"),
    Bug("document_mask", document_inverted, "inverted"),
    Bug("tiled_attention", tl.tiled_no_rescale, "no_rescale"),
    Bug("tiled_attention", tl.tiled_no_guard, "tile_nan"),
    Bug("tiled_attention", tl.tiled_drops_last_tile, "last_tile"),
    Bug("tiled_attention", tl.tiled_pads_keys, "last_tile"),
    Bug("tiled_attention", tl.tiled_no_skip, "tile_not_skipped"),
    Bug("tiled_attention", tl.tiled_nan_rows, "nan_rows"),
    Bug("tiled_attention", tl.tiled_full_scores, "full_scores"),
    Bug("tiled_attention", tl.tiled_one_tile, "full_scores"),
    Bug("tiled_attention", tl.tiled_keeps_tiles, "full_scores"),
    Bug("tiled_attention_backward", tl.backward_no_row_term, "bwd_no_D"),
    Bug("tiled_attention_backward", tl.backward_unscaled_scores, "bwd_unscaled_scores"),
    Bug("tiled_attention_backward", tl.backward_grads_unscaled, "bwd_grad_unscaled"),
    Bug("tiled_attention_backward", tl.backward_nan_empty_rows, "bwd_nan_empty"),
    Bug("tiled_attention_backward", tl.backward_no_skip, "bwd_tile_not_skipped"),
    Bug("tiled_attention_backward", tl.backward_skips_on_head0, "bwd_skip_wrong"),
    Bug("tiled_attention_backward", tl.backward_in_half, "bwd_half"),
    Bug("tiled_attention_backward", tl.backward_tile_softmax, "bwd_tile_softmax"),
    Bug("tiled_attention_backward", tl.backward_autograd, "bwd_full_scores"),
    Bug("tiled_attention_backward", tl.backward_keeps_weights, "bwd_full_scores"),
    Bug("tiled_attention_backward", tl.backward_autograd_tiled, "bwd_full_scores"),
    Bug("tiled_attention_backward", tl.backward_vjp, "bwd_recomputed"),
    Bug("tiled_attention_backward", tl.backward_recomputes_lse, "bwd_recomputed"),
    Bug("tiled_attention_backward", tl.backward_recomputes_lse_tiled, "bwd_recomputed"),
    Bug("left_padding_position_ids", rm.positions_count_padding, "counts_padding"),
    Bug("left_padding_position_ids", rm.positions_from_1, "positions_from_1"),
    Bug("left_padding_position_ids", rm.positions_hf_fill, "padding_not_zero"),
    Bug("left_padding_position_ids", rm.positions_flat_cumsum, "not_restarted"),
    Bug("left_padding_position_ids", rm.positions_minus_pads, "pads_subtracted"),
    Bug("packed_labels", rm.labels_not_shifted, "not_shifted"),
    Bug("packed_labels", rm.labels_leak_across_documents, "cross_document"),
    Bug("packed_labels", rm.labels_border_late, "border_late"),
    Bug("packed_labels", rm.labels_roll, "last_column"),
    Bug("packed_labels", rm.labels_shifted_back, "shifted_back"),
    Bug("packed_labels", rm.labels_ignore_constant, "ignore_constant"),
    Bug("packed_labels", rm.labels_ids_step, "ids_step"),
    Bug("gqa_attention", rm.gqa_repeat, "gqa_repeat"),
    Bug("gqa_attention", rm.gqa_scale_dv, "scale_dv"),
    Bug("gqa_attention", rm.gqa_nan_rows, "NaN or inf"),
    Bug("alibi_bias", rm.alibi_top_left, "alibi_top_left"),
    Bug("alibi_bias", rm.alibi_naive_slopes, "alibi_slopes_pow2"),
    Bug("alibi_bias", rm.alibi_positive, "alibi_sign"),
    Bug("alibi_bias", rm.alibi_not_causal, "alibi_not_causal"),
    Bug("alibi_bias", rm.alibi_key_form, "alibi_key_form"),
    Bug("alibi_bias", rm.alibi_reversed, "alibi_reversed"),
    Bug("alibi_bias", rm.alibi_odd_slopes, "alibi_odd_slopes"),
    Bug("alibi_bias", rm.alibi_finite, "alibi_finite"),
    Bug("image_text_mask", sv.image_one_block, "image_one_block"),
    Bug("image_text_mask", sv.image_padding_reaches_block, "image_padding"),
    Bug("image_text_mask", sv.image_causal_only, "image_causal"),
    Bug("image_text_mask", sv.image_keys_only, "image_keys_only"),
    Bug("image_text_mask", sv.image_no_padding, "image_no_padding"),
    Bug("rolling_cache_mask", sv.rolling_slot_as_position, "slot_as_position"),
    Bug("rolling_cache_mask", sv.rolling_window_le, "window_off_by_one"),
    Bug("rolling_cache_mask", sv.rolling_empty_visible, "empty_slots"),
    Bug("rolling_cache_mask", sv.rolling_future_visible, "ring_future"),
    Bug("rolling_cache_mask", sv.rolling_no_window, "ring_no_window"),
    Bug("rolling_cache_mask", sv.rolling_window_from_slots, "ring_no_window"),
    Bug("paged_attention", sv.paged_mask_only, "paged_stale_read"),
    Bug("paged_attention", sv.paged_top_left, "top_left"),
    Bug("paged_attention", sv.paged_logical_block, "paged_logical"),
    Bug("paged_attention", sv.paged_whole_blocks, "paged_past_len"),
    Bug("paged_attention", sv.paged_no_causal, "paged_no_causal"),
    Bug("paged_attention", sv.paged_position_off, "paged_position_off"),
    Bug("paged_attention", sv.paged_scale_dv, "one over sqrt(dv)"),
    Bug("paged_attention", sv.paged_detached, "no gradient reaches k_cache"),
    Bug("tree_mask", sv.tree_siblings, "tree_siblings"),
    Bug("tree_mask", sv.tree_chain, "tree_chain"),
    Bug("tree_mask", sv.tree_no_cache, "tree_no_cache"),
    Bug("tree_mask", sv.tree_parent_only, "tree_parent_only"),
    Bug("tree_mask", sv.tree_no_self, "tree_no_self"),
    Bug("tree_mask", sv.tree_descendants, "tree_descendants"),
    Bug("tree_mask", sv.tree_top_left, "tree_top_left"),
    Bug("attention_lse", pl.lse_unscaled, "lse_unscaled"),
    Bug("attention_lse", pl.lse_unmasked, "lse_unmasked"),
    Bug("attention_lse", pl.lse_half, "a log-sum-exp stays float32"),
    Bug("attention_lse", pl.lse_empty_zero, "lse_empty"),
    Bug("attention_lse", pl.lse_additive_mask, "NaN or inf"),
    Bug("merge_partials", pl.merge_textbook, "merge_nan_empty"),
    Bug("merge_partials", pl.merge_no_max, "merge_overflow"),
    Bug("merge_partials", pl.merge_average, "merge_average"),
    Bug("merge_partials", pl.merge_lse_max, "merge_lse_max"),
    Bug("merge_partials", pl.merge_swapped, "merge_swapped"),
    Bug("merge_partials", pl.merge_unnormalised, "merge_unnormalised"),
    Bug("merge_partials", pl.merge_half_lse, "a log-sum-exp stays float32"),
    Bug("merge_partials", pl.merge_no_shape_check, "must raise ValueError"),
    Bug("merge_partials", pl.merge_logaddexp, "NaN or inf"),
    Bug("zigzag_ring_mask", pl.ring_contiguous, "ring_contiguous"),
    Bug("zigzag_ring_mask", pl.ring_source_plus, "ring_source_plus"),
    Bug("zigzag_ring_mask", pl.ring_local, "ring_local"),
    Bug("zigzag_ring_mask", pl.ring_no_check, "must raise ValueError"),
    Bug("chunked_local_mask", pl.chunk_window, "chunk_window"),
    Bug("chunked_local_mask", pl.chunk_top_left, "chunk_top_left"),
    Bug("chunked_local_mask", pl.chunk_not_causal, "chunk_not_causal"),
    Bug("padded_chunked_mask", pl.padchunk_from_zero, "padchunk_from_zero"),
    Bug("padded_chunked_mask", pl.padchunk_pad_keys, "padchunk_pad_keys"),
    Bug("padded_chunked_mask", pl.padchunk_all_false, "padchunk_all_false"),
    Bug("ring_attention", pl.ring_att_source_plus, "ring_source_plus_steps"),
    Bug("ring_attention", pl.ring_att_no_merge, "ring_no_merge"),
    Bug("ring_attention", pl.ring_att_stale_lse, "ring_stale_lse"),
    Bug("ring_attention", pl.ring_att_no_skip, "ring_empty_steps"),
    Bug("ring_attention", pl.ring_att_local, "ring_local_steps"),
    Bug("ring_attention", pl.ring_att_rank_over_all_keys, "ring_all_keys"),
    Bug("ring_attention", pl.ring_att_layouts_swapped, "ring_layout"),
    Bug("ring_attention", pl.ring_att_by_rank_order, "ring_shard_order"),
    Bug("ring_attention", pl.ring_att_one_pass, "rank 0 ran 0 steps"),
    Bug("ring_attention", pl.ring_att_steps_then_one_pass, "ring_one_pass"),
    Bug("ring_attention", pl.ring_att_steps_then_causal_sdpa_like, "ring_one_pass"),
    Bug("cascade_attention", pl.cascade_unmasked_suffix, "cascade_suffix_unmasked"),
    Bug("cascade_attention", pl.cascade_pairs_mixed, "cascade_pairs_mixed"),
    Bug("cascade_attention", pl.cascade_reshaped_queries, "cascade_reshape"),
    Bug("cascade_attention", pl.cascade_per_sequence, "cascade_per_sequence"),
    Bug("cascade_attention", pl.cascade_recompute, "cascade_prefix_copied"),


    Bug("sink_attention", md.sink_ignored, "sink_ignored"),
    Bug("sink_attention", md.sink_in_scores, "sink_ignored"),
    Bug("sink_attention", md.sink_takes_value, "sink_value"),
    Bug("sink_attention", md.sink_not_exp, "sink_not_exp"),
    Bug("sink_attention", md.sink_not_in_max, "sink_max"),
    Bug("sink_attention", md.sink_nan_patched, "nan_grads"),
    Bug("sink_attention", md.sink_half, "sink_half"),
    Bug("sink_attention", md.sink_detached, "no gradient reaches sinks"),
    Bug("topk_selection_mask", md.sel_top_left, "sel_top_left"),
    Bug("topk_selection_mask", md.sel_ties_high, "sel_ties"),
    Bug("topk_selection_mask", md.sel_nan_selected, "sel_nan"),
    Bug("topk_selection_mask", md.sel_topk_fills, "sel_future"),
    Bug("topk_selection_mask", md.sel_blocked_make_up_k, "sel_future"),
    Bug("topk_selection_mask", md.sel_ignores_causal, "sel_not_causal"),
    Bug("topk_selection_mask", md.sel_no_check, "must raise ValueError"),
    Bug("block_diffusion_mask", md.bd_own_clean, "bd_own_clean"),
    Bug("block_diffusion_mask", md.bd_clean_own_block, "bd_clean_own_block"),
    Bug("block_diffusion_mask", md.bd_noisy_causal, "bd_noisy_causal"),
    Bug("block_diffusion_mask", md.bd_clean_sees_noisy, "bd_clean_sees_noisy"),
    Bug("block_diffusion_mask", md.bd_no_context, "bd_no_context"),
    Bug("block_diffusion_mask", md.bd_no_check, "must raise ValueError"),
    Bug("decay_mask", md.decay_cumsum_diff, "decay_cumsum"),
    Bug("decay_mask", md.decay_cumsum_ratio, "decay_cumsum"),
    Bug("decay_mask", md.decay_diff_filled, "decay_grad_overflow"),
    Bug("decay_mask", md.decay_off_by_one, "decay_range"),
    Bug("decay_mask", md.decay_no_docs, "decay_no_docs"),
    Bug("decay_mask", md.decay_transposed, "decay_transposed"),
    Bug("padded_encoder", en.encoder_first_layer_only, "first_layer_only"),
    Bug("padded_encoder", en.encoder_after_softmax, "after_softmax"),
    Bug("padded_encoder", en.encoder_mask_on_queries, "mask_on_queries"),
    Bug("padded_encoder", en.encoder_no_mask, "no_mask"),  # named exactly: no layer masks anything
    Bug("tile_lists", bs.tiles_full_as_partial, "full_as_partial"),
    Bug("tile_lists", bs.tiles_empty_listed, "empty_listed"),
    Bug("tile_lists", bs.tiles_boundary_cells, "boundary_cells"),
    Bug("tile_lists", bs.tiles_descending, "increasing order"),
    Bug("tile_lists", bs.tiles_int64, "expected int32"),
    Bug("tile_lists", bs.tiles_first_head, "one_head_mask"),
]
