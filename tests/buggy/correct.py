"""A correct solution of every exercise, written from the contract alone
(no attnmask), the way a careful student would: float32 accumulation for
float16/bfloat16, masked_fill(-inf) before the softmax, zeros for fully masked
rows. Every check must pass it."""

from __future__ import annotations

import math

import torch


def causal_mask(n, *, device=None):
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


def influence_matrix(f, x):
    jac = torch.autograd.functional.jacobian(f, x.detach().clone())  # (L, d', L, d)
    return jac.float().pow(2).sum(dim=(1, 3)).sqrt().to(x.dtype)


def to_additive(mask, dtype=torch.float32):
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, float("-inf"))


def masked_softmax(scores, mask):
    x = scores.float().masked_fill(~mask, float("-inf"))
    w = torch.softmax(x, dim=-1)
    w = torch.where(mask.any(dim=-1, keepdim=True), w, torch.zeros_like(w))
    return w.to(scores.dtype)


def attention(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is None:
        mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device)
    w = masked_softmax(scores, mask)
    return w @ v, w


def padding_mask(lengths, max_len):
    return torch.arange(max_len, device=lengths.device)[None, :] < lengths[:, None]


def padded_encoder(x, lengths, weights):
    L, D = x.shape[1], x.shape[2]
    keys = padding_mask(lengths, L)[:, None, :]  # (B, 1, L)
    h = x
    for layer in weights:
        q, k, v = h @ layer[0], h @ layer[1], h @ layer[2]
        scores = (q @ k.transpose(-2, -1) / math.sqrt(D)).masked_fill(~keys, float("-inf"))
        h = h + torch.softmax(scores, dim=-1) @ v
    return h


def decoder_mask(lengths, max_len):
    causal = causal_mask(max_len, device=lengths.device)
    keys = padding_mask(lengths, max_len)[:, None, None, :]  # (B, 1, 1, L)
    return causal & keys


def encoder_decoder_masks(src_lengths, tgt_lengths, src_len, tgt_len):
    src_keys = padding_mask(src_lengths, src_len)[:, None, None, :]  # (B, 1, 1, S)
    return src_keys, decoder_mask(tgt_lengths, tgt_len), src_keys


def multi_head_attention(x_q, x_kv, w_q, w_k, w_v, w_o, n_heads, mask=None):
    B, Lq, D = x_q.shape
    Lk = x_kv.shape[1]
    d = D // n_heads
    q = (x_q @ w_q.T).view(B, Lq, n_heads, d).transpose(1, 2)
    k = (x_kv @ w_k.T).view(B, Lk, n_heads, d).transpose(1, 2)
    v = (x_kv @ w_v.T).view(B, Lk, n_heads, d).transpose(1, 2)
    out, _ = attention(q, k, v, mask)
    return out.transpose(1, 2).reshape(B, Lq, D) @ w_o.T


def kv_cache_attention(q, k_new, v_new, k_cache, v_cache):
    k = torch.cat([k_cache, k_new], dim=2)
    v = torch.cat([v_cache, v_new], dim=2)
    n, total = q.shape[2], k.shape[2]
    i = torch.arange(n, device=q.device)[:, None]
    j = torch.arange(total, device=q.device)[None, :]
    out, _ = attention(q, k, v, j <= i + (total - n))
    return out, k, v


def sliding_window_mask(n, window, *, device=None):
    i = torch.arange(n, device=device)[:, None]
    j = torch.arange(n, device=device)[None, :]
    return (j <= i) & (i - j < window)


def prefix_lm_mask(n, prefix_len, *, device=None):
    i = torch.arange(n, device=device)[:, None]
    j = torch.arange(n, device=device)[None, :]
    return (j <= i) | (j < prefix_len)


def document_mask(doc_ids):
    L = doc_ids.shape[1]
    same = doc_ids[:, :, None] == doc_ids[:, None, :]  # (B, L, L)
    return (same & causal_mask(L, device=doc_ids.device))[:, None]


