"""The public checks recorded as data (grader.checks.recorded) judge as the reference's checks do.

The student template grades with the recording, not with ``attnmask``: every
classic mistake, correct and trivial implementation must get, on every public check,
the same verdict and the same words from both.
"""

from __future__ import annotations

import pytest
import torch
from buggy import correct, grade, native, trivial
from buggy.mistakes import BUGS

from grader.checks import agreement, declared, recorded
from grader.spec import Call, Check


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """(the reference's public checks, the public checks rebuilt from a recording written to disk)."""
    exercises = declared()
    folder = tmp_path_factory.mktemp("recorded")
    recorded.write(recorded.record(exercises), folder)
    replayed = recorded.load(folder)
    assert list(replayed) == list(exercises)
    return ({n: ex.make_checks(0, hidden=False) for n, ex in exercises.items()},
            {n: ex.make_checks(0, hidden=False) for n, ex in replayed.items()})


def said(verdicts) -> dict[str, tuple[bool, str, str]]:
    return {name: (v.passed, v.message, v.detail) for name, v in verdicts.items()}


def _students():
    for bug in BUGS:
        yield pytest.param(bug.exercise, bug.fn, id=bug.id)
    for module in (correct, native, trivial):
        for name in dir(module):
            fn = getattr(module, name)
            if callable(fn) and getattr(fn, "__module__", "") == module.__name__ and not name.startswith("_"):
                yield pytest.param(name, fn, id=f"{module.__name__.split('.')[-1]}.{name}")


@pytest.mark.parametrize(("exercise", "fn"), list(_students()))
def test_recorded_checks_say_what_the_reference_checks_say(both, exercise, fn):
    reference, replayed = both
    if exercise not in reference:
        pytest.skip(f"{exercise} is not an exercise")
    assert [c.name for c in replayed[exercise]] == [c.name for c in reference[exercise]]
    assert said(grade(fn, replayed[exercise])) == said(grade(fn, reference[exercise]))


def test_a_named_mistake_is_named_from_the_recording(both):
    """Not only the same words: the recording names mistakes (an empty recording would agree on passes)."""
    _, replayed = both
    wrong = lambda n, *, device=None: torch.ones(n, n, dtype=torch.bool, device=device).triu()  # noqa: E731
    wrong.__name__ = "causal_mask"
    verdicts = grade(wrong, replayed["causal_mask"])
    assert "the triangle is on the wrong side" in verdicts["matches reference (n=4)"].message


def test_the_recording_loads_without_running_code(both, tmp_path):
    """weights_only: a file that would build an arbitrary object is refused, not run."""
    import pickle

    class Boom:
        def __reduce__(self):
            return (print, ("ran",))

    bad = tmp_path / "causal_mask.pt"
    torch.save({"format": recorded.FORMAT, "tree": Boom(), "blob": torch.zeros(0)}, bad, pickle_module=pickle)
    with pytest.raises(pickle.UnpicklingError):
        recorded.read_exercise("causal_mask", tmp_path)


def test_a_judge_the_template_cannot_rebuild_stops_the_release():
    exercise = declared()["causal_mask"]
    check = Check("made by hand", [Call((3,))], lambda calls, outcomes: None, public=True)
    homemade = type(exercise)(exercise.name, exercise.chapter, lambda seed=0, hidden=True: [check],
                              exercise.points, exercise.statement)
    with pytest.raises(TypeError, match="cannot rebuild"):
        recorded.record({"causal_mask": homemade})


def test_a_changed_answer_makes_the_data_stale(tmp_path):
    data = recorded.record({"causal_mask": declared()["causal_mask"]})
    recorded.write(data, tmp_path)
    assert not recorded.stale(data, tmp_path)
    answers = next(iter(data["exercises"][0]["recipes"].values()))["answers"]
    first = next(iter(answers.values()))
    first["want"][0] = ~first["want"][0]
    assert recorded.stale(data, tmp_path)


def _one_ulp_up(t: torch.Tensor) -> torch.Tensor:
    return torch.nextafter(t, torch.full_like(t, float("inf")))


def test_last_bits_do_not_make_the_data_stale_and_a_changed_answer_does(tmp_path):
    """Another CPU changes the last bits of float inputs computed with kernels (and so the hash
    the answers are keyed by) and of the answers: not stale. A changed value or a NaN moved is."""
    data = recorded.record({"attention": declared()["attention"]})
    recorded.write(data, tmp_path)
    ex = data["exercises"][0]
    answers = ex["recipes"]["attention"]["answers"]
    call = ex["checks"][0]["calls"][0]
    old_key = recorded.call_key(recorded._call_from(call))
    call["args"] = (_one_ulp_up(call["args"][0]), *call["args"][1:])
    new_key = recorded.call_key(recorded._call_from(call))
    assert new_key != old_key
    answers[new_key] = answers.pop(old_key)
    answers[new_key]["want"][0] = _one_ulp_up(answers[new_key]["want"][0])
    assert not recorded.stale(data, tmp_path)

    answers[new_key]["want"][0] = answers[new_key]["want"][0] * 1.01
    assert recorded.stale(data, tmp_path)
    answers[new_key]["want"][0] = answers[new_key]["want"][0] / 1.01
    assert not recorded.stale(data, tmp_path)
    answers[new_key]["want"][0].view(-1)[0] = float("nan")
    assert recorded.stale(data, tmp_path)


