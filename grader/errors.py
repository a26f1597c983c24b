"""A student's exception, in plain words: recognised, quoted, and reduced to its type for hidden checks.

Text only (no torch), so the engine reads verdicts without importing torch before
its worker has started. An outcome's error is ``"Type: message"``; feedback quotes
it only through :func:`quoted`, so that a hidden check can replace exactly that
quote with its :func:`cut` form.
"""

from __future__ import annotations

import builtins
import re

from .mistakes import MISTAKES

_TORCH_NOT_IMPLEMENTED = re.compile(
    r"not implemented for '|Could not run '|is not (currently )?implemented for")


#: Triton's interpreter wraps what a kernel raises (chapter 13's stubs are in the kernels).
_IN_KERNEL = "InterpreterError: NotImplementedError("


def is_stub_error(error: str | None) -> bool:
    """Whether ``error`` (an outcome's "Type: message") is the stub's NotImplementedError."""
    return (bool(error) and (error.startswith("NotImplementedError") or error.startswith(_IN_KERNEL))
            and not _TORCH_NOT_IMPLEMENTED.search(error))


_READS_VALUES = r"cannot be called on meta|Cannot copy out of meta|meta tensors? (has|have) no data"
_MIXES_DEVICES = (r"not on the expected device|Expected all tensors to be on the same device|"
                  r"device type .* does not match|on different devices")


def reads_values(error: str) -> bool:
    """Whether ``error`` says the code read tensor values (impossible on the meta device)."""
    return bool(re.search(_READS_VALUES, str(error)))


def mixes_devices(error: str) -> bool:
    return bool(re.search(_MIXES_DEVICES, str(error)))


#: Exception types whose name feedback on a hidden check may show: Python's and the grader's own.
#: Any other name is the submission's own class, and its name is text the submission chose.
_KNOWN_TYPES = {name for name, obj in vars(builtins).items()
                if isinstance(obj, type) and issubclass(obj, BaseException)} | {
    "ForbiddenAPIError", "GraderError", "OutOfMemoryError", "ExerciseTimeout", "CellTimeout"}
HIDDEN_NOTE = ("its type and message are not shown where hidden cases run: check(...) in the notebook and "
               "--public-only show them in full")


def error_type(error: str) -> str:
    """The type of an outcome's error ("Type: message"), as feedback on a hidden check may
    name it: Python's exceptions and the grader's by their name, any other class generically."""
    kind = (str(error).splitlines() or [""])[0].partition(": ")[0].strip()
    return kind if kind in _KNOWN_TYPES else "an exception of a class the submission defines"


def quoted(error: str) -> str:
    """How feedback quotes a student's exception ("Type: message"): its first line, at most
    300 characters. The one place that quotes it, so a hidden check can cut it (:func:`cut`)."""
    first = str(error).splitlines()[0] if str(error) else "an error"
    return first[:300] + "..." if len(first) > 300 else first


def cut(error: str) -> str:
    """:func:`quoted` as a hidden check shows it: that it raised, nothing more. Nothing the
    student's code chose (the message, an excerpt of it, its digits spelled as words, the
    exception's type picked per case) may carry a hidden case's inputs out to the student."""
    return f"an exception ({HIDDEN_NOTE})"


def explain_error(error: str) -> str:
    """The student's exception, in plain words (the original text follows)."""
    text = str(error)
    first = quoted(text)
    rules: list[tuple[str, str]] = [
        (_READS_VALUES, MISTAKES["not_vectorised"]),
        (_TORCH_NOT_IMPLEMENTED.pattern, MISTAKES["no_kernel"]),
        (r"^NotImplementedError", "not implemented yet: the function raised NotImplementedError."),
        (r"without overflow", MISTAKES["fill_overflow"]),
        (r"leaf Variable that requires grad is being used in an in-place", MISTAKES["in_place"]),
        (_MIXES_DEVICES, MISTAKES["mixed_devices"]),
        (r"must match the size of tensor b .* at non-singleton dimension", MISTAKES["shapes_clash"]),
        (r"same dtype|expected scalar type|dtype .* but got|Found dtype", MISTAKES["mixed_dtypes"]),
    ]
    for pattern, message in rules:
        if re.search(pattern, text):
            return f"{message} (it raised {first})"
    return f"it raised {first}"
