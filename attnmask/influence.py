"""How much does output position i depend on input position j?

For a sequence map ``f: (L, d) -> (L, d')`` the influence matrix is

    I[i, j] = || d f(x)[i] / d x[j] ||_F        # (L, L)

A causal layer has ``I[i, j] == 0`` for every ``j > i``: the future cannot
reach the past. Without a mask the upper triangle lights up -- that is the
leakage the causal mask exists to stop.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["influence_matrix"]


def influence_matrix(f: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """Frobenius norms of the Jacobian blocks of ``f`` at ``x``.

    Args:
        f: differentiable map from ``(L, d)`` to ``(L, d')``.
        x: ``(L, d)`` float; not modified (a detached copy is differentiated).

    Returns:
        ``(L, L)`` in ``x.dtype`` on ``x.device``: ``[i, j] = ||∂f(x)[i] / ∂x[j]||_F``.
    """
    if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point or x.dim() != 2:
        raise ValueError(f"x must be a float tensor (L, d); got {getattr(x, 'shape', type(x))}")
    x0 = x.detach().clone()
    # jac[i, :, j, :] = d f(x)[i, :] / d x[j, :]   -> (L, d', L, d)
    jac = torch.autograd.functional.jacobian(f, x0)
    if jac.dim() != 4 or jac.shape[0] != x.shape[0]:
        raise ValueError(f"f must map (L, d) to (L, d'); its Jacobian has shape {tuple(jac.shape)}")
    return jac.float().pow(2).sum(dim=(1, 3)).sqrt().to(x.dtype)
