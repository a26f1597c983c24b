"""The classic mistakes of chapter 13's kernels, each a switch of one otherwise correct Triton
kernel (a ``tl.constexpr`` flag), and the shortcuts a launcher can take: attention computed with
PyTorch in the launcher, and outputs that are constant. Import only with triton installed and
``TRITON_INTERPRET=1`` set where there is no GPU."""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from attnmask.kernels import _block


@triton.jit
def _tile(q, m_i, l_i, acc, j, K, V, MASK, bh, rows, row_ok, Lq, Lk, d, dv, scale, cd, cv, keys,
          APPLY_MASK: tl.constexpr, RESCALE: tl.constexpr, TILE: tl.constexpr):
    cols = j * TILE + keys
    col_ok = cols < Lk
    k = tl.load(K + (bh * Lk + cols[:, None]) * d + cd[None, :], mask=col_ok[:, None] & (cd[None, :] < d),
                other=0.0).to(tl.float32)
    v = tl.load(V + (bh * Lk + cols[:, None]) * dv + cv[None, :], mask=col_ok[:, None] & (cv[None, :] < dv),
                other=0.0).to(tl.float32)
    ok = row_ok[:, None] & col_ok[None, :]
    if APPLY_MASK:
        ok = ok & (tl.load(MASK + (bh * Lq + rows[:, None]) * Lk + cols[None, :], mask=ok, other=0) != 0)
    s = tl.where(ok, tl.dot(q, tl.trans(k)) * scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m_i - shift)
    p = tl.exp(s - shift[:, None])
    if RESCALE:
        l_i = l_i * alpha
        acc = acc * alpha[:, None]
    return m_new, l_i + tl.sum(p, 1), acc + tl.dot(p, v)


@triton.jit
def forward_kernel(Q, K, V, MASK, KV_NUM, KV_IDX, FULL_NUM, FULL_IDX, OUT, LSE, Lq, Lk, d, dv, nq, nk, scale,
                   TILE: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr, MASK_FULL: tl.constexpr,
                   MASK_PARTIAL: tl.constexpr, VISIT_FULL: tl.constexpr, VISIT_PARTIAL: tl.constexpr,
                   RESCALE: tl.constexpr, GUARD_END: tl.constexpr, LSE_MODE: tl.constexpr,
                   WHOLE_LIST: tl.constexpr):
    i = tl.program_id(0)
    bh = tl.program_id(1)
    rows = i * TILE + tl.arange(0, TILE)
    cd, cv, keys = tl.arange(0, BD), tl.arange(0, BDV), tl.arange(0, TILE)
    row_ok = rows < Lq
    q = tl.load(Q + (bh * Lq + rows[:, None]) * d + cd[None, :], mask=row_ok[:, None] & (cd[None, :] < d),
                other=0.0).to(tl.float32)
    m_i = tl.full((TILE,), float("-inf"), tl.float32)
    l_i = tl.zeros((TILE,), tl.float32)
    acc = tl.zeros((TILE, BDV), tl.float32)
    lists = bh * nq + i
    if VISIT_FULL:
        n = nk if WHOLE_LIST else tl.load(FULL_NUM + lists)
        for t in range(0, n):
            j = tl.load(FULL_IDX + lists * nk + t)
            m_i, l_i, acc = _tile(q, m_i, l_i, acc, j, K, V, MASK, bh, rows, row_ok, Lq, Lk, d, dv, scale,
                                  cd, cv, keys, MASK_FULL, RESCALE, TILE)
    if VISIT_PARTIAL:
        n = nk if WHOLE_LIST else tl.load(KV_NUM + lists)
        for t in range(0, n):
            j = tl.load(KV_IDX + lists * nk + t)
            m_i, l_i, acc = _tile(q, m_i, l_i, acc, j, K, V, MASK, bh, rows, row_ok, Lq, Lk, d, dv, scale,
                                  cd, cv, keys, MASK_PARTIAL, RESCALE, TILE)
    empty = l_i == 0.0
    out = acc / (tl.where(empty, 1.0, l_i) if GUARD_END else l_i)[:, None]
    lse = tl.where(empty, float("-inf"), m_i + tl.log(tl.where(empty, 1.0, l_i)))
    if LSE_MODE == 1:
        lse = lse * 1.4426950408889634  # log2(e): the base-2 log
    if LSE_MODE == 2:
        lse = m_i
    if LSE_MODE == 3:
        lse = tl.where(empty, 0.0, lse)
    tl.store(OUT + (bh * Lq + rows[:, None]) * dv + cv[None, :], out.to(OUT.dtype.element_ty),
             mask=row_ok[:, None] & (cv[None, :] < dv))
    tl.store(LSE + bh * Lq + rows, lse, mask=row_ok)


