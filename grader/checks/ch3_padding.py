"""Chapter 3, padding: ``padding_mask``.

:func:`lengths_mask_checks` gives the hidden checks of a mask built from
``(lengths, max_len)``; chapter 4 reuses it for ``decoder_mask``.
"""

from __future__ import annotations

import torch

import attnmask as am

from .. import cases
from .. import diagnose as dg
from ..mistakes import MISTAKES
from ..spec import Call, Check, exercise
from .common import judges as J
from .common import properties as P

M = MISTAKES


def diagnose_padding(args, kwargs, got, index, dtype) -> str | None:
    lengths, max_len = args
    ref = am.padding_mask(lengths, max_len)
    return dg.name_mistake(got, [
        (M["inverted"], lambda: ~ref),
        (M["padding_off_by_one"], lambda: am.padding_mask(lengths + 1, max_len + 1)[:, :max_len]),
        ("the padding is off by one: position lengths[b] - 1 is the last real token.",
         lambda: am.padding_mask((lengths - 1).clamp(min=0), max_len)),
    ], dtype)


PADDING = J.Recipe("padding_mask", am.padding_mask, ("lengths", "max_len"),
                   (J.Out("mask", "mask", "(B, L)", lambda a, k: (a[0].shape[0], a[1])),), diagnose_padding)


@exercise(1.0, "padding_mask(lengths, max_len): bool (B, max_len), True at positions < lengths[b]; "
          "vectorised, on lengths' device.")
def padding_mask_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    R = PADDING
    checks = [
        J.values(R, "lengths [3, 1, 4], max_len 4", [Call((torch.tensor([3, 1, 4]), 4))], public=True),
        J.values(R, "length 0 and length = max_len", [Call((torch.tensor([0, 5]), 5))], public=True),
    ]
    if not hidden:
        return checks
    return checks + lengths_mask_checks(R, seed, (2, 5), (4, 12))


def lengths_mask_checks(R: J.Recipe, seed: int, B_range: tuple[int, int], L_range: tuple[int, int],
                        edges: tuple[Check, ...] = ()) -> list[Check]:
    """The hidden checks of a mask built from ``(lengths, max_len)``: three random
    cases (B and L drawn from the ranges), the ``edges``, then dtype, device (meta),
    lengths unchanged and CUDA on one more case."""
    gen = cases.generator(seed, R.name)
    calls = []
    for _ in range(3):
        B, L = cases.integer(gen, *B_range), cases.integer(gen, *L_range)
        calls.append(Call((cases.lengths(gen, B, L), L)))
    B, L = cases.integer(gen, 2, 4), cases.integer(gen, 5, 9)
    lengths = cases.lengths(gen, B, L)
    return [
        J.values(R, "matches reference (random B, lengths)", calls),
        *edges,
        J.dtypes(R, "returns torch.bool", [Call((lengths, L))]),
        P.on_device(R, "on lengths' device, vectorised (meta)", [Call((lengths, L), device="meta")]),
        P.unchanged(R, "does not modify lengths", [Call((lengths, L))]),
        P.on_cuda(R, "matches on CUDA", [Call((lengths, L))]),
    ]
