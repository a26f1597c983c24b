"""Recipes, the reference, and the value and dtype judges shared by every chapter.

A :class:`Recipe` says how one exercise is graded: the reference function
(from :mod:`attnmask`, trusted), the names of its arguments and outputs, each
output's contract shape and dtype, and a ``diagnose`` hook that names the
classic mistake behind a wrong output. The factories below turn a recipe and a
list of :class:`~grader.spec.Call` s into :class:`~grader.spec.Check` s whose
judges compare the student's outcomes to the reference computed here, in the
parent process, on the CPU (in float64 for float inputs). The judges of the
other properties (device, CUDA, inputs unchanged, gradients) and their factories
are in :mod:`grader.checks.common.properties`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ... import diagnose as dg
from ... import errors
from ...fnspecs import build
from ...spec import Call, Check, FnSpec, Outcome, Verdict

Diagnose = Callable[[tuple, dict, torch.Tensor, int, torch.dtype], "str | None"]


@dataclass(frozen=True)
class Out:
    """One returned tensor of an exercise.

    ``kind`` is "mask" (bool, compared after broadcasting to ``shape``),
    "number" (float, same shape as the reference), "logsumexp" (a number that is
    float32 whatever the inputs' dtype) or "additive" (0 where the
    mask allows, <= finfo(dtype).min where it blocks). ``shape`` computes the
    contract shape from the call's args and kwargs; None means the reference's
    shape. ``dtype`` gives the expected dtype; None means "any float".
    """

    name: str
    kind: str
    letters: str
    shape: Callable[[tuple, dict], tuple[int, ...]] | None = None
    dtype: Callable[[tuple, dict], torch.dtype | None] | None = None

    def expected_dtype(self, call: Call, args: tuple, kwargs: dict) -> torch.dtype | None:
        """The dtype this output must have for ``call`` (None: any floating dtype)."""
        if self.dtype is not None:
            return self.dtype(args, kwargs)
        if self.kind == "mask":
            return torch.bool
        if self.kind == "logsumexp":
            return torch.promote_types(float_dtype(call), torch.float32)
        return float_dtype(call)


@dataclass(frozen=True)
class Recipe:
    name: str
    ref: Callable[..., Any]
    arg_names: tuple[str, ...]
    outs: tuple[Out, ...]
    diagnose: Diagnose | None = None
    #: args whose values must survive the call; default: every tensor arg
    kept: tuple[int, ...] | None = None

    @property
    def out_names(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.outs)

    def expected(self, call: Call) -> list[torch.Tensor]:
        """The reference's outputs for ``call``, on the CPU (float64 for float inputs)."""
        args, kwargs = cpu_args(call)
        return as_list(self.ref(*args, **kwargs))

    def expected_grads(self, call: Call) -> dict[int, torch.Tensor | None]:
        """The reference's gradients, in float64, w.r.t. the call's float tensor args (by
        position), of the same weighted sum of its float outputs as the worker takes
        (:func:`grader.sandbox.execute._grads`)."""
        args, kwargs = cpu_args(call)
        idx = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.dtype.is_floating_point]
        args = tuple(a.requires_grad_(True) if i in idx else a for i, a in enumerate(args))
        outs = [o for o in as_list(self.ref(*args, **kwargs))
                if isinstance(o, torch.Tensor) and o.dtype.is_floating_point and o.requires_grad]
        gen = torch.Generator().manual_seed(1234)
        total = sum((o * torch.randn(o.shape, generator=gen).double()).sum() for o in outs)
        grads = torch.autograd.grad(total, [args[i] for i in idx], allow_unused=True)
        return dict(zip(idx, grads))

    def diagnosis(self, call: Call, args: tuple, kwargs: dict, got: torch.Tensor, index: int,
                  dtype: torch.dtype) -> str | None:
        """The classic mistake behind the wrong output ``index`` of ``call``, or None."""
        if self.diagnose is None:
            return None
        try:
            return self.diagnose(args, kwargs, got, index, dtype)
        except Exception:  # noqa: BLE001 -- a recogniser must never make the judge fail
            return None


# --------------------------------------------------------------------------- reference side

def float_dtype(call: Call) -> torch.dtype:
    """The dtype the call's numbers are judged in: its float tensor args' dtype,
    else a ``dtype`` kwarg, else float32."""
    for a in call.args:
        if isinstance(a, torch.Tensor) and a.dtype.is_floating_point:
            return a.dtype
    d = call.kwargs.get("dtype")
    return d if isinstance(d, torch.dtype) else torch.float32


