"""Masks in real models: left-padded generation, packing, grouped-query
attention and ALiBi (chapter 9).

* :func:`left_padding_position_ids` numbers each row's real tokens 0, 1, 2, ...
  from a ``(B, L)`` keep mask (the cumulative sum of Hugging Face's
  ``attention_mask``), so a left-padded row gets the positions it would have
  alone. :func:`generate_left_padded` uses it for batched greedy decoding of a
  :class:`~attnmask.TinyDecoder` with a KV cache.
* :func:`packed_position_ids` restarts the positions at each packed document;
  :func:`packed_labels` shifts the tokens into next-token labels and puts
  ``ignore_index`` wherever the next token belongs to another document.
* :func:`gqa_attention`: query head h reads key/value head ``h // G``.
* :func:`alibi_slopes` / :func:`alibi_bias`: the causal ALiBi bias, aligned
  bottom-right so that it stays right under a KV cache.

Masks are ``torch.bool`` with True = may attend. Nothing here reads tensor
values back into Python, so every function runs on any device, ``meta``
included, and builds its tensors on the inputs' (or the requested) device.
"""

from __future__ import annotations

import math

import torch

from .attention import attention
from .cache import KVCache
from .masks import _check_index_tensor, _check_size, causal_mask
from .models import TinyDecoder

__all__ = [
    "alibi_bias",
    "alibi_slopes",
    "generate_left_padded",
    "gqa_attention",
    "left_padding_position_ids",
    "packed_labels",
    "packed_position_ids",
]


# --------------------------------------------------------------------------- positions

def _check_keep(keep: torch.Tensor) -> None:
    if not isinstance(keep, torch.Tensor) or keep.dtype != torch.bool or keep.dim() != 2:
        got = f"{tuple(keep.shape)} {keep.dtype}" if isinstance(keep, torch.Tensor) else type(keep).__name__
        raise TypeError(f"keep must be a bool (B, L) tensor, True = real token; got {got}. "
                        "From a Hugging Face attention_mask (1 = keep) use attention_mask.bool().")


def left_padding_position_ids(keep: torch.Tensor) -> torch.Tensor:
    """Position ids that skip padding, from a keep mask.

    Args:
        keep: bool ``(B, L)``, True = real token, in any pattern (left padding,
            right padding, gaps).

    Returns:
        long ``(B, L)`` on ``keep.device``: each row's real tokens numbered
        0, 1, 2, ... in order, and 0 at padding.
    """
    _check_keep(keep)
    counted = keep.long().cumsum(dim=-1) - 1  # (B, L): real tokens seen so far, minus one
    return counted.masked_fill(~keep, 0)


def packed_position_ids(doc_ids: torch.Tensor) -> torch.Tensor:
    """Positions that restart at 0 where each packed document starts.

    Args:
        doc_ids: long ``(B, L)``, non-decreasing along each row (documents are
            contiguous runs).

    Returns:
        long ``(B, L)`` on ``doc_ids.device``: t minus the index where t's
        document starts.
    """
    _check_index_tensor("doc_ids", doc_ids, 2, "(B, L) of integer document ids")
    L = doc_ids.shape[1]
    t = torch.arange(L, device=doc_ids.device).expand_as(doc_ids)  # (B, L)
    starts = torch.ones_like(doc_ids, dtype=torch.bool)
    starts[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]  # (B, L): first token of a document
    first = torch.where(starts, t, torch.zeros_like(t)).cummax(dim=1).values  # start of t's document
    return t - first


