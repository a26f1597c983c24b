"""Chapter 11's classic mistakes, each otherwise correct: log-sum-exps, merged partial
results, zigzag ring masks and chunked local masks. Listed in :data:`buggy.mistakes.BUGS`."""

from __future__ import annotations

import math

import torch

from . import correct as ok

# --------------------------------------------------------------------------- attention_lse


def _scores(q, k, mask, scale=True):
    s = q.float() @ k.float().transpose(-2, -1)
    if scale:
        s = s / math.sqrt(q.shape[-1])
    return s if mask is None else s.masked_fill(~mask, float("-inf"))


def _safe_lse(s):
    empty = torch.isneginf(s).all(dim=-1)
    return torch.logsumexp(s.masked_fill(empty[..., None], 0.0), dim=-1).masked_fill(empty, float("-inf"))


def lse_unscaled(q, k, v, mask=None):
    out, _ = ok.attention_lse(q, k, v, mask)
    return out, _safe_lse(_scores(q, k, mask, scale=False))


def lse_unmasked(q, k, v, mask=None):
    out, _ = ok.attention_lse(q, k, v, mask)
    return out, torch.logsumexp(_scores(q, k, None), dim=-1)  # every key, the blocked ones too


def lse_half(q, k, v, mask=None):
    out, lse = ok.attention_lse(q, k, v, mask)
    return out, lse.to(q.dtype)


def lse_empty_zero(q, k, v, mask=None):
    out, lse = ok.attention_lse(q, k, v, mask)
    return out, lse.nan_to_num(neginf=0.0)  # "no NaN, no inf" taken one step too far


def lse_additive_mask(q, k, v, mask=None):
    s = q.float() @ k.float().transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s + torch.zeros_like(s).masked_fill(~mask, float("-inf"))  # an added -inf bias
    lse = torch.logsumexp(s, dim=-1)
    w = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    return (w @ v.float()).to(q.dtype), lse


# --------------------------------------------------------------------------- merge_partials


def merge_textbook(out1, lse1, out2, lse2):
    m = torch.maximum(lse1, lse2)  # -inf where both parts are empty
    a, b = torch.exp(lse1 - m), torch.exp(lse2 - m)
    lse = m + torch.log(a + b)
    out = (a[..., None] * out1.float() + b[..., None] * out2.float()) / (a + b)[..., None]
    return out.to(out1.dtype), lse


def merge_no_max(out1, lse1, out2, lse2):
    a, b = torch.exp(lse1.float()), torch.exp(lse2.float())  # exp(1e4) = inf in float32
    lse = torch.log(a + b)
    out = (a[..., None] * out1.float() + b[..., None] * out2.float()) / (a + b)[..., None]
    return out.to(out1.dtype), lse


def merge_average(out1, lse1, out2, lse2):
    _, lse = ok.merge_partials(out1, lse1, out2, lse2)
    return ((out1.float() + out2.float()) / 2).to(out1.dtype), lse


def merge_lse_max(out1, lse1, out2, lse2):
    out, _ = ok.merge_partials(out1, lse1, out2, lse2)
    return out, torch.maximum(lse1, lse2).float()


def merge_swapped(out1, lse1, out2, lse2):
    out, lse = ok.merge_partials(out2, lse1, out1, lse2)
    return out.to(out1.dtype), lse


def merge_unnormalised(out1, lse1, out2, lse2):
    _, lse = ok.merge_partials(out1, lse1, out2, lse2)
    m = torch.maximum(lse1, lse2).float()
    m = torch.where(torch.isfinite(m), m, 0.0)
    a, b = torch.exp(lse1.float() - m), torch.exp(lse2.float() - m)
    return (a[..., None] * out1.float() + b[..., None] * out2.float()).to(out1.dtype), lse


def merge_half_lse(out1, lse1, out2, lse2):
    out, lse = ok.merge_partials(out1, lse1, out2, lse2)
    return out, lse.to(out1.dtype)


def merge_no_shape_check(out1, lse1, out2, lse2):
    m = torch.maximum(lse1, lse2).float()
    m = torch.where(torch.isfinite(m), m, 0.0)
    a, b = torch.exp(lse1.float() - m), torch.exp(lse2.float() - m)
    total = (a + b).clamp(min=1e-30)  # broadcasts whatever comes, or fails with a RuntimeError
    out = (a[..., None] * out1.float() + b[..., None] * out2.float()) / total[..., None]
    return out.to(out1.dtype), torch.where(a + b > 0, m + torch.log(total), float("-inf"))


