"""Comparison and diagnosis helpers shared by every exercise's checks.

Everything here runs in the trusted process on plain CPU tensors taken from
:class:`~grader.spec.Outcome` s. Nothing raises on junk: each helper either
returns a usable tensor or a plain-words message saying what came back, what
was expected and what to do.

The classic mistakes are recognised by computing what the mistake would have
returned (with the reference code, on the same inputs) and comparing: their
messages live in :data:`grader.mistakes.MISTAKES`, one definition each, reused by every chapter.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from .cases import DTYPE_NAMES
from .spec import FnSpec, NotATensor, Verdict

ALLOWED, BLOCKED, WRONG = "■", "·", "✗"

#: Per-dtype tolerance ``(atol, rtol)``: ``|got - want| <= atol + rtol * |want|``
#: against a float64 reference computed from the same (rounded) inputs. Measured
#: on a float32-accumulating and a natively low-precision implementation
#: (tests/buggy/correct.py, tests/buggy/native.py); both pass with room to spare.
TOL: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-9, 1e-7),
    torch.float32: (2e-5, 2e-4),
    torch.float16: (4e-3, 1e-2),
    torch.bfloat16: (3e-2, 5e-2),
}

# --------------------------------------------------------------------------- basics

def plain(t: torch.Tensor) -> bool:
    """True for an honest tensor: not a subclass that could lie about equality."""
    return type(t) is torch.Tensor


def fail(message: str, detail: str = "") -> Verdict:
    return Verdict(False, message, detail)


PASS = Verdict(True)


def shape_str(shape: Iterable[int]) -> str:
    dims = tuple(int(s) for s in shape)
    return "(" + ", ".join(map(str, dims)) + ("," if len(dims) == 1 else "") + ")"


def dtype_str(dtype: torch.dtype) -> str:
    return DTYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))


def describe(x: Any) -> str:
    """What came back, in words: 'a (2, 3) float16 tensor', 'a list', 'None'."""
    if isinstance(x, NotATensor):
        return f"a {x.type_name}" if x.type_name != "NoneType" else "None"
    if isinstance(x, torch.Tensor):
        if not plain(x):
            return f"a tensor subclass {type(x).__name__}"
        return f"a {shape_str(x.shape)} {dtype_str(x.dtype)} tensor"
    if isinstance(x, tuple | list):
        return f"a {type(x).__name__} of {len(x)}"
    if x is None:
        return "None"
    return f"a {type(x).__name__}"


def describe_args(names: Sequence[str], args: tuple, kwargs: dict | None = None) -> str:
    """'scores (2, 3, 4) float16, mask (3, 4) bool' -- the inputs of a failing case."""
    parts = []
    items = list(zip(names, args)) + list((kwargs or {}).items())
    for name, a in items:
        if isinstance(a, torch.Tensor):
            parts.append(f"{name} {shape_str(a.shape)} {dtype_str(a.dtype)}")
        elif isinstance(a, FnSpec):
            parts.append(f"{name} = {a.kind} map")
        elif isinstance(a, torch.dtype):
            parts.append(f"{name}={dtype_str(a)}")
        else:
            parts.append(f"{name}={a!r}")
    return ", ".join(parts)


# torch's own NotImplementedError: no kernel for these inputs (e.g. tril on uint16), not a stub.
# --------------------------------------------------------------------------- outputs

def unpack(output: Any, names: Sequence[str]) -> tuple[list[torch.Tensor] | None, str | None]:
    """The returned value as a list of plain tensors, one per name in ``names``
    (a single name means a single tensor, several a tuple); or a message."""
    want = names[0] if len(names) == 1 else "a tuple (" + ", ".join(names) + ")"
    if len(names) == 1:
        if isinstance(output, torch.Tensor) and plain(output):
            return [output], None
        extra = " (return only the tensor, not a tuple)" if isinstance(output, tuple | list) else ""
        return None, f"returned {describe(output)}; expected {want} as a plain torch.Tensor{extra}"
    if not isinstance(output, tuple | list):
        return None, f"returned {describe(output)}; expected {want}"
    if len(output) != len(names):
        return None, f"returned {describe(output)}; expected {want}"
    for name, t in zip(names, output):
        if not (isinstance(t, torch.Tensor) and plain(t)):
            return None, f"{name} is {describe(t)}; expected a plain torch.Tensor"
    return list(output), None


def fit_shape(t: torch.Tensor, shape: tuple[int, ...], name: str, letters: str,
              exact: bool = False) -> tuple[torch.Tensor | None, str | None]:
    """``t`` broadcast to the contract ``shape`` (or required equal, ``exact``); or a message."""
    expected = f"{letters} = {shape_str(shape)}"
    if exact:
        if tuple(t.shape) == tuple(shape):
            return t, None
        return None, f"{name} has shape {shape_str(t.shape)}; expected {expected}"
    try:
        if t.dim() > len(shape):
            raise RuntimeError
        return torch.broadcast_to(t, shape), None
    except RuntimeError:
        return None, (f"{name} has shape {shape_str(t.shape)}, which does not broadcast to {expected}; "
                      f"return it as {shape_str(shape)} or a shape that broadcasts to it")


def mask_values(t: torch.Tensor, name: str) -> tuple[torch.Tensor | None, str | None]:
    """``t`` as a boolean mask, or a message: a mask of any other dtype is a wrong mask,
    whatever its values (a float 0/1 mask given to SDPA is added to the scores and masks nothing)."""
    if t.dtype == torch.bool:
        return t, None
    if t.dtype.is_complex or not t.numel():
        return None, f"{name} is {dtype_str(t.dtype)}; expected torch.bool (True = may attend)"
    values = torch.unique(t.double().flatten())
    sample = ", ".join(f"{v:g}" for v in values[:4].tolist())
    if t.dtype.is_floating_point and bool(torch.isinf(t).any()):
        hint = " (that looks like an additive mask; return the boolean mask itself)"
    elif bool(((values == 0) | (values == 1)).all()):
        hint = (" (0s and 1s, but not bool: SDPA adds a float mask to the scores, so it masks nothing; "
                "return torch.bool, e.g. with .bool())")
    else:
        hint = ""
    return None, (f"{name} is {dtype_str(t.dtype)} with values such as {sample}; "
                  f"expected torch.bool, True = may attend{hint}")


# --------------------------------------------------------------------------- masks

QUERY_KEY_AXES = "rows = queries i, columns = keys j"


def grids(want: torch.Tensor, got: torch.Tensor, label: str = "", limit: tuple[int, int] = (16, 24),
          axes: str = QUERY_KEY_AXES) -> str:
    """Expected and actual 2-D masks side by side, wrong cells marked; ``axes`` says what
    rows and columns are ((Lq, Lk) masks by default)."""
    want, got = want[: limit[0], : limit[1]], got[: limit[0], : limit[1]]
    Lq, Lk = want.shape
    row = lambda m, i: " ".join(ALLOWED if bool(m[i, j]) else BLOCKED for j in range(Lk))  # noqa: E731
    diff = lambda i: " ".join(WRONG if bool(want[i, j] != got[i, j]) else "." for j in range(Lk))  # noqa: E731
    w = max(2 * Lk - 1, 8)
    head = f"{'expected':<{w}}   {'got':<{w}}   wrong cells"
    lines = [f"{label}{axes}; {ALLOWED} may attend, {BLOCKED} blocked, "
             f"{WRONG} wrong", head]
    lines += [f"{row(want, i):<{w}}   {row(got, i):<{w}}   {diff(i)}" for i in range(Lq)]
    return "\n".join(lines)


def first_wrong_slice(want: torch.Tensor, got: torch.Tensor) -> tuple[tuple[int, ...], str]:
    """Leading index of the first (Lq, Lk) slice that differs, and its label."""
    lead = want.shape[:-2]
    if not lead:
        return (), ""
    bad = (want != got).flatten(-2).any(-1)
    idx = tuple(int(i) for i in bad.nonzero()[0]) if bool(bad.any()) else (0,) * len(lead)
    if len(lead) == 2:
        label = f"batch b = {idx[0]}" + (f", head h = {idx[1]}" if lead[1] > 1 else "") + ": "
    else:
        label = f"index [{', '.join(map(str, idx))}]: "
    return idx, label


def mask_detail(want: torch.Tensor, got: torch.Tensor, inputs: str, letters: str = "") -> str:
    """The smallest failing slice of a mask, as grids, with the inputs named. ``letters``
    (the contract's shape, e.g. "(B, L)") says what a 2-D mask's rows are."""
    n_wrong = int((want != got).sum())
    if want.dim() == 1:
        want, got = want[None], got[None]
    elif want.dim() > 2:
        idx, label = first_wrong_slice(want, got)
        want, got = want[idx], got[idx]
        return f"{n_wrong} wrong cell(s); inputs: {inputs}\n" + grids(want, got, label)
    axes = ("rows = sequences b, columns = positions j" if letters.replace(" ", "").startswith("(B,")
            else QUERY_KEY_AXES)
    return f"{n_wrong} wrong cell(s); inputs: {inputs}\n" + grids(want, got, axes=axes)


def same_mask(got: torch.Tensor, candidate: torch.Tensor) -> bool:
    try:
        return bool(torch.equal(got, torch.broadcast_to(candidate, got.shape)))
    except RuntimeError:
        return False


# --------------------------------------------------------------------------- numbers

def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    return TOL.get(dtype, TOL[torch.float32])


def tol_str(dtype: torch.dtype) -> str:
    atol, rtol = tolerance(dtype)
    return f"tolerance for {dtype_str(dtype)}: |error| <= {atol:g} + {rtol:g}·|expected|"


def bad_entries(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool, True where ``got`` is not within the ``dtype`` tolerance of ``want``
    (a NaN where a number is expected is always bad; matching infinities are fine)."""
    atol, rtol = tolerance(dtype)
    g, w = got.double(), want.double()
    same_inf = torch.isinf(g) & torch.isinf(w) & (torch.sign(g) == torch.sign(w))
    both_nan = torch.isnan(g) & torch.isnan(w)
    with torch.no_grad():
        err = (g - w).abs()
        # where an infinity is expected only the same infinity will do (inf <= inf would pass anything)
        ok = ((err <= atol + rtol * w.abs()) & torch.isfinite(w)) | same_inf | both_nan
    return ~ok


def close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> bool:
    try:
        return tuple(got.shape) == tuple(want.shape) and not bool(bad_entries(got, want, dtype).any())
    except RuntimeError:
        return False


def fmt(v: float) -> str:
    if math.isnan(v) or math.isinf(v):
        return str(v)
    return f"{v:.4g}"


def index_str(name: str, idx: Sequence[int | str]) -> str:
    return f"{name}[{', '.join(str(i) for i in idx)}]"


def number_detail(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, name: str, inputs: str,
                  tol: str | None = None) -> str:
    """Where the largest error is, and what the row around it looks like."""
    bad = bad_entries(got, want, dtype)
    g, w = got.double(), want.double()
    err = (g - w).abs().nan_to_num(nan=math.inf)
    err = torch.where(bad, err, torch.zeros_like(err))
    flat = int(err.flatten().argmax()) if err.numel() else 0
    idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), got.shape)) if got.dim() else ()
    lines = [
        f"{int(bad.sum())} of {bad.numel()} entries of {name} are off; the largest error is at "
        f"{index_str(name, idx)}: got {fmt(float(g[idx]))}, expected {fmt(float(w[idx]))}",
        f"inputs: {inputs}; {tol or tol_str(dtype)}",
    ]
    if got.dim() >= 1 and got.shape[-1] <= 8:
        row = idx[:-1]
        lines.append(f"{index_str(name, [*row, ':'])}: got [{', '.join(fmt(float(v)) for v in g[row])}], "
                     f"expected [{', '.join(fmt(float(v)) for v in w[row])}]")
    return "\n".join(lines)


