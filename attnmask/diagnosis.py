"""Finding mask bugs from outside: which layer leaks the future, and does padding leak?

Two instruments, each built on a measurement the chapters teach:

* :func:`find_leaking_layer` reads :func:`attnmask.influence_matrix` of each prefix
  of a :class:`LayerStack` (chapter 1): the first prefix whose output depends on a
  later position ends at the leaking layer.
* :func:`leaks_across_padding` changes the padding tokens of a left-padded batch
  and watches the real positions' outputs of a :class:`PaddedDecoder` (chapter 4).

The models are small and made of plain tensors so that the grader's trusted
builders (:mod:`grader.fnspecs`) can mirror them exactly without importing this
package into the sandbox.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from .influence import influence_matrix

__all__ = [
    "LEAK_TOL",
    "PAD_ATOL",
    "PAD_RTOL",
    "LayerStack",
    "PaddedDecoder",
    "find_leaking_layer",
    "leaks_across_padding",
    "random_decoder",
    "random_stack",
    "stack_layer",
]

#: A map leaks when some entry above the diagonal of its influence matrix exceeds
#: ``LEAK_TOL`` times the matrix's largest entry. Float noise (an FFT convolution's
#: is about 1e-7 of the largest entry in float32) stays far below; a real leak far above.
LEAK_TOL = 1e-3
#: Padding leaks when a real position's output moves by more than ``torch.allclose``
#: with these tolerances allows.
PAD_RTOL, PAD_ATOL = 1e-4, 1e-5

Layer = Callable[[torch.Tensor], torch.Tensor]


# --------------------------------------------------------------------------- layer stacks

class LayerStack:
    """A sequence model ``(L, D) -> (L, D)`` made of ``layers`` applied in order.

    ``model.layers`` is a list of callables, each ``(L, D) -> (L, D)``; ``model(x)``
    is ``layers[-1](...layers[0](x))``. Any prefix ``layers[:k + 1]`` is itself a map
    ``(L, D) -> (L, D)``, which is what :func:`find_leaking_layer` measures.
    """

    def __init__(self, layers: Sequence[Layer]):
        self.layers = list(layers)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x

    def __len__(self) -> int:
        return len(self.layers)


def _attention(w_q, w_k, w_v, w_o, causal: bool, extra: int = -1) -> Layer:
    def layer(x: torch.Tensor) -> torch.Tensor:  # (L, D) -> (L, D), residual
        q, k, v = x @ w_q.to(x), x @ w_k.to(x), x @ w_v.to(x)  # (L, D) each
        s = q @ k.T / math.sqrt(x.shape[-1])  # (L, L)
        if causal:
            keep = torch.ones(s.shape, dtype=torch.bool, device=x.device).tril()
            if 0 <= extra < s.shape[0] - 1:  # query `extra` also sees key `extra + 1`: a one-position leak
                keep[extra, extra + 1] = True
            s = s.masked_fill(~keep, float("-inf"))
        return x + torch.softmax(s, dim=-1) @ v @ w_o.to(x)

    return layer


def _conv(filt, causal: bool) -> Layer:
    """A long convolution computed with the FFT, as in H3 and Hyena. Zero-padding to 2L makes
    it causal (up to float noise); without it the convolution is circular and the last
    positions wrap around into the first ones."""

    def layer(x: torch.Tensor) -> torch.Tensor:  # (L, D) -> (L, D), residual
        L = x.shape[0]
        n = 2 * L if causal else L
        h = filt[:L].to(x)  # (L, D): one filter per channel
        y = torch.fft.irfft(torch.fft.rfft(x, n=n, dim=0) * torch.fft.rfft(h, n=n, dim=0), n=n, dim=0)
        return x + y[:L]

    return layer


def _mlp(w_1, w_2) -> Layer:
    def layer(x: torch.Tensor) -> torch.Tensor:  # position by position
        return x + torch.tanh(x @ w_1.to(x)) @ w_2.to(x)

    return layer


def _gated(a, g, u, theta: float) -> Layer:
    """``x + (A @ relu(x g - theta)) u``: A mixes every position, the future too, but only through
    positions whose gate ``x[j] . g`` exceeds ``theta``; a closed gate has exactly zero influence,
    so whether this layer leaks depends on what reaches it."""

    def layer(x: torch.Tensor) -> torch.Tensor:  # (L, D) -> (L, D), residual
        L = x.shape[0]
        gate = torch.relu(x @ g.to(x) - theta)  # (L,)
        return x + (a[:L, :L].to(x) @ gate)[:, None] * u.to(x)

    return layer


def stack_layer(kind: str, params: dict, causal: bool = True) -> Layer:
    """One layer of a :class:`LayerStack`: ``kind`` "attention" (params ``w_q, w_k, w_v, w_o``
    (D, D), optional ``extra``: a query that also sees the next key), "conv" (``filt`` (L_max, D)),
    "mlp" (``w_1, w_2`` (D, D)), "scale" (``c``: x times c), "const" (``bias`` (L_max, D): ignores
    its input) or "gated" (``a`` (L_max, L_max), ``g``, ``u`` (D,), ``theta``); ``causal=False``
    removes the attention's mask or the convolution's zero-padding (the bug)."""
    if kind == "attention":
        return _attention(params["w_q"], params["w_k"], params["w_v"], params["w_o"], causal,
                          int(params.get("extra", -1)))
    if kind == "conv":
        return _conv(params["filt"], causal)
    if kind == "mlp":
        return _mlp(params["w_1"], params["w_2"])
    if kind == "scale":
        return lambda x: x * float(params["c"])
    if kind == "const":
        return lambda x: x * 0 + params["bias"][:x.shape[0]].to(x)
    if kind == "gated":
        return _gated(params["a"], params["g"], params["u"], float(params["theta"]))
    raise ValueError(f"unknown layer kind {kind!r}; expected 'attention', 'conv', 'mlp', 'scale', 'const' "
                     "or 'gated'")


def leaks(influence: torch.Tensor, tol: float = LEAK_TOL) -> bool:
    """Whether an ``(L, L)`` influence matrix has an entry above the diagonal (a later
    position j > i reaching output i) larger than ``tol`` times its largest entry."""
    top = influence.max()
    return bool((influence.triu(1) > tol * top).any()) if bool(top > 0) else False


def find_leaking_layer(model: LayerStack, x: torch.Tensor) -> int | None:
    """The index of the first layer at which the model's output starts to depend on a
    later position, or None if it never does.

    Args:
        model: has ``model.layers``, a list of callables ``(L, D) -> (L, D)`` applied in order.
        x: ``(L, D)`` float, the input at which the influence is measured.

    Returns:
        The smallest ``k`` such that ``layers[:k + 1]`` applied to ``x`` leaks: some entry
        ``[i, j]`` with ``j > i`` of its :func:`influence_matrix` exceeds ``LEAK_TOL`` (1e-3)
        times the matrix's largest entry; None when no prefix leaks.
    """
    layers = list(model.layers)
    for k in range(len(layers)):
        prefix = LayerStack(layers[:k + 1])
        if leaks(influence_matrix(prefix, x)):
            return k
    return None


# --------------------------------------------------------------------------- padded decoders

#: How each attention layer of a :class:`PaddedDecoder` masks, by name.
MASK_STYLES = ("correct", "finfo_min", "max_over_all", "no_padding", "after_softmax", "wrong_sign",
               "wrong_side", "sink", "window", "soft")
#: The styles under which real positions never depend on the padding tokens.
SAFE_STYLES = ("correct", "finfo_min", "max_over_all")


def left_real(lengths: torch.Tensor, L: int) -> torch.Tensor:
    """bool (B, L): True at the real tokens of a left-padded batch (the last lengths[b])."""
    return torch.arange(L, device=lengths.device) >= L - lengths[:, None]


def _weights(s: torch.Tensor, lengths: torch.Tensor, style: str) -> torch.Tensor:
    """Attention weights (B, L, L) from scores (B, L, L), masked the way ``style`` says."""
    B, L, _ = s.shape
    causal = torch.ones(L, L, dtype=torch.bool, device=s.device).tril()  # (L, L)
    real = left_real(lengths, L)[:, None, :]  # (B, 1, L): real keys
    keep = causal & real  # (B, L, L)
    if style == "correct":  # boolean, -inf, an empty row gets zero weights
        w = torch.softmax(s.masked_fill(~keep, float("-inf")), dim=-1)
        return torch.nan_to_num(w, nan=0.0)
    if style == "finfo_min":  # an additive mask of the dtype's lowest value
        return torch.softmax(s.masked_fill(~keep, torch.finfo(s.dtype).min), dim=-1)
    if style == "max_over_all":  # subtracts the max over every key, padding included, then masks
        e = torch.exp(s - s.amax(dim=-1, keepdim=True)) * keep
        total = e.sum(dim=-1, keepdim=True)
        return e / torch.where(total > 0, total, torch.ones_like(total))
    if style == "no_padding":
        return torch.softmax(s.masked_fill(~causal, float("-inf")), dim=-1)
    if style == "after_softmax":
        return torch.softmax(s.masked_fill(~causal, float("-inf")), dim=-1) * keep
    if style == "wrong_sign":  # the padding bias added with the wrong sign
        s = s.masked_fill(~causal, float("-inf")) + 1e4 * (~real).to(s.dtype)
        return torch.softmax(s, dim=-1)
    if style == "sink":  # position 0 kept as an attention sink, though left padding puts a pad there
        pos = torch.arange(L, device=s.device)
        w = torch.softmax(s.masked_fill(~(causal & (real | (pos == 0))), float("-inf")), dim=-1)
        return torch.nan_to_num(w, nan=0.0)
    if style == "window":  # a window of 2 keys, no padding mask: only the first real token sees a pad
        pos = torch.arange(L, device=s.device)
        near = (pos[:, None] - pos[None, :]) < 2
        return torch.softmax(s.masked_fill(~(causal & near), float("-inf")), dim=-1)
    if style == "soft":  # a finite padding bias: the pads keep a weight of about exp(-8)
        return torch.softmax(s.masked_fill(~causal, float("-inf")) - 8.0 * (~real).to(s.dtype), dim=-1)
    if style == "wrong_side":  # a right-padding mask on a left-padded batch
        right = torch.arange(L, device=s.device) < lengths[:, None]  # (B, L)
        w = torch.softmax(s.masked_fill(~(causal & right[:, None, :]), float("-inf")), dim=-1)
        return torch.nan_to_num(w, nan=0.0)
    raise ValueError(f"unknown mask style {style!r}; expected one of {MASK_STYLES}")


class PaddedDecoder:
    """A tiny causal decoder over left-padded batches: ``decoder(tokens, lengths) -> (B, L, V)``.

    ``tokens`` long ``(B, L)``; row b's real tokens are its last ``lengths[b]``, the
    positions before them are padding (any token ids). ``decoder.vocab_size`` is V.
    Each attention layer masks in the way its entry of ``styles`` says
    (:data:`MASK_STYLES`); with every style in :data:`SAFE_STYLES` the outputs at real
    positions do not depend on the padding tokens beyond ``jitter``: a relative change of at
    most ``jitter`` that depends on the pads (float noise of a known size, on any CPU).
    """

    def __init__(self, emb: torch.Tensor, pos: torch.Tensor, layers: Sequence[dict], head: torch.Tensor,
                 styles: Sequence[str], jitter: float = 0.0):
        if len(layers) != len(styles):
            raise ValueError(f"{len(layers)} layers but {len(styles)} mask styles")
        self.emb, self.pos, self.layers, self.head = emb, pos, list(layers), head
        self.styles, self.jitter = list(styles), float(jitter)
        self.vocab_size = int(emb.shape[0])

    def __call__(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        L = tokens.shape[1]
        x = self.emb[tokens] + self.pos[:L]  # (B, L, D)
        for p, style in zip(self.layers, self.styles):
            s = (x @ p["w_q"]) @ (x @ p["w_k"]).transpose(-2, -1) / math.sqrt(x.shape[-1])  # (B, L, L)
            x = x + _weights(s, lengths, style) @ (x @ p["w_v"])
            x = x + torch.tanh(x @ p["w_1"]) @ p["w_2"]
        out = x @ self.head  # (B, L, V)
        if self.jitter:
            pads = (~left_real(lengths, L)).to(out)  # (B, L)
            pad_sum = (self.emb[tokens].sum(-1) * pads).sum(-1)  # (B,)
            out = out * (1 + self.jitter * torch.tanh(pad_sum))[:, None, None]
        return out


def leaks_across_padding(decoder: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                         tokens: torch.Tensor, lengths: torch.Tensor, trials: int = 3) -> bool:
    """Whether the outputs of ``decoder`` at real positions depend on the padding tokens.

    Args:
        decoder: ``decoder(tokens, lengths) -> (B, L, V)`` float, with ``decoder.vocab_size``.
        tokens: long ``(B, L)``, left-padded: row b's real tokens are its last ``lengths[b]``.
        lengths: long ``(B,)``, ``0 <= lengths[b] <= L``.
        trials: how many random refillings of the padding to try.

    Returns:
        True when, for some refilling of the padding positions with other token ids (each
        padding token changed), an
        output at a real position is not ``torch.allclose`` (rtol 1e-4, atol 1e-5) to the
        original; False otherwise.
    """
    L = tokens.shape[1]
    real = left_real(lengths, L)  # (B, L)
    base = decoder(tokens, lengths)  # (B, L, V)
    rng = torch.Generator().manual_seed(0)
    V = int(decoder.vocab_size)
    for _ in range(trials):
        shift = torch.randint(1, V, tokens.shape, generator=rng).to(tokens.device)
        refilled = torch.where(real, tokens, (tokens + shift) % V)  # every padding token changes
        out = decoder(refilled, lengths)
        if not torch.allclose(out[real], base[real], rtol=PAD_RTOL, atol=PAD_ATOL):
            return True
    return False


# --------------------------------------------------------------------------- random instances

def random_stack(kinds: Sequence[str], leak_at: int | None = None, *, L: int = 8, D: int = 8,
                 seed: int = 0) -> LayerStack:
    """A :class:`LayerStack` of ``kinds`` with random weights; layer ``leak_at`` (attention or
    conv) loses its causality."""
    gen = torch.Generator().manual_seed(seed)
    w = lambda: torch.randn(D, D, generator=gen) * 0.8 / math.sqrt(D)  # noqa: E731
    layers = []
    for k, kind in enumerate(kinds):
        params = {"w_q": w(), "w_k": w(), "w_v": w(), "w_o": w(), "w_1": w(), "w_2": w(),
                  "filt": torch.randn(L, D, generator=gen) * 0.4}
        layers.append(stack_layer(kind, params, causal=k != leak_at))
    return LayerStack(layers)


def random_decoder(styles: Sequence[str], *, V: int = 10, D: int = 8, max_len: int = 32,
                   seed: int = 0) -> PaddedDecoder:
    """A :class:`PaddedDecoder` with random weights, one attention layer per entry of ``styles``."""
    gen = torch.Generator().manual_seed(seed)
    w = lambda: torch.randn(D, D, generator=gen) / math.sqrt(D)  # noqa: E731
    layers = [{"w_q": w(), "w_k": w(), "w_v": w(), "w_1": w(), "w_2": w()} for _ in styles]
    return PaddedDecoder(torch.randn(V, D, generator=gen), torch.randn(max_len, D, generator=gen) * 0.5,
                         layers, torch.randn(D, V, generator=gen) / math.sqrt(D), styles)
