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
import textwrap
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


# --------------------------------------------------------------------------- hints that narrate the code

#: Calls too common to say anything about a method (constructors, casts, Python built-ins).
COMMON_CALLS = {
    "float", "int", "len", "range", "tuple", "list", "bool", "isinstance", "ValueError", "TypeError",
    "to", "size", "dim", "sqrt", "any", "all", "sum", "item", "str", "print", "zip", "enumerate", "min",
    "max", "abs", "append", "contiguous", "clone", "detach", "unsqueeze", "type", "ones", "zeros", "full",
    "empty", "tensor", "long", "new_zeros", "new_full", "new_ones", "new_empty", "ones_like", "zeros_like",
}
MIN_STEPS = 3  # a hint may name two of the reference's calls (the idea needs words); three in order: a recipe
MIN_SHARE = 0.25  # ... and only when they are a real part of the reference (a quarter of its calls or more)

#: (notebook stem, exercise number, hint title) -> why it may stay. Each entry says why.
RECIPE_EXCEPTIONS: dict[tuple[str, int, str], str] = {
    ("ex08_speed", 1, "Hint 3: −∞ rows"):
        "issue 45 item 2: ex08's statement and Hint 3 give the guard; `method` rewrites ex08's hints "
        "this step",
    ("ex11_across_devices", 1, "Hint 2: finite gradients"):
        "issue 45 item 2: 11.1's hints are `method`'s to rewrite this step (ex11 is theirs)",
    ("ex11_across_devices", 2, "Hint 2: both parts empty"):
        "issue 45 item 2: 11.2's hints are `method`'s to rewrite this step (ex11 is theirs)",
}


def _stem(word: str) -> str:
    """One spelling for a call and the prose that names it: `scatter_`, `Sorting` -> scatter, sort."""
    word = word.lower().rstrip("_")
    for suffix in ("ing", "ed", "es", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)]
            break
    return word[:-1] if word.endswith("e") and len(word) > 3 else word  # transpose, transposing -> transpos


def reference_calls(code: str) -> list[str]:
    """The functions and methods one solution region calls, in source order (common ones left out)."""
    found = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            if name and name not in COMMON_CALLS:
                found.append((node.lineno, node.col_offset, _stem(name)))
    return [name for _, _, name in sorted(found)]


def named_in_order(calls: list[str], text: str) -> list[str]:
    """The longest run of ``calls`` that ``text`` names in the same order (a longest common subsequence)."""
    calls = [_stem(c) for c in calls]
    words = [_stem(w) for w in re.findall(r"[A-Za-z_]\w*", text)]
    n, m = len(calls), len(words)
    table = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            table[i][j] = (table[i + 1][j + 1] + 1 if calls[i] == words[j]
                           else max(table[i + 1][j], table[i][j + 1]))
    i = j = 0
    out = []
    while i < n and j < m:
        if calls[i] == words[j]:
            out.append(calls[i])
            i, j = i + 1, j + 1
        elif table[i + 1][j] >= table[i][j + 1]:
            i += 1
        else:
            j += 1
    return out


def is_recipe(calls: list[str], text: str) -> list[str]:
    """The calls ``text`` narrates in order when they make a recipe of the reference, else []."""
    named = named_in_order(calls, text)
    return named if len(named) >= MIN_STEPS and len(named) >= MIN_SHARE * len(calls) else []


def _regions(source: str) -> list[str]:
    out, current = [], None
    for line in source.split("\n"):
        if line.strip() == release.BEGIN:
            current = []
        elif line.strip() == release.END:
            out.append(textwrap.dedent("\n".join(current)))
            current = None
        elif current is not None:
            current.append(line)
    return out


def exercise_hints(nb: nbformat.NotebookNode) -> list[tuple[int, str, str]]:
    """(exercise number, hint title, hint text) of every collapsed hint under an '## Exercise' cell."""
    out, number = [], 0
    for cell in nb.cells:
        if cell.cell_type == "markdown" and cell.source.startswith("## Exercise"):
            number += 1
        if cell.cell_type == "markdown" and number:
            for m in re.finditer(r"<details>(.*?)</details>", cell.source, re.S):
                title = re.search(r"<summary>(.*?)</summary>", m.group(1))
                out.append((number, title.group(1).strip() if title else "?", m.group(1)))
    return out


def stub_messages(nb: nbformat.NotebookNode) -> list[str]:
    out = []
    for cell in (c for c in nb.cells if c.cell_type == "code"):
        for line in cell.source.split("\n"):
            if line.strip().startswith("raise NotImplementedError("):
                out.append(ast.literal_eval(line.strip()[len("raise NotImplementedError("):-1]))
    return out


#: 12.2's Hint 2 as it stood before issue 45: two stable sorts and the scatter, the reference in prose.
OLD_12_2_HINT_2 = """`torch.sort(..., stable=True)` keeps equal values in index order, so a descending stable
sort puts the lower index first among ties. Sorting twice, stably, orders by two keys (the last sort decides
first). The rank of each key is the inverse of the sorted order: `scatter` the positions `0 .. Lk-1` back to
the indices."""


def test_the_recipe_scan_catches_a_hint_that_narrates_the_reference():
    path = ROOT / "solutions" / "ex12_modern_architectures.ipynb"
    regions = [r for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"
               for r in _regions(c.source)]
    calls = reference_calls(regions[1])  # 12.2 topk_selection_mask
    assert is_recipe(calls, OLD_12_2_HINT_2) == ["sort", "sort", "scatter"]
    # The idea without the calls passes; so does naming two of them.
    assert not is_recipe(calls, "Rank the keys each query may see; a rank below k is selected.")
    assert not is_recipe(calls, "A stable sort keeps ties in index order; `scatter` undoes an order.")
    # Prose spelling counts: 'viewing', 'transposing', 'reshapes' name view, transpose, reshape.
    assert is_recipe(["view", "transpose", "softmax", "transpose", "reshape"],
                     "viewing the axis, transposing it, then softmax; transposing back and reshapes")


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_no_hint_or_stub_narrates_the_reference_calls_in_order(path):
    """A hint gives the idea, a shape or invariant, a test: never the reference's calls in order."""
    solution = nbformat.read(path, as_version=4)
    regions = [r for c in solution.cells if c.cell_type == "code" for r in _regions(c.source)]
    exercise = nbformat.read(ROOT / "exercises" / path.name, as_version=4)
    recipes = []
    for number, title, text in exercise_hints(exercise):
        named = is_recipe(reference_calls(regions[number - 1]), text) if number <= len(regions) else []
        if named and (path.stem, number, title) not in RECIPE_EXCEPTIONS:
            recipes.append(f"  {path.stem} exercise {number}, {title!r}: names {' -> '.join(named)}")
    for message in stub_messages(exercise):
        for region in regions:
            if named := is_recipe(reference_calls(region), message):
                recipes.append(f"  {path.stem} stub {message!r}: names {' -> '.join(named)}")
    assert not recipes, ("hints that narrate the reference (give the idea, a shape, a test):\n"
                         + "\n".join(recipes))


@pytest.mark.parametrize("path", EXERCISES, ids=lambda p: p.stem)
def test_every_stub_message_is_neutral(path):
    """Read before any hint is opened, a stub names its function and number and nothing of the method."""
    chapter = release.chapter_of(path)
    messages = stub_messages(nbformat.read(path, as_version=4))
    assert messages
    for m, message in enumerate(messages, start=1):
        name = message.split(":")[0]
        want = f"{name}: implement it (see exercise {chapter}.{m})"
        assert message == release.stub_message(name, chapter, m) == want
