"""Grader fixture: the classic masking mistakes, one per exercise (two are correct)."""

import math

import torch


def causal_mask(n, *, device=None):
    pos = torch.arange(n, device=device)
    return pos[None, :] < pos[:, None]  # the diagonal is excluded: a token cannot see itself


def influence_matrix(f, x):
    x0 = x.detach().clone()
    jac = torch.autograd.functional.jacobian(f, x0)  # (L, d', L, d)
    return jac.float().pow(2).sum(dim=(1, 3)).sqrt().to(x.dtype)


def to_additive(mask, dtype=torch.float32):
    return (1 - mask.to(dtype)) * float("-inf")  # 0 * -inf is NaN where the mask allows


def masked_softmax(scores, mask):
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)  # NaN on fully masked rows


def attention(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1)  # forgot the 1 / sqrt(d) scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


def padding_mask(lengths, max_len):
    return torch.arange(max_len, device=lengths.device)[None, :] <= lengths[:, None]  # off by one


def decoder_mask(lengths, max_len):
    pos = torch.arange(max_len, device=lengths.device)
    return (pos[None, :] <= pos[:, None])[None, None]  # causal only: padding ignored


def encoder_decoder_masks(src_lengths, tgt_lengths, src_len, tgt_len):
    s = torch.arange(src_len, device=src_lengths.device)
    t = torch.arange(tgt_len, device=tgt_lengths.device)
    src_keys = (s[None, :] < src_lengths[:, None])[:, None, None, :]
    tgt_keys = (t[None, :] < tgt_lengths[:, None])[:, None, None, :]
    causal = t[None, :] <= t[:, None]
    cross = src_keys & (s[None, :] <= t[:, None])  # the cross mask made causal: hides most of the source
    return src_keys, causal & tgt_keys, cross


def multi_head_attention(x_q, x_kv, w_q, w_k, w_v, w_o, n_heads, mask=None):
    B, Lq, D = x_q.shape
    Lk = x_kv.shape[1]
    H, d = n_heads, D // n_heads
    q = (x_q @ w_q.T).view(B, Lq, H, d).transpose(1, 2)
    k = (x_kv @ w_k.T).view(B, Lk, H, d).transpose(1, 2)
    v = (x_kv @ w_v.T).view(B, Lk, H, d).transpose(1, 2)
    scores = q @ k.transpose(-2, -1) / math.sqrt(D)  # scaled by the model width, not the head width
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores.float(), dim=-1).to(v.dtype)
    return (weights @ v).transpose(1, 2).reshape(B, Lq, D) @ w_o.T


def kv_cache_attention(q, k_new, v_new, k_cache, v_cache):
    k_all = torch.cat([k_cache, k_new], dim=2)
    v_all = torch.cat([v_cache, v_new], dim=2)
    n, total = q.shape[2], k_all.shape[2]
    mask = torch.ones(n, total, dtype=torch.bool, device=q.device).tril()  # top-left: hides the cache
    scores = q @ k_all.transpose(-2, -1) / math.sqrt(q.shape[-1])
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return weights @ v_all, k_all, v_all


def sliding_window_mask(n, window, *, device=None):
    pos = torch.arange(n, device=device)
    i, j = pos[:, None], pos[None, :]
    return (j <= i) & (i - j <= window)  # one key too many


def prefix_lm_mask(n, prefix_len, *, device=None):
    pos = torch.arange(n, device=device)
    i, j = pos[:, None], pos[None, :]
    return (j <= i) & (j < prefix_len)  # AND where it should be OR


def document_mask(doc_ids):
    same = doc_ids[:, :, None] == doc_ids[:, None, :]
    return same[:, None]  # forgot the causal part


def tiled_attention(q, k, v, mask=None, tile=64):
    B, H, Lq, d = q.shape
    Lk = k.shape[2]
    if mask is not None:
        mask = torch.broadcast_to(mask, (B, H, Lq, Lk))
    m = torch.full((B, H, Lq, 1), float("-inf"), device=q.device)
    l = torch.zeros(B, H, Lq, 1, device=q.device)
    acc = torch.zeros(B, H, Lq, v.shape[-1], device=q.device)
    for c in range(0, Lk, tile):
        keep = None if mask is None else mask[..., c:c + tile]
        if keep is not None and not keep.any():
            continue
        s = q.float() @ k[:, :, c:c + tile].float().transpose(-2, -1) / math.sqrt(d)
        if keep is not None:
            s = s.masked_fill(~keep, float("-inf"))
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        shift = torch.where(torch.isfinite(m_new), m_new, 0.0)
        p = torch.exp(s - shift)
        l = l + p.sum(dim=-1, keepdim=True)  # forgot to rescale the running sum by exp(m - shift)
        acc = acc * torch.exp(m - shift) + p @ v[:, :, c:c + tile].float()
        m = m_new
    return (acc / l.clamp(min=1.0)).to(q.dtype)


def left_padding_position_ids(keep):
    pos = torch.arange(keep.shape[1], device=keep.device).expand(keep.shape)
    return torch.where(keep, pos, 0)  # counts the padding: a left-padded row starts late


def packed_labels(tokens, doc_ids, ignore_index=-100):
    labels = torch.full_like(tokens, ignore_index)
    labels[:, :-1] = tokens[:, 1:]  # forgot the document borders
    return labels


