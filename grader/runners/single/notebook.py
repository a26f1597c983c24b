"""``from grader import check; check(causal_mask)``: the public checks, in the notebook.

Runs an exercise's public checks in the student's own kernel, through the same
:func:`grader.sandbox.execute.execute` and the same judges as the full grader, and
prints a compact pass/fail list with the same feedback. The text is
deterministic (no timings), because solution notebooks store it and nbval
compares it. It never says the work is done: hidden cases remain for
``python -m grader``. It never raises on the student's mistakes.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from typing import Any

from ...results import NOT_IMPLEMENTED, NOT_IMPLEMENTED_MESSAGE, PASSED, ExerciseResult

_CHECKS: dict[str, list] = {}  # public checks per exercise: built once per kernel
FULL_GRADER = "python -m grader"
MEMORY_MB = 2048  # as `python -m grader --memory`'s default


def _registry() -> Mapping[str, Any]:
    from ...engine import load_registry

    return load_registry()


def public_checks(name: str) -> list:
    if name not in _CHECKS:
        from ...devices import one_thread
        from ...engine import DEFAULT_SEED

        with one_thread():
            _CHECKS[name] = list(_registry()[name].make_checks(DEFAULT_SEED, hidden=False))
    return _CHECKS[name]


_SCORED_0 = "the grader finds it and scores this exercise 0"


def run_public(fn: Callable, name: str | None = None, *, timeout: float | None = None,
               memory_mb: int | None = MEMORY_MB) -> ExerciseResult:
    """Grade ``fn`` on the public checks of exercise ``name`` (default ``fn.__name__``).

    Under the grader's limits: ``timeout`` seconds for the whole exercise (default
    ``engine.DEFAULT_TIMEOUT``), stopped by the same timer as in the worker, and, where the
    kernel can take it back afterwards, ``memory_mb`` of memory beyond what it uses now.
    """
    import torch

    from ... import engine, rules, verdicts
    from ...devices import one_thread
    from ...sandbox.limits import TIME_LIMIT

    name = name or fn.__name__
    timeout = engine.DEFAULT_TIMEOUT if timeout is None else timeout
    exercise = _registry()[name]
    state = engine._Exercise(0, exercise, 0, True, engine.cuda_available(), checks=public_checks(name))
    limited = _can_time()
    rng = torch.get_rng_state()
    interrupted = False
    deadline = time.monotonic() + timeout
    ran = []
    try:
        # on one thread, as in the worker (OMP_NUM_THREADS=1): the public cases are tiny, and a
        # notebook's default threads made find_leaking_layer's calls 9x as long on 2 busy cores
        with rules.forbid_torch_apis(), rules.forbid_globals(fn) as forbidden, _memory_limit(memory_mb), \
                _deferred_imports(), one_thread():
            for ci in state.runnable:
                check = state.checks[ci]
                outcomes = []
                for call in check.calls:
                    left = deadline - time.monotonic()
                    outcomes.append(_call(fn, call, bool(check.want_grads), left, limited))
                    if outcomes[-1].error and outcomes[-1].error.startswith("KeyboardInterrupt"):
                        interrupted = True
                        break
                if interrupted:
                    break
                ran.append((ci, check, outcomes))
    finally:
        torch.set_rng_state(rng)
    with one_thread():
        for ci, check, outcomes in ran:  # judged after: the reference may use the kernels blocked above
            state.outcomes_seen.extend(outcomes)
            if state.timed_out is None and any((o.error or "").startswith(TIME_LIMIT) for o in outcomes):
                state.timed_out = ci
            state.verdicts[ci] = verdicts.judge(check, outcomes, timeout=timeout)
    if interrupted:
        state.fail_rest("interrupted")
    result = state.finish()
    said = {c.message for c in result.checks}
    result.notes.extend(rules.message(what) for what in forbidden if rules.message(what) not in said)
    for finding in rules.in_body(fn)[:1]:  # imported inside the function: it runs here, not in the grader
        if any(rules.message(finding.what) in m for m in said if m):  # a check said it: only where
            result.notes.append(f"{finding.what} is used at {finding.where}: {_SCORED_0}")
        else:
            result.notes.append(f"{finding.text}: {_SCORED_0}, although it runs here")
    if not limited:
        result.notes.append("no time limit here: check() stops slow code only when called from the "
                            "notebook's main thread on Linux or macOS; the grader's limit is "
                            f"{timeout:g} s per exercise")
    return result


def _call(fn: Callable, call, want_grads: bool, left: float, limited: bool):
    """One call with what is left of the exercise's time, as the worker makes it."""
    from ...sandbox.execute import execute, execute_limited, reseed
    from ...sandbox.limits import CALL_SEED, NOT_RUN, TIME_LIMIT
    from ...spec import Outcome

    if left <= 0:
        return Outcome(error=f"{TIME_LIMIT}: {NOT_RUN}, the exercise's time was used up")
    reseed(CALL_SEED)
    if not limited:
        return execute(fn, call, want_grads=want_grads)
    return execute_limited(fn, call, want_grads=want_grads, seconds=left,
                           timed_out=f"{TIME_LIMIT}: stopped at the time limit")


