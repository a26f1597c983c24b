"""The Python/torch matrix (scripts/ci_matrix.py): its cells, the workflow that runs them, and
.ci/run, read as written; no cell is installed here (each is a venv of its own)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import ci_matrix  # noqa: E402


def test_the_pinned_cell_is_the_readmes_command_with_the_pin():
    cell = ci_matrix.cells()["pinned"]
    assert "python -m pytest\n" in (REPO / "README.md").read_text() and cell.pytest == ()
    pin = re.search(r"^torch==(\S+)$", (REPO / "requirements.txt").read_text(), re.M).group(1)
    assert cell.torch == f"torch=={pin}" and cell.python == "3.11"


def test_the_oldest_cell_is_the_floor_pyproject_allows():
    floor = re.search(r'"torch>=([0-9.]+)', (REPO / "pyproject.toml").read_text()).group(1)
    assert ci_matrix.cells()["oldest"].torch.startswith(f"torch=={floor}")
    assert ci_matrix.cells()["oldest"].pytest == ("-m", "not slow", "tests/")


def test_the_newest_cell_leaves_out_only_the_browser_tests():
    deselected = [a.split("=", 1)[1] for a in ci_matrix.cells()["newest"].pytest]
    text = (REPO / "tests" / "test_book.py").read_text()
    for node in deselected:
        name = node.split("::")[1]
        signature = re.search(rf"def {name}\(([^)]*)\)", text)
        assert signature and ("rendered" in signature.group(1) or "browser" in signature.group(1)), name
    users = re.findall(r"def (test_\w+)\(([^)]*)\)", text)
    assert {n for n, args in users if "browser" in args or "rendered" in args} == {
        d.split("::")[1] for d in deselected}


def test_requirements_swap_only_the_torch_pin():
    pinned = (REPO / "requirements.txt").read_text()
    swapped = ci_matrix.requirements("torch==2.5.1")
    assert swapped.replace("torch==2.5.1", "torch==2.13.0", 1) == pinned
    assert swapped.count("torch==") == 1


def test_the_workflow_runs_every_cell_with_its_python():
    wf = yaml.safe_load((REPO / ".github" / "workflows" / "matrix.yml").read_text())
    include = wf["jobs"]["cell"]["strategy"]["matrix"]["include"]
    assert sorted(c["cell"] for c in include) == sorted(ci_matrix.cells())
    for c in include:
        want = ci_matrix.cells()[c["cell"]].python
        assert want == "newest" or c["python"] == want
    assert "python scripts/ci_matrix.py ${{ matrix.cell }}" in wf["jobs"]["cell"]["steps"][-1]["run"]


def test_ci_runs_the_readmes_command_then_the_cells_asked_for():
    run = (REPO / ".ci" / "run").read_text()
    assert "\npython -m pytest\n" in run and 'python scripts/ci_matrix.py "$cell"' in run


def test_a_dry_run_prints_the_steps_and_makes_nothing(tmp_path):
    venv = tmp_path / "venv"
    p = subprocess.run([sys.executable, str(REPO / "scripts" / "ci_matrix.py"), "oldest", "--dry-run",
                        "--venv", str(venv)], capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "CI_PYTHON": sys.executable})
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == f"+ {sys.executable} -m venv {venv}" and ci_matrix.cells()["oldest"].torch in lines[1]
    assert lines[-1].endswith("-m pytest -m not slow tests/") and not venv.exists()


def test_a_dry_run_without_a_venv_leaves_no_folder(tmp_path):
    p = subprocess.run([sys.executable, str(REPO / "scripts" / "ci_matrix.py"), "oldest", "--dry-run"],
                       capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "CI_PYTHON": sys.executable, "TMPDIR": str(tmp_path)})
    assert p.returncode == 0, p.stderr
    assert list(tmp_path.iterdir()) == [] and "ci-oldest-" in p.stdout
