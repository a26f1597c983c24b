"""Chapter 10's classic mistakes, each otherwise correct: image blocks inside causal
text, rolling-cache masks, paged attention and tree masks. Listed in
:data:`buggy.mistakes.BUGS`."""

from __future__ import annotations

import math

import torch

from . import correct as ok

# --------------------------------------------------------------------------- image_text_mask


def _runs(is_image):
    prev = torch.cat([torch.zeros_like(is_image[:, :1]), is_image[:, :-1]], dim=1)
    return (is_image & ~prev).long().cumsum(dim=1) * is_image.long()  # (B, L), 0 at text


def _image_parts(is_image, attention_mask):
    L = is_image.shape[1]
    run = _runs(is_image)
    same = ((run[:, :, None] == run[:, None, :]) & (run[:, :, None] > 0))[:, None]  # (B, 1, L, L)
    causal = torch.ones(L, L, dtype=torch.bool, device=is_image.device).tril()
    real = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, L)
    return causal, same, real


def image_one_block(is_image, attention_mask):
    causal, _, real = _image_parts(is_image, attention_mask)
    both = (is_image[:, :, None] & is_image[:, None, :])[:, None]  # token types compared, as in #38053
    return (causal | both) & real


def image_padding_reaches_block(is_image, attention_mask):
    causal, same, real = _image_parts(is_image, attention_mask)
    return (causal & real) | same


def image_causal_only(is_image, attention_mask):
    causal, _, real = _image_parts(is_image, attention_mask)
    return causal & real  # the bidirectional part never reaches attention (#39389)


def image_keys_only(is_image, attention_mask):
    causal, _, real = _image_parts(is_image, attention_mask)
    return (causal | is_image[:, None, None, :]) & real


def image_no_padding(is_image, attention_mask):
    causal, same, _ = _image_parts(is_image, attention_mask)
    return causal | same


# --------------------------------------------------------------------------- rolling_cache_mask


def rolling_slot_as_position(slot_pos, q_pos, window):
    s = torch.arange(slot_pos.shape[1], device=slot_pos.device)[None, None, None, :]
    p = q_pos[:, None, :, None]
    return (slot_pos[:, None, None, :] >= 0) & (s <= p) & (s > p - window)


def rolling_window_le(slot_pos, q_pos, window):
    s, p = slot_pos[:, None, None, :], q_pos[:, None, :, None]
    return (s >= 0) & (s <= p) & (p - s <= window)


def rolling_empty_visible(slot_pos, q_pos, window):
    s, p = slot_pos[:, None, None, :], q_pos[:, None, :, None]
    return (s <= p) & (p - s < window)


def rolling_future_visible(slot_pos, q_pos, window):
    s, p = slot_pos[:, None, None, :], q_pos[:, None, :, None]
    return (s >= 0) & (p - s < window)


def rolling_no_window(slot_pos, q_pos, window):
    s, p = slot_pos[:, None, None, :], q_pos[:, None, :, None]
    return (s >= 0) & (s <= p)


def rolling_window_from_slots(slot_pos, q_pos, window):
    return ok.rolling_cache_mask(slot_pos, q_pos, slot_pos.shape[1])


# --------------------------------------------------------------------------- paged_attention


