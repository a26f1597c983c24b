"""The registry of exercises: order, points, determinism of the cases, speed of
the public checks, and the fnspecs given to influence_matrix."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch
from buggy import correct, failures, grade

import attnmask as am
from grader import fnspecs
from grader.checks import EXERCISES, POINTS, public_summary
from grader.checks.ch13_kernels import KERNEL_EXERCISES
from grader.spec import Call, FnSpec


def test_exercises_follow_the_contract_in_chapter_order():
    assert tuple(EXERCISES) == am.CONTRACT
    assert list(POINTS) == list(EXERCISES)
    chapters = [ex.chapter for ex in EXERCISES.values()]
    assert chapters == sorted(chapters) and set(chapters) == {*range(1, 14)}  # every chapter has one
    for name, ex in EXERCISES.items():
        assert ex.name == name and ex.points == POINTS[name] > 0
        assert name in public_summary(name)
    with pytest.raises(KeyError):
        public_summary("no_such_exercise")


def test_the_instructor_guide_lists_the_registrys_points():
    """book/instructors_grader.md's points table is the registry's, row for row."""
    guide = (Path(__file__).resolve().parent.parent / "book" / "instructors_grader.md").read_text()
    rows = re.findall(r"^\| (\d+) \| `(\w+)` \| ([\d.]+) \|", guide, flags=re.M)
    assert [(name, float(points)) for _, name, points in rows] == list(POINTS.items())
    assert [int(ch) for ch, _, _ in rows] == [ex.chapter for ex in EXERCISES.values()]


def test_points_add_up_to_100_in_half_points():
    assert sum(POINTS.values()) == 100
    assert all(2 * p == int(2 * p) for p in POINTS.values()), "points are whole or half points"


@pytest.mark.parametrize("name", list(EXERCISES))
def test_check_names_are_unique_and_public_checks_come_first(name):
    checks = EXERCISES[name].make_checks(0, hidden=True)
    names = [c.name for c in checks]
    assert len(names) == len(set(names))
    public = [c.name for c in EXERCISES[name].make_checks(0, hidden=False)]
    assert public and names[: len(public)] == public
    assert all(c.public for c in checks[: len(public)]) and not any(c.public for c in checks[len(public):])
    assert any(c.requires == "cuda" for c in checks), "a CUDA check exists (skipped without a GPU)"
    assert 6 <= sum(len(c.calls) for c in checks) <= 40


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        if not (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape):
            return False
        if a.dtype.is_floating_point:  # NaN inputs are deliberate (tiled_attention's skipped tiles)
            return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0.5), b.nan_to_num(0.5))
        return torch.equal(a, b)
    if isinstance(a, FnSpec):
        return isinstance(b, FnSpec) and a.kind == b.kind and _same(a.params, b.params)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, tuple | list):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _calls(checks) -> list[Call]:
    return [(c.name, call.args, call.kwargs, call.device) for c in checks for call in c.calls]


@pytest.mark.parametrize("name", list(EXERCISES))
def test_same_seed_same_checks_other_seed_other_hidden_inputs(name):
    make = EXERCISES[name].make_checks
    assert _same(_calls(make(5)), _calls(make(5)))
    assert _same(_calls(make(5, hidden=False)), _calls(make(6, hidden=False))), "public: same for all"
    assert [c.name for c in make(5)] == [c.name for c in make(6)], "check names do not depend on the seed"
    hidden = lambda seed: _calls(make(seed)[len(make(seed, hidden=False)):])  # noqa: E731
    assert not _same(hidden(5), hidden(6))


def _tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, list | tuple):
        for e in x:
            yield from _tensors(e)
    elif isinstance(x, dict):
        for e in x.values():
            yield from _tensors(e)
    elif isinstance(x, FnSpec):
        yield from _tensors(x.params)


@pytest.mark.parametrize("name", list(EXERCISES))
def test_public_checks_are_small_enough_for_the_notebook(name):
    """check() runs in the student's kernel after every edit, so its cases stay small: a few
    calls on tensors of a few thousand entries, sizes in the tens. How long they take is
    measured, not tested: scripts/bench_grader.py prints each exercise's check() time."""
    checks = EXERCISES[name].make_checks(0, hidden=False)
    calls = [call for c in checks for call in c.calls]
    entries = sum(t.numel() for call in calls for t in _tensors((call.args, call.kwargs)))
    sizes = [a for call in calls for a in call.args if type(a) is int]
    assert len(calls) <= 20 and entries <= 20_000 and max(sizes, default=0) <= 64, (entries, sizes)
    assert failures(grade(getattr(correct, name), checks)) == {}


def test_fnspec_mix_has_the_closed_form_influence():
    gen = torch.Generator().manual_seed(0)
    a, w = torch.randn(4, 4, generator=gen), torch.randn(3, 5, generator=gen)
    f = fnspecs.build(FnSpec("mix", {"a": a, "w": w}))
    x = torch.randn(4, 3, generator=gen)
    assert f(x).shape == (4, 5)
    torch.testing.assert_close(correct.influence_matrix(f, x), a.abs() * w.norm())


def test_fnspec_attention_causal_and_elementwise_influence_patterns():
    gen = torch.Generator().manual_seed(1)
    ws = {k: torch.randn(3, 3, generator=gen) for k in ("w_q", "w_k", "w_v")}
    x = torch.randn(5, 3, generator=gen)
    causal = correct.influence_matrix(fnspecs.build(FnSpec("attention", {**ws, "causal": True})), x)
    full = correct.influence_matrix(fnspecs.build(FnSpec("attention", {**ws, "causal": False})), x)
    future = torch.ones(5, 5, dtype=torch.bool).triu(1)
    assert (causal[future] == 0).all() and (full[future] > 0).all()
    diag = correct.influence_matrix(fnspecs.build(FnSpec("elementwise", {"scale": 0.5})), x)
    assert (diag - torch.diag(diag.diagonal()) == 0).all() and (diag.diagonal() > 0).all()


