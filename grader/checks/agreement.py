"""When two recordings of the public checks agree (:func:`grader.checks.recorded.stale`): the same
structure, integers, flags, strings, NaN positions and infinities, and floats within what a float32
kernel keeps on another CPU."""

from __future__ import annotations

import math
from typing import Any

import torch

#: Relative tolerance of :func:`same` for each float dtype: what a float32 kernel keeps (sums
#: of a few dozen terms, in another order, on another CPU), or two ulps of a narrower type (a
#: value rounded to it from float32 inputs that differ in their last bit).
SAME_RTOL = {torch.float64: 1e-4, torch.float32: 1e-4,
             torch.float16: 2 * 2.0**-10, torch.bfloat16: 2 * 2.0**-7}


def same(a: Any, b: Any) -> bool:
    """Whether two recordings agree: the same structure, dtypes, shapes, integers, flags, strings
    and non-finite entries (NaN where NaN, the same infinities), and finite floats equal up to
    :data:`SAME_RTOL` of each value plus a tenth of that of the tensor's largest magnitude (at least 1,
    for entries near 0 that cancellation made):
    a float recorded on another CPU, with vectorised kernels or not, one thread or several,
    differs in its last bits, and that does not make the data stale."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.dtype != b.dtype \
                or a.shape != b.shape:
            return False
        if a.dtype.is_floating_point:
            return _close(a, b)
        return bool(torch.equal(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, tuple | list) and isinstance(b, tuple | list):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=SAME_RTOL[torch.float64]) or a == b or (a != a and b != b)
    return type(a) is type(b) and a == b


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    rtol = SAME_RTOL.get(a.dtype, SAME_RTOL[torch.float32])
    a, b = a.double(), b.double()
    finite = torch.isfinite(b)
    if not torch.equal(torch.isfinite(a), finite) or not torch.equal(torch.isnan(a), torch.isnan(b)) \
            or not torch.equal(a[torch.isinf(b)], b[torch.isinf(b)]):
        return False
    a, b = a[finite], b[finite]
    if not b.numel():
        return True
    scale = max(1.0, float(b.abs().max()))
    return bool(((a - b).abs() <= rtol * (b.abs() + scale / 10)).all())
