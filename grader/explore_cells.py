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
Grading never runs these blocks (:mod:`grader.submission` skips them).
"""

from __future__ import annotations

import re
from types import TracebackType

#: The release's stub raises ``NotImplementedError("<function>: <hint> (see exercise N.M)")``
#: (:mod:`grader.runners.release`); torch's own NotImplementedError (no kernel) does not match.
_STUB = re.compile(r"^(?P<name>[A-Za-z_]\w*): .*\(see exercise (?P<exercise>\d+\.\d+)\)\s*$", re.S)


def stub_exercise(error: BaseException) -> tuple[str, str] | None:
    """``(exercise, function)`` when ``error`` is an exercise stub's NotImplementedError, else None."""
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
