"""Deterministic inputs for the checks: one random stream per (seed, exercise).

Public checks draw from :data:`PUBLIC_SEED` so every student sees the same
cases; hidden checks draw from the grading seed. Streams are named so that
adding a check to one exercise never shifts the inputs of another.
"""

from __future__ import annotations

import hashlib
import math

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
    """Normal values drawn as float32 (so every dtype sees the same numbers), then cast.

    The same bits on every CPU: see :func:`normal`."""
    return (normal(gen, shape) * scale).to(dtype)


def normal(gen: torch.Generator, shape: tuple[int, ...]) -> torch.Tensor:
    """float32 ``shape`` of standard normal values, the same bits on every CPU and thread count.

    ``torch.randn`` of 16 or more float32 values runs a vectorised Box-Muller whose last bits
    depend on the CPU (AVX2 or not: ``ATEN_CPU_CAPABILITY=default`` changes them), so inputs
    drawn with it, and everything recorded from them, would differ from machine to machine.
    This draws the same uniforms from ``gen`` as ``torch.randn`` does and applies the same
    transform in float64 before rounding to float32: the numbers are torch's to within an ulp or
    two, and a float64 result changes the float32 one only if it lies within a float64 ulp of a
    float32 rounding boundary. Fewer than 16 values: torch's scalar path, float64 already."""
    n = math.prod(shape)
    if n < 16:
        return torch.randn(shape, generator=gen)
    u = torch.rand(n, generator=gen).double()  # torch draws every value's uniform first ...
    out = _box_muller(u[: n - n % 16].view(-1, 16)).reshape(-1)
    if n % 16:  # ... then redraws the last 16 when n is not a multiple of 16
        tail = _box_muller(torch.rand(16, generator=gen).double().view(1, 16)).reshape(-1)
        out = torch.cat([out[: n - 16], tail])
    return out.float().view(shape)


def _box_muller(u: torch.Tensor) -> torch.Tensor:
    """float64 ``(m, 16)`` uniforms in [0, 1) -> ``(m, 16)`` normals: columns 0-7 and 8-15 pair up."""
    radius = torch.sqrt(-2 * torch.log(1 - u[:, :8]))  # 1 - u is in (0, 1]: log is finite
    theta = 2 * math.pi * u[:, 8:]
    return torch.cat([radius * torch.cos(theta), radius * torch.sin(theta)], dim=1)


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


# --------------------------------------------------------------------------- scores far from 0
#
# Random normal q and k scaled up give large scores, but float32 rounds a score of 1e5 to about
# 0.01, and two keys within a few such steps of each other make the softmax ill-conditioned: a
# correct float32 answer then differs from the float64 reference by more than any fair tolerance
# (seed 29 failed the course's own tiled_attention that way). The cases below are exact instead:
# integer entries times a power of two, and d = 4 so that the scale 1/sqrt(d) = 0.5 is exact, so
# every way of computing the scores in float32 gives the same, exact numbers, however large.

#: Head width of the exact cases: 1/sqrt(4) = 0.5 is exact in every float type.
EXACT_D = 4


def exact_qk(gen: torch.Generator, q_shape: tuple[int, ...], k_shape: tuple[int, ...], kind: str
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 q ``q_shape`` and k ``k_shape`` (last dim :data:`EXACT_D`) whose scores q·k / 2 are
    exact in float32 and, in every row, distinct and at least 2048 apart: each softmax is one-hot
    whatever the precision, so any float32 route (a running max, weights exp(s - lse)) gives the
    reference's numbers. ``kind``: "large" (either sign, about 1e4 to 1e5), "huge" (either sign,
    about 1e9 to 1e11) or "negative" (every score below -2e9: a blocked key filled with -1e9 instead
    of -inf, or a running max started at 0 or -1e9, then outweighs every allowed key).

    q's entries are positive integers times 2**u; key j is c_j·(1, 1, 1, 1)·2**u with the c_j of
    each row of keys distinct non-zero integers, so that score (i, j) is c_j·sum(q_i)·2**(2u) / 2."""
    *lead, n_keys, d = k_shape
    if d != EXACT_D or q_shape[-1] != EXACT_D:
        raise ValueError(f"exact cases have head width {EXACT_D}; got {q_shape}, {k_shape}")
    unit = {"large": 5, "huge": 14, "negative": 15}.get(kind)
    if unit is None:
        raise ValueError(f"kind is {kind!r}; expected 'large', 'huge' or 'negative'")
    order = torch.rand(*lead, n_keys, generator=gen).argsort(dim=-1) + 1  # each row: 1 .. Lk, shuffled
    if kind == "negative":
        c = -order
    else:
        sign = torch.where(torch.rand(*lead, n_keys, generator=gen) < 0.5, -1, 1)
        c = order * sign
    q = randint_(gen, q_shape, 1, 8).float() * 2.0**unit
    k = c[..., None].expand(*lead, n_keys, d).float() * 2.0**unit
    return q, k.contiguous()


def randint_(gen: torch.Generator, shape: tuple[int, ...], low: int, high: int) -> torch.Tensor:
    """long ``shape`` uniform in ``[low, high]`` (both ends included)."""
    return torch.randint(low, high + 1, shape, generator=gen)


def exact_scores(gen: torch.Generator, *shape: int, kind: str) -> torch.Tensor:
    """float32 scores ``shape`` far from 0 that float32 holds exactly: "huge" (±1e10) or "negative"
    (every entry about -1e10, below a -1e9 fill)."""
    if kind == "huge":
        return randint_(gen, shape, -2**9, 2**9).float() * 2.0**24
    if kind == "negative":
        return -randint_(gen, shape, 2**9, 2**10).float() * 2.0**24
    raise ValueError(f"kind is {kind!r}; expected 'huge' or 'negative'")


def two_keys_or_none(mask: torch.Tensor) -> torch.Tensor:
    """``mask`` with every row that allows exactly one key given a second one (the next key, or
    the previous one for the last key). Gradient checks use it: in a row with one allowed key the
    softmax's normaliser is exactly 1, where a reasonable answer's ``clamp(min=1)`` sits on its
    kink, and torch changed the gradient it picks there (2.13: 1, 2.14: 0). With two or more keys
    the normaliser is above 1 and every reasonable answer's gradient is the same."""
    mask = mask.clone()
    Lk = mask.shape[-1]
    if Lk < 2:
        return mask
    single = mask.sum(-1, keepdim=True) == 1  # (..., 1)
    where = mask.int().argmax(-1, keepdim=True)  # (..., 1): the one allowed key
    other = torch.where(where == Lk - 1, where - 1, where + 1)
    extra = torch.zeros_like(mask).scatter_(-1, other, True) & single
    return mask | extra


def with_empty_row(mask: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """``mask`` with one query row fully blocked (and every other row kept non-empty)."""
    mask = mask.clone()
    mask[..., :, 0] = True
    flat = mask.view(-1, mask.shape[-1])
    flat[int(torch.randint(0, flat.shape[0], (), generator=gen))] = False
    return mask
