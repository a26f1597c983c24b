"""Exercises that teach: the answer is not handed out, and the student uses what they build.

* No line of a solution (the code between ``# BEGIN SOLUTION`` and ``# END SOLUTION`` in
  ``solutions/``) appears in what the student reads: an exercise notebook's markdown
  (statements, hints, worked examples) or a book chapter's code cells.
* Every exercise notebook ships Explore cells (tagged ``explore``): with the release's stubs
  each prints only "Explore: finish exercise N.M (name) first." lines; with the solutions
  each shows its payoff (the stored outputs, which nbval keeps fresh, hold no error).

Notebooks are found, not listed: a new chapter or a new exercise is covered as it lands.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import nbformat
import pytest

from grader.explore_cells import TAG, explore_block
from grader.runners.single import release

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = sorted((ROOT / "solutions").glob("ex*.ipynb"))
EXERCISES = sorted((ROOT / "exercises").glob("ex*.ipynb"))
CHAPTERS = sorted((ROOT / "book").glob("*.ipynb"))
MIN_CHARS = 20  # a shorter line (`return mask`, `pos = torch.arange(n)`) is an idiom, not an answer

#: (normalised solution line, where it is found) -> why it may stay. Each entry says why.
EXCEPTIONS: dict[tuple[str, str], str] = {
    # (normalised line, where): why a solution line may stand there. None today: chapter 8's cell that
    # spelled out the online-softmax update is a predict-then-run prompt over attnmask now.
}


def normalised(line: str) -> str:
    """The code of one line: its comment dropped, whitespace removed, one quote style."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(line.strip() + "\n").readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        tokens = []
    comments = [t for t in tokens if t.type == tokenize.COMMENT]
    code = line.strip()[: comments[0].start[1]] if comments else line.strip()
    return re.sub(r"\s+", "", code).replace("'", '"')


def solution_lines(path: Path) -> list[str]:
    """The normalised code lines (longer than MIN_CHARS) of a notebook's solution regions."""
    out = []
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type != "code":
            continue
        inside = False
        for line in cell.source.split("\n"):
            if line.strip() in (release.BEGIN, release.END):
                inside = line.strip() == release.BEGIN
            elif inside and not line.strip().startswith("#") and len(n := normalised(line)) > MIN_CHARS:
                out.append(n)
    return out


def read_texts() -> list[tuple[str, str]]:
    """(where, normalised text) of everything the student reads that must not hold a solution line."""
    texts = []
    for path in EXERCISES:
        nb = nbformat.read(path, as_version=4)
        markdown = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
        texts.append((f"exercises/{path.name}", re.sub(r"\s+", "", markdown).replace("'", '"')))
    for path in CHAPTERS:
        nb = nbformat.read(path, as_version=4)
        code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
        texts.append((f"book/{path.name}", "".join(normalised(line) for line in code.split("\n"))))
    return texts


def test_the_normalisation_ignores_layout_comments_and_quotes():
    line = "    x = zeros.masked_fill(~m, float('-inf'))  # note"
    assert normalised(line) == 'x=zeros.masked_fill(~m,float("-inf"))'
    assert normalised("s = '#' + t") == 's="#"+t'


def test_the_scan_finds_a_planted_solution_line(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "def f(x):\n    # BEGIN SOLUTION\n    # HINT: h\n    return x.masked_fill(~x, float('-inf'))\n"
        "    # END SOLUTION")])
    nbformat.write(nb, tmp_path / "ex01_x.ipynb")
    (line,) = solution_lines(tmp_path / "ex01_x.ipynb")
    hint = "Hint: `return x.masked_fill( ~x, float(\"-inf\") )`"
    assert line in re.sub(r"\s+", "", hint)


def test_no_solution_line_is_in_a_statement_hint_or_chapter():
    assert SOLUTIONS and EXERCISES and CHAPTERS
    texts = read_texts()
    found = {(line, where) for path in SOLUTIONS for line in solution_lines(path)
             for where, text in texts if line in text}
    leaks = sorted(found - EXCEPTIONS.keys())
    assert not leaks, "solution lines the student can read (give the idea, not the line):\n" + "\n".join(
        f"  {where}: {line}" for line, where in leaks)
    stale = sorted(EXCEPTIONS.keys() - found)
    assert not stale, f"exceptions that no longer match anything: drop them from EXCEPTIONS: {stale}"


# --------------------------------------------------------------------------- Explore cells

STUB_LINE = re.compile(r"^Explore: finish exercise (\d+)\.(\d+) \((\w+)\) first\.$")


def _explore_cells(nb: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    return [c for c in nb.cells if c.cell_type == "code" and TAG in c.metadata.get("tags", [])]


@pytest.mark.parametrize("path", EXERCISES, ids=lambda p: p.stem)
def test_every_exercise_notebook_ships_explore_cells_in_explore_blocks(path):
    cells = _explore_cells(nbformat.read(path, as_version=4))
    assert cells, f"{path.name}: no code cell tagged '{TAG}' (the payoff that uses the student's functions)"
    for cell in cells:
        body = ast.parse(cell.source).body
        assert any(explore_block(stmt) for stmt in body), (
            f"{path.name}: an '{TAG}' cell without a top-level `with explore():` block:\n{cell.source}")


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_with_the_solutions_explore_cells_show_their_payoff(path):
    """The stored outputs (nbval re-runs the notebook and compares them) hold the payoff: output,
    no error and no 'finish exercise ... first' line."""
    for cell in _explore_cells(nbformat.read(path, as_version=4)):
        kinds = [o.output_type for o in cell.outputs]
        assert kinds and "error" not in kinds, f"{path.name}: an Explore cell shows {kinds}:\n{cell.source}"
        text = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
        assert "Explore: finish" not in text, f"{path.name}: {text}"


@pytest.mark.slow
@pytest.mark.parametrize("path", EXERCISES, ids=lambda p: p.stem)
def test_with_the_stubs_explore_cells_print_one_line_each_and_no_traceback(path):
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(ROOT)}})
    client.execute()
    chapter = release.chapter_of(path)
    cells = _explore_cells(nb)
    assert cells
    for cell in cells:
        assert all(o.output_type == "stream" and o.name == "stdout" for o in cell.outputs), (
            f"{path.name}: an Explore cell with the stubs gave {[o.output_type for o in cell.outputs]}")
        lines = "".join(o.text for o in cell.outputs).splitlines()
        assert lines, f"{path.name}: an Explore cell printed nothing with the stubs:\n{cell.source}"
        for line in lines:
            m = STUB_LINE.match(line)
            assert m and int(m[1]) == chapter, f"{path.name}: {line!r} (only 'Explore: finish ...' lines)"
