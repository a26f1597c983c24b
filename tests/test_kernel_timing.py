"""grader.kernel_timing: the harness runs (in Triton's interpreter, at a tiny size: no speed is
asserted) and the leaderboard ranks recorded timings, correct submissions only."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from grader import kernel_timing as kt

FIXTURE = Path(__file__).parent / "data" / "kernel_timings.json"


def _recorded():
    data = json.loads(FIXTURE.read_text())
    return data["records"], data["references"]


def _rows(table: str) -> list[list[str]]:
    lines = [line for line in table.splitlines() if line.startswith("|")][2:]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


def test_leaderboard_ranks_correct_submissions_by_total_time():
    records, refs = _recorded()
    rows = _rows(kt.leaderboard(records, refs))
    totals = {r["name"]: r["forward_ms"] + r["backward_ms"] for r in records if r["correct"]}
    expected = sorted(totals, key=lambda n: (totals[n], n))
    assert [r[1] for r in rows if r[0].isdigit()] == expected
    assert [r[0] for r in rows if r[0].isdigit()] == [str(i) for i in range(1, len(expected) + 1)]


def test_a_wrong_submission_is_listed_but_never_ranked_however_fast():
    records, refs = _recorded()
    rows = _rows(kt.leaderboard(records, refs))
    wrong = [r["name"] for r in records if not r["correct"]]
    assert wrong and all(any(row[1] == n and row[0] == "–" for row in rows) for n in wrong)


def test_references_head_the_table_and_ratios_are_to_the_course_kernel():
    records, refs = _recorded()
    rows = _rows(kt.leaderboard(records, refs))
    assert [r[1] for r in rows if r[0] == "ref"] == [f"*{n}*" for n in refs]
    course = refs["course"]["forward_ms"] + refs["course"]["backward_ms"]
    first = next(r for r in rows if r[0] == "1")
    assert first[5] == f"{float(first[4]) / course:.2f}x"


def test_leaderboard_figure_is_written(tmp_path):
    records, refs = _recorded()
    path = kt.leaderboard_figure(records, tmp_path / "board.png", refs)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_harness_times_the_course_kernels_in_the_interpreter():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    pytest.importorskip("triton")
    from attnmask.kernels import block_sparse_backward, block_sparse_forward

    got = kt.time_kernels(block_sparse_forward, block_sparse_backward, kt.TINY_SIZE, "cpu", repeats=1,
                          dtype=kt.torch.float32)
    assert set(got) == {"forward_ms", "backward_ms"}
    assert all(math.isfinite(t) and t > 0 for t in got.values())
    refs = kt.reference_timings(kt.TINY_SIZE, "cpu", repeats=1)
    assert list(refs) == ["course"]  # FlexAttention is timed on CUDA only