def cpu_args(call: Call, *, wide: bool = True) -> tuple[tuple, dict]:
    """The call's args on the CPU (floats widened to float64 when ``wide``), with
    function specs built; kwargs naming a device are pointed at the CPU."""

    def conv(x):
        if isinstance(x, torch.Tensor):
            x = x.detach().cpu()
            return x.double() if wide and x.dtype.is_floating_point else x
        if isinstance(x, FnSpec):
            return build(x, "cpu")
        return x

    args = tuple(conv(a) for a in call.args)
    kwargs = {k: ("cpu" if k == "device" else conv(v)) for k, v in call.kwargs.items()}
    return args, kwargs


def as_list(x: Any) -> list[torch.Tensor]:
    return list(x) if isinstance(x, tuple | list) else [x]


#: (what, id(recipe), id(call)) -> (recipe, call, value): references computed before a class run
#: forks its gradings (:func:`remember`), which every grading of the class then reads instead of
#: computing again. None (the default, and in a notebook's check): always computed afresh.
_REMEMBERED: dict[tuple[str, int, int], tuple[Recipe, Call, Any]] | None = None


def outputs_of(recipe: Recipe, call: Call) -> list[torch.Tensor]:
    """``recipe.expected(call)``, as a function of both (what :func:`remember` keeps)."""
    return recipe.expected(call)


def remember(recipe: Recipe, call: Call, what: Callable[[Recipe, Call], Any] = outputs_of) -> None:
    """Compute ``what(recipe, call)`` (the reference's outputs, or its gradients) now and keep it
    for :func:`recall`."""
    global _REMEMBERED
    if _REMEMBERED is None:
        _REMEMBERED = {}
    _REMEMBERED[what.__name__, id(recipe), id(call)] = (recipe, call, what(recipe, call))


def recall(recipe: Recipe, call: Call, what: Callable[[Recipe, Call], Any]) -> Any:
    """``what(recipe, call)``: a copy of the value :func:`remember` kept, else computed now."""
    kept = _REMEMBERED.get((what.__name__, id(recipe), id(call))) if _REMEMBERED is not None else None
    if kept is None or kept[0] is not recipe or kept[1] is not call:
        return what(recipe, call)
    # a copy: a judge may not change what the next grading compares with
    value = kept[2]
    if isinstance(value, dict):
        return {k: t.clone() if isinstance(t, torch.Tensor) else t for k, t in value.items()}
    return [t.clone() if isinstance(t, torch.Tensor) else t for t in value]


def reference(recipe: Recipe, call: Call) -> list[torch.Tensor]:
    """The reference's outputs for ``call`` (:meth:`Recipe.expected`), remembered for a class."""
    return recall(recipe, call, outputs_of)


def inputs_of(recipe: Recipe, call: Call) -> str:
    return dg.describe_args(recipe.arg_names, call.args, {k: v for k, v in call.kwargs.items()})


#: The judge factories, by name: a judge they make records how it was made (``made_by``), so
#: that the student template rebuilds its public checks from data (:mod:`grader.checks.recorded`).
FACTORIES: dict[str, Callable[..., Callable]] = {}
#: Those of them whose judges name classic mistakes (:meth:`Recipe.diagnosis`): release records
#: the mistakes' outputs for their calls only.
NAMES_MISTAKES: set[str] = set()


def rebuildable(factory: Callable[..., Callable] | None = None, *, names_mistakes: bool = False):
    """Declare a judge factory whose judges the student template can rebuild: its arguments are
    recipes, plain values, and functions of one :class:`~grader.spec.Call`. ``names_mistakes``:
    its judges call :meth:`Recipe.diagnosis` (:func:`judge_call` does)."""

    def declare(factory: Callable[..., Callable]) -> Callable[..., Callable]:
        @functools.wraps(factory)
        def make(*args, **kwargs):
            judge = factory(*args, **kwargs)
            judge.made_by = (factory.__name__, args, kwargs)
            return judge

        FACTORIES[factory.__name__] = make
        if names_mistakes:
            NAMES_MISTAKES.add(factory.__name__)
        return make

    return declare if factory is None else declare(factory)


# --------------------------------------------------------------------------- comparing one output

def raised(error: str, inputs: str, device: str | None = None) -> Verdict:
    """The failing verdict of a call that raised ``error``: what it means in plain words,
    and the inputs it was called with (on ``device``, when that is the point)."""
    where = f"inputs on {device}" if device else "inputs"
    return dg.fail(errors.explain_error(error), f"{where}: {inputs}")


