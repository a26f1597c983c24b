"""Generate the exercise notebooks from the solution notebooks, and the public checks' data.

    python -m grader release            # write exercises/ from solutions/, and grader/data/
    python -m grader release --check    # exit 1 and list stale files, write nothing
    python -m grader release --repo-url https://github.com/OWNER/REPO   # install lines from its Releases

The public checks' data (``grader/data/public_checks/``) is what the student
template grades with instead of the reference: the public cases, the reference's
outputs on them and the outputs of the classic mistakes that feedback names,
recorded from ``grader.checks`` (see :mod:`grader.checks.recorded`). A new exercise
gets its data here, as soon as it is in ``attnmask.CONTRACT`` and has its checks.

In a solution notebook, the code between a ``# BEGIN SOLUTION`` line and a
``# END SOLUTION`` line is the answer. In the exercise it becomes

    raise NotImplementedError("<function>: implement it (see exercise N.M)")

at the marker's indentation, where ``<function>`` is the enclosing ``def``, N is the
chapter (``ex03_...`` -> 3) and M counts the solution regions of the notebook. The
message is the same for every exercise: it is read before any hint is opened, so it
names the task and nothing of the method. A ``# HINT: ...`` line inside a region is
a note for maintainers and goes with the region; the hints the student reads are the
statement's collapsed steps. Cells
tagged ``solution-only`` are dropped; cells tagged ``explore`` (the payoff that
runs the student's own functions in a ``with explore():`` block, see
:mod:`grader.explore_cells`) are kept like every other cell, and may hold no
solution region. Outputs and execution counts are cleared. The note that the
file is generated, and from what, is for maintainers: it lives in the
notebook's metadata under ``NOTICE_KEY``, where ``--check`` compares it like
every other byte, and the first cell the student sees is the solution
notebook's own opening cell.

With ``--repo-url``, the install line of every notebook (the Rules cell's
``%pip install ... attnmask-VERSION-py3-none-any.whl``, run beside a wheel the
instructor hands out) installs the wheel that ``.github/workflows/release.yml``
attaches to the repository's latest GitHub Release instead, so that a notebook
opened alone (Colab) finds the course. The URL is kept in the notebooks' note, so
later runs (and ``--check``) keep it until ``--repo-url none``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import nbformat
from nbformat import NotebookNode

from .checkout import NoCheckout, course_root

ROOT = Path(__file__).resolve().parents[3]
SOLUTIONS = ROOT / "solutions"
EXERCISES = ROOT / "exercises"

BEGIN = "# BEGIN SOLUTION"
END = "# END SOLUTION"
HINT = "# HINT:"  # a maintainers' note inside a region; never copied to the exercise
SOLUTION_ONLY = "solution-only"
EXPLORE = "explore"  # shipped to students; grading skips these cells (grader.explore_cells.TAG)
NOTICE_KEY = "attnmask_release"  # notebook metadata: the generator's note
REPO_URL_KEY = "repo_url"  # in the note: the --repo-url the install lines point at

_DEF = re.compile(r"^(\s*)def\s+([A-Za-z_]\w*)\s*\(")
_CHAPTER = re.compile(r"^ex(\d+)_")


#: The Rules cell's install line for a lone notebook: the wheel lies beside the notebook.
_LOCAL_INSTALL = re.compile(
    r"put the course's wheel, `(?P<wheel>attnmask-[\w.+-]+\.whl)` \(your instructor hands it out\), "
    r"beside the notebook and run `%pip install (?P<options>[^`]*?)(?P=wheel)`")
_REPO_URL = re.compile(r"https?://[^\s/`]+(/[^\s/`]+)+")


class ReleaseError(ValueError):
    """A solution notebook whose markers cannot be turned into a stub."""


def chapter_of(path: Path) -> int:
    m = _CHAPTER.match(path.name)
    if not m:
        raise ReleaseError(f"{path.name}: expected a name like ex03_padding.ipynb")
    return int(m.group(1))


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _enclosing_def(lines: list[str], at: int) -> str | None:
    """Name of the innermost ``def`` above line ``at`` that is less indented than it."""
    width = len(_indent(lines[at]))
    for line in reversed(lines[:at]):
        m = _DEF.match(line)
        if m and len(m.group(1)) < width:
            return m.group(2)
    return None


def stub_message(name: str, chapter: int, number: int) -> str:
    """The stub's message: the task's name and number, the same words for every exercise."""
    return f"{name}: implement it (see exercise {chapter}.{number})"


def strip_solutions(source: str, chapter: int, counter: list[int], where: str) -> str:
    """Replace every solution region of one cell's source by a stub.

    ``counter`` holds the number of regions seen so far in the notebook and is
    advanced in place (it numbers the exercises N.1, N.2, ...).
    """
    lines = source.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        if lines[i].strip() == END:
            raise ReleaseError(f"{where}: '{END}' without '{BEGIN}' (line {i + 1})")
        if lines[i].strip() != BEGIN:
            out.append(lines[i])
            i += 1
            continue
        start = i
        name = _enclosing_def(lines, start)
        if name is None:
            raise ReleaseError(f"{where}: '{BEGIN}' on line {start + 1} is not inside a def")
        i += 1
        while i < len(lines) and lines[i].strip() != END:
            if lines[i].strip() == BEGIN:
                raise ReleaseError(f"{where}: nested '{BEGIN}' on line {i + 1}")
            i += 1
        if i == len(lines):
            raise ReleaseError(f"{where}: '{BEGIN}' on line {start + 1} has no '{END}'")
        counter[0] += 1
        message = stub_message(name, chapter, counter[0])
        literal = json.dumps(message, ensure_ascii=False)  # a JSON string is a valid Python literal
        out.append(f"{_indent(lines[start])}raise NotImplementedError({literal})")
        i += 1  # skip the END line
    return "\n".join(out)


def wheel_url(repo_url: str, wheel: str) -> str:
    """Where ``.github/workflows/release.yml`` puts ``wheel``: the repository's latest Release."""
    return f"{repo_url.rstrip('/')}/releases/latest/download/{wheel}"


