"""Similarity flags: a renamed copy and a pasted reference are flagged, once per group;
independently written correct solutions are not, nor short or hint-led code; and a flag
changes no grade."""

from __future__ import annotations

from pathlib import Path

import pytest
from buggy.variants import STUDENTS

from grader.results import PASSED
from grader.runners.classmode import similarity
from grader.runners.classmode.scores import contract_exercises
from grader.runners.single.notebook import run_public

REPO = Path(__file__).resolve().parent.parent
EXERCISES = contract_exercises()

# tests/buggy/correct.py's masked_softmax with every name changed, a docstring, comments,
# other constants and another layout: what a student who copied it would hand in.
RENAMED = '''
def masked_softmax(logits, allowed):
    """Softmax over the keys, blocked keys get no weight."""
    z = logits.float().masked_fill(
        ~allowed,
        float("-inf"),  # blocked before the softmax
    )
    probs = torch.softmax(z, dim=-1)
    probs = torch.where(allowed.any(dim=-1, keepdim=True), probs,
                        torch.zeros_like(probs))
    return probs.to(logits.dtype)
'''


def _functions(path: str) -> dict[str, str]:
    return similarity.functions_in(REPO / path, EXERCISES)


def test_a_renamed_copy_and_a_pasted_reference_are_flagged_and_nothing_else():
    solutions = _functions("solutions")
    students = {
        "ann": _functions("tests/buggy/correct.py"),  # written from the contract, apart from solutions/
        "ben": {"masked_softmax": RENAMED},
        "cy": {"kv_cache_attention": solutions["kv_cache_attention"]},  # pasted from the solutions
    }
    found = similarity.flags(students, EXERCISES)
    pairs = {(f.exercise, f.a, f.b.split(" ")[0]) for f in found}
    assert pairs == {("masked_softmax", "ann", "ben"), ("kv_cache_attention", "cy", "reference:")}, found
    copy = next(f for f in found if f.b == "ben")
    assert copy.score >= similarity.THRESHOLD and "logits" in copy.b_source and "scores" in copy.a_source


def test_independently_written_correct_solutions_are_not_flagged():
    """tests/buggy/correct.py and the solutions (with attnmask) were written apart: no exercise
    of the one is flagged against the other, the reference side of every comparison."""
    students = {"careful": _functions("tests/buggy/correct.py")}
    assert len(students["careful"]) == len(EXERCISES)
    assert similarity.flags(students, EXERCISES) == []
    scores = [similarity.similarity(src, ref) for ex, src in students["careful"].items()
              for _, ref in similarity.references([ex])[ex]]
    assert max(scores) < similarity.THRESHOLD


def test_a_submission_that_mirrors_the_solutions_is_flagged_against_them():
    """tests/submissions/correct.py says of itself that it mirrors the course's solutions:
    the flags say so too, exercise by exercise, against the reference only."""
    found = similarity.flags({"mirror": _functions("tests/submissions/correct.py")}, EXERCISES)
    assert found and all(f.b.startswith("reference: ") for f in found)
    assert len({f.exercise for f in found}) >= 8  # those long enough to tell (a one-liner is not compared)


def test_names_constants_and_layout_do_not_count_what_is_called_does():
    a = "def f(x, n):\n    y = x.tril(1)  # lower\n    return y.sum(dim=-1) * n\n"
    b = ("def g(inp, count):\n    '''doc'''\n    out = inp.tril(\n        7)\n"
         "    return out.sum(dim=3) * count\n")
    c = "def f(x, n):\n    y = x.triu(1)\n    return y.sum(dim=-1) * n\n"
    assert similarity.tokens(a) == similarity.tokens(b)
    assert similarity.tokens(a) != similarity.tokens(c)


def test_one_flagged_group_per_shared_function():
    shared = RENAMED
    students = {f"s{i}": {"masked_softmax": shared} for i in range(5)}
    grouped = similarity.grouped(similarity.flags(students, ["masked_softmax"], refs={}))
    assert len(grouped) == 1 and len(grouped[0].others) == 3


def test_a_link_out_of_the_submission_is_not_read(tmp_path):
    outside = tmp_path / "secret.py"
    outside.write_text("def causal_mask(n):\n    return 'the instructor key'\n")
    sub = tmp_path / "student"
    sub.mkdir()
    (sub / "ex.py").symlink_to(outside)
    assert similarity.functions_in(sub, ["causal_mask"]) == {}


def test_students_who_pasted_one_reference_are_one_flag():
    ref = similarity.functions_in(REPO / "solutions", ["kv_cache_attention"])["kv_cache_attention"]
    students = {f"s{i}": {"kv_cache_attention": ref} for i in range(6)}
    found = similarity.flags(students, ["kv_cache_attention"])
    assert len({f.a for f in found if f.b.startswith("reference:")}) == 6  # each of them, against it
    grouped = similarity.grouped(found)
    to_ref = [f for f in grouped if f.b.startswith("reference:")]
    assert len(to_ref) == 1 and len(to_ref[0].others) == 5


