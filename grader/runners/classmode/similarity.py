"""Similarity flags: pairs of submitted functions too alike to have been written apart.

Per exercise, each student's function is compared with every other student's and with
the reference (``solutions/`` and ``attnmask``'s source). Both sides are normalised
first (:func:`tokens`): only the function's body counts (its signature is the exercise's),
names it binds (arguments, locals) become ``v0, v1, …`` in order of first use, constants
become their type, docstrings, annotations, comments and formatting disappear; what the
code *calls* (``torch.tril``, ``masked_fill``) stays. A function is the set of its runs of
:data:`K` tokens (:func:`shingles`), and two are compared by the Jaccard similarity of
those sets once the runs that carry no evidence are taken out (:class:`Evidence`), as MOSS
sets aside base code and passages common to many submissions:

* **base code**: runs found in what the exercise hands everyone, the stub and every piece
  of code in its statement and hints (:func:`base_code`);
* **common code**: runs found in at least :data:`COMMON_SHARE` of the class's *distinct*
  functions for the exercise, references included, and in at least :data:`COMMON_MIN` of
  them (identical copies count once, so a function pasted by ten students stays evidence).

What is left must be at least :data:`MIN_SHINGLES` runs on both sides, or the pair is not
compared: a hint-led one-line ``causal_mask`` can only be written a few ways, and two
students writing it alike says nothing. A pair at or above :data:`THRESHOLD` is flagged;
:func:`grouped` makes one flag of each group of students (and references) linked by flagged
pairs.

A flag is information for the instructor, not a grade change: nothing here touches a score.
"""

from __future__ import annotations

import ast
import itertools
import json
import re
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from ... import submission

THRESHOLD = 0.8
#: Runs of evidence a function must keep, on both sides of a pair, to be compared.
MIN_SHINGLES = 30
K = 5
#: A run in this share of the exercise's distinct functions (and in COMMON_MIN of them) is common.
COMMON_SHARE = 0.25
COMMON_MIN = 4
#: Tokens of the normalised syntax tree that say nothing about how the code was written.
_NOISE = {"Load", "Store", "Del", "[", "]", "="}
FUNCTIONS_FILE = "functions.json"
NOTE = ("A flag is information, not a grade change: two functions that normalise alike may come from a "
        "shared study session, a hint in class or the same textbook line. Read the two side by side, talk "
        "to the students, and decide; the grader has changed no score.")
_REPO = Path(__file__).resolve().parents[3]


def functions_in(path: Path, names: Iterable[str]) -> dict[str, str]:
    """The source of each top-level function of ``names`` a submission defines (the last
    definition wins, as when the notebook runs), read as the grader reads it
    (:func:`grader.submission.read`): no link, pipe or device is read."""
    wanted, found = set(names), {}
    if path is None:
        return {}
    try:
        src = submission.read(path)
    except submission.SubmissionError:
        return {}
    for cell, tree in src.trees():
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name in wanted:
                seg = ast.get_source_segment(cell.source, node)
                if seg:
                    found[node.name] = seg
    return found


def save_functions(path: Path | None, folder: Path, exercises: Sequence[str]) -> None:
    """OUT/STUDENT/functions.json: the student's graded functions, for the class report."""
    if path is None:
        return
    folder.mkdir(parents=True, exist_ok=True)
    (folder / FUNCTIONS_FILE).write_text(json.dumps(functions_in(path, exercises), indent=1))


class _Normalise(ast.NodeTransformer):
    def __init__(self, bound: dict[str, str]):
        self.bound = bound

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return ast.Name(id=self.bound.get(node.id, node.id), ctx=node.ctx)

    def visit_arg(self, node: ast.arg) -> ast.AST:
        return ast.arg(arg=self.bound.get(node.arg, node.arg), annotation=None)

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        return ast.Constant(value=type(node.value).__name__)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.AST:
        if isinstance(node.op, (ast.USub, ast.UAdd)) and isinstance(node.operand, ast.Constant):
            return self.visit_Constant(node.operand)  # -1 is a constant as 1 is
        return self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]  # the docstring
        node.body, node.returns, node.name = body or [ast.Pass()], None, "f"
        return self.generic_visit(node)


