"""The public answers are not a lookup table: a submission that returns the recorded public
checks' expected outputs (grader/data/public_checks/, what the student template carries)
for their calls, and nothing for any other call, earns about nothing under the instructor's
grading, while the notebook's public checks still say which of their cases pass.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from grader import engine
from grader.checks import recorded
from grader.checks.common.judges import Recipe
from grader.results import CheckResult, score_of

#: Computed the same way here (on the recorded calls) and in the submission (on what it is given).
KEY = '''
def _key(args, kwargs):
    def one(a):
        if isinstance(a, torch.Tensor):
            if a.device.type == "meta":
                return "meta"
            return f"{tuple(a.shape)}|{a.dtype}|{float(a.double().nan_to_num().sum()):.6g}"
        if callable(a) or isinstance(a, dict):
            return "fn"
        return repr(a)
    return ";".join([one(a) for a in args] + [f"{k}={one(v)}" for k, v in sorted(kwargs.items())])
'''


def _plain(t: torch.Tensor) -> list:
    return t.tolist() if t.dtype == torch.bool else t.double().tolist()


def lookup_table_source() -> str:
    """A submission that answers every recorded public call from the recorded data."""
    scope: dict = {"torch": torch}
    exec(KEY, scope)
    table: dict[str, list] = {}
    for name, ex in recorded.load().items():
        for check in ex.make_checks(0, hidden=False):
            made = getattr(check.judge, "made_by", None)
            recipe = next((a for a in (made[1] if made else ()) if isinstance(a, Recipe)), None)
            for call in check.calls if recipe is not None else ():
                try:
                    want = recipe.expected(call)
                except recorded.NotRecorded:
                    continue
                args = tuple({} if not isinstance(a, torch.Tensor | int | float | str | None) else a
                             for a in call.args)
                outs = [[_plain(w), str(d).replace("torch.", "")]
                        for w, d in zip(want, recorded._lookup(recipe.table, call, recipe.name)["dtypes"])]
                table[f"{name}|{scope['_key'](args, call.kwargs)}"] = outs
    # The table in cells of under 256 KiB each (the grader parses at most 512 KiB of one cell).
    chunks, chunk = [], {}
    for key, outs in table.items():
        chunk[key] = outs
        if len(json.dumps(chunk)) > 2**17:
            chunks.append(chunk)
            chunk = {}
    chunks.append(chunk)
    # each an assignment: the grader runs those, not bare expressions
    cells = [f"# %%\nTABLE = TABLE | json.loads({json.dumps(json.dumps(c))})" for c in chunks]
    lines = ["import json", "import torch", KEY, "TABLE = {}", *cells, "# %%",
             "def _answer(name):",
             "    def f(*args, **kwargs):",
             "        outs = TABLE.get(name + '|' + _key(args, kwargs))",
             "        if outs is None:",
             "            return None",
             "        got = [torch.tensor(v, dtype=getattr(torch, d or 'float32')) for v, d in outs]",
             "        return got[0] if len(got) == 1 else tuple(got)",
             "    return f", ""]
    lines += [f"{name} = _answer({name!r})" for name in recorded.load()]
    return "\n".join(lines) + "\n"


@pytest.mark.slow
def test_a_lookup_table_of_the_public_answers_earns_nothing(tmp_path):
    path = tmp_path / "lookup.py"
    path.write_text(lookup_table_source())
    public = engine.grade(path, public_only=True)
    assert public.score > 10  # the table does answer the public checks: check(...) says they pass
    report = engine.grade(path, seed=918273645512345678)
    assert report.score <= 1.0, [(e.name, e.score) for e in report.exercises if e.score]


def _check(kind: str, public: bool, passed: bool) -> CheckResult:
    return CheckResult(name=f"{kind} {public}", public=public, weight=1.0, passed=passed, kind=kind)


def test_a_public_value_check_earns_once_a_hidden_one_passes():
    public_only = [_check("value", True, True), _check("value", False, False)]
    assert score_of(public_only) == 0.0
    both = [_check("value", True, True), _check("value", False, True), _check("edge", True, True)]
    assert score_of(both) == 1.0
    without_hidden = [_check("value", True, True), _check("value", True, False)]  # a public-only grading
    assert math.isclose(score_of(without_hidden), 0.5)
