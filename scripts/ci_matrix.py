"""The Python/torch matrix: the README's test command on the Pythons and torches students have.

    python scripts/ci_matrix.py CELL [--venv DIR] [--dry-run] [-- PYTEST ARGS]

Each cell makes a fresh virtual environment with its Python, installs ``requirements.txt`` with
the cell's torch in place of the pin (PyTorch's CPU wheel index first, as the README's set-up
line does), and runs the cell's tests there:

=========  ==========================  ===========================================================
cell       Python, torch               tests
=========  ==========================  ===========================================================
pinned     3.11, 2.13.0 (the pin)      ``python -m pytest``: the README's command, the whole suite
newest     the newest of both          the whole suite but the headless-browser test (test_book's
                                       pages in Chromium: it tests the book's HTML, not torch)
oldest     3.10, the floor of          ``python -m pytest -m "not slow" tests/``: the fast tests
           pyproject.toml (2.5.1)      (the notebooks' stored outputs are 2.13.0's)
=========  ==========================  ===========================================================

``.ci/run`` runs the pinned cell (every CI run, as the README says); ``CI_MATRIX="newest oldest"``
makes it run those too, where this machine can install them. The GitHub Actions workflow
``.github/workflows/matrix.yml`` runs the three cells side by side (``python scripts/ci_matrix.py
${{ matrix.cell }}``). ``newest`` takes the newest torch the index offers (``CI_TORCH`` overrides
the version, ``CI_PYTHON`` the interpreter of any cell, ``CI_TORCH_INDEX`` the wheel index; empty:
none but pip's own configuration, e.g. a machine with its wheels on disk). A standard-library
script: it must run before anything is installed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
#: test_book's tests that open the built pages in headless Chromium (the ``browser`` fixture).
BROWSER_TESTS = ("tests/test_book.py::test_page_renders_title_figures_and_no_errors",
                 "tests/test_book.py::test_page_fits_1280_px_with_one_search_box",
                 "tests/test_book.py::test_figures_have_alt_text",
                 "tests/test_book.py::test_screenshots_of_every_chapter")


@dataclass(frozen=True)
class Cell:
    python: str  # "3.11", or "newest": the newest CPython 3 found
    torch: str  # a pip requirement for torch
    pytest: tuple[str, ...]  # arguments of `python -m pytest`


def torch_floor() -> str:
    """The lowest torch ``pyproject.toml`` allows (``torch>=X``)."""
    text = (REPO / "pyproject.toml").read_text()
    m = re.search(r'"torch>=([0-9.]+)', text)
    if m is None:
        raise SystemExit("pyproject.toml states no torch>= floor")
    return m.group(1)


def pinned_torch() -> str:
    m = re.search(r"^torch==([0-9.]+)", (REPO / "requirements.txt").read_text(), re.M)
    if m is None:
        raise SystemExit("requirements.txt pins no torch==")
    return m.group(1)


def cells() -> dict[str, Cell]:
    floor = torch_floor()
    oldest = f"torch=={floor}.1" if floor.count(".") == 1 else f"torch=={floor}"  # 2.5 -> its bug-fix release
    return {
        "pinned": Cell("3.11", f"torch=={pinned_torch()}", ()),
        "newest": Cell("newest", os.environ.get("CI_TORCH") and f"torch=={os.environ['CI_TORCH']}" or "torch",
                       tuple(f"--deselect={t}" for t in BROWSER_TESTS)),
        "oldest": Cell("3.10", oldest, ("-m", "not slow", "tests/")),
    }


def interpreter(version: str) -> str:
    """A python executable for ``version`` ("3.11", or "newest"), from PATH or pyenv."""
    if os.environ.get("CI_PYTHON"):
        return os.environ["CI_PYTHON"]
    found: dict[tuple[int, int], str] = {}
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    roots = sorted(pyenv.glob("versions/3.*/bin"), reverse=True)  # pyenv's own, before its shims
    roots += [Path(p) for p in os.environ.get("PATH", "").split(os.pathsep) if p and "shims" not in p]
    for root in roots:
        for exe in root.glob("python3.*"):
            m = re.fullmatch(r"python3\.(\d+)", exe.name)
            if m and os.access(exe, os.X_OK):
                found.setdefault((3, int(m.group(1))), str(exe))
    if version == "newest":
        if not found:
            raise SystemExit("no python3.X found on PATH or under pyenv")
        return found[max(found)]
    major, minor = map(int, version.split("."))
    if (major, minor) not in found:
        raise SystemExit(f"Python {version} is not installed here (PATH, pyenv); set CI_PYTHON to one")
    return found[(major, minor)]


def requirements(torch: str) -> str:
    """requirements.txt with ``torch`` in place of its pin."""
    text = (REPO / "requirements.txt").read_text()
    return re.sub(r"^torch==[0-9.]+$", torch, text, count=1, flags=re.M)


def commands(name: str, venv: Path) -> list[list[str]]:
    cell = cells()[name]
    py = str(venv / "bin" / "python")
    reqs = venv / "requirements-cell.txt"
    where = os.environ.get("CI_TORCH_INDEX", CPU_INDEX)  # "": this machine's own index or wheels only
    index = ["--extra-index-url", where] if where else []
    return [[interpreter(cell.python), "-m", "venv", str(venv)],
            ["write", str(reqs), cell.torch],
            [py, "-m", "pip", "install", "-q", *index, "-r", str(reqs)],
            [py, "-c", "import sys, torch; print('cell:', sys.version.split()[0], torch.__version__)"],
            [py, "-m", "pytest", *cell.pytest]]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("cell", choices=sorted(cells()))
    p.add_argument("--venv", type=Path, help="where the cell's venv goes (default: a new temporary folder)")
    p.add_argument("--dry-run", action="store_true", help="print the commands; run nothing")
    argv = list(sys.argv[1:] if argv is None else argv)
    own, extra = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    args = p.parse_args(own)
    args.pytest = extra  # after --: pytest arguments in place of the cell's
    if args.venv:
        venv = args.venv
    elif args.dry_run:  # a name only: a dry run leaves nothing behind
        venv = Path(tempfile.gettempdir()) / f"ci-{args.cell}-XXXXXXXX"
    else:
        venv = Path(tempfile.mkdtemp(prefix=f"ci-{args.cell}-"))
    steps = commands(args.cell, venv)
    if args.pytest:
        steps[-1] = [*steps[-1][:3], *args.pytest]
    for step in steps:
        print("+", " ".join(step), flush=True)
        if args.dry_run:
            continue
        if step[0] == "write":  # the requirements with the cell's torch
            Path(step[1]).write_text(requirements(step[2]))
            continue
        if step[1:3] == ["-m", "venv"] and venv.exists():
            shutil.rmtree(venv)
        code = subprocess.run(step, cwd=REPO).returncode
        if code != 0:
            print(f"ci_matrix: cell {args.cell} failed at: {' '.join(step)} (exit {code})", file=sys.stderr)
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
