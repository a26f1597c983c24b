"""The course's Triton kernels for chapter 13: attention over a block-sparse mask's tile lists.

This module imports ``triton`` at the top: import it only through :mod:`attnmask.kernels`,
whose launchers import it when first called (triton is the optional ``[kernels]`` extra).

One program handles one query tile of one (batch, head): program id 0 is the query tile
``i``, program id 1 is ``b * H + h``. It walks the key tiles listed for ``(b, h, i)``:
first the FULL ones (no mask is read there), then the PARTIAL ones (the mask is loaded and
applied). Tiles in neither list are never loaded, which is what makes a block-sparse mask
fast, and what lets the grader put NaN in their keys and values.

Every tensor is contiguous: q ``(B, H, Lq, d)``, k ``(B, H, Lk, d)``, v ``(B, H, Lk, dv)``,
mask ``(B, H, Lq, Lk)`` (True = may attend), the counts ``(B, H, nq)`` and the index lists
``(B, H, nq, nk)``, int32. Scores and sums are float32 whatever the inputs' dtype.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _online_step(s, v, m_i, l_i, acc):
    """One key tile of the online softmax: scores ``s (TILE, TILE)`` (-inf where masked),
    values ``v (TILE, BDV)``; returns the new running max, sum and output."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # A row that has seen only -inf keeps m = -inf: shift by 0 so exp gives 0, not NaN.
    shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m_i - shift)
    p = tl.exp(s - shift[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p, v)
    return m_new, l_i, acc


@triton.jit
def forward_kernel(Q, K, V, MASK, KV_NUM, KV_IDX, FULL_NUM, FULL_IDX, OUT, LSE,
                   Lq, Lk, d, dv, nq, nk, scale,
                   TILE: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr):
    i = tl.program_id(0)
    bh = tl.program_id(1)
    rows = i * TILE + tl.arange(0, TILE)
    cd = tl.arange(0, BD)
    cv = tl.arange(0, BDV)
    keys = tl.arange(0, TILE)
    row_ok = rows < Lq
    q = tl.load(Q + (bh * Lq + rows[:, None]) * d + cd[None, :],
                mask=row_ok[:, None] & (cd[None, :] < d), other=0.0).to(tl.float32)
    m_i = tl.full((TILE,), float("-inf"), tl.float32)
    l_i = tl.zeros((TILE,), tl.float32)
    acc = tl.zeros((TILE, BDV), tl.float32)
    lists = bh * nq + i
    n_full = tl.load(FULL_NUM + lists)
    for t in range(0, n_full):
        j = tl.load(FULL_IDX + lists * nk + t)
        cols = j * TILE + keys
        col_ok = cols < Lk
        k = tl.load(K + (bh * Lk + cols[:, None]) * d + cd[None, :],
                    mask=col_ok[:, None] & (cd[None, :] < d), other=0.0).to(tl.float32)
        v = tl.load(V + (bh * Lk + cols[:, None]) * dv + cv[None, :],
                    mask=col_ok[:, None] & (cv[None, :] < dv), other=0.0).to(tl.float32)
        s = tl.dot(q, tl.trans(k)) * scale
        s = tl.where(col_ok[None, :], s, float("-inf"))  # keys past Lk in the last tile
        m_i, l_i, acc = _online_step(s, v, m_i, l_i, acc)
    n_part = tl.load(KV_NUM + lists)
    for t in range(0, n_part):
        j = tl.load(KV_IDX + lists * nk + t)
        cols = j * TILE + keys
        col_ok = cols < Lk
        k = tl.load(K + (bh * Lk + cols[:, None]) * d + cd[None, :],
                    mask=col_ok[:, None] & (cd[None, :] < d), other=0.0).to(tl.float32)
        v = tl.load(V + (bh * Lk + cols[:, None]) * dv + cv[None, :],
                    mask=col_ok[:, None] & (cv[None, :] < dv), other=0.0).to(tl.float32)
        inside = row_ok[:, None] & col_ok[None, :]
        allowed = tl.load(MASK + (bh * Lq + rows[:, None]) * Lk + cols[None, :], mask=inside, other=0)
        s = tl.dot(q, tl.trans(k)) * scale
        s = tl.where(inside & (allowed != 0), s, float("-inf"))
        m_i, l_i, acc = _online_step(s, v, m_i, l_i, acc)
    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), m_i + tl.log(tl.where(empty, 1.0, l_i)))
    tl.store(OUT + (bh * Lq + rows[:, None]) * dv + cv[None, :], out.to(OUT.dtype.element_ty),
             mask=row_ok[:, None] & (cv[None, :] < dv))
    tl.store(LSE + bh * Lq + rows, lse, mask=row_ok)


