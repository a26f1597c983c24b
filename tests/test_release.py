"""The exercise notebooks are generated from the solution notebooks (grader/release.py)."""

from __future__ import annotations

import ast
import inspect
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import torch

from grader.runners.single import release

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = ROOT / "solutions"
EXERCISES = ROOT / "exercises"

# The exercise contract: chapter notebook -> its graded functions, in order.
CHAPTERS = {
    "ex01_leakage": ("causal_mask", "influence_matrix", "find_leaking_layer"),
    "ex02_softmax": ("to_additive", "masked_softmax", "attention"),
    "ex03_padding": ("padding_mask",),
    "ex04_combining": ("decoder_mask", "leaks_across_padding"),
    "ex05_cross_attention": ("encoder_decoder_masks", "multi_head_attention"),
    "ex06_kv_cache": ("kv_cache_attention",),
    "ex07_beyond_triangle": ("sliding_window_mask", "prefix_lm_mask", "document_mask"),
    "ex08_speed": ("tiled_attention", "tiled_attention_backward", "tiled_attention_fn"),
    "ex09_real_models": ("left_padding_position_ids", "packed_labels", "gqa_attention", "alibi_bias"),
    "ex10_serving_multimodal": ("image_text_mask", "rolling_cache_mask", "paged_attention", "tree_mask"),
    "ex11_across_devices": ("attention_lse", "merge_partials", "zigzag_ring_mask", "chunked_local_mask",
                            "padded_chunked_mask", "ring_attention", "cascade_attention"),
    "ex12_modern_architectures": ("sink_attention", "topk_selection_mask", "block_diffusion_mask",
                                  "decay_mask"),
    "ex13_masks_in_a_kernel": ("block_sparse_forward", "block_sparse_backward"),
}
#: Graded launchers that are given whole: the student writes the @triton.jit kernel they launch,
#: and the stub is in the kernel.
STUB_IN = {"block_sparse_forward": "forward_kernel", "block_sparse_backward": "backward_kernel"}
CONTRACT = [name for names in CHAPTERS.values() for name in names]
# Names that would be the answer: no exercise function may use them.
FORBIDDEN = {"attnmask", "scaled_dot_product_attention", "MultiheadAttention",
             "multi_head_attention_forward", "flex_attention", "enable_gqa", "build_alibi_tensor"}
STUB = re.compile(r"^(?P<name>\w+): implement it \(see exercise (?P<ch>\d+)\.(?P<m>\d+)\)$")


def _read(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


def _code(nb: nbformat.NotebookNode, *, keep_solution_only: bool = True) -> str:
    cells = [c for c in nb.cells if c.cell_type == "code"
             and (keep_solution_only or release.SOLUTION_ONLY not in c.metadata.get("tags", []))]
    return "\n\n".join(c.source for c in cells)


def _functions(source: str) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef)}


def _regions(source: str) -> list[list[str]]:
    """The lines between each BEGIN/END SOLUTION pair."""
    out, current = [], None
    for line in source.split("\n"):
        if line.strip() == release.BEGIN:
            current = []
        elif line.strip() == release.END:
            out.append(current)
            current = None
        elif current is not None:
            current.append(line)
    return out


# --------------------------------------------------------------------------- the real notebooks

def test_chapter_files_exist():
    assert sorted(p.stem for p in SOLUTIONS.glob("ex*.ipynb")) == sorted(CHAPTERS)
    assert sorted(p.stem for p in EXERCISES.glob("ex*.ipynb")) == sorted(CHAPTERS)


def test_exercises_are_up_to_date():
    # with the --repo-url a published course generated them with (none here), as `release` does
    stale = release.stale(release.plan(repo_url=release.remembered_repo_url()))
    assert not stale, (
        f"stale exercise notebooks: {[str(p.relative_to(ROOT)) for p in stale]}; "
        "run `python -m grader release` after editing solutions/"
    )


