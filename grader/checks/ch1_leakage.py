"""Chapter 1, leakage: ``causal_mask`` and ``influence_matrix``."""

from __future__ import annotations

import torch

import attnmask as am

from .. import cases
from .. import diagnose as dg
from ..mistakes import MISTAKES
from ..spec import Call, Check, FnSpec, exercise
from . import judges as J
from . import properties as P

M = MISTAKES


# --------------------------------------------------------------------------- causal_mask

def square(args: tuple, kwargs: dict) -> tuple[int, int]:
    """Contract shape (n, n) of a builder whose first argument is n."""
    return (args[0], args[0])


def diagnose_causal(args, kwargs, got, index, dtype) -> str | None:
    ref = am.causal_mask(args[0])
    eye = torch.eye(args[0], dtype=torch.bool)
    return dg.name_mistake(got, [
        (M["diagonal_excluded"], lambda: ref & ~eye),  # before "inverted": the same for n = 1
        (M["inverted"], lambda: ~ref),
        (M["wrong_triangle"], lambda: ref.T),
        (M["no_mask"], lambda: torch.ones_like(ref)),
    ], dtype)


CAUSAL = J.Recipe("causal_mask", am.causal_mask, ("n",),
                  (J.Out("mask", "mask", "(n, n)", square),), diagnose_causal)


@exercise(1.0, "causal_mask(n, *, device=None): bool (n, n), True where key j <= query i.")
def causal_mask_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    public = [("matches reference (n=4)", (4,)), ("a single token sees itself (n=1)", (1,))]
    # the second public case is degenerate (edge): any mask with a True passes it
    return P.int_mask_checks(CAUSAL, seed, hidden, public, [("n = 2", (2,))],
                             lambda gen: (cases.integer(gen, 3, 12),))


# --------------------------------------------------------------------------- influence_matrix

def attention_fn(gen: torch.Generator, d: int, causal: bool) -> FnSpec:
    w = lambda: cases.randn(gen, d, d, scale=0.7)  # noqa: E731
    return FnSpec("attention", {"w_q": w(), "w_k": w(), "w_v": w(), "causal": causal})


def mix_fn(gen: torch.Generator, L: int, d: int, d_out: int, scale: float = 1.0) -> FnSpec:
    return FnSpec("mix", {"a": cases.randn(gen, L, L, scale=scale),
                          "w": cases.randn(gen, d, d_out, scale=scale)})


def diagnose_influence(args, kwargs, got, index, dtype) -> str | None:
    f, x = args
    ref = am.influence_matrix(f, x)
    return dg.name_mistake(got, [
        ("the matrix is transposed: row i is the output position, column j the input position "
         "([i, j] = ||∂f(x)[i] / ∂x[j]||).", lambda: ref.T),
        ("the norms are squared: take the square root of the sum of squares (the Frobenius norm).",
         lambda: ref**2),
        ("the gradient of f(x)[i].sum() is not the Jacobian block: summing the outputs first lets "
         "components cancel. Differentiate every output component (e.g. torch.autograd.functional.jacobian).",
         lambda: grad_of_sum(f, x)),
        ("the block norm is the L1 norm (the sum of |entries|); the contract asks for the Frobenius norm, "
         "the square root of the sum of squares.", lambda: jacobian_blocks(f, x).abs().sum(dim=(-2, -1))),
        ("the block norm is the spectral norm (the largest singular value); the contract asks for the "
         "Frobenius norm, the square root of the sum of squares.",
         lambda: torch.linalg.matrix_norm(jacobian_blocks(f, x), ord=2)),
        ("the block norm is the largest |entry|; the contract asks for the Frobenius norm, the square root "
         "of the sum of squares.", lambda: jacobian_blocks(f, x).abs().amax(dim=(-2, -1))),
    ], dtype)


def jacobian_blocks(f, x: torch.Tensor) -> torch.Tensor:
    """(L, L, d_out, d): block [i, j] is ∂f(x)[i] / ∂x[j]."""
    jac = torch.autograd.functional.jacobian(f, x.detach())  # (L, d_out, L, d)
    return jac.permute(0, 2, 1, 3)


def grad_of_sum(f, x: torch.Tensor) -> torch.Tensor:
    """The mistaken [i, j] = ||∂ sum_k f(x)[i, k] / ∂x[j]||, for recognising it."""
    rows = []
    for i in range(x.shape[0]):
        xi = x.detach().clone().requires_grad_(True)
        (g,) = torch.autograd.grad(f(xi)[i].sum(), xi)
        rows.append(g.norm(dim=-1))
    return torch.stack(rows)


INFLUENCE = J.Recipe("influence_matrix", am.influence_matrix, ("f", "x"),
                     (J.Out("influence", "number", "(L, L)", dtype=lambda a, k: a[1].dtype),),
                     diagnose_influence, kept=(1,))


@exercise(3.0, "influence_matrix(f, x): for x (L, d), the (L, L) matrix of Frobenius norms ||∂f(x)[i] / "
          "∂x[j]||; x unchanged.")
def influence_matrix_checks(seed: int = 0, hidden: bool = True) -> list[Check]:
    R = INFLUENCE
    pub = cases.generator(cases.PUBLIC_SEED, R.name)
    checks = [
        J.values(R, "causal attention layer (L=4, d=3)",
                 [Call((attention_fn(pub, 3, True), cases.randn(pub, 4, 3)))], public=True),
        J.values(R, "token mixing A·x·W (L=3, d=2, d'=4)",
                 [Call((mix_fn(pub, 3, 2, 4), cases.randn(pub, 3, 2)))], public=True),
    ]
    if not hidden:
        return checks
    gen = cases.generator(seed, R.name)
    L, d = cases.integer(gen, 5, 8), cases.integer(gen, 2, 4)
    x = lambda dtype=torch.float32: cases.randn(gen, L, d, dtype=dtype)  # noqa: E731
    return checks + [
        J.values(R, "causal attention layer (random)", [Call((attention_fn(gen, d, True), x()))]),
        J.values(R, "attention layer without mask", [Call((attention_fn(gen, d, False), x()))]),
        J.values(R, "position-wise map → diagonal only",
                 [Call((FnSpec("elementwise", {"scale": 0.5 + float(torch.rand((), generator=gen))}), x()))]),
        J.values(R, "token mixing, d' ≠ d (random)", [Call((mix_fn(gen, L, d, d + 3), x()))]),
        J.values(R, "matches reference (float16 x)", [Call((mix_fn(gen, L, d, d), x(torch.float16)))]),
        # Jacobian entries above 256: their squares overflow float16 (65504), their norms do not.
        J.values(R, "float16 x whose Jacobian entries pass 256 (square in float32)",
                 [Call((mix_fn(gen, L, d, d, scale=24.0), x(torch.float16)))]),
        J.dtypes(R, "in x's dtype", [Call((mix_fn(gen, L, d, d), x(dt))) for dt in cases.FLOATS]),
        P.unchanged(R, "does not modify x", [Call((attention_fn(gen, d, True), x()))]),
        P.on_cuda(R, "matches on CUDA", [Call((attention_fn(gen, d, True), x()))]),
    ]
