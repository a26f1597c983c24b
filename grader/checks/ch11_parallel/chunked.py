"""Chapter 11's chunked masks: ``chunked_local_mask`` and ``padded_chunked_mask`` (Llama 4's
chunked attention, with transformers' left padding), their checks and mistakes; in chapter 11's
package (:mod:`grader.checks.ch11_parallel`). The hidden cases draw chunks that do not divide the
sequence, decode steps across a chunk border, and masked keys after a row's first real token.
"""

from __future__ import annotations

import torch

import attnmask as am

from ... import cases
from ... import diagnose as dg
from ...mistakes import MISTAKES
from ...spec import Call, Check, exercise
from ..common import judges as J
from ..common import properties as P
from .mistakes import MISTAKES11

M = MISTAKES
X = MISTAKES11


# --------------------------------------------------------------------------- chunked_local_mask

def diagnose_chunked(args, kwargs, got, index, dtype) -> str | None:
    Lq, Lk, chunk = args[:3]
    p = (Lk - Lq + torch.arange(Lq))[:, None]  # (Lq, 1)
    j = torch.arange(Lk)[None, :]  # (1, Lk)
    i = torch.arange(Lq)[:, None]
    ref = am.chunked_local_mask(Lq, Lk, chunk)
    return dg.name_mistake(got, [
        (M["inverted"], lambda: ~ref),
        (X["chunk_window"], lambda: (j <= p) & (p - j < chunk)),
        (X["chunk_window"], lambda: (j <= p) & (p - j <= chunk)),
        (X["chunk_top_left"], lambda: (j <= i) & (j // chunk == i // chunk)),
        (X["chunk_top_left"], lambda: (j <= i) & (i - j < chunk)),
        (X["chunk_not_causal"], lambda: j // chunk == p // chunk),
        (M["no_causal"], lambda: (j // chunk == p // chunk) & (j >= p)),
    ], dtype)


CHUNKED = J.Recipe("chunked_local_mask", am.chunked_local_mask, ("Lq", "Lk", "chunk"),
                   (J.Out("mask", "mask", "(Lq, Lk)", lambda a, k: (a[0], a[1])),), diagnose_chunked)


@exercise(1.5, "chunked_local_mask(Lq, Lk, chunk, *, device=None): bool (Lq, Lk), query i at p = Lk - Lq + i "
          "sees key j iff j <= p and j // chunk == p // chunk.")
def chunked_local_mask_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    R = CHUNKED
    gen = cases.generator(seed, "chunked_local_mask sizes")
    chunk = cases.integer(gen, 3, 5)
    Lk = cases.integer(gen, 3 * chunk + 1, 4 * chunk - 1)  # chunk does not divide Lk

    def draw(g):
        n = cases.integer(g, 2 * chunk + 1, 5 * chunk)
        return (cases.integer(g, 2, n), n, chunk)

    public = [("prefill: Lq = Lk = 10, chunk 4 (a partial last chunk)", (10, 10, 4)),
              ("chunk = 1: each query sees only itself", (6, 6, 1))]
    edges = [("decode: one query at the first position of a chunk", (1, 2 * chunk + 1, chunk)),
             ("chunk >= Lk: plain causal", (4, 7, 9))]
    checks = P.int_mask_checks(R, seed, hidden, public, edges, draw) + [
        J.values(R, "3 queries after 9 keys, chunk 4", [Call((3, 12, 4))], public=True),
        J.raises(R.name, R.arg_names, "bad sizes raise ValueError",
                 [Call((0, 4, 2)), Call((5, 4, 2)), Call((3, 4, 0))], "Lq >= 1, Lq <= Lk and chunk >= 1"),
    ]
    if not hidden:
        return checks
    return checks + [
        J.values(R, "decode steps across a chunk border (Lq = 1)",
                 [Call((1, n, chunk)) for n in range(2 * chunk - 1, 2 * chunk + 3)]),
        J.values(R, "prefill of Lk keys, chunk not dividing Lk; queries across two chunks",
                 [Call((Lk, Lk, chunk)), Call((chunk + 2, Lk, chunk))]),
    ]


# --------------------------------------------------------------------------- padded_chunked_mask

def _chunked_with(attention_mask, Lq, chunk, pad, keys=True):
    """bool (B, 1, Lq, Lk): chunks counted from ``pad`` (B,), keys masked by ``attention_mask`` or not."""
    Lk = attention_mask.shape[-1]
    p = torch.arange(Lk - Lq, Lk)[:, None]
    j = torch.arange(Lk)[None, :]
    off = pad[:, None, None, None]
    same = (j - off).div(chunk, rounding_mode="floor") == (p - off).div(chunk, rounding_mode="floor")
    m = (j <= p) & same
    return m & attention_mask[:, None, None, :] if keys else m


def diagnose_padded(args, kwargs, got, index, dtype) -> str | None:
    mask, Lq, chunk = args[:3]
    mask = mask.bool()
    pad = (~mask).long().cumprod(dim=-1).sum(dim=-1)
    zero = torch.zeros_like(pad)
    ref = am.padded_chunked_mask(mask, Lq, chunk)
    Lk = mask.shape[-1]
    i = torch.arange(Lq)[:, None]
    j = torch.arange(Lk)[None, :]
    off = pad[:, None, None, None]
    return dg.name_mistake(got, [
        (M["inverted"], lambda: ~ref),
        (X["padchunk_from_zero"], lambda: _chunked_with(mask, Lq, chunk, zero)),
        (X["padchunk_pad_keys"], lambda: _chunked_with(mask, Lq, chunk, pad, keys=False)),
        (X["padchunk_from_zero"], lambda: _chunked_with(mask, Lq, chunk, zero, keys=False)),
        (X["padchunk_all_false"], lambda: _chunked_with(mask, Lq, chunk, (~mask).long().sum(dim=-1))),
        (X["chunk_top_left"], lambda: ((j <= i) & ((j - off).div(chunk, rounding_mode="floor")
                                                   == (i - off).div(chunk, rounding_mode="floor"))
                                       & mask[:, None, None, :])),
    ], dtype)


PADDED = J.Recipe("padded_chunked_mask", am.padded_chunked_mask, ("attention_mask", "Lq", "chunk"),
                  (J.Out("mask", "mask", "(B, 1, Lq, Lk)",
                         lambda a, k: (a[0].shape[0], 1, a[1], a[0].shape[-1])),), diagnose_padded)


def left_padded(gen, B: int, Lk: int, pads: list[int] | None = None, holes: bool = False) -> torch.Tensor:
    """bool (B, Lk), True = a real token: row b starts with pads[b] False (random when None); with
    ``holes``, one real row also gets a False after its first real token (a masked key, not padding)."""
    pads = pads if pads is not None else [cases.integer(gen, 0, Lk - 2) for _ in range(B)]
    m = torch.arange(Lk)[None, :] >= torch.tensor(pads)[:, None]
    if holes:
        b = int(torch.argmin(torch.tensor(pads)))
        m[b, cases.integer(gen, pads[b] + 1, Lk - 1)] = False
    return m


@exercise(2.5, "padded_chunked_mask(attention_mask, Lq, chunk): bool (B, 1, Lq, Lk), True = may attend: "
          "query i of row b at p = Lk - Lq + i sees key j iff attention_mask[b, j], j <= p and "
          "(j - pad_b) // chunk == (p - pad_b) // chunk, pad_b = the number of leading False of row b "
          "(transformers' chunked overlay with left padding); vectorised, on attention_mask's device.")
def padded_chunked_mask_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    R = PADDED
    pub = cases.generator(cases.PUBLIC_SEED, R.name)
    checks = [
        J.values(R, "prefill, chunk 3, left padding of 0, 2 and 5 (B=3, Lk=10)",
                 [Call((left_padded(pub, 3, 10, [0, 2, 5]), 10, 3))], public=True),
        J.values(R, "decode: one query after 8 keys, chunk 4, left padding of 1 and 3",
                 [Call((left_padded(pub, 2, 9, [1, 3]), 1, 4))], public=True),
        J.values(R, "a masked key after the first real token shifts nothing (B=2, Lk=9, chunk 3)",
                 [Call((left_padded(pub, 2, 9, [2, 0], holes=True), 9, 3))], public=True),
        J.raises(R.name, R.arg_names, "bad sizes raise ValueError",
                 [Call((left_padded(pub, 2, 6, [0, 1]), 0, 2)), Call((left_padded(pub, 2, 6, [0, 1]), 7, 2)),
                  Call((left_padded(pub, 2, 6, [0, 1]), 3, 0))], "1 <= Lq <= Lk and chunk >= 1"),
    ]
    if not hidden:
        return checks
    gen = cases.generator(seed, R.name)
    chunk = cases.integer(gen, 2, 4)
    B, Lk = cases.integer(gen, 3, 4), cases.integer(gen, 3 * chunk + 1, 4 * chunk + 2)
    x = lambda holes=False: left_padded(gen, B, Lk, holes=holes)  # noqa: E731
    return checks + [
        J.values(R, "prefill of random left-padded rows (random chunk, Lk)", [Call((x(), Lk, chunk))]),
        J.values(R, "the last Lq queries (a chunk of queries after a cache), random padding",
                 [Call((x(), cases.integer(gen, 2, chunk + 2), chunk)), Call((x(True), Lk - 1, chunk))]),
        J.values(R, "decode steps across a chunk border of a padded row",
                 [Call((left_padded(gen, 2, n, [cases.integer(gen, 1, 3), 0]), 1, chunk))
                  for n in range(2 * chunk + 2, 2 * chunk + 6)]),
        J.values(R, "a row that is all padding beside a real one; chunk >= Lk (plain causal over real keys)",
                 [Call((left_padded(gen, 2, Lk, [Lk, 1]), Lk, chunk)),
                  Call((left_padded(gen, 2, Lk, [2, 0]), Lk, Lk + 1))], edge=True),
        J.dtypes(R, "bool (True = may attend)", [Call((x(), Lk, chunk))]),
        *P.device_checks(R, "on attention_mask's device, vectorised (meta)",
                         [Call((x(), Lk, chunk), device="meta")]),
        P.unchanged(R, "does not modify attention_mask", [Call((x(), Lk, chunk))]),
        P.on_cuda(R, "matches on CUDA", [Call((x(True), Lk - 2, chunk))]),
    ]
