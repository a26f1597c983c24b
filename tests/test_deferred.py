"""The worker's stand-ins for torch's heaviest modules (grader.sandbox.deferred) answer
exactly as the real ones for eager code, import nothing heavy on the meta device, and
step aside for anything symbolic."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Meta-device work of the kind the checks make student code do: masks from comparisons,
# fills, softmax, matmuls, broadcasting, reductions, type promotion, indexing.
META_WORK = r'''
import json, sys, torch
x = torch.arange(5, device="meta")
causal = x[None, :] <= x[:, None]
q = torch.randn(2, 3, 5, 4, device="meta")
s = (q @ q.transpose(-1, -2)) / 2.0
w = s.masked_fill(~causal, float("-inf")).softmax(-1)
out = [
    causal, w, torch.where(causal, s, torch.zeros((), device="meta")), w.sum(-1), w.max(-1).values,
    torch.cat([q, q], dim=1), q.half() + q.float(), (x + 1.5), x.cumsum(0), torch.tril(s), s[:, :, 1:, :2],
    torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=causal),
    causal.any(-1) & causal.all(-1),
]
facts = [[list(t.shape), str(t.dtype), str(t.device)] for t in out]
modules = {m: type(sys.modules[m]).__name__ for m in
           ("sympy", "torch._dynamo", "torch.fx.experimental.symbolic_shapes") if m in sys.modules}
print(json.dumps({"facts": facts, "modules": modules}))
'''


def _run(code: str, *, deferred: bool) -> dict:
    setup = "from grader.sandbox import deferred; deferred.install()\n" if deferred else ""
    p = subprocess.run([sys.executable, "-c", "import torch\n" + setup + code], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_meta_work_gives_the_same_results_without_importing_sympy_or_dynamo():
    real, stood_in = _run(META_WORK, deferred=False), _run(META_WORK, deferred=True)
    assert stood_in["facts"] == real["facts"]
    assert set(real["modules"].values()) == {"module"}, "the real run imports them: the test still tests"
    assert stood_in["modules"] == {"sympy": "_Sympy", "torch._dynamo": "_Dynamo",
                                   "torch.fx.experimental.symbolic_shapes": "_Shapes"}


PLAIN = [True, False, 0, 1, 7, (), (1, 2), [1, 2], (1, 3), (2, 3, 4), [2, [3]], 1.5, "x", None, {"a": 1}]


@pytest.mark.parametrize("name", ["guard_size_oblivious", "guard_or_false", "guard_or_true", "expect_true",
                                  "statically_known_true", "guard_int", "optimization_hint",
                                  "guarding_hint_or_throw", "has_guarding_hint", "is_nested_int",
                                  "has_free_symbols", "free_unbacked_symbols", "sym_and", "sym_or", "sym_eq"])
def test_each_answer_is_the_real_functions_answer(name):
    """On every plain value (and pair of them), the stand-in returns what the real function
    returns, or raises what it raises."""
    code = f'''
import itertools, json, sys
import torch.fx.experimental.symbolic_shapes as real
from grader.sandbox import deferred
stand_in = deferred._Shapes(deferred.SHAPES)  # not installed: it asks the real one
PLAIN = {PLAIN!r}
two = {name!r} in ("sym_and", "sym_or", "sym_eq")
def answer(fn, args):
    try:
        return repr(fn(*args))
    except Exception as e:
        return type(e).__name__
cases = list(itertools.product(PLAIN, PLAIN)) if two else [(v,) for v in PLAIN]
import torch
if not two:  # tensors as the meta kernels hand them over
    cases += [(torch.ones(2, 3, device="meta"),), (torch.ones(4, device="meta")[1:],), ([torch.ones(2), 3],)]
got = [(repr(a), answer(getattr(stand_in, {name!r}), a), answer(getattr(real, {name!r}), a)) for a in cases]
print(json.dumps(got))
'''
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    differ = [(args, ours, theirs) for args, ours, theirs in json.loads(p.stdout) if ours != theirs]
    assert not differ, differ[:10]


def test_anything_symbolic_gets_the_real_modules():
    code = r'''
import json, sys, torch
import sympy
x = sympy.Symbol("x")  # a name the stand-in does not define: the real sympy
from torch._prims_common import elementwise_dtypes
from torch.fx.experimental.symbolic_shapes import ShapeEnv, sym_eq
import torch._dynamo.utils  # a submodule: the real package
ok = isinstance(x, sympy.Basic) and ShapeEnv is not None and sym_eq((1, 2), (1, 2))
dtype = str(elementwise_dtypes(x + 1, torch.ones(2), type_promotion_kind=
            torch._prims_common.ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)[1])
print(json.dumps({"facts": [ok, dtype], "modules": {m: type(sys.modules[m]).__name__ for m in
      ("sympy", "torch._dynamo", "torch.fx.experimental.symbolic_shapes")}}))
'''
    stood_in = _run(code, deferred=True)
    assert stood_in == _run(code, deferred=False)
    assert set(stood_in["modules"].values()) == {"module"}