def _paged(q, k_cache, v_cache, block_table, context_lens, *, table=None, mask_fn=None, scale=None):
    B, H, Lq, d = q.shape
    S = k_cache.shape[2]
    p = torch.arange(block_table.shape[1] * S, device=q.device)
    phys = (block_table if table is None else table)[:, p // S].clamp(min=0)
    k = k_cache[phys, :, p % S].transpose(1, 2)  # (B, H, M*S, d)
    v = v_cache[phys, :, p % S].transpose(1, 2)
    q_pos = context_lens[:, None] - Lq + torch.arange(Lq, device=q.device)  # (B, Lq)
    if mask_fn is None:
        mask = (p[None, None, :] <= q_pos[:, :, None])[:, None]
    else:
        mask = mask_fn(p, q_pos, block_table, context_lens, S)
    scores = q @ k.transpose(-2, -1) * (1 / math.sqrt(d) if scale is None else scale)
    w = torch.softmax(scores.float().masked_fill(~mask, float("-inf")), dim=-1).to(q.dtype)
    return w @ v


def paged_mask_only(q, k_cache, v_cache, block_table, context_lens):
    """Reads every gathered slot and only masks the stale ones: 0 * NaN in w @ v."""
    return _paged(q, k_cache, v_cache, block_table, context_lens)


def paged_top_left(q, k_cache, v_cache, block_table, context_lens):
    Lq = q.shape[2]
    return _paged(
        q,
        k_cache,
        v_cache,
        block_table,
        context_lens,
        mask_fn=lambda p, qp, t, n, S: p[None, :] <= torch.arange(Lq, device=p.device)[:, None],
    )


def paged_logical_block(q, k_cache, v_cache, block_table, context_lens):
    logical = torch.arange(block_table.shape[1], device=q.device).expand(block_table.shape)
    return _paged(q, k_cache, v_cache, block_table, context_lens, table=logical)


def paged_whole_blocks(q, k_cache, v_cache, block_table, context_lens):
    used = lambda p, qp, t, n, S: (t[:, p // S] >= 0)[:, None, None, :]  # noqa: E731 -- every slot of a used block
    return _paged(q, k_cache, v_cache, block_table, context_lens, mask_fn=used)


def paged_no_causal(q, k_cache, v_cache, block_table, context_lens):
    return _paged(
        q,
        k_cache,
        v_cache,
        block_table,
        context_lens,
        mask_fn=lambda p, qp, t, n, S: (p[None, :] < n[:, None])[:, None, None, :],
    )


def paged_position_off(q, k_cache, v_cache, block_table, context_lens):
    return _paged(
        q,
        k_cache,
        v_cache,
        block_table,
        context_lens,
        mask_fn=lambda p, qp, t, n, S: (p[None, None, :] < qp[:, :, None])[:, None],
    )


def paged_scale_dv(q, k_cache, v_cache, block_table, context_lens):
    return _paged(q, k_cache, v_cache, block_table, context_lens, scale=1 / math.sqrt(v_cache.shape[-1]))


def paged_detached(q, k_cache, v_cache, block_table, context_lens):
    return ok.paged_attention(q, k_cache.detach(), v_cache.detach(), block_table, context_lens)


# --------------------------------------------------------------------------- tree_mask


def _ancestors(parents):
    return ok.tree_mask(parents, 0)  # (N, N)


def _with_cache(tree, past_len):
    return torch.cat([torch.ones(tree.shape[0], past_len, dtype=torch.bool, device=tree.device), tree], dim=1)


def tree_siblings(parents, past_len):
    sib = parents[:, None] == parents[None, :]
    return _with_cache(_ancestors(parents) | sib, past_len)


def tree_chain(parents, past_len):
    N = parents.shape[0]
    return _with_cache(torch.ones(N, N, dtype=torch.bool, device=parents.device).tril(), past_len)


def tree_no_cache(parents, past_len):
    anc = _ancestors(parents)
    return torch.cat([torch.zeros(anc.shape[0], past_len, dtype=torch.bool, device=anc.device), anc], dim=1)


def tree_parent_only(parents, past_len):
    N = parents.shape[0]
    idx = torch.arange(N, device=parents.device)
    return _with_cache((parents[:, None] == idx[None, :]) | (idx[:, None] == idx[None, :]), past_len)


def tree_no_self(parents, past_len):
    N = parents.shape[0]
    return _with_cache(_ancestors(parents) & ~torch.eye(N, dtype=torch.bool, device=parents.device), past_len)


def tree_descendants(parents, past_len):
    return _with_cache(_ancestors(parents).T, past_len)


def tree_top_left(parents, past_len):
    anc = _ancestors(parents)
    return torch.cat([anc, torch.ones(anc.shape[0], past_len, dtype=torch.bool, device=anc.device)], dim=1)
