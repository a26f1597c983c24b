"""Mutants of correct answers that full marks once let through (issue 38's mutation testing), one per
class: a -1e9 fill instead of -inf, a running max started at 0 or -1e9, an influence matrix squared in
half precision or in the wrong dtype, a paged gather whose NaN stale slots reach q's gradient, ring
positions computed in float32, sizes not refused, an lse computed in half precision, softmax over the
wrong dim in one branch. Each is otherwise the correct answer of :mod:`buggy.correct`."""

from __future__ import annotations

import math

import torch

from . import correct as ok
from . import parallel as ring_mistakes
from . import tiled as tiled_mistakes


def _softmax_fill(scores, mask, fill):
    x = scores.float().masked_fill(~mask, fill)
    w = torch.softmax(x, dim=-1)
    w = torch.where(mask.any(dim=-1, keepdim=True), w, torch.zeros_like(w))
    return w.to(scores.dtype)


def _attention_fill(q, k, v, mask=None, fill=-1e9):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is None:
        mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device)
    w = _softmax_fill(scores, mask, fill)
    return w @ v, w


def masked_softmax_fill_1e9(scores, mask):
    return _softmax_fill(scores, mask, -1e9)


def attention_fill_1e9(q, k, v, mask=None):
    return _attention_fill(q, k, v, mask)


def mha_fill_1e9(x_q, x_kv, w_q, w_k, w_v, w_o, n_heads, mask=None):
    B, Lq, D = x_q.shape
    Lk, d = x_kv.shape[1], D // n_heads
    q = (x_q @ w_q.T).view(B, Lq, n_heads, d).transpose(1, 2)
    k = (x_kv @ w_k.T).view(B, Lk, n_heads, d).transpose(1, 2)
    v = (x_kv @ w_v.T).view(B, Lk, n_heads, d).transpose(1, 2)
    out, _ = _attention_fill(q, k, v, mask)
    return out.transpose(1, 2).reshape(B, Lq, D) @ w_o.T


def mha_wrong_dim_unmasked(x_q, x_kv, w_q, w_k, w_v, w_o, n_heads, mask=None):
    """Softmax over the queries (dim -2) in the branch without a mask."""
    if mask is not None:
        return ok.multi_head_attention(x_q, x_kv, w_q, w_k, w_v, w_o, n_heads, mask)
    B, Lq, D = x_q.shape
    Lk, d = x_kv.shape[1], D // n_heads
    q = (x_q @ w_q.T).view(B, Lq, n_heads, d).transpose(1, 2)
    k = (x_kv @ w_k.T).view(B, Lk, n_heads, d).transpose(1, 2)
    v = (x_kv @ w_v.T).view(B, Lk, n_heads, d).transpose(1, 2)
    w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d), dim=-2)
    return (w @ v).transpose(1, 2).reshape(B, Lq, D) @ w_o.T


def kv_cache_fill_1e9(q, k_new, v_new, k_cache, v_cache):
    k = torch.cat([k_cache, k_new], dim=2)
    v = torch.cat([v_cache, v_new], dim=2)
    n, total = q.shape[2], k.shape[2]
    i = torch.arange(n, device=q.device)[:, None]
    j = torch.arange(total, device=q.device)[None, :]
    out, _ = _attention_fill(q, k, v, j <= i + (total - n))
    return out, k, v


