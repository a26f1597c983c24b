"""Classic mistakes of the two diagnosis exercises, each otherwise correct:
``find_leaking_layer`` (1.3) and ``leaks_across_padding`` (4.2)."""

from __future__ import annotations

import torch

from . import correct as ok

# --------------------------------------------------------------------------- find_leaking_layer

def _prefix(layers, k):
    def f(h):
        for layer in layers[:k + 1]:
            h = layer(h)
        return h

    return f


def leak_layer_after(model, x):
    """Counts the prefix's length instead of its last layer's index."""
    for k in range(len(model.layers)):
        infl = ok.influence_matrix(_prefix(model.layers, k), x)
        if bool((infl.triu(1) > 1e-3 * infl.max()).any()):
            return k + 1
    return None


def leak_whole_model(model, x):
    """Measures only the model's final output, and blames the last layer."""
    infl = ok.influence_matrix(model, x)
    return len(model.layers) - 1 if bool((infl.triu(1) > 1e-3 * infl.max()).any()) else None


def leak_zero_threshold(model, x):
    """Any nonzero influence from the future counts, float noise included."""
    for k in range(len(model.layers)):
        if bool((ok.influence_matrix(_prefix(model.layers, k), x).triu(1) > 0).any()):
            return k
    return None


def leak_lower_triangle(model, x):
    """Looks below the diagonal: the past, which every mixing layer reads."""
    for k in range(len(model.layers)):
        infl = ok.influence_matrix(_prefix(model.layers, k), x)
        if bool((infl.tril(-1) > 1e-3 * infl.max()).any()):
            return k
    return None


# --------------------------------------------------------------------------- leaks_across_padding

def _refill(tokens, V, where):
    return torch.where(where, (tokens + torch.randint(1, V, tokens.shape)) % V, tokens)


def _real(tokens, lengths):
    L = tokens.shape[1]
    return torch.arange(L) >= L - lengths[:, None]  # (B, L)


def pad_all_positions(decoder, tokens, lengths):
    """Compares every position, the padded ones too (their own token changed)."""
    real = _real(tokens, lengths)
    base = decoder(tokens, lengths)
    out = decoder(_refill(tokens, decoder.vocab_size, ~real), lengths)
    return not torch.allclose(out, base, rtol=1e-4, atol=1e-5)


def pad_right_side(decoder, tokens, lengths):
    """Takes the padding to be on the right: refills positions >= lengths[b]."""
    pad = torch.arange(tokens.shape[1]) >= lengths[:, None]
    base = decoder(tokens, lengths)
    out = decoder(_refill(tokens, decoder.vocab_size, pad), lengths)
    return not torch.allclose(out[~pad], base[~pad], rtol=1e-4, atol=1e-5)


def pad_first_row(decoder, tokens, lengths):
    """Tests only the first sequence of the batch."""
    real = _real(tokens, lengths)
    base = decoder(tokens, lengths)
    out = decoder(_refill(tokens, decoder.vocab_size, ~real), lengths)
    return not torch.allclose(out[0][real[0]], base[0][real[0]], rtol=1e-4, atol=1e-5)


def pad_exact(decoder, tokens, lengths):
    """Demands bit-identical outputs at the real positions."""
    real = _real(tokens, lengths)
    base = decoder(tokens, lengths)
    out = decoder(_refill(tokens, decoder.vocab_size, ~real), lengths)
    return not torch.equal(out[real], base[real])
