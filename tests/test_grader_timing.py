"""Where a grading's time goes (``--timing``, :mod:`grader.timing`): each exercise's checks built,
run and judged, and the grading's phases outside them, for the instructor; no hidden check's own
figure, and none of it in what a student sees. Nothing here asserts on a duration: only that the
figures are there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grader import timing
from grader.runners.single import cli
from grader.spec import Outcome

SUBMISSIONS = Path(__file__).parent / "submissions"
EXERCISES = ("causal_mask", "find_leaking_layer")


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """correct.py graded on two exercises with a seed of the instructor's: (timing file, results.json)."""
    out = tmp_path_factory.mktemp("timing")
    only = [a for name in EXERCISES for a in ("--exercise", name)]
    code = cli.main([str(SUBMISSIONS / "correct.py"), "--seed", "4242", "--json", str(out / "results.json"),
                     "--timing", str(out / "timing.json"), "--quiet", *only])
    assert code == 0
    return json.loads((out / "timing.json").read_text()), json.loads((out / "results.json").read_text())


def test_each_exercise_says_its_checks_built_run_and_judged(graded):
    data, results = graded
    assert results["score"] == results["max_score"] > 0
    assert list(data["exercises"]) == list(EXERCISES) and data["execution_time"] > 0
    for entry in data["exercises"].values():
        assert entry["chapter"] == 1
        figures = [entry["total"], entry["build"], *entry["run"].values(), *entry["judge"].values()]
        assert all(set(f) == {"wall", "cpu"} and min(f.values()) >= 0 for f in figures)
        assert set(entry["run"]) == set(entry["judge"]) == {"public", "hidden"}
        assert entry["build"]["wall"] > 0 and entry["run"]["hidden"]["wall"] > 0


def test_the_grading_outside_its_checks_by_phase(graded):
    """The sandbox's phases, the channel and the reports: class mode's per-student overhead."""
    data, _ = graded
    phases = data["phases"]
    assert set(phases) <= set(timing.PHASES) and list(phases) == [p for p in timing.PHASES if p in phases]
    assert {"started", "worker forked", "sandbox ready", "cells loaded", "records read", "worker stopped",
            "reports written"} <= set(phases)
    assert all(set(f) == {"wall", "cpu"} and min(f.values()) >= 0 for f in phases.values())


def test_only_public_checks_have_figures_of_their_own(graded):
    data, results = graded
    for test in results["tests"]:
        name = next(n for n in EXERCISES if n in test["name"])
        lines = [ln[2:].split(" (public)")[0] for ln in test["output"].splitlines() if "(public)" in ln]
        assert lines and set(data["exercises"][name]["public_checks"]) <= set(lines), lines


def _keys(x) -> set[str]:
    if isinstance(x, dict):
        return set(x) | {k for v in x.values() for k in _keys(v)}
    return {k for v in x for k in _keys(v)} if isinstance(x, list) else set()


def test_no_timing_in_what_a_student_sees(graded):
    """results.json (what Gradescope shows, what class mode's feedback.md is written from) holds
    the grading's wall time alone."""
    _, results = graded
    assert not _keys(results) & {"cpu", "wall", "build", "run", "judge", "public_checks", "timing"}


def test_a_hidden_check_adds_to_its_exercise_only():
    spent = timing.ExerciseTiming()
    spent.count("public one", True, [Outcome(seconds=0.5, cpu=0.25)], timing.Spent(0.1, 0.1))
    spent.count("hidden one", False, [Outcome(seconds=2.0, cpu=1.0)] * 2, timing.Spent(0.2, 0.2))
    spent.count("hidden two", False, "a channel error, no outcomes", timing.Spent(0.0, 0.0))
    data = spent.to_dict()
    assert data["run"] == {"public": {"wall": 0.5, "cpu": 0.25}, "hidden": {"wall": 4.0, "cpu": 2.0}}
    assert data["judge"]["hidden"] == {"wall": 0.2, "cpu": 0.2}
    assert list(data["public_checks"]) == ["public one"] and "hidden" not in json.dumps(data["public_checks"])
    assert data["total"] == {"wall": 4.8, "cpu": 2.55}
