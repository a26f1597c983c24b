"""Masks as predicates: one definition per mask, many materialisations.

A *mask function* answers "may query ``q_idx`` attend to key ``kv_idx``?" for
batch element ``b`` and head ``h``::

    mask_fn(b, h, q_idx, kv_idx) -> bool tensor     # True = may attend

It is written with tensor operations only (``<=``, ``&``, ``|``, indexing), so
the same function works in two places:

* :func:`materialize` calls it once on broadcast index tensors
  ``b (B, 1, 1, 1)``, ``h (1, H, 1, 1)``, ``q_idx (Lq, 1)``, ``kv_idx (Lk,)`` and
  gets a dense boolean mask that broadcasts to ``(B, H, Lq, Lk)``;
* :func:`block_mask` hands it to FlexAttention's ``create_block_mask``, which
  evaluates it on scalars and records which ``(q, kv)`` tiles are empty, so the
  kernel can skip them.

This is the design of PyTorch's FlexAttention ``mask_mod`` and of Hugging Face's
``masking_utils``. Every dense builder in :mod:`attnmask.masks` is a
materialisation of a predicate defined here.

Each builder labels the function it returns with what it is: ``fn.kind`` (the
builder's name, e.g. ``"causal"``) and ``fn.params`` (its arguments, e.g.
``{"offset": 0}``); see :func:`kind_of`. The function stays a plain function,
so FlexAttention takes it as it is, and ``attention(..., need_weights=False)``
reads the label to pick a kernel that needs no ``(Lq, Lk)`` mask at all (see
:mod:`attnmask.dispatch`). A predicate written by hand has no label and is
treated as ``"custom"``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

MaskFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

__all__ = [
    "MaskFn",
    "and_masks",
    "block_diffusion",
    "block_mask",
    "causal",
    "chunked_local",
    "document",
    "key_padding",
    "kind_of",
    "materialize",
    "or_masks",
    "prefix_lm",
    "sliding_window",
]


def _labelled(kind: str, **params: Any) -> Callable[[MaskFn], MaskFn]:
    """Decorator: record ``fn.kind = kind`` and ``fn.params = params`` on a predicate."""

    def label(fn: MaskFn) -> MaskFn:
        fn.kind, fn.params = kind, params
        return fn

    return label


def kind_of(mask_fn: MaskFn) -> tuple[str, dict[str, Any]]:
    """``(kind, params)`` of a predicate built here, e.g. ``("causal", {"offset": 0})``,
    ``("and", {"parts": (fn1, fn2)})``; ``("custom", {})`` for any other function."""
    return getattr(mask_fn, "kind", "custom"), getattr(mask_fn, "params", {})


def causal(offset: int = 0) -> MaskFn:
    """Causal predicate: key ``kv_idx`` is visible from query ``q_idx`` when
    ``kv_idx <= q_idx + offset``.

    ``offset = 0`` is the square (and top-left aligned) triangle. With a KV cache
    the ``Lq`` new queries are the *last* ``Lq`` of ``Lk`` positions, so the
    triangle must be bottom-right aligned: ``offset = Lk - Lq``.
    """

    @_labelled("causal", offset=offset)
    def mask_fn(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + offset

    return mask_fn


def sliding_window(window: int) -> MaskFn:
    """Causal sliding window of ``window`` keys, *counting the query itself*:
    ``kv_idx <= q_idx`` and ``q_idx - kv_idx < window``. ``window = 1`` sees only
    itself; ``window >= L`` is plain causal."""
    if window < 1:
        raise ValueError(f"window must be >= 1 (it counts the query itself); got {window}")

    @_labelled("sliding_window", window=window)
    def mask_fn(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (q_idx - kv_idx < window)

    return mask_fn


def chunked_local(chunk: int, offset: int = 0) -> MaskFn:
    """Chunked local attention (Llama 4's local layers): query ``q_idx`` sits at position
    ``p = q_idx + offset`` and sees key ``kv_idx`` when ``kv_idx <= p`` and both lie in the
    same chunk of ``chunk`` positions (``kv_idx // chunk == p // chunk``). Unlike a sliding
    window, the first query of a chunk sees only itself, whatever came before."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1; got {chunk}")

    @_labelled("chunked_local", chunk=chunk, offset=offset)
    def mask_fn(b, h, q_idx, kv_idx):
        p = q_idx + offset
        return (kv_idx <= p) & (kv_idx // chunk == p // chunk)

    return mask_fn


def prefix_lm(prefix_len: int) -> MaskFn:
    """Prefix-LM: the first ``prefix_len`` positions are visible to every query
    (bidirectional prompt), the rest is causal: ``kv_idx <= q_idx or kv_idx < prefix_len``."""
    prefix = lambda b, h, q_idx, kv_idx: kv_idx < prefix_len  # noqa: E731
    return _labelled("prefix_lm", prefix_len=prefix_len)(or_masks(causal(), prefix))


def key_padding(lengths: torch.Tensor) -> MaskFn:
    """Key padding from per-sequence lengths ``lengths (B,)``: key ``kv_idx`` of
    sequence ``b`` is real when ``kv_idx < lengths[b]``. Queries are never masked
    here: a padded query row still sees the real keys, and its output is ignored
    downstream."""

    @_labelled("key_padding", lengths=lengths)
    def mask_fn(b, h, q_idx, kv_idx):
        return kv_idx < lengths[b]

    return mask_fn


def document(doc_ids: torch.Tensor) -> MaskFn:
    """Packed documents, ``doc_ids (B, L)``: causal *within* a document, nothing
    across documents. Equal ids mean the same document; ids need not be sorted
    or contiguous."""
    same_doc = lambda b, h, q_idx, kv_idx: doc_ids[b, q_idx] == doc_ids[b, kv_idx]  # noqa: E731
    return _labelled("document", doc_ids=doc_ids)(and_masks(causal(), same_doc))


def block_diffusion(L: int, block: int) -> MaskFn:
    """Block Diffusion's (BD3-LM's) training mask over ``[x_noisy (L), x_clean (L)]``:
    index ``t < L`` is noisy token t, ``t >= L`` clean token ``t - L``; both belong to block
    ``(t mod L) // block``. A noisy token sees the noisy tokens of its own block (both ways)
    and the clean tokens of strictly earlier blocks; a clean token sees the clean tokens of
    its own and earlier blocks (block-causal); no clean token sees a noisy one."""
    if block < 1:
        raise ValueError(f"block must be >= 1; got {block}")

    @_labelled("block_diffusion", L=L, block=block)
    def mask_fn(b, h, q_idx, kv_idx):
        q_clean, kv_clean = q_idx >= L, kv_idx >= L
        q_blk, kv_blk = (q_idx % L) // block, (kv_idx % L) // block
        own_noisy = ~q_clean & ~kv_clean & (q_blk == kv_blk)
        earlier_clean = ~q_clean & kv_clean & (kv_blk < q_blk)
        block_causal = q_clean & kv_clean & (kv_blk <= q_blk)
        return own_noisy | earlier_clean | block_causal

    return mask_fn


def and_masks(*mask_fns: MaskFn) -> MaskFn:
    """A key is visible when *every* predicate allows it (logical AND)."""
    if not mask_fns:
        raise ValueError("and_masks needs at least one mask function")

    @_labelled("and", parts=mask_fns)
    def mask_fn(b, h, q_idx, kv_idx):
        out = mask_fns[0](b, h, q_idx, kv_idx)
        for fn in mask_fns[1:]:
            out = out & fn(b, h, q_idx, kv_idx)
        return out

    return mask_fn


def or_masks(*mask_fns: MaskFn) -> MaskFn:
    """A key is visible when *any* predicate allows it (logical OR)."""
    if not mask_fns:
        raise ValueError("or_masks needs at least one mask function")

    @_labelled("or", parts=mask_fns)
    def mask_fn(b, h, q_idx, kv_idx):
        out = mask_fns[0](b, h, q_idx, kv_idx)
        for fn in mask_fns[1:]:
            out = out | fn(b, h, q_idx, kv_idx)
        return out

    return mask_fn


def materialize(
    mask_fn: MaskFn,
    Lq: int,
    Lk: int,
    *,
    B: int = 1,
    H: int = 1,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Evaluate ``mask_fn`` on every ``(b, h, q, kv)`` at once.

    Returns:
        bool tensor, True = may attend, that broadcasts to ``(B, H, Lq, Lk)``.
        Its shape is the smallest the predicate needs: ``(Lq, Lk)`` when it
        ignores ``b`` and ``h``, ``(B, 1, Lq, Lk)`` when it reads ``b``,
        ``(B, 1, 1, Lk)`` when it reads only ``b`` and ``kv_idx``.

    No value is read back into Python, so this runs on any device, ``meta``
    included.
    """
    ar = lambda n: torch.arange(n, device=device)  # noqa: E731
    b = ar(B).view(B, 1, 1, 1)
    h = ar(H).view(1, H, 1, 1)
    q_idx = ar(Lq).view(Lq, 1)
    kv_idx = ar(Lk)
    mask = torch.as_tensor(mask_fn(b, h, q_idx, kv_idx), device=device)
    if mask.dtype != torch.bool:
        raise TypeError(f"mask function returned {mask.dtype}; expected torch.bool (True = may attend)")
    if mask.dim() < 2:
        mask = mask.expand(Lq, Lk)
    return mask


def block_mask(
    mask_fn: MaskFn,
    Lq: int,
    Lk: int,
    *,
    B: int | None = None,
    H: int | None = None,
    device: torch.device | str = "cpu",
    block_size: int = 128,
):
    """Turn the same predicate into FlexAttention's block-sparse ``BlockMask``.

    ``B``/``H`` of ``None`` broadcast over batch and heads. The ``BlockMask``
    keeps, per tile of ``block_size x block_size`` scores, whether it is empty,
    full or partial; ``flex_attention`` skips empty tiles entirely.
    """
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(
        mask_fn, B, H, Lq, Lk, device=str(device) if device is not None else "cpu",
        BLOCK_SIZE=block_size,
    )
