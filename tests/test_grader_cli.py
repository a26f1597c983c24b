"""``python -m grader`` as a user runs it: exit codes, files, the terminal report."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grader import engine
from grader.report import fmt_points

ROOT = Path(__file__).parent.parent
SUBMISSIONS = Path(__file__).parent / "submissions"


def run(*args: str, cwd: Path = ROOT, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grader", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=env)


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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
    from grader.runners.single import cli

    def broken():
        raise SyntaxError("invalid syntax in a check module")

    monkeypatch.setattr(engine, "load_registry", broken)
    code = cli.main([str(SUBMISSIONS / "correct.py"), "--json", str(tmp_path / "r.json"), "--quiet"])
    assert code == cli.INTERNAL_ERROR
    data = json.loads((tmp_path / "r.json").read_text())
    assert "internal grader error" in data["output"] and "SyntaxError" in data["output"]


# --------------------------------------------------------------------------- what one file is graded on


def _points(chapter: int | None = None) -> float:
    return sum(ex.points for ex in engine.load_registry().values() if chapter in (None, ex.chapter))


@pytest.mark.slow
def test_a_chapter_notebook_is_graded_on_its_chapter(tmp_path):
    p = run(str(ROOT / "solutions" / "ex01_leakage.ipynb"), "--json", str(tmp_path / "r.json"))
    assert p.returncode == 0, p.stderr
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["score"] == data["max_score"] == _points(1)
    chapter_1 = sorted(name for name, ex in engine.load_registry().items() if ex.chapter == 1)
    assert sorted(t["name"].split()[0] for t in data["tests"]) == chapter_1
    assert "not found" not in p.stdout
    assert "total (chapter 1)" in p.stdout
    total = f"course total: {fmt_points(_points(1))} / {fmt_points(_points())} (only chapter 1 graded here)"
    assert total in p.stdout


@pytest.mark.slow
def test_a_py_file_is_graded_on_the_functions_it_defines(tmp_path):
    mine = tmp_path / "mine.py"
    mine.write_text("import torch\n\n\ndef causal_mask(n, *, device=None):\n"
                    "    i = torch.arange(n, device=device)\n    return i[None, :] <= i[:, None]\n\n\n"
                    "def padding_mask(lengths, max_len):\n    raise NotImplementedError\n")
    p = run(str(mine), "--json", str(tmp_path / "r.json"))
    data = json.loads((tmp_path / "r.json").read_text())
    assert [t["name"].split()[0] for t in data["tests"]] == ["causal_mask", "padding_mask"]
    assert "total (mine.py)" in p.stdout
    assert p.stdout.rstrip().endswith("next: exercise 3.1 padding_mask in mine.py")
    # --exercise still narrows; a file that defines none of the exercises is graded on all (not found)
    p = run(str(mine), "--exercise", "causal_mask", "--json", str(tmp_path / "r.json"))
    data = json.loads((tmp_path / "r.json").read_text())
    assert [t["name"].split()[0] for t in data["tests"]] == ["causal_mask"]
    other = tmp_path / "other.py"
    other.write_text("def helper():\n    return 1\n")
    p = run(str(other), "--json", str(tmp_path / "r.json"))
    data = json.loads((tmp_path / "r.json").read_text())
    assert len(data["tests"]) == len(engine.load_registry()) and "not found" in p.stdout


@pytest.mark.parametrize("kind", ["missing", "empty folder", "text file"])
def test_bad_input_is_one_line_and_exit_2(tmp_path, kind):
    path = {"missing": tmp_path / "no" / "such" / "path", "empty folder": tmp_path / "empty",
            "text file": tmp_path / "notes.txt"}[kind]
    if kind == "empty folder":
        path.mkdir()
    elif kind == "text file":
        path.write_text("def causal_mask(n): ...\n")
    p = run(str(path), "--json", str(tmp_path / "r.json"))
    assert p.returncode == 2 and p.stdout == ""
    assert len(p.stderr.strip().splitlines()) == 1 and str(path) in p.stderr, p.stderr
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["score"] == 0 and data["tests"] == [] and "called wrongly" in data["output"]


# --------------------------------------------------------------------------- the short report


def _partly_finished(folder: Path) -> Path:
    """The student's exercises/: chapters 1 and 2 done, padding_mask off by one, the rest not started."""
    shutil.copytree(ROOT / "exercises", folder)
    for name in ("ex01_leakage.ipynb", "ex02_softmax.ipynb"):
        shutil.copy2(ROOT / "solutions" / name, folder / name)
    nb = json.loads((folder / "ex03_padding.ipynb").read_text())
    for cell in nb["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and 'NotImplementedError("padding_mask' in source:
            cell["source"] = re.sub(r'raise NotImplementedError\("padding_mask.*',
                                    "return torch.arange(max_len, device=lengths.device)[None, :] "
                                    "<= lengths[:, None]", source)
    (folder / "ex03_padding.ipynb").write_text(json.dumps(nb))
    return folder


@pytest.mark.slow
def test_a_partly_finished_folder_fits_on_one_screen(tmp_path):
    folder = _partly_finished(tmp_path / "exercises")
    p = run(str(folder))
    assert p.returncode == 0, p.stderr
    lines = p.stdout.rstrip().splitlines()
    registry = engine.load_registry()
    # one row per exercise, then one diagnosis and the footer: a fixed number of lines beyond the table
    assert len(lines) <= len(registry) + 24, p.stdout
    assert lines[-1] == "next: exercise 3.1 padding_mask in ex03_padding.ipynb"
    for name in registry:
        assert sum(name in line for line in lines[:len(registry) + 8]) >= 1, name  # one row each
    # The off-by-one is said once under the table (whose row, piped, shows the message whole), with
    # its grid and how many failing checks it explains.
    total = next(i for i, line in enumerate(lines) if line.lstrip().startswith("total"))
    assert sum("the padding is off by one" in line for line in lines[:total]) == 1
    assert sum("the padding is off by one" in line for line in lines[total:]) == 1
    assert "the same diagnosis explains all" in p.stdout and "expected   got" in p.stdout
    verbose = run(str(folder), "--verbose")
    assert verbose.stdout.count("the padding is off by one") > 1
    assert len(verbose.stdout.splitlines()) > len(lines)


def test_a_misspelled_subcommand_names_the_closest_one(tmp_path):
    p = run("clas", str(tmp_path))
    assert p.returncode == 2 and p.stdout == ""
    (line,) = p.stderr.splitlines()
    assert "did you mean `python -m grader class`?" in line and "release, gradescope" in line


def test_an_empty_notebook_is_one_line_not_one_per_exercise(tmp_path):
    """Every exercise 'not found' for one reason: said once, with the total and the next step."""
    import nbformat

    empty = tmp_path / "empty.ipynb"
    nbformat.write(nbformat.v4.new_notebook(), empty)
    p = run(str(empty), "--json", str(tmp_path / "r.json"))
    assert p.returncode == 0, p.stderr
    lines = [ln for ln in p.stdout.splitlines() if ln.strip()]
    text = " ".join(" ".join(lines).split())  # the terminal's line breaks undone
    assert text.count("total") == 1 and "not found: empty.ipynb has no code" in text, p.stdout
    assert lines[-1].startswith("next: exercise 1.1 causal_mask")
    assert len(lines) <= 5, p.stdout
    assert json.loads((tmp_path / "r.json").read_text())["score"] == 0


def _on_a_pty(env_extra: dict[str, str]) -> bytes:
    """``python -m grader`` with stderr on a pseudo-terminal, as IPython runs a ``!`` cell's command."""
    import os
    import pty

    master, slave = pty.openpty()
    env = {**os.environ, "TERM": "xterm-256color", **env_extra}
    proc = subprocess.Popen([sys.executable, "-m", "grader", str(ROOT / "solutions" / "ex01_leakage.ipynb"),
                             "--exercise", "causal_mask", "--public-only"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # the other end closed
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=300)
    os.close(master)
    return b"".join(chunks)


@pytest.mark.parametrize("marker", [{"JPY_PARENT_PID": "1"}, {"COLAB_RELEASE_TAG": "release-colab"},
                                    {"MPLBACKEND": "module://matplotlib_inline.backend_inline"}])
def test_no_progress_bar_in_a_notebook_cell(marker):
    """``!python -m grader`` in a notebook: a pty, but a cell shows every frame of a bar."""
    err = _on_a_pty(marker)
    assert b"\x1b[" not in err and b"grading" not in err, err[:300]


def test_no_progress_bar_into_a_pipe_even_with_force_color():
    p = run(str(ROOT / "solutions" / "ex01_leakage.ipynb"), "--exercise", "causal_mask", "--public-only",
            env={**__import__("os").environ, "FORCE_COLOR": "1", "TTY_COMPATIBLE": "1"})
    assert p.returncode == 0 and "\x1b[" not in p.stderr


def test_an_unrelated_grader_distribution_is_named_and_how_to_remove_it(tmp_path):
    """PyPI's `grader` (1.2, 2012) is another package: `pip install grader` gets it."""
    import os

    info = tmp_path / "grader-1.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: grader\nVersion: 1.2\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    p = run(str(tmp_path / "nothing-here.ipynb"), env=env)
    assert "unrelated package named 'grader' (grader 1.2)" in p.stderr and "pip uninstall grader" in p.stderr
    assert "unrelated package" not in run(str(tmp_path / "nothing-here.ipynb")).stderr
