"""Judges never raise: whatever comes back, the verdict is a plain failure."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grader.checks import EXERCISES
from grader.spec import NotATensor, Outcome, Verdict

CHECKS = [(name, check) for name, ex in EXERCISES.items() for check in ex.make_checks(2, hidden=True)]
IDS = [f"{name}:{check.name}" for name, check in CHECKS]

JUNK_OUTPUTS = [
    None, NotATensor("list"), NotATensor("NoneType"), NotATensor("tensor subclass Evil"), "a string", 3, 2.5,
    (), (None,), (NotATensor("int"), NotATensor("int"), NotATensor("int")),
    {"value": torch.zeros(2)}, [torch.zeros(2)],
    torch.tensor(float("nan")), torch.zeros(()), torch.zeros(0), torch.zeros(3, 0, 2),
    torch.full((2, 2), float("nan")), torch.full((4, 4), float("inf")), torch.zeros(7, 7, dtype=torch.int64),
    torch.zeros(2, 3, dtype=torch.complex64), torch.ones(1, 1, 1, 1, 1, 1, dtype=torch.bool),
    (torch.zeros(2, 2), torch.zeros(3)), (torch.zeros(2), torch.zeros(2), torch.zeros(2), torch.zeros(2)),
    (torch.full((2, 3), float("nan")),) * 3, torch.zeros(2, 3, dtype=torch.uint8) + 7,
]


def junk_outcomes(check, output=None, **kw) -> list[Outcome]:
    return [Outcome(output=output, **kw) for _ in check.calls]


def assert_fails_plainly(verdict, may_pass: bool = False):
    assert isinstance(verdict, Verdict)
    if may_pass and verdict.passed:
        return
    assert not verdict.passed
    assert isinstance(verdict.message, str) and verdict.message
    assert "could not be judged" not in verdict.message, verdict.message  # no judge crashed


@pytest.mark.parametrize("name, check", CHECKS, ids=IDS)
def test_judges_fail_plainly_on_junk(name, check):
    for k, output in enumerate(JUNK_OUTPUTS):
        for devices in [(None, "meta", ("cuda", "cpu"), 5)[k % 4]]:
            outcomes = junk_outcomes(check, output, devices=devices, args_after=("junk",), grads={"junk": 1})
            # a dtype check judges only the dtype: a bool (int64) tensor of any shape passes it
            dtype_only = isinstance(output, torch.Tensor) and any(
                word in check.name and output.dtype == dtype
                for word, dtype in (("bool", torch.bool), ("int64", torch.int64)))
            assert_fails_plainly(check.judge(check.calls, outcomes), may_pass=dtype_only)
    assert_fails_plainly(check.judge(check.calls, junk_outcomes(check, error="RuntimeError: boom")))
    assert_fails_plainly(check.judge(check.calls, []))  # lost outcomes
    if check.want_grads:
        assert_fails_plainly(check.judge(check.calls, junk_outcomes(check, grads={"error": "no grad"})))


tensors = st.builds(
    lambda shape, dtype, fill: torch.full(shape, fill).to(dtype),
    st.lists(st.integers(0, 5), max_size=5).map(tuple),
    st.sampled_from([torch.bool, torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int64]),
    st.sampled_from([0.0, 1.0, -1.0, float("nan"), float("inf"), float("-inf"), 1e30]),
)
outputs = st.recursive(
    st.one_of(tensors, st.none(), st.integers(), st.text(max_size=5),
              st.builds(NotATensor, st.text(max_size=8))),
    lambda inner: st.one_of(st.tuples(inner), st.tuples(inner, inner), st.tuples(inner, inner, inner),
                            st.lists(inner, max_size=3),
                            st.dictionaries(st.text(max_size=3), inner, max_size=2)),
    max_leaves=4,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pick=st.integers(0, len(CHECKS) - 1), output=outputs, after=outputs, grads=outputs, devices=outputs)
def test_judges_never_raise_on_random_junk(pick, output, after, grads, devices):
    name, check = CHECKS[pick]
    outcomes = junk_outcomes(check, output, args_after=after, grads=grads, devices=devices)
    verdict = check.judge(check.calls, outcomes)
    assert isinstance(verdict, Verdict)
    assert "could not be judged" not in verdict.message, verdict.message
