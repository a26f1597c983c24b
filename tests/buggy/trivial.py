"""Submissions that implement nothing: each returns outputs of the contract's shape,
dtype and device, but none of them computes what the exercise asks for.

Grader fixture: every one of them must score (about) zero, because points come
from outputs that agree with the reference, never from properties alone
(dtype, device, inputs unchanged, invariances), which such code meets for free.

``TRIVIAL[style][exercise]`` is a function with the exercise's signature. Styles:

* ``false`` / ``true`` / ``zeros`` / ``ones``: constants of the right shape and dtype;
* ``random``: random values of the right shape and dtype (a fresh draw per call);
* ``identity``: the inputs handed back (the mask, the scores, q, lengths, ...),
  or, where the mask is the point, the same computation with no mask at all
  (unmasked softmax, attention, multi-head attention);
* ``transposed``: the reference mask transposed (the triangle on the wrong side).
"""

from __future__ import annotations

import math

import torch

import attnmask as am

FLOAT = torch.float32


def _float_of(*tensors) -> torch.dtype:
    floats = (t.dtype for t in tensors if isinstance(t, torch.Tensor) and t.dtype.is_floating_point)
    return next(floats, FLOAT)


def _dev(*tensors, device=None):
    if device is not None:
        return torch.device(device)
    return next((t.device for t in tensors if isinstance(t, torch.Tensor)), torch.device("cpu"))


