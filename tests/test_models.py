"""Tiny models: they learn, cached decoding equals the full pass, padding is
invisible, and the causal mask is exactly what stops the future leaking."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import attnmask as am
from attnmask.data import TEXT, CharVocab, lm_batch, reverse_batch
from attnmask.models import ModelConfig, TinyDecoder, TinyEncoderDecoder, train_steps

VOCAB = CharVocab(TEXT)
DATA = VOCAB.encode(TEXT)
N_SYMBOLS, MAX_LEN = 6, 6


def decoder(causal=True, seed=0) -> TinyDecoder:
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=len(VOCAB), d_model=32, n_heads=4, n_layers=2, max_len=32, causal=causal)
    return TinyDecoder(cfg).eval()


def enc_dec(seed=0) -> TinyEncoderDecoder:
    torch.manual_seed(seed)
    return TinyEncoderDecoder(ModelConfig(vocab_size=3 + N_SYMBOLS, d_model=32, n_heads=4, n_layers=2,
                                          max_len=16)).eval()


# --- learning -------------------------------------------------------------------------------------


def test_decoder_training_lowers_the_loss():
    model = decoder()
    gen = torch.Generator().manual_seed(0)

    def loss_fn(m, step):
        x, y = lm_batch(DATA, 8, 16, gen)
        return F.cross_entropy(m(x).flatten(0, 1), y.flatten())

    losses = train_steps(model, loss_fn, 30, lr=3e-3, seed=0)
    assert len(losses) == 30 and all(map(torch.isfinite, torch.tensor(losses)))
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.8 * first, f"loss went from {first:.3f} to {last:.3f}"
    assert not model.training, "train_steps leaves the model in eval mode"


def test_encoder_decoder_training_lowers_the_loss():
    model = enc_dec()
    gen = torch.Generator().manual_seed(0)

    def loss_fn(m, step):
        src, src_len, tgt_in, tgt_out, tgt_len = reverse_batch(8, MAX_LEN, N_SYMBOLS, gen)
        logits = m(src, tgt_in, src_len, tgt_len)
        return F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=0)

    losses = train_steps(model, loss_fn, 30, lr=3e-3, seed=0)
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.8 * first, f"loss went from {first:.3f} to {last:.3f}"


# --- the causal mask and leakage ------------------------------------------------------------------


def token_influence(model: TinyDecoder, idx: torch.Tensor) -> torch.Tensor:
    """influence_matrix of the whole model, differentiating with respect to the
    embeddings: a forward hook swaps the embedding output for the input of f, so
    the model's own forward (and its own mask) runs unchanged."""

    def f(e):  # (L, D) -> (L, 3)
        handle = model.embed.register_forward_hook(lambda mod, args, out: e[None])
        try:
            # A few logits are enough to see who depends on whom, at a fraction of the cost.
            return model(idx[None])[0, :, :3]
        finally:
            handle.remove()

    return am.influence_matrix(f, model.embed(idx[None])[0].detach())


@pytest.mark.parametrize("causal", [True, False])
def test_future_tokens_reach_earlier_outputs_only_without_the_causal_mask(causal):
    model = decoder(causal=causal)
    idx = VOCAB.encode("the mask")
    infl = token_influence(model, idx)  # (L, L)
    above = torch.ones(len(idx), len(idx), dtype=torch.bool).triu(1)
    if causal:
        assert (infl[above] == 0).all(), "with the causal mask, output i must not depend on token j > i"
    else:
        assert (infl[above] > 0).all(), "without the mask, later tokens must influence earlier outputs"
    assert (infl[~above] > 0).all()


def test_causal_logits_do_not_change_when_the_future_does():
    model = decoder()
    a, b = VOCAB.encode("the causal mask"), VOCAB.encode("the causal seam")
    la, lb = model(a[None]), model(b[None])
    split = 11  # first position where the strings differ
    torch.testing.assert_close(la[:, :split], lb[:, :split], atol=0, rtol=0)
    assert not torch.allclose(la[:, split:], lb[:, split:])


# --- caches ---------------------------------------------------------------------------------------