@pytest.mark.parametrize(("a", "b", "agree"), [
    ([1.0, -2.0], [1.0 + 2**-23, -2.0], True),         # a float32 kernel's last bit
    ([1.0, -2.0], [1.001, -2.0], False),               # a value
    ([1.0, float("nan")], [1.0, float("nan")], True),
    ([1.0, float("nan")], [1.0, 0.0], False),          # NaN where a number was
    ([float("inf"), 0.0], [float("-inf"), 0.0], False),  # the other infinity
    ([1e10, 1.0], [1e10 + 1e5, 1.0], True),            # relative to the tensor's scale
    ([100.0, 1.0], [100.0, 1.01], False),
    ([0.5, 0.0], [0.5, 1e-6], True),              # near 0: the tensor's scale
])
def test_same_allows_what_a_float32_kernel_changes(a, b, agree):
    assert agreement.same(torch.tensor(a), torch.tensor(b)) is agree
    assert agreement.same(torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)) is agree


def test_same_is_exact_for_integers_and_flags():
    assert not agreement.same(torch.tensor([1, 2]), torch.tensor([1, 3]))
    assert not agreement.same(torch.tensor([True]), torch.tensor([False]))
    assert not agreement.same(torch.tensor([1.0]), torch.tensor([1.0], dtype=torch.float64))


_NORMALS = ("import hashlib, torch; from grader import cases; "
            "print([hashlib.sha256(cases.normal(torch.Generator().manual_seed(n), (n,)).numpy().tobytes())"
            ".hexdigest() for n in (3, 16, 17, 100, 4099)])")


def test_inputs_are_the_same_bits_on_another_cpu():
    """cases.normal under ATEN_CPU_CAPABILITY=default and one thread (scalar kernels: the last
    bits torch.randn gives there differ from AVX2's) is bit for bit what it is here."""
    import os
    import subprocess
    import sys

    runs = [subprocess.run([sys.executable, "-c", _NORMALS], capture_output=True, text=True, check=True,
                           env={**os.environ, **env}).stdout
            for env in ({}, {"ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "1"})]
    assert runs[0] == runs[1]


def test_normal_draws_torch_randn_s_numbers():
    """The same uniforms and transform as torch.randn: its numbers to float32 round-off (the
    chapters' tuned cases keep their values), and the generator left where randn leaves it."""
    from grader import cases

    for n in (5, 16, 40, 333):
        mine, theirs = torch.Generator().manual_seed(n), torch.Generator().manual_seed(n)
        got, want = cases.normal(mine, (n,)), torch.randn(n, generator=theirs)
        assert torch.allclose(got, want, rtol=0, atol=4 * 2.0**-23 * max(1.0, float(want.abs().max())))
        assert torch.equal(torch.rand(4, generator=mine), torch.rand(4, generator=theirs))


def test_a_recording_made_on_another_cpu_is_not_stale_here(tmp_path):
    """Recorded in a process with scalar kernels and one thread, checked in this one. Chapter 8's
    backward takes the forward's output as an input (computed with floats: another key)."""
    import os
    import subprocess
    import sys

    names = ["attention", "kv_cache_attention", "tiled_attention_backward", "influence_matrix"]
    script = ("import sys; from pathlib import Path; from grader.checks import declared, recorded; "
              f"ex = declared(); data = recorded.record({{n: ex[n] for n in {names!r}}}); "
              "recorded.write(data, Path(sys.argv[1]))")
    subprocess.run([sys.executable, "-c", script, str(tmp_path)], check=True,
                   env={**os.environ, "ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "1"})
    exercises = declared()
    here = recorded.record({n: exercises[n] for n in names})
    assert not recorded.stale(here, tmp_path)


def test_the_public_checks_catch_nan_gradients_of_an_added_bias(both):
    """Exercise 2.2's public checks run the backward pass: an answer right in the forward pass
    whose added -inf sends NaN back from a fully masked row fails check() and is told why,
    while the same answer that fills the -inf in (tests/buggy/correct.py) passes."""
    from buggy.mistakes import softmax_additive_patched

    from grader.mistakes import MISTAKES

    _, replayed = both
    failed = {n: v.message for n, v in grade(softmax_additive_patched, replayed["masked_softmax"]).items()
              if not v.passed}
    assert list(failed) == ["finite gradients with a fully masked row, match reference"]
    assert MISTAKES["nan_grads"] in next(iter(failed.values()))
    assert all(v.passed for v in grade(correct.masked_softmax, replayed["masked_softmax"]).values())
