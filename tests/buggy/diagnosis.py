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
    return torch.where(where, (tokens + torch.randint(1, V, tokens.shape, device=tokens.device)) % V, tokens)


def _real(tokens, lengths):
    L = tokens.shape[1]
    return torch.arange(L, device=tokens.device) >= L - lengths[:, None]  # (B, L)


def pad_all_positions(decoder, tokens, lengths):
    """Compares every position, the padded ones too (their own token changed)."""
    real = _real(tokens, lengths)
    base = decoder(tokens, lengths)
    out = decoder(_refill(tokens, decoder.vocab_size, ~real), lengths)
    return not torch.allclose(out, base, rtol=1e-4, atol=1e-5)


def pad_right_side(decoder, tokens, lengths):
    """Takes the padding to be on the right: refills positions >= lengths[b]."""
    pad = torch.arange(tokens.shape[1], device=tokens.device) >= lengths[:, None]
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


# --------------------------------------------------------------------------- shortcuts (issues 45, 46)
# find_leaking_layer: each is otherwise the reference's search.

def _search(model, x, leaks):
    for k in range(len(model.layers)):
        if leaks(ok.influence_matrix(_prefix(model.layers, k), x)):
            return k
    return None


def leak_each_layer_alone(model, x):
    """Measures each layer alone at x, not the prefix that reaches it."""
    for k, layer in enumerate(model.layers):
        infl = ok.influence_matrix(layer, x)
        if bool((infl.triu(1) > 1e-3 * infl.max()).any()):
            return k
    return None


def leak_each_layer_own_input(model, x):
    """Correct: each layer measured alone on what reaches it (as buggy.native does); the hidden
    models never make it disagree with the statement's prefixes (keeps full marks)."""
    h = x
    for k, layer in enumerate(model.layers):
        infl = ok.influence_matrix(layer, h)
        if bool((infl.triu(1) > 1e-3 * infl.max()).any()):
            return k
        h = layer(h).detach()
    return None


def leak_threshold_divided(model, x):
    """1e-3 / the largest entry instead of 1e-3 x the largest entry."""
    return _search(model, x, lambda i: bool((i.triu(1) > 1e-3 / i.max()).any()))


def leak_greater_or_equal(model, x):
    """>= instead of >: an all-zero influence matrix counts as a leak."""
    return _search(model, x, lambda i: bool((i.triu(1) >= 1e-3 * i.max()).any()))


def leak_two_positions(model, x):
    """Looks from the second diagonal above the main one: blind to a leak of the next position only."""
    return _search(model, x, lambda i: bool((i.triu(2) > 1e-3 * i.max()).any()))


def leak_absolute_threshold(model, x):
    """An absolute threshold of 1e-3: wrong for a model far from scale 1."""
    return _search(model, x, lambda i: bool((i.triu(1) > 1e-3).any()))


def leak_relative_to_mean(model, x):
    """Correct: the same test written as a ratio, guarding a zero matrix (keeps full marks)."""
    def leaks(i):
        top = i.max()
        return bool(top > 0) and bool((i.triu(1) / top).max() > 1e-3)

    return _search(model, x, leaks)


# leaks_across_padding: each is otherwise the reference's test.

def _test(decoder, tokens, lengths, refill, compare, trials=3):
    real = _real(tokens, lengths)
    base = decoder(tokens, lengths)
    for _ in range(trials):
        out = decoder(torch.where(real, tokens, refill(tokens)), lengths)
        if not compare(out, base, real):
            return True
    return False


def _random_refill(V):
    # its own generator: the same draws in every grading, so a mutant near its tolerance is judged
    # alike by the reference's checks and the recorded ones
    gen = torch.Generator().manual_seed(V)
    return lambda t: (t + torch.randint(1, V, t.shape, generator=gen, device=t.device)) % V


def pad_tolerance_one(decoder, tokens, lengths):
    """atol 1 instead of 1e-5."""
    return _test(decoder, tokens, lengths, _random_refill(decoder.vocab_size),
                 lambda o, b, r: torch.allclose(o[r], b[r], rtol=1e-4, atol=1.0))


def pad_no_relative_tolerance(decoder, tokens, lengths):
    """atol only: float noise of large outputs is taken for a leak."""
    return _test(decoder, tokens, lengths, _random_refill(decoder.vocab_size),
                 lambda o, b, r: torch.allclose(o[r], b[r], rtol=0.0, atol=1e-5))


def pad_plus_one(decoder, tokens, lengths):
    """One fixed refilling, (id + 1) % V."""
    V = decoder.vocab_size
    return _test(decoder, tokens, lengths, lambda t: (t + 1) % V,
                 lambda o, b, r: torch.allclose(o[r], b[r], rtol=1e-4, atol=1e-5), trials=1)


def pad_mirror_id(decoder, tokens, lengths):
    """Refills with V - 1 - id: the middle id of an odd V stays as it was."""
    V = decoder.vocab_size
    return _test(decoder, tokens, lengths, lambda t: V - 1 - t,
                 lambda o, b, r: torch.allclose(o[r], b[r], rtol=1e-4, atol=1e-5), trials=1)


def pad_token_zero(decoder, tokens, lengths):
    """Refills the padding with token 0: no change where the padding already holds 0."""
    return _test(decoder, tokens, lengths, torch.zeros_like,
                 lambda o, b, r: torch.allclose(o[r], b[r], rtol=1e-4, atol=1e-5), trials=1)


def pad_last_position(decoder, tokens, lengths):
    """Compares the last position of each row only."""
    return _test(decoder, tokens, lengths, _random_refill(decoder.vocab_size),
                 lambda o, b, r: torch.allclose(o[:, -1], b[:, -1], rtol=1e-4, atol=1e-5))


def pad_next_to_real_only(decoder, tokens, lengths):
    """Refills only the padding position next to the real tokens."""
    L, V = tokens.shape[1], decoder.vocab_size
    real = _real(tokens, lengths)
    nearest = torch.arange(L, device=tokens.device) == (L - lengths - 1)[:, None]  # (B, L)
    base = decoder(tokens, lengths)
    for _ in range(3):
        shift = torch.randint(1, V, tokens.shape, device=tokens.device)
        out = decoder(torch.where(nearest, (tokens + shift) % V, tokens), lengths)
        if not torch.allclose(out[real], base[real], rtol=1e-4, atol=1e-5):
            return True
    return False


def pad_default_device(decoder, tokens, lengths):
    """Builds its refilling on the default device, not tokens.device."""
    L, V = tokens.shape[1], decoder.vocab_size
    real = torch.arange(L, device=tokens.device) >= L - lengths[:, None]
    base = decoder(tokens, lengths)
    for _ in range(3):
        shift = torch.randint(1, V, tokens.shape, device=tokens.device)
        out = decoder(torch.where(real, tokens, (tokens + shift) % V), lengths)
        if not torch.allclose(out[real], base[real], rtol=1e-4, atol=1e-5):
            return True
    return False


def pad_one_refill_per_trial_kind(decoder, tokens, lengths):
    """Correct: one shift per trial for the whole batch (1, 2, ...), every padding token changed
    (keeps full marks)."""
    V = decoder.vocab_size
    real = _real(tokens, lengths)
    base = decoder(tokens, lengths)
    for shift in range(1, min(V, 6)):
        out = decoder(torch.where(real, tokens, (tokens + shift) % V), lengths)
        if not torch.allclose(out[real], base[real], rtol=1e-4, atol=1e-5):
            return True
    return False
