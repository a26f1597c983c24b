"""What a student hands in, as cells of Python source; and running those cells.

A submission is an exercise notebook, a ``.py`` file, or a folder of them (a
student's copy of ``exercises/``). :func:`read` turns it into :class:`Cell` s in
the trusted process without running anything: notebooks give their code cells
(IPython magics and shell escapes neutralised), a ``.py`` file gives one cell, or
one per ``# %%`` block when it has them, or one per top-level block when the
whole file does not parse (so one typo costs only the functions next to it).

:func:`run_cells` runs in the sandboxed worker. Each file gets its own
namespace; cells run in order. Only top-level *definitions* run: imports,
``def``/``class``, assignments and ``if``/``try``/``with`` blocks. Bare
expressions and loops (plots, prints, demos, ``check(...)`` calls, training
loops) are skipped: they cannot define a graded function, and skipping them
keeps grading fast and keeps scratch work from costing marks. Explore blocks
are skipped too: a top-level ``with explore(): ...`` statement, and every code
cell tagged ``explore`` (they only use the graded functions, see
:mod:`grader.explore_cells`). A statement that
raises, or runs over its time budget, is reported and skipped; the
statements after it still run.
"""

from __future__ import annotations

import ast
import json
import linecache
import os
import re
import signal
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import files
from .explore_cells import explore_block, tagged_explore

SUFFIXES = (".ipynb", ".py")
MAX_FILE_BYTES = 8 * 2**20
MAX_CELLS = 10_000  # a notebook's cells read; the course's have about 30
#: Characters of code parsed at once, and in all, of one submission. The grading process parses
#: a student's code (to find its functions, to scan its calls) and keeps the trees: a 2 MiB list
#: literal is a million nodes, and three of them took the parent to 1.8 GiB and a minute. The
#: course's largest cell is under 10 KiB, a whole solved course under 200 KiB.
MAX_PARSED_CHARS = 512 * 2**10
MAX_SUBMISSION_PARSED_CHARS = 2 * 2**20
_SKIP_DIRS = {"__pycache__", "node_modules", "site-packages"}
# Cell magics whose body is still Python (timing, capturing output).
_PYTHON_CELL_MAGICS = {"time", "timeit", "capture", "prun", "debug"}
_KEPT_STATEMENTS = (
    ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
    ast.Assign, ast.AnnAssign, ast.AugAssign, ast.If, ast.Try, ast.With, ast.Global,
    ast.Delete, ast.Pass,
) + ((ast.TryStar,) if hasattr(ast, "TryStar") else ())


class SubmissionError(Exception):
    """The submission cannot be graded at all (e.g. the path does not exist)."""


@dataclass
class Cell:
    """One unit of source. ``file`` is the display name (relative to the submission)."""

    file: str
    number: int  # 1-based cell number in a notebook; block number in a .py file
    source: str
    line_offset: int = 0  # lines before this cell in its file (.py blocks)
    notebook: bool = False

    @property
    def label(self) -> str:
        if self.notebook:
            return f"cell {self.number} of {self.file}"
        if self.line_offset or self.number > 1:
            return f"{self.file} (from line {self.line_offset + 1})"
        return self.file

    @property
    def filename(self) -> str:
        """The code's filename: tracebacks read "line 3 of cell 4 of x.ipynb", "line 40 of x.py"."""
        return f"<cell {self.number} of {self.file}>" if self.notebook else f"<{self.file}>"

    def where(self, line: int) -> str:
        """A readable location of ``line`` (1-based, within the cell)."""
        if self.notebook:
            return f"line {line} of {self.label}"
        return f"line {line + self.line_offset} of {self.file}"


@dataclass
class Source:
    """A submission read into cells, plus what could not be read."""

    path: str
    files: list[str] = field(default_factory=list)
    cells: list[Cell] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # whole files that could not be read
    syntax_errors: list[tuple[Cell, str]] = field(default_factory=list)  # (cell, message)
    helpers: dict[str, str] = field(default_factory=dict)  # name.py -> text, importable by the cells

    @property
    def runnable(self) -> bool:
        """Some cell parses: there is something for a worker to run."""
        return len(self.cells) > len(self.syntax_errors)

    parsed: list[tuple[Cell, ast.Module]] = field(default_factory=list, repr=False)  # see trees()
    parsed_chars: int = 0  # of MAX_SUBMISSION_PARSED_CHARS

    def trees(self) -> list[tuple[Cell, ast.Module]]:
        """Parsed cells (those that parse), in order: parsed once, when read; do not change them."""
        return list(self.parsed)

    def statement_places(self) -> set[str]:
        """Where each top-level statement the worker runs is, as its load errors name it
        ("line 3 of cell 4 of x.ipynb", "line 40 of x.py"): read here, from the source."""
        return {f"line {stmt.lineno + cell.line_offset} of {cell.filename.strip('<>')}"
                for cell, tree in self.parsed for stmt in kept_statements(tree)}