def test_the_functions_read_for_the_report_are_read_as_the_grader_reads_them(tmp_path):
    """A FIFO named like a notebook must not stall the class run (it is never opened), and a
    link to another notebook is not followed."""
    import os
    import shutil
    import threading

    from grader.runners.classmode import similarity

    repo = Path(__file__).resolve().parent.parent
    sub = tmp_path / "sub"
    sub.mkdir()
    shutil.copy(repo / "solutions" / "ex01_leakage.ipynb", sub)
    os.mkfifo(sub / "a.ipynb")
    (sub / "ex02_softmax.ipynb").symlink_to(repo / "solutions" / "ex02_softmax.ipynb")
    found = {}
    reader = threading.Thread(target=lambda: found.update(
        similarity.functions_in(sub, ["causal_mask", "masked_softmax"])), daemon=True)
    reader.start()
    reader.join(30)
    assert not reader.is_alive(), "reading the submission's functions hung on a FIFO"
    assert sorted(found) == ["causal_mask"]


# --------------------------------------------------------------------------- a class written apart


HINT_LED = ("def causal_mask(n, *, device=None):\n    p = torch.arange(n, device=device)\n"
            "    return p[None, :] <= p[:, None]\n")
ONE_LINE = ("def causal_mask(n, *, device=None):\n"
            "    return torch.ones(n, n, dtype=torch.bool, device=device).tril()\n")


@pytest.fixture(scope="module")
def independent_class(tmp_path_factory) -> dict[str, dict[str, str]]:
    """Twenty-two students, no two sharing a source: the hand-written variants (one file each,
    read as class mode reads a submission), tests/buggy/correct.py's functions split among five
    students and native.py's own among three, and two who wrote causal_mask the ways everyone
    does: as the hints lead (the solutions' way) and as the one line correct.py has too."""
    folder = tmp_path_factory.mktemp("class")
    students = {}
    for who, source in STUDENTS.items():
        (folder / f"{who}.py").write_text(source)
        students[who] = similarity.functions_in(folder / f"{who}.py", EXERCISES)
    correct, native = _functions("tests/buggy/correct.py"), _functions("tests/buggy/native.py")
    for i in range(5):
        students[f"c{i}"] = {e: correct[e] for e in EXERCISES[i::5]}
    for i in range(3):
        students[f"n{i}"] = {e: native[e] for e in sorted(native)[i::3]}
    students["h1"], students["h2"] = {"causal_mask": HINT_LED}, {"causal_mask": ONE_LINE}
    return students


def test_the_hand_written_variants_are_correct():
    """Each variant function passes its exercise's public checks: the class below is correct work."""
    for who, source in STUDENTS.items():
        namespace: dict = {}
        exec(compile(source, f"{who}.py", "exec"), namespace)  # noqa: S102 -- our own test data
        for name in (n for n in EXERCISES if n in namespace):
            result = run_public(namespace[name], name)
            assert result.status == PASSED, (who, name, result.message)


def test_a_class_of_twenty_independently_correct_submissions_has_no_flag(independent_class):
    assert len(independent_class) >= 20
    assert similarity.flags(independent_class, EXERCISES) == []  # 0 false flags (the guide says so)


PLANTED = """
def kv_cache_attention(query, new_keys, new_values, cached_keys, cached_values):
    T = cached_keys.size(2)
    count = new_keys.size(2)
    all_keys = torch.cat([cached_keys, new_keys], 2)
    all_values = torch.cat([cached_values, new_values], 2)
    rows = torch.arange(T, T + count, device=query.device).view(-1, 1)
    cols = torch.arange(T + count, device=query.device).view(1, -1)
    s = torch.matmul(query.float(), all_keys.float().transpose(2, 3)).div(math.sqrt(query.size(-1)))
    s = s.masked_fill(cols > rows, -math.inf)  # no peeking ahead
    return torch.matmul(s.softmax(-1), all_values.float()).type_as(query), all_keys, all_values
"""

def test_planted_copies_are_flagged_once_per_pair_and_nothing_else(independent_class):
    """Into the class: a renamed copy of s12's kv_cache_attention, a verbatim copy of s05's
    multi_head_attention, the solutions' masked_softmax pasted, and two students each writing
    the hint-led and the one-line causal_mask alike (too short to tell: not compared)."""
    solutions = _functions("solutions")
    students = dict(independent_class)
    students["p1"] = {"kv_cache_attention": PLANTED, "causal_mask": HINT_LED}
    students["p2"] = {"multi_head_attention": students["s05"]["multi_head_attention"],
                      "causal_mask": HINT_LED}
    students["p3"] = {"masked_softmax": solutions["masked_softmax"], "causal_mask": ONE_LINE}
    students["p4"] = {"causal_mask": ONE_LINE}
    found = similarity.grouped(similarity.flags(students, EXERCISES))
    got = sorted((f.exercise, *sorted([f.a, f.b.split(":")[0]]), *f.others) for f in found)
    assert got == [("kv_cache_attention", "p1", "s12"), ("masked_softmax", "p3", "reference"),
                   ("multi_head_attention", "p2", "s05")], found


def test_a_group_that_matches_a_reference_is_listed_once():
    """Two students who both pasted the solutions: per exercise one flag, naming both students
    and, where it matches, the reference; not a students' group and a reference group."""
    mirror = _functions("tests/submissions/correct.py")
    found = similarity.flags({"ann": mirror, "bob": dict(mirror)}, EXERCISES)
    grouped = similarity.grouped(found)
    exercises = [f.exercise for f in grouped]
    assert exercises and len(exercises) == len(set(exercises))
    assert all({f.a, f.b, *f.others} >= {"ann", "bob"} for f in grouped)
    to_reference = {f.exercise for f in found if f.b.startswith("reference:")}
    assert to_reference and all(any(m.startswith("reference:") for m in (f.b, *f.others))
                                for f in grouped if f.exercise in to_reference)