def tile_lists(mask, tile=64):
    B, H, Lq, Lk = mask.shape
    nq, nk = -(-Lq // tile), -(-Lk // tile)
    grid = torch.zeros(B, H, nq * tile, nk * tile, dtype=torch.int32, device=mask.device)
    grid[:, :, :Lq, :Lk] = mask.int()
    inside = torch.zeros(nq * tile, nk * tile, dtype=torch.int32, device=mask.device)
    inside[:Lq, :Lk] = 1
    allowed = grid.view(B, H, nq, tile, nk, tile).sum(dim=(3, 5))
    cells = inside.view(nq, tile, nk, tile).sum(dim=(1, 3))
    full = allowed == cells
    partial = (allowed > 0) & ~full
    out = []
    for chosen in (partial, full):
        key = torch.where(chosen, torch.arange(nk, device=mask.device), nk)  # unlisted tiles sort last
        out += [chosen.sum(-1).int(), key.sort(dim=-1).values.clamp(max=nk - 1).int()]
    return tuple(out)


def left_padding_position_ids(keep):
    pos = keep.long().cumsum(dim=-1) - 1
    return torch.where(keep, pos, torch.zeros_like(pos))


def packed_labels(tokens, doc_ids, ignore_index=-100):
    same = doc_ids[:, 1:] == doc_ids[:, :-1]  # (B, L-1)
    shifted = torch.where(same, tokens[:, 1:], torch.full_like(tokens[:, 1:], ignore_index))
    return torch.cat([shifted, torch.full_like(tokens[:, :1], ignore_index)], dim=1)


def gqa_attention(q, k, v, mask=None):
    G = q.shape[1] // k.shape[1]
    out, _ = attention(q, k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1), mask)
    return out


def alibi_bias(n_heads, Lq, Lk, *, device=None, dtype=torch.float32):
    def slopes(n):
        return [2 ** (-8 * (h + 1) / n) for h in range(n)]

    m = 2 ** math.floor(math.log2(n_heads))
    s = slopes(m) + slopes(2 * m)[0::2][: n_heads - m]
    s = torch.tensor(s, device=device)  # (H,)
    i = torch.arange(Lq, device=device)[:, None] + (Lk - Lq)
    j = torch.arange(Lk, device=device)[None, :]
    bias = s[:, None, None] * (j - i)  # (H, Lq, Lk)
    return bias.masked_fill(j > i, float("-inf")).to(dtype)


def tiled_attention(q, k, v, mask=None, tile=64):
    B, H, Lq, d = q.shape
    Lk = k.shape[2]
    if mask is not None:
        mask = mask.expand(B, H, Lq, Lk)  # a view
    x = q.float() / math.sqrt(d)
    m = torch.full((B, H, Lq, 1), float("-inf"), device=q.device)
    total = torch.zeros(B, H, Lq, 1, device=q.device)
    acc = torch.zeros(B, H, Lq, v.shape[-1], device=q.device)
    for start in range(0, Lk, tile):
        keep = None if mask is None else mask[:, :, :, start:start + tile]
        if keep is not None and not keep.any():
            continue
        s = x @ k[:, :, start:start + tile].float().transpose(-2, -1)  # (B, H, Lq, t)
        if keep is not None:
            s = s.masked_fill(~keep, float("-inf"))
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True)).detach()
        safe = torch.where(m_new == float("-inf"), torch.zeros_like(m_new), m_new)
        p = torch.exp(s - safe)
        alpha = torch.exp(m - safe)
        total = total * alpha + p.sum(dim=-1, keepdim=True)
        acc = acc * alpha + p @ v[:, :, start:start + tile].float()
        m = m_new
    # total >= 1 for a row with an allowed key (its max contributes exp(0)); 0 for an empty row
    return (acc / total.clamp(min=1.0)).to(q.dtype)


