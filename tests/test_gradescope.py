"""The Gradescope bundle, tested the way Gradescope uses it.

The bundle is built into a temporary folder and unzipped into a simulated
``/autograder`` (``AUTOGRADER_ROOT``): ``source/`` holds the zip's contents,
``run_autograder`` is copied next to it, the student's files go in
``submission/``, and ``run_autograder`` is executed from the root. setup.sh's pip
install is skipped: ``AUTOGRADER_PYTHON`` points run_autograder at this Python,
while ``PYTHONPATH`` (set by run_autograder) makes it grade with the bundle's own
copy of the grader.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest

from grader.gradescope import build

REPO = Path(__file__).resolve().parent.parent
SEED = 4242


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("gradescope"), seed=SEED)


def _unzip(zip_path: Path, dest: Path) -> None:
    with zipfile.ZipFile(zip_path) as zf:
        for info in zf.infolist():
            target = dest / info.filename
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(zf.read(info))
            mode = info.external_attr >> 16
            if mode:
                target.chmod(stat.S_IMODE(mode))


def simulate(tmp_path: Path, zip_path: Path, files: dict[str, bytes]) -> tuple[dict, str]:
    """Run the bundle on ``files`` as Gradescope would; returns results.json and stdout."""
    root = tmp_path / "autograder"
    _unzip(zip_path, root / "source")
    shutil.copy2(root / "source" / "run_autograder", root / "run_autograder")
    (root / "submission").mkdir(parents=True)
    for name, data in files.items():
        (root / "submission" / name).write_bytes(data)
    env = {**os.environ, "AUTOGRADER_ROOT": str(root), "AUTOGRADER_PYTHON": sys.executable}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([str(root / "run_autograder")], cwd=root, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads((root / "results" / "results.json").read_text())
    return results, proc.stdout + proc.stderr


def _valid(results: dict) -> None:
    """The fields Gradescope reads, with the types it expects."""
    assert isinstance(results["score"], int | float)
    for t in results.get("tests", []):
        assert isinstance(t["name"], str) and isinstance(t["score"], int | float)
        assert isinstance(t["max_score"], int | float) and 0 <= t["score"] <= t["max_score"]
        assert t.get("visibility", "visible") in ("hidden", "after_due_date", "after_published", "visible")


def _solutions() -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((REPO / "solutions").glob("ex*.ipynb"))}


def _plant(files: dict[str, bytes], name: str, good: str, bad: str) -> None:
    nb = nbformat.reads(files[name].decode(), as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code" and good in c.source]
    assert cells, f"{good!r} is no longer in solutions/{name}: update this test's planted bug"
    cells[0].source = cells[0].source.replace(good, bad)
    files[name] = nbformat.writes(nb).encode()


def test_bundle_holds_what_gradescope_needs(bundle):
    with zipfile.ZipFile(bundle) as zf:
        names = set(zf.namelist())
        modes = {i.filename: i.external_attr >> 16 for i in zf.infolist()}
        reqs = zf.read("requirements.txt").decode()
        seed = zf.read("grader_seed").decode().strip()
    # At the zip's root, not under a folder: Gradescope looks there.
    assert {"setup.sh", "run_autograder", "requirements.txt", "pyproject.toml", "README.md"} <= names
    assert {"grader/__init__.py", "grader/gradescope.py", "attnmask/__init__.py"} <= names
    assert modes["run_autograder"] & stat.S_IXUSR and modes["setup.sh"] & stat.S_IXUSR
    assert not any("__pycache__" in n or n.startswith(("solutions/", "tests/")) for n in names)
    assert "torch==2.13.0" in reqs and "-e ." not in reqs and "ruff" not in reqs
    assert seed == str(SEED)
    for script in ("setup.sh", "run_autograder"):
        assert subprocess.run(["bash", "-n", str(bundle.parent / "autograder" / script)]).returncode == 0


def test_correct_submission_gets_full_marks(tmp_path, bundle):
    results, log = simulate(tmp_path, bundle, _solutions())
    _valid(results)
    assert results["tests"], log
    assert results["score"] == pytest.approx(sum(t["max_score"] for t in results["tests"])), log
    assert results["score"] > 0
    # Students read results.json on Gradescope: the secret seed must not be in it.
    assert str(SEED) not in json.dumps(results), "the hidden-case seed leaks to students"
    assert f"seed {SEED}" in log  # ...while staff can still reproduce the run from the stdout


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="the seed is kept from student code by the sandbox's own user, which needs root")
def test_student_code_cannot_read_the_seed(tmp_path, bundle):
    """Where the seed could be: the grader's command line (readable by every process), its
    environment, the bundle's seed file. The student's code reports what it read, reversed
    so that the seed scrubbing of results.json cannot hide a leak."""
    root = tmp_path / "autograder"
    spy = (
        "import os\n\n\ndef causal_mask(n, *, device=None):\n"
        "    found = []\n"
        f"    for path in (f'/proc/{{os.getppid()}}/cmdline', f'/proc/{{os.getppid()}}/environ',\n"
        f"                 {str(root / 'source' / 'grader_seed')!r}):\n"
        "        try:\n"
        "            found.append(open(path, 'rb').read().decode(errors='replace').replace('\\n', ' '))\n"
        "        except OSError as e:\n"
        "            found.append(type(e).__name__)\n"
        "    raise ValueError(' | '.join(found)[::-1])\n")
    results, _ = simulate(tmp_path, bundle, {"spy.py": spy.encode()})
    text = json.dumps(results)
    assert "rorrEnoissimreP" in text, "the spy did not run, or read everything"  # 'PermissionError' reversed
    assert str(SEED)[::-1] not in text, "student code read the seed"
    assert (root / "source" / "grader_seed").read_text().strip() == str(SEED), "the seed file is back after"


def test_buggy_submission_loses_exactly_the_buggy_exercises(tmp_path, bundle):
    files = _solutions()
    _plant(files, "ex01_leakage.ipynb", "return pos[None, :] <= pos[:, None]",
           "return pos[None, :] < pos[:, None]")
    _plant(files, "ex03_padding.ipynb", "positions[None, :] < lengths[:, None]",
           "positions[None, :] <= lengths[:, None]")
    results, log = simulate(tmp_path, bundle, files)
    _valid(results)
    lost = {t["name"] for t in results["tests"] if t["score"] < t["max_score"]}
    assert any("causal_mask" in n for n in lost) and any("padding_mask" in n for n in lost), lost
    assert len(lost) == 2, lost
    assert results["score"] < sum(t["max_score"] for t in results["tests"])


def test_corrupt_submission_gets_a_zero_and_a_reason(tmp_path, bundle):
    results, log = simulate(tmp_path, bundle, {"ex01_leakage.ipynb": b"\x89PNG\r\n\x1a\n\x00\x00 not json"})
    _valid(results)
    assert results["score"] == 0
    text = json.dumps(results)
    assert "ex01_leakage.ipynb" in text, text


def test_feedback_can_wait_for_the_due_date(tmp_path):
    zip_path = build(tmp_path / "gs", seed=SEED, visibility="after_due_date")
    results, _ = simulate(tmp_path, zip_path, {"ex03_padding.ipynb": _solutions()["ex03_padding.ipynb"]})
    _valid(results)
    assert results["tests"] and {t["visibility"] for t in results["tests"]} == {"after_due_date"}
    assert results["score"] > 0  # the padding_mask exercise, graded as usual


def test_empty_submission_gets_a_zero_and_a_reason(tmp_path, bundle):
    results, _ = simulate(tmp_path, bundle, {"notes.txt": b"I forgot to upload"})
    _valid(results)
    assert results["score"] == 0 and "No notebook" in results["output"] and "notes.txt" in results["output"]
