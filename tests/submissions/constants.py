"""A submission that implements nothing: every function returns a constant of the
contract's shape, dtype and device (all-True masks, zero tensors).

Grader fixture: it must score 0, because a constant meets every property check
(dtype, device, inputs unchanged, "changing the future never changes the past")
and properties earn nothing alone.
"""

import torch


def _true(*shape, device=None):
    return torch.ones(shape, dtype=torch.bool, device=device)


def causal_mask(n, *, device=None):
    return _true(n, n, device=device)


def influence_matrix(f, x):
    return torch.zeros(x.shape[0], x.shape[0], dtype=x.dtype, device=x.device)


def to_additive(mask, dtype=torch.float32):
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device)


def masked_softmax(scores, mask):
    return torch.zeros_like(scores)


def attention(q, k, v, mask=None):
    out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)
    return out, torch.zeros(*q.shape[:-1], k.shape[-2], dtype=q.dtype, device=q.device)


def padding_mask(lengths, max_len):
    return _true(lengths.shape[0], max_len, device=lengths.device)


def decoder_mask(lengths, max_len):
    return _true(lengths.shape[0], 1, max_len, max_len, device=lengths.device)


def encoder_decoder_masks(src_lengths, tgt_lengths, src_len, tgt_len):
    B, dev = src_lengths.shape[0], src_lengths.device
    return (_true(B, 1, src_len, src_len, device=dev), _true(B, 1, tgt_len, tgt_len, device=dev),
            _true(B, 1, tgt_len, src_len, device=dev))


def multi_head_attention(x_q, x_kv, w_q, w_k, w_v, w_o, n_heads, mask=None):
    return torch.zeros_like(x_q)


def kv_cache_attention(q, k_new, v_new, k_cache, v_cache):
    k_all, v_all = torch.cat([k_cache, k_new], dim=-2), torch.cat([v_cache, v_new], dim=-2)
    return torch.zeros(*q.shape[:-1], v_new.shape[-1], dtype=q.dtype, device=q.device), k_all, v_all


def sliding_window_mask(n, window, *, device=None):
    return _true(n, n, device=device)


def prefix_lm_mask(n, prefix_len, *, device=None):
    return _true(n, n, device=device)


def document_mask(doc_ids):
    return _true(doc_ids.shape[0], 1, doc_ids.shape[1], doc_ids.shape[1], device=doc_ids.device)
