"""Grader fixture: the classic masking mistakes, one per exercise (two are correct)."""

import math
import os

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


def padded_encoder(x, lengths, weights):
    # correct: builds its own key mask rather than reusing this file's off-by-one padding_mask
    real = torch.arange(x.shape[1], device=lengths.device)[None, :] < lengths[:, None]  # (B, L)
    keys = real[:, None, :]  # (B, 1, L)
    h = x
    for wq, wk, wv in weights:
        scores = (h @ wq) @ (h @ wk).transpose(-2, -1) / math.sqrt(x.shape[-1])  # (B, L, L)
        h = h + torch.softmax(scores.masked_fill(~keys, float("-inf")), dim=-1) @ (h @ wv)
    return h


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


def tile_lists(mask, tile=64):
    B, H, Lq, Lk = mask.shape
    nq, nk = -(-Lq // tile), -(-Lk // tile)
    padded = torch.nn.functional.pad(mask, (0, nk * tile - Lk, 0, nq * tile - Lq), value=False)
    allowed = padded.view(B, H, nq, tile, nk, tile).sum(dim=(3, 5))  # (B, H, nq, nk)
    rows = (Lq - torch.arange(nq, device=mask.device) * tile).clamp(max=tile)
    cols = (Lk - torch.arange(nk, device=mask.device) * tile).clamp(max=tile)
    full = allowed == rows[:, None] * cols[None, :]
    partial = (allowed > 0) & ~full
    out = []
    for chosen in (partial, full):
        order = torch.argsort((~chosen).to(torch.uint8), dim=-1, stable=True)
        out += [chosen.sum(dim=-1, dtype=torch.int32), order.to(torch.int32)]
    return tuple(out)

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


def _tiled_backward(q, k, v, out, lse, d_out, mask=None, tile=64):
    B, H, Lq, d = q.shape
    Lk = k.shape[2]
    if mask is not None:
        mask = torch.broadcast_to(mask, (B, H, Lq, Lk))  # a view: no copy
    f = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    x, g = q.to(f) / math.sqrt(d), d_out.to(f)  # the scale folded into q
    D = (g * out.to(f)).sum(dim=-1, keepdim=True)  # (B, H, Lq, 1)
    lse = lse.to(f)[..., None]
    shift = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))  # empty rows: exp(-inf - 0) = 0
    dq = torch.zeros(B, H, Lq, d, dtype=f, device=q.device)
    dk = torch.zeros(B, H, Lk, d, dtype=f, device=q.device)
    dv = torch.zeros(B, H, Lk, v.shape[-1], dtype=f, device=q.device)
    for c in range(0, Lk, tile):
        keep = None if mask is None else mask[..., c:c + tile]  # (B, H, Lq, t)
        if keep is not None and not keep.any():
            continue  # all weights 0: k and v unread, their gradients stay 0
        kt, vt = k[:, :, c:c + tile].to(f), v[:, :, c:c + tile].to(f)
        s = x @ kt.transpose(-2, -1)  # (B, H, Lq, t)
        if keep is not None:
            s = s.masked_fill(~keep, float("-inf"))
        p = torch.exp(s - shift)
        dv[:, :, c:c + tile] = p.transpose(-2, -1) @ g
        ds = p * (g @ vt.transpose(-2, -1) - D)
        dq = dq + ds @ kt / math.sqrt(d)
        dk[:, :, c:c + tile] = ds.transpose(-2, -1) @ x  # x holds the 1/sqrt(d)
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
        return (*_tiled_backward(q, k, v, out, lse, d_out, mask, ctx.tile), None, None)


def tiled_attention_fn(q, k, v, mask=None, tile=64):
    return TiledAttentionFunction.apply(q, k, v, mask, tile)

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


# Correct answers to the exercises added in the fifth step (the report tests list every exercise).