def fit(out: Out, got: torch.Tensor, want: torch.Tensor, args: tuple, kwargs: dict
        ) -> tuple[torch.Tensor | None, torch.Tensor | None, str | None]:
    """(got, want) in the contract shape, or a message about the shape/values kind."""
    if out.kind == "mask":
        got, msg = dg.mask_values(got, out.name)
        if msg:
            return None, None, msg
        shape = out.shape(args, kwargs) if out.shape else tuple(want.shape)
        want_full = torch.broadcast_to(want, shape)
        got_full, msg = dg.fit_shape(got, shape, out.name, out.letters)
        return got_full, want_full, msg
    if out.kind in ("number", "logsumexp") and not got.dtype.is_floating_point:
        return None, None, f"{out.name} is {dg.dtype_str(got.dtype)}; expected a floating tensor"
    got_full, msg = dg.fit_shape(got, tuple(want.shape), out.name, out.letters, exact=True)
    return got_full, want, msg


def compare(out: Out, got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, inputs: str,
            kwargs: dict) -> tuple[str, str] | None:
    """None when ``got`` matches; else (what is wrong, detail). Shapes already fitted."""
    if out.kind == "mask":
        if torch.equal(got, want):
            return None
        return f"{out.name} has wrong cells", dg.mask_detail(want, got, inputs, out.letters)
    if out.kind == "additive":
        return additive_problem(out.name, got, want, kwargs)
    bad = dg.bad_entries(got, want, dtype)
    if not bool(bad.any()):
        return None
    what = "NaN values" if bool(torch.isnan(got).any()) else "wrong values"
    return f"{out.name} has {what}", dg.number_detail(got, want, dtype, out.name, inputs)


def additive_problem(name: str, got: torch.Tensor, want: torch.Tensor, kwargs: dict
                     ) -> tuple[str, str] | None:
    """to_additive's rule: 0 where the mask allows, <= finfo(dtype).min where it blocks."""
    dtype = kwargs.get("dtype", torch.float32)
    if not got.dtype.is_floating_point:
        return f"{name} is {dg.dtype_str(got.dtype)}; expected a floating tensor", ""
    allowed = want == 0
    g = got.double()
    lowest = torch.finfo(dtype).min if isinstance(dtype, torch.dtype) and dtype.is_floating_point \
        else torch.finfo(torch.float32).min
    ok = torch.where(allowed, g == 0, g <= lowest)
    if bool(ok.all()):
        return None
    idx = tuple(int(i) for i in (~ok).nonzero()[0])
    where = "allowed (True)" if bool(allowed[idx]) else "blocked (False)"
    expected = "0" if bool(allowed[idx]) else \
        f"-inf or <= torch.finfo({dg.dtype_str(dtype)}).min = {lowest:.4g}"
    detail = (f"{int((~ok).sum())} of {ok.numel()} entries are off; at {dg.index_str(name, idx)} "
              f"the mask is {where}: got {dg.fmt(float(g[idx]))}, expected {expected}")
    return f"{name} has wrong values", detail


# --------------------------------------------------------------------------- judging calls

def judge_call(recipe: Recipe, call: Call, outcome: Outcome, only: Sequence[int] | None = None
               ) -> Verdict | None:
    """None when every judged output matches the reference; else the failing verdict."""
    inputs = inputs_of(recipe, call)
    if outcome.error is not None:
        return raised(outcome.error, inputs)
    got, msg = dg.unpack(outcome.output, recipe.out_names)
    if msg:
        return dg.fail(msg, f"inputs: {inputs}")
    args, kwargs = cpu_args(call)
    want = reference(recipe, call)
    dtype = float_dtype(call)
    for i in range(len(recipe.outs)) if only is None else only:
        out = recipe.outs[i]
        g, w, msg = fit(out, got[i], want[i], args, kwargs)
        if msg:
            return dg.fail(msg, f"inputs: {inputs}")
        # A log-sum-exp is float32 whatever the inputs' dtype, computed in float32: judged as such.
        judged = torch.float32 if out.kind == "logsumexp" else dtype
        problem = compare(out, g, w, judged, inputs, kwargs)
        if problem:
            diagnosis = recipe.diagnosis(call, args, kwargs, g, i, judged)
            message = f"{out.name}: {diagnosis}" if diagnosis else problem[0]
            return dg.fail(message, problem[1])
    return None


def size(call: Call) -> int:
    """How big a call's inputs are: failing cases are shown smallest first."""
    return sum(a.numel() if isinstance(a, torch.Tensor) else a if isinstance(a, int) else 0
               for a in call.args)


@rebuildable(names_mistakes=True)
def values_judge(recipe: Recipe, only: Sequence[int] | None = None):
    def judge(calls: list[Call], outcomes: list[Outcome]) -> Verdict:
        order = sorted(range(len(calls)), key=lambda i: size(calls[i]))
        for i in order:
            verdict = judge_call(recipe, calls[i], outcomes[i], only)
            if verdict is not None:
                return verdict
        return dg.PASS

    return dg.judged(judge)


