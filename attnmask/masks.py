"""Dense boolean attention masks. True = may attend (PyTorch SDPA convention).

Every builder here materialises a predicate from :mod:`attnmask.predicates`,
so the dense mask and the FlexAttention block mask come from one definition.

Shape letters: B batch, H heads, Lq queries, Lk keys, L when both are equal.
Masks are returned in the smallest shape that *broadcasts* to the full
``(B, H, Lq, Lk)`` (trailing dimensions align, as in PyTorch).

Builders from integers take ``device=``; builders from tensors put the result on
the argument's device and never read tensor values back into Python, so they
work on CUDA without a sync and on the ``meta`` device.
"""

from __future__ import annotations

from typing import Literal

import torch

from . import predicates as P

__all__ = [
    "block_diffusion_mask",
    "broadcast_mask",
    "causal_mask",
    "chunked_local_mask",
    "combine_masks",
    "decoder_mask",
    "document_mask",
    "encoder_decoder_masks",
    "padding_mask",
    "prefix_lm_mask",
    "sliding_window_mask",
    "to_additive",
]

Align = Literal["bottom_right", "top_left"]


def _check_size(name: str, value: int, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a Python int; got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}; got {value}")


def _check_index_tensor(name: str, t: torch.Tensor, ndim: int, shape_doc: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor {shape_doc}; got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name} has shape {tuple(t.shape)}; expected {shape_doc}")
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise TypeError(f"{name} has dtype {t.dtype}; expected an integer tensor (torch.long)")


