"""``python -m grader`` as a user runs it: exit codes, files, the terminal report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from grader import engine

ROOT = Path(__file__).parent.parent
SUBMISSIONS = Path(__file__).parent / "submissions"


def run(*args: str, cwd: Path = ROOT, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grader", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=env)


def test_correct_submission_scores_full_marks(tmp_path):
    paths = {k: tmp_path / f"out.{k}" for k in ("json", "xml", "md")}
    p = run(str(SUBMISSIONS / "correct.py"), "--json", str(paths["json"]), "--junit", str(paths["xml"]),
            "--markdown", str(paths["md"]), "--seed", "11")
    assert p.returncode == 0, p.stderr
    data = json.loads(paths["json"].read_text())
    assert data["score"] == data["max_score"] == sum(e.points for e in engine.load_registry().values())
    assert all(t["status"] == "passed" for t in data["tests"])
    assert "seed 11" in data["output"]
    # The terminal report: a table with every exercise, the total and the seed.
    for name in engine.load_registry():
        assert name in p.stdout
    assert "total" in p.stdout and "seed 11" in p.stdout
    assert paths["xml"].read_text().startswith("<?xml") and paths["md"].read_text().startswith("## Grader")


def test_low_score_still_exits_zero(tmp_path):
    p = run(str(ROOT / "exercises" / "ex01_leakage.ipynb"), "--exercise", "causal_mask",
            "--json", str(tmp_path / "r.json"))
    assert p.returncode == 0, p.stderr
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["score"] == 0 and "not implemented yet" in data["tests"][0]["output"]
    assert "not implemented" in p.stdout


def test_missing_path_exits_2_with_results_file(tmp_path):
    p = run(str(tmp_path / "missing.ipynb"), "--json", str(tmp_path / "r.json"))
    assert p.returncode == 2
    assert "does not exist" in p.stderr and "Traceback" not in p.stderr
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["score"] == 0 and "does not exist" in data["output"]


def test_unknown_exercise_exits_2_with_results_file(tmp_path):
    p = run(str(SUBMISSIONS / "correct.py"), "--exercise", "causal_maks", "--json", str(tmp_path / "r.json"))
    assert p.returncode == 2
    assert "unknown exercise 'causal_maks'" in p.stderr and "Traceback" not in p.stderr
    data = json.loads((tmp_path / "r.json").read_text())
    assert "unknown exercise" in data["output"] and data["tests"] == []


def test_bad_option_exits_2_with_results_file(tmp_path):
    p = run(str(SUBMISSIONS / "correct.py"), "--seed", "abc", "--json", str(tmp_path / "r.json"))
    assert p.returncode == 2 and "invalid int value" in p.stderr
    assert "invalid int value" in json.loads((tmp_path / "r.json").read_text())["output"]


def test_bad_seed_in_environment_is_a_usage_error(tmp_path):
    import os

    env = {**os.environ, "GRADER_SEED": "not-a-number"}
    p = run(str(SUBMISSIONS / "correct.py"), "--json", str(tmp_path / "r.json"), env=env)
    assert p.returncode == 2 and "GRADER_SEED" in p.stderr
    assert "GRADER_SEED" in json.loads((tmp_path / "r.json").read_text())["output"]


def test_help_lists_the_options():
    p = run("--help")
    assert p.returncode == 0
    for option in ("--json", "--junit", "--markdown", "--seed", "--exercise", "--public-only"):
        assert option in p.stdout


def test_broken_grader_exits_1_with_results_file(tmp_path, monkeypatch):
    from grader import cli

    def broken():
        raise SyntaxError("invalid syntax in a check module")

    monkeypatch.setattr(engine, "load_registry", broken)
    code = cli.main([str(SUBMISSIONS / "correct.py"), "--json", str(tmp_path / "r.json"), "--quiet"])
    assert code == cli.INTERNAL_ERROR
    data = json.loads((tmp_path / "r.json").read_text())
    assert "internal grader error" in data["output"] and "SyntaxError" in data["output"]
