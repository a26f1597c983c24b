"""Masks in serving and multimodal models (chapter 10).

* :func:`image_blocks` / :func:`image_text_mask`: image tokens inside causal
  text. Each maximal run of image tokens is one block that attends to itself
  in both directions; text stays causal; padded keys are hidden.
* :class:`RollingKVCache` / :func:`rolling_slot_positions` /
  :func:`rolling_cache_mask`: a ring buffer of W cache slots for a sliding
  window, and the mask over its slots.
* :class:`PagedKVCache` / :func:`paged_attention`: keys and values stored in
  blocks of S slots, found through a block table per sequence.
* :func:`tree_ancestors` / :func:`tree_positions` / :func:`tree_mask`: a draft
  tree for speculative decoding, verified in one forward pass.
* :func:`decoder_logits` (defined in :mod:`attnmask.real_models`): a
  :class:`~attnmask.TinyDecoder` run with an explicit mask and explicit positions,
  over optional KV caches.

Masks are ``torch.bool`` with True = may attend. The mask builders never read
tensor values back into Python, so they run on any device, ``meta`` included.
"""

from __future__ import annotations

import torch

from . import predicates as P
from .attention import attention
from .masks import _check_index_tensor, _check_size, causal_mask
from .real_models import decoder_logits  # noqa: F401 -- part of this module's API (__all__)

__all__ = [
    "PagedKVCache",
    "RollingKVCache",
    "decoder_logits",
    "gather_blocks",
    "image_blocks",
    "image_text_mask",
    "paged_attention",
    "rolling_cache_mask",
    "rolling_slot_positions",
    "tree_ancestors",
    "tree_mask",
    "tree_positions",
]


# --------------------------------------------------------------------------- images inside text


def _check_bool(name: str, t: torch.Tensor, shape_doc: str) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.bool or t.dim() != 2:
        got = f"{tuple(t.shape)} {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise TypeError(f"{name} must be a bool {shape_doc} tensor; got {got}")


def image_blocks(is_image: torch.Tensor) -> torch.Tensor:
    """Which image block each token belongs to.

    Args:
        is_image: bool ``(B, L)``, True at image tokens.

    Returns:
        long ``(B, L)`` on ``is_image.device``: 1, 2, 3, ... numbering the
        maximal runs of consecutive image tokens of each row, 0 at text tokens.
    """
    _check_bool("is_image", is_image, "(B, L)")
    before = torch.zeros_like(is_image)
    before[:, 1:] = is_image[:, :-1]  # (B, L): the token before is an image token
    starts = is_image & ~before  # a run starts where an image token follows text (or the row's start)
    return torch.where(is_image, starts.long().cumsum(dim=-1), 0)