def install_from_release(source: str, repo_url: str) -> str:
    """A markdown cell's install line, made to install the wheel from the repository's latest
    Release (unchanged where the cell has no install line)."""
    return _LOCAL_INSTALL.sub(
        lambda m: f"run `%pip install {m['options']}{wheel_url(repo_url, m['wheel'])}`", source)


def check_repo_url(url: str) -> str:
    """``url`` without a trailing slash; :class:`ReleaseError` unless it looks like a repository's."""
    if not _REPO_URL.fullmatch(url.rstrip("/")):
        raise ReleaseError(f"--repo-url is {url!r}; expected the repository's web address, "
                           "e.g. https://github.com/OWNER/REPO")
    return url.rstrip("/")


def remembered_repo_url(exercises: Path = EXERCISES) -> str | None:
    """The ``--repo-url`` the exercise notebooks were last generated with (kept in their note), so
    that ``release`` and ``release --check`` without the option keep it; None: none was given."""
    for path in sorted(exercises.glob("ex*.ipynb")):
        try:
            note = nbformat.read(path, as_version=4).metadata.get(NOTICE_KEY, {})
        except Exception:  # noqa: BLE001,S112 -- an unreadable notebook is stale anyway
            continue
        if note.get(REPO_URL_KEY):
            return str(note[REPO_URL_KEY])
    return None


def notice(source_name: str) -> dict[str, str]:
    """The maintainers' note stored in a generated notebook's metadata."""
    return {
        "generated_from": f"solutions/{source_name}",
        "generator": "python -m grader release",
        "note": "Generated — don't edit; edit the solution notebook and run "
                "`python -m grader release` again.",
    }


def make_exercise(solution: NotebookNode, source_name: str, chapter: int,
                  repo_url: str | None = None) -> NotebookNode:
    """The exercise notebook generated from one solution notebook (with ``repo_url``, its install
    line installs the wheel of that repository's latest Release: :func:`install_from_release`)."""
    counter = [0]
    installs = 0
    cells = []
    for index, cell in enumerate(solution.cells):
        tags = list(cell.get("metadata", {}).get("tags", []))
        if SOLUTION_ONLY in tags:
            continue
        metadata = {"tags": tags} if tags else {}
        if EXPLORE in tags and BEGIN in cell.source:
            raise ReleaseError(f"{source_name} cell {index}: an '{EXPLORE}' cell holds a '{BEGIN}' region "
                               "(grading skips Explore cells, so it would never be graded)")
        if cell.cell_type == "code":
            source = strip_solutions(cell.source, chapter, counter, f"{source_name} cell {index}")
            new = nbformat.v4.new_code_cell(source, metadata=metadata)
        elif cell.cell_type == "markdown":
            source = cell.source
            if repo_url is not None:
                installs += len(_LOCAL_INSTALL.findall(source))
                source = install_from_release(source, repo_url)
            new = nbformat.v4.new_markdown_cell(source, metadata=metadata)
        else:
            new = nbformat.v4.new_raw_cell(cell.source, metadata=metadata)
        new.id = cell.get("id") or f"cell-{index}"
        cells.append(new)
    if counter[0] == 0:
        raise ReleaseError(f"{source_name}: no '{BEGIN}' region, so nothing to exercise")
    if repo_url is not None and not installs:
        raise ReleaseError(f"{source_name}: --repo-url was given but no markdown cell has the install "
                           "line to point at the release (expected \"put the course's wheel, "
                           "`attnmask-....whl` (your instructor hands it out), beside the notebook and run "
                           "`%pip install ...`\")")
    # Only stable metadata: the Python version recorded by the last execution of
    # the solution must not make the exercise look stale.
    metadata = {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"},
        NOTICE_KEY: notice(source_name) | ({} if repo_url is None else {REPO_URL_KEY: repo_url}),
    }
    nb = nbformat.v4.new_notebook(cells=cells, metadata=metadata)
    nbformat.validate(nb)
    return nb


