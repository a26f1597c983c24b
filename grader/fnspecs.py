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
  its influence is zero off the diagonal.
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


KINDS: dict[str, Callable[..., Callable[[torch.Tensor], torch.Tensor]]] = {
    "attention": lambda p: _attention(p["w_q"], p["w_k"], p["w_v"], bool(p.get("causal", True))),
    "mix": lambda p: _mix(p["a"], p["w"]),
    "elementwise": lambda p: _elementwise(float(p.get("scale", 1.0))),
}


def build(spec: FnSpec, device: str | torch.device = "cpu") -> Callable[[torch.Tensor], torch.Tensor]:
    """The callable described by ``spec``, with its tensors on ``device``."""
    if spec.kind not in KINDS:
        raise ValueError(f"unknown function kind {spec.kind!r}; expected one of {sorted(KINDS)}")
    params = {k: v.detach().clone().to(device) if isinstance(v, torch.Tensor) else v
              for k, v in spec.params.items()}
    return KINDS[spec.kind](params)