def packed_labels(tokens: torch.Tensor, doc_ids: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Next-token labels for a packed row, with no prediction across documents.

    Args:
        tokens: long ``(B, L)``.
        doc_ids: long ``(B, L)``, non-decreasing along each row.
        ignore_index: the label that ``F.cross_entropy(..., ignore_index=)`` skips.

    Returns:
        long ``(B, L)`` on ``tokens.device``: ``labels[b, t] = tokens[b, t + 1]``
        when ``doc_ids[b, t + 1] == doc_ids[b, t]``, else ``ignore_index``; the
        last column is always ``ignore_index``.
    """
    _check_index_tensor("tokens", tokens, 2, "(B, L) of token ids")
    _check_index_tensor("doc_ids", doc_ids, 2, "(B, L) of integer document ids")
    if tokens.shape != doc_ids.shape:
        raise ValueError(f"tokens {tuple(tokens.shape)} and doc_ids {tuple(doc_ids.shape)} "
                         "must both be (B, L)")
    labels = torch.full_like(tokens, ignore_index, dtype=torch.long)  # (B, L)
    same = doc_ids[:, 1:] == doc_ids[:, :-1]  # (B, L-1): t and t+1 in one document
    labels[:, :-1] = torch.where(same, tokens[:, 1:].long(), labels[:, :-1])
    return labels


# --------------------------------------------------------------------------- grouped-query attention

def gqa_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Grouped-query attention: Hq query heads share Hkv key/value heads.

    Args:
        q: ``(B, Hq, Lq, d)``; k: ``(B, Hkv, Lk, d)``; v: ``(B, Hkv, Lk, dv)``
            with ``Hq = G * Hkv``. Hkv = 1 is multi-query attention, Hkv = Hq
            plain multi-head attention.
        mask: bool, True = may attend, broadcastable to ``(B, Hq, Lq, Lk)``; or None.

    Returns:
        ``(B, Hq, Lq, dv)``: query head h attends with key/value head ``h // G``,
        scale ``1/sqrt(d)``; a fully masked query row gives zeros.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"{name} has shape {tuple(t.shape)}; expected 4 dimensions: "
                             "q (B, Hq, Lq, d), k (B, Hkv, Lk, d), v (B, Hkv, Lk, dv)")
    Hq, Hkv = q.shape[1], k.shape[1]
    if v.shape[1] != Hkv or Hkv == 0 or Hq % Hkv:
        raise ValueError(f"q has Hq = {Hq} heads, k {Hkv} and v {v.shape[1]}: k and v need the same "
                         "number Hkv of heads, and Hq must be a multiple of it (Hq = G * Hkv)")
    G = Hq // Hkv
    # Head h of q pairs with head h // G: each kv head repeated G times *in place*
    # (0 0 1 1), not tiled (0 1 0 1).
    k = k.repeat_interleave(G, dim=1)  # (B, Hq, Lk, d)
    v = v.repeat_interleave(G, dim=1)  # (B, Hq, Lk, dv)
    out, _ = attention(q, k, v, mask)
    return out  # (B, Hq, Lq, dv)


# --------------------------------------------------------------------------- ALiBi

def alibi_slopes(n_heads: int, *, device: torch.device | str | None = None,
                 dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """ALiBi's per-head slopes, ``(H,)``.

    For H a power of two, ``slope_h = 2 ** (-8 (h + 1) / H)``. Otherwise the
    slopes of m = the largest power of two below H, followed by the first
    ``H - m`` even-indexed slopes of 2m (the rule of BLOOM and transformers).
    """
    _check_size("n_heads", n_heads, 1)
    m = 2 ** int(math.floor(math.log2(n_heads)))
    h = torch.arange(1, m + 1, device=device, dtype=torch.float32)
    slopes = torch.exp2(-8.0 * h / m)  # (m,)
    if m < n_heads:
        odd = torch.arange(1, 2 * (n_heads - m), 2, device=device, dtype=torch.float32)  # 1, 3, 5, ...
        slopes = torch.cat([slopes, torch.exp2(-8.0 * odd / (2 * m))])  # even indices of 2m's slopes
    return slopes.to(dtype)


def alibi_bias(n_heads: int, Lq: int, Lk: int, *, device: torch.device | str | None = None,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Causal ALiBi additive bias, aligned bottom-right.

    Query i sits at position ``pos_q = Lk - Lq + i`` (the last Lq of Lk
    positions, as when decoding with a KV cache).

    Returns:
        ``dtype`` ``(H, Lq, Lk)`` on ``device``: ``-slope_h * (pos_q - j)`` for
        ``j <= pos_q`` and ``-inf`` for ``j > pos_q``. Add it to the scores
        ``(B, H, Lq, Lk)``.
    """
    _check_size("Lq", Lq, 1)
    _check_size("Lk", Lk, 1)
    if not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating dtype; got {dtype}")
    slopes = alibi_slopes(n_heads, device=device)  # (H,) float32
    pos_q = torch.arange(Lq, device=device)[:, None] + (Lk - Lq)  # (Lq, 1)
    j = torch.arange(Lk, device=device)[None, :]  # (1, Lk)
    behind = (j - pos_q).float()  # (Lq, Lk): -(pos_q - j), <= 0 where visible
    bias = slopes[:, None, None] * behind  # (H, Lq, Lk); +0, not -0, on the diagonal
    visible = causal_mask(Lq, n_keys=Lk, device=device)  # (Lq, Lk), bottom-right: j <= pos_q
    return bias.masked_fill(~visible, float("-inf")).to(dtype)


# --------------------------------------------------------------------------- batched generation

def decoder_logits(
    model: TinyDecoder,
    idx: torch.Tensor,
    mask: torch.Tensor | None | list,
    positions: torch.Tensor,
    caches: list | None = None,
) -> torch.Tensor:
    """:class:`~attnmask.TinyDecoder`'s forward with an explicit mask and positions.

    Args:
        idx: long ``(B, L)`` new tokens; positions: long ``(L,)`` or ``(B, L)``.
        mask: bool, True = may attend, broadcastable to ``(B, H, L, keys)``; or a
            list of such masks, one per layer (local and global layers).
        caches: one cache per layer (:class:`~attnmask.KVCache` or
            :class:`~attnmask.RollingKVCache`, written to), or None.

    Returns:
        logits ``(B, L, V)``.
    """
    masks = mask if isinstance(mask, list) else [mask] * len(model.blocks)
    x = model.embed.tok(idx) + model.embed.pos(positions)  # (B, L, D)
    for i, block in enumerate(model.blocks):
        x = block(x, masks[i], cache=caches[i] if caches else None)
    return model.head(model.ln_f(x))


@torch.no_grad()
def generate_left_padded(model: TinyDecoder, idx: torch.Tensor, keep: torch.Tensor, n_new: int, *,
                         position_ids: bool = True) -> torch.Tensor:
    """Greedy batched decoding of a :class:`~attnmask.TinyDecoder` with a KV cache.

    Args:
        idx: long ``(B, L)`` prompts, padded (any token id at padding).
        keep: bool ``(B, L)``, True = real token; padding keys are masked.
        n_new: how many tokens to append.
        position_ids: True takes positions from ``keep``
            (:func:`left_padding_position_ids`); False uses ``0 .. L-1`` for
            every row, padding included.

    Returns:
        long ``(B, L + n_new)``: the prompts followed by the greedy tokens, each
        chosen from the logits of the row's last position.
    """
    B, L = idx.shape
    caches = [KVCache() for _ in model.blocks]
    pos = left_padding_position_ids(keep) if position_ids else torch.arange(L, device=idx.device).expand(B, L)
    keys, out, step, step_pos = keep, idx, idx, pos
    for _ in range(n_new):
        n, past = step.shape[1], len(caches[0])
        mask = causal_mask(n, n_keys=past + n, device=idx.device) & keys[:, None, None, :]  # (B, 1, n, Lk)
        nxt = decoder_logits(model, step, mask, step_pos, caches)[:, -1].argmax(-1, keepdim=True)  # (B, 1)
        out = torch.cat([out, nxt], dim=1)
        keys = torch.cat([keys, torch.ones_like(keys[:, :1])], dim=1)
        step, step_pos = nxt, step_pos[:, -1:] + 1
    return out