# --------------------------------------------------------------------------- reading


def read(path: str | os.PathLike) -> Source:
    """Read a notebook, a .py file or a folder of them. Never runs student code.

    Files are read as files (:mod:`grader.files`): a symbolic link, a pipe, a device or a
    socket is named in ``problems`` and not read. Raises :class:`SubmissionError` only
    when ``path`` does not exist; every other problem (empty, corrupt, binary, not
    Python, a link) is recorded in ``problems``.
    """
    p = Path(path)
    src = Source(path=str(path))
    if not p.exists() and not p.is_symlink():
        raise SubmissionError(
            f"{path} does not exist. Pass an exercise notebook (.ipynb), a .py file, "
            "or the folder holding them (e.g. exercises/)."
        )
    if p.is_symlink():
        src.problems.append(f"{p.name} is {files.kind(os.lstat(p).st_mode)}: the grader reads only plain "
                            "files and folders, so it was not read")
        return src
    if p.is_dir():
        found = _listing(p)
        src.problems.extend(found.problems())
        names = found.files
        if not names and not found.refused:
            src.problems.append(f"the folder {p.name or path} holds no notebooks (.ipynb) or .py files")
        base = p
    else:
        names, base = [Path(p.name)], p.parent
    for rel in names:
        name = rel.as_posix()
        src.files.append(name)
        text = _read_file(base, rel, name, src)
        if rel.suffix == ".py" and len(rel.parts) == 1 and p.is_dir() and isinstance(text, str):
            src.helpers[rel.name] = text
    return src


def _listing(folder: Path) -> files.Listing:
    return files.listing(folder, keep=lambda name: name.endswith(SUFFIXES) and not name.startswith("."),
                         skip_dir=lambda name: name.startswith(".") or name in _SKIP_DIRS)


def files_in(folder: Path) -> list[Path]:
    """The notebooks and .py files a folder submission consists of, in order (hidden folders left
    out), links and other entries that are not plain files included (the report names them)."""
    found = _listing(folder)
    return sorted(folder / rel for rel in [*found.files, *(rel for rel, _ in found.refused)])


def _text(base: Path, rel: Path) -> str | Exception:
    try:
        data = files.read(base, rel, MAX_FILE_BYTES)
    except OSError as e:
        return e
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return ValueError("it is UTF-16 text; save it as UTF-8 (Jupyter and every editor can)")
    if b"\x00" in data:
        return ValueError("it is a binary file, not text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        return ValueError(f"it is not UTF-8 text ({e.reason} at byte {e.start})")


def _read_file(base: Path, f: Path, name: str, src: Source) -> str | None:
    """Add the file's cells to ``src`` (or a problem); its text, when it could be read."""
    text = _text(base, f)
    if isinstance(text, Exception):
        what = text.strerror if isinstance(text, OSError) and text.strerror else text
        src.problems.append(f"{name} could not be read: {what}")
        return None
    if not text.strip():
        src.problems.append(f"{name} is empty")
        return text
    if f.suffix == ".ipynb":
        try:
            cells = notebook_cells(text, name)
        except ValueError as e:  # the reader's own words: nothing of the file's text
            src.problems.append(f"{name} is not a readable notebook: {e}. "
                                "Open it in Jupyter and save it again, or re-download it.")
            return text
    elif f.suffix == ".py":
        cells = python_cells(text, name)
    else:
        src.problems.append(f"{name} is neither a notebook (.ipynb) nor a Python file (.py)")
        return text
    if not cells:
        src.problems.append(f"{name} has no code")
    for cell in cells:
        fits = len(cell.source) > MAX_PARSED_CHARS or (  # parse() refuses that one itself, unparsed
            src.parsed_chars + len(cell.source) <= MAX_SUBMISSION_PARSED_CHARS)
        tree = parse(cell.source) if fits else (
            f"TooLarge: the submission's code passed {MAX_SUBMISSION_PARSED_CHARS // 2**20} MiB "
            "(the grader reads no more of it)")
        if isinstance(tree, ast.Module):
            src.parsed_chars += len(cell.source)
        if isinstance(tree, ast.Module):
            src.parsed.append((cell, tree))
        else:
            src.syntax_errors.append((cell, _located(tree, cell)))
        src.cells.append(cell)
    return text


def notebook_cells(text: str, name: str) -> list[Cell]:
    """Code cells of a notebook's JSON text (nbformat 4), magics neutralised."""
    try:
        nb = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"invalid JSON at line {e.lineno}, column {e.colno}") from None
    except (RecursionError, MemoryError):  # arrays in arrays, 100,000 deep: no notebook looks like that
        raise ValueError("its JSON nests deeper than Python can read") from None
    if not isinstance(nb, dict):
        raise ValueError("no list of cells (is it a notebook?)")
    version = nb.get("nbformat")
    if type(version) is int and version < 4 and "worksheets" in nb:
        raise ValueError(f"it is in the old notebook format {version} (the grader reads format 4)")
    if not isinstance(nb.get("cells"), list):
        raise ValueError("no list of cells (is it a notebook?)")
    cells = []
    for i, c in enumerate(nb["cells"][:MAX_CELLS], start=1):
        if not isinstance(c, dict) or c.get("cell_type") != "code" or tagged_explore(c):
            continue
        source = c.get("source", "")
        if isinstance(source, list):
            source = "".join(s for s in source if isinstance(s, str))
        if not isinstance(source, str):
            continue
        code = strip_magics(source)
        if code is not None and code.strip():
            cells.append(Cell(name, i, code, notebook=True))
    return cells