def image_text_mask(is_image, attention_mask):
    L = is_image.shape[1]
    prev = torch.cat([torch.zeros_like(is_image[:, :1]), is_image[:, :-1]], dim=1)
    run = (is_image & ~prev).long().cumsum(dim=1) * is_image.long()  # (B, L): run number, 0 at text
    same = (run[:, :, None] == run[:, None, :]) & (run[:, :, None] > 0)  # (B, L, L)
    causal = torch.ones(L, L, dtype=torch.bool, device=is_image.device).tril()
    return ((causal | same) & (attention_mask[:, None, :] != 0))[:, None]


def rolling_cache_mask(slot_pos, q_pos, window):
    s, p = slot_pos[:, None, None, :], q_pos[:, None, :, None]  # (B, 1, 1, W), (B, 1, Lq, 1)
    return (s >= 0) & (s <= p) & (p - s < window)


def paged_attention(q, k_cache, v_cache, block_table, context_lens):
    B, H, Lq, d = q.shape
    S = k_cache.shape[2]
    n_keys = block_table.shape[1] * S
    p = torch.arange(n_keys, device=q.device)  # (M*S,)
    phys = block_table[:, p // S].clamp(min=0)  # (B, M*S): physical block of each position
    held = (p[None, :] < context_lens[:, None])[:, None, :, None]  # (B, 1, M*S, 1): a token is there
    k = torch.where(held, k_cache[phys, :, p % S].transpose(1, 2), 0)  # (B, H, M*S, d)
    v = torch.where(held, v_cache[phys, :, p % S].transpose(1, 2), 0)  # (B, H, M*S, dv)
    q_pos = context_lens[:, None] - Lq + torch.arange(Lq, device=q.device)  # (B, Lq)
    mask = (p[None, None, :] <= q_pos[:, :, None])[:, None]  # (B, 1, Lq, M*S)
    out, _ = attention(q, k, v, mask)
    return out


def tree_mask(parents, past_len):
    n = parents.numel()
    idx = torch.arange(n, device=parents.device)
    seen = idx[:, None] == idx[None, :]
    up = parents
    for _ in range(n):  # climb one generation per round; -1 stays -1 and matches nothing
        seen = seen | (up[:, None] == idx[None, :])
        up = torch.where(up >= 0, parents[up.clamp(min=0)], up)
    return torch.cat([seen.new_ones(n, past_len), seen], dim=1)


def attention_lse(q, k, v, mask=None):
    s = q.float() @ k.float().transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, Lq, Lk)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    has = ~torch.isneginf(s).all(dim=-1, keepdim=True)  # (B, H, Lq, 1): a row with an allowed key
    s = torch.where(has, s, 0.0)
    lse = torch.logsumexp(s, dim=-1).masked_fill(~has[..., 0], float("-inf"))
    w = torch.softmax(s, dim=-1) * has
    return (w @ v.float()).to(q.dtype), lse


def merge_partials(out1, lse1, out2, lse2):
    if out1.shape != out2.shape or lse1.shape != lse2.shape or out1.shape[:-1] != lse1.shape:
        raise ValueError(f"shapes disagree: {out1.shape}, {lse1.shape}, {out2.shape}, {lse2.shape}")
    m = torch.maximum(lse1, lse2).float().detach()
    m = torch.where(m == float("-inf"), 0.0, m)
    a, b = torch.exp(lse1.float() - m), torch.exp(lse2.float() - m)
    total = a + b
    some = total > 0
    total = torch.where(some, total, 1.0)
    lse = torch.where(some, m + torch.log(total), float("-inf"))
    out = (a[..., None] * out1.float() + b[..., None] * out2.float()) / total[..., None]
    return out.to(out1.dtype), lse


def zigzag_ring_mask(L, world, rank, step, *, device=None):
    if L < 1 or world < 1 or L % (2 * world) or not 0 <= rank < world or not 0 <= step < world:
        raise ValueError(f"bad ring: L={L}, world={world}, rank={rank}, step={step}")
    c = L // (2 * world)
    t = torch.arange(2 * c, device=device)

    def pos(r):  # local index -> global position
        return torch.where(t < c, r * c + t, (2 * world - 1 - r) * c + t - c)

    return pos(rank)[:, None] >= pos((rank - step) % world)[None, :]