#: Another CPU, reproduced on this one: no vectorised kernels (scalar loops, as on a CPU without
#: AVX2) and one thread change the last bits of float kernels and of torch.randn.
OTHER_CPU = {"ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "1"}


@pytest.mark.parametrize("env", [{}, OTHER_CPU], ids=["this-cpu", "scalar-one-thread"])
def test_release_check_cli_passes_on_the_tree(env):
    """The data were recorded on some machine; --check must agree with them on this one, with
    vectorised kernels or not (grader.checks.agreement.same, grader.checks.recorded.canonical;
    grader.cases.normal)."""
    done = subprocess.run([sys.executable, "-m", "grader", "release", "--check"], cwd=ROOT,
                          capture_output=True, text=True, env={**os.environ, **env})
    assert done.returncode == 0, done.stdout + done.stderr


def test_each_contract_function_is_in_exactly_one_solution_notebook():
    where: dict[str, list[str]] = {name: [] for name in CONTRACT}
    for path in sorted(SOLUTIONS.glob("ex*.ipynb")):
        for name in _functions(_code(_read(path))):
            if name in where:
                where[name].append(path.stem)
    for stem, names in CHAPTERS.items():
        for name in names:
            assert where[name] == [stem], f"{name} is defined in {where[name]}; expected only in {stem}"


@pytest.mark.parametrize("stem", sorted(CHAPTERS))
def test_exercise_stubs_raise_with_a_hint(stem):
    nb = _read(EXERCISES / f"{stem}.ipynb")
    source = _code(nb)
    functions = _functions(source)
    chapter = int(stem[2:4])
    for m, graded in enumerate(CHAPTERS[stem], start=1):
        assert graded in functions, f"{stem}: {graded} missing from the exercise"
        name = STUB_IN.get(graded, graded)
        # Run the def alone (no grader import needed; a kernel without its @triton.jit) and call it
        # with placeholder arguments.
        namespace: dict = {}
        functions[name].decorator_list = []
        module = compile(ast.Module([functions[name]], []), stem, "exec")
        exec(module, {"torch": torch, "math": math}, namespace)
        fn = namespace[name]
        args = [None for p in inspect.signature(fn).parameters.values()
                if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        with pytest.raises(NotImplementedError) as info:
            fn(*args)
        found = STUB.match(str(info.value))
        assert found, f"{stem}: {name} raises {info.value!r}, not the neutral stub message"
        assert found["name"] == name
        assert (int(found["ch"]), int(found["m"])) == (chapter, m)


@pytest.mark.parametrize("stem", sorted(CHAPTERS))
def test_exercises_are_clean(stem):
    nb = _read(EXERCISES / f"{stem}.ipynb")
    # The generator's note is for maintainers: it sits in the metadata, not in front of the student.
    note = nb.metadata[release.NOTICE_KEY]
    assert note["generated_from"] == f"solutions/{stem}.ipynb"
    assert note["generator"] == "python -m grader release" and "don't edit" in note["note"]
    first = nb.cells[0]
    assert first.cell_type == "markdown" and first.source.startswith("# ")
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for maintainer_talk in ("grader release", "solutions/", "don't edit", "Generated from"):
                assert maintainer_talk not in cell.source, f"{stem}: {maintainer_talk!r} in a markdown cell"
    for cell in nb.cells:
        assert release.SOLUTION_ONLY not in cell.metadata.get("tags", [])
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None
            assert release.BEGIN not in cell.source and release.END not in cell.source


@pytest.mark.parametrize("stem", sorted(CHAPTERS))
def test_no_solution_code_leaks(stem):
    solution = _read(SOLUTIONS / f"{stem}.ipynb")
    kept = _code(solution, keep_solution_only=False)
    inside = {line.strip() for region in _regions(kept) for line in region}
    outside = {line.strip() for line in kept.split("\n")} - inside
    exercise = {line.strip() for line in _code(_read(EXERCISES / f"{stem}.ipynb")).split("\n")}
    secret = {line for line in inside - outside if line and not line.startswith("#")}
    assert secret, f"{stem}: no solution code found"
    leaked = sorted(secret & exercise)
    assert not leaked, f"{stem}: solution lines in the exercise: {leaked}"


@pytest.mark.parametrize("stem", sorted(CHAPTERS))
def test_solutions_use_only_torch_and_math(stem):
    source = _code(_read(SOLUTIONS / f"{stem}.ipynb"))
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            assert not any(m.split(".")[0] == "attnmask" for m in modules), f"{stem} imports attnmask"
    functions = _functions(source)
    for name in CHAPTERS[stem]:
        used = {n.id for n in ast.walk(functions[name]) if isinstance(n, ast.Name)}
        used |= {n.attr for n in ast.walk(functions[name]) if isinstance(n, ast.Attribute)}
        assert not used & FORBIDDEN, f"{stem}: {name} uses {sorted(used & FORBIDDEN)}"
        later = set(CONTRACT[CONTRACT.index(name) + 1:]) | (set(CONTRACT) - set(CHAPTERS[stem]))
        assert not used & later, f"{stem}: {name} calls {sorted(used & later)} from another exercise"


# --------------------------------------------------------------------------- the generator itself

def _solution_nb(cells: list[nbformat.NotebookNode]) -> nbformat.NotebookNode:
    for i, c in enumerate(cells):
        c.id = f"c{i}"
    return nbformat.v4.new_notebook(cells=cells)


SOURCE = '''def f(x):
    """Doc."""
    y = 1
    # BEGIN SOLUTION
    # HINT: add one
    return x + y
    # END SOLUTION


class K:
    def g(self):
        if True:
            # BEGIN SOLUTION
            # HINT: two
            return 2
            # END SOLUTION'''


def test_strip_solutions_indents_names_and_numbers():
    counter = [0]
    out = release.strip_solutions(SOURCE, 4, counter, "test")
    assert counter == [2]
    assert '    raise NotImplementedError("f: implement it (see exercise 4.1)")' in out.split("\n")
    assert '            raise NotImplementedError("g: implement it (see exercise 4.2)")' in out.split("\n")
    assert "return x + y" not in out and "HINT" not in out
    assert '    y = 1' in out
    ast.parse(out)


@pytest.mark.parametrize("bad, why", [
    ("def f():\n    # BEGIN SOLUTION\n    # HINT: h\n    return 1\n", "no '# END SOLUTION'"),
    ("def f():\n    return 1\n    # END SOLUTION\n", "without"),
    ("# BEGIN SOLUTION\n# HINT: h\nx = 1\n# END SOLUTION\n", "not inside a def"),
    ("def f():\n    # BEGIN SOLUTION\n    # BEGIN SOLUTION\n", "nested"),
])
def test_strip_solutions_rejects_bad_markers(bad, why):
    with pytest.raises(release.ReleaseError, match=why):
        release.strip_solutions(bad, 1, [0], "test")


def test_a_maintainers_hint_line_never_reaches_the_stub():
    """The stub is read before any hint is opened: it names the task, never the method."""
    src = 'def f():\n    # BEGIN SOLUTION\n    # HINT: use "x" and \\n\n    pass\n    # END SOLUTION'
    out = release.strip_solutions(src, 1, [0], "test")
    assert "HINT" not in out and "use" not in out
    ns: dict = {}
    exec(out, ns)
    with pytest.raises(NotImplementedError, match=r"^f: implement it \(see exercise 1\.1\)$"):
        ns["f"]()
    # A region without a maintainers' note is fine too.
    src = "def g():\n    # BEGIN SOLUTION\n    return 1\n    # END SOLUTION"
    bare = release.strip_solutions(src, 2, [0], "t")
    assert 'raise NotImplementedError("g: implement it (see exercise 2.1)")' in bare


def test_make_exercise_drops_solution_only_and_outputs():
    code = nbformat.v4.new_code_cell(SOURCE, execution_count=3,
                                     outputs=[nbformat.v4.new_output("stream", text="hi\n")])
    demo = nbformat.v4.new_code_cell("print(f(1))", metadata={"tags": ["solution-only"]})
    nb = _solution_nb([nbformat.v4.new_markdown_cell("# Title"), code, demo])
    ex = release.make_exercise(nb, "ex04_x.ipynb", 4)
    assert [c.id for c in ex.cells] == ["c0", "c1"]
    assert ex.cells[0].source == "# Title"  # the solution's own opening cell comes first
    assert ex.metadata[release.NOTICE_KEY]["generated_from"] == "solutions/ex04_x.ipynb"
    assert ex.cells[1].outputs == [] and ex.cells[1].execution_count is None
    assert "print(f(1))" not in nbformat.writes(ex)


def test_make_exercise_keeps_explore_cells_without_their_outputs():
    code = nbformat.v4.new_code_cell(SOURCE)
    tell = nbformat.v4.new_markdown_cell("**Explore.** f at work.", metadata={"tags": ["explore"]})
    use = nbformat.v4.new_code_cell("with explore():\n    print(f(1))", metadata={"tags": ["explore"]},
                                    execution_count=4, outputs=[nbformat.v4.new_output("stream", text="1\n")])
    ex = release.make_exercise(_solution_nb([code, tell, use]), "ex04_x.ipynb", 4)
    assert [c.metadata.get("tags") for c in ex.cells] == [None, ["explore"], ["explore"]]
    assert ex.cells[2].source == use.source
    assert ex.cells[2].outputs == [] and ex.cells[2].execution_count is None
    graded = nbformat.v4.new_code_cell(SOURCE, metadata={"tags": ["explore"]})
    with pytest.raises(release.ReleaseError, match="explore"):  # grading would never see it
        release.make_exercise(_solution_nb([code, graded]), "ex04_x.ipynb", 4)


def test_plan_and_stale(tmp_path):
    sol, exe = tmp_path / "solutions", tmp_path / "exercises"
    sol.mkdir()
    exe.mkdir()
    nb = _solution_nb([nbformat.v4.new_code_cell(SOURCE)])
    nbformat.write(nb, sol / "ex02_demo.ipynb")
    (exe / "ex09_orphan.ipynb").write_text(nbformat.writes(nb))
    wanted = release.plan(sol, exe)
    assert set(release.stale(wanted)) == {exe / "ex02_demo.ipynb", exe / "ex09_orphan.ipynb"}
    (exe / "ex09_orphan.ipynb").unlink()
    del wanted[exe / "ex09_orphan.ipynb"]
    (exe / "ex02_demo.ipynb").write_text(wanted[exe / "ex02_demo.ipynb"])
    assert release.stale(wanted) == []
    # Any edit to the solution makes the exercise stale again.
    nb.cells[0].source = nb.cells[0].source.replace("y = 1", "y = 2")
    nbformat.write(nb, sol / "ex02_demo.ipynb")
    assert release.stale(release.plan(sol, exe)) == [exe / "ex02_demo.ipynb"]


def test_a_missing_notice_makes_the_exercise_stale(tmp_path):
    sol, exe = tmp_path / "solutions", tmp_path / "exercises"
    sol.mkdir()
    exe.mkdir()
    nbformat.write(_solution_nb([nbformat.v4.new_code_cell(SOURCE)]), sol / "ex02_demo.ipynb")
    wanted = release.plan(sol, exe)
    exercise = nbformat.reads(wanted[exe / "ex02_demo.ipynb"], as_version=4)
    del exercise.metadata[release.NOTICE_KEY]
    nbformat.write(exercise, exe / "ex02_demo.ipynb")
    assert release.stale(wanted) == [exe / "ex02_demo.ipynb"]


# Every chapter's task cells carry their hints as collapsed steps.
STEPPED_HINTS = sorted(CHAPTERS)


@pytest.mark.parametrize("stem", STEPPED_HINTS)
def test_stub_messages_say_what_to_build_and_hints_are_collapsed(stem):
    """A stub names the task; the steps towards the answer sit in <details> blocks the student opens."""
    exercise = _read(EXERCISES / f"{stem}.ipynb")
    solution_lines = {line.strip() for region in _regions(_code(_read(SOLUTIONS / f"{stem}.ipynb")))
                      for line in region if line.strip() and not line.strip().startswith("#")}
    for cell in (c for c in exercise.cells if c.cell_type == "code"):
        for line in cell.source.split("\n"):
            if line.strip().startswith("raise NotImplementedError("):
                message = ast.literal_eval(line.strip()[len("raise NotImplementedError("):-1])
                for code in solution_lines:
                    assert code not in message, f"{stem}: the stub message quotes the solution line {code!r}"
    tasks = [c for c in exercise.cells if c.cell_type == "markdown" and c.source.startswith("## Exercise")]
    assert tasks, f"{stem}: no task cells"
    for task in tasks:
        opened, closed = task.source.count("<details>"), task.source.count("</details>")
        assert opened >= 2 and opened == closed, f"{stem}: hints should be collapsed steps"


def test_repo_url_points_every_install_line_at_the_latest_release():
    """With --repo-url the Rules cell's install line installs the wheel .github/workflows/release.yml
    attaches to the latest Release; without it, the notebook is what it was."""
    url = "https://github.com/someone/attnmask-course"
    for path in sorted(SOLUTIONS.glob("ex*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        default = release.make_exercise(nb, path.name, release.chapter_of(path))
        online = release.make_exercise(nb, path.name, release.chapter_of(path), url)
        lines = [line for c in online.cells if c.cell_type == "markdown" for line in c.source.splitlines()
                 if "%pip install" in line]
        assert lines, f"{path.name}: no install line"
        wheel = re.search(r"attnmask-[\w.+-]+\.whl", lines[0]).group(0)
        assert f"{url}/releases/latest/download/{wheel}`" in lines[0], lines[0]
        assert "beside the notebook" not in lines[0] and "--extra-index-url" in lines[0]
        assert online.metadata[release.NOTICE_KEY][release.REPO_URL_KEY] == url
        assert release.REPO_URL_KEY not in default.metadata[release.NOTICE_KEY]
        assert [c.source for c in online.cells if c.cell_type == "code"] == \
               [c.source for c in default.cells if c.cell_type == "code"]


def test_repo_url_is_remembered_until_none(tmp_path):
    sol, exe = tmp_path / "solutions", tmp_path / "exercises"
    exe.mkdir()
    shutil.copytree(SOLUTIONS, sol, ignore=shutil.ignore_patterns("ex0[2-9]*", "ex1*"))
    url = "https://github.com/someone/course"
    assert release.remembered_repo_url(exe) is None
    for path, text in release.plan(sol, exe, url).items():
        path.write_text(text + "\n")
    assert release.remembered_repo_url(exe) == url
    assert release.stale(release.plan(sol, exe, url)) == []
    assert release.stale(release.plan(sol, exe)) != []  # the default line differs


@pytest.mark.parametrize("bad", ["github.com/o/r", "https://github.com", "file:///tmp/x", "https://x/a b"])
def test_a_bad_repo_url_is_refused(bad):
    with pytest.raises(release.ReleaseError, match="expected the repository's web address"):
        release.check_repo_url(bad)


def test_repo_url_without_an_install_line_stops_the_release():
    nb = _solution_nb([nbformat.v4.new_markdown_cell("# Rules"), nbformat.v4.new_code_cell(SOURCE)])
    assert release.make_exercise(nb, "ex02_x.ipynb", 2)  # fine without a URL
    with pytest.raises(release.ReleaseError, match="no markdown cell has the install line"):
        release.make_exercise(nb, "ex02_x.ipynb", 2, "https://github.com/o/r")