def test_decoder_logits_with_cache_equal_the_full_pass():
    model = decoder().double()
    idx = VOCAB.encode("padding hides the filler")[None].repeat(2, 1)
    idx[1] = idx[1].flip(0)
    full = model(idx)
    caches, outs, start = [am.KVCache() for _ in model.blocks], [], 0
    for n in (5, 1, 1, 7, 1, 9):
        outs.append(model(idx[:, start:start + n], caches=caches))
        start += n
    assert start == idx.shape[1]
    torch.testing.assert_close(torch.cat(outs, dim=1), full)


@pytest.mark.parametrize("causal", [True, False])
def test_generate_with_and_without_cache_agree(causal):
    model = decoder(causal=causal)
    prompt = torch.stack([VOCAB.encode("a mask "), VOCAB.encode("the key")])  # (B, L)
    with_cache = model.generate(prompt, 12, use_cache=True)
    without = model.generate(prompt, 12, use_cache=False)
    assert with_cache.shape == (2, prompt.shape[1] + 12)
    assert torch.equal(with_cache[:, :prompt.shape[1]], prompt)
    if causal:
        assert torch.equal(with_cache, without)


def test_greedy_decode_with_and_without_cache_agree():
    model = enc_dec()
    src, src_len, *_ = reverse_batch(4, MAX_LEN, N_SYMBOLS, torch.Generator().manual_seed(1))
    with_cache = model.greedy_decode(src, src_len, bos=1, n_steps=MAX_LEN + 1, use_cache=True)
    without = model.greedy_decode(src, src_len, bos=1, n_steps=MAX_LEN + 1, use_cache=False)
    assert with_cache.shape == (4, MAX_LEN + 2) and (with_cache[:, 0] == 1).all()
    assert torch.equal(with_cache, without)


def test_encoder_decoder_cached_logits_equal_the_full_pass():
    model = enc_dec().double()
    src, src_len, tgt_in, _, tgt_len = reverse_batch(3, MAX_LEN, N_SYMBOLS, torch.Generator().manual_seed(2))
    full = model(src, tgt_in, src_len, tgt_len)
    enc_m, dec_m, cross_m = am.encoder_decoder_masks(src_len, tgt_len, src.shape[1], tgt_in.shape[1])
    memory = model.encode(src, enc_m)
    caches = [(am.KVCache(), am.KVCache()) for _ in model.decoder]
    T = tgt_in.shape[1]
    dec_m = torch.broadcast_to(dec_m, (3, 1, T, T))
    steps = [model.decode(tgt_in[:, t:t + 1], memory, dec_m[:, :, t:t + 1, :t + 1], cross_m, caches, start=t)
             for t in range(T)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full)


# --- padding --------------------------------------------------------------------------------------


def test_padded_keys_are_invisible_to_the_decoder():
    # Without the causal mask every position sees every key, so only the key mask
    # can hide the padding: changing padded tokens must not move real outputs.
    model = decoder(causal=False)
    idx = VOCAB.encode("hidden keys")[None].repeat(2, 1)
    key_mask = am.padding_mask(torch.tensor([7, 11]), idx.shape[1])
    other = idx.clone()
    other[0, 7:] = VOCAB.encode("zzzz")
    la, lb = model(idx, key_mask=key_mask), model(other, key_mask=key_mask)
    torch.testing.assert_close(la[0, :7], lb[0, :7], atol=0, rtol=0)
    torch.testing.assert_close(la[1], lb[1], atol=0, rtol=0)
    assert not torch.allclose(model(idx)[0, :7], model(other)[0, :7]), "without the key mask padding leaks"


def test_source_padding_is_invisible_to_the_encoder_decoder():
    model = enc_dec()
    src, src_len, tgt_in, _, tgt_len = reverse_batch(4, MAX_LEN, N_SYMBOLS, torch.Generator().manual_seed(3))
    noisy = src.clone()
    pad = torch.arange(src.shape[1])[None, :] >= src_len[:, None]
    noisy[pad] = 5  # a real symbol where padding was
    assert pad.any()
    torch.testing.assert_close(model(src, tgt_in, src_len, tgt_len), model(noisy, tgt_in, src_len, tgt_len),
                               atol=0, rtol=0)
