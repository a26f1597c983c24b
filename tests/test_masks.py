"""Dense mask builders against two oracles nobody here wrote in this form:
python loops over the definitions in the exercise contract, and PyTorch's own
causal biases (``causal_lower_right`` / ``causal_upper_left``).

A mask may come back in any shape that broadcasts to the full one, so every
comparison broadcasts first.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right, causal_upper_left

import attnmask as am

FAST = settings(max_examples=40, deadline=None)


def loop_mask(rule, Lq: int, Lk: int) -> torch.Tensor:
    """Oracle: evaluate ``rule(i, j)`` on plain ints, one cell at a time."""
    return torch.tensor([[bool(rule(i, j)) for j in range(Lk)] for i in range(Lq)], dtype=torch.bool)


def loop_batch(rule, B: int, Lq: int, Lk: int) -> torch.Tensor:
    """Oracle for per-sequence masks: ``rule(b, i, j)`` -> bool ``(B, 1, Lq, Lk)``."""
    return torch.stack([loop_mask(lambda i, j, b=b: rule(b, i, j), Lq, Lk) for b in range(B)])[:, None]


def assert_mask(got: torch.Tensor, expected: torch.Tensor) -> None:
    assert got.dtype == torch.bool, f"masks are torch.bool; got {got.dtype}"
    assert torch.broadcast_shapes(got.shape, expected.shape) == expected.shape, (
        f"mask of shape {tuple(got.shape)} does not broadcast to {tuple(expected.shape)}"
    )
    assert torch.equal(torch.broadcast_to(got, expected.shape), expected)


def lower_right(Lq: int, Lk: int):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # it warns that Lq > Lk leaves rows empty
        return causal_lower_right(Lq, Lk)


def mask_seen_by_sdpa(bias, Lq: int, Lk: int) -> torch.Tensor:
    """Recover the boolean mask behind any SDPA ``attn_mask`` (a CausalBias
    included) from SDPA itself: with q = k = 0 every allowed key gets the same
    weight, and v = I copies the weights to the output."""
    q, k, v = torch.zeros(1, Lq, 4), torch.zeros(1, Lk, 4), torch.eye(Lk)[None]
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)[0] > 0


# --- causal ---------------------------------------------------------------------------------------


@FAST
@given(n=st.integers(1, 24))
def test_causal_mask_matches_the_definition(n):
    assert_mask(am.causal_mask(n), loop_mask(lambda i, j: j <= i, n, n))
    assert am.causal_mask(n).shape == (n, n)


@FAST
@given(Lq=st.integers(1, 16), Lk=st.integers(1, 16))
def test_rectangular_causal_matches_pytorch_causal_biases(Lq, Lk):
    assert_mask(am.causal_mask(Lq, n_keys=Lk), mask_seen_by_sdpa(lower_right(Lq, Lk), Lq, Lk))
    assert_mask(am.causal_mask(Lq, n_keys=Lk, align="top_left"),
                mask_seen_by_sdpa(causal_upper_left(Lq, Lk), Lq, Lk))
    assert_mask(am.causal_mask(Lq, n_keys=Lk), loop_mask(lambda i, j: j <= Lk - Lq + i, Lq, Lk))


def test_top_left_causal_is_what_sdpa_is_causal_does():
    Lq, Lk = 3, 7
    sdpa = torch.ones(Lq, Lk, dtype=torch.bool).tril()  # documented is_causal behaviour
    assert_mask(am.causal_mask(Lq, n_keys=Lk, align="top_left"), sdpa)
    assert not torch.equal(am.causal_mask(Lq, n_keys=Lk), sdpa), "bottom-right must differ when Lq < Lk"


# --- sliding window and prefix-LM -----------------------------------------------------------------


@FAST
@given(n=st.integers(1, 20), window=st.integers(1, 24))
def test_sliding_window_matches_the_definition(n, window):
    assert_mask(am.sliding_window_mask(n, window), loop_mask(lambda i, j: j <= i and i - j < window, n, n))


def test_sliding_window_extremes():
    assert_mask(am.sliding_window_mask(6, 1), torch.eye(6, dtype=torch.bool))  # counts the query itself
    assert_mask(am.sliding_window_mask(6, 6), am.causal_mask(6))


@FAST
@given(data=st.data())
def test_prefix_lm_matches_the_definition(data):
    n = data.draw(st.integers(1, 20))
    p = data.draw(st.integers(0, n))
    assert_mask(am.prefix_lm_mask(n, p), loop_mask(lambda i, j: j <= i or j < p, n, n))


def test_prefix_lm_extremes():
    assert_mask(am.prefix_lm_mask(5, 0), am.causal_mask(5))
    assert_mask(am.prefix_lm_mask(5, 5), torch.ones(5, 5, dtype=torch.bool))


# --- padding, decoder, encoder-decoder ------------------------------------------------------------

lengths_st = st.lists(st.integers(0, 9), min_size=1, max_size=5)


@FAST
@given(lengths=lengths_st, extra=st.integers(0, 3))
def test_padding_mask_matches_the_definition(lengths, extra):
    L = max(lengths) + extra
    got = am.padding_mask(torch.tensor(lengths), L)
    assert got.shape == (len(lengths), L)
    assert_mask(got, torch.tensor([[j < n for j in range(L)] for n in lengths], dtype=torch.bool))


@FAST
@given(lengths=lengths_st, extra=st.integers(0, 3))
def test_decoder_mask_matches_the_definition(lengths, extra):
    L = max(max(lengths) + extra, 1)
    expected = loop_batch(lambda b, i, j: j <= i and j < lengths[b], len(lengths), L, L)
    assert_mask(am.decoder_mask(torch.tensor(lengths), L), expected)


def test_decoder_mask_keeps_padded_query_rows():
    m = torch.broadcast_to(am.decoder_mask(torch.tensor([2, 4]), 4), (2, 1, 4, 4))
    # Row 3 of sequence 0 is padding, but it still sees the two real keys.
    assert m[0, 0, 3].tolist() == [True, True, False, False]
    assert m.any(-1).all(), "no row is fully masked when every length >= 1"


@FAST
@given(data=st.data())
def test_encoder_decoder_masks_match_the_definition(data):
    B = data.draw(st.integers(1, 4))
    S, T = data.draw(st.integers(1, 9)), data.draw(st.integers(1, 9))
    src = data.draw(st.lists(st.integers(0, S), min_size=B, max_size=B))
    tgt = data.draw(st.lists(st.integers(0, T), min_size=B, max_size=B))
    enc, dec, cross = am.encoder_decoder_masks(torch.tensor(src), torch.tensor(tgt), S, T)
    assert_mask(enc, loop_batch(lambda b, i, j: j < src[b], B, S, S))
    assert_mask(dec, loop_batch(lambda b, i, j: j <= i and j < tgt[b], B, T, T))
    assert_mask(cross, loop_batch(lambda b, i, j: j < src[b], B, T, S))


# --- documents ------------------------------------------------------------------------------------


@FAST
@given(ids=st.lists(st.lists(st.integers(0, 3), min_size=7, max_size=7), min_size=1, max_size=3))
def test_document_mask_matches_the_definition(ids):
    B, L = len(ids), len(ids[0])
    expected = loop_batch(lambda b, i, j: ids[b][i] == ids[b][j] and j <= i, B, L, L)
    assert_mask(am.document_mask(torch.tensor(ids)), expected)


def test_document_mask_of_one_document_is_causal():
    assert_mask(am.document_mask(torch.full((2, 6), 7)), torch.broadcast_to(am.causal_mask(6), (2, 1, 6, 6)))


# --- devices --------------------------------------------------------------------------------------


def test_tensor_builders_follow_the_meta_device():
    # meta tensors have no values: a builder that calls .item() / .tolist() / int(t) raises here.
    lengths = torch.tensor([3, 1, 4], device="meta")
    outs = [
        am.padding_mask(lengths, 5),
        am.decoder_mask(lengths, 5),
        *am.encoder_decoder_masks(lengths, lengths, 5, 6),
        am.document_mask(torch.zeros(3, 5, dtype=torch.long, device="meta")),
    ]
    expected_full = [(3, 5), (3, 1, 5, 5), (3, 1, 5, 5), (3, 1, 6, 6), (3, 1, 6, 5), (3, 1, 5, 5)]
    for out, full in zip(outs, expected_full):
        assert out.device.type == "meta" and out.dtype == torch.bool
        assert torch.broadcast_shapes(out.shape, full) == full


@pytest.mark.parametrize("build", [
    lambda dev: am.causal_mask(4, device=dev),
    lambda dev: am.causal_mask(3, n_keys=5, align="top_left", device=dev),
    lambda dev: am.sliding_window_mask(4, 2, device=dev),
    lambda dev: am.prefix_lm_mask(4, 2, device=dev),
])
def test_integer_builders_take_a_device(build):
    m = build("meta")
    assert m.device.type == "meta" and m.dtype == torch.bool
    assert build(None).device.type == "cpu"


def test_builders_on_device(device):
    lengths = torch.tensor([2, 3], device=device)
    ids = torch.tensor([[0, 0, 1], [1, 0, 1]], device=device)
    built = [am.padding_mask(lengths, 3), am.decoder_mask(lengths, 3),
             *am.encoder_decoder_masks(lengths, lengths, 3, 3), am.document_mask(ids),
             am.causal_mask(3, device=device), am.sliding_window_mask(3, 2, device=device),
             am.prefix_lm_mask(3, 1, device=device)]
    for m in built:
        assert m.device.type == device and m.dtype == torch.bool
    assert_mask(built[1].cpu(), am.decoder_mask(lengths.cpu(), 3))
    assert_mask(built[5].cpu(), am.document_mask(ids.cpu()))
    assert_mask(built[-2].cpu(), loop_mask(lambda i, j: j <= i and i - j < 2, 3, 3))


# --- to_additive and combine_masks ----------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_to_additive(dtype):
    mask = am.decoder_mask(torch.tensor([3, 0]), 4)
    bias = am.to_additive(mask, dtype)
    assert bias.shape == mask.shape and bias.dtype == dtype and bias.device == mask.device
    assert (bias[mask] == 0).all()
    assert (bias[~mask] <= torch.finfo(dtype).min).all()
    # Rows with a visible key: softmax(scores + bias) is PyTorch's masked softmax.
    scores = torch.randn(2, 1, 4, 4).to(dtype)
    via_bias = torch.softmax(scores.float() + bias.float(), dim=-1)
    ok = mask.any(-1)
    ours = am.masked_softmax(scores, mask)[ok].float()
    torch.testing.assert_close(ours, via_bias[ok], atol=1e-2, rtol=1e-2)


def test_to_additive_default_dtype_and_meta():
    bias = am.to_additive(torch.ones(2, 3, dtype=torch.bool, device="meta"))
    assert bias.dtype == torch.float32 and bias.device.type == "meta" and bias.shape == (2, 3)


def test_to_additive_on_device(device):
    bias = am.to_additive(am.causal_mask(3, device=device), torch.float16)
    assert bias.device.type == device and bias.dtype == torch.float16


def test_combine_masks_is_a_broadcast_and():
    causal = am.causal_mask(4)
    pad = am.padding_mask(torch.tensor([2, 4]), 4)[:, None, None, :]
    got = am.combine_masks(causal, None, pad)
    assert_mask(got, loop_batch(lambda b, i, j: j <= i and j < [2, 4][b], 2, 4, 4))


# --- errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("call, exc, words", [
    (lambda: am.causal_mask(0), ValueError, ["n", ">= 1", "0"]),
    (lambda: am.causal_mask(3.0), TypeError, ["int", "float"]),
    (lambda: am.causal_mask(3, align="left"), ValueError, ["bottom_right", "top_left", "left"]),
    (lambda: am.sliding_window_mask(4, 0), ValueError, ["window", ">= 1"]),
    (lambda: am.prefix_lm_mask(3, 4), ValueError, ["prefix_len", "3", "4"]),
    (lambda: am.padding_mask([1, 2], 4), TypeError, ["lengths", "Tensor", "list"]),
    (lambda: am.padding_mask(torch.tensor([1.0, 2.0]), 4), TypeError, ["lengths", "float32", "integer"]),
    (lambda: am.padding_mask(torch.tensor([[1, 2]]), 4), ValueError, ["lengths", "(1, 2)", "(B,)"]),
    (lambda: am.decoder_mask(torch.tensor([1, 2]), 0), ValueError, ["max_len", ">= 1"]),
    (lambda: am.encoder_decoder_masks(torch.tensor([1, 2]), torch.tensor([1]), 3, 3), ValueError,
     ["src_lengths", "tgt_lengths", "(B,)"]),
    (lambda: am.encoder_decoder_masks(torch.tensor([1]), torch.tensor([1]), 3, 0), ValueError,
     ["tgt_len", ">= 1"]),
    (lambda: am.document_mask(torch.tensor([1, 2])), ValueError, ["doc_ids", "(2,)", "(B, L)"]),
    (lambda: am.to_additive(torch.ones(3)), TypeError, ["torch.bool", "float32"]),
    (lambda: am.to_additive(torch.ones(3, dtype=torch.bool), torch.long), TypeError, ["floating", "int64"]),
    (lambda: am.combine_masks(torch.ones(3, 4, dtype=torch.bool), torch.ones(5, dtype=torch.bool)),
     ValueError, ["(3, 4)", "(5,)", "broadcast"]),
    (lambda: am.combine_masks(torch.ones(3)), TypeError, ["float32", "to_additive"]),
    (lambda: am.broadcast_mask(torch.ones(4, 7, dtype=torch.bool), (2, 1, 4, 5)), ValueError,
     ["(4, 7)", "(2, 1, 4, 5)", "(B, H, Lq, Lk)"]),
])
def test_errors_say_what_was_expected_and_what_was_got(call, exc, words):
    with pytest.raises(exc) as info:
        call()
    for word in words:
        assert word in str(info.value), f"{word!r} missing from: {info.value}"
