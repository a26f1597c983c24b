"""Without triton (the [kernels] extra), the grader skips chapter 13's exercises with a one-line
note on what to install, and grades the rest: they count neither for nor against."""

from __future__ import annotations

from pathlib import Path

from grader import engine
from grader.checks.ch13_kernels import KERNEL_EXERCISES

ROOT = Path(__file__).resolve().parents[1]


def test_kernel_exercises_are_skipped_with_the_install_line(monkeypatch):
    monkeypatch.setattr(engine, "triton_available", lambda: False)
    report = engine.grade(ROOT / "solutions" / "ex13_masks_in_a_kernel.ipynb", public_only=True,
                          exercises=list(KERNEL_EXERCISES))
    by_name = {e.name: e for e in report.exercises}
    assert set(by_name) == set(KERNEL_EXERCISES)
    for e in by_name.values():
        assert e.status == "skipped" and e.max_score == 0 and e.score == 0, (e.name, e.status)
        assert e.message == engine.NEEDS_TRITON
        assert "pip install -r requirements-kernels.txt" in e.message and "\n" not in e.message
        assert e.checks and all(c.skipped for c in e.checks)
