"""Chapter 12's classic mistakes, each otherwise correct: learned sinks, top-k selection,
block-diffusion masks and decay masks. Listed in :data:`buggy.mistakes.BUGS`."""

from __future__ import annotations

import math

import torch

from . import correct as ok

NINF = float("-inf")

# --------------------------------------------------------------------------- sink_attention


def _scores(q, k, mask):
    s = q.float() @ k.float().mT / math.sqrt(q.shape[-1])  # (B, H, Lq, Lk)
    return s if mask is None else s.masked_fill(~mask, NINF)


def _plain(s, v, dtype):
    w = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return (w @ v.float()).to(dtype)


def sink_ignored(q, k, v, sinks, mask=None):
    return _plain(_scores(q, k, mask), v, q.dtype)  # chapter 2's attention; the sinks unused


def sink_in_scores(q, k, v, sinks, mask=None):
    s = _scores(q, k, mask) + sinks.float().view(-1, 1, 1)  # a shift of every score: cancels
    return _plain(s, v, q.dtype)


def sink_takes_value(q, k, v, sinks, mask=None):
    s = _scores(q, k, mask)
    sink = sinks.float().view(1, -1, 1, 1).expand(*s.shape[:-1], 1)
    w = torch.softmax(torch.cat([sink, s], dim=-1), dim=-1)[..., :-1]  # the sink first, the last key dropped
    return (w @ v.float()).to(q.dtype)


def sink_not_exp(q, k, v, sinks, mask=None):
    s = _scores(q, k, mask)
    m = torch.maximum(s.amax(-1, keepdim=True), sinks.float().view(-1, 1, 1)).detach()
    e = torch.exp(s - m)
    w = e / (sinks.float().view(-1, 1, 1) + e.sum(-1, keepdim=True))  # the logit added, not exp of it
    return (w @ v.float()).to(q.dtype)


def sink_not_in_max(q, k, v, sinks, mask=None):
    s = _scores(q, k, mask)
    m = s.amax(-1, keepdim=True).detach()  # -inf on a fully masked row
    e = torch.exp(s - m)
    w = e / (torch.exp(sinks.float().view(-1, 1, 1) - m) + e.sum(-1, keepdim=True))
    return (w @ v.float()).to(q.dtype)


def sink_nan_patched(q, k, v, sinks, mask=None):
    s = _scores(q, k, mask)
    m = s.amax(-1, keepdim=True).detach()
    e = torch.exp(s - m).nan_to_num(0.0)  # the forward patched; the backward still meets NaN
    w = e / (torch.exp(sinks.float().view(-1, 1, 1) - m) + e.sum(-1, keepdim=True))
    return (w.nan_to_num(0.0) @ v.float()).to(q.dtype)


def sink_half(q, k, v, sinks, mask=None):
    # transformers' eager code, fed q's dtype throughout
    s = q @ k.mT / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, NINF)
    both = torch.cat([s, sinks.to(q.dtype).view(1, -1, 1, 1).expand(*s.shape[:-1], 1)], dim=-1)
    both = both - both.amax(-1, keepdim=True)
    return torch.softmax(both, dim=-1)[..., :-1] @ v


def sink_detached(q, k, v, sinks, mask=None):
    return ok.sink_attention(q, k, v, sinks.detach(), mask)


# --------------------------------------------------------------------------- topk_selection_mask


def _positions(scores, causal, offset=None):
    _, Lq, Lk = scores.shape
    dev = scores.device
    p = (Lk - Lq if offset is None else offset) + torch.arange(Lq, device=dev)[:, None]
    j = torch.arange(Lk, device=dev)
    return (j <= p) if causal else torch.ones(Lq, Lk, dtype=torch.bool, device=dev)


def _top(scores, keep, k):
    """The k best of ``scores`` where ``keep`` (a stable sort: ties to the lower index)."""
    order = torch.sort(scores.masked_fill(~keep, NINF), dim=-1, descending=True, stable=True).indices
    picked = torch.zeros_like(keep.expand(scores.shape)).scatter(-1, order[..., :k], True)
    return picked & keep


def sel_top_left(index_scores, k, *, causal=True):
    if k < 1:
        raise ValueError("k >= 1")
    keep = _positions(index_scores, causal, offset=0) & ~torch.isnan(index_scores)
    return _top(index_scores, keep, min(k, index_scores.shape[-1]))


def sel_ties_high(index_scores, k, *, causal=True):
    if k < 1:
        raise ValueError("k >= 1")
    keep = _positions(index_scores, causal) & ~torch.isnan(index_scores)
    flipped = _top(index_scores.flip(-1), keep.flip(-1), min(k, index_scores.shape[-1]))
    return flipped.flip(-1)


def sel_nan_selected(index_scores, k, *, causal=True):
    if k < 1:
        raise ValueError("k >= 1")
    keep = _positions(index_scores, causal).expand(index_scores.shape)
    s = index_scores.masked_fill(~keep, NINF)  # NaN left in: sort puts it first
    order = torch.sort(s, dim=-1, descending=True, stable=True).indices[..., : min(k, s.shape[-1])]
    return torch.zeros_like(keep).scatter(-1, order, True) & keep