# Only at column 0: an indented "% x" is usually the tail of a string-formatting expression.
_MAGIC = re.compile(r"^()(%|!|\w+\s*=\s*[%!])")


def strip_magics(source: str) -> str | None:
    """IPython-only lines become ``pass`` (same indentation, same line numbers).
    Returns None for a cell whose magic makes the whole body non-Python (``%%bash``)."""
    lines = source.splitlines()
    if lines and lines[0].lstrip().startswith("%%"):
        magic = lines[0].lstrip()[2:].split(maxsplit=1)
        if not magic or magic[0] not in _PYTHON_CELL_MAGICS:
            return None
        lines[0] = ""
    out = []
    for line in lines:
        m = _MAGIC.match(line)
        out.append(f"{m.group(1)}pass" if m else line)
    return "\n".join(out) + "\n"


_TOP_LEVEL_START = re.compile(r"^(def |async def |class |@|import |from |if __name__)")


def python_cells(text: str, name: str) -> list[Cell]:
    """A .py file as cells: ``# %%`` blocks if any, else the whole file, else (when
    the file does not parse) one block per top-level definition."""
    lines = text.splitlines()
    if any(line.startswith("# %%") for line in lines):
        starts = [0] + [i for i, line in enumerate(lines) if line.startswith("# %%") and i > 0]
    elif isinstance(parse(text), ast.Module):
        return [Cell(name, 1, text)]
    else:
        starts = [0] + [i for i, line in enumerate(lines) if i > 0 and _TOP_LEVEL_START.match(line)]
    cells = []
    for n, (a, b) in enumerate(zip(starts, starts[1:] + [len(lines)]), start=1):
        block = "\n".join(lines[a:b]) + "\n"
        if block.strip():
            cells.append(Cell(name, n, block, line_offset=a))
    return cells


def parse(source: str) -> ast.Module | str | None:
    """The parsed module, or a one-line description of the syntax error (or of a source too
    large to parse: over :data:`MAX_PARSED_CHARS`)."""
    if len(source) > MAX_PARSED_CHARS:
        return (f"TooLarge: {len(source) // 2**10} KiB of code in one cell; the grader parses at most "
                f"{MAX_PARSED_CHARS // 2**10} KiB of one (keep data in a file, not in the code)")
    try:
        return ast.parse(source)
    except SyntaxError as e:
        return f"SyntaxError: {e.msg} (line {e.lineno})"
    except (ValueError, RecursionError, MemoryError) as e:  # null bytes, absurd nesting
        return f"{type(e).__name__}: {e}"


def syntax_error(cell: Cell) -> str | None:
    tree = parse(cell.source)
    return _located(tree, cell) if isinstance(tree, str) else None


