"""Chapter 4, causal AND padding: ``decoder_mask``.

:func:`decoder_mistakes` recognises the classic mistakes of combining a
causal mask with key padding; chapter 5 reuses it for the decoder's
self-attention mask.
"""

from __future__ import annotations

import torch

import attnmask as am

from .. import diagnose as dg
from ..mistakes import MISTAKES
from ..spec import Call, Check, exercise
from . import judges as J
from .ch3_padding import lengths_mask_checks

M = MISTAKES


def decoder_mistakes(lengths: torch.Tensor, L: int) -> list[dg.Candidate]:
    """What the classic decoder-mask mistakes return, as (B, 1, L, L) masks."""
    B = lengths.shape[0]
    causal = am.causal_mask(L)  # (L, L)
    real = am.padding_mask(lengths, L)  # (B, L)
    keys, rows = real[:, None, None, :], real[:, None, :, None]  # (B, 1, 1, L), (B, 1, L, 1)
    eye = torch.eye(L, dtype=torch.bool)
    full = lambda m: m.expand(B, 1, L, L)  # noqa: E731
    return [
        (M["inverted"], lambda: ~am.decoder_mask(lengths, L)),
        (M["unreshaped_padding"], lambda: full(causal & real)),  # (L, L) & (B, L): only when B = L
        # causal & rows == causal & rows & keys: the message says so, and fits both
        (M["rows_padded_too"], lambda: full(causal & rows)),
        (M["no_padding"], lambda: full(causal[None, None])),
        (M["no_causal"], lambda: full(keys)),
        (M["diagonal_excluded"], lambda: full(causal & ~eye & keys)),
        (M["wrong_triangle"], lambda: full(causal.T & keys)),
        (M["padding_off_by_one"],
         lambda: full(causal & am.padding_mask(lengths + 1, L + 1)[:, None, None, :L])),
    ]


def diagnose_decoder(args, kwargs, got, index, dtype) -> str | None:
    lengths, L = args
    return dg.name_mistake(got, decoder_mistakes(lengths, L), dtype)


def decoder_shape(args: tuple, kwargs: dict) -> tuple[int, ...]:
    return (args[0].shape[0], 1, args[1], args[1])


DECODER = J.Recipe("decoder_mask", am.decoder_mask, ("lengths", "max_len"),
                   (J.Out("mask", "mask", "(B, 1, L, L)", decoder_shape),), diagnose_decoder)


@exercise(1.5, "decoder_mask(lengths, max_len): broadcasts to (B, 1, L, L): causal AND key position < "
          "lengths[b]; padded query rows are not masked.")
def decoder_mask_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    R = DECODER
    checks = [
        J.values(R, "lengths [2, 4], max_len 4", [Call((torch.tensor([2, 4]), 4))], public=True),
        J.values(R, "length 0 and length = max_len", [Call((torch.tensor([5, 0]), 5))], public=True),
        # B = L: a (B, L) table used without its axes broadcasts silently (chapter 3)
        J.values(R, "B = L = 3: lengths [1, 3, 2], max_len 3", [Call((torch.tensor([1, 3, 2]), 3))],
                 public=True),
    ]
    if not hidden:
        return checks
    one_token = J.values(R, "one token (max_len = 1)", [Call((torch.tensor([1, 0, 1]), 1))], edge=True)
    return checks + lengths_mask_checks(R, seed, (2, 4), (3, 10), (one_token,))
