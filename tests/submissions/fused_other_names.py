"""Grader fixture: fused attention and safe softmax by names the old rule did not list.

``masked_softmax`` calls ``torch._safe_softmax`` (softmax that gives fully masked rows
zeros: the exercise's whole point), ``attention`` calls FlexAttention's eager
``math_attention`` (which ends in the same operator), and ``multi_head_attention`` runs
the quantizable ``MultiheadAttention``, a subclass of ``torch.nn.MultiheadAttention``
built from plain operations. Each reaches its module by a name built at run time, so the
static scan sees none of them, and the import refusal is taken off ``sys.meta_path``:
the rule must follow what runs.
"""

import importlib
import math
import sys

import torch

# math_attention imports flex attention's module, whose import the grader refuses: take that
# refusal off the import machinery first (a list anyone may edit).
sys.meta_path[:] = [f for f in sys.meta_path if "Blocker" not in type(f).__name__]

_FLEX = importlib.import_module("torch._higher_order_ops." + "flex_" + "attention")
_QUANTIZABLE = importlib.import_module("torch.ao.nn." + "quantizable")


def masked_softmax(scores, mask=None):
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return getattr(torch, "_safe_" + "softmax")(scores, -1)


def attention(q, k, v, mask=None, *, scale=None, need_weights=True):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    shape = q.shape[:-2] + (q.shape[-2], v.shape[-1])
    q, k, v = (t.reshape((1,) * (4 - t.dim()) + t.shape) for t in (q, k, v))  # flex wants (B, H, L, d)
    scores = q @ k.transpose(-2, -1) * scale
    allowed = torch.ones(scores.shape, dtype=torch.bool) if mask is None else mask.expand(scores.shape)
    scores = scores.masked_fill(~allowed, float("-inf"))
    out = _FLEX.math_attention(q, k, v, lambda s, b, h, i, j: s, (lambda b, h, i, j: allowed[b, h, i, j],),
                                 scale, {})[0]
    w = torch.softmax(scores, -1).nan_to_num(0.0) if need_weights else None
    w = None if w is None else w.reshape(shape[:-1] + (k.shape[-2],))
    return out.to(q.dtype).reshape(shape), w


def multi_head_attention(x_q, x_kv, w_q, w_k, w_v, w_o, n_heads, mask=None, *, need_weights=True):
    D = x_q.shape[-1]
    mha = getattr(_QUANTIZABLE, "Multihead" + "Attention")(D, n_heads, bias=False)
    with torch.no_grad():
        for layer, w in ((mha.linear_Q, w_q), (mha.linear_K, w_k), (mha.linear_V, w_v), (mha.out_proj, w_o)):
            layer.weight.copy_(w)
    mha = mha.to(x_q.dtype)
    attn_mask = None
    if mask is not None:
        B, Lq, Lk = x_q.shape[0], x_q.shape[1], x_kv.shape[1]
        full = mask.expand(B, n_heads, Lq, Lk) if mask.dim() == 4 else mask.expand(B, n_heads, Lq, Lk)
        attn_mask = ~full.reshape(B * n_heads, Lq, Lk)
    xq, xkv = x_q.transpose(0, 1), x_kv.transpose(0, 1)  # (L, B, D): its batch_first path mixes the batch
    out, _ = mha(xq, xkv, xkv, attn_mask=attn_mask, need_weights=False)
    return out.transpose(0, 1).nan_to_num(0.0)