# --------------------------------------------------------------------------- mistakes

Candidate = tuple[str, Callable[[], Any]]


def name_mistake(got: torch.Tensor, candidates: Iterable[Candidate], dtype: torch.dtype,
                 index: int | None = None) -> str | None:
    """The message of the first candidate mistake whose result equals the student's
    (masks exactly, numbers within the ``dtype`` tolerance, NaN where NaN).

    Each thunk returns what the mistaken function would have returned: a tensor,
    or a tuple from which ``index`` picks the output being judged. Candidates
    that raise are skipped: a recogniser must never make a judge fail.
    """
    for message, thunk in candidates:
        try:
            cand = thunk()
            if index is not None and isinstance(cand, tuple | list):
                cand = cand[index]
            if _same(got, cand, dtype):
                return message
        except Exception:  # noqa: BLE001 -- a recogniser that cannot apply just does not match
            continue
    return None


def _same(got: torch.Tensor, cand: torch.Tensor, dtype: torch.dtype) -> bool:
    if got.dtype == torch.bool or cand.dtype == torch.bool:
        return same_mask(got.bool() if got.dtype != torch.bool else got, cand.bool())
    if tuple(got.shape) != tuple(cand.shape):
        return False
    return not bool(bad_entries(got, cand, dtype).any())


def judged(judge: Callable[..., Verdict]) -> Callable[..., Verdict]:
    """Wrap a judge so that it never raises: a crash becomes a failing verdict
    that says the result could not be judged."""

    def safe(calls, outcomes) -> Verdict:
        try:
            if len(outcomes) != len(calls):
                return fail(f"expected {len(calls)} outcomes, got {len(outcomes)}")
            verdict = judge(calls, outcomes)
            if not isinstance(verdict, Verdict):
                return fail("the check could not judge this result")
            return verdict
        except Exception as e:  # noqa: BLE001 -- judges must never raise on junk
            return fail("the result could not be judged; it is probably malformed "
                        f"({type(e).__name__}: {str(e)[:200]})")

    safe.__name__ = getattr(judge, "__name__", "judge")
    safe.__doc__ = judge.__doc__
    return safe
