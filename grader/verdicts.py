"""One check's verdict: what its calls produced, judged, and the result a report shows.

Shared by the engine and the notebook's ``check``: rule breaks and time limits are
named here, before the check's judge sees them, so every check words them the same
way. On a hidden check, and on every check of a grading with the instructor's seed,
the verdict keeps the grader's own words only, with every value masked
(:mod:`grader.hidden`): nothing the submission wrote, no case.
"""

from __future__ import annotations

import builtins
import dataclasses
from typing import Any

from . import hidden, rules
from .errors import cut, is_stub_error, quoted
from .results import CheckResult
from .sandbox.limits import NOT_RUN, TIME_LIMIT, ChannelError
from .spec import NotATensor, Verdict

#: What a hidden check may say a returned object was: Python's own types by name.
_BUILTIN_TYPES = {name for name, obj in vars(builtins).items() if isinstance(obj, type)}


def judge(check, outcomes: Any, findings: list[rules.Finding] = (), *, timeout: float | None = None,
          public_errors: dict[str, str] | None = None, hidden_run: bool = False):
    """The verdict of one check on what its calls produced, never an exception.

    ``outcomes`` is a list of :class:`~grader.spec.Outcome` or a
    :class:`~grader.sandbox.channel.ChannelError`. Rule breaks and time limits are
    named here, before the check's judge sees them, so every check words them
    the same way. ``public_errors``, kept per exercise, remembers how each public check
    failed (the exception's type, the masked message), so that a hidden check that fails
    the same way can name the public check that shows it in full.

    A failing hidden check says the kind of mistake only (:mod:`grader.hidden`). So does
    a public check in a ``hidden_run`` (a grading that runs hidden cases too): the worker
    holds every case of the exercise while the public ones run, and code that reads them
    there could say them in what it raises or returns; ``check(...)`` in the notebook and
    ``--public-only`` show public checks in full.
    """
    shown = check.public and not hidden_run
    verdict = _judge(check, outcomes, findings, timeout=timeout if shown else None, quoted=shown)
    if check.public and public_errors is not None:
        if not verdict.passed and not verdict.skipped:
            public_errors.setdefault(_SAID + hidden.words(verdict.message), check.name)
    if shown or verdict.passed or verdict.skipped:
        return verdict
    if isinstance(outcomes, list) and any(_forbidden(o.error) for o in outcomes):
        return Verdict(False, FORBIDDEN, PUBLIC_CASE if check.public else RAISED_CASE)
    if isinstance(outcomes, list) and any(_raised(o.error) for o in outcomes):
        # What student code raised is its own choice (a type per case: bits of the case per
        # check): the grader says that it raised, in fixed words, and nothing about what.
        return Verdict(False, RAISED, PUBLIC_CASE if check.public else RAISED_CASE)
    if check.public:
        return Verdict(False, hidden.words(verdict.message), PUBLIC_CASE)
    return _as_hidden(verdict, public_errors or {})


def _forbidden(error: str | None) -> bool:
    """Whether an outcome's error is the rule's (student code may raise the same words: which
    forbidden name it says is not shown where hidden cases run)."""
    return bool(error) and error.startswith("ForbiddenAPIError: ") and \
        rules.is_rule_message(error.split(": ", 1)[1])


def _raised(error: str | None) -> bool:
    """Whether an outcome's error is an exception of the submission's (not a time limit, which
    the grader's own words name)."""
    return bool(error) and not error.startswith(TIME_LIMIT)


#: How ``public_errors`` keys a public check's masked message (apart from exception types).
_SAID = "said: "
#: What a failing public check says, in a grading that runs hidden cases, instead of its case.
PUBLIC_CASE = ("run check(...) in the notebook (or grade with --public-only) to see this public case "
               "and what your code did with it")


def _as_hidden(verdict, public_errors: dict[str, str]):
    """A failing hidden check's verdict as the student sees it (no exception raised: see
    :func:`judge`): its message with every value masked, and, instead of the case (inputs,
    grids, expected values), the public check that fails the same way, where one does."""
    message = hidden.words(verdict.message)
    same = public_errors.get(_SAID + message)
    if same is not None:
        detail = (f"the public check \"{same}\" fails the same way: run check(...) in the notebook to see "
                  "its case")
    else:
        detail = HIDDEN_CASE
    return Verdict(False, message, detail)


#: What a check says, where hidden cases run, when the submission raised on it: the same words
#: whatever it raised (no type, no message, no line), and the notebook as the place to see it.
RAISED = "your code raised an exception on this check"
FORBIDDEN = (f"something your code called {rules.RULE}; the notes name it where the grader finds it in your "
             "code, and check(...) in the notebook names it")
