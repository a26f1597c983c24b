"""What feedback may say about a hidden check: the grader's own words, with every value masked.

A hidden check's cases are drawn from the instructor's seed; a student who resubmits
learns whatever its feedback says. Under the default seed (no secret) a failing hidden
check shows the kind of mistake only (its diagnosis, or "wrong cells", "wrong values", or
that the code raised: never which exception), and which public check fails the same way,
where one does: never an input, a shape, a size, a dtype or an expected value; under the
instructor's seed, only that it failed (below). Rather than trust each judge to leave those
out, :func:`words` masks every number and dtype name in a hidden check's message
(the classic mistakes' own texts, :data:`grader.mistakes.MISTAKES`, are kept whole:
they say the same on every case), and :func:`load_note` and :func:`stopped` do the
same for what happens around the checks (a statement that raised while the
submission loaded, a worker that died). The engine applies them; two seeds then give
the same feedback (tests/test_hidden_channel.py).

**One bit per hidden check.** The worker gets a hidden check's calls only after the
submission has loaded and every public check has run (:mod:`grader.sandbox.worker`): what
loading does and what the public checks say cannot depend on a hidden case. What the
hidden checks themselves say, in a grading with the instructor's seed, is their pass or
fail and nothing more: every failing hidden check says :data:`FAILED` with a detail drawn
from the public checks alone (:func:`failed`), and a stop (a crash, a time limit, code
raising ``NotImplementedError`` only there) during the hidden checks is a failure of those
checks like any other (:func:`bounded`). ``scripts/bench_hidden_bits.py`` measures it.

Text only (no torch), like :mod:`grader.errors`.
"""

from __future__ import annotations

import re

from .errors import HIDDEN_NOTE
from .mistakes import MISTAKES

#: What stands for a masked value.
MASK = "…"
_PROTECTED = sorted({text for text in MISTAKES.values() if text}, key=len, reverse=True)
# Tuples of numbers first ("(2, 1, 4, 7)" -> "(…)"), then numbers not inside a word (float16 keeps
# its 16 until the dtype rule takes the whole word), then dtype names but torch.bool, the contract's.
_TUPLE = re.compile(r"\(\s*[-+]?\d[\d.eE+-]*(?:\s*,\s*[-+]?\d[\d.eE+-]*)*\s*,?\s*\)")
_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?(?!\w)"
                     r"|(?<![\w.])(?:nan|inf)\b")
_DTYPE = re.compile(r"(?<!torch\.)\b(?:b?float|u?int|complex)\d+\w*|(?<!torch\.)\bbool\b(?! \()")


def _mask(text: str) -> str:
    text = _TUPLE.sub(f"({MASK})", text)
    text = _DTYPE.sub(MASK, text)
    return _NUMBER.sub(MASK, text)


def words(text: str) -> str:
    """``text`` (a hidden check's message) with every number, tuple of numbers and dtype name
    masked, outside the classic mistakes' own texts."""
    text = str(text)
    out, i = [], 0
    while i < len(text):
        hit = min(((text.find(p, i), p) for p in _PROTECTED if p in text[i:]), default=None)
        if hit is None:
            out.append(_mask(text[i:]))
            break
        at, phrase = hit
        out.append(_mask(text[i:at]) + phrase)
        i = at + len(phrase)
    return "".join(out)


_LOAD_ERROR = re.compile(r"^(line \d+ of .+?) (raised|ran longer than) ")


def load_note(error: str, statements: set[str], budget: float) -> str | None:
    """A note on a statement that raised while the submission loaded, as a grading that runs
    hidden cases shows it: where (only a top-level statement the parent itself read: one of
    ``statements``, "line N of FILE") and the exception's type, or that it ran past the
    statement's ``budget``; None when the worker's text names no such statement (code that
    loads can also write the worker's records). Not the exception's type: the grader says
    that a statement raised, not what."""
    m = _LOAD_ERROR.match(str(error))
    if m is None or m.group(1) not in statements:
        return None
    if m.group(2) != "raised":
        return f"{m.group(1)} ran longer than {budget:g} s and was stopped"
    return f"{m.group(1)} raised an exception ({HIDDEN_NOTE})"


def stopped(reason: str) -> str:
    """Why the worker stopped, as a grading that runs hidden cases shows it: without what the
    submission chose (its exit status, the signal it sent itself, the line of a crash read from
    what it printed, the cell it said it was running); the grader's own limits stay."""
    reason = str(reason).split(", at ", 1)[0]
    reason = re.sub(r" while running .*", "", reason, flags=re.S)
    reason = re.sub(r"exit code -?\d+", f"exit code {MASK}", reason)
    return re.sub(r"signal -?\d+|\bSIG[A-Z0-9]+\b", "a signal", reason)


#: What every failing hidden check says in a grading with the instructor's seed, whatever went wrong.
FAILED = "fails on a hidden case"


def failed(public_failing: list[str]) -> str:
    """The detail of a failing hidden check: only what the public checks show (the names of those
    that fail, ``public_failing``), never anything of the hidden case or of what the code did."""
    if public_failing:
        names = ", ".join(f'"{n}"' for n in public_failing[:3]) + (", ..." if len(public_failing) > 3 else "")
        return (f"the public checks {names} fail too: run check(...) in the notebook to see their cases "
                "and what your code did with them; fix those first")
    return ("every public check passes: feedback on a hidden case says pass or fail, nothing more; "
            "try cases of your own in the notebook (other sizes, dtypes, masks, extreme values)")
