"""Grader fixture: every route to PyTorch's fused attention that does not spell its name.

Each exercise reaches ``scaled_dot_product_attention`` (or a kernel under it, or fused
masked softmax) another way: through ``torch.ops.aten`` with the name built at run time,
through the stand-in's closure, ``__wrapped__`` or ``__globals__``, through a kernel
under SDPA, from code compiled with a file name inside ``grader/``, or through the
``__bases__`` of the class stand-in. None may score: the rule holds whatever the route,
because the operators themselves are blocked. The static scan sees none of these names.
"""

import math
import os
import sys

import torch
import torch.nn.functional as F

ATEN = getattr(torch.ops, "at" + "en")
NAME = "scaled_dot_" + "product_attention"


def _real_sdpa():
    """The real function, if the stand-in kept it anywhere."""
    stand_in = getattr(F, NAME)
    for cell in stand_in.__closure__ or ():
        try:
            value = cell.cell_contents
        except ValueError:
            continue
        if callable(value) and getattr(value, "__name__", "") == NAME:
            return value
    return getattr(stand_in, "__wrapped__", None) or stand_in.__globals__.get("original") or stand_in


def masked_softmax(scores, mask):
    # fused masked softmax: mask_type 2 = a mask of the scores' own shape, True = masked out
    w = torch._masked_softmax(scores.float(), ~mask.expand(scores.shape), scores.dim() - 1, 2)
    return w.nan_to_num(0.0).to(scores.dtype)


def attention(q, k, v, mask=None):
    out = getattr(ATEN, NAME)(q, k, v, attn_mask=mask)  # torch.ops.aten, the name built at run time
    w = torch.softmax((q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1]), dim=-1)
    return out, w


def multi_head_attention(x_q, x_kv, w_q, w_k, w_v, w_o, n_heads, mask=None):
    B, Lq, D = x_q.shape
    Lk, d = x_kv.shape[1], D // n_heads
    q = (x_q @ w_q.T).view(B, Lq, n_heads, d).transpose(1, 2)
    k = (x_kv @ w_k.T).view(B, Lk, n_heads, d).transpose(1, 2)
    v = (x_kv @ w_v.T).view(B, Lk, n_heads, d).transpose(1, 2)
    out = _real_sdpa()(q, k, v, attn_mask=mask)  # the real function, from the stand-in's closure
    return out.transpose(1, 2).reshape(B, Lq, D) @ w_o.T


def kv_cache_attention(q, k_new, v_new, k_cache, v_cache):
    k = torch.cat([k_cache, k_new], dim=2)
    v = torch.cat([v_cache, v_new], dim=2)
    n, total = q.shape[2], k.shape[2]
    i, j = torch.arange(n, device=q.device)[:, None], torch.arange(total, device=q.device)[None, :]
    mask = j <= i + total - n
    # the math kernel under SDPA, called by its own operator
    out = getattr(ATEN, "_" + NAME + "_math")(q, k, v, attn_mask=mask)[0]
    return out, k, v


# Code compiled under a grader file name, so that a check of the caller's file would let it through.
# (Assignments, not bare statements: the grader runs only a submission's definitions.)
_GRADER = next((os.path.join(p, "grader", "rules.py") for p in sys.path
                if p and os.path.exists(os.path.join(p, "grader", "rules.py"))), "grader/rules.py")
_SOURCE = (f"def gqa_attention(q, k, v, mask=None):\n"
           f"    G = q.shape[1] // k.shape[1]\n"
           f"    k, v = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)\n"
           f"    return F.{NAME}(q, k, v, attn_mask=mask)\n")
_ = exec(compile(_SOURCE, _GRADER, "exec"), globals())
