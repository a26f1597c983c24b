"""Chapter 3, padding: ``padding_mask``, and ``padded_encoder``, which needs it in every layer.

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


@exercise(0.5, "padding_mask(lengths, max_len): bool (B, max_len), True at positions < lengths[b]; "
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
        *P.device_checks(R, "on lengths' device, vectorised (meta)", [Call((lengths, L), device="meta")]),
        P.unchanged(R, "does not modify lengths", [Call((lengths, L))]),
        P.on_cuda(R, "matches on CUDA", [Call((lengths, L))]),
    ]


# --------------------------------------------------------------------------- padded_encoder

def encoder_variant(x, lengths, weights, *, masked_layers: int | None = None, where: str = "keys"):
    """The encoder with a classic mistake: only the first ``masked_layers`` layers masked, or the
    mask on the queries (``where="queries"``) or applied after the softmax (``"after"``)."""
    B, L, D = x.shape
    real = am.padding_mask(lengths, L)  # (B, L)
    h = x
    for n, (Wq, Wk, Wv) in enumerate(weights):
        scores = (h @ Wq) @ (h @ Wk).transpose(-2, -1) / D ** 0.5  # (B, L, L)
        masked = masked_layers is None or n < masked_layers
        if masked and where == "keys":
            scores = scores.masked_fill(~real[:, None, :], float("-inf"))
        if masked and where == "queries":
            scores = scores.masked_fill(~real[:, :, None], float("-inf"))
        weights_ = torch.softmax(scores, dim=-1)
        if masked and where == "after":
            weights_ = weights_ * real[:, None, :]
        h = h + weights_ @ (h @ Wv)
    return h


def diagnose_encoder(args, kwargs, got, index, dtype) -> str | None:
    x, lengths, weights = args
    return dg.name_mistake(got, [
        (M["first_layer_only"], lambda: encoder_variant(x, lengths, weights, masked_layers=1)),
        (M["after_softmax"], lambda: encoder_variant(x, lengths, weights, where="after")),
        (M["mask_on_queries"], lambda: encoder_variant(x, lengths, weights, where="queries")),
        (M["no_mask"], lambda: encoder_variant(x, lengths, weights, masked_layers=0)),
    ], dtype)


ENCODER = J.Recipe("padded_encoder", am.padded_encoder, ("x", "lengths", "weights"),
                   (J.Out("h", "number", "(B, L, D)"),), diagnose_encoder)


def encoder_call(gen: torch.Generator, B: int, L: int, D: int, N: int, lengths: torch.Tensor | None = None,
                 dtype: torch.dtype = torch.float32) -> Call:
    """``padded_encoder(x, lengths, weights)`` on random inputs: weights scaled by 1/sqrt(D) so
    every layer's scores stay of order 1; by default random lengths with some padding."""
    if lengths is None:
        lengths = cases.positive_lengths(gen, B, L)
        lengths[0] = cases.integer(gen, 1, L - 1)  # at least one padded sequence
    weights = cases.randn(gen, N, 3, D, D, dtype=dtype) / D ** 0.5
    return Call((cases.randn(gen, B, L, D, dtype=dtype), lengths, weights))


def refilled(gen: torch.Generator, call: Call) -> list[Call]:
    """``call`` and the same call with new values (three times larger) at the padded positions."""
    x, lengths, weights = call.args
    pad = ~am.padding_mask(lengths, x.shape[1])[:, :, None]  # (B, L, 1)
    noise = cases.randn(gen, *x.shape, dtype=x.dtype) * 3
    return [call, Call((torch.where(pad, noise, x), lengths, weights))]


def real_tokens(call: Call) -> torch.Tensor:
    """The rows that are real tokens, bool (B, L)."""
    x, lengths, _ = call.args
    return am.padding_mask(lengths, x.shape[1])


@exercise(2, "padded_encoder(x, lengths, weights): N single-head self-attention layers with residuals "
          "over a padded batch, the padded keys masked in every layer; returns h (B, L, D).")
def padded_encoder_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    R = ENCODER
    pub = cases.generator(cases.PUBLIC_SEED, R.name)
    checks = [
        J.values(R, "two layers, lengths [5, 3]",
                 [encoder_call(pub, 2, 5, 4, 2, torch.tensor([5, 3]))], public=True),
        J.values(R, "three layers, lengths [2, 6, 4]",
                 [encoder_call(pub, 3, 6, 4, 3, torch.tensor([2, 6, 4]))], public=True),
    ]
    if not hidden:
        return checks
    gen = cases.generator(seed, R.name)

    def drawn(N=None, dtype=torch.float32):
        B, L, D = cases.integer(gen, 2, 4), cases.integer(gen, 4, 9), cases.integer(gen, 4, 8)
        return encoder_call(gen, B, L, D, N or cases.integer(gen, 2, 3), dtype=dtype)

    B, L = 3, 6
    return checks + [
        J.values(R, "matches reference (random B, L, D, 2 or 3 layers)", [drawn(), drawn()]),
        J.values(R, "four layers, a sequence of length 1",
                 [encoder_call(gen, B, L, 4, 4, torch.tensor([1, 6, 3]))]),
        J.values(R, "no padding, and one layer", [encoder_call(gen, 2, 5, 4, 2, torch.tensor([5, 5])),
                                                   drawn(N=1)], edge=True),
        Check("what the padding holds does not change the real tokens (3 layers)", refilled(gen, drawn(N=3)),
              P.pair_judge(R, real_tokens, M["padding_leak"]), kind="property"),
        J.dtypes(R, "keeps x's dtype", [drawn(dtype=torch.float64), drawn(dtype=torch.float32)]),
        *P.device_checks(R, "on x's device, vectorised (meta)", [Call(drawn().args, device="meta")]),
        P.unchanged(R, "does not modify x, lengths or weights", [drawn()]),
        P.on_cuda(R, "matches on CUDA", [drawn()]),
    ]