def merge_logaddexp(out1, lse1, out2, lse2):
    if out1.shape != out2.shape or lse1.shape != lse2.shape:
        raise ValueError("shapes disagree")
    lse = torch.logaddexp(lse1.float(), lse2.float())  # its backward is NaN where both are -inf
    safe = torch.where(torch.isfinite(lse), lse, 0.0)
    out = torch.exp(lse1 - safe)[..., None] * out1.float() + torch.exp(lse2 - safe)[..., None] * out2.float()
    return out.to(out1.dtype), lse


# --------------------------------------------------------------------------- zigzag_ring_mask


def _ring(L, world, rank, src, chunks, device):
    c = L // (2 * world)
    t = torch.arange(c, device=device)
    pos = lambda r: torch.cat([chunks(r)[0] * c + t, chunks(r)[1] * c + t])  # noqa: E731
    return pos(rank)[:, None] >= pos(src)[None, :]


def _valid(L, world, rank, step):
    if world < 1 or L % (2 * world) or not 0 <= rank < world or not 0 <= step < world:
        raise ValueError("bad ring")


def ring_contiguous(L, world, rank, step, *, device=None):
    _valid(L, world, rank, step)
    return _ring(L, world, rank, (rank - step) % world, lambda r: (2 * r, 2 * r + 1), device)


def ring_source_plus(L, world, rank, step, *, device=None):
    _valid(L, world, rank, step)
    return _ring(L, world, rank, (rank + step) % world, lambda r: (r, 2 * world - 1 - r), device)


def ring_local(L, world, rank, step, *, device=None):
    _valid(L, world, rank, step)
    n = L // world
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()  # local i >= j, at every step


def ring_no_check(L, world, rank, step, *, device=None):
    return _ring(L, world, rank, (rank - step) % world, lambda r: (r, 2 * world - 1 - r), device)


# --------------------------------------------------------------------------- chunked_local_mask


def _chunk_parts(Lq, Lk, device):
    if Lq < 1 or Lq > Lk:
        raise ValueError("bad sizes")
    return torch.arange(Lk - Lq, Lk, device=device)[:, None], torch.arange(Lk, device=device)[None, :]


def chunk_window(Lq, Lk, chunk, *, device=None):
    p, j = _chunk_parts(Lq, Lk, device)
    return (j <= p) & (p - j < chunk)  # a sliding window of `chunk` keys


