"""influence_matrix against a closed form, torch.func.jacrev and finite
differences, and the property the book uses it for: a causal layer has an
exactly zero upper triangle."""

from __future__ import annotations

import pytest
import torch
from torch.func import jacrev

import attnmask as am

L, D_IN, D_OUT = 6, 3, 4


def test_linear_mixing_has_a_closed_form():
    # f(x) = A @ x @ W: d f[i] / d x[j] = A[i, j] * W^T, whose Frobenius norm is |A[i, j]| * ||W||_F.
    g = torch.Generator().manual_seed(0)
    A = torch.randn(L, L, generator=g, dtype=torch.float64)
    W = torch.randn(D_IN, D_OUT, generator=g, dtype=torch.float64)
    x = torch.randn(L, D_IN, generator=g, dtype=torch.float64)
    got = am.influence_matrix(lambda t: A @ t @ W, x)
    assert got.shape == (L, L) and got.dtype == torch.float64
    torch.testing.assert_close(got, A.abs() * torch.linalg.norm(W))


def nonlinear(t):
    """A non-linear sequence map (L, d) -> (L, d'), mixing positions through attention."""
    W = torch.linspace(-1, 1, D_IN * D_OUT, dtype=t.dtype).view(D_IN, D_OUT)
    out, _ = am.attention(t, t, torch.tanh(t) @ W, am.sliding_window_mask(t.shape[0], 3))
    return out * t.sum(-1, keepdim=True)


def test_matches_jacrev_and_finite_differences():
    x = torch.randn(L, D_IN, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    got = am.influence_matrix(nonlinear, x)
    jac = jacrev(nonlinear)(x)  # (L, d', L, d)
    torch.testing.assert_close(got, jac.pow(2).sum(dim=(1, 3)).sqrt())
    eps, fd = 1e-6, torch.zeros(L, D_OUT, L, D_IN, dtype=torch.float64)
    for j in range(L):
        for c in range(D_IN):
            dx = torch.zeros_like(x)
            dx[j, c] = eps
            fd[:, :, j, c] = (nonlinear(x + dx) - nonlinear(x - dx)) / (2 * eps)
    torch.testing.assert_close(got, fd.pow(2).sum(dim=(1, 3)).sqrt(), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("mask_fn, zero_above", [
    (lambda n: am.causal_mask(n), True),
    (lambda n: am.sliding_window_mask(n, 2), True),
    (lambda n: None, False),
])
def test_the_future_reaches_the_past_only_without_a_causal_mask(mask_fn, zero_above):
    x = torch.randn(L, D_IN, generator=torch.Generator().manual_seed(2))
    got = am.influence_matrix(lambda t: am.attention(t, t, t, mask_fn(t.shape[0]))[0], x)
    above = torch.ones(L, L, dtype=torch.bool).triu(1)
    if zero_above:
        assert (got[above] == 0).all(), "a causal layer must have an exactly zero upper triangle"
    else:
        assert (got[above] > 0).all()
    assert (got.diagonal() > 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_low_precision(dtype, device):
    x = torch.randn(L, D_IN, generator=torch.Generator().manual_seed(3)).to(dtype=dtype, device=device)
    got = am.influence_matrix(lambda t: 2 * t.sin(), x)
    assert got.shape == (L, L) and got.device == x.device and torch.isfinite(got).all()
    expected = torch.diag(2 * x.double().cos().norm(dim=-1)).cpu()
    torch.testing.assert_close(got.double().cpu(), expected, atol=2e-2, rtol=2e-2)


def test_input_is_not_modified():
    x = torch.randn(L, D_IN, requires_grad=True)
    x.grad = torch.ones_like(x)
    before = x.detach().clone()
    am.influence_matrix(lambda t: t.cumsum(0), x)
    assert torch.equal(x.detach(), before) and torch.equal(x.grad, torch.ones_like(x)) and x.requires_grad
    plain = torch.randn(L, D_IN)
    am.influence_matrix(lambda t: t * 2, plain)
    assert not plain.requires_grad and plain.grad is None


@pytest.mark.parametrize("x, words", [
    (torch.randn(L), ["(L, d)", f"[{L}]"]),
    (torch.ones(L, D_IN, dtype=torch.long), ["float", "(L, d)"]),
])
def test_errors_are_clear(x, words):
    with pytest.raises(ValueError) as info:
        am.influence_matrix(lambda t: t, x)
    for word in words:
        assert word in str(info.value), f"{word!r} missing from: {info.value}"


def test_rejects_a_map_that_does_not_keep_positions():
    with pytest.raises(ValueError, match="Jacobian"):
        am.influence_matrix(lambda t: t.sum(0), torch.randn(L, D_IN))
