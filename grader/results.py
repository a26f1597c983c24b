"""What grading produced: per-check verdicts, per-exercise scores, the report.

Plain dataclasses, shared by the CLI (:mod:`grader.engine`), the in-notebook
check (:mod:`grader.notebook`) and whatever grades a whole class. Timings are
kept apart (``execution_time``) so that :meth:`Report.to_dict` is the same for
two runs with the same seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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

    @property
    def status(self) -> str:
        return SKIPPED if self.skipped else PASSED if self.passed else FAILED

    @property
    def line(self) -> str:
        """``name: message`` in one line."""
        return f"{self.name}: {self.message}" if self.message else self.name


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
        """Score from the verdicts: points x passed weight / weight of the checks not skipped.

        A status already set to something final (not found, crashed, ...) is kept;
        its score still counts the checks that passed before things went wrong.
        """
        counted = [c for c in self.checks if not c.skipped]
        total = sum(c.weight for c in counted)
        passed = sum(c.weight for c in counted if c.passed)
        self.score = round(self.max_score * passed / total, 2) if total > 0 else 0.0
        if self.status in (NOT_FOUND, NOT_IMPLEMENTED, GRADER_ERROR):
            self.score = 0.0
            return
        if self.status in (CRASHED, TIMED_OUT):
            return
        if self.checks and not counted:
            # Nothing could be checked here: the exercise counts neither for nor against.
            self.status, self.message = SKIPPED, "every check needs hardware this machine lacks"
            self.max_score = 0.0
        elif counted and passed == total:
            self.status, self.message = PASSED, ""
        else:
            self.status = PARTIAL if passed > 0 else FAILED
            first = self.first_failure
            self.message = first.line if first else self.message

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "chapter": self.chapter, "score": self.score, "max_score": self.max_score,
            "status": self.status, "message": self.message, "found_at": self.found_at,
            "notes": list(self.notes),
            "checks": [{"name": c.name, "status": c.status, "public": c.public, "weight": c.weight,
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
    execution_time: float = 0.0  # seconds; not part of to_dict()

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
            "notes": list(self.notes), "output": self.output,
            "exercises": [e.to_dict() for e in self.exercises],
        }