FORWARD = dict(MASK_FULL=False, MASK_PARTIAL=True, VISIT_FULL=True, VISIT_PARTIAL=True, RESCALE=True,
               GUARD_END=True, LSE_MODE=0, WHOLE_LIST=False)


def forward(q, k, v, mask, kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices, tile=16, *,
            scale=None, **flags):
    B, H, Lq, d = q.shape
    Lk, dv = k.shape[2], v.shape[3]
    nq, nk = -(-Lq // tile), -(-Lk // tile)
    out = torch.empty(B, H, Lq, dv, dtype=q.dtype)
    lse = torch.empty(B, H, Lq, dtype=torch.float32)
    lists = [t.contiguous() for t in (kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices)]
    forward_kernel[(nq, B * H)](q.contiguous(), k.contiguous(), v.contiguous(), mask.contiguous(), *lists,
                                out, lse, Lq, Lk, d, dv, nq, nk,
                                1.0 / math.sqrt(d) if scale is None else scale,
                                TILE=tile, BD=_block(d), BDV=_block(dv), **{**FORWARD, **flags})
    return out, lse


def _forward_bug(name, **flags):
    fn = functools.partial(forward, **flags)
    fn.__name__ = name
    return fn


def fwd_torch_launcher(q, k, v, mask, kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices,
                       tile=16):
    """The shortcut: attention computed with PyTorch in the launcher, tile by tile over the lists
    (no kernel at all), right to float rounding."""
    B, H, Lq, d = q.shape
    out = torch.zeros(B, H, Lq, v.shape[-1], dtype=torch.float32)
    lse = torch.full((B, H, Lq), float("-inf"))
    for b in range(B):
        for h in range(H):
            for i in range(kv_num_blocks.shape[-1]):
                r = slice(i * tile, (i + 1) * tile)
                keys, allowed = [], []
                for num, idx, full in ((full_kv_num_blocks, full_kv_indices, True),
                                       (kv_num_blocks, kv_indices, False)):
                    for j in idx[b, h, i, :num[b, h, i]].tolist():
                        c = slice(j * tile, (j + 1) * tile)
                        keys.append(torch.arange(k.shape[2])[c])
                        m = mask[b, h, r, c]
                        allowed.append(torch.ones_like(m) if full else m)
                if not keys:
                    continue
                cols, ok = torch.cat(keys), torch.cat(allowed, dim=-1)
                s = q[b, h, r].float() @ k[b, h, cols].float().T / math.sqrt(d)
                s = s.masked_fill(~ok, float("-inf"))
                row_lse = torch.logsumexp(s, -1)
                w = torch.exp(s - row_lse.nan_to_num(neginf=0.0)[:, None])
                out[b, h, r] = w @ v[b, h, cols].float()
                lse[b, h, r] = row_lse
    return out.to(q.dtype), lse


def fwd_zeros(q, k, v, mask, *lists, tile=16):
    """A constant answer: out 0, lse 0."""
    return torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype), torch.zeros(q.shape[:-1])


