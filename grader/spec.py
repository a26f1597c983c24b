"""The contract between exercise checks and the grading engine.

An exercise is graded by a list of :class:`Check`. A check names the property it
tests, lists the :class:`Call` s to make to the student's function, and carries
a ``judge`` that turns what came back into a :class:`Verdict`.

Calls run wherever the student's code runs (a sandboxed worker process for the
CLI, the student's own kernel for the in-notebook ``check``). Only plain data
crosses that boundary: tensors, ints, floats, bools, strings, None, and
lists/tuples/dicts of them (see :mod:`grader.sandbox.channel`).
Judges run in the trusted process; they never see student objects, only
:class:`Outcome` s built from that data.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class FnSpec:
    """A function argument described as data (e.g. the ``f`` of ``influence_matrix``).

    The worker rebuilds it with :func:`grader.fnspecs.build` from trusted code:
    ``kind`` names a builder, ``params`` holds its tensors and numbers.
    """

    kind: str
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class Call:
    """One call ``fn(*args, **kwargs)``; tensors in args go to ``device`` first
    (``"cpu"``, ``"cuda"`` or ``"meta"``). With ``allocations``, the call also
    records the largest floating tensor it creates (:attr:`Outcome.largest`) and the most
    floating entries alive at once (:attr:`Outcome.peak`). With ``default_device`` (``"meta"``),
    the call runs inside ``with torch.device(...)``: a tensor the function makes without
    ``device=`` lands there, not beside its inputs."""

    args: tuple
    kwargs: dict[str, Any] = field(default_factory=dict)
    device: str = "cpu"
    allocations: bool = False
    default_device: str | None = None


@dataclass
class Outcome:
    """What one call produced, as plain data.

    ``output`` is the return value converted to plain tensors (``type(t) is
    torch.Tensor``, moved to the CPU, ``device`` recorded separately) or
    containers of them; ``error`` is ``"ExcType: message"`` when the call
    raised, else None. ``args_after`` are the tensor arguments after the call
    (to detect in-place changes), ``grad_ok`` the result of the gradient probe
    when the check asked for one.
    """

    output: Any = None
    error: str | None = None
    devices: Any = None  # same structure as output, device type strings
    args_after: tuple | None = None
    grads: Any = None  # gradients of sum(outputs) w.r.t. float args, when requested
    #: the call's cost in the process that made it, wall and CPU (all its threads): the arguments
    #: copied, the function, its outputs and gradients recorded (:mod:`grader.timing`)
    seconds: float = 0.0
    cpu: float = 0.0
    where: str | None = None  # with error: the innermost line of the student's code, "line 3 of cell 4 of x"
    #: with ``Call.allocations``: the shape of the largest floating tensor an operation created
    #: during the call (views and in-place results excluded); () when it created none
    largest: tuple[int, ...] | None = None
    #: with ``Call.allocations``: the most floating entries that tensors created during the call
    #: held alive at once (:class:`grader.sandbox.execute.Allocations`); 0 when it created none
    peak: int | None = None


@dataclass
class Verdict:
    passed: bool
    message: str = ""  # one line: what broke, in plain words
    detail: str = ""  # smallest failing case: grids side by side, largest error, ...
    skipped: bool = False  # e.g. CUDA checks on a machine without CUDA


@dataclass
class Check:
    name: str
    calls: list[Call]
    judge: Callable[[list[Call], list[Outcome]], Verdict]
    public: bool = False
    weight: float = 1.0
    want_grads: bool = False
    requires: str | None = None  # "cuda" -> skipped (reported) when unavailable
    #: "value": outputs compared with the reference on a general case; a hidden one earns
    #: points alone, a public one (its answer is in the student template) only once a hidden
    #: "value" check of the exercise passes (see grader.results.score_of).
    #: "edge": compared with the reference on a degenerate case (n = 1, ...) that a
    #: constant can pass; earns only once a general "value" check of the exercise passes.
    #: "property": a necessary condition (dtype, device, inputs unchanged, an
    #: invariance) that even a constant function can meet; it takes points away
    #: when it fails and never earns any alone (see grader.runners.classmode.scores).
    kind: str = "value"


@dataclass
class Exercise:
    """One graded function of the exercise contract.

    ``make_checks(seed, hidden=...)`` returns the public checks (fixed, the
    same ones the in-notebook ``check`` runs) and, when ``hidden`` is True, the
    hidden randomized checks drawn from ``seed`` as well. Each is declared once,
    by :func:`exercise` on its checks in its chapter's module (``grader/checks/``).
    """

    name: str  # the function name, e.g. "causal_mask"
    chapter: int
    make_checks: Callable[..., list[Check]]
    points: float = 10.0
    statement: str = ""  # the one-line task statement, as reports show it


#: A chapter's ``NAME_checks(seed, hidden)``.
Checks = Callable[..., list[Check]]


def exercise(points: float, statement: str) -> Callable[[Checks], Checks]:
    """Declare ``NAME_checks(seed, hidden)`` the checks of exercise NAME, worth ``points``,
    with its one-line task statement; :mod:`grader.checks` gathers what is declared."""

    def declare(make: Checks) -> Checks:
        make.points, make.statement = points, statement
        return make

    return declare


@dataclass(frozen=True)
class NotATensor:
    """Stands in for a returned value that is not a plain tensor (a list, a
    numpy array, a tensor subclass...), so judges can say what came back."""

    type_name: str