def _paged_gather(q, k_cache, v_cache, block_table, context_lens):
    B, H, Lq, d = q.shape
    S = k_cache.shape[2]
    p = torch.arange(block_table.shape[1] * S, device=q.device)
    phys = block_table[:, p // S].clamp(min=0)
    k = k_cache[phys, :, p % S].transpose(1, 2)  # (B, H, M*S, d): stale slots too
    v = v_cache[phys, :, p % S].transpose(1, 2)
    q_pos = context_lens[:, None] - Lq + torch.arange(Lq, device=q.device)
    mask = (p[None, None, :] <= q_pos[:, :, None])[:, None]  # (B, 1, Lq, M*S)
    return k, v, mask


def paged_fill_1e9(q, k_cache, v_cache, block_table, context_lens):
    k, v, mask = _paged_gather(q, k_cache, v_cache, block_table, context_lens)
    held = mask.any(dim=2, keepdim=True).transpose(-2, -1)  # (B, 1, M*S, 1)
    out, _ = _attention_fill(q, k, torch.where(held, v, 0), mask)
    return out


def paged_nan_into_grad(q, k_cache, v_cache, block_table, context_lens):
    """Masks the scores of stale slots (right forward values), but 0 · NaN reaches q's gradient."""
    k, v, mask = _paged_gather(q, k_cache, v_cache, block_table, context_lens)
    scores = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~mask, float("-inf"))
    w = torch.softmax(scores, dim=-1)
    return w @ torch.where(mask.transpose(-2, -1).any(-1, keepdim=True), v, 0)


def _tiled(q, k, v, mask, tile, start_max):
    B, H, Lq, d = q.shape
    Lk = k.shape[2]
    if mask is not None:
        mask = mask.expand(B, H, Lq, Lk)
    x = q.float() / math.sqrt(d)
    m = torch.full((B, H, Lq, 1), start_max, device=q.device)
    total = torch.zeros(B, H, Lq, 1, device=q.device)
    acc = torch.zeros(B, H, Lq, v.shape[-1], device=q.device)
    for s0 in range(0, Lk, tile):
        keep = None if mask is None else mask[:, :, :, s0:s0 + tile]
        if keep is not None and not keep.any():
            continue
        s = x @ k[:, :, s0:s0 + tile].float().transpose(-2, -1)
        if keep is not None:
            s = s.masked_fill(~keep, float("-inf"))
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True)).detach()
        p = torch.exp(s - m_new)
        alpha = torch.exp(m - m_new)
        total = total * alpha + p.sum(dim=-1, keepdim=True)
        acc = acc * alpha + p @ v[:, :, s0:s0 + tile].float()
        m = m_new
    return torch.where(total > 0, acc / total.clamp(min=1e-30), 0.0).to(q.dtype)


def tiled_max_from_zero(q, k, v, mask=None, tile=64):
    return _tiled(q, k, v, mask, tile, 0.0)


def tiled_max_from_1e9(q, k, v, mask=None, tile=64):
    return _tiled(q, k, v, mask, tile, -1e9)


def influence_float32(f, x):
    """Right values, always float32 (the contract: x's dtype)."""
    jac = torch.autograd.functional.jacobian(f, x.detach().clone())
    return jac.float().pow(2).sum(dim=(1, 3)).sqrt()


def influence_half_squares(f, x):
    """Squares and sums in x's dtype: in float16 an entry above 256 squares to inf."""
    jac = torch.autograd.functional.jacobian(f, x.detach().clone())
    return jac.pow(2).sum(dim=(1, 3)).sqrt()


def zigzag_float_positions(L, world, rank, step, *, device=None):
    """Positions computed in float32, which skips odd integers past 2**24."""
    ok.zigzag_ring_mask(L, world, rank, step)  # the same refusals
    c = L // (2 * world)
    t = torch.arange(2 * c, device=device, dtype=torch.float32)

    def pos(r):
        return torch.where(t < c, r * c + t, (2 * world - 1 - r) * c + t - c)

    return pos(rank)[:, None] >= pos((rank - step) % world)[None, :]


def zigzag_accepts_any_step(L, world, rank, step, *, device=None):
    """Takes step modulo world and never checks L >= 1."""
    if world < 1 or L % (2 * world) or not 0 <= rank < world:
        raise ValueError("bad ring")
    if L < 1:
        return torch.zeros(0, 0, dtype=torch.bool, device=device)
    return ok.zigzag_ring_mask(L, world, rank, step % world, device=device)