def sel_topk_fills(index_scores, k, *, causal=True):
    if k < 1:
        raise ValueError("k >= 1")
    keep = _positions(index_scores, causal)
    s = index_scores.masked_fill(~keep, -1e30).nan_to_num(nan=-1e38)  # k always taken
    order = torch.sort(s, dim=-1, descending=True, stable=True).indices[..., : min(k, s.shape[-1])]
    return torch.zeros(index_scores.shape, dtype=torch.bool, device=s.device).scatter(-1, order, True) \
        & ~torch.isnan(index_scores)


def sel_blocked_make_up_k(index_scores, k, *, causal=True):
    """Blocked keys (future and NaN) filled with -inf and sorted last: a query that sees fewer than k
    keys takes blocked ones, the lowest indices first, to make up k."""
    if k < 1:
        raise ValueError("k >= 1")
    keep = _positions(index_scores, causal) & ~torch.isnan(index_scores)
    order = torch.sort(index_scores.masked_fill(~keep, NINF), dim=-1, descending=True, stable=True).indices
    picked = order[..., : min(k, index_scores.shape[-1])]
    chosen = torch.zeros(index_scores.shape, dtype=torch.bool, device=index_scores.device)
    return chosen.scatter(-1, picked, True)


def sel_ignores_causal(index_scores, k, *, causal=True):
    return ok.topk_selection_mask(index_scores, k, causal=False)


def sel_no_check(index_scores, k, *, causal=True):
    if k < 1:
        return torch.zeros(index_scores.shape, dtype=torch.bool, device=index_scores.device)
    return ok.topk_selection_mask(index_scores, k, causal=causal)


# --------------------------------------------------------------------------- block_diffusion_mask


def _bd(L, block, device, *, own_clean=False, clean_own_only=False, noisy_causal=False, no_check=False,
        no_context=False):
    if not no_check and (block < 1 or L % block):
        raise ValueError("block must divide L")
    t = torch.arange(2 * L, device=device)
    clean = t >= L
    blk = (t % L) // block
    qc, kc, qb, kb = clean[:, None], clean[None, :], blk[:, None], blk[None, :]
    nn = ~qc & ~kc & (qb == kb)
    if noisy_causal:
        nn = nn & (t[None, :] <= t[:, None])
    nc = ~qc & kc & ((kb <= qb) if own_clean else (kb < qb)) & (not no_context)
    cc = qc & kc & ((kb == qb) if clean_own_only else (kb <= qb))
    return nn | nc | cc


def bd_own_clean(L, block, *, device=None):
    return _bd(L, block, device, own_clean=True)


def bd_clean_own_block(L, block, *, device=None):
    return _bd(L, block, device, clean_own_only=True)


def bd_noisy_causal(L, block, *, device=None):
    return _bd(L, block, device, noisy_causal=True)


def bd_no_context(L, block, *, device=None):
    return _bd(L, block, device, no_context=True)  # each noisy block denoised from nothing


def bd_no_check(L, block, *, device=None):
    return _bd(L, max(block, 1), device, no_check=True)


def bd_clean_sees_noisy(L, block, *, device=None):
    t = torch.arange(2 * L, device=device)
    q_clean, k_noisy = (t >= L)[:, None], (t < L)[None, :]
    blk = (t % L) // block
    return _bd(L, block, device) | (q_clean & k_noisy & (blk[None, :] <= blk[:, None]))


# --------------------------------------------------------------------------- decay_mask


def _keep(log_gates, doc_ids):
    L = log_gates.shape[-1]
    keep = torch.ones(L, L, dtype=torch.bool, device=log_gates.device).tril()
    if doc_ids is not None:
        keep = keep & (doc_ids[:, :, None] == doc_ids[:, None, :])
    return keep


def decay_cumsum_diff(log_gates, doc_ids=None):
    c = log_gates.float().cumsum(-1)  # (B, L)
    d = torch.exp(c[:, :, None] - c[:, None, :])  # -inf - (-inf) after a closed gate
    return torch.where(_keep(log_gates, doc_ids), d, torch.zeros_like(d))


def decay_diff_filled(log_gates, doc_ids=None):
    """exp(c_i - c_j), the cells that must be 0 filled after the exp: D right, its backward NaN (0 * inf)."""
    c = log_gates.float().cumsum(-1)  # (B, L)
    return torch.exp(c[:, :, None] - c[:, None, :]).masked_fill(~_keep(log_gates, doc_ids), 0.0)


def decay_cumsum_ratio(log_gates, doc_ids=None):
    e = torch.exp(log_gates.float().cumsum(-1))  # underflows to 0 on long sequences
    d = e[:, :, None] / e[:, None, :]
    return torch.where(_keep(log_gates, doc_ids), d, torch.zeros_like(d))


def decay_off_by_one(log_gates, doc_ids=None):
    g = log_gates.float()
    L = g.shape[-1]
    i = torch.arange(L, device=g.device)
    terms = g[:, :, None].masked_fill(i[:, None] < i[None, :], 0.0)  # t >= j: one gate too many
    d = torch.exp(terms.cumsum(1))
    return torch.where(_keep(log_gates, doc_ids), d, torch.zeros_like(d))


def decay_no_docs(log_gates, doc_ids=None):
    return ok.decay_mask(log_gates)


def decay_transposed(log_gates, doc_ids=None):
    return ok.decay_mask(log_gates, doc_ids).mT
