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
