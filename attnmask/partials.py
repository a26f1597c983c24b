"""Attention over a part of the keys, and putting parts back together (chapter 11).

A softmax over a row of scores ``s`` is ``exp(s - lse)`` with
``lse = log(sum(exp(s)))``, the row's log-sum-exp. Attention that also returns
its LSE can be computed over any part of the keys and merged later: the output
over two disjoint key sets is the LSE-weighted mean of the two outputs,

    lse = log(exp(lse1) + exp(lse2))
    out = exp(lse1 - lse) * out1 + exp(lse2 - lse) * out2

which is what split-KV decoding (Flash-Decoding), shared-prefix (cascade)
attention and ring attention do. A part with no allowed key has ``lse = -inf``
and ``out = 0``; two such parts merge to ``lse = -inf`` and ``out = 0``, not to
the NaN of ``exp(-inf - (-inf))``.

* :func:`attention_lse`: masked attention returning ``(out, lse)``.
* :func:`merge_partials`: two partial results over disjoint keys -> one.
* :func:`merge_all`: any number of them, in order.
* :func:`split_kv_attention`: the keys cut into ``splits`` parts, each attended
  alone, then merged (Flash-Decoding's plan).
* :func:`cascade_attention`: one decoding step of N sequences that share a prefix: the
  prefix's keys read once for all N queries, each suffix alone, the two merged.
"""

from __future__ import annotations

import math

import torch

from .attention import check_qkv
from .masks import broadcast_mask
from .softmax import masked_softmax

__all__ = ["attention_lse", "cascade_attention", "merge_all", "merge_partials", "split_kv_attention"]


def _wide(dtype: torch.dtype) -> torch.dtype:
    """float32 for float32/float16/bfloat16, float64 for float64: where the LSE lives."""
    return torch.promote_types(dtype, torch.float32)


def attention_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked scaled dot-product attention that also returns each row's log-sum-exp.

    Args:
        q: ``(B, H, Lq, d)``; k: ``(B, H, Lk, d)``; v: ``(B, H, Lk, dv)``, one dtype
            and device.
        mask: bool, True = may attend, broadcastable to ``(B, H, Lq, Lk)``; or None.

    Returns:
        ``(out, lse)``: ``out (B, H, Lq, dv)`` in q's dtype, zeros for a fully masked
        row; ``lse (B, H, Lq)`` float32 (float64 for float64 inputs): the natural log
        of the sum over the row's allowed keys of ``exp(q·k / sqrt(d))``, ``-inf`` for
        a fully masked row (every row, when Lk = 0). float16/bfloat16 are computed in
        float32. Gradients are finite, and zero for fully masked rows.
    """
    check_qkv(q, k, v)
    work = _wide(q.dtype)
    if k.shape[-2] == 0:  # a part with no key at all: every row is empty
        return q.new_zeros(*q.shape[:-1], v.shape[-1]), q.new_full(q.shape[:-1], float("-inf"), dtype=work)
    scores = (q.to(work) @ k.to(work).transpose(-2, -1)) / math.sqrt(q.shape[-1])  # (B, H, Lq, Lk)
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            got = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
            raise TypeError(f"mask must be torch.bool (True = may attend); got {got}")
        mask = broadcast_mask(mask, scores.shape)
        scores = scores.masked_fill(~mask, float("-inf"))
    empty = torch.isneginf(scores).all(dim=-1)  # (B, H, Lq): no allowed key
    # logsumexp of an all -inf row is -inf, but its backward is NaN: give such rows
    # finite scores, and put -inf back where no gradient can reach.
    lse = torch.logsumexp(scores.masked_fill(empty[..., None], 0.0), dim=-1).masked_fill(empty, float("-inf"))
    weights = masked_softmax(scores, None if mask is None else mask)  # (B, H, Lq, Lk), 0 on empty rows
    out = weights @ v.to(work)  # (B, H, Lq, dv)
    return out.to(q.dtype), lse


def merge_partials(
    out1: torch.Tensor, lse1: torch.Tensor, out2: torch.Tensor, lse2: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over two disjoint key sets, merged into attention over their union.

    Args:
        out1, out2: ``(..., Lq, dv)``, one dtype: the outputs over each key set
            (0 where a set held no allowed key).
        lse1, lse2: ``(..., Lq)`` float32: their log-sum-exps (-inf where empty).

    Returns:
        ``(out (..., Lq, dv) in out1's dtype, lse (..., Lq) float32)``, computed in
        float32: ``lse = log(exp(lse1) + exp(lse2))``, ``out = exp(lse1 - lse) * out1
        + exp(lse2 - lse) * out2``; out 0 and lse -inf where both are empty. Stable
        for any finite lse (the larger one is subtracted first). Raises ValueError on
        mismatched shapes.
    """
    for name, t in (("out1", out1), ("lse1", lse1), ("out2", out2), ("lse2", lse2)):
        if not isinstance(t, torch.Tensor) or not t.dtype.is_floating_point:
            raise TypeError(f"{name} must be a floating tensor; got {getattr(t, 'dtype', type(t).__name__)}")
    if out1.shape != out2.shape or lse1.shape != lse2.shape or out1.dim() < 1 \
            or tuple(lse1.shape) != tuple(out1.shape[:-1]):
        raise ValueError(f"out1 {tuple(out1.shape)} and out2 {tuple(out2.shape)} must be (..., Lq, dv), "
                         f"lse1 {tuple(lse1.shape)} and lse2 {tuple(lse2.shape)} (..., Lq), one (..., Lq)")
    work = _wide(torch.promote_types(out1.dtype, lse1.dtype))
    l1, l2 = lse1.to(work), lse2.to(work)
    # The larger LSE is the shift (it cancels; no gradient through it). Where both are
    # -inf, shift by 0 so that exp(-inf - 0) = 0 instead of exp(-inf - (-inf)) = NaN.
    m = torch.maximum(l1, l2).detach()
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    w1, w2 = torch.exp(l1 - m), torch.exp(l2 - m)  # (..., Lq), in [0, 1]
    total = w1 + w2
    empty = total == 0
    total = total.masked_fill(empty, 1.0)  # divide by 1, not by 0, where both parts are empty
    lse = (m + torch.log(total)).masked_fill(empty, float("-inf"))
    out = (w1 / total)[..., None] * out1.to(work) + (w2 / total)[..., None] * out2.to(work)
    return out.to(out1.dtype), lse.to(_wide(lse1.dtype))


