"""Chapter 9's classic mistakes, each otherwise correct: position ids, packed
labels, grouped-query attention and ALiBi. Listed in :data:`buggy.mistakes.BUGS`."""

from __future__ import annotations

import math

import torch

from . import correct as ok


def positions_count_padding(keep):
    pos = torch.arange(keep.shape[1], device=keep.device).expand(keep.shape)
    return torch.where(keep, pos, torch.zeros_like(pos))  # left padding shifts every position


def positions_from_1(keep):
    return keep.long().cumsum(dim=-1).masked_fill(~keep, 0)


def positions_hf_fill(keep):
    return (keep.long().cumsum(dim=-1) - 1).masked_fill(~keep, 1)  # 1 at padding, not 0


def positions_minus_pads(keep):
    pads = (~keep).sum(dim=-1, keepdim=True)  # (B, 1): right for left padding only, negative at the pads
    return torch.arange(keep.shape[1], device=keep.device) - pads


def positions_flat_cumsum(keep):
    B, L = keep.shape
    return (keep.long().flatten().cumsum(0).view(B, L) - 1).masked_fill(~keep, 0)


def labels_not_shifted(tokens, doc_ids, ignore_index=-100):
    same = torch.zeros_like(doc_ids, dtype=torch.bool)
    same[:, :-1] = doc_ids[:, 1:] == doc_ids[:, :-1]
    return torch.where(same, tokens, ignore_index)


def labels_leak_across_documents(tokens, doc_ids, ignore_index=-100):
    labels = torch.full_like(tokens, ignore_index)
    labels[:, :-1] = tokens[:, 1:]
    return labels


def labels_border_late(tokens, doc_ids, ignore_index=-100):
    kept = torch.ones_like(doc_ids, dtype=torch.bool)
    kept[:, 1:] = doc_ids[:, 1:] == doc_ids[:, :-1]  # compares t with t - 1: one position late
    nxt = torch.cat([tokens[:, 1:], torch.full_like(tokens[:, :1], ignore_index)], dim=1)
    return torch.where(kept, nxt, ignore_index)


def labels_shifted_back(tokens, doc_ids, ignore_index=-100):
    kept = torch.zeros_like(doc_ids, dtype=torch.bool)
    kept[:, 1:] = doc_ids[:, 1:] == doc_ids[:, :-1]
    return torch.where(kept, torch.roll(tokens, 1, dims=1), ignore_index)  # the previous token


def labels_roll(tokens, doc_ids, ignore_index=-100):
    same = torch.ones_like(doc_ids, dtype=torch.bool)
    same[:, :-1] = doc_ids[:, 1:] == doc_ids[:, :-1]
    return torch.where(same, torch.roll(tokens, -1, dims=1), ignore_index)  # wraps at the end


def labels_ids_step(tokens, doc_ids, ignore_index=-100):
    same = torch.zeros_like(doc_ids, dtype=torch.bool)
    same[:, :-1] = doc_ids[:, 1:] - doc_ids[:, :-1] != 1  # a new document only where the id grows by 1
    return torch.where(same, torch.roll(tokens, -1, dims=1), ignore_index)


def labels_ignore_constant(tokens, doc_ids, ignore_index=-100):
    return ok.packed_labels(tokens, doc_ids)


def gqa_repeat(q, k, v, mask=None):
    G = q.shape[1] // k.shape[1]
    out, _ = ok.attention(q, k.repeat(1, G, 1, 1), v.repeat(1, G, 1, 1), mask)  # heads tiled 0 1 0 1
    return out


def gqa_scale_dv(q, k, v, mask=None):
    G = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(v.shape[-1])
    if mask is None:
        mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device)
    return ok.masked_softmax(scores, mask) @ v


def gqa_nan_rows(q, k, v, mask=None):
    G = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores.float(), dim=-1).to(q.dtype) @ v


def _alibi(slopes, Lq, Lk, offset, device, dtype, causal=True):
    i = torch.arange(Lq, device=device)[:, None] + offset
    j = torch.arange(Lk, device=device)[None, :]
    bias = slopes.to(device)[:, None, None] * (j - i)
    return (bias.masked_fill(j > i, float("-inf")) if causal else bias).to(dtype)


def _right_slopes(n):
    return -ok.alibi_bias(n, 2, 2)[:, 1, 0]  # row 1, key 0: -slope_h * 1


def _slopes(n):
    return torch.tensor([2 ** (-8 * (h + 1) / n) for h in range(n)])


def alibi_top_left(n_heads, Lq, Lk, *, device=None, dtype=torch.float32):
    slopes = _right_slopes(n_heads)
    return _alibi(slopes, Lq, Lk, 0, device, dtype)


def alibi_naive_slopes(n_heads, Lq, Lk, *, device=None, dtype=torch.float32):
    return _alibi(_slopes(n_heads), Lq, Lk, Lk - Lq, device, dtype)  # right only for powers of two


def alibi_odd_slopes(n_heads, Lq, Lk, *, device=None, dtype=torch.float32):
    m = 2 ** int(math.floor(math.log2(n_heads)))
    slopes = torch.cat([_slopes(m), _slopes(2 * m)[1::2][: n_heads - m]])  # [1::2]: m's slopes again
    return _alibi(slopes, Lq, Lk, Lk - Lq, device, dtype)


def alibi_positive(n_heads, Lq, Lk, *, device=None, dtype=torch.float32):
    slopes = _right_slopes(n_heads)
    return _alibi(-slopes, Lq, Lk, Lk - Lq, device, dtype)


def alibi_not_causal(n_heads, Lq, Lk, *, device=None, dtype=torch.float32):
    slopes = _right_slopes(n_heads)
    return _alibi(slopes, Lq, Lk, Lk - Lq, device, dtype, causal=False)


def alibi_key_form(n_heads, Lq, Lk, *, device=None, dtype=torch.float32):
    slopes = _right_slopes(n_heads).to(device)
    i = torch.arange(Lq, device=device)[:, None] + Lk - Lq
    j = torch.arange(Lk, device=device)[None, :]
    return (slopes[:, None, None] * j).masked_fill(j > i, float("-inf")).to(dtype)


def alibi_reversed(n_heads, Lq, Lk, *, device=None, dtype=torch.float32):
    return ok.alibi_bias(n_heads, Lq, Lk, device=device, dtype=dtype).flip(0)


def alibi_finite(n_heads, Lq, Lk, *, device=None, dtype=torch.float32):
    bias = ok.alibi_bias(n_heads, Lq, Lk, device=device, dtype=dtype)
    return bias.clamp(min=torch.finfo(dtype).min)