def gqa_attention(q, k, v, mask=None):
    G = q.shape[1] // k.shape[1]
    k, v = k.repeat(1, G, 1, 1), v.repeat(1, G, 1, 1)  # tiles heads 0 1 0 1 instead of 0 0 1 1
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return weights @ v


def alibi_bias(n_heads, Lq, Lk, *, device=None, dtype=torch.float32):
    slopes = torch.tensor([2 ** (-8 * (h + 1) / n_heads) for h in range(n_heads)], device=device)  # pow2 only
    i = torch.arange(Lq, device=device)[:, None] + (Lk - Lq)
    j = torch.arange(Lk, device=device)[None, :]
    return (slopes[:, None, None] * (j - i)).masked_fill(j > i, float("-inf")).to(dtype)


def tiled_attention_backward(q, k, v, out, lse, d_out, mask=None, tile=64):
    """Autograd through plain attention: right gradients, but the whole (Lq, Lk) weights."""
    q, k, v = (t.detach().float().requires_grad_(True) for t in (q, k, v))
    with torch.enable_grad():
        s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        o = torch.softmax(s, dim=-1).nan_to_num(0.0) @ v
        grads = torch.autograd.grad(o, (q, k, v), d_out.float())
    return tuple(g.to(d_out.dtype) for g in grads)

def image_text_mask(is_image, attention_mask):
    L = is_image.shape[1]
    both = is_image[:, :, None] & is_image[:, None, :]  # token types compared: every image is one block
    causal = torch.ones(L, L, dtype=torch.bool, device=is_image.device).tril()
    return ((causal | both) & attention_mask.bool()[:, None, :])[:, None]


def rolling_cache_mask(slot_pos, q_pos, window):
    j, p = slot_pos[:, None, :], q_pos[:, :, None]
    return ((j >= 0) & (j <= p) & (p - j <= window))[:, None]  # one key too many


def paged_attention(q, k_cache, v_cache, block_table, context_lens):
    B, H, Lq, d = q.shape
    M, S = block_table.shape[1], k_cache.shape[2]
    k = k_cache[:M].permute(1, 0, 2, 3).reshape(H, M * S, d)  # logical block p read as physical block p
    v = v_cache[:M].permute(1, 0, 2, 3).reshape(H, M * S, -1)
    p = torch.arange(M * S, device=q.device)
    q_pos = context_lens[:, None] - Lq + torch.arange(Lq, device=q.device)
    mask = (p[None, None, :] <= q_pos[:, :, None])[:, None]
    scores = (q @ k.transpose(-2, -1)).float() / math.sqrt(d)
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1).to(q.dtype) @ v


def tree_mask(parents, past_len):
    N = parents.shape[0]
    idx = torch.arange(N, device=parents.device)
    parent = (parents[:, None] == idx[None, :]).float()
    step = reach = torch.eye(N, device=parents.device)
    for _ in range(N):
        step = step @ parent
        reach = reach + step
    siblings = parents[:, None] == parents[None, :]  # alternatives seen as context
    past = torch.ones(N, past_len, dtype=torch.bool, device=parents.device)
    return torch.cat([past, (reach > 0) | siblings], dim=1)


def attention_lse(q, k, v, mask=None):
    s = q.float() @ k.float().transpose(-2, -1)  # (B, H, Lq, Lk)
    scaled = s / math.sqrt(q.shape[-1])
    if mask is not None:
        s, scaled = s.masked_fill(~mask, float("-inf")), scaled.masked_fill(~mask, float("-inf"))
    empty = torch.isneginf(scaled).all(dim=-1, keepdim=True)
    w = torch.softmax(scaled.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)
    lse = torch.logsumexp(s.masked_fill(empty, 0.0), dim=-1).masked_fill(empty[..., 0], float("-inf"))
    return (w @ v.float()).to(q.dtype), lse  # the lse of the unscaled scores


def merge_partials(out1, lse1, out2, lse2):
    m = torch.maximum(lse1, lse2)  # -inf where both parts are empty: exp(-inf - -inf) is NaN
    w1, w2 = torch.exp(lse1 - m), torch.exp(lse2 - m)
    out = (w1[..., None] * out1.float() + w2[..., None] * out2.float()) / (w1 + w2)[..., None]
    return out.to(out1.dtype), m + torch.log(w1 + w2)


def zigzag_ring_mask(L, world, rank, step, *, device=None):
    if L < 1 or world < 1 or L % (2 * world) or not 0 <= rank < world or not 0 <= step < world:
        raise ValueError(f"L={L} must be divisible by 2*world, 0 <= rank, step < world={world}")
    c = L // (2 * world)
    t = torch.arange(2 * c, device=device)
    src = (rank - step) % world
    return (2 * c * rank + t)[:, None] >= (2 * c * src + t)[None, :]  # contiguous shards, not zigzag


def chunked_local_mask(Lq, Lk, chunk, *, device=None):
    if Lq < 1 or Lq > Lk or chunk < 1:
        raise ValueError(f"need 1 <= Lq <= Lk and chunk >= 1, got Lq={Lq}, Lk={Lk}, chunk={chunk}")
    p = torch.arange(Lk - Lq, Lk, device=device)[:, None]
    j = torch.arange(Lk, device=device)[None, :]
    return (j <= p) & (p - j < chunk)  # a sliding window of `chunk` keys, not a chunk