def test_fnspec_follows_the_input_dtype_and_rejects_unknown_kinds():
    f = fnspecs.build(FnSpec("mix", {"a": torch.eye(2), "w": torch.ones(2, 2)}))
    assert f(torch.ones(2, 2, dtype=torch.float16)).dtype == torch.float16
    with pytest.raises(ValueError, match="unknown function kind"):
        fnspecs.build(FnSpec("nope"))


# --------------------------------------------------------------------------- bug classes, caught in general

def _contract_args(name: str) -> list[ast.arg]:
    """The positional parameters of exercise ``name`` as the contract states them
    (its one-line summary starts with the signature), with their defaults."""
    signature = public_summary(name).split("):")[0] + "): pass"
    fn = ast.parse(f"def {signature}").body[0]
    args = fn.args.posonlyargs + fn.args.args
    return [(a.arg, i >= len(args) - len(fn.args.defaults)) for i, a in enumerate(args)]


def _arg_names(name: str) -> list[str]:
    return [a for a, _ in _contract_args(name)]


def _optional_args(name: str) -> list[str]:
    return [a for a, optional in _contract_args(name) if optional]


def _has_empty_row(call) -> bool:
    for a in call.args:
        if isinstance(a, torch.Tensor) and a.dtype == torch.bool and a.dim() >= 2 and a.shape[-1] > 0:
            if bool((~a.any(dim=-1)).any()):
                return True
    return False


#: A Triton kernel reads memory through pointers: it cannot run on meta tensors (chapter 13).
@pytest.mark.parametrize("name", [n for n in EXERCISES if n not in KERNEL_EXERCISES])
def test_defaults_are_exercised_on_the_meta_device(name):
    """Every optional argument an exercise can be called without is left out in a check on the
    meta device, or on the CPU under a meta default device, so a tensor the function makes for it
    on the default device, not the inputs', is caught."""
    checks = EXERCISES[name].make_checks(3, hidden=True)
    for arg in _optional_args(name):
        position = _arg_names(name).index(arg)
        assert any(c.kind == "property" and "meta" in (call.device, call.default_device)
                   and len(call.args) <= position
                   and arg not in call.kwargs for c in checks for call in c.calls), \
            f"{name}: no meta check leaves {arg} out"


MASKED = [n for n in EXERCISES if "mask" in _arg_names(n) or "scores" in _arg_names(n)]
# kv_cache_attention is left out: none of its rows is ever empty
DIFFERENTIABLE = ["masked_softmax", "attention", "multi_head_attention", "tiled_attention"]


@pytest.mark.parametrize("name", MASKED)
def test_masked_exercises_have_value_cases_with_a_fully_masked_row(name):
    checks = EXERCISES[name].make_checks(3, hidden=True)
    assert any(c.kind == "value" and any(_has_empty_row(call) for call in c.calls) for c in checks), name


# to_additive and tile_lists compute no scores: they read the mask alone
@pytest.mark.parametrize("name", [n for n in MASKED if n not in ("to_additive", "tile_lists")]
                         + ["kv_cache_attention"])
def test_attention_exercises_have_large_blocked_score_cases(name):
    names = [c.name for c in EXERCISES[name].make_checks(3, hidden=True) if c.kind == "value"]
    assert any(n.startswith("large scores") for n in names), names


@pytest.mark.parametrize("name", DIFFERENTIABLE)
def test_gradients_are_checked_through_fully_masked_rows(name):
    checks = EXERCISES[name].make_checks(3, hidden=True)
    assert any(c.want_grads and any(_has_empty_row(call) for call in c.calls) for c in checks), name


# --------------------------------------------------------------------------- public checks state every rule

@pytest.mark.parametrize("name", list(EXERCISES))
def test_every_rule_is_met_in_the_public_checks(name):
    """Dtype, device, inputs unchanged, invariances: every property is checked publicly, so
    the notebook's check() meets each stated rule; hidden checks only draw new values."""
    public = EXERCISES[name].make_checks(3, hidden=False)
    everything = EXERCISES[name].make_checks(3, hidden=True)
    assert any(c.kind == "property" for c in public), name
    assert all(c.public for c in everything if c.kind == "property"), name
    assert [c.name for c in everything if c.public] == [c.name for c in public]


def test_a_float_mask_fails_the_public_checks():
    def causal_mask(n, *, device=None):
        return torch.ones(n, n, device=device).tril()  # float, not bool

    failed = failures(grade(causal_mask, EXERCISES["causal_mask"].make_checks(0, hidden=False)))
    assert any("expected bool" in m for m in failed.values()), failed


def test_a_decoder_mask_that_pads_rows_is_not_told_it_pads_instead_of_keys():
    from buggy.mistakes import decoder_pads_rows_too

    failed = failures(grade(decoder_pads_rows_too, EXERCISES["decoder_mask"].make_checks(7, hidden=True)))
    text = " ".join(failed.values())
    assert "padded query rows are masked" in text and "instead of key columns" not in text


def test_a_padding_mask_grid_names_its_rows_as_sequences():
    def padding_mask(lengths, max_len):
        return torch.arange(max_len, device=lengths.device)[None, :] <= lengths[:, None]

    failed = failures(grade(padding_mask, EXERCISES["padding_mask"].make_checks(0, hidden=False)))
    text = " ".join(failed.values())
    assert "rows = sequences b, columns = positions j" in text and "rows = queries" not in text
