"""Linear attention, where the causal mask becomes a decay mask (chapter 12).

Gated linear attention (Mamba-2's SSD, Gated DeltaNet without its delta rule, GLA with
one gate per step) keeps a state ``S`` of shape (d, dv) and, at each position t,

    S_t = a_t · S_{t-1} + k_t v_tᵀ        o_t = q_t S_t        (0 < a_t <= 1)

Unrolled, ``o_i = Σ_{j<=i} (Π_{t=j+1..i} a_t) (q_i·k_j) v_j``: softmax-free attention
whose mask is not 0/1 but the decay ``D[i, j] = Π_{t=j+1..i} a_t`` (and 0 above the
diagonal). Packed documents reset the state at each border: D is 0 across documents,
the varlen ``cu_seqlens`` of flash-linear-attention.

* :func:`decay_mask`: D from the log gates, built without an ``exp`` of a cumulative
  sum (which underflows to 0/0 or meets -inf - (-inf) on long sequences).
* :func:`linear_attention`: ``(D ⊙ (q kᵀ)) v``, the parallel form.
* :func:`decay_scan`: the recurrent form, one position at a time (the oracle).
"""

from __future__ import annotations

import torch

__all__ = ["decay_mask", "decay_scan", "linear_attention"]


def decay_mask(log_gates: torch.Tensor, doc_ids: torch.Tensor | None = None) -> torch.Tensor:
    """The decay mask of gated linear attention.

    Args:
        log_gates: (B, L) float, log a_t <= 0 (a_t the gate at position t).
        doc_ids: (B, L) int64, non-decreasing along each row, or None (one document).

    Returns:
        float32 (B, L, L) (float64 for float64 gates): D[b, i, j] = exp(Σ_{t=j+1..i}
        log_gates[b, t]) for j <= i in the same document, else 0; D[b, i, i] = 1.
        Gradients flow to log_gates.
    """
    if log_gates.dim() != 2:
        raise ValueError(f"log_gates has shape {tuple(log_gates.shape)}; expected (B, L)")
    g = log_gates.to(torch.promote_types(log_gates.dtype, torch.float32))
    L = g.shape[-1]
    i = torch.arange(L, device=g.device)
    # segsum (Mamba-2's): seg[b, i, j] = Σ_{t=j+1..i} g[b, t] as a cumulative sum down each
    # column of g[b, t]·[t > j], never a difference of two cumulative sums.
    terms = g[:, :, None].masked_fill(i[:, None] <= i[None, :], 0.0)  # (B, L, L): [b, t, j]
    seg = terms.cumsum(dim=1)  # (B, L, L): [b, i, j]
    keep = i[:, None] >= i[None, :]  # (L, L): j <= i
    if doc_ids is not None:
        if doc_ids.shape != log_gates.shape:
            raise ValueError(f"doc_ids has shape {tuple(doc_ids.shape)}; expected (B, L) = "
                             f"{tuple(log_gates.shape)}")
        keep = keep & (doc_ids[:, :, None] == doc_ids[:, None, :])  # (B, L, L)
    return torch.exp(seg.masked_fill(~keep, float("-inf")))


def linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, decay: torch.Tensor) -> torch.Tensor:
    """The parallel form: ``(decay ⊙ (q kᵀ)) v``, no softmax, no scale.

    Args:
        q: (B, L, d). k: (B, L, d). v: (B, L, dv). decay: (B, L, L) from :func:`decay_mask`.

    Returns:
        (B, L, dv) in decay's dtype.
    """
    wide = decay.dtype
    return (decay * (q.to(wide) @ k.to(wide).transpose(-2, -1))) @ v.to(wide)


def decay_scan(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_gates: torch.Tensor,
               doc_ids: torch.Tensor | None = None) -> torch.Tensor:
    """The recurrent form: ``S_t = a_t S_{t-1} + k_t v_tᵀ``, ``o_t = q_t S_t``, with the state
    reset to 0 where a new document starts. A loop over positions: the oracle, not a kernel.

    Args:
        q: (B, L, d). k: (B, L, d). v: (B, L, dv). log_gates: (B, L), log a_t <= 0.
        doc_ids: (B, L) int64 or None.

    Returns:
        (B, L, dv), float32 (float64 for float64 inputs).
    """
    wide = torch.promote_types(q.dtype, torch.float32)
    q, k, v, a = q.to(wide), k.to(wide), v.to(wide), torch.exp(log_gates.to(wide))
    B, L, d = q.shape
    S = q.new_zeros(B, d, v.shape[-1])  # (B, d, dv)
    out = []
    for t in range(L):
        decay = a[:, t, None, None]  # (B, 1, 1)
        if doc_ids is not None and t > 0:
            decay = decay * (doc_ids[:, t] == doc_ids[:, t - 1]).to(wide)[:, None, None]
        S = decay * S + k[:, t, :, None] * v[:, t, None, :]  # (B, d, dv)
        out.append((q[:, t, None, :] @ S)[:, 0])  # (B, dv)
    return torch.stack(out, dim=1)