def lse_half_precision(q, k, v, mask=None):
    """Scores, softmax and lse in the inputs' dtype; only the lse is cast to float32 at the end."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    has = ~torch.isneginf(s).all(dim=-1, keepdim=True)
    s = torch.where(has, s, 0.0)
    lse = torch.logsumexp(s, dim=-1).masked_fill(~has[..., 0], float("-inf"))
    w = torch.softmax(s, dim=-1) * has
    return (w @ v).to(q.dtype), lse.float()


#: (exercise, mutant): each must lose points on every seed.
MUTANTS = [
    ("masked_softmax", masked_softmax_fill_1e9),
    ("attention", attention_fill_1e9),
    ("multi_head_attention", mha_fill_1e9),
    ("kv_cache_attention", kv_cache_fill_1e9),
    ("paged_attention", paged_fill_1e9),
    ("paged_attention", paged_nan_into_grad),
    ("tiled_attention", tiled_max_from_zero),
    ("tiled_attention", tiled_max_from_1e9),
    ("influence_matrix", influence_float32),
    ("influence_matrix", influence_half_squares),
    ("zigzag_ring_mask", zigzag_float_positions),
    ("zigzag_ring_mask", zigzag_accepts_any_step),
    ("attention_lse", lse_half_precision),
    ("multi_head_attention", mha_wrong_dim_unmasked),
]


# ----------------------------------------------------------------- issue 46 item 5 (chapters 2, 5, 9, 10, 12)

def masked_softmax_fill_lowest(scores, mask):
    """torch.finfo(float32).min for -inf: allowed scores at that value tie with the blocked keys."""
    return _softmax_fill(scores, mask, torch.finfo(torch.float32).min)


def _sink(q, k, v, sinks, mask, *, fill=float("-inf"), sink_in_max=True, work=torch.float32):
    s = (q.to(work) @ k.to(work).transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, fill)
    sink = sinks.to(work).view(-1, 1)
    m = s.amax(dim=-1)
    m = torch.maximum(m, sink) if sink_in_max else torch.where(torch.isfinite(m), m, sink)
    m = m.detach()
    e = torch.exp(s - m[..., None])
    total = torch.exp(sink - m) + e.sum(dim=-1)
    return (e / total[..., None] @ v.to(work)).to(q.dtype)


def sink_fill_1e9(q, k, v, sinks, mask=None):
    return _sink(q, k, v, sinks, mask, fill=-1e9)


def sink_fill_lowest(q, k, v, sinks, mask=None):
    return _sink(q, k, v, sinks, mask, fill=torch.finfo(torch.float32).min)


def sink_max_without_sink(q, k, v, sinks, mask=None):
    """The running max over the allowed scores only (the sink where a row has none): a sink far above
    every score overflows exp(sink - m)."""
    return _sink(q, k, v, sinks, mask, sink_in_max=False)


def sink_softmax_in_half(q, k, v, sinks, mask=None):
    """Scores and softmax in the inputs' dtype: bfloat16 or float16 rounds scores near 1e3 by units."""
    return _sink(q, k, v, sinks, mask, work=q.dtype)


def topk_on_default_device(index_scores, k, *, causal=True):
    """The correct ranking, with its positions made by torch.arange(Lk) on the default device."""
    if k < 1:
        raise ValueError("k >= 1")
    _, Lq, Lk = index_scores.shape
    visible = ~torch.isnan(index_scores)
    if causal:
        p = (Lk - Lq + torch.arange(Lq))[:, None].to(index_scores.device)
        visible = visible & (torch.arange(Lk).to(index_scores.device) <= p)
    s = index_scores.masked_fill(~visible, float("-inf"))
    order = torch.sort(s, dim=-1, descending=True, stable=True).indices
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(Lk).expand_as(order))
    return visible & (rank < k)


def bd_refuses_one(L, block, *, device=None):
    if L < 2:
        raise ValueError("L >= 2")
    return ok.block_diffusion_mask(L, block, device=device)


def bd_accepts_zero(L, block, *, device=None):
    if L == 0 and block >= 1:
        return torch.zeros(0, 0, dtype=torch.bool, device=device)
    return ok.block_diffusion_mask(L, block, device=device)


