"""Keys selected at run time (DeepSeek's NSA and DSA, MoBA; chapter 12).

A small *indexer* scores every (query, key) pair; each query then attends only the
``k`` keys it scores highest among those it may see. The mask depends on the data,
not just on positions, so it is built per batch element, after the scores exist.

* :func:`topk_selection_mask`: the top-k keys of every query as a dense bool mask
  (DSA's token-level selection).
* :func:`selected_blocks`: a predicate (chapter 7's ``mask_fn``) that keeps whole
  selected key blocks, NSA's and MoBA's block-level selection, which FlexAttention
  turns into a ``BlockMask`` whose unselected tiles the kernel skips.
"""

from __future__ import annotations

import torch

from .predicates import MaskFn

__all__ = ["selected_blocks", "topk_selection_mask"]


def topk_selection_mask(index_scores: torch.Tensor, k: int, *, causal: bool = True) -> torch.Tensor:
    """Each query keeps the ``k`` highest-scoring keys it may see.

    Args:
        index_scores: (B, Lq, Lk) float, the indexer's scores. Query i sits at position
            Lk - Lq + i (bottom-right, as with a KV cache).
        k: how many keys each query keeps, >= 1.
        causal: when True a query may see keys j <= its position; else every key.

    Returns:
        bool (B, Lq, Lk), True = may attend: the k best visible keys of each query (all
        of them when it sees fewer than k). Ties go to the lower key index; a NaN score
        is never selected.

    Raises:
        ValueError: k < 1, or index_scores not 3-dimensional.
    """
    if k < 1:
        raise ValueError(f"k = {k}: each query must keep at least one key (k >= 1)")
    if index_scores.dim() != 3:
        raise ValueError(f"index_scores has shape {tuple(index_scores.shape)}; expected (B, Lq, Lk)")
    _, Lq, Lk = index_scores.shape
    dev = index_scores.device
    visible = ~torch.isnan(index_scores)  # (B, Lq, Lk)
    if causal:
        p = (Lk - Lq + torch.arange(Lq, device=dev))[:, None]  # (Lq, 1)
        visible = visible & (torch.arange(Lk, device=dev) <= p)
    # Rank the keys: visible ones first, then by score (high first), then by index. Two
    # stable sorts give that order (a -inf fill alone would let a blocked key tie a -inf score).
    by_score = torch.sort(index_scores.masked_fill(~visible, float("-inf")), dim=-1, descending=True,
                          stable=True).indices  # (B, Lq, Lk)
    first = torch.sort(visible.gather(-1, by_score).to(torch.uint8), dim=-1, descending=True,
                       stable=True).indices
    order = by_score.gather(-1, first)  # (B, Lq, Lk): key indices, best first
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(Lk, device=dev).expand_as(order))
    return visible & (rank < k)


def selected_blocks(chosen: torch.Tensor, block: int) -> MaskFn:
    """A mask function keeping the key blocks each query block chose (NSA, MoBA).

    Args:
        chosen: bool (B, Lq // block, Lk // block), True where a query block keeps a key block
            (e.g. :func:`topk_selection_mask` of block-level scores).
        block: the block size, in tokens, of queries and keys alike.

    Returns:
        ``mask_fn(b, h, q_idx, kv_idx)`` (True = may attend), for
        :func:`attnmask.predicates.materialize` or FlexAttention's ``create_block_mask``; with a
        ``BLOCK_SIZE`` equal to ``block`` every tile is either full or empty.
    """

    def mask_fn(b, h, q_idx, kv_idx):
        return chosen[b, q_idx // block, kv_idx // block]

    return mask_fn
