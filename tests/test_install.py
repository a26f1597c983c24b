"""The grader installs like any package: the wheel, in a fresh venv outside the checkout, grades.

``pip wheel .`` builds what an instructor installs into a Docker image or a grading
server (and what Gradescope's setup.sh installs from the bundle); the venv gets
torch from the system's site-packages rather than downloading it again, but the
``grader`` it imports must be the wheel's, not the checkout's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A venv outside the checkout with the wheel built from it installed; returns its python."""
    tmp = tmp_path_factory.mktemp("install")
    wheels = tmp / "wheels"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps",
                            "--no-build-isolation", "-w", str(wheels), "-q"],
                           capture_output=True, text=True, timeout=600, cwd=tmp)
    assert build.returncode == 0, build.stderr
    (wheel,) = wheels.glob("*.whl")
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(tmp / "venv")], check=True,
                   timeout=300)
    python = tmp / "venv" / "bin" / "python"
    install = subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "--no-index",
                              "--ignore-installed", "-q", str(wheel)],
                             capture_output=True, text=True, timeout=600, cwd=tmp)
    # --ignore-installed: the checkout's own (editable) install is in the system's site-packages,
    # which pip would otherwise take for this package, already installed
    assert install.returncode == 0, install.stderr
    return python


def run(python: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GRADER_SEED")}
    return subprocess.run([str(python), *args], capture_output=True, text=True, timeout=600, cwd=cwd, env=env)


def test_the_venv_imports_the_installed_wheel(venv):
    cwd = venv.parents[2]
    p = run(venv, "-c", "import grader, grader.runners.cli, grader.sandbox.worker, attnmask; "
                        "from grader.checks import recorded; "
                        "print(grader.__file__); print(attnmask.__file__); print(recorded.DATA.is_dir())",
            cwd=cwd)
    assert p.returncode == 0, p.stderr
    grader_file, attnmask_file, data = p.stdout.split()
    venv_root = venv.parents[1]
    assert Path(grader_file).is_relative_to(venv_root), p.stdout
    assert Path(attnmask_file).is_relative_to(venv_root), p.stdout
    assert not Path(grader_file).is_relative_to(REPO)
    assert data == "True"


def test_the_installed_grader_grades_the_solutions_and_the_stubs(venv, tmp_path):
    results = tmp_path / "solutions.json"
    p = run(venv, "-m", "grader", str(REPO / "solutions"), "--quiet", "--json", str(results), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    data = json.loads(results.read_text())
    assert data["score"] == data["max_score"] == 100, data.get("output")
    results = tmp_path / "stub.json"
    p = run(venv, "-m", "grader", str(REPO / "exercises" / "ex01_leakage.ipynb"), "--json", str(results),
            cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    data = json.loads(results.read_text())
    assert data["score"] == 0 and data["max_score"] > 0
    assert "next: exercise 1.1 causal_mask" in p.stdout
