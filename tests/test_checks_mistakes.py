"""Each classic mistake fails, and the feedback names it in plain words."""

from __future__ import annotations

import pytest
from buggy import failures, grade
from buggy.mistakes import BUGS

from grader.checks import EXERCISES
from grader.checks.ch8_speed.backward import MISTAKES8
from grader.checks.ch9_real import MISTAKES9
from grader.checks.ch10_serving import MISTAKES10
from grader.checks.ch11_parallel.mistakes import MISTAKES11
from grader.checks.ch12_modern.mistakes import MISTAKES12
from grader.mistakes import MISTAKES

#: Every named mistake: the shared ones and chapters 8 to 12's own.
NAMED = {**MISTAKES, **MISTAKES8, **MISTAKES9, **MISTAKES10, **MISTAKES11, **MISTAKES12}


@pytest.mark.parametrize("bug", BUGS, ids=[b.id for b in BUGS])
def test_mistake_fails_with_its_diagnosis(bug):
    verdicts = grade(bug.fn, EXERCISES[bug.exercise].make_checks(7, hidden=True))
    failed = failures(verdicts)
    assert failed, f"{bug.id} passes every check"
    # A float mask is a wrong mask in every check that reads it, the dtype check included; an
    # unreshaped padding table raises or is wrong in every case with B > 1; every check of a
    # diagnosis exercise holds models of every answer, so a mistaken search is caught by each.
    everything_fails = (bug.exercise in ("influence_matrix", "find_leaking_layer", "leaks_across_padding")
                        or bug.id == "causal_mask-causal_float"
                        or bug.fn.__name__.startswith("decoder_unreshaped"))
    assert len(failed) < len(verdicts) or everything_fails, "only the broken property fails"
    text = NAMED.get(bug.says, bug.says)
    said = [name for name, message in failed.items() if text in message]
    assert said, f"no failing check says {text!r}; they say:\n" + "\n".join(
        f"  {name}: {message.splitlines()[0]}" for name, message in failed.items())


def test_every_named_mistake_has_a_buggy_variant():
    """Each message of MISTAKES is asserted by some buggy variant above, so a
    recogniser that stops matching is noticed."""
    assert set(NAMED) - {b.says for b in BUGS} == set()


#: Wrong answers whose feedback named another mistake, or none (issue 32): (exercise, answer, hidden
#: checks too, the check that must name the mistake, its words, words it must not say).
MISLED = [
    ("kv_cache_attention", "cache_no_mask", False, "empty cache T=0", "each other's future", None),
    ("kv_cache_attention", "cache_no_mask", True, "step by step equals the full pass", "each other's future",
     "decoding token 0"),
    ("tiled_attention", "tiled_no_guard", False, "skips fully masked tiles", "(see the guard)",
     "tile_not_skipped"),
    ("left_padding_position_ids", "positions_hf_fill", False, "left padding", "padding_not_zero",
     "Hugging Face"),
    ("left_padding_position_ids", "positions_minus_pads", False, "left padding", "pads_subtracted", None),
    ("alibi_bias", "alibi_odd_slopes", False, "6 heads", "alibi_odd_slopes", None),
    ("influence_matrix", "influence_l1", False, "causal attention layer", "the L1 norm", None),
    ("decoder_mask", "decoder_unreshaped", False, "lengths [2, 4]", "shapes_clash", None),
    ("decoder_mask", "decoder_unreshaped", False, "B = L = 3", "unreshaped_padding", None),
]


@pytest.mark.parametrize(("exercise", "answer", "hidden", "check", "says", "not_says"), MISLED,
                         ids=[f"{m[1]}-{m[3]}" for m in MISLED])
def test_feedback_names_the_mistake_in_the_check_that_catches_it(exercise, answer, hidden, check, says,
                                                                 not_says):
    import buggy.mistakes
    import buggy.real_models
    import buggy.tiled

    modules = (buggy.mistakes, buggy.real_models, buggy.tiled)
    fn = next(getattr(m, answer) for m in modules if hasattr(m, answer))
    verdicts = grade(fn, EXERCISES[exercise].make_checks(7, hidden=hidden))
    (name,) = [n for n in verdicts if n.startswith(check)]
    verdict = verdicts[name]
    assert not verdict.passed, f"{answer} passes {name!r}"
    assert NAMED.get(says, says) in verdict.message, verdict.message
    if not_says:
        assert NAMED.get(not_says, not_says) not in verdict.message, verdict.message
