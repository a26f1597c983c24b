"""A second correct solution, computing natively in the inputs' dtype (no float32
upcast), the way a student following the contract literally might: scale the
queries first, softmax in float16/bfloat16, nan_to_num for fully masked rows,
F.linear for the projections. Every check must pass it too: the tolerances
have to cover both styles."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .correct import (  # noqa: F401 -- the mask builders are the same
    causal_mask,
    decoder_mask,
    document_mask,
    encoder_decoder_masks,
    padding_mask,
    prefix_lm_mask,
    sliding_window_mask,
)


def influence_matrix(f, x):
    x = x.detach().clone().requires_grad_(True)
    y = f(x)  # (L, d')
    L = x.shape[0]
    out = torch.zeros(L, L, dtype=x.dtype, device=x.device)
    for i in range(L):
        for c in range(y.shape[1]):
            (g,) = torch.autograd.grad(y[i, c], x, retain_graph=True)
            out[i] += g.pow(2).sum(-1)
    return out.sqrt()


def to_additive(mask, dtype=torch.float32):
    return torch.where(mask, 0.0, torch.finfo(dtype).min).to(dtype)


def masked_softmax(scores, mask):
    w = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return torch.nan_to_num(w, nan=0.0)


def attention(q, k, v, mask=None):
    scores = (q / math.sqrt(q.shape[-1])) @ k.transpose(-2, -1)
    w = torch.softmax(scores if mask is None else scores.masked_fill(~mask, float("-inf")), dim=-1)
    if mask is not None:
        w = w.masked_fill(~mask.any(-1, keepdim=True), 0.0)
    return w @ v, w


def multi_head_attention(x_q, x_kv, w_q, w_k, w_v, w_o, n_heads, mask=None):
    B, Lq, D = x_q.shape
    Lk = x_kv.shape[1]
    d = D // n_heads
    q = F.linear(x_q, w_q).view(B, Lq, n_heads, d).transpose(1, 2)
    k = F.linear(x_kv, w_k).view(B, Lk, n_heads, d).transpose(1, 2)
    v = F.linear(x_kv, w_v).view(B, Lk, n_heads, d).transpose(1, 2)
    out, _ = attention(q, k, v, mask)
    return F.linear(out.transpose(1, 2).reshape(B, Lq, D), w_o)


def kv_cache_attention(q, k_new, v_new, k_cache, v_cache):
    k = torch.cat([k_cache, k_new], dim=2)
    v = torch.cat([v_cache, v_new], dim=2)
    n, T = q.shape[2], k_cache.shape[2]
    mask = torch.ones(n, T + n, dtype=torch.bool, device=q.device).tril(diagonal=T)
    out, _ = attention(q, k, v, mask)
    return out, k, v
