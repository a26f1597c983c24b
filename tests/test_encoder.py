"""attnmask.padded_encoder (exercise 3.2): every layer masks the padded keys, as PyTorch's own
attention with the key mask does; the real tokens do not see the padding; the shortcuts (the mask in
the first layer only, after the softmax, on the queries) lose more than half of the points."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from buggy import correct, encoder, grade

import attnmask as am
from grader.checks import EXERCISES
from grader.results import CheckResult, score_of


def _inputs(seed: int, B=3, L=7, D=8, N=3):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, L, D, generator=gen, dtype=torch.float64)
    weights = torch.randn(N, 3, D, D, generator=gen, dtype=torch.float64) / D ** 0.5
    return x, torch.tensor([L, 2, 5])[:B], weights


@pytest.mark.parametrize("seed", [0, 1])
def test_each_layer_is_sdpa_with_the_key_mask(seed):
    """The oracle: scaled_dot_product_attention with the (B, 1, L) key mask, layer after layer."""
    x, lengths, weights = _inputs(seed)
    keys = torch.arange(x.shape[1])[None, None, :] < lengths[:, None, None]  # (B, 1, L)
    h = x
    for wq, wk, wv in weights:
        h = h + F.scaled_dot_product_attention(h @ wq, h @ wk, h @ wv, attn_mask=keys)
    torch.testing.assert_close(am.padded_encoder(x, lengths, weights), h)


def test_the_real_tokens_do_not_see_the_padding():
    x, lengths, weights = _inputs(2)
    refilled = x.clone()
    refilled[1, 2:] = 1e3
    refilled[2, 5:] = -7.0
    h, h2 = am.padded_encoder(x, lengths, weights), am.padded_encoder(refilled, lengths, weights)
    real = am.padding_mask(lengths, x.shape[1])
    assert torch.equal(h[real], h2[real])
    assert not torch.equal(h[~real], h2[~real])  # the padded rows do read their own refilled input


def _points(fn, seed: int) -> float:
    checks = EXERCISES["padded_encoder"].make_checks(seed, hidden=True)
    verdicts = grade(fn, checks)
    return score_of([CheckResult(c.name, c.public, c.weight, verdicts[c.name].passed, kind=c.kind)
                     for c in checks if c.name in verdicts])


@pytest.mark.parametrize("seed", [0, 7])
def test_a_correct_encoder_gets_full_marks(seed):
    assert _points(correct.padded_encoder, seed) == 1.0


@pytest.mark.parametrize("seed", [0, 7])
@pytest.mark.parametrize("shortcut", sorted(encoder.SHORTCUTS))
def test_each_shortcut_loses_more_than_half(shortcut, seed):
    assert _points(encoder.SHORTCUTS[shortcut], seed) < 0.5


def test_the_input_handed_back_scores_zero():
    assert _points(encoder.encoder_returns_x, 3) == 0.0
