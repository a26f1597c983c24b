"""The in-notebook ``check``: public checks in the student's kernel, same judges,
deterministic text, never a traceback, never "done" while hidden cases remain."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import attnmask
from grader import check, check_all
from grader.runners.single.notebook import run_public, text

ROOT = Path(__file__).parent.parent


def causal_mask(n, *, device=None):
    pos = torch.arange(n, device=device)
    return pos[None, :] <= pos[:, None]


def _wrong(n, *, device=None):
    pos = torch.arange(n, device=device)
    return pos[None, :] >= pos[:, None]  # the wrong triangle


def _stub(*args, **kwargs):
    raise NotImplementedError("see the task above")


def _borrowed(n, *, device=None):
    return attnmask.causal_mask(n, device=device)


def _named(fn, name="causal_mask"):
    fn.__name__ = name
    return fn


def test_correct_function_passes_but_hidden_cases_remain(capsys):
    check(causal_mask)
    out = capsys.readouterr().out
    assert out.startswith("causal_mask: ") and "public checks pass." in out
    assert "✓" in out and "✗" not in out
    assert "The full grader (python -m grader) runs hidden cases as well." in out
    assert "done" not in out.lower() and "finished" not in out.lower()


def test_output_is_deterministic(capsys):
    check(causal_mask)
    first = capsys.readouterr().out
    check(causal_mask)
    assert capsys.readouterr().out == first


def test_mistake_gets_the_graders_feedback(capsys):
    check(_named(_wrong))
    out = capsys.readouterr().out
    assert "✗" in out and "Fix the first failing check" in out
    result = run_public(_wrong, "causal_mask")
    assert result.first_failure is not None
    assert result.first_failure.message in out  # the same words as the full grader


def test_the_prefaces_sample_feedback_is_what_check_prints(capsys):
    """book/00_preface.md shows check() on a causal_mask built with triu, as it prints."""
    import textwrap

    preface = (ROOT / "book" / "00_preface.md").read_text()
    sample = preface.split("```text\n", 1)[1].split("```", 1)[0]
    check(_named(_wrong))
    assert capsys.readouterr().out == textwrap.dedent(sample)


def test_stub_says_not_implemented_yet(capsys):
    check(_named(_stub))
    out = capsys.readouterr().out.strip()
    assert out == "causal_mask: not implemented yet (it raises NotImplementedError)."


def test_student_errors_never_raise(capsys):
    def causal_mask(n, *, device=None):
        return {"not": "a tensor"}[n]

    check(causal_mask)
    out = capsys.readouterr().out
    assert "✗" in out and "KeyError" in out


def test_borrowing_the_answer_is_named(capsys):
    check(_named(_borrowed))
    out = capsys.readouterr().out
    assert "attnmask is off limits in exercises" in out and "✗" in out
    assert attnmask.causal_mask(2).shape == (2, 2)  # the namespace is restored afterwards


def test_a_message_every_failing_check_repeats_is_shown_once_with_its_count(capsys):
    """A forbidden call fails every check with the same words: check() says them once, then how many
    more checks fail with them; a different message still gets its own line."""

    def causal_mask(n, *, device=None):
        q = torch.zeros(1, 1, n, 1, device=device)
        return F.scaled_dot_product_attention(q, q, q)

    check(causal_mask)
    out = capsys.readouterr().out
    failing = len([c for c in run_public(causal_mask).checks if not c.passed and not c.skipped])
    assert failing > 2
    marked = [line for line in out.splitlines() if line.startswith("✗")]
    assert out.count("scaled_dot_product_attention is off limits") == 1, out
    assert "scaled_dot_product_attention is used at line 3 of causal_mask: the grader finds it" in out
    assert f"✗ the same message for {failing - 1} more checks: " in out
    assert len(marked) == 2 and f"0 of {failing} public checks pass" in out


def test_an_import_of_the_answer_inside_the_function_is_named(capsys):
    """In the notebook ``import attnmask`` inside the function works; the grader's scan scores the
    exercise 0. check() says so instead of reporting a pass."""

    def causal_mask(L, device=None):
        import attnmask as am

        return am.causal_mask(L, device=device)

    check(causal_mask)
    out = capsys.readouterr().out
    assert "attnmask is off limits" in out and "line 2 of causal_mask" in out
    assert "scores this exercise 0" in out and "The public checks pass here, but not in the grader" in out


def test_torch_apis_are_restored_after_a_check(capsys):
    original = F.scaled_dot_product_attention

    def attention(q, k, v, mask=None):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask), None

    check(attention)
    assert "scaled_dot_product_attention is off limits" in capsys.readouterr().out
    assert F.scaled_dot_product_attention is original


def test_random_state_is_left_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    run_public(causal_mask)
    assert torch.equal(torch.rand(3), expected)


def test_check_by_name_and_bad_targets(capsys):
    check("causal_mask")
    assert "public checks pass" in capsys.readouterr().out
    check("padding_mask")
    assert "padding_mask is not defined yet" in capsys.readouterr().out
    check("no_such_thing")
    assert "no such exercise" in capsys.readouterr().out
    check(lambda n: n)
    assert "check() needs one of the exercise functions" in capsys.readouterr().out


def test_check_all_lists_every_exercise(capsys):
    check_all({"causal_mask": causal_mask, "padding_mask": _stub})
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("✓ causal_mask:")
    assert any(line.startswith("✗ padding_mask:") and "not implemented yet" in line for line in out)
    assert any("decoder_mask: not defined here" in line for line in out)
    assert "hidden cases" in out[-1]


def test_text_of_a_passing_result():
    result = run_public(causal_mask)
    lines = text(result).splitlines()
    assert lines[0] == f"causal_mask: {len(result.checks)} of {len(result.checks)} public checks pass."
    assert all(line.startswith("✓") for line in lines[1:-1])


EXERCISES = sorted(p.stem for p in (ROOT / "exercises").glob("ex*.ipynb"))


def _execute(nb):
    """Run ``nb`` top to bottom in a fresh kernel of this interpreter (ipykernel's
    ``python3`` is ``sys.executable``), in exercises/ as a student would, never
    stopping at an error; return ``{check cell source: its printed text}``."""
    from nbclient import NotebookClient

    NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(ROOT / "exercises")}}).execute()
    errors = [f"{o.ename}: {o.evalue}" for c in nb.cells if c.cell_type == "code"
              for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, f"cells raised (a student would see a traceback): {errors}"
    printed = lambda c: "".join(o.get("text", "") for o in c.outputs if o.get("output_type") == "stream")  # noqa: E731
    return {c.source.strip(): printed(c) for c in nb.cells if c.cell_type == "code" and "check(" in c.source}


@pytest.mark.slow
@pytest.mark.parametrize("stem", EXERCISES)
def test_exercise_notebook_runs_and_says_not_implemented_yet(stem):
    """The generated exercise notebook, as handed out: every check cell says "not implemented yet"."""
    import nbformat

    checks = _execute(nbformat.read(ROOT / "exercises" / f"{stem}.ipynb", as_version=4))
    assert checks, f"{stem} has no check cells"
    for cell, out in checks.items():
        name = cell.removeprefix("check(").removesuffix(")")
        assert out.strip() == f"{name}: not implemented yet (it raises NotImplementedError).", (cell, out)
        assert "Traceback" not in out


@pytest.mark.slow
@pytest.mark.parametrize("stem", EXERCISES)
def test_exercise_notebook_with_the_solutions_pasted_in_passes_its_checks(stem):
    """The exercise notebook with each stub cell replaced by its solution cell (same cell id),
    what a student who solved everything has: every check cell says its public checks pass."""
    import nbformat

    nb = nbformat.read(ROOT / "exercises" / f"{stem}.ipynb", as_version=4)
    solution = nbformat.read(ROOT / "solutions" / f"{stem}.ipynb", as_version=4).cells
    solved = {c.id: c.source for c in solution}
    # A solution-only cell (the capstone's Function class) is the student's own cell: it goes with the
    # stub that follows it in the solution notebook.
    own = ""
    for c in solution:
        if "solution-only" in c.get("metadata", {}).get("tags", []):
            own += c.source + "\n\n"
        elif own and c.cell_type == "code" and "BEGIN SOLUTION" in c.source:
            solved[c.id], own = own + c.source, ""
    stubs = [c for c in nb.cells if c.cell_type == "code" and "raise NotImplementedError" in c.source]
    assert stubs, f"{stem} has no stubs to solve"
    for cell in stubs:
        assert cell.id in solved, f"{stem}: stub cell {cell.id!r} has no solution cell with the same id"
        cell.source = solved[cell.id]
    checks = _execute(nb)
    assert len(checks) >= len(stubs)
    for cell, out in checks.items():
        name = cell.removeprefix("check(").removesuffix(")")
        assert out.startswith(f"{name}: ") and "public checks pass." in out, (cell, out)
        assert "✗" not in out and "Traceback" not in out, (cell, out)


# --------------------------------------------------------------------------- limits


def _endless(n, *, device=None):
    while True:
        pass


def _sleeps(n, *, device=None):
    import time

    time.sleep(100)


def _swallows(n, *, device=None):
    while True:
        try:
            while True:
                pass
        except Exception:  # noqa: BLE001 -- a student's catch-all must not eat the time limit
            pass


# It checks that check() leaves SIGALRM's handler as it was and no timer running: its own limit uses neither.
@pytest.mark.timeout(method="thread")
@pytest.mark.parametrize("slow", [_endless, _sleeps, _swallows], ids=["loop", "sleep", "except-Exception"])
def test_check_stops_slow_code_at_the_graders_time_limit(slow):
    import signal

    run_public(causal_mask)  # the checks are built once per kernel: not part of the limit
    handler = signal.getsignal(signal.SIGALRM)
    r = run_public(_named(slow), timeout=0.5)  # a limit that did not hold would hang here (pytest's timeout)
    assert r.status == "timed out" and r.score == 0
    assert "stopped at the time limit (0.5 s): an infinite loop" in r.message
    assert signal.getsignal(signal.SIGALRM) is handler and signal.getitimer(signal.ITIMER_REAL)[0] == 0
    r = run_public(causal_mask)  # the kernel goes on as before
    assert r.status == "passed"


def test_check_and_the_grader_use_one_timer():
    from grader.sandbox import execute, worker

    assert worker.execute_limited is execute.execute_limited
    assert not issubclass(execute.ExerciseTimeout, Exception)  # a student's except Exception cannot eat it


def test_check_limits_memory_and_gives_it_back():
    import resource
    import sys

    before = resource.getrlimit(resource.RLIMIT_AS)

    def hungry(n, *, device=None):
        torch.empty(2**31, dtype=torch.float64)  # 16 GiB
        return causal_mask(n, device=device)

    r = run_public(_named(hungry), memory_mb=512)
    assert resource.getrlimit(resource.RLIMIT_AS) == before
    if sys.platform.startswith("linux") and not torch.cuda.is_initialized():
        assert r.status != "passed" and "allocate" in r.message
