"""The grader's house, read from its own imports: layers that only import down, no
circle, no module over 450 lines.

Every ``import`` and ``from ... import`` statement counts, at module level or inside a
function, so a lazy import cannot hide an upward arrow. The package's face
(``grader/__init__.py``, which hands ``grade`` and ``check`` on lazily) is not a
room: importing it is no arrow.
"""

from __future__ import annotations

import ast
from fnmatch import fnmatch
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 450

#: The grader's floors, from the ground up; a module may import its own floor or lower ones.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("the contract and the cases", ("grader.spec", "grader.cases", "grader.seed", "grader.results",
                                    "grader.timing", "grader.fnspecs", "grader.files", "grader.fused",
                                    "grader.rules", "grader.submission", "grader.safetext",
                                    "grader.explore_cells", "grader.devices")),
    ("checks and their feedback", ("grader.mistakes", "grader.errors", "grader.hidden", "grader.diagnose",
                                   "grader.checks", "grader.checks.*")),
    ("the sandbox", ("grader.sandbox", "grader.sandbox.*")),
    ("reports", ("grader.report", "grader.terminal")),
    ("the engine", ("grader.verdicts", "grader.engine")),
    ("a single grading", ("grader.runners", "grader.runners.single", "grader.runners.single.*")),
    ("a class run", ("grader.runners.classmode", "grader.runners.classmode.*")),
    ("the platforms", ("grader.runners.platforms", "grader.runners.platforms.*")),
    ("the command", ("grader.__main__",)),
]
FACE = "grader"


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, modules: set[str], root: Path = ROOT) -> set[str]:
    """The modules of ``modules`` that the file at ``path`` imports, anywhere in it."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            # `from pkg import mod` imports the module; `from mod import name` the module itself
            subs = [f"{source}.{alias.name}" for alias in node.names]
            targets = [s for s in subs if s in modules] or [source]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # `import a.b.c` of a package: its deepest module
                target = target.rpartition(".")[0]
            if target and target not in (name, FACE):
                found.add(target)
    return found


def graph(package: str = "grader", root: Path = ROOT) -> dict[str, set[str]]:
    files = sorted((root / package).rglob("*.py"))
    modules = {module_name(f, root) for f in files}
    return {module_name(f, root): imports_of(f, modules, root) for f in files}


def floor_of(module: str, layers=LAYERS) -> int:
    for i, (_, patterns) in enumerate(layers):
        if any(fnmatch(module, p) for p in patterns):
            return i
    raise AssertionError(f"{module} is on no floor of LAYERS: add it where it belongs")


def upward(edges: dict[str, set[str]], layers=LAYERS) -> list[str]:
    return sorted(f"{a} -> {b}" for a, targets in edges.items() if a != FACE for b in targets
                  if floor_of(b, layers) > floor_of(a, layers))


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_checker_finds_a_circle_and_an_upward_import():
    layers = [("low", ("a",)), ("high", ("b", "c"))]
    edges = {"a": {"b"}, "b": {"c"}, "c": {"b"}}
    assert upward(edges, layers) == ["a -> b"]
    assert circles(edges) == [["b", "c"]]
    assert upward({"b": {"a"}}, layers) == [] and circles({"b": {"a"}, "a": set()}) == []


def test_the_checker_reads_relative_lazy_and_package_imports(tmp_path):
    pkg = tmp_path / "grader"
    (pkg / "sub").mkdir(parents=True)
    for name in ("__init__.py", "low.py", "sub/__init__.py", "sub/mod.py"):
        (pkg / name).write_text("")
    (pkg / "high.py").write_text("def f():\n    from .sub import mod\n    from . import low\n")
    (pkg / "sub" / "mod.py").write_text("from ..low import thing\nimport grader.high\nimport grader\n")
    edges = graph("grader", tmp_path)
    assert edges["grader.high"] == {"grader.sub.mod", "grader.low"}
    assert edges["grader.sub.mod"] == {"grader.low", "grader.high"}


def test_the_grader_imports_only_flow_down():
    edges = graph()
    assert not upward(edges), "imports from a lower floor up to a higher one:\n" + "\n".join(upward(edges))


def test_the_grader_has_no_import_circle():
    assert not circles(graph())


@pytest.mark.parametrize("package", ["grader", "attnmask"])
def test_no_module_is_longer_than_450_lines(package):
    long = {str(f.relative_to(ROOT)): n for f in (ROOT / package).rglob("*.py")
            if (n := len(f.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these by what they hold: {long}"


def test_the_engine_starts_its_worker_before_torch_is_imported():
    """The worker imports torch while the parent does: so nothing the command line imports
    before grade() starts the worker may import torch (it would put a second import of
    torch on every grading's critical path)."""
    import subprocess
    import sys

    code = ("import sys; import grader.engine, grader.report, grader.runners.single.cli, grader.verdicts; "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]", p.stdout