def merge_all(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`merge_partials` folded over ``parts``, a list of ``(out, lse)`` over disjoint keys."""
    if not parts:
        raise ValueError("merge_all needs at least one (out, lse) part")
    out, lse = parts[0]
    for o, s in parts[1:]:
        out, lse = merge_partials(out, lse, o, s)
    return out, lse


def split_kv_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None, splits: int = 2
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention with the keys cut into ``splits`` contiguous parts, each attended alone (on
    its own core, in Flash-Decoding) and merged: equal to :func:`attention_lse` over all keys.
    Shapes as for :func:`attention_lse`; a part may hold no allowed key."""
    Lk = k.shape[-2]
    full = None if mask is None else broadcast_mask(mask, (*q.shape[:-1], Lk))
    edges = [round(i * Lk / splits) for i in range(splits + 1)]
    parts = []
    for a, b in zip(edges, edges[1:]):
        if b > a:
            part_mask = None if full is None else full[..., a:b]
            parts.append(attention_lse(q, k[..., a:b, :], v[..., a:b, :], part_mask))
    return merge_all(parts)


def cascade_attention(
    q: torch.Tensor, prefix_k: torch.Tensor, prefix_v: torch.Tensor, suffix_k: torch.Tensor,
    suffix_v: torch.Tensor, suffix_lengths: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoding step of N sequences that share a prefix (cascade, or shared-prefix, attention).

    Args:
        q: ``(N, H, d)``: the new token's query of each of the N sequences.
        prefix_k: ``(H, P, d)``, prefix_v: ``(H, P, dv)``: the shared prefix, stored once, P >= 1.
        suffix_k: ``(N, H, S, d)``, suffix_v: ``(N, H, S, dv)``: each sequence's own keys after the
            prefix, padded on the right to S.
        suffix_lengths: long ``(N,)``, 0 <= n <= S: how many of sequence n's S suffix keys are real
            (the rest is padding, never attended).

    Returns:
        ``(out (N, H, dv) in q's dtype, lse (N, H) float32)`` (float64 for float64 inputs): each
        query attended over the whole prefix and its own real suffix keys, equal to
        :func:`attention_lse` over their concatenation. The prefix is attended by all N queries
        in one product (its keys read once, not once per sequence), each suffix by its own query,
        and the two partial results merged (:func:`merge_partials`). Raises ValueError on
        shapes that do not fit together or lengths outside 0 .. S.
    """
    for name, t, dims in (("q", q, 3), ("prefix_k", prefix_k, 3), ("prefix_v", prefix_v, 3),
                          ("suffix_k", suffix_k, 4), ("suffix_v", suffix_v, 4)):
        if not isinstance(t, torch.Tensor) or t.dim() != dims:
            raise ValueError(f"{name} must be a {dims}-D tensor; got {getattr(t, 'shape', type(t).__name__)}")
    N, H, d = q.shape
    P, S = prefix_k.shape[1], suffix_k.shape[2]
    if (tuple(prefix_k.shape) != (H, P, d) or prefix_v.shape[:2] != (H, P) or P < 1
            or tuple(suffix_k.shape) != (N, H, S, d) or tuple(suffix_v.shape[:3]) != (N, H, S)
            or suffix_v.shape[-1] != prefix_v.shape[-1]):
        raise ValueError(f"expected q (N, H, d), prefix_k (H, P, d), prefix_v (H, P, dv), "
                         f"suffix_k (N, H, S, d), suffix_v (N, H, S, dv) with P >= 1; got "
                         f"q {tuple(q.shape)}, prefix_k {tuple(prefix_k.shape)}, "
                         f"prefix_v {tuple(prefix_v.shape)}, suffix_k {tuple(suffix_k.shape)}, "
                         f"suffix_v {tuple(suffix_v.shape)}")
    if not isinstance(suffix_lengths, torch.Tensor) or tuple(suffix_lengths.shape) != (N,) \
            or suffix_lengths.dtype.is_floating_point \
            or bool(((suffix_lengths < 0) | (suffix_lengths > S)).any()):
        raise ValueError(f"suffix_lengths must be an integer (N,) = ({N},) tensor with values in "
                         f"0 .. S = {S}; got {suffix_lengths!r}")
    # The prefix: the N queries are one block of rows (1, H, N, d) against the H prefix heads.
    shared_out, shared_lse = attention_lse(q.transpose(0, 1)[None], prefix_k[None], prefix_v[None])
    shared = (shared_out[0].transpose(0, 1), shared_lse[0].transpose(0, 1))  # (N, H, dv), (N, H)
    real = torch.arange(S, device=q.device) < suffix_lengths.to(q.device)[:, None]  # (N, S)
    # each sequence's own suffix: its one query against its S keys, the padding masked
    own_out, own_lse = attention_lse(q[:, :, None], suffix_k, suffix_v, real[:, None, None, :])
    return merge_partials(*shared, own_out[:, :, 0], own_lse[:, :, 0])
