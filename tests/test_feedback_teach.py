"""Feedback that names the mistake (issue 45 item 5), for chapters 2, 5, 6, 9, 10 and 12.

* A wrong answer is sent to the line that is wrong: 5.2's heads split without moving the head axis
  are named as such, not as a mask that leaks; 12.2's blocked keys that make up k are named in the
  NaN check too; 12.4's NaN gradient from exp(c_i - c_j) is explained without a softmax.
* A hidden check's message has no number in it: :func:`grader.hidden.words` masks every digit, so a
  message written with numbers reads "gives …/…; … -… - (-…)" where hidden cases run.
"""

from __future__ import annotations

import pytest
from buggy import failures, grade
from buggy import mistakes as bm
from buggy import modern as md
from buggy.mistakes import BUGS

from grader import hidden
from grader.checks import EXERCISES
from grader.checks.ch5_cross import HEADS_UNMOVED
from grader.checks.ch9_real import MISTAKES9
from grader.checks.ch10_serving import MISTAKES10
from grader.checks.ch12_modern.mistakes import MISTAKES12
from grader.mistakes import MISTAKES

MINE = {"to_additive", "masked_softmax", "attention", "encoder_decoder_masks", "multi_head_attention",
        "kv_cache_attention", "left_padding_position_ids", "packed_labels", "gqa_attention", "alibi_bias",
        "image_text_mask", "rolling_cache_mask", "paged_attention", "tree_mask", "sink_attention",
        "topk_selection_mask", "block_diffusion_mask", "decay_mask"}


def _failed(fn, name: str, hidden_too: bool, seed: int = 7) -> dict[str, str]:
    checks = [c for c in EXERCISES[name].make_checks(seed, hidden=hidden_too) if c.requires is None]
    return failures(grade(fn, checks))


@pytest.mark.parametrize("hidden_too", [False, True])
def test_heads_split_by_a_bare_reshape_are_named_not_sent_to_the_mask(hidden_too):
    failed = _failed(bm.mha_heads_reshaped, "multi_head_attention", hidden_too)
    assert failed
    for name, message in failed.items():
        first = message.splitlines()[0]
        assert HEADS_UNMOVED in first, f"{name}: {first}"
        assert MISTAKES["padding_leak"] not in first and MISTAKES["future_leak"] not in first


def test_heads_never_moved_in_front_of_the_positions_are_named_in_the_shape_clash():
    failed = _failed(bm.mha_heads_not_moved, "multi_head_attention", False)
    assert failed
    for name, message in failed.items():
        assert "(B, L, H, H), which no mask fits" in message, f"{name}: {message.splitlines()[0]}"


def test_blocked_keys_that_make_up_k_are_named_in_the_nan_check():
    failed = _failed(md.sel_blocked_make_up_k, "topk_selection_mask", False)
    nan = failed["NaN scores are never selected"]
    assert MISTAKES12["sel_future"] in nan and not nan.startswith("mask has wrong cells"), nan


def test_a_nan_gradient_of_the_decay_mask_is_explained_without_a_softmax():
    failed = _failed(md.decay_diff_filled, "decay_mask", True)  # the long sequence overflows exp
    grads = [m for name, m in failed.items() if "gradient" in name]
    assert grads, failed
    for message in grads:
        assert MISTAKES12["decay_grad_overflow"] in message
        assert "softmax" not in message.split("no softmax")[1]
        assert MISTAKES["nan_grads"] not in message


@pytest.mark.parametrize("text", [*MISTAKES9.values(), *MISTAKES10.values(), *MISTAKES12.values(),
                                  HEADS_UNMOVED],
                         ids=lambda t: t[:40])
def test_chapter_mistakes_read_the_same_where_hidden_cases_run(text):
    assert hidden.words(text) == text, f"masked for hidden checks: {hidden.words(text)}"


#: Every named mistake: the shared ones and chapters 9 to 12's own (as test_checks_mistakes names them).
NAMED = {**MISTAKES, **MISTAKES9, **MISTAKES10, **MISTAKES12}


@pytest.mark.parametrize("bug", [b for b in BUGS if b.exercise in MINE], ids=lambda b: b.id)
def test_the_diagnosis_of_every_classic_mistake_survives_the_masking(bug):
    """Where hidden cases run, a check's message is masked (:func:`grader.hidden.words`); the diagnosis
    in it, written without numbers, reads the same there (the shapes and dtypes of the case do not)."""
    if bug.says.startswith("expected float"):
        pytest.skip("the diagnosis is the case's dtype, which hidden checks keep secret on purpose")
    text = NAMED.get(bug.says, bug.says)
    firsts = [m.splitlines()[0] for m in _failed(bug.fn, bug.exercise, True).values()]
    said = [first for first in firsts if text in first]
    assert said, f"{bug.id}: no failing check says {text!r}"
    for first in said:
        assert text in hidden.words(first), f"{bug.id}: masked where hidden cases run: {hidden.words(first)}"