def image_text_mask(is_image: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Causal text with bidirectional image blocks (PaliGemma, Gemma 3).

    Args:
        is_image: bool ``(B, L)``, True at image tokens.
        attention_mask: ``(B, L)`` of 0/1 (int64 or bool), 1 = real token.

    Returns:
        bool ``(B, 1, L, L)``, True = may attend: key j is real and (j <= i, or
        i and j lie in the same maximal run of image tokens).
    """
    _check_bool("is_image", is_image, "(B, L)")
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != is_image.shape:
        got = (
            tuple(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else type(attention_mask)
        )
        raise ValueError(
            f"attention_mask must be a (B, L) tensor like is_image {tuple(is_image.shape)}; got {got}"
        )
    L = is_image.shape[1]
    block = image_blocks(is_image)  # (B, L), 0 = text
    same_image = (block[:, :, None] == block[:, None, :]) & (block[:, :, None] > 0)  # (B, L, L)
    causal = causal_mask(L, device=is_image.device)  # (L, L)
    real_key = attention_mask.bool()[:, None, :]  # (B, 1, L): padded keys hidden from every query
    return ((causal | same_image) & real_key)[:, None]  # (B, 1, L, L)


# --------------------------------------------------------------------------- rolling (ring-buffer) cache


def rolling_slot_positions(
    n_written: torch.Tensor | int, slots: int, *, device: torch.device | str | None = None
) -> torch.Tensor:
    """The position each slot of a ring buffer holds after ``n_written`` tokens.

    Token p is written to slot ``p % slots``, overwriting what was there.

    Args:
        n_written: int, or long ``(B,)``: tokens written so far (per sequence).
        slots: W, the number of slots.

    Returns:
        long ``(W,)`` (or ``(B, W)``): the largest p < n_written with
        p % W == s, or -1 for a slot not yet written.
    """
    _check_size("slots", slots, 1)
    n = torch.as_tensor(n_written, device=device)
    s = torch.arange(slots, device=n.device)
    n = n[..., None]  # (..., 1)
    last = s + torch.div(n - 1 - s, slots, rounding_mode="floor") * slots  # (..., W)
    return torch.where(s < n, last, -1)


def rolling_cache_mask(slot_pos: torch.Tensor, q_pos: torch.Tensor, window: int) -> torch.Tensor:
    """The sliding-window mask over the slots of a rolling cache.

    Args:
        slot_pos: long ``(B, W)``, the position held by each slot, -1 if empty.
        q_pos: long ``(B, Lq)``, the queries' positions (their keys already written).
        window: w >= 1; query p sees positions p - w < j <= p.

    Returns:
        bool ``(B, 1, Lq, W)``, True = may attend.
    """
    _check_index_tensor("slot_pos", slot_pos, 2, "(B, W) of positions, -1 for an empty slot")
    _check_index_tensor("q_pos", q_pos, 2, "(B, Lq) of query positions")
    _check_size("window", window, 1)
    j, p = slot_pos[:, None, :], q_pos[:, :, None]  # (B, 1, W), (B, Lq, 1)
    in_window = P.sliding_window(window)(None, None, p, j)  # p - w < j <= p
    return ((j >= 0) & in_window)[:, None]  # (B, 1, Lq, W)


class RollingKVCache:
    """A ring buffer of ``slots`` keys and values per layer, for a sliding-window layer.

    Token p goes to slot ``p % slots``; :meth:`update` has :class:`~attnmask.KVCache`'s
    interface, so a :class:`~attnmask.MultiHeadAttention` layer can write to either.
    The mask over the slots is :func:`rolling_cache_mask` of :meth:`slot_positions`.
    """

    def __init__(self, slots: int):
        _check_size("slots", slots, 1)
        self.slots, self.n = slots, 0
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.n  # tokens written, not slots held

    def update(self, k: torch.Tensor, v: torch.Tensor, *, replace: bool = False):
        """Write ``k, v (B, H, n, d)`` at positions ``len(self) ..``; return the slots ``(B, H, W, d)``."""
        if self.k is None:
            self.k = k.new_zeros(*k.shape[:2], self.slots, k.shape[3])
            self.v = v.new_zeros(*v.shape[:2], self.slots, v.shape[3])
        n = k.shape[2]
        keep = min(n, self.slots)  # of a chunk longer than the ring only the last W tokens survive
        slot = (self.n + n - keep + torch.arange(keep, device=k.device)) % self.slots
        self.k = self.k.index_copy(2, slot, k[:, :, n - keep:])
        self.v = self.v.index_copy(2, slot, v[:, :, n - keep:])
        self.n += n
        return self.k, self.v

    def slot_positions(self) -> torch.Tensor:
        """long ``(W,)``: the position each slot holds, -1 if empty."""
        return rolling_slot_positions(self.n, self.slots, device=None if self.k is None else self.k.device)


# --------------------------------------------------------------------------- paged KV cache


def gather_blocks(cache: torch.Tensor, block_table: torch.Tensor) -> torch.Tensor:
    """Each sequence's blocks, in logical order: the paged cache as one tensor per sequence.

    Args:
        cache: ``(N, H, S, d)``, N physical blocks of S slots.
        block_table: ``(B, M)`` physical block numbers, -1 where unused (read as block 0:
            the caller must keep those positions out of its arithmetic).

    Returns:
        ``(B, H, M*S, d)``: position p of sequence b is block ``block_table[b, p // S]``,
        slot ``p % S``.
    """
    B, M = block_table.shape
    H, S = cache.shape[1], cache.shape[2]
    return cache[block_table.clamp(min=0)].permute(0, 2, 1, 3, 4).reshape(B, H, M * S, -1)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    context_lens: torch.Tensor,
) -> torch.Tensor:
    """Attention of the last Lq tokens of each sequence over a paged KV cache.

    Args:
        q: ``(B, H, Lq, d)``, the last Lq tokens of each sequence.
        k_cache: ``(N, H, S, d)``; v_cache: ``(N, H, S, dv)``: N physical blocks of S slots.
        block_table: long ``(B, M)``, the physical block of each logical block, -1 if unused.
        context_lens: long ``(B,)``, tokens of each sequence (queries included), each >= Lq.

    Returns:
        ``(B, H, Lq, dv)``: query i of sequence b, at position
        ``context_lens[b] - Lq + i``, attends positions 0 .. its own (bottom-right
        causal); position p is at block ``block_table[b, p // S]``, slot ``p % S``.
        Slots at or past ``context_lens[b]`` (and blocks the table marks -1) may hold
        anything, NaN and inf included: they never reach the output.
    """
    _check_index_tensor("block_table", block_table, 2, "(B, M) of physical block numbers, -1 if unused")
    _check_index_tensor("context_lens", context_lens, 1, "(B,) of sequence lengths")
    if q.dim() != 4 or k_cache.dim() != 4 or v_cache.dim() != 4:
        raise ValueError(
            f"q (B, H, Lq, d), k_cache (N, H, S, d) and v_cache (N, H, S, dv) need 4 dims; got "
            f"{tuple(q.shape)}, {tuple(k_cache.shape)}, {tuple(v_cache.shape)}"
        )
    Lq = q.shape[2]
    M, S = block_table.shape[1], k_cache.shape[2]
    pos = torch.arange(M * S, device=q.device)  # (M*S,): logical position of each gathered key
    held = (pos[None, :] < context_lens[:, None])[:, None, :, None]  # (B, 1, M*S, 1): holds a token
    # A kernel stops reading at context_lens; gathering reads every slot, so the stale ones are
    # replaced (selected away, not multiplied by 0) before any arithmetic: 0 * NaN would be NaN.
    keys = torch.where(held, gather_blocks(k_cache, block_table), 0)  # (B, H, M*S, d)
    values = torch.where(held, gather_blocks(v_cache, block_table), 0)  # (B, H, M*S, dv)
    q_pos = context_lens[:, None] - Lq + torch.arange(Lq, device=q.device)  # (B, Lq)
    mask = (pos[None, None, :] <= q_pos[:, :, None])[:, None]  # (B, 1, Lq, M*S)
    out, _ = attention(q, keys, values, mask)
    return out


class PagedKVCache:
    """A pool of N blocks of S slots shared by many sequences, vLLM style.

    The bookkeeping (which blocks a sequence owns) is host-side Python, as in
    a serving engine's scheduler; the keys and values live in two tensors
    ``k (N, H, S, d)`` and ``v (N, H, S, dv)``. Free blocks are handed out in
    a shuffled order, so block tables are not contiguous.
    """

    def __init__(
        self,
        n_blocks: int,
        block_size: int,
        n_heads: int,
        d: int,
        dv: int | None = None,
        *,
        dtype: torch.dtype = torch.float32,
        seed: int = 0,
    ):
        _check_size("n_blocks", n_blocks, 1)
        _check_size("block_size", block_size, 1)
        self.block_size = block_size
        self.k = torch.zeros(n_blocks, n_heads, block_size, d, dtype=dtype)
        self.v = torch.zeros(n_blocks, n_heads, block_size, dv or d, dtype=dtype)
        self.free = torch.randperm(n_blocks, generator=torch.Generator().manual_seed(seed)).tolist()
        self.tables: dict[int, list[int]] = {}
        self.lens: dict[int, int] = {}

    def append(self, seq: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write ``k (H, n, d)``, ``v (H, n, dv)`` after sequence ``seq``'s tokens."""
        table, start = self.tables.setdefault(seq, []), self.lens.get(seq, 0)
        S = self.block_size
        for t in range(k.shape[1]):
            p = start + t
            if p // S == len(table):
                if not self.free:
                    raise RuntimeError("the paged KV cache is full: free a sequence or add blocks")
                table.append(self.free.pop())
            self.k[table[p // S], :, p % S] = k[:, t]
            self.v[table[p // S], :, p % S] = v[:, t]
        self.lens[seq] = start + k.shape[1]

    def release(self, seq: int) -> None:
        """Give sequence ``seq``'s blocks back to the pool."""
        self.free += self.tables.pop(seq)
        self.lens.pop(seq)

    def block_table(self, seqs: list[int]) -> torch.Tensor:
        """long ``(B, M)``: the tables of ``seqs``, padded with -1."""
        M = max(len(self.tables[s]) for s in seqs)
        return torch.tensor([self.tables[s] + [-1] * (M - len(self.tables[s])) for s in seqs])

    def context_lens(self, seqs: list[int]) -> torch.Tensor:
        """long ``(B,)``: the tokens stored for each of ``seqs``."""
        return torch.tensor([self.lens[s] for s in seqs])

    def blocks_used(self) -> int:
        return sum(len(t) for t in self.tables.values())


# --------------------------------------------------------------------------- tree masks


def tree_ancestors(parents: torch.Tensor) -> torch.Tensor:
    """bool ``(N, N)``: entry [i, a] is True when draft token a is i or an ancestor of i.

    Args:
        parents: long ``(N,)``, ``parents[i] < i`` the parent of token i, or -1
            for a child of the last committed token.
    """
    _check_index_tensor("parents", parents, 1, "(N,) of parent indices, -1 for the root's children")
    N = parents.shape[0]
    ext = torch.cat(
        [torch.where(parents >= 0, parents, N), parents.new_full((1,), N)]
    )  # (N+1,): N = no parent
    ids = torch.arange(N + 1, device=parents.device)
    node = ids[:N]  # (N,): walks up from each token, one generation per step
    anc = torch.zeros(N, N + 1, dtype=torch.bool, device=parents.device)
    for _ in range(N):  # a chain of N tokens is the deepest tree
        anc = anc | (node[:, None] == ids[None, :])
        node = ext[node]
    return anc[:, :N]


def tree_positions(parents: torch.Tensor, past_len: int) -> torch.Tensor:
    """long ``(N,)``: the position of each draft token, past_len + its depth (0 for a root child)."""
    _check_size("past_len", past_len, 0)
    return tree_ancestors(parents).long().sum(dim=-1) - 1 + past_len


def tree_mask(parents: torch.Tensor, past_len: int) -> torch.Tensor:
    """The mask of a draft tree placed after ``past_len`` committed tokens.

    Args:
        parents: long ``(N,)``, ``parents[i] < i`` or -1.
        past_len: committed tokens in the cache, >= 0.

    Returns:
        bool ``(N, past_len + N)``, True = may attend: every committed key, and
        the draft keys that are i itself or an ancestor of i.
    """
    _check_size("past_len", past_len, 0)
    anc = tree_ancestors(parents)  # (N, N)
    past = torch.ones(anc.shape[0], past_len, dtype=torch.bool, device=anc.device)
    return torch.cat([past, anc], dim=1)  # (N, past_len + N): the tree sits bottom-right