def _shapes(name: str, args: tuple, kwargs: dict) -> tuple[list[tuple[tuple, torch.dtype]], torch.device]:
    """The contract's output shapes and dtypes of exercise ``name`` for this call."""
    dev = _dev(*args, device=kwargs.get("device"))
    if name in ("causal_mask", "sliding_window_mask", "prefix_lm_mask"):
        n = int(args[0])
        return [((n, n), torch.bool)], dev
    if name == "influence_matrix":
        x = args[1]
        return [((x.shape[0], x.shape[0]), x.dtype)], dev
    if name == "to_additive":
        mask = args[0]
        dtype = args[1] if len(args) > 1 else kwargs.get("dtype", FLOAT)
        return [(tuple(mask.shape), dtype)], dev
    if name == "masked_softmax":
        return [(tuple(args[0].shape), args[0].dtype)], dev
    if name == "tiled_attention":
        q, v = args[0], args[2]
        return [((*q.shape[:-1], v.shape[-1]), q.dtype)], dev
    if name in ("attention", "kv_cache_attention"):
        q, k, v = args[0], args[1], args[2]
        lead, lq = tuple(q.shape[:-2]), q.shape[-2]
        if name == "attention":
            return [((*lead, lq, v.shape[-1]), q.dtype), ((*lead, lq, k.shape[-2]), q.dtype)], dev
        k_cache = args[3]
        total = k_cache.shape[-2] + k.shape[-2]
        return [((*lead, lq, v.shape[-1]), q.dtype), ((*lead, total, k.shape[-1]), q.dtype),
                ((*lead, total, v.shape[-1]), q.dtype)], dev
    if name == "padding_mask":
        return [((args[0].shape[0], int(args[1])), torch.bool)], dev
    if name == "decoder_mask":
        L = int(args[1])
        return [((args[0].shape[0], 1, L, L), torch.bool)], dev
    if name == "encoder_decoder_masks":
        src, _tgt, S, T = args[0], args[1], int(args[2]), int(args[3])
        B = src.shape[0]
        return [((B, 1, S, S), torch.bool), ((B, 1, T, T), torch.bool), ((B, 1, T, S), torch.bool)], dev
    if name == "multi_head_attention":
        x_q = args[0]
        return [(tuple(x_q.shape), x_q.dtype)], dev
    if name == "document_mask":
        B, L = args[0].shape
        return [((B, 1, L, L), torch.bool)], dev
    if name == "padded_encoder":
        return [(tuple(args[0].shape), args[0].dtype)], dev
    if name == "tile_lists":
        B, H, Lq, Lk = args[0].shape
        tile = args[1] if len(args) > 1 else kwargs.get("tile", 64)
        counts, indices = (B, H, -(-Lq // tile)), (B, H, -(-Lq // tile), -(-Lk // tile))
        return [(counts, torch.int32), (indices, torch.int32)] * 2, dev
    raise KeyError(name)


def _constant(name: str, fill):
    def fn(*args, **kwargs):
        specs, dev = _shapes(name, args, kwargs)
        outs = tuple(fill(shape, dtype, dev) for shape, dtype in specs)
        return outs[0] if len(outs) == 1 else outs

    fn.__name__ = name
    return fn


def _random(shape, dtype, dev):
    if dtype == torch.bool:
        return torch.rand(shape, device=dev) < 0.5
    return torch.randn(shape, device=dev).to(dtype)


FILLS = {
    "false": lambda s, d, dev: torch.zeros(s, dtype=d, device=dev),
    "true": lambda s, d, dev: torch.ones(s, dtype=d, device=dev),
    "zeros": lambda s, d, dev: torch.zeros(s, dtype=d, device=dev),
    "ones": lambda s, d, dev: torch.ones(s, dtype=d, device=dev) / (s[-1] if d.is_floating_point and s else 1)
    if d.is_floating_point else torch.ones(s, dtype=d, device=dev),
    "random": _random,
}


def _batched(mask: torch.Tensor, B: int) -> torch.Tensor:
    """(L, L) -> (B, 1, L, L)"""
    return mask[None, None].expand(B, 1, *mask.shape)


def _unmasked_attention(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    weights = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    return weights @ v, weights


def _unmasked_mha(x_q, x_kv, w_q, w_k, w_v, w_o, n_heads, mask=None):
    B, Lq, D = x_q.shape
    d = D // n_heads

    def split(x):  # (B, L, D) -> (B, H, L, d)
        return x.view(B, -1, n_heads, d).transpose(1, 2)

    out, _ = _unmasked_attention(split(x_q @ w_q.T), split(x_kv @ w_k.T), split(x_kv @ w_v.T))
    return out.transpose(1, 2).reshape(B, Lq, D) @ w_o.T


def _unmasked_encoder(x, weights):
    for wq, wk, wv in weights:
        scores = (x @ wq) @ (x @ wk).transpose(-2, -1) / math.sqrt(x.shape[-1])
        x = x + torch.softmax(scores, dim=-1) @ (x @ wv)
    return x


def _every_tile_full(mask, tile=64):
    (counts, _), (indices, _) = _shapes("tile_lists", (mask, tile), {})[0][:2]
    nk = indices[-1]
    listed = torch.arange(nk, dtype=torch.int32, device=mask.device).expand(indices).contiguous()
    none = torch.zeros(counts, dtype=torch.int32, device=mask.device)
    return none, listed, none + nk, listed.clone()


IDENTITY = {
    "causal_mask": _constant("causal_mask", FILLS["true"]),
    "influence_matrix": lambda f, x: torch.eye(x.shape[0], dtype=x.dtype, device=x.device),
    "to_additive": lambda mask, dtype=FLOAT: mask.to(dtype),
    "masked_softmax": lambda scores, mask: torch.softmax(scores.float(), dim=-1).to(scores.dtype),
    "attention": _unmasked_attention,
    "padding_mask": _constant("padding_mask", FILLS["true"]),
    "decoder_mask": lambda lengths, max_len: _batched(am.causal_mask(max_len, device=lengths.device),
                                                      lengths.shape[0]),
    "encoder_decoder_masks": _constant("encoder_decoder_masks", FILLS["true"]),
    "multi_head_attention": _unmasked_mha,
    "kv_cache_attention": lambda q, k_new, v_new, k_cache, v_cache: (
        q, torch.cat([k_cache, k_new], dim=-2), torch.cat([v_cache, v_new], dim=-2)),
    "sliding_window_mask": lambda n, window, *, device=None: am.causal_mask(n, device=device),
    "prefix_lm_mask": lambda n, prefix_len, *, device=None: am.causal_mask(n, device=device),
    "document_mask": lambda doc_ids: _batched(am.causal_mask(doc_ids.shape[1], device=doc_ids.device),
                                              doc_ids.shape[0]),
    "tiled_attention": lambda q, k, v, mask=None, tile=64: _unmasked_attention(q, k, v)[0],
    "padded_encoder": lambda x, lengths, weights: _unmasked_encoder(x, weights),
    "tile_lists": _every_tile_full,
}
"""Where the mask is the point, the exercise computed as if there were none: the
plain causal triangle for the masks built on top of it, unmasked softmax and
attention, and the caches concatenated around an output that is just q."""


def _t(mask: torch.Tensor) -> torch.Tensor:
    return mask.transpose(-2, -1)


TRANSPOSED = {
    "causal_mask": lambda n, *, device=None: _t(am.causal_mask(n, device=device)),
    "decoder_mask": lambda lengths, max_len: _t(am.decoder_mask(lengths, max_len)),
    "sliding_window_mask": lambda n, w, *, device=None: _t(am.sliding_window_mask(n, w, device=device)),
    "prefix_lm_mask": lambda n, p, *, device=None: _t(am.prefix_lm_mask(n, p, device=device)),
    "document_mask": lambda doc_ids: _t(am.document_mask(doc_ids)),
}

# chapter 9's trivial code is in tests/test_real_models.py
EXERCISES = (*am.CONTRACT[:am.CONTRACT.index("document_mask") + 1], "tiled_attention")

#: The diagnosis exercises answer with a plain value: the constants (and a random answer) they can give.
ANSWERS = {
    "find_leaking_layer": {"false": None, "true": 0, "zeros": 0, "ones": 1,
                           "random": lambda: [None, 0, 1, 2, 3][int(torch.randint(0, 5, ()))]},
    "leaks_across_padding": {"false": False, "true": True, "zeros": False, "ones": True,
                             "random": lambda: bool(torch.rand(()) < 0.5)},
}


def _answer(name: str, style: str):
    value = ANSWERS[name][style]

    def fn(*args, **kwargs):
        return value() if callable(value) else value

    fn.__name__ = name
    return fn


TRIVIAL: dict[str, dict[str, object]] = {
    **{style: {name: _answer(name, style) if name in ANSWERS else _constant(name, fill) for name in EXERCISES}
       for style, fill in FILLS.items()},
    "identity": IDENTITY,
    "transposed": TRANSPOSED,
}