def find_leaking_layer(model, x: torch.Tensor) -> int | None:
    """The index of the first layer at which the model's output starts to depend on the future.

    Args:
        model: has model.layers, a list of callables (L, D) -> (L, D) applied in order.
        x: float (L, D), the input at which the influence is measured.

    Returns:
        The smallest k such that layers[:k + 1] applied to x has an influence entry [i, j] with
        j > i above 1e-3 times the matrix's largest entry; None when no prefix has one.
    """
    layers = list(model.layers)
    for k in range(len(layers)):

        def prefix(h, first=layers[:k + 1]):  # layers 0..k, bound now (not the loop's last k)
            for layer in first:
                h = layer(h)
            return h

        infl = influence_matrix(prefix, x)  # (L, L)
        future = infl.triu(diagonal=1)  # entries [i, j] with j > i
        if bool((future > 1e-3 * infl.max()).any()):
            return k
    return None


def leaks_across_padding(decoder, tokens: torch.Tensor, lengths: torch.Tensor) -> bool:
    """Whether decoder's outputs at real positions depend on the padding tokens.

    Args:
        decoder: decoder(tokens, lengths) -> float (B, L, V); decoder.vocab_size is V.
        tokens: long (B, L), left-padded: row b's real tokens are its last lengths[b].
        lengths: long (B,), 1 <= lengths[b] <= L.

    Returns:
        True when refilling the padding with other token ids changes an output at a real position
        beyond torch.allclose(rtol=1e-4, atol=1e-5); else False.
    """
    L, V = tokens.shape[1], decoder.vocab_size
    real = torch.arange(L, device=tokens.device) >= L - lengths[:, None]  # (B, L): left padding
    before = decoder(tokens, lengths)  # (B, L, V)
    for _ in range(3):
        shift = torch.randint(1, V, tokens.shape, device=tokens.device)  # every padding token changes
        after = decoder(torch.where(real, tokens, (tokens + shift) % V), lengths)
        if not torch.allclose(after[real], before[real], rtol=1e-4, atol=1e-5):
            return True
    return False


