"""setup.sh's choice of Python, run against a fake system.

Gradescope's base image is Ubuntu 22.04, whose python3 is 3.10. setup.sh looks for
3.11, installs it with apt-get when it is missing, and falls back to python3 when apt
cannot. Here the commands it calls (python3.11, python3, apt-get, pip through the
venv's python) are small scripts that log their arguments, in a PATH that holds
nothing else, so each branch runs for real without touching this machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SETUP = Path(__file__).resolve().parent.parent / "grader" / "templates" / "gradescope" / "setup.sh"
TOOLS = ("bash", "basename", "cat", "chmod", "cp", "mkdir", "dirname", "env")

FAKE_PYTHON = """#!/bin/bash
# a fake Python {version}: logs every call; "-m venv DIR" makes DIR/bin/python, a fake too
echo "$(basename "$0") $*" >> "$LOG"
case "$1" in
  -c) case "$2" in *version_info*) exit {too_old};; esac; echo "autograder ready: torch 0.0";;
  -m) if [ "$2" = venv ]; then mkdir -p "$3/bin"; cat "$0" > "$3/bin/python"; chmod +x "$3/bin/python"; fi;;
esac
exit 0
"""


def _system(tmp_path: Path, *, pythons: dict[str, str], apt_works: bool, bwrap: bool = True
            ) -> tuple[Path, dict]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if bwrap:  # bubblewrap already installed (a fake: setup.sh only asks whether it is there)
        (bin_dir / "bwrap").write_text("#!/bin/bash\nexit 0\n")
        (bin_dir / "bwrap").chmod(0o755)
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found, tool
        (bin_dir / tool).symlink_to(found)
    for name, version in pythons.items():
        script = bin_dir / name
        script.write_text(FAKE_PYTHON.format(version=version, too_old=int(version < "3.11")))
        script.chmod(0o755)
    apt = bin_dir / "apt-get"
    if apt_works:  # installing python3.11 puts a fake one on the PATH
        apt.write_text('#!/bin/bash\necho "apt-get $*" >> "$LOG"\n'
                       'case "$*" in *install*python3.11*) cp "$(dirname "$0")/.python3.11" '
                       '"$(dirname "$0")/python3.11";; esac\nexit 0\n')
        spare = bin_dir / ".python3.11"
        spare.write_text(FAKE_PYTHON.format(version="3.11", too_old=0))
        spare.chmod(0o755)
    else:
        apt.write_text('#!/bin/bash\necho "apt-get $*" >> "$LOG"\nexit 100\n')
    apt.chmod(0o755)
    root = tmp_path / "autograder"
    (root / "source").mkdir(parents=True)
    env = {"PATH": str(bin_dir), "AUTOGRADER_ROOT": str(root), "LOG": str(tmp_path / "log")}
    return root, env


def _run(tmp_path, **system) -> tuple[subprocess.CompletedProcess, list[str]]:
    root, env = _system(tmp_path, **system)
    p = subprocess.run([str(tmp_path / "bin" / "bash"), str(SETUP)], env=env, capture_output=True, text=True,
                       timeout=60)
    log = (tmp_path / "log").read_text().splitlines() if (tmp_path / "log").exists() else []
    return p, log


def test_python_3_11_present_is_used_without_apt(tmp_path):
    p, log = _run(tmp_path, pythons={"python3.11": "3.11", "python3": "3.10"}, apt_works=True)
    assert p.returncode == 0, p.stderr
    assert not [line for line in log if line.startswith("apt-get")]
    assert any(line.startswith("python3.11 -m venv") for line in log)
    assert any("pip install" in line and "requirements.txt" in line for line in log)


def test_bubblewrap_is_installed_where_it_is_missing(tmp_path):
    """Student code runs inside bubblewrap; without it the grader refuses to grade as root."""
    p, log = _run(tmp_path, pythons={"python3.11": "3.11"}, apt_works=True, bwrap=False)
    assert p.returncode == 0, p.stderr
    assert any(line.startswith("apt-get install") and "bubblewrap" in line for line in log), log


def test_ubuntu_22_04_gets_python_3_11_from_apt(tmp_path):
    p, log = _run(tmp_path, pythons={"python3": "3.10"}, apt_works=True)
    assert p.returncode == 0, p.stderr
    assert any(line.startswith("apt-get install") and "python3.11" in line for line in log), log
    assert any(line.startswith("python3.11 -m venv") for line in log), log


@pytest.mark.skipif(os.name != "posix", reason="bash")
def test_without_apt_it_falls_back_to_python3_and_says_so(tmp_path):
    p, log = _run(tmp_path, pythons={"python3": "3.10"}, apt_works=False)
    assert "falling back" in p.stderr
    assert any(line.startswith("python3 -m venv") for line in log), log


def test_an_apt_that_succeeds_without_installing_python_3_11_falls_back(tmp_path):
    p, log = _run(tmp_path, pythons={"python3": "3.10"}, apt_works=True)
    assert p.returncode == 0
    (tmp_path / "bin" / "python3.11").unlink()  # as if apt had said yes and installed nothing
    (tmp_path / "log").unlink()
    shutil.rmtree(tmp_path / "autograder" / "venv")
    (tmp_path / "bin" / ".python3.11").unlink()
    env = {"PATH": str(tmp_path / "bin"), "AUTOGRADER_ROOT": str(tmp_path / "autograder"),
           "LOG": str(tmp_path / "log")}
    p = subprocess.run([str(tmp_path / "bin" / "bash"), str(SETUP)], env=env, capture_output=True, text=True,
                       timeout=60)
    log = (tmp_path / "log").read_text().splitlines()
    assert "falling back" in p.stderr, p.stderr
    assert any(line.startswith("python3 -m venv") for line in log), log