def _can_time() -> bool:
    """SIGALRM can stop a call: a POSIX system, and we are in the main thread (as in a notebook cell)."""
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


@contextmanager
def _deferred_imports():
    """While the checks run, torch's heaviest modules (dynamo, sympy) stay unimported, as in the
    worker (:mod:`grader.sandbox.deferred`): the first operation on a ``meta`` tensor (the
    "device= (meta)" checks) would import dynamo, about as long as importing torch itself, only to
    learn that nothing is compiled. Stand-ins that are still in place afterwards are taken out, so
    that the student's own imports get the real modules."""
    from ...sandbox import deferred

    placed = deferred.install()
    try:
        yield
    finally:
        deferred.uninstall(placed)


@contextmanager
def _memory_limit(memory_mb: int | None):
    """Lower the kernel's address-space limit to what it uses now + ``memory_mb``, then restore it.

    As in the worker: a call that wants more gets a MemoryError (an outcome, like any error)
    instead of swapping the machine to a halt. Left out with CUDA, which reserves huge ranges.
    """
    try:
        import resource

        import torch

        if memory_mb is None or torch.cuda.is_initialized() or not sys.platform.startswith("linux"):
            raise OSError("not here")
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        with open("/proc/self/status") as f:
            size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
        limit = size + memory_mb * 2**20
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        if soft != resource.RLIM_INFINITY and soft <= limit:
            raise OSError("already limited")
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (OSError, ValueError, StopIteration, ImportError):
        yield
        return
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


#: Names of the other checks listed after "the same message for N more checks".
SAME_NAMES_SHOWN = 6


def checks_lines(result: ExerciseResult, indent: str = "    ") -> list[str]:
    """One line per check, as :func:`grader.report.checks_lines`, except that a failing check whose
    message an earlier failing check already gave is not repeated: the first one's line says it once,
    with its detail, and one line after it counts the others (a forbidden call fails every check with
    the same words)."""
    from ...report import MARK

    failing = [c for c in result.checks if not c.passed and not c.skipped]
    same: dict[str, list[str]] = {}
    for c in failing:
        if c.message:
            same.setdefault(c.message, []).append(c.name)
    lines = []
    for c in result.checks:
        text = f"{MARK[c.status]} {c.name} ({'public' if c.public else 'hidden'})"
        if c.skipped:
            lines.append(f"{text}: skipped, {c.message}")
            continue
        if c.passed:
            lines.append(text)
            continue
        names = same.get(c.message, [c.name])
        if c.message and names[0] != c.name:
            continue  # said by the first failing check with these words
        lines.append(f"{text}: {c.message}" if c.message else text)
        lines.extend(indent + d for d in c.detail.splitlines())
        if len(names) > 1:
            more = len(names) - 1
            shown = ", ".join(names[1:1 + SAME_NAMES_SHOWN]) + (", …" if more > SAME_NAMES_SHOWN else "")
            lines.append(f"{MARK['failed']} the same message for {more} more check{'s' if more > 1 else ''}: "
                         f"{shown}")
    return lines


