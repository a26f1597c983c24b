"""Reading a grading's results.json (Gradescope format) and scoring it for class mode.

Totals, per-exercise scores and the one-line summary of what cost a student points
are what ``grades.csv``, the class summary and GitHub Classroom's points are made of.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...results import protected

#: How the engine's feedback begins for an exercise the submission does not define.
NOT_DEFINED = "not found: the submission defines no function named"


def read_results(path: Path) -> dict[str, Any] | None:
    """A results.json as written by the engine, or None when missing or not valid."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("tests", []), list):
        return None
    if "score" not in data and not data.get("tests"):
        return None
    return data


def failure_results(message: str) -> dict[str, Any]:
    """A valid Gradescope results.json for a submission the grader could not grade."""
    return {"score": 0.0, "output": message, "tests": [], "extra_data": {"failure": message}}


def total_score(results: dict[str, Any]) -> float:
    if "score" in results:
        return float(results["score"])
    return float(sum(float(t.get("score", 0) or 0) for t in results.get("tests", [])))


def max_score(results: dict[str, Any]) -> float | None:
    if results.get("max_score") is not None:
        return float(results["max_score"])
    tests = results.get("tests", [])
    if tests and all(t.get("max_score") is not None for t in tests):
        return float(sum(float(t["max_score"]) for t in tests))
    return None


def exercise_of(test_name: str, exercises: Sequence[str]) -> str | None:
    """The contract function a test entry is about: its name contains the function name
    as a whole identifier ("attention" does not match "multi_head_attention")."""
    hits = [e for e in exercises if re.search(rf"(?<![A-Za-z0-9_]){re.escape(e)}(?![A-Za-z0-9_])", test_name)]
    return max(hits, key=len) if hits else None


def per_exercise(results: dict[str, Any], exercises: Sequence[str]) -> dict[str, float]:
    scores: dict[str, float] = {}
    for t in results.get("tests", []):
        ex = exercise_of(str(t.get("name", "")), exercises)
        if ex is not None:
            scores[ex] = scores.get(ex, 0.0) + float(t.get("score", 0) or 0)
    return scores


def isolation(results: dict[str, Any]) -> str:
    """grades.csv's word on the sandbox, from the report's isolation block (what the worker
    measured from inside): "held", "NOT HELD: why", or "" where the report has none."""
    block = (results.get("extra_data") or {}).get("isolation") or {}
    if not isinstance(block, dict) or not block:
        return ""
    if protected(block):
        return "held"
    return f"NOT HELD: {str(block.get('why', ''))[:120]}"


def summarize(results: dict[str, Any], exercises: Sequence[str], limit: int = 300) -> str:
    """One line: what cost the student points, after the grader's notes on the whole
    submission (e.g. a file that ran too long at import), which say why better. Exercises
    the submission does not define are named together, all of them, past ``limit``."""
    notes = [ln.strip() for ln in str(results.get("output", "")).splitlines()
             if ln.strip().lower().startswith(("note:", "error:", "warning:"))]
    lost, absent = [], []
    for t in results.get("tests", []):
        score, top = float(t.get("score", 0) or 0), t.get("max_score")
        if top is not None and score < float(top):
            first = next((ln.strip() for ln in str(t.get("output", "")).splitlines() if ln.strip()), "")
            ex = exercise_of(str(t.get("name", "")), exercises) or str(t.get("name", "?"))
            if first.startswith(NOT_DEFINED):
                absent.append(ex)
            else:
                lost.append(f"{ex}: {first}" if first else ex)
    if not lost and not absent:
        if not results.get("tests") and results.get("output"):
            return str(results["output"]).strip().splitlines()[0][:limit]
        return "full marks"
    line = "; ".join(notes + lost)
    line = line if len(line) <= limit else line[: limit - 1] + "…"
    if absent:
        line = "; ".join(filter(None, [f"not found ({len(absent)} of {len(exercises)}): {', '.join(absent)}",
                                       line]))
    return line


def _fmt(x: float | None) -> str:
    return "" if x is None else f"{x:.2f}".rstrip("0").rstrip(".")


def contract_exercises() -> tuple[str, ...]:
    """``attnmask.CONTRACT``, read from the source: importing attnmask imports torch, which
    would cost class mode seconds of serial start-up before any worker starts."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec("attnmask")
    if spec is not None and spec.origin:
        for node in ast.parse(Path(spec.origin).read_text()).body:
            names = [getattr(t, "id", None) for t in getattr(node, "targets", [])]
            if isinstance(node, ast.Assign) and "CONTRACT" in names:
                return tuple(ast.literal_eval(node.value))
    from attnmask import CONTRACT

    return tuple(CONTRACT)