def chunked_local_mask(Lq, Lk, chunk, *, device=None):
    if Lq < 1 or Lq > Lk or chunk < 1:
        raise ValueError(f"bad sizes: Lq={Lq}, Lk={Lk}, chunk={chunk}")
    p = torch.arange(Lk - Lq, Lk, device=device)[:, None]
    j = torch.arange(Lk, device=device)
    return (j <= p) & (j // chunk == p // chunk)


def tiled_attention_backward(q, k, v, out, lse, d_out, mask=None, tile=64):
    B, H, Lq, d = q.shape
    Lk = k.shape[2]
    if mask is not None:
        mask = mask.expand(B, H, Lq, Lk)  # a view
    f = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    x, g = q.to(f), d_out.to(f)
    delta = (g * out.to(f)).sum(dim=-1, keepdim=True)  # (B, H, Lq, 1)
    m = lse.to(f).unsqueeze(-1)
    m = torch.where(m == float("-inf"), torch.zeros_like(m), m)  # empty rows: exp(-inf - 0) = 0
    dq = torch.zeros_like(x)
    dk = torch.zeros(B, H, Lk, d, dtype=f, device=q.device)
    dv = torch.zeros(B, H, Lk, v.shape[-1], dtype=f, device=q.device)
    for start in range(0, Lk, tile):
        keep = None if mask is None else mask[:, :, :, start:start + tile]
        if keep is not None and not keep.any():
            continue
        kt, vt = k[:, :, start:start + tile].to(f), v[:, :, start:start + tile].to(f)
        s = x @ kt.transpose(-2, -1) / math.sqrt(d)
        if keep is not None:
            s = s.masked_fill(~keep, float("-inf"))
        p = torch.exp(s - m)
        dv[:, :, start:start + tile] = p.transpose(-2, -1) @ g
        ds = p * (g @ vt.transpose(-2, -1) - delta)
        dq += ds @ kt / math.sqrt(d)
        dk[:, :, start:start + tile] = ds.transpose(-2, -1) @ x / math.sqrt(d)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _tiled_forward_lse(q, k, v, mask, tile):
    """The online softmax's out and lse = m + log(l), -inf on a row with no allowed key."""
    B, H, Lq, d = q.shape
    Lk = k.shape[2]
    if mask is not None:
        mask = torch.broadcast_to(mask, (B, H, Lq, Lk))
    work = torch.promote_types(q.dtype, torch.float32)
    x = q.to(work) / math.sqrt(d)
    m = torch.full((B, H, Lq, 1), float("-inf"), dtype=work, device=q.device)
    l = torch.zeros(B, H, Lq, 1, dtype=work, device=q.device)
    acc = torch.zeros(B, H, Lq, v.shape[-1], dtype=work, device=q.device)
    for c in range(0, Lk, tile):
        keep = None if mask is None else mask[..., c:c + tile]
        if keep is not None and not keep.any():
            continue
        s = x @ k[:, :, c:c + tile].to(work).transpose(-2, -1)
        if keep is not None:
            s = s.masked_fill(~keep, float("-inf"))
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        shift = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
        alpha, p = torch.exp(m - shift), torch.exp(s - shift)
        l = l * alpha + p.sum(dim=-1, keepdim=True)
        acc = acc * alpha + p @ v[:, :, c:c + tile].to(work)
        m = m_new
    empty = l == 0
    lse = (m + torch.log(l.masked_fill(empty, 1.0))).masked_fill(empty, float("-inf"))[..., 0]
    return (acc / l.masked_fill(empty, 1.0)).to(q.dtype), lse


class TiledAttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mask, tile):
        out, lse = _tiled_forward_lse(q, k, v, mask, tile)
        ctx.save_for_backward(q, k, v, out, lse, mask)
        ctx.tile = tile
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, out, lse, mask = ctx.saved_tensors
        return (*tiled_attention_backward(q, k, v, out, lse, d_out, mask, ctx.tile), None, None)