@triton.jit
def _backward_tile(q, do, lse, delta, rows, row_ok, j, K, V, MASK, DK, DV, bh, Lq, Lk, d, dv, scale,
                   cd, cv, keys, dq, APPLY_MASK: tl.constexpr, TILE: tl.constexpr):
    """One key tile of the backward: adds this tile's part to ``dq`` (returned) and, atomically,
    to the float32 ``DK``/``DV`` buffers (other query tiles add to the same key rows)."""
    cols = j * TILE + keys
    col_ok = cols < Lk
    kmask = col_ok[:, None] & (cd[None, :] < d)
    vmask = col_ok[:, None] & (cv[None, :] < dv)
    k = tl.load(K + (bh * Lk + cols[:, None]) * d + cd[None, :], mask=kmask, other=0.0).to(tl.float32)
    v = tl.load(V + (bh * Lk + cols[:, None]) * dv + cv[None, :], mask=vmask, other=0.0).to(tl.float32)
    ok = row_ok[:, None] & col_ok[None, :]
    if APPLY_MASK:
        allowed = tl.load(MASK + (bh * Lq + rows[:, None]) * Lk + cols[None, :], mask=ok, other=0)
        ok = ok & (allowed != 0)
    s = tl.dot(q, tl.trans(k)) * scale
    # The forward's weights again, from the saved lse: exp(s - lse) sums to 1 over the row.
    p = tl.where(ok & (lse[:, None] != float("-inf")), tl.exp(s - lse[:, None]), 0.0)
    dp = tl.dot(do, tl.trans(v))
    ds = p * (dp - delta[:, None])
    tl.atomic_add(DV + (bh * Lk + cols[:, None]) * dv + cv[None, :], tl.dot(tl.trans(p), do), mask=vmask)
    tl.atomic_add(DK + (bh * Lk + cols[:, None]) * d + cd[None, :], tl.dot(tl.trans(ds), q) * scale,
                  mask=kmask)
    return dq + tl.dot(ds, k) * scale


@triton.jit
def backward_kernel(Q, K, V, OUT, LSE, DOUT, MASK, KV_NUM, KV_IDX, FULL_NUM, FULL_IDX, DQ, DK, DV,
                    Lq, Lk, d, dv, nq, nk, scale,
                    TILE: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr):
    i = tl.program_id(0)
    bh = tl.program_id(1)
    rows = i * TILE + tl.arange(0, TILE)
    cd = tl.arange(0, BD)
    cv = tl.arange(0, BDV)
    keys = tl.arange(0, TILE)
    row_ok = rows < Lq
    qmask = row_ok[:, None] & (cd[None, :] < d)
    omask = row_ok[:, None] & (cv[None, :] < dv)
    q = tl.load(Q + (bh * Lq + rows[:, None]) * d + cd[None, :], mask=qmask, other=0.0).to(tl.float32)
    o = tl.load(OUT + (bh * Lq + rows[:, None]) * dv + cv[None, :], mask=omask, other=0.0).to(tl.float32)
    do = tl.load(DOUT + (bh * Lq + rows[:, None]) * dv + cv[None, :], mask=omask, other=0.0).to(tl.float32)
    lse = tl.load(LSE + bh * Lq + rows, mask=row_ok, other=float("-inf"))
    delta = tl.sum(do * o, 1)  # D = rowsum(dO * O): the softmax's backward in one number per row
    dq = tl.zeros((TILE, BD), tl.float32)
    lists = bh * nq + i
    n_full = tl.load(FULL_NUM + lists)
    for t in range(0, n_full):
        j = tl.load(FULL_IDX + lists * nk + t)
        dq = _backward_tile(q, do, lse, delta, rows, row_ok, j, K, V, MASK, DK, DV, bh, Lq, Lk, d, dv, scale,
                            cd, cv, keys, dq, False, TILE)
    n_part = tl.load(KV_NUM + lists)
    for t in range(0, n_part):
        j = tl.load(KV_IDX + lists * nk + t)
        dq = _backward_tile(q, do, lse, delta, rows, row_ok, j, K, V, MASK, DK, DV, bh, Lq, Lk, d, dv, scale,
                            cd, cv, keys, dq, True, TILE)
    tl.store(DQ + (bh * Lq + rows[:, None]) * d + cd[None, :], dq.to(DQ.dtype.element_ty), mask=qmask)