def mha_on_default_device(x_q, x_kv, w_q, w_k, w_v, w_o, n_heads, mask=None):
    """The mask made for mask=None by torch.ones on the default device."""
    if mask is None:
        mask = torch.ones(x_q.shape[1], x_kv.shape[1], dtype=torch.bool)
    return ok.multi_head_attention(x_q, x_kv, w_q, w_k, w_v, w_o, n_heads, mask)


# "A tensor made on the default device" in the exercises that take tensors: each is right wherever
# the default device is the inputs' device (a CPU-only machine, until the checks move the default).


def ring_on_default_device(q, k, v, world, layout="zigzag"):
    """The ring's positions made by torch.arange on the default device, then moved with .to()."""
    return ring_mistakes._ring_attention(
        q, k, v, world, layout, positions=lambda L, w, r, lay: ok.ring_positions(L, w, r, lay).to(q.device))


def cascade_on_default_device(q, prefix_k, prefix_v, suffix_k, suffix_v, suffix_lengths):
    """The suffix's real keys compared with a torch.arange(S) made on the default device."""
    N, H, d = q.shape
    S = suffix_k.shape[2]
    if prefix_k.shape[0] != H or suffix_k.shape[:2] != (N, H) or suffix_lengths.shape != (N,) \
            or bool((suffix_lengths < 0).any()) or bool((suffix_lengths > S).any()):
        raise ValueError("shapes or lengths do not fit")
    o1, l1 = ok.attention_lse(q.transpose(0, 1).unsqueeze(0), prefix_k.unsqueeze(0), prefix_v.unsqueeze(0))
    real = torch.arange(S) < suffix_lengths[:, None]
    o2, l2 = ok.attention_lse(q.unsqueeze(2), suffix_k, suffix_v, real[:, None, None, :])
    return ok.merge_partials(o1[0].transpose(0, 1), l1[0].transpose(0, 1), o2[:, :, 0], l2[:, :, 0])


def _leaks(decoder, tokens, lengths, *, positions_here=True, refill_here=True):
    L = tokens.shape[1]
    real = torch.arange(L, device=tokens.device if positions_here else None) >= L - lengths[:, None]
    base = decoder(tokens, lengths)
    V = decoder.vocab_size
    for _ in range(3):
        here = tokens.device if refill_here else None
        other = (tokens + torch.randint(1, V, tokens.shape, device=here)) % V
        out = decoder(torch.where(real, tokens, other), lengths)
        if not torch.allclose(out[real], base[real], rtol=1e-4, atol=1e-5):
            return True
    return False


def leaks_refill_on_default_device(decoder, tokens, lengths):
    """The new padding tokens drawn by torch.randint on the default device."""
    return _leaks(decoder, tokens, lengths, refill_here=False)


def leaks_positions_on_default_device(decoder, tokens, lengths):
    """The positions that tell real tokens from padding made by torch.arange on the default device."""
    return _leaks(decoder, tokens, lengths, positions_here=False)


def influence_on_default_device(f, x):
    """The influence matrix row by row (one backward per output position), into a torch.zeros made on
    the default device."""
    x = x.detach().clone().requires_grad_(True)
    y = f(x)
    L = x.shape[0]
    infl = torch.zeros(L, L)
    for i in range(L):
        for j in range(y.shape[1]):
            (g,) = torch.autograd.grad(y[i, j], x, retain_graph=True)
            infl[i] += g.float().pow(2).sum(dim=-1)
    return infl.sqrt().to(x.dtype)


def lse_on_default_device(q, k, v, mask=None):
    """The mask made for mask=None by torch.ones on the default device."""
    if mask is None:
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool)
    return ok.attention_lse(q, k, v, mask)


def tiled_on_default_device(q, k, v, mask=None, tile=64):
    """The mask made for mask=None by torch.ones on the default device."""
    if mask is None:
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool)
    return ok.tiled_attention(q, k, v, mask, tile)