def _located(error: str, cell: Cell) -> str:
    """A syntax error placed by its line within the file, which is what the student can find."""
    m = re.search(r"\(line (\d+)\)$", error)
    if m:
        return error[: m.start()] + f"at {cell.where(int(m.group(1)))}"
    return f"{error} in {cell.label}"


_DEF = re.compile(r"^\s*(?:async\s+)?def\s+(\w+)", re.M)


def defined_names(cell: Cell) -> set[str]:
    """Names of functions a cell defines at top level (a guess by regex when it does not parse,
    or is too large to parse again for this: it is asked once per exercise not found)."""
    tree = parse(cell.source) if len(cell.source) <= MAX_PARSED_CHARS // 8 else None
    if isinstance(tree, ast.Module):
        return {s.name for s in tree.body if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef)}
    return set(_DEF.findall(cell.source))


# --------------------------------------------------------------------------- running (worker)


class CellTimeout(BaseException):
    """A cell ran over its time budget. BaseException: ``except Exception`` in student code won't eat it."""


def _alarm(signum, frame):
    raise CellTimeout()


@dataclass
class Loaded:
    """Namespaces after running the cells, and what went wrong on the way."""

    namespaces: dict[str, dict[str, Any]] = field(default_factory=dict)  # file -> globals
    errors: list[str] = field(default_factory=list)


def kept_statements(tree: ast.Module) -> list[ast.stmt]:
    return [s for s in tree.body if isinstance(s, _KEPT_STATEMENTS) and not explore_block(s)]


def run_cells(cells: list[Cell], *, budget: float, on_cell: Callable[[int], None] | None = None) -> Loaded:
    """Run the definitions of every cell, each file in its own namespace (worker only)."""
    loaded = Loaded()
    old = signal.signal(signal.SIGALRM, _alarm)
    try:
        for i, cell in enumerate(cells):
            if on_cell:
                on_cell(i)
            ns = loaded.namespaces.get(cell.file)
            if ns is None:
                module = types.ModuleType(f"submission_{len(loaded.namespaces)}")
                ns = loaded.namespaces[cell.file] = module.__dict__
            err = _run_cell(cell, ns, budget)
            if err:
                loaded.errors.append(err)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    return loaded


def _run_cell(cell: Cell, ns: dict, budget: float) -> str | None:
    tree = parse(cell.source)
    if not isinstance(tree, ast.Module):
        return None  # reported by the parent from syntax_error()
    filename = cell.filename
    if cell.line_offset:
        ast.increment_lineno(tree, cell.line_offset)  # line numbers of the whole .py file
    # Register the source so tracebacks and inspect.getsource see the student's lines.
    lines = ["\n"] * cell.line_offset + cell.source.splitlines(keepends=True)
    linecache.cache[filename] = (len(cell.source), None, lines, filename)
    first_error = None
    signal.signal(signal.SIGALRM, _alarm)
    for stmt in kept_statements(tree):
        where = f"line {stmt.lineno} of {filename.strip('<>')}"
        # Each statement gets the budget: a hanging demo line must not take the definitions after it.
        try:
            try:
                signal.setitimer(signal.ITIMER_REAL, budget)
                code = compile(ast.Module(body=[stmt], type_ignores=[]), filename, "exec")
                exec(code, ns)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except CellTimeout:
            error = f"{where} ran longer than {budget:g} s and was stopped"
        except BaseException as e:  # noqa: BLE001 -- sys.exit / KeyboardInterrupt cost that statement only
            error = f"{where} raised {type(e).__name__}: {_one_line(e)}"
        else:
            continue
        first_error = first_error or error
    return first_error


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    first = text[0] if text else ""
    return first[:300]


def pick(loaded: Loaded, names: list[str]) -> dict[str, tuple[Callable, str]]:
    """The graded functions: for each name, the first file (in order) whose namespace
    binds it to a callable, preferring a function defined in that file."""
    found: dict[str, tuple[Callable, str]] = {}
    for name in names:
        fallback = None
        for file, ns in loaded.namespaces.items():
            obj = ns.get(name)
            if obj is None or not callable(obj):
                continue
            code = getattr(obj, "__code__", None)
            if code is not None and code.co_filename.startswith("<") and file in code.co_filename:
                found[name] = (obj, f"line {code.co_firstlineno} of {code.co_filename.strip('<>')}")
                break
            fallback = fallback or (obj, file)
        else:
            if fallback:
                found[name] = fallback
    return found
