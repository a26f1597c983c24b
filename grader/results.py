"""What grading produced: per-check verdicts, per-exercise scores, the report.

Plain dataclasses, shared by the CLI (:mod:`grader.engine`), the in-notebook
check (:mod:`grader.runners.single.notebook`) and whatever grades a whole class. Timings are
kept apart (``execution_time``, ``timing``) so that :meth:`Report.to_dict` is the same for
two runs with the same seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .timing import Timing

PASSED = "passed"
PARTIAL = "partial"
FAILED = "failed"
NOT_FOUND = "not found"
NOT_IMPLEMENTED = "not implemented"
CRASHED = "crashed"
TIMED_OUT = "timed out"
SKIPPED = "skipped"
GRADER_ERROR = "grader error"

NOT_IMPLEMENTED_MESSAGE = "not implemented yet"


@dataclass
class CheckResult:
    name: str
    public: bool
    weight: float
    passed: bool
    skipped: bool = False
    message: str = ""
    detail: str = ""
    kind: str = "value"  # "value" / "edge" earn points; "property" only takes them away (score_of)

    @property
    def status(self) -> str:
        return SKIPPED if self.skipped else PASSED if self.passed else FAILED

    @property
    def line(self) -> str:
        """``name: message`` in one line."""
        return f"{self.name}: {self.message}" if self.message else self.name


def score_of(checks: list[CheckResult]) -> float:
    """The share of an exercise's points that its checks earn, in [0, 1].

    Points come only from checks whose outputs are compared with the reference:
    the passed share of their weight. Of those, only a *general* case earns alone: a
    hidden *value* check, drawn from the seed. A public value check (its case and its
    answer are in the student template: a lookup table passes it) and an *edge* check
    (n = 1, one document, a window wider than the sequence: a case a constant or a
    simpler mask gets right by accident, or a mask so small that a blind guess matches
    it) earn only once a general case passes. Where there is no hidden value check
    (a public-only grading), the public value checks are the general cases; where there
    is no value check at all, edge checks stand alone. Each failed *property* check
    (dtype, device, inputs unchanged, an invariance: things a constant function meets
    for free) then takes away its share of the weight of all the checks. So code whose
    general cases are all wrong scores 0 whatever else it does, and code that is right
    but, say, modifies its inputs loses what that check is worth. Skipped checks count
    for neither.
    """
    counted = [c for c in checks if not c.skipped]
    compared = [c for c in counted if c.kind in ("value", "edge")]
    if not compared:
        return 0.0
    values = [c for c in compared if c.kind == "value"]
    general = [c for c in values if not c.public] or values
    general_passes = any(c.passed for c in general) or not general
    alone = {id(c) for c in general}
    earned = sum(c.weight for c in compared if c.passed and (general_passes or id(c) in alone))
    lost = sum(c.weight for c in counted if c.kind == "property" and not c.passed)
    return max(0.0, earned / sum(c.weight for c in compared) - lost / sum(c.weight for c in counted))


@dataclass
class ExerciseResult:
    name: str
    chapter: int
    max_score: float
    score: float = 0.0
    status: str = FAILED
    message: str = ""  # the first failing property, or why nothing ran
    checks: list[CheckResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # rule findings, where the function was found
    found_at: str | None = None

    @property
    def first_failure(self) -> CheckResult | None:
        return next((c for c in self.checks if not c.passed and not c.skipped), None)

    @property
    def skipped_checks(self) -> list[CheckResult]:
        return [c for c in self.checks if c.skipped]

    def finish(self) -> None:
        """Score from the verdicts (:func:`score_of`), then the status and its message.

        A status already set to something final (not found, crashed, ...) is kept;
        its score still counts the value checks that passed before things went wrong.
        """
        counted = [c for c in self.checks if not c.skipped]
        values = [c for c in counted if c.kind in ("value", "edge")]
        self.score = round(self.max_score * score_of(self.checks), 2)
        if self.status in (NOT_FOUND, NOT_IMPLEMENTED, GRADER_ERROR):
            self.score = 0.0
            return
        if self.status in (CRASHED, TIMED_OUT):
            return
        if self.checks and not values:
            # Nothing could be compared here: the exercise counts neither for nor against.
            self.status, self.message = SKIPPED, (self.skipped_checks[0].message if self.skipped_checks
                                                  else "every check needs hardware this machine lacks")
            self.max_score, self.score = 0.0, 0.0
        elif all(c.passed for c in counted):
            self.status, self.message = PASSED, ""
        else:
            self.status = PARTIAL if self.score > 0 else FAILED
            first = self.first_failure
            self.message = first.line if first else self.message

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "chapter": self.chapter, "score": self.score, "max_score": self.max_score,
            "status": self.status, "message": self.message, "found_at": self.found_at,
            "notes": list(self.notes),
            "checks": [{"name": c.name, "status": c.status, "public": c.public, "weight": c.weight,
                        "kind": c.kind,
                        "message": c.message, "detail": c.detail} for c in self.checks],
        }


@dataclass
class Report:
    submission: str
    seed: int
    public_only: bool = False
    exercises: list[ExerciseResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # problems reading or running the submission
    output: str = ""  # what the student's code printed, truncated
    error: str | None = None  # why nothing could be graded
    usage_error: bool = False  # the caller's mistake (e.g. a path that does not exist)
    internal_error: bool = False  # the grader's own mistake (e.g. its checks do not import)
    #: what kept the seed and the reference answers from student code (grader.sandbox.namespaces.isolation);
    #: empty when no student code ran
    isolation: dict[str, Any] = field(default_factory=dict)
    execution_time: float = 0.0  # seconds; not part of to_dict()
    #: where the grading's time went (grader.timing): the instructor's (``--timing``), not part
    #: of to_dict() nor of anything a student sees
    timing: Timing = field(default_factory=Timing)

    @property
    def score(self) -> float:
        return round(sum(e.score for e in self.exercises), 2)

    @property
    def max_score(self) -> float:
        return round(sum(e.max_score for e in self.exercises), 2)

    @property
    def checks_kind(self) -> str:
        return "public checks only" if self.public_only else "public and hidden checks"

    def exercise(self, name: str) -> ExerciseResult:
        for e in self.exercises:
            if e.name == name:
                return e
        raise KeyError(f"no exercise {name!r} in this report; graded: {[e.name for e in self.exercises]}")

    def to_dict(self) -> dict[str, Any]:
        """Everything but timings: equal for two runs with the same submission and seed."""
        return {
            "submission": self.submission, "seed": self.seed, "public_only": self.public_only,
            "score": self.score, "max_score": self.max_score, "error": self.error,
            "notes": list(self.notes), "output": self.output, "isolation": dict(self.isolation),
            "exercises": [e.to_dict() for e in self.exercises],
        }


def protected(isolation: dict[str, Any]) -> bool:
    """Whether a report's isolation block says the seed and the reference answers were both
    kept from student code."""
    return isolation.get("seed_protected") is True and isolation.get("references_protected") is True
