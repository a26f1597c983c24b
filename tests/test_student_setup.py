"""What a student needs after `pip install -r requirements.txt`: JupyterLab, started
from the interpreter the requirements went into (not whichever `jupyter` is on PATH).
The exercise notebooks themselves are run in tests/test_grader_notebook.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _required(package: str) -> str:
    """The version specifier requirements.txt gives ``package``."""
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        m = re.match(rf"{re.escape(package)}\s*([<>=!~].*)$", line.strip())
        if m:
            return m.group(1)
    raise AssertionError(f"requirements.txt does not name {package}; students open the exercises with it")


@pytest.mark.parametrize("command", [
    ["-m", "jupyterlab", "--version"],
    ["-m", "jupyter", "lab", "--version"],
], ids=["python -m jupyterlab", "python -m jupyter lab"])
@pytest.mark.slow
def test_jupyter_lab_starts_from_this_interpreter(command):
    # A PATH without this interpreter's bin/: the command must not work only by luck of PATH.
    env = {**os.environ, "PATH": os.defpath}
    done = subprocess.run([sys.executable, *command], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, (
        f"`{sys.executable} {' '.join(command)}` failed (exit {done.returncode}):\n{done.stderr[-2000:]}\n"
        "Install the course requirements into this interpreter: python -m pip install -r requirements.txt"
    )
    version = done.stdout.strip().splitlines()[-1]
    major, minor = (int(x) for x in version.split(".")[:2])
    assert (major, minor) >= (4, 2) and major < 5, f"JupyterLab {version}; requirements.txt asks for " \
        f"{_required('jupyterlab')}"


def test_readme_tells_students_how_to_open_the_exercises():
    readme = (ROOT / "README.md").read_text()
    students = readme.split("## For students", 1)[1].split("\n## ", 1)[0]
    assert "jupyter lab exercises/" in students
    assert _required("jupyterlab")
