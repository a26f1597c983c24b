"""Chapter 13's kernels graded in class mode, whose zygote imports triton once for its workers (with
TRITON_INTERPRET=1 first where there is no NVIDIA driver): the course's kernels keep full marks, and a
chapter 1 notebook beside them too."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest

from grader.devices import triton_available
from grader.runners.classmode import classroom

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.skipif(not triton_available(), reason="triton (the [kernels] extra) is not installed")
def test_class_mode_grades_the_kernels_with_full_marks(tmp_path, monkeypatch):
    monkeypatch.setattr(classroom, "grader_fingerprint", lambda: "pinned")
    subs = tmp_path / "subs"
    for student in ("ada", "ben"):
        (subs / student).mkdir(parents=True)
        for name in ("ex13_masks_in_a_kernel.ipynb", "ex01_leakage.ipynb"):
            shutil.copy2(ROOT / "solutions" / name, subs / student / name)
    out = tmp_path / "out"
    argv = [str(subs), "--out", str(out), "--jobs", "2", "--seed", "9", "--no-progress"]
    for name in ("block_sparse_forward", "block_sparse_backward", "causal_mask"):
        argv += ["--exercise", name]
    assert classroom.main(argv) == 0
    with open(out / "grades.csv", newline="") as f:
        rows = {r["student"]: r for r in csv.DictReader(f)}
    for student in ("ada", "ben"):
        row = rows[student]
        assert row["status"] == "graded" and row["total"] == row["max"], row
        assert float(row["block_sparse_forward"]) > 0 and float(row["block_sparse_backward"]) > 0
