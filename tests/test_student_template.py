"""The student template (`python -m grader template`) carries the public checks as data, not the answers.

It holds no ``attnmask`` and no implementation of a graded function, and yet its
``check()`` and ``python -m grader`` judge the public cases as the course's grader
does and name the classic mistakes. Its commands run here in a separate Python in
which ``import attnmask`` fails, so nothing they do can lean on the reference.
"""

from __future__ import annotations

import ast
import inspect
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import attnmask
from grader.runners.platforms import github

REPO = Path(__file__).resolve().parents[1]
TEXT = (".py", ".ipynb", ".md", ".json", ".toml", ".yml", ".txt", ".sh", ".cfg")


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    return github.build_template(REPO, tmp_path_factory.mktemp("t") / "template")


class _NoStrings(ast.NodeTransformer):
    """Every string literal emptied: a hint or a message that quotes code is not code."""

    def visit_Constant(self, node):
        return ast.Constant("") if isinstance(node.value, str) else node


def body_lines(fn) -> list[str]:
    """The statements of ``fn``'s body (its docstring left out), one stripped line each, those
    long enough to be an answer rather than a common idiom (``return out``)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    (node,) = tree.body
    body = node.body[1:] if ast.get_docstring(node) else node.body
    lines = []
    for stmt in body:
        for line in ast.unparse(_NoStrings().visit(stmt)).splitlines():
            line = line.strip()
            if len(line) >= 24 and not line.startswith(("raise ", "if ", "else", "return None")):
                lines.append(line)
    return lines


def texts(folder: Path):
    for path in folder.rglob("*"):
        if path.is_file() and path.suffix in TEXT:
            yield path, path.read_text(errors="replace")


def code(folder: Path):
    """The template's code: its Python files, and the code cells of its notebooks (their
    Markdown states each task, formulas included, on purpose)."""
    for path, text in texts(folder):
        if path.suffix == ".py":
            yield path, normalised(text)
        elif path.suffix == ".ipynb":
            cells = json.loads(text)["cells"]
            yield path, "\n".join(normalised("".join(c["source"])) for c in cells if c["cell_type"] == "code")


def normalised(source: str) -> str:
    """Python source as ast.unparse writes it, string literals emptied, when it parses (so quoting and
    spacing cannot hide a copy); else as it is."""
    try:
        return ast.unparse(_NoStrings().visit(ast.parse(source)))
    except SyntaxError:
        return source


def test_the_template_holds_no_reference(template):
    assert not (template / "attnmask").exists()
    assert not list(template.rglob("ch[0-9]*_*.py")), "the chapters' check modules hold the recognisers"
    assert (template / "grader" / "data" / "public_checks" / "index.json").is_file()
    assert (template / ".gitignore").is_file() and "__pycache__/" in (template / ".gitignore").read_text()
    found = []
    files = list(code(template))
    for name in attnmask.CONTRACT:
        lines = body_lines(getattr(attnmask, name))
        assert lines, f"{name}: no body lines to look for"
        for line in lines:
            found += [f"{name}: {line!r} in {path.relative_to(template)}"
                      for path, text in files if line in text]
    assert not found, "\n".join(found)
    for path, text in code(template):  # the notebooks need nothing of the course but the grader
        if path.suffix == ".ipynb":
            assert "attnmask" not in text, path


def test_the_search_would_find_a_copy(template, tmp_path):
    """The search above is not blind: a pasted reference body is found."""
    copy = tmp_path / "copy"
    shutil.copytree(template / "grader", copy)
    (copy / "pasted.py").write_text(inspect.getsource(attnmask.real_models))
    texts_ = [t for _, t in code(copy)]
    assert any(line in t for line in body_lines(attnmask.packed_labels) for t in texts_)


def run_without_attnmask(template: Path, tmp_path: Path, *args: str, code: str | None = None):
    """``python ARGS`` (or ``python -c CODE``) in the template, where ``import attnmask`` fails."""
    blocker = tmp_path / "blocker"
    blocker.mkdir(exist_ok=True)
    (blocker / "attnmask.py").write_text("raise ImportError('attnmask is not in the student template')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("GRADER_SEED",)}
    # The template on the path as `pip install -e .` would put it: the worker must import this grader,
    # not the course's (installed editable on a maintainer's machine).
    env["PYTHONPATH"] = os.pathsep.join([str(blocker), str(template)])
    argv = [sys.executable, *(["-c", code] if code is not None else args)]
    return subprocess.run(argv, cwd=template, capture_output=True, text=True, timeout=300, env=env)


CHECKS = """
import torch, sys
from grader import check
import grader
assert grader.__file__.startswith({where!r}), grader.__file__

def causal_mask(n, *, device=None):          # the triangle on the wrong side
    return torch.ones(n, n, dtype=torch.bool, device=device).triu()
check(causal_mask)

def causal_mask(n, *, device=None):          # right
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()
check(causal_mask)

def kv_cache_attention(q, k_new, v_new, k_cache, v_cache):   # top-left causal mask under a cache
    k, v = torch.cat([k_cache, k_new], 2), torch.cat([v_cache, v_new], 2)
    n, Lk = q.shape[2], k.shape[2]
    keep = torch.ones(n, Lk, dtype=torch.bool).tril()
    w = (q @ k.mT / q.shape[-1] ** 0.5).masked_fill(~keep, float("-inf")).softmax(-1)
    return w @ v, k, v
check(kv_cache_attention)
print("attnmask imported:", "attnmask" in sys.modules and sys.modules["attnmask"] is not None)
"""


def test_check_in_the_template_names_the_classic_mistakes(template, tmp_path):
    p = run_without_attnmask(template, tmp_path, code=CHECKS.format(where=str(template)))
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "the triangle is on the wrong side" in out
    assert "causal_mask: 4 of 4 public checks pass." in out and "The public checks pass." in out
    assert "the causal mask is aligned top-left" in out
    assert "attnmask imported: False" in out
    assert "internal grader error" not in out


@pytest.mark.slow
def test_the_template_grades_its_public_checks(template, tmp_path):
    """The stubs score 0; a finished chapter gets every public point; the report says public only."""
    out = tmp_path / "r.json"
    p = run_without_attnmask(template, tmp_path, "-m", "grader", "exercises/", "--json", str(out))
    assert p.returncode == 0, p.stderr
    assert json.loads(out.read_text())["score"] == 0 and "public checks only" in p.stdout
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy2(REPO / "solutions" / "ex01_leakage.ipynb", work / "ex01_leakage.ipynb")
    p = run_without_attnmask(template, tmp_path, "-m", "grader", str(work / "ex01_leakage.ipynb"),
                             "--json", str(out))
    assert p.returncode == 0, p.stderr
    data = json.loads(out.read_text())
    assert data["score"] == data["max_score"] > 0, p.stdout
