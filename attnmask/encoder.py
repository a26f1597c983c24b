"""A padded batch through a stack of attention layers: every layer needs the padding mask.

:func:`padded_encoder` is chapter 3's second exercise. Masking the padded keys in the first
layer is not enough: after it, the hidden states at padded positions carry what the padding
held, and a layer that does not mask them reads it back into the real tokens.
"""

from __future__ import annotations

import math

import torch

from .masks import padding_mask
from .softmax import masked_softmax


def padded_encoder(x: torch.Tensor, lengths: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """A stack of single-head self-attention layers with residuals over a padded batch.

    Args:
        x: float ``(B, L, D)``, the padded batch; what the padded positions hold is arbitrary.
        lengths: long ``(B,)``, ``1 <= lengths[b] <= L``, the real tokens of each sequence.
        weights: float ``(N, 3, D, D)``: layer n projects with ``Wq, Wk, Wv = weights[n]``.

    Returns:
        float ``(B, L, D)``, x's dtype: ``h`` after the N layers, where each layer does
        ``h = h + softmax(mask(q k^T / sqrt(D))) v`` with ``q, k, v = h Wq, h Wk, h Wv`` and
        every query (padded ones too) attending to the real keys of its sequence only.
    """
    keys = padding_mask(lengths, x.shape[1])[:, None, :]  # (B, 1, L): the real keys
    h = x
    for Wq, Wk, Wv in weights:
        q, k, v = h @ Wq, h @ Wk, h @ Wv  # (B, L, D)
        scores = q @ k.transpose(-2, -1) / math.sqrt(x.shape[-1])  # (B, L, L)
        h = h + masked_softmax(scores, keys) @ v  # (B, L, D)
    return h