#: (function, the exercise, what the feedback must say: a key of MISTAKES13, MISTAKES8 or MISTAKES).
FORWARD_BUGS = [
    (_forward_bug("fwd_mask_on_full", MASK_FULL=True), "k_mask_on_full"),
    (_forward_bug("fwd_partial_unmasked", MASK_PARTIAL=False), "k_partial_unmasked"),
    (_forward_bug("fwd_full_skipped", VISIT_FULL=False), "k_full_skipped"),
    (_forward_bug("fwd_partial_skipped", VISIT_PARTIAL=False), "k_partial_skipped"),
    (_forward_bug("fwd_whole_list", WHOLE_LIST=True), "k_lists_ignored"),
    (_forward_bug("fwd_no_rescale", RESCALE=False), "no_rescale"),
    (_forward_bug("fwd_nan_rows", GUARD_END=False), "nan_rows"),
    (_forward_bug("fwd_lse_base2", LSE_MODE=1), "k_lse_base2"),
    (_forward_bug("fwd_lse_max", LSE_MODE=2), "k_lse_max"),
    (_forward_bug("fwd_lse_empty", LSE_MODE=3), "k_lse_empty"),
    (_forward_bug("fwd_no_scale", scale=1.0), "no_scale"),
]


@triton.jit
def backward_kernel(Q, K, V, OUT, LSE, DOUT, MASK, KV_NUM, KV_IDX, FULL_NUM, FULL_IDX, DQ, DK, DV,
                    Lq, Lk, d, dv, nq, nk, scale, TILE: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
                    ROW_TERM: tl.constexpr, SCALED_SCORES: tl.constexpr, GRAD_SCALE: tl.constexpr,
                    GUARD: tl.constexpr, MASK_FULL: tl.constexpr, MASK_PARTIAL: tl.constexpr,
                    VISIT_FULL: tl.constexpr):
    i = tl.program_id(0)
    bh = tl.program_id(1)
    rows = i * TILE + tl.arange(0, TILE)
    cd, cv, keys = tl.arange(0, BD), tl.arange(0, BDV), tl.arange(0, TILE)
    row_ok = rows < Lq
    qmask = row_ok[:, None] & (cd[None, :] < d)
    omask = row_ok[:, None] & (cv[None, :] < dv)
    q = tl.load(Q + (bh * Lq + rows[:, None]) * d + cd[None, :], mask=qmask, other=0.0).to(tl.float32)
    o = tl.load(OUT + (bh * Lq + rows[:, None]) * dv + cv[None, :], mask=omask, other=0.0).to(tl.float32)
    do = tl.load(DOUT + (bh * Lq + rows[:, None]) * dv + cv[None, :], mask=omask, other=0.0).to(tl.float32)
    lse = tl.load(LSE + bh * Lq + rows, mask=row_ok, other=float("-inf"))
    if GUARD:
        lse = tl.where(lse == float("-inf"), 0.0, lse)
    delta = tl.sum(do * o, 1) if ROW_TERM else tl.zeros((TILE,), tl.float32)
    dq = tl.zeros((TILE, BD), tl.float32)
    lists = bh * nq + i
    n_full = tl.load(FULL_NUM + lists) if VISIT_FULL else 0
    n_part = tl.load(KV_NUM + lists)
    for t in range(0, n_full + n_part):
        if t < n_full:
            j = tl.load(FULL_IDX + lists * nk + t)
        else:
            j = tl.load(KV_IDX + lists * nk + t - n_full)
        cols = j * TILE + keys
        col_ok = cols < Lk
        kmask = col_ok[:, None] & (cd[None, :] < d)
        vmask = col_ok[:, None] & (cv[None, :] < dv)
        k = tl.load(K + (bh * Lk + cols[:, None]) * d + cd[None, :], mask=kmask, other=0.0).to(tl.float32)
        v = tl.load(V + (bh * Lk + cols[:, None]) * dv + cv[None, :], mask=vmask, other=0.0).to(tl.float32)
        ok = row_ok[:, None] & col_ok[None, :]
        use = (keys * 0 + t < n_full) & MASK_FULL | (keys * 0 + t >= n_full) & MASK_PARTIAL
        allowed = tl.load(MASK + (bh * Lq + rows[:, None]) * Lk + cols[None, :], mask=ok & use[None, :],
                          other=1)
        s = tl.dot(q, tl.trans(k)) * (scale if SCALED_SCORES else 1.0)
        if GUARD:
            p = tl.where(ok & (allowed != 0), tl.exp(s - lse[:, None]), 0.0)
        else:  # -inf scores for blocked keys, and exp(-inf - lse) with lse = -inf is NaN
            p = tl.exp(tl.where(ok & (allowed != 0), s, float("-inf")) - lse[:, None])
        ds = p * (tl.dot(do, tl.trans(v)) - delta[:, None])
        g = scale if GRAD_SCALE else 1.0
        tl.atomic_add(DV + (bh * Lk + cols[:, None]) * dv + cv[None, :], tl.dot(tl.trans(p), do), mask=vmask)
        tl.atomic_add(DK + (bh * Lk + cols[:, None]) * d + cd[None, :], tl.dot(tl.trans(ds), q) * g,
                      mask=kmask)
        dq += tl.dot(ds, k) * g
    tl.store(DQ + (bh * Lq + rows[:, None]) * d + cd[None, :], dq.to(DQ.dtype.element_ty), mask=qmask)