@rebuildable
def dtype_judge(recipe: Recipe):
    def judge(calls, outcomes):
        for call, outcome in zip(calls, outcomes):
            if outcome.error is not None:
                return raised(outcome.error, inputs_of(recipe, call))
            got, msg = dg.unpack(outcome.output, recipe.out_names)
            if msg:
                return dg.fail(msg)
            args, kwargs = cpu_args(call, wide=False)
            for out, g in zip(recipe.outs, got):
                want = out.expected_dtype(call, args, kwargs)
                if want is None and not g.dtype.is_floating_point:
                    return dg.fail(f"{out.name} is {dg.dtype_str(g.dtype)}; expected a floating dtype")
                if want is not None and g.dtype != want:
                    return dg.fail(f"{out.name} is {dg.dtype_str(g.dtype)}; expected {dg.dtype_str(want)}"
                                   + dtype_hint(out, want), f"inputs: {inputs_of(recipe, call)}")
        return dg.PASS

    return dg.judged(judge)


def dtype_hint(out: Out, want: torch.dtype) -> str:
    if out.kind == "mask":
        return " (True = may attend)"
    if out.kind == "additive":
        return ": build it with dtype=dtype"
    if out.kind == "logsumexp":
        return (": a log-sum-exp stays float32 whatever the inputs' dtype (in float16 or bfloat16 it loses "
                "the digits that exp(lse1 - lse) needs when partial results are merged); do not cast it back")
    if out.kind == "integer":
        return " (torch.long): cumsum of a long tensor, or dtype=torch.long where you create it"
    return ": return the inputs' dtype (compute in float32 if you like, then cast back with .to(dtype))"


# --------------------------------------------------------------------------- check factories

#: Calls whose compared outputs hold fewer cells than this are passed by a blind guess once in
#: 2**20 tries or more often: they earn like an edge case.
GUESSABLE_BELOW = 20


def guess_bits(recipe: Recipe, calls: list[Call], only: Sequence[int] | None = None) -> float:
    """How many yes/no answers a blind guess must get right to pass ``calls``: one for each cell
    of a mask, additive or integer output (a lower bound); a float output cannot be guessed."""
    bits = 0
    for call in calls:
        args, kwargs = cpu_args(call, wide=False)
        want = None
        for i, out in enumerate(recipe.outs):
            if only is not None and i not in only:
                continue
            if out.kind in ("number", "logsumexp"):
                return math.inf
            if out.shape is None:
                want = want or recipe.expected(call)
            bits += math.prod(out.shape(args, kwargs) if out.shape else want[i].shape)
    return bits


def guessable(recipe: Recipe, calls: list[Call], only: Sequence[int] | None = None) -> bool:
    """Whether a blind guess passes ``calls`` once in 2**20 tries or more often: such a case
    earns like an edge case (see :func:`grader.results.score_of`)."""
    return guess_bits(recipe, calls, only) < GUESSABLE_BELOW


def values(recipe: Recipe, name: str, calls: list[Call], *, public: bool = False,
           only: Sequence[int] | None = None, weight: float = 1.0, edge: bool = False) -> Check:
    """Outputs compared with the reference. ``edge``: a degenerate case that a
    constant or a simpler mask can pass (see :func:`grader.results.score_of`); so is
    a case small enough to guess (:data:`GUESSABLE_BELOW`)."""
    edge = edge or guessable(recipe, calls, only)
    return Check(name, calls, values_judge(recipe, only), public=public, weight=weight,
                 kind="edge" if edge else "value")


def dtypes(recipe: Recipe, name: str, calls: list[Call], *, public: bool = False) -> Check:
    return Check(name, calls, dtype_judge(recipe), public=public, kind="property")


@rebuildable
def raises_judge(name: str, arg_names: tuple[str, ...], error: str, why: str):
    """Every call raises ``error`` (an exception's type name, e.g. "ValueError"); ``why``: what
    the contract says about such inputs. Takes no recipe: the reference raises on these calls."""

    def judge(calls: list[Call], outcomes: list[Outcome]) -> Verdict:
        for call, o in zip(calls, outcomes):
            inputs = dg.describe_args(arg_names, call.args, dict(call.kwargs))
            if o.error is not None and errors.error_type(o.error) == error:
                continue
            if errors.is_stub_error(o.error):
                return raised(o.error, inputs)
            got = f"it raised {errors.quoted(o.error)}" if o.error else "it returned a result"
            return dg.fail(f"{name} must raise {error} here ({why}); {got}", f"inputs: {inputs}")
        return dg.PASS

    return dg.judged(judge)


def raises(name: str, arg_names: tuple[str, ...], check: str, calls: list[Call], why: str,
           error: str = "ValueError") -> Check:
    """A property check: each of ``calls`` raises ``error``."""
    return Check(check, calls, raises_judge(name, arg_names, error, why), kind="property")