def padded_chunked_mask(attention_mask: torch.Tensor, Lq: int, chunk: int) -> torch.Tensor:
    """Chunked local attention over left-padded rows (transformers' chunked overlay with left padding).

    Args:
        attention_mask: bool (B, Lk), True = a real token; left padding is the leading False of a row.
        Lq: the queries are the last Lq of the Lk positions, 1 <= Lq <= Lk. chunk: chunk size, >= 1.

    Returns:
        bool (B, 1, Lq, Lk): query i of row b at p = Lk - Lq + i sees key j iff attention_mask[b, j], j <= p
        and (j - pad_b) // chunk == (p - pad_b) // chunk, pad_b the number of leading False of row b.
    """
    Lk = attention_mask.shape[-1]
    if Lq < 1 or Lq > Lk or chunk < 1:
        raise ValueError(f"expected 1 <= Lq <= Lk and chunk >= 1; got Lq = {Lq}, Lk = {Lk}, chunk = {chunk}")
    device = attention_mask.device
    pad = (attention_mask.long().cumsum(dim=-1) == 0).sum(dim=-1)[:, None, None, None]  # (B, 1, 1, 1)
    p = torch.arange(Lk - Lq, Lk, device=device)[:, None]  # (Lq, 1)
    j = torch.arange(Lk, device=device)[None, :]  # (1, Lk)
    same_chunk = (j - pad).div(chunk, rounding_mode="floor") == (p - pad).div(chunk, rounding_mode="floor")
    return (j <= p) & same_chunk & attention_mask[:, None, None, :]  # (B, 1, Lq, Lk)


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, world: int,
                   layout: str = "zigzag") -> tuple[torch.Tensor, torch.Tensor, list]:
    """Causal attention on a simulated ring of `world` ranks (context parallelism).

    Args:
        q, k: (B, H, L, d). v: (B, H, L, dv). world: ranks, 2·world divides L.
        layout: "zigzag" (rank r owns chunks r and 2·world - 1 - r) or "contiguous" (chunks 2r and 2r + 1).

    Returns:
        (out (B, H, L, dv) in q's dtype, lse (B, H, L) float32, in global order;
         steps: a list of `world` lists, steps[r] the (out_s (B, H, 2c, dv), lse_s (B, H, 2c)) of each step
         rank r ran, in ring order, all-False steps skipped).
    """
    L = q.shape[-2]
    if world < 1 or L % (2 * world) or layout not in ("zigzag", "contiguous"):
        raise ValueError(f"expected 2·world dividing L and layout 'zigzag' or 'contiguous'; "
                         f"got L = {L}, world = {world}, layout = {layout!r}")
    c = L // (2 * world)
    t = torch.arange(c, device=q.device)

    def positions(r):  # (2c,): the global positions of rank r's tokens, in local order
        first, second = (r, 2 * world - 1 - r) if layout == "zigzag" else (2 * r, 2 * r + 1)
        return torch.cat([first * c + t, second * c + t])

    mine = [positions(r) for r in range(world)]
    held = [(k[..., p, :], v[..., p, :], p) for p in mine]  # held[r]: the shard rank r holds now
    running = [None] * world
    steps = [[] for _ in range(world)]
    for _ in range(world):
        for r in range(world):
            k_s, v_s, k_pos = held[r]
            allowed = mine[r][:, None] >= k_pos[None, :]  # (2c, 2c), by global position
            if not bool(allowed.any()):
                continue  # nothing to attend: skipped, as a kernel skips it
            part = attention_lse(q[..., mine[r], :], k_s, v_s, allowed)
            steps[r].append(part)
            running[r] = part if running[r] is None else merge_partials(*running[r], *part)
        held = held[-1:] + held[:-1]  # every rank passes its shard on to rank r + 1
    out = torch.empty(*q.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
    for r in range(world):  # its own shard (step 0) always has allowed keys
        out[..., mine[r], :], lse[..., mine[r]] = running[r]
    return out, lse, steps


def cascade_attention(q: torch.Tensor, prefix_k: torch.Tensor, prefix_v: torch.Tensor,
                      suffix_k: torch.Tensor, suffix_v: torch.Tensor,
                      suffix_lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoding step of N sequences sharing a prefix: the prefix read once, each suffix alone, merged.

    Args:
        q: (N, H, d). prefix_k: (H, P, d). prefix_v: (H, P, dv).
        suffix_k: (N, H, S, d). suffix_v: (N, H, S, dv).
        suffix_lengths: long (N,), 0 <= n <= S: the real keys of each suffix (the rest is padding).

    Returns:
        (out (N, H, dv) in q's dtype, lse (N, H) float32): attention over the prefix and the real
        suffix keys.
    """
    N, H, d = q.shape
    S = suffix_k.shape[2]
    if prefix_k.dim() != 3 or prefix_k.shape[0] != H or suffix_k.shape[:2] != (N, H) \
            or suffix_v.shape[:3] != (N, H, S) or suffix_lengths.shape != (N,):
        raise ValueError(f"expected q (N, H, d), prefix (H, P, .), suffix (N, H, S, .), suffix_lengths (N,); "
                         f"got {tuple(q.shape)}, {tuple(prefix_k.shape)}, {tuple(suffix_k.shape)}, "
                         f"{tuple(suffix_lengths.shape)}")
    if bool((suffix_lengths < 0).any()) or bool((suffix_lengths > S).any()):
        raise ValueError(f"suffix_lengths must lie in 0 .. S = {S}; got {suffix_lengths.tolist()}")
    rows = q.transpose(0, 1).unsqueeze(0)  # (1, H, N, d): every sequence's query, side by side
    shared_out, shared_lse = attention_lse(rows, prefix_k.unsqueeze(0), prefix_v.unsqueeze(0))  # read once
    shared_out, shared_lse = shared_out[0].transpose(0, 1), shared_lse[0].transpose(0, 1)  # (N, H, .)
    real = torch.arange(S, device=q.device) < suffix_lengths.to(q.device)[:, None]  # (N, S)
    own_out, own_lse = attention_lse(q.unsqueeze(2), suffix_k, suffix_v, real[:, None, None, :])
    return merge_partials(shared_out, shared_lse, own_out[:, :, 0], own_lse[:, :, 0])


def sink_attention(q, k, v, sinks, mask=None):
    s = q.float() @ k.float().transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, Lq, Lk)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    sink = sinks.float().view(-1, 1)  # (H, 1): broadcasts against (B, H, Lq)
    m = torch.maximum(s.amax(dim=-1), sink).detach()  # (B, H, Lq): finite, the sink is
    e = torch.exp(s - m[..., None])  # (B, H, Lq, Lk), 0 where blocked
    total = torch.exp(sink - m) + e.sum(dim=-1)  # (B, H, Lq)
    return (e / total[..., None] @ v.float()).to(q.dtype)


def topk_selection_mask(index_scores, k, *, causal=True):
    if k < 1:
        raise ValueError(f"k = {k}: each query must keep at least one key (k >= 1)")
    _, Lq, Lk = index_scores.shape
    dev = index_scores.device
    visible = ~torch.isnan(index_scores)  # (B, Lq, Lk)
    if causal:
        p = (Lk - Lq + torch.arange(Lq, device=dev))[:, None]  # (Lq, 1)
        visible = visible & (torch.arange(Lk, device=dev) <= p)
    by_score = torch.sort(index_scores.masked_fill(~visible, float("-inf")), dim=-1, descending=True,
                          stable=True).indices
    first = torch.sort(visible.gather(-1, by_score).to(torch.uint8), dim=-1, descending=True,
                       stable=True).indices
    order = by_score.gather(-1, first)  # (B, Lq, Lk): key indices, best first
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(Lk, device=dev).expand_as(order))
    return visible & (rank < k)


def block_diffusion_mask(L, block, *, device=None):
    if block < 1 or L < 1 or L % block:
        raise ValueError(f"block = {block} must be >= 1 and divide L = {L}")
    t = torch.arange(2 * L, device=device)
    clean = t >= L  # (2L,)
    blk = (t % L) // block  # (2L,)
    q_clean, kv_clean = clean[:, None], clean[None, :]
    q_blk, kv_blk = blk[:, None], blk[None, :]
    own_noisy = ~q_clean & ~kv_clean & (q_blk == kv_blk)
    earlier_clean = ~q_clean & kv_clean & (kv_blk < q_blk)
    block_causal = q_clean & kv_clean & (kv_blk <= q_blk)
    return own_noisy | earlier_clean | block_causal  # (2L, 2L)


def decay_mask(log_gates, doc_ids=None):
    g = log_gates.float()
    L = g.shape[-1]
    i = torch.arange(L, device=g.device)
    terms = g[:, :, None].masked_fill(i[:, None] <= i[None, :], 0.0)  # (B, L, L): [b, t, j]
    seg = terms.cumsum(dim=1)  # (B, L, L): [b, i, j]
    keep = i[:, None] >= i[None, :]
    if doc_ids is not None:
        keep = keep & (doc_ids[:, :, None] == doc_ids[:, None, :])
    return torch.exp(seg.masked_fill(~keep, float("-inf")))


# Chapter 13's kernels need triton (the [kernels] extra); without it they are not defined, and the
# grader skips chapter 13. Without CUDA, Triton's interpreter runs them on the CPU.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

if triton is not None:
    @triton.jit
    def forward_kernel(Q, K, V, MASK, KV_NUM, KV_IDX, FULL_NUM, FULL_IDX, OUT, LSE,
                       Lq, Lk, d, dv, nq, nk, scale,
                       TILE: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr):
        """One query tile of attention over the listed key tiles: writes its rows of OUT and LSE."""
        i = tl.program_id(0)
        bh = tl.program_id(1)
        rows = i * TILE + tl.arange(0, TILE)
        keys = tl.arange(0, TILE)
        cd, cv = tl.arange(0, BD), tl.arange(0, BDV)
        row_ok = rows < Lq
        q = tl.load(Q + (bh * Lq + rows[:, None]) * d + cd[None, :],
                    mask=row_ok[:, None] & (cd[None, :] < d), other=0.0).to(tl.float32)
        m_i = tl.full((TILE,), float("-inf"), tl.float32)
        l_i = tl.zeros((TILE,), tl.float32)
        acc = tl.zeros((TILE, BDV), tl.float32)
        lists = bh * nq + i
        n_full = tl.load(FULL_NUM + lists)
        n_part = tl.load(KV_NUM + lists)
        for t in range(0, n_full + n_part):
            partial = keys * 0 + t >= n_full  # (TILE,): whether this tile came from the partial list
            if t >= n_full:
                j = tl.load(KV_IDX + lists * nk + (t - n_full))
            else:
                j = tl.load(FULL_IDX + lists * nk + t)
            cols = j * TILE + keys
            col_ok = cols < Lk
            k = tl.load(K + (bh * Lk + cols[:, None]) * d + cd[None, :],
                        mask=col_ok[:, None] & (cd[None, :] < d), other=0.0).to(tl.float32)
            v = tl.load(V + (bh * Lk + cols[:, None]) * dv + cv[None, :],
                        mask=col_ok[:, None] & (cv[None, :] < dv), other=0.0).to(tl.float32)
            keep = row_ok[:, None] & col_ok[None, :]
            # The mask is loaded only for a partial tile: a full tile's cells are never read.
            allowed = tl.load(MASK + (bh * Lq + rows[:, None]) * Lk + cols[None, :], mask=keep & partial[None, :], other=1)  # noqa: E501
            s = tl.where(keep & (allowed != 0), tl.dot(q, tl.trans(k)) * scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            shift = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp(m_i - shift)
            p = tl.exp(s - shift[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p, v)
            m_i = m_new
        empty = l_i == 0.0
        safe = tl.where(empty, 1.0, l_i)
        tl.store(OUT + (bh * Lq + rows[:, None]) * dv + cv[None, :], (acc / safe[:, None]).to(OUT.dtype.element_ty),  # noqa: E501
                 mask=row_ok[:, None] & (cv[None, :] < dv))
        tl.store(LSE + bh * Lq + rows, tl.where(empty, float("-inf"), m_i + tl.log(safe)), mask=row_ok)


    @triton.jit
    def backward_kernel(Q, K, V, OUT, LSE, DOUT, MASK, KV_NUM, KV_IDX, FULL_NUM, FULL_IDX, DQ, DK, DV,
                        Lq, Lk, d, dv, nq, nk, scale,
                        TILE: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr):
        """One query tile's part of the gradients: writes its rows of DQ, adds to DK and DV."""
        i = tl.program_id(0)
        bh = tl.program_id(1)
        rows = i * TILE + tl.arange(0, TILE)
        keys = tl.arange(0, TILE)
        cd, cv = tl.arange(0, BD), tl.arange(0, BDV)
        row_ok = rows < Lq
        qmask = row_ok[:, None] & (cd[None, :] < d)
        omask = row_ok[:, None] & (cv[None, :] < dv)
        q = tl.load(Q + (bh * Lq + rows[:, None]) * d + cd[None, :], mask=qmask, other=0.0).to(tl.float32)
        o = tl.load(OUT + (bh * Lq + rows[:, None]) * dv + cv[None, :], mask=omask, other=0.0).to(tl.float32)
        do = tl.load(DOUT + (bh * Lq + rows[:, None]) * dv + cv[None, :], mask=omask, other=0.0).to(tl.float32)  # noqa: E501
        lse = tl.load(LSE + bh * Lq + rows, mask=row_ok, other=float("-inf"))
        seen = lse != float("-inf")
        lse = tl.where(seen, lse, 0.0)
        D = tl.sum(do * o, 1)
        dq = tl.zeros((TILE, BD), tl.float32)
        lists = bh * nq + i
        n_full = tl.load(FULL_NUM + lists)
        n_part = tl.load(KV_NUM + lists)
        for t in range(0, n_full + n_part):
            partial = keys * 0 + t >= n_full  # (TILE,): whether this tile came from the partial list
            if t >= n_full:
                j = tl.load(KV_IDX + lists * nk + (t - n_full))
            else:
                j = tl.load(FULL_IDX + lists * nk + t)
            cols = j * TILE + keys
            col_ok = cols < Lk
            kmask = col_ok[:, None] & (cd[None, :] < d)
            vmask = col_ok[:, None] & (cv[None, :] < dv)
            k = tl.load(K + (bh * Lk + cols[:, None]) * d + cd[None, :], mask=kmask, other=0.0).to(tl.float32)
            v = tl.load(V + (bh * Lk + cols[:, None]) * dv + cv[None, :], mask=vmask, other=0.0).to(tl.float32)  # noqa: E501
            keep = row_ok[:, None] & col_ok[None, :]
            allowed = tl.load(MASK + (bh * Lq + rows[:, None]) * Lk + cols[None, :], mask=keep & partial[None, :], other=1)  # noqa: E501
            s = tl.dot(q, tl.trans(k)) * scale
            p = tl.where(keep & (allowed != 0) & seen[:, None], tl.exp(s - lse[:, None]), 0.0)
            ds = p * (tl.dot(do, tl.trans(v)) - D[:, None])
            tl.atomic_add(DV + (bh * Lk + cols[:, None]) * dv + cv[None, :], tl.dot(tl.trans(p), do), mask=vmask)  # noqa: E501
            tl.atomic_add(DK + (bh * Lk + cols[:, None]) * d + cd[None, :], tl.dot(tl.trans(ds), q) * scale,
                          mask=kmask)
            dq += tl.dot(ds, k) * scale
        tl.store(DQ + (bh * Lq + rows[:, None]) * d + cd[None, :], dq.to(DQ.dtype.element_ty), mask=qmask)


def _block(n: int) -> int:
    """A power of two >= n and >= 16 (tl.arange takes powers of two; tl.dot on a GPU 16 or more)."""
    return max(16, triton.next_power_of_2(n))


def block_sparse_forward(q, k, v, mask, kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices,
                         tile=16):
    """Attention over a block-sparse mask, computed by forward_kernel.

    Args:
        q: (B, H, Lq, d); k: (B, H, Lk, d); v: (B, H, Lk, dv), one dtype.
        mask: bool (B, H, Lq, Lk), True = may attend; read only inside partial tiles.
        kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices: int32 (B, H, nq) counts and
            (B, H, nq, nk) lists of the partial and of the full key tiles of each query tile.
        tile: the tiles' size, a power of two.

    Returns:
        (out, lse): out (B, H, Lq, dv) in q's dtype, 0 on a row with no allowed key; lse (B, H, Lq)
        float32, the natural log of the row's sum of exp(q·k / sqrt(d)), -inf on such a row.
    """
    B, H, Lq, d = q.shape
    Lk, dv = k.shape[2], v.shape[3]
    nq, nk = triton.cdiv(Lq, tile), triton.cdiv(Lk, tile)
    out = torch.empty(B, H, Lq, dv, dtype=q.dtype, device=q.device)
    lse = torch.empty(B, H, Lq, dtype=torch.float32, device=q.device)
    lists = [t.contiguous() for t in (kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices)]
    forward_kernel[(nq, B * H)](q.contiguous(), k.contiguous(), v.contiguous(), mask.contiguous(), *lists,
                                out, lse, Lq, Lk, d, dv, nq, nk, 1.0 / math.sqrt(d),
                                TILE=tile, BD=_block(d), BDV=_block(dv))
    return out, lse


def block_sparse_backward(q, k, v, out, lse, d_out, mask, kv_num_blocks, kv_indices, full_kv_num_blocks,
                          full_kv_indices, tile=16):
    """The gradients of block_sparse_forward, computed by backward_kernel.

    Args:
        q, k, v, mask, the four tile lists and tile: as for block_sparse_forward.
        out: (B, H, Lq, dv) and lse: float32 (B, H, Lq), what the forward returned.
        d_out: (B, H, Lq, dv), the loss's gradient with respect to out.

    Returns:
        (dq, dk, dv), shaped and typed like q, k and v; 0 where no allowed cell reaches.
    """
    B, H, Lq, d = q.shape
    Lk, dv = k.shape[2], v.shape[3]
    nq, nk = triton.cdiv(Lq, tile), triton.cdiv(Lk, tile)
    dq = torch.empty(B, H, Lq, d, dtype=q.dtype, device=q.device)
    dk = torch.zeros(B, H, Lk, d, dtype=torch.float32, device=q.device)  # summed over query tiles
    dvv = torch.zeros(B, H, Lk, dv, dtype=torch.float32, device=q.device)
    lists = [t.contiguous() for t in (kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices)]
    backward_kernel[(nq, B * H)](q.contiguous(), k.contiguous(), v.contiguous(), out.contiguous(),
                                 lse.contiguous(), d_out.contiguous(), mask.contiguous(), *lists,
                                 dq, dk, dvv, Lq, Lk, d, dv, nq, nk, 1.0 / math.sqrt(d),
                                 TILE=tile, BD=_block(d), BDV=_block(dv))
    return dq, dk.to(k.dtype), dvv.to(v.dtype)
