"""``python -m grader class --timing DIR``: each grading's timing in DIR, the class's summary beside
it, nothing of it in what a student sees; the summary reads hostile files without failing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import nbformat
import pytest

from grader.runners.classmode import classroom, classtiming
from grader.timing import PHASES

REPO = Path(__file__).resolve().parent.parent


def _ex01(folder: Path, *, bug: bool = False) -> None:
    """Chapter 1's solution notebook, with the diagonal left out of causal_mask when ``bug``."""
    nb = nbformat.read(REPO / "solutions" / "ex01_leakage.ipynb", as_version=4)
    for cell in nb.cells:
        if bug and cell.cell_type == "code":
            cell.source = cell.source.replace("pos[None, :] <= pos[:, None]", "pos[None, :] < pos[:, None]")
    folder.mkdir(parents=True)
    nbformat.write(nb, folder / "ex01_leakage.ipynb")


@pytest.mark.slow
def test_each_grading_writes_its_timing_and_the_class_a_summary(tmp_path, monkeypatch):
    monkeypatch.setattr(classroom, "grader_fingerprint", lambda: "pinned")
    subs, out, timing = tmp_path / "subs", tmp_path / "out", tmp_path / "timing"
    _ex01(subs / "alice")
    _ex01(subs / "bob", bug=True)
    argv = [str(subs), "--out", str(out), "--jobs", "2", "--seed", "3", "--exercise", "causal_mask",
            "--no-progress", "--timing", str(timing)]
    assert classroom.main(argv) == 0
    score = lambda name: json.loads((out / name / "results.json").read_text())["score"]  # noqa: E731
    assert score("bob") < score("alice")  # the bug was planted
    assert oct(timing.stat().st_mode & 0o777) == "0o700"
    for name in ("alice", "bob"):
        record = json.loads((timing / f"{name}.json").read_text())
        assert {"worker forked", "sandbox ready", "records read", "reports written"} <= set(record["phases"])
        spent = record["exercises"]["causal_mask"]["total"]
        assert spent["cpu"] > 0 and spent["wall"] > 0
        # nothing of it where the student's files are (their results, feedback and log)
        for path in (out / name).rglob("*"):
            if path.is_file():
                assert "sandbox ready" not in path.read_text(errors="replace"), path
    summary = (timing / "summary.md").read_text()
    assert "| causal_mask | 2 |" in summary
    assert "| sandbox ready | 2 |" in summary
    # the timing path is not part of what decides a regrade: the same class again grades nobody
    rerun = classroom.grade_class(subs, out, jobs=2, seed=3, progress=False,
                                  extra=["--exercise", "causal_mask"], timing=tmp_path / "timing2")
    assert all(r.skipped for r in rerun)


def test_the_summary_takes_the_medians_and_skips_what_is_not_a_timing(tmp_path):
    def record(cpu: float) -> dict:
        return {"phases": {"sandbox ready": {"wall": 2 * cpu, "cpu": cpu}, "made up": {"wall": 1, "cpu": 1}},
                "exercises": {"causal_mask": {"total": {"wall": cpu, "cpu": cpu}},
                              "x | y": {"total": {"wall": 1, "cpu": 1}}}}

    for slug, cpu in (("a", 0.1), ("b", 0.3), ("c", 0.2)):
        (tmp_path / f"{slug}.json").write_text(json.dumps(record(cpu)))
    (tmp_path / "d.json").write_bytes(b"\xff not json")
    (tmp_path / "e.json").write_text("[" * 100_000)  # deeper than the parser goes
    (tmp_path / "f.json").write_text(json.dumps({"phases": {"sandbox ready": {"wall": "x", "cpu": -1}},
                                                 "exercises": [1, 2]}))
    with open(tmp_path / "g.json", "wb") as f:  # over the size read: never parsed
        f.write(b'{"phases": {}, "pad": "' + b"x" * (classtiming.MAX_BYTES + 10) + b'"}')
    os.symlink("/dev/zero", tmp_path / "h.json")
    path = classtiming.summarize(tmp_path, ["a", "b", "c", "d", "e", "f", "g", "h", "missing"])
    text = path.read_text()
    assert "4 students' timings" in text  # a, b, c and f (a dict with nothing usable)
    assert "| sandbox ready | 3 | 0.400 | 0.200 | 0.300 |" in text
    assert "| causal_mask | 3 | 0.200 | 0.200 | 0.300 |" in text
    assert "made up" not in text and "x | y" not in text
    assert set(PHASES) >= {"sandbox ready"}