@lru_cache(maxsize=4096)
def tokens(source: str) -> tuple[str, ...]:
    """The normalised token sequence of a function's body (or of any code, for
    :func:`base_code`); empty when it does not parse."""
    try:
        tree = ast.parse(textwrap.dedent(source))
    except (SyntaxError, ValueError):
        return ()
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        names = [node.arg] if isinstance(node, ast.arg) else (
            [node.id] if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) else [])
        for n in names:
            bound.setdefault(n, f"v{len(bound)}")
    tree = _Normalise(bound).visit(tree)
    body = tree.body
    if len(body) == 1 and isinstance(body[0], ast.FunctionDef):
        body = body[0].body  # the signature is the exercise's, the same for everyone
    out: list[str] = []
    for node in body:
        dumped = ast.dump(node, annotate_fields=False)
        out += [t for t in re.findall(r"[A-Za-z_][A-Za-z_0-9]*|[^\sA-Za-z_0-9,()']", dumped)
                if t not in _NOISE]
    return tuple(out)


def shingles(source: str) -> frozenset[tuple[str, ...]]:
    t = tokens(source)
    return frozenset(t[i:i + K] for i in range(max(0, len(t) - K + 1)))


def similarity(a: str, b: str, ignore: frozenset = frozenset()) -> float:
    """Jaccard similarity of two functions' normalised runs, those in ``ignore`` left out; in [0, 1]."""
    sa, sb = shingles(a) - ignore, shingles(b) - ignore
    return len(sa & sb) / len(sa | sb) if sa and sb else 0.0


_CODE = re.compile(r"```(?:python)?\n(.*?)```|`([^`\n]+)`", re.S)


