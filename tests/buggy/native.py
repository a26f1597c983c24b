"""A second correct solution, computing natively in the inputs' dtype (no float32
upcast), the way a student following the contract literally might: scale the
queries first, softmax in float16/bfloat16, nan_to_num for fully masked rows,
F.linear for the projections. Every check must pass it too: the tolerances
have to cover both styles."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .correct import (  # noqa: F401 -- the mask builders are the same
    block_diffusion_mask,
    causal_mask,
    chunked_local_mask,
    decay_mask,
    decoder_mask,
    document_mask,
    encoder_decoder_masks,
    image_text_mask,
    left_padding_position_ids,
    packed_labels,
    padded_chunked_mask,
    padding_mask,
    prefix_lm_mask,
    rolling_cache_mask,
    sliding_window_mask,
    tile_lists,
    topk_selection_mask,
    tree_mask,
    zigzag_ring_mask,
)


def influence_matrix(f, x):
    x = x.detach().clone().requires_grad_(True)
    y = f(x)  # (L, d')
    L = x.shape[0]
    out = torch.zeros(L, L, device=x.device)  # float32: squares of float16 entries above 256 overflow
    for i in range(L):
        for c in range(y.shape[1]):
            (g,) = torch.autograd.grad(y[i, c], x, retain_graph=True)
            out[i] += g.float().pow(2).sum(-1)
    return out.sqrt().to(x.dtype)


def to_additive(mask, dtype=torch.float32):
    return torch.where(mask, 0.0, torch.finfo(dtype).min).to(dtype)


def masked_softmax(scores, mask):
    w = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return torch.nan_to_num(w, nan=0.0)


def attention(q, k, v, mask=None):
    scores = (q / math.sqrt(q.shape[-1])) @ k.transpose(-2, -1)
    w = torch.softmax(scores if mask is None else scores.masked_fill(~mask, float("-inf")), dim=-1)
    if mask is not None:
        w = w.masked_fill(~mask.any(-1, keepdim=True), 0.0)
    return w @ v, w


def padded_encoder(x, lengths, weights):
    real = padding_mask(lengths, x.shape[1])  # (B, L)
    h = x
    for wq, wk, wv in weights:
        q = F.linear(h, wq.T) / math.sqrt(x.shape[-1])  # scaled first
        scores = q @ F.linear(h, wk.T).transpose(-2, -1)  # (B, L, L)
        scores = scores.masked_fill(~real[:, None, :], float("-inf"))
        h = h + scores.softmax(dim=-1) @ F.linear(h, wv.T)
    return h

def multi_head_attention(x_q, x_kv, w_q, w_k, w_v, w_o, n_heads, mask=None):
    B, Lq, D = x_q.shape
    Lk = x_kv.shape[1]
    d = D // n_heads
    q = F.linear(x_q, w_q).view(B, Lq, n_heads, d).transpose(1, 2)
    k = F.linear(x_kv, w_k).view(B, Lk, n_heads, d).transpose(1, 2)
    v = F.linear(x_kv, w_v).view(B, Lk, n_heads, d).transpose(1, 2)
    out, _ = attention(q, k, v, mask)
    return F.linear(out.transpose(1, 2).reshape(B, Lq, D), w_o)


def kv_cache_attention(q, k_new, v_new, k_cache, v_cache):
    k = torch.cat([k_cache, k_new], dim=2)
    v = torch.cat([v_cache, v_new], dim=2)
    n, T = q.shape[2], k_cache.shape[2]
    mask = torch.ones(n, T + n, dtype=torch.bool, device=q.device).tril(diagonal=T)
    out, _ = attention(q, k, v, mask)
    return out, k, v


def gqa_attention(q, k, v, mask=None):
    """Groups as a dimension instead of repeated heads: q (B, Hkv, G, Lq, d)
    against k (B, Hkv, 1, Lk, d)."""
    B, Hq, Lq, d = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    G = Hq // Hkv
    if mask is not None:
        mask = torch.broadcast_to(mask, (B, Hq, Lq, Lk)).reshape(B, Hkv, G, Lq, Lk)
    out, _ = attention(q.view(B, Hkv, G, Lq, d), k[:, :, None], v[:, :, None], mask)
    return out.reshape(B, Hq, Lq, v.shape[-1])


def alibi_bias(n_heads, Lq, Lk, *, device=None, dtype=torch.float32):
    """Everything in the requested dtype from the start."""
    m = 2 ** int(math.log2(n_heads))
    h = torch.arange(1, m + 1, device=device, dtype=dtype)
    slopes = torch.pow(2.0, -8.0 * h / m)
    if n_heads > m:
        odd = torch.arange(1, 2 * (n_heads - m), 2, device=device, dtype=dtype)
        slopes = torch.cat([slopes, torch.pow(2.0, -4.0 * odd / m)])
    i = torch.arange(Lk - Lq, Lk, device=device, dtype=dtype)[:, None]
    j = torch.arange(Lk, device=device, dtype=dtype)[None, :]
    return torch.where(j <= i, slopes[:, None, None] * (j - i), float("-inf"))


def tiled_attention(q, k, v, mask=None, tile=64):
    """In the inputs' dtype throughout, with a finite starting max instead of a
    -inf guard, and the key tiles cut up front with torch.split."""
    B, H, Lq, d = q.shape
    Lk = k.shape[2]
    low = torch.finfo(q.dtype).min  # exp(-inf - low) = 0: a row with nothing allowed yet stays 0
    m = torch.full((B, H, Lq, 1), low, dtype=q.dtype, device=q.device)
    total = torch.zeros(B, H, Lq, 1, dtype=q.dtype, device=q.device)
    acc = torch.zeros(B, H, Lq, v.shape[-1], dtype=q.dtype, device=q.device)
    q = q / math.sqrt(d)
    masks = [None] * len(range(0, Lk, tile)) if mask is None else \
        torch.broadcast_to(mask, (B, H, Lq, Lk)).split(tile, dim=-1)
    for kt, vt, keep in zip(k.split(tile, dim=2), v.split(tile, dim=2), masks):
        if keep is not None and not bool(keep.any()):
            continue
        s = q @ kt.transpose(-2, -1)
        if keep is not None:
            s = s.masked_fill(~keep, float("-inf"))
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True)).detach()
        p = torch.exp(s - m_new)
        alpha = torch.exp(m - m_new)
        total = total * alpha + p.sum(dim=-1, keepdim=True)
        acc = acc * alpha + p @ vt
        m = m_new
    return acc / torch.where(total == 0, 1.0, total)


def paged_attention(q, k_cache, v_cache, block_table, context_lens):
    B, H, Lq, d = q.shape
    N, _, S, _ = k_cache.shape
    flat_k = k_cache.transpose(1, 2).reshape(N * S, H, d)  # (N*S, H, d): one row per physical slot
    flat_v = v_cache.transpose(1, 2).reshape(N * S, H, -1)
    # (B, M*S): the physical slot of each logical position
    slot = (block_table.clamp(min=0)[:, :, None] * S + torch.arange(S, device=q.device)).flatten(1)
    pos = torch.arange(slot.shape[1], device=q.device)
    held = (pos < context_lens[:, None])[:, None, :, None]  # (B, 1, M*S, 1): stale slots never read
    k = torch.where(held, flat_k[slot].permute(0, 2, 1, 3), 0.0)  # (B, H, M*S, d)
    v = torch.where(held, flat_v[slot].permute(0, 2, 1, 3), 0.0)
    last = (context_lens[:, None] - Lq + torch.arange(Lq, device=q.device))[:, None, :, None]  # (B, 1, Lq, 1)
    out, _ = attention(q, k, v, pos <= last)
    return out


def attention_lse(q, k, v, mask=None):
    # the weights from the lse itself, exp(s - lse); float32 as the contract says
    s = (q.float() / math.sqrt(q.shape[-1])) @ k.float().mT
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    empty = torch.isneginf(s).all(dim=-1)
    lse = torch.logsumexp(s.masked_fill(empty[..., None], 0.0), dim=-1).masked_fill(empty, float("-inf"))
    w = torch.exp(s - lse.masked_fill(empty, 0.0)[..., None])  # exp(-inf) = 0 on empty rows
    return (w @ v.float()).to(q.dtype), lse


def merge_partials(out1, lse1, out2, lse2):
    # torch.logaddexp, with both-empty rows kept finite for its backward
    if out1.shape != out2.shape or lse1.shape != lse2.shape or out1.shape[:-1] != lse1.shape:
        raise ValueError("out1, out2 (..., Lq, dv) and lse1, lse2 (..., Lq) must agree")
    empty = torch.isneginf(lse1) & torch.isneginf(lse2)
    l1, l2 = lse1.float().masked_fill(empty, 0.0), lse2.float().masked_fill(empty, 0.0)
    lse = torch.logaddexp(l1, l2)
    out = torch.exp(l1 - lse)[..., None] * out1.float() + torch.exp(l2 - lse)[..., None] * out2.float()
    out = out.masked_fill(empty[..., None], 0.0)
    return out.to(out1.dtype), lse.masked_fill(empty, float("-inf"))


def tiled_attention_backward(q, k, v, out, lse, d_out, mask=None, tile=64):
    """float32 for half inputs (the contract asks it), the key tiles cut up front with
    torch.split, the row term from torch.einsum, the gradients of each tile collected in lists."""
    B, H, Lq, d = q.shape
    Lk = k.shape[2]
    work = torch.promote_types(q.dtype, torch.float32)
    qs = q.to(work) / math.sqrt(d)  # the scale folded into q
    do = d_out.to(work)
    D = torch.einsum("bhqe,bhqe->bhq", do, out.to(work))[..., None]
    shift = torch.nan_to_num(lse.to(work), neginf=0.0)[..., None]
    masks = [None] * len(range(0, Lk, tile)) if mask is None else \
        torch.broadcast_to(mask, (B, H, Lq, Lk)).split(tile, dim=-1)
    dq = torch.zeros(B, H, Lq, d, dtype=work, device=q.device)
    dks, dvs = [], []
    for kt, vt, keep in zip(k.split(tile, dim=2), v.split(tile, dim=2), masks):
        if keep is not None and not bool(keep.any()):
            dks.append(torch.zeros(kt.shape, dtype=work, device=q.device))
            dvs.append(torch.zeros(vt.shape, dtype=work, device=q.device))
            continue
        kt, vt = kt.to(work), vt.to(work)
        s = qs @ kt.mT
        if keep is not None:
            s = torch.where(keep, s, float("-inf"))
        p = (s - shift).exp()
        dvs.append(p.mT @ do)
        ds = p * (do @ vt.mT - D)
        dq = dq + ds @ kt / math.sqrt(d)
        dks.append(ds.mT @ qs)  # qs holds the 1/sqrt(d) already
    return dq.to(q.dtype), torch.cat(dks, 2).to(k.dtype), torch.cat(dvs, 2).to(v.dtype)


class _NativeTiled(torch.autograd.Function):
    """Forward: the online softmax of tiled_attention (torch.split tiles, a finite starting max),
    in float32 for half inputs so that the saved lse is exact enough; backward: the tiled
    tiled_attention_backward above, from the saved out and lse."""

    @staticmethod
    def forward(ctx, q, k, v, mask, tile):
        B, H, Lq, d = q.shape
        Lk = k.shape[2]
        work = torch.promote_types(q.dtype, torch.float32)
        qs = q.to(work) / math.sqrt(d)
        low = torch.finfo(work).min
        m = torch.full((B, H, Lq, 1), low, dtype=work, device=q.device)
        total = torch.zeros(B, H, Lq, 1, dtype=work, device=q.device)
        acc = torch.zeros(B, H, Lq, v.shape[-1], dtype=work, device=q.device)
        masks = [None] * len(range(0, Lk, tile)) if mask is None else \
            torch.broadcast_to(mask, (B, H, Lq, Lk)).split(tile, dim=-1)
        for kt, vt, keep in zip(k.split(tile, dim=2), v.split(tile, dim=2), masks):
            if keep is not None and not bool(keep.any()):
                continue
            s = qs @ kt.to(work).mT
            if keep is not None:
                s = torch.where(keep, s, float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            alpha = torch.exp(m - m_new)
            p = torch.exp(s - m_new)
            total = total * alpha + p.sum(dim=-1, keepdim=True)
            acc = acc * alpha + p @ vt.to(work)
            m = m_new
        empty = total == 0
        out = (acc / torch.where(empty, 1.0, total)).to(q.dtype)
        lse = torch.where(empty, float("-inf"), m + torch.log(torch.where(empty, 1.0, total)))[..., 0]
        ctx.save_for_backward(q, k, v, out, lse, mask)
        ctx.tile = tile
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, out, lse, mask = ctx.saved_tensors
        dq, dk, dv = tiled_attention_backward(q, k, v, out, lse, d_out, mask, ctx.tile)
        return dq, dk, dv, None, None


def tiled_attention_fn(q, k, v, mask=None, tile=64):
    return _NativeTiled.apply(q, k, v, mask, tile)


def ring_attention(q, k, v, world, layout="zigzag"):
    # each rank's shard as a dict; the ring as a list rotated by one at each step
    L = q.shape[-2]
    if world < 1 or L % (2 * world) or layout not in ("zigzag", "contiguous"):
        raise ValueError("2·world must divide L; layout is 'zigzag' or 'contiguous'")
    c = L // (2 * world)
    chunks = [(r, 2 * world - 1 - r) if layout == "zigzag" else (2 * r, 2 * r + 1) for r in range(world)]
    pos = [torch.cat([torch.arange(a * c, (a + 1) * c, device=q.device) for a in ch]) for ch in chunks]
    ring = [{"k": k[..., p, :], "v": v[..., p, :], "pos": p} for p in pos]
    out, lse = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device), None
    lse = torch.full(q.shape[:-1], float("-inf"), device=q.device)
    steps = [[] for _ in range(world)]
    for _ in range(world):
        for r in range(world):
            held = ring[r]
            allowed = pos[r][:, None] >= held["pos"][None, :]
            if not bool(allowed.any()):
                continue
            part = attention_lse(q[..., pos[r], :], held["k"], held["v"], allowed)
            steps[r].append(part)
            merged = merge_partials(out[..., pos[r], :], lse[..., pos[r]], *part)
            out[..., pos[r], :], lse[..., pos[r]] = merged
        ring = ring[-1:] + ring[:-1]
    return out, lse, steps


def cascade_attention(q, prefix_k, prefix_v, suffix_k, suffix_v, suffix_lengths):
    # the prefix with einsum, all N queries against it at once
    N, H, d = q.shape
    S = suffix_k.shape[2]
    if prefix_k.shape[0] != H or suffix_k.shape[:2] != (N, H) or suffix_lengths.shape != (N,) \
            or not bool(((suffix_lengths >= 0) & (suffix_lengths <= S)).all()):
        raise ValueError("shapes or suffix_lengths do not fit")
    s1 = torch.einsum("nhd,hpd->hnp", q.float(), prefix_k.float()) / math.sqrt(d)  # (H, N, P)
    l1 = torch.logsumexp(s1, dim=-1)  # (H, N)
    o1 = torch.einsum("hnp,hpe->nhe", torch.exp(s1 - l1[..., None]), prefix_v.float())
    real = torch.arange(S, device=q.device) < suffix_lengths[:, None]  # (N, S)
    o2, l2 = attention_lse(q[:, :, None], suffix_k, suffix_v, real[:, None, None, :])
    return merge_partials(o1.to(q.dtype), l1.T, o2[:, :, 0], l2[:, :, 0])


def sink_attention(q, k, v, sinks, mask=None):
    # float32 as the contract says; the max over scores and sink by torch.cat, then logsumexp
    s = (q.float() / math.sqrt(q.shape[-1])) @ k.float().mT
    if mask is not None:
        s = torch.where(mask, s, float("-inf"))
    both = torch.cat([s, sinks.float().view(1, -1, 1, 1).expand(*s.shape[:-1], 1)], dim=-1)
    w = torch.exp(both - torch.logsumexp(both, dim=-1, keepdim=True))[..., :-1]
    return (w @ v.float()).to(q.dtype)


def find_leaking_layer(model, x):
    """Each layer measured alone, on the input it receives in the model: the first one whose
    own influence reaches the future is the leaking layer (the same layer as the prefixes')."""
    h = x.detach()
    for k, layer in enumerate(model.layers):
        infl = influence_matrix(layer, h)  # (L, L)
        if bool((torch.triu(infl, diagonal=1) > 1e-3 * infl.max()).any()):
            return k
        h = layer(h).detach()
    return None


def leaks_across_padding(decoder, tokens, lengths):
    """Every padding token replaced by its successor modulo V, then by a random other id."""
    L, V = tokens.shape[1], decoder.vocab_size
    pad = torch.arange(L, device=tokens.device)[None, :] < (L - lengths)[:, None]  # (B, L)
    before = decoder(tokens, lengths)
    for shift in ((tokens + 1) % V, (tokens + torch.randint(1, V, tokens.shape, device=tokens.device)) % V):
        after = decoder(torch.where(pad, shift, tokens), lengths)
        if not torch.isclose(after[~pad], before[~pad], rtol=1e-4, atol=1e-5).all():
            return True
    return False


def block_sparse_forward(*args, **kwargs):
    """The course's Triton kernel (chapter 13): imported when called, triton being an extra."""
    from attnmask.kernels import block_sparse_forward as launch

    return launch(*args, **kwargs)


def block_sparse_backward(*args, **kwargs):
    from attnmask.kernels import block_sparse_backward as launch

    return launch(*args, **kwargs)