def text(result: ExerciseResult) -> str:
    """The notebook's report: deterministic plain text."""
    name = result.name
    counted = [c for c in result.checks if not c.skipped]
    passed = sum(c.passed for c in counted)
    if result.status == NOT_IMPLEMENTED:
        return f"{name}: {NOT_IMPLEMENTED_MESSAGE} (it raises NotImplementedError)."
    lines = [f"{name}: {passed} of {len(counted)} public checks pass."]
    lines += checks_lines(result)
    lines += [f"note: {n}" for n in result.notes]
    if result.status == PASSED and any(_SCORED_0 in n for n in result.notes):
        lines.append("The public checks pass here, but not in the grader: remove what the note names.")
    elif result.status == PASSED:
        lines.append(f"The public checks pass. The full grader ({FULL_GRADER}) runs hidden cases as well.")
    else:
        lines.append("Fix the first failing check, then run this cell again.")
    return "\n".join(lines)


def _resolve(target: Any, namespace: Mapping[str, Any]) -> tuple[Callable, str] | str:
    """The function to check and its exercise name, or a message saying what is wrong."""
    names = list(_registry())
    if isinstance(target, str):
        if target not in names:
            return f"check({target!r}): no such exercise; the exercises are {', '.join(names)}."
        fn = namespace.get(target)
        if fn is None:
            return f"{target} is not defined yet: run the cell that defines it, then check again."
        if not callable(fn):
            return f"{target} is a {type(fn).__name__}, not a function."
        return fn, target
    if not callable(target):
        return f"check() takes an exercise function, e.g. check(causal_mask); got a {type(target).__name__}."
    name = getattr(target, "__name__", "")
    if name not in names:
        return (f"check() needs one of the exercise functions ({', '.join(names)}); "
                f"got {name or type(target).__name__}. Keep the exercise's function name.")
    return target, name


def check(target: Any) -> None:
    """Run the public checks of one exercise and print what passed and what did not.

    ``target`` is the function (``check(causal_mask)``) or its name
    (``check("causal_mask")``, looked up in the calling namespace).
    """
    try:
        namespace = sys._getframe(1).f_globals
        resolved = _resolve(target, namespace)
        if isinstance(resolved, str):
            print(resolved)
            return
        fn, name = resolved
        print(text(run_public(fn, name)))
    except Exception as e:  # noqa: BLE001 -- a notebook check must never end in a traceback
        print(f"internal grader error ({type(e).__name__}: {e}); please report it to the course staff.")


def check_all(namespace: Mapping[str, Any] | None = None) -> None:
    """The public checks of every exercise defined in ``namespace`` (default: the caller's globals)."""
    try:
        namespace = sys._getframe(1).f_globals if namespace is None else namespace
        lines = []
        for name in _registry():
            fn = namespace.get(name)
            if not callable(fn):
                lines.append(f"· {name}: not defined here")
                continue
            r = run_public(fn, name)
            counted = [c for c in r.checks if not c.skipped]
            passed = sum(c.passed for c in counted)
            mark = "✓" if r.status == PASSED else "✗"
            tail = "" if r.status == PASSED else f" -- {r.message}"
            lines.append(f"{mark} {name}: {passed} of {len(counted)} public checks pass{tail}")
        lines.append(f"Public checks only: the full grader ({FULL_GRADER}) runs hidden cases as well.")
        print("\n".join(lines))
    except Exception as e:  # noqa: BLE001
        print(f"internal grader error ({type(e).__name__}: {e}); please report it to the course staff.")
