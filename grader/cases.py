"""Deterministic inputs for the checks: one random stream per (seed, exercise).

Public checks draw from :data:`PUBLIC_SEED` so every student sees the same
cases; hidden checks draw from the grading seed. Streams are named so that
adding a check to one exercise never shifts the inputs of another.
"""

from __future__ import annotations

import hashlib

import torch

PUBLIC_SEED = 0

FLOATS = (torch.float32, torch.float16, torch.bfloat16)
DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
               torch.float64: "float64"}


def generator(seed: int, name: str) -> torch.Generator:
    """A CPU generator seeded from ``seed`` and ``name`` (stable across runs and
    machines, unlike Python's salted ``hash``)."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))


def integer(gen: torch.Generator, low: int, high: int) -> int:
    """Uniform int in ``[low, high]`` (both ends included)."""
    return int(torch.randint(low, high + 1, (), generator=gen))


def randn(gen: torch.Generator, *shape: int, dtype: torch.dtype = torch.float32,
          scale: float = 1.0) -> torch.Tensor:
    """Normal values drawn in float32 (so every dtype sees the same numbers), then cast."""
    return (torch.randn(shape, generator=gen) * scale).to(dtype)


def random_mask(gen: torch.Generator, *shape: int, p: float = 0.6) -> torch.Tensor:
    """bool mask, True (may attend) with probability ``p``."""
    return torch.rand(shape, generator=gen) < p


def lengths(gen: torch.Generator, B: int, max_len: int, *, edges: bool = True) -> torch.Tensor:
    """long ``(B,)`` in ``[0, max_len]``; with ``edges`` (and B >= 2) one length is 0
    and one is ``max_len``, at random positions."""
    out = torch.randint(0, max_len + 1, (B,), generator=gen)
    if edges and B >= 2:
        i, j = torch.randperm(B, generator=gen)[:2].tolist()
        out[i], out[j] = 0, max_len
    return out


def positive_lengths(gen: torch.Generator, B: int, max_len: int) -> torch.Tensor:
    """long ``(B,)`` in ``[1, max_len]``, one of them ``max_len`` when B >= 2."""
    out = torch.randint(1, max_len + 1, (B,), generator=gen)
    if B >= 2:
        out[int(torch.randint(0, B, (), generator=gen))] = max_len
    return out


def doc_ids(gen: torch.Generator, B: int, L: int) -> torch.Tensor:
    """long ``(B, L)`` packed document ids, neither sorted nor contiguous: each row
    is a few runs whose ids come from a shuffled, gappy set (e.g. 7, 2, 11), and
    the first document comes back after another one (ids a b a c ...), so equal
    ids in separate runs must still count as one document. Needs L >= 3."""
    rows = []
    for _ in range(B):
        pool = (torch.randperm(12, generator=gen)[:3] * 3 + 1).tolist()
        a, b, c = pool
        runs = [a, b, a, c, b][: min(L, 5)]
        cuts = sorted(torch.randperm(L - 1, generator=gen)[: len(runs) - 1].add(1).tolist())
        bounds = [0, *cuts, L]
        rows.append(torch.cat([torch.full((bounds[r + 1] - bounds[r],), runs[r]) for r in range(len(runs))]))
    return torch.stack(rows)
