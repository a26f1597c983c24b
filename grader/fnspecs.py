"""Trusted builders of function arguments (the ``f`` given to ``influence_matrix``).

A :class:`~grader.spec.FnSpec` crosses the sandbox boundary as data (a kind and
its tensors); :func:`build` turns it back into a callable on the worker's side.
Everything here is plain torch so the worker needs nothing else, and every map
casts its parameters to the input's dtype and device, so ``f`` works for any
float ``x`` (L, d) the student differentiates.

Kinds:

* ``"attention"``: one single-head self-attention layer,
  ``softmax(mask(x Wq^T (x Wk^T)^T / sqrt(d))) x Wv^T``, causal or not
  (params ``w_q``, ``w_k``, ``w_v`` (d, d), ``causal``);
* ``"mix"``: a linear token-mixing map ``A x W`` (params ``a`` (L, L), ``w`` (d, d'));
  its influence is ``|A[i, j]| * ||W||_F``;
* ``"elementwise"``: ``tanh(scale * x) * x``, position by position (params ``scale``);
  its influence is zero off the diagonal;
* ``"layer_stack"``: the ``model`` of ``find_leaking_layer``, an object whose ``layers`` are
  callables (L, D) -> (L, D) applied in order (params ``layers``: a list of dicts with
  ``kind`` "attention" / "conv" / "mlp" / "scale" / "const" / "gated", ``causal`` and the
  layer's tensors). Every layer carries ``causal = True`` as an attribute, true or not: what a
  layer says about itself is no evidence, only its measured influence is;
* ``"padded_decoder"``: the ``decoder`` of ``leaks_across_padding``,
  ``decoder(tokens (B, L), lengths (B,)) -> (B, L, V)`` over left-padded batches, with
  ``vocab_size`` (params ``emb``, ``pos``, ``head``, ``layers``, one mask ``styles`` entry per
  layer and an optional ``jitter``).

The last two mirror :mod:`attnmask.diagnosis` line for line: the worker must not import the
course's package (it holds the references), so the grader keeps its own copy.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from .spec import FnSpec

__all__ = ["KINDS", "build"]


def _attention(w_q, w_k, w_v, causal) -> Callable[[torch.Tensor], torch.Tensor]:
    def f(x: torch.Tensor) -> torch.Tensor:  # (L, d) -> (L, d)
        q = x @ w_q.to(x).T
        k = x @ w_k.to(x).T
        v = x @ w_v.to(x).T
        scores = (q @ k.T) / math.sqrt(x.shape[-1])  # (L, L)
        if causal:
            L = x.shape[0]
            keep = torch.ones(L, L, dtype=torch.bool, device=x.device).tril()
            scores = scores.masked_fill(~keep, float("-inf"))
        return torch.softmax(scores, dim=-1) @ v

    return f


def _mix(a, w) -> Callable[[torch.Tensor], torch.Tensor]:
    def f(x: torch.Tensor) -> torch.Tensor:  # (L, d) -> (L, d')
        return a.to(x) @ x @ w.to(x)

    return f


def _elementwise(scale) -> Callable[[torch.Tensor], torch.Tensor]:
    def f(x: torch.Tensor) -> torch.Tensor:  # (L, d) -> (L, d)
        return torch.tanh(scale * x) * x

    return f


def _stack_attention(p, causal: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    extra = int(p.get("extra", -1))  # >= 0: query `extra` also sees key `extra + 1` (a one-position leak)

    def layer(x: torch.Tensor) -> torch.Tensor:  # (L, D) -> (L, D), residual
        q, k, v = x @ p["w_q"].to(x), x @ p["w_k"].to(x), x @ p["w_v"].to(x)
        s = q @ k.T / math.sqrt(x.shape[-1])  # (L, L)
        if causal:
            keep = torch.ones(s.shape, dtype=torch.bool, device=x.device).tril()
            if 0 <= extra < s.shape[0] - 1:
                keep[extra, extra + 1] = True
            s = s.masked_fill(~keep, float("-inf"))
        return x + torch.softmax(s, dim=-1) @ v @ p["w_o"].to(x)

    return layer


def _stack_conv(p, causal: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    def layer(x: torch.Tensor) -> torch.Tensor:  # (L, D) -> (L, D): FFT long convolution, residual
        L = x.shape[0]
        n = 2 * L if causal else L  # without the zero-padding the convolution wraps around
        h = p["filt"][:L].to(x)
        y = torch.fft.irfft(torch.fft.rfft(x, n=n, dim=0) * torch.fft.rfft(h, n=n, dim=0), n=n, dim=0)
        return x + y[:L]

    return layer


def _stack_mlp(p) -> Callable[[torch.Tensor], torch.Tensor]:
    def layer(x: torch.Tensor) -> torch.Tensor:  # position by position
        return x + torch.tanh(x @ p["w_1"].to(x)) @ p["w_2"].to(x)

    return layer


def _stack_scale(p) -> Callable[[torch.Tensor], torch.Tensor]:
    def layer(x: torch.Tensor) -> torch.Tensor:  # position by position: the model's scale
        return x * float(p["c"])

    return layer


def _stack_const(p) -> Callable[[torch.Tensor], torch.Tensor]:
    def layer(x: torch.Tensor) -> torch.Tensor:  # ignores its input: every influence is 0
        return x * 0 + p["bias"][:x.shape[0]].to(x)

    return layer


def _stack_gated(p) -> Callable[[torch.Tensor], torch.Tensor]:
    """x + (A @ relu(x g - theta)) u: A mixes every position, the future too, but only through
    positions whose gate x[j] . g exceeds theta; a closed gate has exactly zero influence, so
    whether this layer leaks depends on what reaches it."""

    def layer(x: torch.Tensor) -> torch.Tensor:  # (L, D) -> (L, D), residual
        L = x.shape[0]
        gate = torch.relu(x @ p["g"].to(x) - float(p["theta"]))  # (L,)
        return x + (p["a"][:L, :L].to(x) @ gate)[:, None] * p["u"].to(x)

    return layer


class _Stack:
    """``layers``: callables (L, D) -> (L, D); calling the stack applies them in order."""

    def __init__(self, layers):
        self.layers = list(layers)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x

    def __len__(self) -> int:
        return len(self.layers)


def _layer_stack(layers) -> _Stack:
    built = []
    for p in layers:
        causal = bool(p.get("causal", True))
        kind = p["kind"]
        layer = (_stack_attention(p, causal) if kind == "attention" else
                 _stack_conv(p, causal) if kind == "conv" else
                 _stack_scale(p) if kind == "scale" else
                 _stack_const(p) if kind == "const" else
                 _stack_gated(p) if kind == "gated" else _stack_mlp(p))
        layer.causal = True  # said of every layer, leaking or not
        built.append(layer)
    return _Stack(built)


def _decoder_weights(s: torch.Tensor, lengths: torch.Tensor, style: str) -> torch.Tensor:
    """Attention weights (B, L, L) from scores (B, L, L) of a left-padded batch, masked by ``style``."""
    L = s.shape[-1]
    pos = torch.arange(L, device=s.device)
    causal = torch.ones(L, L, dtype=torch.bool, device=s.device).tril()  # (L, L)
    real = (pos >= L - lengths[:, None])[:, None, :]  # (B, 1, L): real keys
    keep = causal & real
    if style == "correct":
        return torch.nan_to_num(torch.softmax(s.masked_fill(~keep, float("-inf")), dim=-1), nan=0.0)
    if style == "finfo_min":
        return torch.softmax(s.masked_fill(~keep, torch.finfo(s.dtype).min), dim=-1)
    if style == "max_over_all":
        e = torch.exp(s - s.amax(dim=-1, keepdim=True)) * keep
        total = e.sum(dim=-1, keepdim=True)
        return e / torch.where(total > 0, total, torch.ones_like(total))
    if style == "no_padding":
        return torch.softmax(s.masked_fill(~causal, float("-inf")), dim=-1)
    if style == "after_softmax":
        return torch.softmax(s.masked_fill(~causal, float("-inf")), dim=-1) * keep
    if style == "wrong_sign":
        return torch.softmax(s.masked_fill(~causal, float("-inf")) + 1e4 * (~real).to(s.dtype), dim=-1)
    if style == "sink":  # position 0 kept as an attention sink, though left padding puts a pad there
        keep = causal & (real | (pos == 0))
        return torch.nan_to_num(torch.softmax(s.masked_fill(~keep, float("-inf")), dim=-1), nan=0.0)
    if style == "window":  # a window of 2 keys, no padding mask: only the first real token sees a pad
        near = (pos[:, None] - pos[None, :]) < 2
        return torch.softmax(s.masked_fill(~(causal & near), float("-inf")), dim=-1)
    if style == "soft":  # a finite padding bias: the pads keep a weight of about exp(-8)
        return torch.softmax(s.masked_fill(~causal, float("-inf")) - 8.0 * (~real).to(s.dtype), dim=-1)
    right = (pos < lengths[:, None])[:, None, :]  # "wrong_side": a right-padding mask
    return torch.nan_to_num(torch.softmax(s.masked_fill(~(causal & right), float("-inf")), dim=-1), nan=0.0)


class _PaddedDecoder:
    """``decoder(tokens (B, L), lengths (B,)) -> (B, L, V)`` over a left-padded batch."""

    def __init__(self, p):
        self._p = p
        self.vocab_size = int(p["emb"].shape[0])

    def __call__(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        p = self._p
        L = tokens.shape[1]
        x = p["emb"].to(tokens.device)[tokens] + p["pos"][:L].to(tokens.device)  # (B, L, D)
        for w, style in zip(p["layers"], p["styles"]):
            s = (x @ w["w_q"].to(x)) @ (x @ w["w_k"].to(x)).transpose(-2, -1) / math.sqrt(x.shape[-1])
            x = x + _decoder_weights(s, lengths.to(tokens.device), style) @ (x @ w["w_v"].to(x))
            x = x + torch.tanh(x @ w["w_1"].to(x)) @ w["w_2"].to(x)
        out = x @ p["head"].to(x)  # (B, L, V)
        jitter = float(p.get("jitter", 0.0))
        if jitter:  # a relative change of at most `jitter` that depends on the pads: float noise, made sure
            pads = (torch.arange(L, device=tokens.device) < L - lengths.to(tokens.device)[:, None]).to(out)
            pad_sum = (p["emb"].to(out)[tokens].sum(-1) * pads).sum(-1)  # (B,)
            out = out * (1 + jitter * torch.tanh(pad_sum))[:, None, None]
        return out


KINDS: dict[str, Callable[..., Callable[..., torch.Tensor]]] = {
    "attention": lambda p: _attention(p["w_q"], p["w_k"], p["w_v"], bool(p.get("causal", True))),
    "mix": lambda p: _mix(p["a"], p["w"]),
    "elementwise": lambda p: _elementwise(float(p.get("scale", 1.0))),
    "layer_stack": lambda p: _layer_stack(p["layers"]),
    "padded_decoder": lambda p: _PaddedDecoder(p),
}


def _moved(v, device):
    if isinstance(v, torch.Tensor):
        return v.detach().clone().to(device)
    if isinstance(v, list | tuple):
        return type(v)(_moved(x, device) for x in v)
    if isinstance(v, dict):
        return {k: _moved(x, device) for k, x in v.items()}
    return v


def build(spec: FnSpec, device: str | torch.device = "cpu") -> Callable[[torch.Tensor], torch.Tensor]:
    """The callable described by ``spec``, with its tensors on ``device``."""
    if spec.kind not in KINDS:
        raise ValueError(f"unknown function kind {spec.kind!r}; expected one of {sorted(KINDS)}")
    params = {k: _moved(v, device) for k, v in spec.params.items()}
    return KINDS[spec.kind](params)
