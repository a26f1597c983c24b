"""Explore cells: the student's own functions at work, or one line saying what to finish first.

An exercise notebook ends each exercise with cells that *use* what the student built
(see the leak with your ``influence_matrix``, your cached decoding equal the full pass).
Their code sits in a ``with explore():`` block::

    from grader import explore

    with explore():
        print(causal_mask(6).int())

While a function the block calls is still the release's stub, the block stops at that
call and prints one line, ``Explore: finish exercise 1.1 (causal_mask) first.``, instead
of a traceback. Any other exception is the student's own bug and propagates as usual.
Grading never runs these blocks, nor cells tagged ``explore`` (:mod:`grader.submission` skips
them, asking :func:`explore_block` and :func:`tagged_explore`).
"""

from __future__ import annotations

import ast
import re
from types import TracebackType

#: The release's stub raises ``NotImplementedError("<function>: implement it (see exercise N.M)")``
#: (:mod:`grader.runners.single.release`); torch's own NotImplementedError (no kernel) does not match.
_STUB = re.compile(r"^(?P<name>[A-Za-z_]\w*): .*\(see exercise (?P<exercise>\d+\.\d+)\)\s*$", re.S)


def stub_exercise(error: BaseException) -> tuple[str, str] | None:
    """``(exercise, function)`` when ``error`` is an exercise stub's NotImplementedError, else None.
    A stub raised inside a Triton kernel (chapter 13) arrives as the cause of the interpreter's error."""
    if type(error).__name__ == "InterpreterError" and error.__cause__ is not None:
        error = error.__cause__
    if not isinstance(error, NotImplementedError) or not error.args:
        return None
    m = _STUB.match(str(error.args[0]))
    return (m["exercise"], m["name"]) if m else None


class explore:
    """Context manager for an Explore cell: a stub's NotImplementedError becomes one printed line."""

    def __enter__(self) -> explore:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> bool:
        found = stub_exercise(error) if error is not None else None
        if found is None:
            return False
        exercise, name = found
        print(f"Explore: finish exercise {exercise} ({name}) first.")
        return True


# --------------------------------------------------------------------------- what grading skips

TAG = "explore"  # a notebook cell's tag: an Explore cell (release keeps it, grading never runs it)


def explore_block(stmt: ast.stmt) -> bool:
    """A top-level ``with explore(): ...`` (or ``with grader.explore():``) statement."""
    if not isinstance(stmt, ast.With | ast.AsyncWith):
        return False
    for item in stmt.items:
        fn = item.context_expr.func if isinstance(item.context_expr, ast.Call) else None
        if (isinstance(fn, ast.Name) and fn.id == "explore") or (
                isinstance(fn, ast.Attribute) and fn.attr == "explore"):
            return True
    return False


def tagged_explore(cell: dict) -> bool:
    """A notebook cell (its JSON) tagged ``explore``."""
    metadata = cell.get("metadata")
    tags = metadata.get("tags") if isinstance(metadata, dict) else None
    return isinstance(tags, list) and TAG in tags