def _header(stub: str, exercise: str) -> str | None:
    """``def NAME(ARGS):`` of the exercise's stub: wrapped round a snippet of the statement, it makes
    the snippet's argument names normalise as a student's function's do."""
    try:
        tree = ast.parse(stub)
    except (SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == exercise:
            node.body, node.returns, node.decorator_list = [ast.Pass()], None, []
            return ast.unparse(node).splitlines()[0]
    return None


def base_code(exercise: str, repo: Path = _REPO) -> frozenset[tuple[str, ...]]:
    """The runs of code the exercise hands every student: its stub in ``exercises/`` and each
    code span and block of its statement and hints (those that parse as Python), read as the
    body of the stub's function."""
    found: set[tuple[str, ...]] = set()
    folder = repo / "exercises"
    for f in sorted(folder.glob("ex*.ipynb")) if folder.is_dir() else []:
        try:
            cells = json.loads(f.read_text())["cells"]
            texts = [(c.get("cell_type"), "".join(c.get("source", ""))) for c in cells]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
        stub = next((t for kind, t in texts if kind == "code" and f"def {exercise}(" in t), None)
        header = _header(stub, exercise) if stub else None
        if header is None:
            continue
        found |= shingles(stub)
        for kind, text in texts:
            if kind == "markdown" and f"`{exercise}`" in text:
                for block, span in _CODE.findall(text):
                    found |= shingles(header + "\n" + textwrap.indent(block or span, "    "))
    return frozenset(found)


@dataclass
class Evidence:
    """The runs of one exercise that carry no evidence: base code, and code common to the class."""

    ignore: frozenset

    @classmethod
    def of(cls, exercise: str, distinct: Sequence[str], base: frozenset) -> Evidence:
        counts: dict[tuple[str, ...], int] = {}
        for src in distinct:
            for sh in shingles(src):
                counts[sh] = counts.get(sh, 0) + 1
        common = max(COMMON_MIN, COMMON_SHARE * len(distinct))
        return cls(base | frozenset(sh for sh, n in counts.items() if n >= common))

    def enough(self, source: str) -> bool:
        return len(shingles(source) - self.ignore) >= MIN_SHINGLES

    def score(self, a: str, b: str) -> float:
        return similarity(a, b, self.ignore)


def references(exercises: Sequence[str], repo: Path = _REPO) -> dict[str, list[tuple[str, str]]]:
    """exercise -> [(where, source)] from solutions/ and attnmask/ (those that exist here)."""
    out: dict[str, list[tuple[str, str]]] = {e: [] for e in exercises}
    for folder in ("solutions", "attnmask"):
        if not (repo / folder).is_dir():
            continue
        for f in submission.files_in(repo / folder):
            for name, src in functions_in(f, exercises).items():
                out[name].append((f"reference: {folder}/{f.relative_to(repo / folder).as_posix()}", src))
    return out


@dataclass
class Flag:
    exercise: str
    a: str
    b: str  # another student, or "reference: …"
    score: float
    a_source: str
    b_source: str
    others: list[str] = field(default_factory=list)  # more students in the same group as a and b


def grouped(found: Sequence[Flag]) -> list[Flag]:
    """One flag per group of students (and references) linked by flagged pairs, per exercise: a
    function shared by ten students, or pasted by them from the solutions, is one finding, not
    forty-five pairs nor one per reference. The group's flag is its most similar pair; ``others``
    names the rest."""
    parent: dict[tuple[str, str], tuple[str, str]] = {}

    def root(x: tuple[str, str]) -> tuple[str, str]:
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    for f in found:
        parent[root((f.exercise, f.b))] = root((f.exercise, f.a))
    best: dict[tuple[str, str], Flag] = {}
    members: dict[tuple[str, str], set[str]] = {}
    for f in found:
        r = root((f.exercise, f.a))
        members.setdefault(r, set()).update((f.a, f.b))
        if r not in best or (f.score, f.b.startswith("reference:")) > (best[r].score,
                                                                       best[r].b.startswith("reference:")):
            best[r] = f
    out = []
    for r, f in best.items():
        f.others = sorted(members[r] - {f.a, f.b})
        out.append(f)
    return sorted(out, key=lambda f: (-f.score, f.exercise, f.a, f.b))


def flags(students: dict[str, dict[str, str]], exercises: Sequence[str], *, threshold: float = THRESHOLD,
          refs: dict[str, list[tuple[str, str]]] | None = None, repo: Path = _REPO) -> list[Flag]:
    """Pairs at or above ``threshold``, most similar first. ``students``: name -> {exercise: source}.

    Students whose functions normalise to the same tokens are compared once, as one: each
    of them is flagged with the first (a chain that :func:`grouped` turns into one group)."""
    refs = references(exercises) if refs is None else refs
    out = []
    for ex in exercises:
        alike: dict[tuple[str, ...], list[tuple[str, str]]] = {}
        for n, fns in sorted(students.items()):
            if ex in fns and tokens(fns[ex]):
                alike.setdefault(tokens(fns[ex]), []).append((n, fns[ex]))
        ref_sources = {tokens(rs): (where, rs) for where, rs in refs.get(ex, []) if tokens(rs)}
        distinct = [same[0][1] for same in alike.values()] + [
            rs for t, (_, rs) in ref_sources.items() if t not in alike]
        evidence = Evidence.of(ex, distinct, base_code(ex, repo))
        groups = [same for same in alike.values() if evidence.enough(same[0][1])]
        for same in groups:
            out += [Flag(ex, same[0][0], b, 1.0, same[0][1], sb) for b, sb in same[1:]]
        for ((a, sa), *_), ((b, sb), *_) in itertools.combinations(groups, 2):
            s = evidence.score(sa, sb)
            if s >= threshold:
                out.append(Flag(ex, a, b, round(s, 3), sa, sb))
        for same in groups:
            best = max(((evidence.score(same[0][1], rs), where, rs) for where, rs in ref_sources.values()
                        if evidence.enough(rs)), default=None)
            if best is not None and best[0] >= threshold:
                out += [Flag(ex, a, best[1], round(best[0], 3), sa, best[2]) for a, sa in same]
    return sorted(out, key=lambda f: (-f.score, f.exercise, f.a, f.b))


def load_students(out: Path, rows: Sequence[dict]) -> dict[str, dict[str, str]]:
    """name -> {exercise: source} from each graded student's OUT/slug/functions.json."""
    found = {}
    for r in rows:
        if not r.get("slug"):
            continue
        try:
            data = json.loads((out / r["slug"] / FUNCTIONS_FILE).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            found[r["student"]] = {k: v for k, v in data.items() if isinstance(v, str)}
    return found
