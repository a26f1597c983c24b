"""Forbidden APIs as a class, not as names: every route to a fused attention kernel counts.

``tests/submissions/fused_routes.py`` reaches SDPA through ``torch.ops.aten`` with the
name built at run time, the stand-in's closure, the math kernel under SDPA, code
compiled with a file name inside ``grader/``, and fused masked softmax: none scores,
each check names the rule. In-process, :func:`grader.fused.blocked` refuses every
route while it is active and gives the dispatcher its kernels back after.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from grader import engine, fused, rules

SUBMISSIONS = Path(__file__).parent / "submissions"
ROUTES = ("masked_softmax", "attention", "multi_head_attention", "kv_cache_attention", "gqa_attention")


@pytest.mark.slow
def test_every_route_to_the_fused_kernels_scores_zero_and_names_the_rule():
    report = engine.grade(SUBMISSIONS / "fused_routes.py", exercises=list(ROUTES))
    for name in ROUTES:
        e = report.exercise(name)
        assert e.score == 0, (name, e.message)
        assert rules.RULE in e.message, (name, e.message)


@pytest.mark.slow
def test_safe_softmax_flex_math_attention_and_the_quantizable_module_score_zero_with_the_rule():
    """The routes by other names: ``torch._safe_softmax``, FlexAttention's eager
    ``math_attention`` (after taking the import refusal off ``sys.meta_path``) and the
    quantizable ``MultiheadAttention``, each reached by a name built at run time."""
    names = ["masked_softmax", "attention", "multi_head_attention"]
    report = engine.grade(SUBMISSIONS / "fused_other_names.py", exercises=names)
    for name in names:
        e = report.exercise(name)
        assert e.score == 0, (name, e.message)
        assert rules.RULE in e.message, (name, e.message)
    assert "safe masked softmax" in report.exercise("masked_softmax").message
    assert rules.ATTENTION_MODULE in report.exercise("multi_head_attention").message


def test_safe_softmax_and_every_multihead_attention_class_are_refused_and_given_back():
    from torch.ao.nn import quantizable

    real = torch.nn.modules.activation.MultiheadAttention
    x, q = _q(3, 1, 4), _q(2, 3)
    with rules.forbid_torch_apis():
        for call in (lambda: torch._safe_softmax(q, -1), lambda: ATEN._safe_softmax(q, -1),
                     lambda: quantizable.MultiheadAttention(4, 2), lambda: real(4, 2),
                     lambda: quantizable.MultiheadAttention._forward_impl(None, x, x, x),
                     lambda: torch.nn.TransformerEncoderLayer(4, 2)):
            with pytest.raises(rules.ForbiddenAPIError) as e:
                call()
            assert rules.is_rule_message(str(e.value)), str(e.value)
        assert torch.allclose(torch.softmax(q, -1).sum(-1), torch.ones(2))  # a plain softmax runs
    assert torch.allclose(torch._safe_softmax(q, -1), torch.softmax(q, -1))  # all given back after
    assert quantizable.MultiheadAttention(4, 2)(x, x, x)[0].shape == (3, 1, 4)


def _q(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


ATEN = torch.ops.aten
ROUTE_CALLS = {
    "F.scaled_dot_product_attention": lambda q, m: F.scaled_dot_product_attention(q, q, q),
    "torch.ops.aten.scaled_dot_product_attention": lambda q, m: ATEN.scaled_dot_product_attention(q, q, q),
    "the math kernel": lambda q, m: ATEN._scaled_dot_product_attention_math(q, q, q),
    "the flash kernel for the CPU": lambda q, m: ATEN._scaled_dot_product_flash_attention_for_cpu(q, q, q),
    "on the meta device": lambda q, m: F.scaled_dot_product_attention(*(q.to("meta"),) * 3),
    "with autograd": lambda q, m: F.scaled_dot_product_attention(q.requires_grad_(), q, q),
    "fused masked softmax": lambda q, m: torch._masked_softmax(q, m, 3, 2),
    "the fast path of nn.MultiheadAttention": lambda q, m: ATEN._native_multi_head_attention(
        q[0], q[0], q[0], 8, 2, _q(24, 8), _q(24), _q(8, 8), _q(8)),
}


def test_the_fused_operators_are_blocked_whoever_calls_them_and_given_back_after():
    q, m = _q(1, 2, 4, 8), torch.zeros(1, 2, 4, 8, dtype=torch.bool)
    refused = []
    with rules.forbid_torch_apis():
        real = F.scaled_dot_product_attention
        assert real.__closure__ is None or all(not callable(c.cell_contents) for c in real.__closure__)
        assert not hasattr(real, "__wrapped__")
        assert torch.nn.MultiheadAttention.__bases__ == (object,)  # the stand-in hands no real class back
        for name, call in ROUTE_CALLS.items():
            with pytest.raises(rules.ForbiddenAPIError) as e:
                call(q, m)
            refused.append(name)
            assert rules.is_rule_message(str(e.value)), str(e.value)
        ops = fused.fused_operators()
        assert {"aten::scaled_dot_product_attention", "aten::_masked_softmax",
                "aten::_native_multi_head_attention", "aten::_efficient_attention_forward"} <= set(ops)
        assert torch.softmax(q @ q.mT, -1).shape == (1, 2, 4, 4)  # plain operations run
    assert len(refused) == len(ROUTE_CALLS)
    out = F.scaled_dot_product_attention(q, q, q)  # the dispatcher has its kernels back
    assert torch.allclose(out, torch.softmax(q @ q.mT / 8**0.5, -1) @ q, atol=1e-5)


def test_code_compiled_under_a_grader_file_name_is_not_let_through():
    q = _q(1, 1, 3, 4)
    code = compile("def f(q):\n    return F.scaled_dot_product_attention(q, q, q)\n", rules.__file__, "exec")
    namespace = {"F": F}
    exec(code, namespace)
    with rules.forbid_torch_apis(), pytest.raises(rules.ForbiddenAPIError):
        namespace["f"](q)


def test_flex_attention_s_operator_is_blocked():
    hops = fused._hops()
    assert hops, "no flex attention higher-order operator found in this torch"
    from torch._higher_order_ops.flex_attention import flex_attention as hop

    with rules.forbid_torch_apis(), pytest.raises(rules.ForbiddenAPIError):
        hop(*(_q(1, 1, 4, 8),) * 3, lambda s, b, h, i, j: s, (4, 4, None), 1.0, {})