def causal_mask(
    n: int,
    *,
    n_keys: int | None = None,
    align: Align = "bottom_right",
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Causal mask: query i may attend key j when j <= i.

    Args:
        n: number of queries Lq.
        n_keys: number of keys Lk (default ``n``: the square mask).
        align: where the triangle sits when ``Lq != Lk``.
            ``"bottom_right"`` (default) treats the queries as the *last* Lq of
            the Lk positions: query i may see keys ``0 .. Lk - Lq + i``. This is
            what decoding with a KV cache needs (the new token sees the whole
            cache). ``"top_left"`` anchors the triangle at key 0: query i sees
            keys ``0 .. i``, which is what ``F.scaled_dot_product_attention(
            is_causal=True)`` does; with a cache it hides most of the past.
            Both agree when ``Lq == Lk``.
        device: where to build the mask.

    Returns:
        bool ``(Lq, Lk)``, True = may attend.
    """
    _check_size("n", n, 1)
    n_keys = n if n_keys is None else n_keys
    _check_size("n_keys", n_keys, 1)
    if align not in ("bottom_right", "top_left"):
        raise ValueError(f"align must be 'bottom_right' or 'top_left'; got {align!r}")
    offset = n_keys - n if align == "bottom_right" else 0
    return P.materialize(P.causal(offset), n, n_keys, device=device)


def sliding_window_mask(
    n: int, window: int, *, device: torch.device | str | None = None
) -> torch.Tensor:
    """Causal sliding window: j <= i and i - j < window (the window counts the
    query itself). Returns bool ``(L, L)``, True = may attend."""
    _check_size("n", n, 1)
    _check_size("window", window, 1)
    return P.materialize(P.sliding_window(window), n, n, device=device)


def chunked_local_mask(
    Lq: int, Lk: int, chunk: int, *, device: torch.device | str | None = None
) -> torch.Tensor:
    """Chunked local attention (Llama 4's ``attention_chunk_size``): the queries are the last
    ``Lq`` of ``Lk`` positions (query i at p = Lk - Lq + i, bottom-right), and query p sees
    key j when j <= p and ``j // chunk == p // chunk``. Returns bool ``(Lq, Lk)``, True = may
    attend. Raises ValueError when Lq < 1, Lq > Lk or chunk < 1."""
    _check_size("Lq", Lq, 1)
    _check_size("Lk", Lk, 1)
    _check_size("chunk", chunk, 1)
    if Lq > Lk:
        raise ValueError(f"Lq = {Lq} queries cannot be the last of Lk = {Lk} positions: expected Lq <= Lk")
    return P.materialize(P.chunked_local(chunk, offset=Lk - Lq), Lq, Lk, device=device)


def padded_chunked_mask(attention_mask: torch.Tensor, Lq: int, chunk: int) -> torch.Tensor:
    """Chunked local attention over left-padded rows, as transformers' ``create_chunked_causal_mask``
    builds it (``chunked_overlay`` with ``left_padding``, AND causal, AND the padding mask).

    Args:
        attention_mask: bool ``(B, Lk)``, True = a real token; a left-padded row starts with False.
        Lq: the queries are the last Lq of the Lk positions (query i at p = Lk - Lq + i).
        chunk: the chunk size.

    Returns:
        bool ``(B, 1, Lq, Lk)``, True = may attend: with ``pad_b`` the number of leading False of
        row b (its left padding; a False after the first True is a masked key and shifts nothing),
        query p of row b sees key j when ``attention_mask[b, j]``, j <= p and
        ``(j - pad_b) // chunk == (p - pad_b) // chunk``: the chunks of each row start at its
        first real token. A query at a padding position has no key (an all-False row).
        Raises ValueError unless attention_mask is bool (B, Lk), 1 <= Lq <= Lk and chunk >= 1.
    """
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.dtype != torch.bool \
            or attention_mask.dim() != 2:
        got = _describe(attention_mask)
        raise ValueError(f"attention_mask must be bool (B, Lk), True = a real token; got {got}")
    Lk = attention_mask.shape[1]
    _check_size("Lq", Lq, 1)
    _check_size("chunk", chunk, 1)
    if Lq > Lk:
        raise ValueError(f"Lq = {Lq} queries cannot be the last of Lk = {Lk} positions: expected Lq <= Lk")
    pad = (~attention_mask).long().cumprod(dim=-1).sum(dim=-1)[:, None, None, None]  # (B, 1, 1, 1)
    p = torch.arange(Lk - Lq, Lk, device=attention_mask.device)[:, None]  # (Lq, 1)
    j = torch.arange(Lk, device=attention_mask.device)[None, :]  # (1, Lk)
    same_chunk = (j - pad).div(chunk, rounding_mode="floor") == (p - pad).div(chunk, rounding_mode="floor")
    return (j <= p) & same_chunk & attention_mask[:, None, None, :]  # (B, 1, Lq, Lk)


def _describe(x) -> str:
    """``x`` in a few words for an error message: a tensor's dtype and shape, else its type."""
    if isinstance(x, torch.Tensor):
        return f"{str(x.dtype).replace('torch.', '')} {tuple(x.shape)}"
    return type(x).__name__


def block_diffusion_mask(L: int, block: int, *, device: torch.device | str | None = None) -> torch.Tensor:
    """Block Diffusion's (BD3-LM's) training mask over the concatenation ``[x_noisy (L),
    x_clean (L)]`` (see :func:`attnmask.predicates.block_diffusion`): bidirectional among the
    noisy tokens of a block, which also see the clean tokens of strictly earlier blocks;
    block-causal among the clean tokens. Returns bool ``(2L, 2L)``, True = may attend.
    Raises ValueError unless ``block`` (>= 1) divides ``L`` (>= 1)."""
    _check_size("L", L, 1)
    _check_size("block", block, 1)
    if L % block:
        raise ValueError(f"block = {block} does not divide L = {L}: the blocks must tile the sequence")
    return P.materialize(P.block_diffusion(L, block), 2 * L, 2 * L, device=device)


def prefix_lm_mask(
    n: int, prefix_len: int, *, device: torch.device | str | None = None
) -> torch.Tensor:
    """Prefix-LM: j <= i or j < prefix_len. The prefix (prompt) is attended
    bidirectionally, the rest causally. Returns bool ``(L, L)``, True = may attend."""
    _check_size("n", n, 1)
    _check_size("prefix_len", prefix_len, 0)
    if prefix_len > n:
        raise ValueError(f"prefix_len must be <= n = {n}; got {prefix_len}")
    return P.materialize(P.prefix_lm(prefix_len), n, n, device=device)


def padding_mask(lengths: torch.Tensor, max_len: int) -> torch.Tensor:
    """Per-token validity from lengths.

    Args:
        lengths: long ``(B,)``, ``0 <= lengths[b] <= max_len``.
        max_len: padded length L.

    Returns:
        bool ``(B, L)`` on ``lengths.device``: True at positions < lengths[b]
        (real tokens), False at padding. As an attention mask it applies to
        *keys*: view it as ``(B, 1, 1, L)``.
    """
    _check_index_tensor("lengths", lengths, 1, "(B,) of integer lengths")
    _check_size("max_len", max_len, 0)
    B = lengths.shape[0]
    mask = P.materialize(P.key_padding(lengths), 1, max_len, B=B, device=lengths.device)
    return mask.reshape(B, max_len)


def decoder_mask(lengths: torch.Tensor, max_len: int) -> torch.Tensor:
    """Decoder self-attention mask: causal AND key position < lengths[b].

    Padded *query* rows are not masked (they still see the real keys before
    them), so no row is ever fully masked when lengths[b] >= 1.

    Returns:
        bool ``(B, 1, L, L)``, True = may attend, on ``lengths.device``.
    """
    _check_index_tensor("lengths", lengths, 1, "(B,) of integer lengths")
    _check_size("max_len", max_len, 1)
    fn = P.and_masks(P.causal(), P.key_padding(lengths))
    return P.materialize(fn, max_len, max_len, B=lengths.shape[0], device=lengths.device)


def encoder_decoder_masks(
    src_lengths: torch.Tensor, tgt_lengths: torch.Tensor, src_len: int, tgt_len: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The three masks of an encoder-decoder Transformer.

    Args:
        src_lengths: long ``(B,)`` real source lengths, <= src_len (S).
        tgt_lengths: long ``(B,)`` real target lengths, <= tgt_len (T).

    Returns:
        ``(enc_self, dec_self, cross)``, bool, True = may attend, broadcasting to
        ``(B, 1, S, S)``, ``(B, 1, T, T)`` and ``(B, 1, T, S)``:

        * enc_self: source key padding (bidirectional);
        * dec_self: causal AND target key padding;
        * cross: source key padding, no causal part -- every target position
          may read the whole (real) source.
    """
    _check_index_tensor("src_lengths", src_lengths, 1, "(B,) of integer lengths")
    _check_index_tensor("tgt_lengths", tgt_lengths, 1, "(B,) of integer lengths")
    if src_lengths.shape != tgt_lengths.shape:
        raise ValueError(
            f"src_lengths {tuple(src_lengths.shape)} and tgt_lengths "
            f"{tuple(tgt_lengths.shape)} must both be (B,)"
        )
    _check_size("src_len", src_len, 1)
    _check_size("tgt_len", tgt_len, 1)
    B, dev = src_lengths.shape[0], src_lengths.device
    src_keys = P.key_padding(src_lengths)
    enc_self = P.materialize(src_keys, src_len, src_len, B=B, device=dev)  # (B, 1, 1, S)
    cross = P.materialize(src_keys, tgt_len, src_len, B=B, device=dev)  # (B, 1, 1, S)
    dec_self = decoder_mask(tgt_lengths, tgt_len)  # (B, 1, T, T)
    return enc_self, dec_self, cross


def document_mask(doc_ids: torch.Tensor) -> torch.Tensor:
    """Packed-document mask from ``doc_ids (B, L)``: doc_ids[b, i] == doc_ids[b, j]
    and j <= i. Block-diagonal causal when documents are contiguous; equal ids
    mean the same document even when they are not.

    Returns:
        bool ``(B, 1, L, L)``, True = may attend, on ``doc_ids.device``.
    """
    _check_index_tensor("doc_ids", doc_ids, 2, "(B, L) of integer document ids")
    B, L = doc_ids.shape
    return P.materialize(P.document(doc_ids), L, L, B=B, device=doc_ids.device)


def combine_masks(*masks: torch.Tensor) -> torch.Tensor:
    """Logical AND of boolean masks with broadcasting: a key is visible only when
    every mask allows it. ``combine_masks(causal (L, L), padding (B, 1, 1, L))``
    gives ``(B, 1, L, L)``. ``None`` entries are skipped."""
    present = [m for m in masks if m is not None]
    if not present:
        raise ValueError("combine_masks needs at least one mask")
    for i, m in enumerate(present):
        if m.dtype != torch.bool:
            raise TypeError(
                f"mask {i} has dtype {m.dtype}; combine boolean masks (True = may attend) "
                "and convert once with to_additive"
            )
    shapes = [tuple(m.shape) for m in present]
    try:
        torch.broadcast_shapes(*shapes)
    except RuntimeError:
        raise ValueError(f"masks of shapes {shapes} do not broadcast together") from None
    out = present[0]
    for m in present[1:]:
        out = out & m
    return out


def broadcast_mask(mask: torch.Tensor, shape: tuple[int, ...], what: str = "scores") -> torch.Tensor:
    """Check that ``mask`` broadcasts to ``shape`` and return the broadcast view,
    with an error that names both shapes when it does not."""
    try:
        return torch.broadcast_to(mask, shape)
    except RuntimeError:
        letters = "(B, H, Lq, Lk)" if len(shape) == 4 else "(..., Lq, Lk)"
        raise ValueError(
            f"mask has shape {tuple(mask.shape)}; expected something that broadcasts to "
            f"{what} {letters} = {tuple(shape)}. A (B, L) padding mask needs "
            "mask[:, None, None, :] to become (B, 1, 1, L)."
        ) from None


def to_additive(mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Boolean mask -> additive bias of ``dtype`` on the mask's device.

    0 where True (may attend), ``-inf`` where False, so that
    ``softmax(scores + bias)`` gives masked keys weight exactly 0. A row with no
    True becomes all ``-inf`` and softmax returns NaN for it: use
    :func:`attnmask.masked_softmax` (or SDPA with the boolean mask), which
    returns zeros there instead.
    """
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise TypeError(f"to_additive expects a torch.bool mask (True = may attend); got {got}")
    if not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating dtype; got {dtype}")
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    return torch.where(mask, zero, torch.tensor(float("-inf"), dtype=dtype, device=mask.device))
