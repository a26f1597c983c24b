"""Reports: Gradescope results.json (validated against a schema), JUnit XML,
Markdown, the terminal table; scoring; determinism for a fixed seed."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest
import torch

from grader import engine, report
from grader.results import FAILED, PARTIAL, PASSED, SKIPPED, CheckResult, ExerciseResult, Report
from grader.runners.single import cli

SUBMISSIONS = Path(__file__).parent / "submissions"

#: What Gradescope reads from results.json (the fields we promise, and their types).
GRADESCOPE_SCHEMA = {
    "type": "object",
    "required": ["score", "max_score", "output", "execution_time", "tests"],
    "properties": {
        "score": {"type": "number", "minimum": 0},
        "max_score": {"type": "number", "minimum": 0},
        "output": {"type": "string"},
        "execution_time": {"type": "number", "minimum": 0},
        "visibility": {"enum": ["hidden", "after_due_date", "after_published", "visible"]},
        "stdout_visibility": {"enum": ["hidden", "after_due_date", "after_published", "visible"]},
        "tests": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "score", "max_score", "output", "visibility", "status"],
                "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "score": {"type": "number", "minimum": 0},
                    "max_score": {"type": "number", "minimum": 0},
                    "output": {"type": "string"},
                    "visibility": {"enum": ["hidden", "after_due_date", "after_published", "visible"]},
                    "status": {"enum": ["passed", "failed"]},
                },
            },
        },
    },
}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """mistakes.py graded twice with one seed (all formats), once with another seed (two exercises)."""
    out = tmp_path_factory.mktemp("reports")
    runs = {}
    for tag, seed, only in (("a", 7, []), ("b", 7, []), ("c", 8, ["--exercise", "causal_mask",
                                                                   "--exercise", "padding_mask"])):
        paths = {k: out / f"{tag}.{k}" for k in ("json", "xml", "md")}
        code = cli.main([str(SUBMISSIONS / "mistakes.py"), "--seed", str(seed), "--json", str(paths["json"]),
                         "--junit", str(paths["xml"]), "--markdown", str(paths["md"]), "--quiet", *only])
        assert code == 0
        runs[tag] = {k: p.read_text() for k, p in paths.items()}
    return runs


def _comparable(text: str) -> dict:
    data = json.loads(text)
    data.pop("execution_time")
    return data


@pytest.mark.slow
def test_results_json_validates_against_the_gradescope_schema(graded):
    data = json.loads(graded["a"]["json"])
    jsonschema.validate(data, GRADESCOPE_SCHEMA)
    names = list(engine.load_registry())
    assert len(data["tests"]) == len(names)
    for test, name in zip(data["tests"], names):
        assert name in test["name"]
        assert test["status"] == ("passed" if test["score"] == test["max_score"] else "failed")
    assert data["score"] == pytest.approx(sum(t["score"] for t in data["tests"]))
    assert data["max_score"] == pytest.approx(sum(t["max_score"] for t in data["tests"]))
    assert 0 < data["score"] < data["max_score"]


@pytest.mark.slow
def test_same_seed_same_results_file(graded):
    assert _comparable(graded["a"]["json"]) == _comparable(graded["b"]["json"])
    assert graded["a"]["xml"] == graded["b"]["xml"]
    assert graded["a"]["md"] == graded["b"]["md"]


@pytest.mark.slow
def test_the_seed_is_in_every_report(graded):
    for tag, seed in (("a", 7), ("c", 8)):
        run = graded[tag]
        assert f"seed {seed}" in json.loads(run["json"])["output"]
        assert f"seed {seed}" in run["md"]
        props = {p.get("name"): p.get("value") for p in ET.fromstring(run["xml"]).iter("property")}
        assert props["seed"] == str(seed)


@pytest.mark.slow
def test_exercise_option_grades_only_those(graded):
    c = _comparable(graded["c"]["json"])
    assert [t["name"].split()[0] for t in c["tests"]] == ["causal_mask", "padding_mask"]
    assert c["max_score"] == sum(t["max_score"] for t in c["tests"])


@pytest.mark.slow
def test_junit_xml_parses_and_counts_add_up(graded):
    root = ET.fromstring(graded["a"]["xml"])
    assert root.tag == "testsuites"
    suites = root.findall("testsuite")
    assert [s.get("name") for s in suites] == list(engine.load_registry())
    for suite in suites:
        cases = suite.findall("testcase")
        assert int(suite.get("tests")) == len(cases) > 0
        assert int(suite.get("failures")) == sum(c.find("failure") is not None for c in cases)
        assert int(suite.get("skipped")) == sum(c.find("skipped") is not None for c in cases)
    assert int(root.get("failures")) > 0
    failure = root.find(".//failure")
    assert failure.get("message")


@pytest.mark.slow
def test_markdown_summary_has_the_table_and_feedback(graded):
    md = graded["a"]["md"]
    assert md.startswith("## Grader: ")
    assert "| exercise | score | status | first failing property |" in md
    assert "| `causal_mask` |" in md and "diagonal" in md
    assert "<details>" in md


@pytest.mark.slow
def test_cuda_checks_are_skipped_visibly_not_counted(graded):
    data = json.loads(graded["a"]["json"])
    cuda_lines = [line for t in data["tests"] for line in t["output"].splitlines() if "on CUDA" in line]
    assert cuda_lines, "the registry has CUDA checks"
    if torch.cuda.is_available():
        assert not any("skipped" in line for line in cuda_lines)
    else:
        assert all("skipped" in line and "CUDA" in line for line in cuda_lines)
        # influence_matrix is correct in mistakes.py: full marks despite its skipped check.
        infl = next(t for t in data["tests"] if "influence_matrix" in t["name"])
        assert infl["score"] == infl["max_score"]


def test_public_only_runs_only_public_checks(tmp_path):
    out = tmp_path / "r.json"
    assert cli.main([str(SUBMISSIONS / "correct.py"), "--public-only", "--exercise", "attention",
                     "--json", str(out), "--quiet"]) == 0
    data = json.loads(out.read_text())
    lines = [ln for ln in data["tests"][0]["output"].splitlines() if ln[:1] in "✓✗–"]
    assert lines and all("(public)" in ln for ln in lines)
    assert "public checks only" in data["output"]


def test_terminal_report_table_and_feedback(capsys):
    r = _report()
    report.print_terminal(r)
    out = capsys.readouterr().out
    for text in ("exercise", "first failing property", "causal_mask", "5 / 10", "partial",
                 "seed 3", "query 0 sees key 1", "not found"):
        assert text in out, text


# --------------------------------------------------------------------------- scoring


def _check(name: str, passed: bool, weight: float = 1.0, skipped: bool = False) -> CheckResult:
    return CheckResult(name, public=True, weight=weight, passed=passed, skipped=skipped,
                       message="" if passed else "query 0 sees key 1")


def _report() -> Report:
    checks = [_check("upper triangle", False), _check("shape", True)]
    a = ExerciseResult("causal_mask", 1, 10.0, checks=checks)
    b = ExerciseResult("padding_mask", 3, 5.0, status="not found", message="not found: no padding_mask")
    for e in (a, b):
        e.finish()
    return Report("sub.py", seed=3, exercises=[a, b])


def test_partial_credit_is_weighted_and_skips_are_not_counted():
    e = ExerciseResult("x", 1, 10.0, checks=[_check("a", True, 3), _check("b", False, 1),
                                              _check("c", False, 5, skipped=True)])
    e.finish()
    assert (e.score, e.status) == (7.5, PARTIAL)
    e = ExerciseResult("x", 1, 10.0, checks=[_check("a", True), _check("c", False, skipped=True)])
    e.finish()
    assert (e.score, e.status) == (10.0, PASSED)
    e = ExerciseResult("x", 1, 10.0, checks=[_check("a", False)])
    e.finish()
    assert (e.score, e.status) == (0.0, FAILED)
    e = ExerciseResult("x", 1, 10.0, checks=[_check("c", False, skipped=True)])
    e.finish()
    assert (e.score, e.max_score, e.status) == (0.0, 0.0, SKIPPED)


def test_report_totals_and_dict_leave_out_timings():
    r = _report()
    r.execution_time = 12.3
    assert (r.score, r.max_score) == (5.0, 15.0)
    assert "execution_time" not in json.dumps(r.to_dict())
    data = report.gradescope(r)
    jsonschema.validate(data, GRADESCOPE_SCHEMA)
    assert data["execution_time"] == 12.3


def test_usage_failure_file_is_valid(tmp_path):
    report.failure_json("bad flag", tmp_path / "r.json")
    data = json.loads((tmp_path / "r.json").read_text())
    jsonschema.validate(data, GRADESCOPE_SCHEMA)
    assert data["output"] == "bad flag"


def test_markdown_appends_to_the_step_summary_only(tmp_path, monkeypatch):
    summary = tmp_path / "step_summary"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    report.write_markdown(_report(), summary)
    assert summary.read_text().startswith("earlier step\n## Grader: 5 / 15")
    other = tmp_path / "summary.md"
    other.write_text("old\n")
    report.write_markdown(_report(), other)
    assert other.read_text().startswith("## Grader: 5 / 15")


def test_short_terminal_report_says_a_diagnosis_once_and_what_is_next(capsys):
    same = "mask: the diagonal is missing"
    checks = [CheckResult(f"case {i}", public=i == 0, weight=1.0, passed=False, message=same,
                          detail="expected   got\n■ ·        · ·") for i in range(3)]
    checks += [CheckResult("dtype", public=False, weight=1.0, passed=False, kind="property",
                           message="returns torch.int64, not torch.bool"),
               CheckResult("shape", public=True, weight=1.0, passed=True)]
    a = ExerciseResult("causal_mask", 1, 5.0, checks=checks)
    b = ExerciseResult("padding_mask", 3, 5.0, checks=[_check("shape", True)])
    for e in (a, b):
        e.finish()
    r = Report("exercises/", seed=3, exercises=[a, b])
    from rich.console import Console

    report.print_terminal(r, Console(width=160))
    out = capsys.readouterr().out
    assert out.count("expected   got") == 1 and out.count("returns torch.int64") == 0
    assert "the same diagnosis explains 3 of the 4 failing checks; --verbose lists the 1 other" in out
    assert out.rstrip().splitlines()[-1] == "next: exercise 1.1 causal_mask in ex01_leakage.ipynb"
    report.print_terminal(r, Console(width=160), verbose=True)
    out = capsys.readouterr().out
    assert out.count("expected   got") == 3 and "returns torch.int64" in out


def test_the_short_table_is_cut_to_a_terminal_but_whole_in_a_pipe():
    """Piped to a file or `less` nothing wraps, so nothing is cut ("first failing pr…" was)."""
    import io

    from rich.console import Console

    long = "mask: the triangle is on the wrong side: query i may see keys j <= i (the past), not j >= i"
    e = ExerciseResult("causal_mask", 1, 5.0, checks=[CheckResult("case", public=True, weight=1.0,
                                                                  passed=False, message=long)])
    e.finish()
    r = Report("exercises/", seed=3, exercises=[e])
    piped = io.StringIO()
    report.print_terminal(r, Console(file=piped, width=60))
    table = piped.getvalue().split("\n✗", 1)[0]  # the table, before the diagnosis
    assert long in table and "first failing property" in table and "…" not in table
    shown = io.StringIO()
    report.print_terminal(r, Console(file=shown, width=60, force_terminal=True))
    lines = re.sub(r"\x1b\[[0-9;]*m", "", shown.getvalue()).split("\n✗", 1)[0].splitlines()
    assert "…" in "\n".join(lines) and all(len(line) <= 60 for line in lines)


def test_next_step_when_everything_passes():
    from grader import terminal

    e = ExerciseResult("padding_mask", 3, 5.0, checks=[_check("shape", True)])
    e.finish()
    assert terminal.next_step(Report("x.py", seed=0, exercises=[e])).startswith("next: nothing to fix")
    assert terminal.number(e) == "3.1" and terminal.notebook_of(9, "nowhere/") == "ex09_real_models.ipynb"


@pytest.mark.parametrize("verbose", [False, True])
def test_nothing_a_submission_wrote_drives_the_terminal(capsys, verbose):
    """Printed output, error messages, notes and file names reach the terminal report as text:
    an escape that clears the screen, a carriage return that overwrites the total, a C1 control
    or a bidirectional override is taken out, and the words around it stay."""
    from rich.console import Console

    fake = "\x1b[2J\x1b[H\x1b[1;32mScore 100 / 100\x1b[0m\rTOTAL\x9b2J \u202eA\x07\x08"
    r = _report()
    r.exercises[0].checks[0].message = r.exercises[0].message = f"it raised ValueError: {fake}"
    r.exercises[0].checks[0].detail = fake
    r.notes, r.output, r.submission = [f"skipped: {fake}"], f"{fake}\nlast line", f"sub\x1b[2J{fake}.py"
    report.print_terminal(r, Console(width=160, force_terminal=True), verbose=verbose)
    out = capsys.readouterr().out
    assert "Score 100 / 100" in out and "TOTAL" in out  # the text is shown, as text
    styled = re.sub(r"\x1b\[[0-9;]*m", "", out)  # the report's own colours (SGR) are its own
    for control in ("\x1b", "\r", "\x9b", "\u202e", "\x07", "\x08"):
        assert control not in styled, repr(control)
