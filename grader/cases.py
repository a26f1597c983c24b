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


def doc_ids(gen: torch.Generator, B: int, L: int, n_docs: int = 3) -> torch.Tensor:
    """long ``(B, L)`` document ids drawn from a shuffled, gappy set (e.g. 7, 2, 11),
    so they are neither sorted nor contiguous, and a document may come back
    after another one (the same id in two separate runs)."""
    pool = torch.randperm(4 * n_docs, generator=gen)[:n_docs] * 3 + 1
    runs = torch.randint(0, n_docs, (B, L), generator=gen)
    # Runs of equal ids (packed documents) rather than pure noise: repeat the
    # previous id with probability 1/2.
    keep = torch.rand(B, L, generator=gen) < 0.5
    for i in range(1, L):
        runs[:, i] = torch.where(keep[:, i], runs[:, i - 1], runs[:, i])
    return pool[runs]