RAISED_CASE = ("a hidden case: where hidden cases run, feedback names neither the exception's type nor its "
               "message; run the public checks with check(...) in the notebook, or try a case of your own "
               "like this one")
#: What a failing hidden check that no public check reproduces says instead of its case.
HIDDEN_CASE = ("a hidden case: its inputs, sizes and expected values are not shown; no public check fails "
               "this way, so try a case of your own like it in the notebook")


def _judge(check, outcomes: Any, findings, *, timeout: float | None, quoted: bool):
    if isinstance(outcomes, ChannelError):
        return Verdict(False, f"what came back could not be read: {outcomes}")
    if not isinstance(outcomes, list) or len(outcomes) != len(check.calls):
        return Verdict(False, "the grader lost track of this check's results (internal grader error)")
    if not quoted:
        outcomes = [_without_student_text(o) for o in outcomes]
    errors = [o.error for o in outcomes if o.error]
    for err in errors:
        if err.startswith("ForbiddenAPIError: "):
            said = err.split(": ", 1)[1]
            # A class of the submission's own may bear the name: only the rule's own words are shown.
            return Verdict(False, said if quoted or rules.is_rule_message(said) else cut(err))
    for err in errors:
        if err.startswith(TIME_LIMIT):
            if NOT_RUN in err:
                return Verdict(False, "not run: an earlier check used up the exercise's time")
            limit = f" ({timeout:g} s)" if timeout else ""
            return Verdict(False, f"stopped at the time limit{limit}: an infinite loop, or a very slow one?")
    if findings and any(e.startswith(("ImportError", "NameError", "ModuleNotFoundError")) for e in errors):
        return Verdict(False, findings[0].text)
    try:
        verdict = check.judge(check.calls, outcomes)
        if not isinstance(verdict, Verdict):
            raise TypeError(f"the judge returned {type(verdict).__name__}, not a Verdict")
    except Exception as e:  # noqa: BLE001 -- a broken judge must cost one check, not the run
        return Verdict(False, f"internal grader error in this check ({type(e).__name__}: {str(e)[:200]}); "
                              "please report it to the course staff")
    if not verdict.passed and not verdict.skipped:
        where = next((o.where for o in outcomes if o.error and o.where), None)  # hidden: none kept
        if where and where not in verdict.detail:
            verdict.detail = (verdict.detail + "\n" if verdict.detail else "") + f"raised at {where}"
        if not quoted:
            _cut_student_text(verdict, outcomes)
    return verdict


def _cut_student_text(verdict, outcomes) -> None:
    """On a hidden check, the student's own exceptions appear only as "an exception"
    (:func:`grader.errors.cut`): no text student code wrote may carry a hidden case's
    inputs out to the student. Feedback quotes an error only through
    :func:`grader.errors.quoted`, so replacing that quote is enough; the grader's own
    words (the diagnosis, shapes and dtypes, the mask grids) stay."""
    for o in outcomes:
        if not o.error or o.error.startswith(("ForbiddenAPIError", TIME_LIMIT)):
            continue
        whole, short = quoted(o.error), cut(o.error)
        verdict.message = verdict.message.replace(whole, short)
        verdict.detail = verdict.detail.replace(whole, short)


def _plain_name(x: Any) -> Any:
    """A returned value with every type name student code chose (its own classes) made generic."""
    if isinstance(x, NotATensor):
        if x.type_name in _BUILTIN_TYPES:
            return x
        return NotATensor("tensor subclass" if x.type_name.startswith("tensor subclass")
                          else "object of a class the submission defines")
    if type(x) in (tuple, list):
        return type(x)(_plain_name(v) for v in x)
    return x


def _without_student_text(o):
    """An outcome of a hidden check, as judges may quote it: the names of the submission's own
    classes made generic, a failed backward pass reduced to "an exception", and no line
    number (the line that raises can be chosen to say a number). The error itself stays for the
    diagnosis, and :func:`_cut_student_text` cuts its quote."""
    grads = o.grads
    if isinstance(grads, dict) and isinstance(grads.get("error"), str):
        grads = {"error": cut(grads["error"])}
    return dataclasses.replace(o, output=_plain_name(o.output), grads=grads, where=None)


def check_result(check, verdict) -> CheckResult:
    return CheckResult(name=check.name, public=bool(check.public), weight=float(check.weight),
                       kind=check.kind,
                       passed=bool(verdict.passed) and not verdict.skipped, skipped=bool(verdict.skipped),
                       message=str(verdict.message), detail=str(verdict.detail))


def all_not_implemented(outcomes_seen: list[Any]) -> bool:
    errors = [getattr(o, "error", o) for o in outcomes_seen]  # outcomes, or their errors alone
    return bool(errors) and all(is_stub_error(e) for e in errors)