def padded_chunked_on_default_device(attention_mask, Lq, chunk):
    """The key positions made by torch.arange(Lk) on the default device."""
    Lk = attention_mask.shape[-1]
    if Lq < 1 or Lq > Lk or chunk < 1:
        raise ValueError(f"bad sizes: Lq={Lq}, Lk={Lk}, chunk={chunk}")
    pad = (attention_mask.long().cumsum(-1) == 0).sum(-1)[:, None, None, None]
    p = torch.arange(Lk - Lq, Lk, device=attention_mask.device)[:, None]
    j = torch.arange(Lk)
    same = (j - pad).div(chunk, rounding_mode="floor") == (p - pad).div(chunk, rounding_mode="floor")
    return (j <= p) & same & attention_mask[:, None, None, :]


def padding_mask_on_default_device(lengths, max_len):
    return torch.arange(max_len)[None, :] < lengths[:, None]


#: Issue 46 item 5's classes: (exercise, mutant), each caught at every seed.
CLASSES_46 = [
    ("masked_softmax", masked_softmax_fill_lowest),
    ("sink_attention", sink_fill_1e9),
    ("sink_attention", sink_fill_lowest),
    ("sink_attention", sink_max_without_sink),
    ("sink_attention", sink_softmax_in_half),
    ("topk_selection_mask", topk_on_default_device),
    ("block_diffusion_mask", bd_refuses_one),
    ("block_diffusion_mask", bd_accepts_zero),
    ("multi_head_attention", mha_on_default_device),
    ("cascade_attention", cascade_on_default_device),
    ("influence_matrix", influence_on_default_device),
    ("attention_lse", lse_on_default_device),
    ("tiled_attention", tiled_on_default_device),
    ("padded_chunked_mask", padded_chunked_on_default_device),
    ("padding_mask", padding_mask_on_default_device),
]


def ring_lse_in_q_dtype(q, k, v, world, layout="zigzag"):
    """The merged lse stored in q's dtype (torch.empty(..., dtype=q.dtype)): float16 for float16 q."""
    out, lse, steps = ok.ring_attention(q, k, v, world, layout)
    return out, lse.to(q.dtype), steps


def decay_in_gates_dtype(log_gates, doc_ids=None):
    """D returned in the gates' dtype (float16 for float16 gates), not float32."""
    return ok.decay_mask(log_gates, doc_ids).to(log_gates.dtype)


def decay_cumsum_in_gates_dtype(log_gates, doc_ids=None):
    """The prefix sums taken in the gates' own dtype: half precision loses the small gates."""
    c = log_gates.clamp(min=-1e4).cumsum(-1).float()
    L = c.shape[-1]
    pos = torch.arange(L, device=c.device)
    allowed = (pos[None, :] <= pos[:, None]).expand(c.shape[0], L, L)
    if doc_ids is not None:
        allowed = allowed & (doc_ids[:, :, None] == doc_ids[:, None, :])
    return torch.exp((c[:, :, None] - c[:, None, :]).masked_fill(~allowed, float("-inf")))


CLASSES_46 += [
    ("tiled_attention_backward", tiled_mistakes.backward_fill_1e9),
    ("decay_mask", decay_cumsum_in_gates_dtype),
    ("decay_mask", decay_in_gates_dtype),
    ("ring_attention", ring_lse_in_q_dtype),
    ("ring_attention", ring_on_default_device),
    ("leaks_across_padding", leaks_refill_on_default_device),
    ("leaks_across_padding", leaks_positions_on_default_device),
]


def padchunk_reads_values(attention_mask, Lq, chunk):
    """Each row's padding read back with int(...) and the rows built one by one: right values, but a
    value read back on every row (it fails on meta, and breaks a compiled graph)."""
    rows = [ok.padded_chunked_mask(attention_mask[b:b + 1], Lq, chunk)
            if int((attention_mask[b].long().cumsum(-1) == 0).sum()) >= 0 else None
            for b in range(attention_mask.shape[0])]
    return torch.cat(rows)


CLASSES_46 += [("padded_chunked_mask", padchunk_reads_values)]