def tiled_attention_fn(q, k, v, mask=None, tile=64):
    if mask is not None:  # one (Lq, Lk) plane per head, as a view: saved for the backward uncopied
        mask = torch.broadcast_to(mask, (*q.shape[:-1], k.shape[-2]))
    return TiledAttentionFunction.apply(q, k, v, mask, tile)


def padded_chunked_mask(attention_mask, Lq, chunk):
    Lk = attention_mask.shape[-1]
    if Lq < 1 or Lq > Lk or chunk < 1:
        raise ValueError(f"bad sizes: Lq={Lq}, Lk={Lk}, chunk={chunk}")
    pad = (attention_mask.long().cumsum(-1) == 0).sum(-1)[:, None, None, None]  # transformers' count
    p = torch.arange(Lk - Lq, Lk, device=attention_mask.device)[:, None]
    j = torch.arange(Lk, device=attention_mask.device)
    same = (j - pad).div(chunk, rounding_mode="floor") == (p - pad).div(chunk, rounding_mode="floor")
    return (j <= p) & same & attention_mask[:, None, None, :]


def ring_positions(L, world, r, layout, device=None):
    c = L // (2 * world)
    a, b = (r, 2 * world - 1 - r) if layout == "zigzag" else (2 * r, 2 * r + 1)
    return torch.cat([torch.arange(a * c, a * c + c, device=device),
                      torch.arange(b * c, b * c + c, device=device)])


def ring_attention(q, k, v, world, layout="zigzag"):
    L = q.shape[-2]
    if world < 1 or L % (2 * world) or layout not in ("zigzag", "contiguous"):
        raise ValueError(f"bad ring: L={L}, world={world}, layout={layout!r}")
    pos = [ring_positions(L, world, r, layout, q.device) for r in range(world)]
    held = [(k[..., p, :], v[..., p, :], p) for p in pos]  # the shard each rank holds
    acc, steps = [None] * world, [[] for _ in range(world)]
    for _ in range(world):
        for r in range(world):
            kk, vv, kp = held[r]
            m = pos[r][:, None] >= kp[None, :]
            if m.any():
                part = attention_lse(q[..., pos[r], :], kk, vv, m)
                steps[r].append(part)
                acc[r] = part if acc[r] is None else merge_partials(*acc[r], *part)
        held = [held[(r - 1) % world] for r in range(world)]  # pass on to r + 1
    out = q.new_empty(*q.shape[:-1], v.shape[-1])
    lse = torch.empty(q.shape[:-1], device=q.device)
    for r in range(world):
        out[..., pos[r], :], lse[..., pos[r]] = acc[r]
    return out, lse, steps


def cascade_attention(q, prefix_k, prefix_v, suffix_k, suffix_v, suffix_lengths):
    N, H, d = q.shape
    S = suffix_k.shape[2]
    if prefix_k.shape[0] != H or suffix_k.shape[:2] != (N, H) or suffix_lengths.shape != (N,) \
            or bool((suffix_lengths < 0).any()) or bool((suffix_lengths > S).any()):
        raise ValueError("shapes or lengths do not fit")
    o1, l1 = attention_lse(q.transpose(0, 1).unsqueeze(0), prefix_k.unsqueeze(0), prefix_v.unsqueeze(0))
    real = torch.arange(S, device=q.device) < suffix_lengths[:, None]  # (N, S)
    o2, l2 = attention_lse(q.unsqueeze(2), suffix_k, suffix_v, real[:, None, None, :])
    return merge_partials(o1[0].transpose(0, 1), l1[0].transpose(0, 1), o2[:, :, 0], l2[:, :, 0])