def normalised(nb: NotebookNode) -> str:
    return nbformat.writes(nb)


def plan(solutions: Path = SOLUTIONS, exercises: Path = EXERCISES,
         repo_url: str | None = None) -> dict[Path, str | None]:
    """What each file in ``exercises`` should contain (None: it should not exist)."""
    wanted: dict[Path, str | None] = {}
    for path in sorted(solutions.glob("ex*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        wanted[exercises / path.name] = normalised(make_exercise(nb, path.name, chapter_of(path), repo_url))
    for path in sorted(exercises.glob("ex*.ipynb")):
        wanted.setdefault(path, None)
    return wanted


def stale(wanted: dict[Path, str | None]) -> list[Path]:
    """Files whose current state differs from ``wanted``."""
    out = []
    for path, text in wanted.items():
        if text is None:
            out.append(path)
        elif not path.exists() or normalised(nbformat.read(path, as_version=4)) != text:
            out.append(path)
    return out


def public_data() -> dict:
    """The public checks' data, recorded now with the reference (:func:`grader.checks.recorded.record`)."""
    from ...checks import declared, recorded
    from ...engine import DEFAULT_SEED

    return recorded.record(declared(), DEFAULT_SEED)


def main(argv: list[str] | None = None) -> int:
    from ...checks import recorded

    parser = argparse.ArgumentParser(prog="python -m grader release", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if exercises/ or the public checks' data is stale; write nothing")
    parser.add_argument("--repo-url", metavar="URL",
                        help="the course's repository (https://github.com/OWNER/REPO): the notebooks' "
                             "install line then installs the wheel attached to its latest GitHub Release "
                             "(.github/workflows/release.yml). Remembered in exercises/ for later runs; "
                             "--repo-url none goes back to the default, a wheel beside the notebook")
    args = parser.parse_args(argv)
    try:
        root = course_root(("solutions",), "python -m grader release")
    except NoCheckout as e:
        print(f"release: {e}", file=sys.stderr)
        return 2

    def shown(path: Path) -> str:  # a wheel's data lies outside the course repository
        return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)

    try:
        given = remembered_repo_url(root / "exercises") if args.repo_url is None else args.repo_url
        repo_url = None if given in (None, "none") else check_repo_url(given)
        wanted = plan(root / "solutions", root / "exercises", repo_url)
        data = public_data()
    except (ReleaseError, TypeError, LookupError) as e:
        print(f"release: {e}", file=sys.stderr)
        return 2
    todo = stale(wanted)
    data_todo = recorded.stale(data)
    if args.check:
        for path in todo + ([recorded.DATA] if data_todo else []):
            print(f"stale: {shown(path)}")
        print("run `python -m grader release` to regenerate exercises/ and grader/data/ from solutions/ and "
              "the checks" if todo or data_todo else "exercises/ and the public checks' data are up to date")
        return 1 if todo or data_todo else 0
    if data_todo:
        recorded.write(data)
        print(f"wrote {shown(recorded.DATA)}")
    (root / "exercises").mkdir(exist_ok=True)
    for path in todo:
        text = wanted[path]
        if text is None:
            path.unlink()
            print(f"removed {shown(path)} (no solution notebook)")
        else:
            path.write_text(text + "\n", encoding="utf-8")
            print(f"wrote {shown(path)}")
    if not todo:
        print("exercises/ is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