def chunk_top_left(Lq, Lk, chunk, *, device=None):
    _, j = _chunk_parts(Lq, Lk, device)
    i = torch.arange(Lq, device=device)[:, None]
    return (j <= i) & (j // chunk == i // chunk)


def chunk_not_causal(Lq, Lk, chunk, *, device=None):
    p, j = _chunk_parts(Lq, Lk, device)
    return j // chunk == p // chunk


# --------------------------------------------------------------------------- padded_chunked_mask


def _padded(attention_mask, Lq, chunk, pad, keys=True):
    Lk = attention_mask.shape[-1]
    if Lq < 1 or Lq > Lk or chunk < 1:
        raise ValueError("bad sizes")
    pad = pad[:, None, None, None]
    p = torch.arange(Lk - Lq, Lk)[:, None]
    j = torch.arange(Lk)
    same = (j - pad).div(chunk, rounding_mode="floor") == (p - pad).div(chunk, rounding_mode="floor")
    m = (j <= p) & same
    return m & attention_mask[:, None, None, :] if keys else m


def padchunk_from_zero(attention_mask, Lq, chunk):
    return _padded(attention_mask, Lq, chunk, torch.zeros(attention_mask.shape[0], dtype=torch.long))


def padchunk_pad_keys(attention_mask, Lq, chunk):
    pad = (attention_mask.long().cumsum(-1) == 0).sum(-1)
    return _padded(attention_mask, Lq, chunk, pad, keys=False)  # padding keys left visible


def padchunk_all_false(attention_mask, Lq, chunk):
    return _padded(attention_mask, Lq, chunk, (~attention_mask).sum(-1))  # every False counted as padding


# --------------------------------------------------------------------------- ring_attention


def _ring_attention(q, k, v, world, layout, *, source=lambda r, s, w: (r - s) % w, skip=True, local=False,
                    merge="right", positions=ok.ring_positions, by_rank=False):
    L = q.shape[-2]
    if world < 1 or L % (2 * world) or layout not in ("zigzag", "contiguous"):
        raise ValueError("bad ring")
    pos = [positions(L, world, r, layout) for r in range(world)]
    acc, steps = [None] * world, [[] for _ in range(world)]
    for r in range(world):
        for s in range(world):
            src = pos[source(r, s, world)]
            n = len(src)
            m = torch.ones(n, n, dtype=torch.bool).tril() if local else pos[r][:, None] >= src[None, :]
            if by_rank:  # the order of the ranks, not the positions: right for contiguous only
                j = source(r, s, world)
                m = torch.ones(n, n, dtype=torch.bool).tril() if j == r else torch.full((n, n), j < r)
            if skip and not m.any():
                continue
            part = ok.attention_lse(q[..., pos[r], :], k[..., src, :], v[..., src, :], m)
            steps[r].append(part)
            if acc[r] is None or merge == "overwrite":
                acc[r] = part
            elif merge == "stale":  # the merged out kept, the running lse left as it was
                acc[r] = (ok.merge_partials(*acc[r], *part)[0], acc[r][1])
            else:
                acc[r] = ok.merge_partials(*acc[r], *part)
    out = q.new_empty(*q.shape[:-1], v.shape[-1])
    lse = torch.empty(q.shape[:-1])
    for r in range(world):
        out[..., pos[r], :], lse[..., pos[r]] = acc[r]
    return out, lse, steps


def ring_att_source_plus(q, k, v, world, layout="zigzag"):
    return _ring_attention(q, k, v, world, layout, source=lambda r, s, w: (r + s) % w)


def ring_att_no_merge(q, k, v, world, layout="zigzag"):
    return _ring_attention(q, k, v, world, layout, merge="overwrite")


def ring_att_stale_lse(q, k, v, world, layout="zigzag"):
    return _ring_attention(q, k, v, world, layout, merge="stale")


def ring_att_no_skip(q, k, v, world, layout="zigzag"):
    return _ring_attention(q, k, v, world, layout, skip=False)


def ring_att_local(q, k, v, world, layout="zigzag"):
    return _ring_attention(q, k, v, world, layout, local=True)


def ring_att_by_rank_order(q, k, v, world, layout="zigzag"):
    return _ring_attention(q, k, v, world, layout, by_rank=True)


def ring_att_layouts_swapped(q, k, v, world, layout="zigzag"):
    swap = {"zigzag": "contiguous", "contiguous": "zigzag"}
    return _ring_attention(q, k, v, world, layout,
                           positions=lambda L, w, r, lay: ok.ring_positions(L, w, r, swap[lay]))


def ring_att_one_pass(q, k, v, world, layout="zigzag"):
    """Full causal attention in one call, no ring: nothing to show for the steps."""
    L = q.shape[-2]
    if world < 1 or L % (2 * world) or layout not in ("zigzag", "contiguous"):
        raise ValueError("bad ring")
    mask = torch.ones(L, L, dtype=torch.bool).tril()
    out, lse = ok.attention_lse(q, k, v, mask)
    return out, lse, [[] for _ in range(world)]


# --------------------------------------------------------------------------- cascade_attention


def _cascade(q, prefix_k, prefix_v, suffix_k, suffix_v, suffix_lengths, *, masked=True, mixed=False,
             reshape=False):
    N, H, d = q.shape
    S = suffix_k.shape[2]
    if suffix_lengths.shape != (N,) or bool((suffix_lengths > S).any()) or prefix_k.shape[0] != H \
            or suffix_k.shape[:2] != (N, H):
        raise ValueError("bad shapes")
    qq = q.reshape(1, H, N, d) if reshape else q.transpose(0, 1)[None]
    o1, l1 = ok.attention_lse(qq, prefix_k[None], prefix_v[None])
    o1, l1 = (o1[0].reshape(N, H, -1), l1[0].reshape(N, H)) if reshape else (o1[0].transpose(0, 1), l1[0].T)
    real = torch.arange(S) < suffix_lengths[:, None] if masked else torch.ones(N, S, dtype=torch.bool)
    o2, l2 = ok.attention_lse(q[:, :, None], suffix_k, suffix_v, real[:, None, None, :])
    o2, l2 = o2[:, :, 0], l2[:, :, 0]
    return ok.merge_partials(o1, l2, o2, l1) if mixed else ok.merge_partials(o1, l1, o2, l2)


def cascade_unmasked_suffix(q, prefix_k, prefix_v, suffix_k, suffix_v, suffix_lengths):
    return _cascade(q, prefix_k, prefix_v, suffix_k, suffix_v, suffix_lengths, masked=False)


def cascade_pairs_mixed(q, prefix_k, prefix_v, suffix_k, suffix_v, suffix_lengths):
    return _cascade(q, prefix_k, prefix_v, suffix_k, suffix_v, suffix_lengths, mixed=True)


def cascade_reshaped_queries(q, prefix_k, prefix_v, suffix_k, suffix_v, suffix_lengths):
    return _cascade(q, prefix_k, prefix_v, suffix_k, suffix_v, suffix_lengths, reshape=True)


def cascade_per_sequence(q, prefix_k, prefix_v, suffix_k, suffix_v, suffix_lengths):
    """Right values, the prefix attended once per sequence (its keys read N times)."""
    N, S = q.shape[0], suffix_k.shape[2]
    if suffix_lengths.shape != (N,) or bool((suffix_lengths > S).any()) or suffix_k.shape[0] != N:
        raise ValueError("bad shapes")
    outs, lses = [], []
    for n in range(N):
        o1, l1 = ok.attention_lse(q[n][None, :, None], prefix_k[None], prefix_v[None])  # (1, H, 1, .)
        real = (torch.arange(S) < suffix_lengths[n])[None, None, None, :]
        o2, l2 = ok.attention_lse(q[n][None, :, None], suffix_k[n][None], suffix_v[n][None], real)
        o, s = ok.merge_partials(o1, l1, o2, l2)
        outs.append(o[0, :, 0])
        lses.append(s[0, :, 0])
    return torch.stack(outs), torch.stack(lses)


def cascade_recompute(q, prefix_k, prefix_v, suffix_k, suffix_v, suffix_lengths):
    """Right values, the prefix concatenated with every suffix: a copy of the prefix per sequence."""
    N, H, d = q.shape
    P, S = prefix_k.shape[1], suffix_k.shape[2]
    if suffix_lengths.shape != (N,) or bool((suffix_lengths > S).any()) or suffix_k.shape[0] != N:
        raise ValueError("bad shapes")
    k = torch.cat([prefix_k.expand(N, -1, -1, -1), suffix_k], dim=2)  # (N, H, P + S, d)
    v = torch.cat([prefix_v.expand(N, -1, -1, -1), suffix_v], dim=2)
    real = torch.cat([torch.ones(N, P, dtype=torch.bool), torch.arange(S) < suffix_lengths[:, None]], dim=1)
    o, s = ok.attention_lse(q[:, :, None], k, v, real[:, None, None, :])
    return o[:, :, 0], s[:, :, 0]


def ring_att_steps_then_one_pass(q, k, v, world, layout="zigzag"):
    """Every step right, then out and lse from one causal attention over all keys: the ring's merge
    is never done, and the (L, L) scores are held at once."""
    _, _, steps = ok.ring_attention(q, k, v, world, layout)
    L = q.shape[-2]
    out, lse = ok.attention_lse(q, k, v, torch.ones(L, L, dtype=torch.bool, device=q.device).tril())
    return out, lse, steps


def ring_att_steps_then_causal_sdpa_like(q, k, v, world, layout="zigzag"):
    """Every step right, then out and lse by hand from the whole causal score matrix (no helper)."""
    _, _, steps = ok.ring_attention(q, k, v, world, layout)
    L = q.shape[-2]
    s = (q.float() @ k.float().mT / math.sqrt(q.shape[-1])).masked_fill(
        ~torch.ones(L, L, dtype=torch.bool, device=q.device).tril(), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    return (torch.exp(s - lse[..., None]) @ v.float()).to(q.dtype), lse, steps


def ring_att_rank_over_all_keys(q, k, v, world, layout="zigzag"):
    """Every step right, then each rank's out and lse from its own queries against all L keys at
    once (no merge of the steps): under the live bound, but never one shard at a time."""
    _, _, steps = ok.ring_attention(q, k, v, world, layout)
    L = q.shape[-2]
    c = L // (2 * world)
    pos = torch.arange(L, device=q.device)
    out = torch.empty_like(q[..., :1].expand(*q.shape[:-1], v.shape[-1])).clone()
    lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
    for r in range(world):
        pair = (r, 2 * world - 1 - r) if layout == "zigzag" else (2 * r, 2 * r + 1)
        rows = torch.cat([pos[i * c:(i + 1) * c] for i in pair])
        mask = pos[None, :] <= rows[:, None]
        o, s = ok.attention_lse(q[..., rows, :], k, v, mask)
        out[..., rows, :] = o
        lse[..., rows] = s
    return out, lse, steps

