"""Inputs for chapter 12's checks (:mod:`grader.checks.ch12_modern`): sink logits placed among
the scores, scores near 1e3 that float16 rounds, tied and NaN indexer scores, log gates, packed
document ids and closed gates. Every draw comes from a :func:`grader.cases.generator`."""

from __future__ import annotations

import math

import torch

from ... import cases

NINF = float("-inf")
F32 = torch.float32


def sinks_of(gen, H: int, dtype=F32, scale: float = 1.0) -> torch.Tensor:
    """(H,) sink logits, float32 (the parameter's dtype in gpt-oss) unless ``dtype``."""
    return cases.randn(gen, H, scale=scale).to(dtype)


def low_sinks(H: int) -> torch.Tensor:
    """(H,) float32 sinks far below any fill that stands in for -inf: float32's lowest, then -1e10, ...
    A -1e9 or finfo.min fill ties with or beats such a sink on a fully masked row."""
    return torch.tensor([torch.finfo(F32).min, -1e10, -3e9, -1e12])[torch.arange(H) % 4]


def big_scores(gen, B, H, Lq, Lk, d, dv, dtype) -> tuple:
    """q, k whose scaled scores are all near 1e3, a few units apart (so the weights are far
    from one-hot), and v of ±1: float16 rounds such a score by up to 0.5 before the scale."""
    q = torch.zeros(B, H, Lq, d)
    q[..., 0] = 32 * math.sqrt(d)
    k = cases.randn(gen, B, H, Lk, d, scale=0.02)
    k[..., 0] = 31 + cases.randn(gen, B, H, Lk, scale=0.05)
    v = cases.randn(gen, B, H, Lk, dv).sign()
    return q.to(dtype), k.to(dtype), v.to(dtype)


def among(q, k, v, mask) -> tuple:
    """(q, k, v, sinks, mask) with each head's sink in the middle of the widest gap between its
    rows' largest allowed scores: some rows give nearly all their weight to the sink, the others
    to a key, and no row's largest score lies near the sink (a near tie at scores of 1e4 would
    make float32's rounding of the scores visible in the output)."""
    s = (q.double() @ k.double().mT / math.sqrt(q.shape[-1])).masked_fill(~mask, NINF).amax(-1)  # (B, H, Lq)
    s = s.transpose(0, 1).flatten(1)  # (H, B·Lq)
    sinks = []
    for row in s:
        top = row[torch.isfinite(row)].sort().values  # >= 2 values: one empty row of B·Lq >= 6
        gap = int((top[1:] - top[:-1]).argmax())
        sinks.append((top[gap] + top[gap + 1]) / 2)
    sinks = torch.stack(sinks).float()
    return q, k, v, sinks, mask


def tied(gen, B: int, Lq: int, Lk: int, levels: int = 3) -> torch.Tensor:
    """(B, Lq, Lk) scores from a few levels, so that many keys tie."""
    return torch.randint(0, levels, (B, Lq, Lk), generator=gen).float()


def with_nan(scores: torch.Tensor, gen, p: float = 0.25) -> torch.Tensor:
    """``scores`` with about a fraction ``p`` of them NaN, the highest-scoring key of row 0 among them."""
    out = scores.clone()
    out[torch.rand(out.shape, generator=gen) < p] = float("nan")
    out[:, 0, 0] = float("nan")
    return out


def gates(gen, B: int, L: int, low: float = 1.0) -> torch.Tensor:
    """(B, L) float32 log gates in [-low, 0): a_t in (exp(-low), 1]."""
    return -torch.rand(B, L, generator=gen) * low


def docs(gen, B: int, L: int, n: int = 3) -> torch.Tensor:
    """(B, L) int64 non-decreasing document ids, ``n`` documents per row at random borders."""
    rows = []
    for _ in range(B):
        cuts = torch.randperm(L - 1, generator=gen)[: n - 1].add(1)
        starts = torch.zeros(L, dtype=torch.long)
        starts[cuts] = 1
        rows.append(starts.cumsum(0))
    return torch.stack(rows)


def closed(g: torch.Tensor, gen) -> torch.Tensor:
    """``g`` with a few gates closed (log a = -inf): the state forgets everything there."""
    out = g.clone()
    L = out.shape[-1]
    for b in range(out.shape[0]):
        out[b, torch.randperm(L - 1, generator=gen)[:2] + 1] = NINF
    return out