def sink_attention(q, k, v, sinks, mask=None):
    # the sink as one more column of logits, softmaxed with the scores, then dropped
    scores = q.float() @ k.float().transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, Lq, Lk)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    column = sinks.float()[:, None, None].expand(*scores.shape[:-1], 1)  # (B, H, Lq, 1)
    probs = torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)  # the sink is finite: no NaN
    return (probs[..., :-1] @ v.float()).to(q.dtype)


def topk_selection_mask(index_scores, k, *, causal=True):
    if k < 1:
        raise ValueError(f"k must be >= 1; got {k}")
    _, Lq, Lk = index_scores.shape
    dev = index_scores.device
    keep = ~torch.isnan(index_scores)
    if causal:
        p = Lk - Lq + torch.arange(Lq, device=dev)[:, None]
        keep = keep & (torch.arange(Lk, device=dev) <= p)
    # how many visible keys rank before key j: a higher score, or the same score and a lower index
    s = index_scores.masked_fill(~keep, 0.0)
    lower = torch.arange(Lk, device=dev)[None, :] < torch.arange(Lk, device=dev)[:, None]
    higher = s[..., None, :] > s[..., :, None]
    same = s[..., None, :] == s[..., :, None]
    ahead = (keep[..., None, :] & (higher | (same & lower))).sum(-1)
    return keep & (ahead < k)


def block_diffusion_mask(L, block, *, device=None):
    if block < 1 or L < 1 or L % block:
        raise ValueError(f"block = {block} must divide L = {L}")
    nb = L // block
    blocks = torch.ones(nb, nb, dtype=torch.bool, device=device)
    none = torch.zeros_like(blocks)
    top = torch.cat([torch.eye(nb, dtype=torch.bool, device=device), blocks.tril(-1)], dim=1)
    bottom = torch.cat([none, blocks.tril()], dim=1)
    grid = torch.cat([top, bottom], dim=0)  # (2nb, 2nb): one cell per pair of blocks
    return grid.repeat_interleave(block, dim=0).repeat_interleave(block, dim=1)


def decay_mask(log_gates, doc_ids=None):
    # prefix sums in float64, the closed gates (-inf) clamped to a finite -1e4: exp(-1e4) is 0 anyway
    c = log_gates.double().clamp(min=-1e4).cumsum(-1)  # (B, L)
    L = c.shape[-1]
    pos = torch.arange(L, device=c.device)
    allowed = (pos[None, :] <= pos[:, None]).expand(c.shape[0], L, L)
    if doc_ids is not None:
        allowed = allowed & (doc_ids[:, :, None] == doc_ids[:, None, :])
    diff = (c[:, :, None] - c[:, None, :]).masked_fill(~allowed, float("-inf"))
    return torch.exp(diff).float()


def find_leaking_layer(model, x):
    layers = model.layers
    for k in range(len(layers)):
        def prefix(h, k=k):
            for layer in layers[:k + 1]:
                h = layer(h)
            return h

        infl = influence_matrix(prefix, x)  # (L, L)
        if bool((infl.triu(1) > 1e-3 * infl.max()).any()):
            return k
    return None


def leaks_across_padding(decoder, tokens, lengths):
    L = tokens.shape[1]
    real = torch.arange(L, device=tokens.device) >= L - lengths[:, None]  # (B, L): left padding, real last
    base = decoder(tokens, lengths)
    V = decoder.vocab_size
    for _ in range(3):
        other = (tokens + torch.randint(1, V, tokens.shape, device=tokens.device)) % V  # every pad changes
        out = decoder(torch.where(real, tokens, other), lengths)
        if not torch.allclose(out[real], base[real], rtol=1e-4, atol=1e-5):
            return True
    return False


def block_sparse_forward(*args, **kwargs):
    """The course's Triton kernel (chapter 13): imported when called, triton being an extra."""
    from attnmask.kernels import block_sparse_forward as launch

    return launch(*args, **kwargs)


def block_sparse_backward(*args, **kwargs):
    from attnmask.kernels import block_sparse_backward as launch

    return launch(*args, **kwargs)
