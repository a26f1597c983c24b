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

from grader.runners.platforms.gradescope import build

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
    assert {"grader/__init__.py", "grader/runners/platforms/gradescope.py", "attnmask/__init__.py"} <= names
    assert modes["run_autograder"] & stat.S_IXUSR and modes["setup.sh"] & stat.S_IXUSR
    assert not any("__pycache__" in n or n.startswith(("solutions/", "tests/")) for n in names)
    assert "torch==2.13.0" in reqs and "-e ." not in reqs and "ruff" not in reqs
    assert seed == str(SEED)
    # The seed is the instructor's alone, as class mode's files are.
    assert modes["grader_seed"] & 0o777 == 0o600 and bundle.stat().st_mode & 0o777 == 0o600
    assert (bundle.parent / "autograder" / "grader_seed").stat().st_mode & 0o777 == 0o600
    # Each comment kept belongs to a requirement kept under it: none speaks of a line left out.
    assert reqs.rstrip().splitlines()[-1].strip()[:1] not in ("#", "")
    assert "jupyter lab" not in reqs and "editable" not in reqs
    for script in ("setup.sh", "run_autograder"):
        assert subprocess.run(["bash", "-n", str(bundle.parent / "autograder" / script)]).returncode == 0


@pytest.mark.slow
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
@pytest.mark.slow
def test_student_code_cannot_read_the_seed(tmp_path, bundle):
    """Where the seed could be: the grader's command line (readable by every process), its
    environment, the bundle's seed file. The student's code says whether it read the seed: it
    returns None where it did, and raises where it did not."""
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
        "    seen = ' | '.join(found)\n"
        # What it says never reaches results.json (tests/test_hidden_channel.py), nor which exception it
        # raises: whether it raises does (it returns None if it saw the seed).
        f"    if {str(SEED)[::-1]!r}[::-1] in seen:\n"
        "        return None\n"
        "    raise TypeError('looked')\n")
    results, _ = simulate(tmp_path, bundle, {"spy.py": spy.encode()})
    text = json.dumps(results)
    assert "raised an exception" in text and "None" not in text, "the spy did not run, or read the seed"
    assert str(SEED)[::-1] not in text, "student code read the seed"
    assert (root / "source" / "grader_seed").read_text().strip() == str(SEED), "the seed file is back after"


@pytest.mark.slow
def test_buggy_submission_loses_exactly_the_buggy_exercises(tmp_path, bundle):
    files = _solutions()
    _plant(files, "ex01_leakage.ipynb", "return pos[None, :] <= pos[:, None]",
           "return pos[None, :] < pos[:, None]")
    _plant(files, "ex03_padding.ipynb", "positions[None, :] < lengths[:, None]",
           "positions[None, :] <= lengths[:, None]")
    results, log = simulate(tmp_path, bundle, files)
    _valid(results)
    lost = {t["name"] for t in results["tests"] if t["score"] < t["max_score"]}
    # padded_encoder (3.2) builds its mask with the student's padding_mask: it inherits the bug.
    assert {n.split()[0] for n in lost} == {"causal_mask", "padding_mask", "padded_encoder"}, lost
    assert results["score"] < sum(t["max_score"] for t in results["tests"])


@pytest.mark.slow
def test_corrupt_submission_gets_a_zero_and_a_reason(tmp_path, bundle):
    results, log = simulate(tmp_path, bundle, {"ex01_leakage.ipynb": b"\x89PNG\r\n\x1a\n\x00\x00 not json"})
    _valid(results)
    assert results["score"] == 0
    text = json.dumps(results)
    assert "ex01_leakage.ipynb" in text, text


@pytest.mark.parametrize("visibility", ["visible", "after_due_date", "after_published", "hidden"])
@pytest.mark.slow
def test_feedback_waits_for_the_moment_the_instructor_chose(tmp_path, visibility):
    """Gradescope shows the top-level ``output`` at once whatever the tests' settings: with
    anything but "visible", it says only that grading happened, and the top level carries
    the setting too (Gradescope's results.json: top-level and per-test ``visibility``)."""
    zip_path = build(tmp_path / "gs", seed=SEED, visibility=visibility)
    results, stdout = simulate(tmp_path, zip_path, {"ex03_padding.ipynb": _solutions()["ex03_padding.ipynb"]})
    _valid(results)
    assert results["score"] > 0  # the padding_mask exercise, graded as usual
    assert results["tests"] and {t["visibility"] for t in results["tests"]} == {visibility}
    if visibility == "visible":
        assert "Score" in results["output"]
        return
    assert results["visibility"] == visibility
    assert "Score " not in results["output"] and "padding_mask" not in results["output"]
    assert not any(ch.isdigit() for ch in results["output"]), results["output"]
    assert "Score" in stdout  # staff still see everything in the autograder's stdout


def test_the_bundle_installs_only_what_grading_needs(bundle):
    with zipfile.ZipFile(bundle) as zf:
        reqs = zf.read("requirements.txt").decode()
    names = {line.split("=")[0].split(">")[0].split("<")[0].strip().lower() for line in reqs.splitlines()
             if line.strip() and not line.startswith(("#", "-"))}
    assert "torch" in names and "rich" in names
    assert not names & {"nbclient", "ipykernel", "nbformat", "pyyaml", "jupyterlab", "jupyter-book", "pytest",
                        "transformers"}


@pytest.mark.slow
def test_feedback_on_hidden_checks_carries_no_hidden_input(tmp_path, bundle):
    """A submission that raises (and prints) the inputs it was given: what students see
    holds no hidden tensor, and no message of the submission's own."""
    code = ("def document_mask(doc_ids):\n"
            "    print('IDS', doc_ids.tolist())\n"
            "    raise ValueError('my inputs: ' + str(doc_ids.tolist()))\n")
    results, _ = simulate(tmp_path, bundle, {"leak.py": code.encode()})
    text = json.dumps(results)
    from grader.checks import EXERCISES

    hidden = [a for c in EXERCISES["document_mask"].make_checks(SEED, hidden=True) if not c.public
              for call in c.calls for a in call.args if hasattr(a, "tolist") and a.numel() > 1]
    assert hidden
    for ids in hidden:
        assert str(ids.tolist()) not in text and str(ids.tolist()[0]) not in text, ids
    # Not even on a public case: while it runs the worker holds the hidden ones (test_hidden_channel.py).
    assert "my inputs:" not in text
    assert "raised an exception" in text and "ValueError" not in text and "IDS" not in results["output"]


def test_empty_submission_gets_a_zero_and_a_reason(tmp_path, bundle):
    results, _ = simulate(tmp_path, bundle, {"notes.txt": b"I forgot to upload"})
    _valid(results)
    assert results["score"] == 0 and "No notebook" in results["output"] and "notes.txt" in results["output"]


def test_feedback_on_a_notebook_upload_names_the_notebook_not_the_platforms_folder(tmp_path):
    """Gradescope puts an upload in ``submission/``, a folder the student does not have: the
    command to check again names what they handed in."""
    from types import SimpleNamespace

    from grader.report import check_yourself

    upload = tmp_path / "submission"
    upload.mkdir()
    (upload / "ex01_leakage.ipynb").write_text("{}")
    assert check_yourself(SimpleNamespace(submission=str(upload))) == "python -m grader ex01_leakage.ipynb"
    (upload / "ex02_softmax.ipynb").write_text("{}")
    said = check_yourself(SimpleNamespace(submission=str(upload)))
    assert "submission" not in said and "exercises/" in said
    assert check_yourself(SimpleNamespace(submission=str(upload / "ex01_leakage.ipynb"))).endswith(
        "grader ex01_leakage.ipynb")