BACKWARD = dict(ROW_TERM=True, SCALED_SCORES=True, GRAD_SCALE=True, GUARD=True, MASK_FULL=False,
                MASK_PARTIAL=True, VISIT_FULL=True)


def backward(q, k, v, out, lse, d_out, mask, kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices,
             tile=16, **flags):
    B, H, Lq, d = q.shape
    Lk, dv = k.shape[2], v.shape[3]
    nq, nk = -(-Lq // tile), -(-Lk // tile)
    dq = torch.empty(B, H, Lq, d, dtype=q.dtype)
    dk = torch.zeros(B, H, Lk, d)
    dvv = torch.zeros(B, H, Lk, dv)
    lists = [t.contiguous() for t in (kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices)]
    backward_kernel[(nq, B * H)](q.contiguous(), k.contiguous(), v.contiguous(), out.contiguous(),
                                 lse.contiguous(), d_out.contiguous(), mask.contiguous(), *lists, dq, dk, dvv,
                                 Lq, Lk, d, dv, nq, nk, 1.0 / math.sqrt(d), TILE=tile, BD=_block(d),
                                 BDV=_block(dv), **{**BACKWARD, **flags})
    return dq, dk.to(k.dtype), dvv.to(v.dtype)


def _backward_bug(name, **flags):
    fn = functools.partial(backward, **flags)
    fn.__name__ = name
    return fn


def bwd_torch_launcher(q, k, v, out, lse, d_out, mask, *lists, tile=16):
    """The shortcut: autograd through dense attention over the cells the lists allow, in the launcher."""
    from grader.checks.ch13_kernels import allowed  # the test's oracle of the lists' cells

    keep = allowed(mask, lists, q.shape[-2], k.shape[-2], tile)
    leaves = [t.float().nan_to_num(0.0).requires_grad_(True) for t in (q, k, v)]
    s = (leaves[0] @ leaves[1].mT / math.sqrt(q.shape[-1])).masked_fill(~keep, float("-inf"))
    w = torch.softmax(s, -1).nan_to_num(0.0)
    (w @ leaves[2]).backward(d_out.float())
    return tuple(t.grad.to(x.dtype) for t, x in zip(leaves, (q, k, v)))


def bwd_zeros(q, k, v, *rest, tile=16):
    return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)


BACKWARD_BUGS = [
    (_backward_bug("bwd_no_D", ROW_TERM=False), "bwd_no_D"),
    (_backward_bug("bwd_unscaled_scores", SCALED_SCORES=False), "bwd_unscaled_scores"),
    (_backward_bug("bwd_grad_unscaled", GRAD_SCALE=False), "bwd_grad_unscaled"),
    (_backward_bug("bwd_nan_empty", GUARD=False), "bwd_nan_empty"),
    (_backward_bug("bwd_mask_on_full", MASK_FULL=True), "k_mask_on_full"),
    (_backward_bug("bwd_partial_unmasked", MASK_PARTIAL=False), "k_partial_unmasked"),
    (_backward_bug("bwd_full_skipped", VISIT_FULL=False), "k_full_skipped"),
]
