"""attnmask.real_models against oracles nobody here wrote (PyTorch's SDPA with
enable_gqa, FlexAttention), the contract's worked examples, and the grader's
chapter-9 checks against implementations that compute nothing."""

from __future__ import annotations

import ast
import warnings

import pytest
import torch
import torch.nn.functional as F
from buggy import grade
from torch.nn.attention.flex_attention import flex_attention

import attnmask as am
from grader.checks import EXERCISES
from grader.rules import scan_trees

CH9 = ("left_padding_position_ids", "packed_labels", "gqa_attention", "alibi_bias")


def test_position_ids_number_real_tokens_in_any_pattern():
    keep = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 0, 1, 0], [0, 0, 0, 0, 0]]).bool()
    want = torch.tensor([[0, 0, 0, 1, 2], [0, 1, 0, 2, 0], [0, 0, 0, 0, 0]])
    got = am.left_padding_position_ids(keep)
    assert got.dtype == torch.long and torch.equal(got, want)
    assert am.left_padding_position_ids(keep.to("meta")).device.type == "meta"
    with pytest.raises(TypeError, match="bool"):
        am.left_padding_position_ids(keep.long())


def test_packed_labels_and_positions():
    tokens, ids = torch.tensor([[5, 6, 7, 8, 9, 10]]), torch.tensor([[0, 0, 0, 1, 1, 2]])
    assert am.packed_labels(tokens, ids).tolist() == [[6, 7, -100, 9, -100, -100]]
    assert am.packed_labels(tokens, ids, ignore_index=-1).tolist() == [[6, 7, -1, 9, -1, -1]]
    assert am.packed_position_ids(ids).tolist() == [[0, 1, 2, 0, 1, 0]]
    assert am.packed_labels(tokens.to("meta"), ids.to("meta")).device.type == "meta"


@pytest.mark.parametrize("Hq, Hkv", [(4, 2), (6, 3), (4, 1), (3, 3)])
def test_gqa_matches_sdpa_enable_gqa(Hq, Hkv):
    gen = torch.Generator().manual_seed(Hq * 10 + Hkv)
    q = torch.randn(2, Hq, 5, 8, generator=gen)
    k, v = torch.randn(2, Hkv, 7, 8, generator=gen), torch.randn(2, Hkv, 7, 4, generator=gen)
    mask = (torch.rand(2, 1, 5, 7, generator=gen) < 0.7) | (torch.arange(7) == 0)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(am.gqa_attention(q, k, v, mask), want)
    unmasked = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    torch.testing.assert_close(am.gqa_attention(q, k, v), unmasked)


def test_gqa_fully_masked_row_is_zero_with_finite_gradients():
    q = torch.randn(1, 4, 3, 8, requires_grad=True)
    k, v = torch.randn(1, 2, 3, 8, requires_grad=True), torch.randn(1, 2, 3, 8)
    mask = torch.tensor([[True, False, False], [False] * 3, [True] * 3])
    out = am.gqa_attention(q, k, v, mask)
    assert bool((out[:, :, 1] == 0).all())
    out.sum().backward()
    assert bool(torch.isfinite(q.grad).all() and torch.isfinite(k.grad).all())


def test_alibi_slopes_follow_the_bloom_rule():
    assert am.alibi_slopes(8).tolist() == [2.0 ** -(h + 1) for h in range(8)]
    six = am.alibi_slopes(6).tolist()
    assert six == [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8, 2.0 ** -1, 2.0 ** -3]


def test_alibi_bias_is_bottom_right_and_equals_the_flex_score_mod():
    full = am.alibi_bias(4, 9, 9)
    assert torch.equal(am.alibi_bias(4, 3, 9), full[:, 6:])  # the cache's last 3 queries
    assert am.alibi_bias(3, 2, 5, device="meta", dtype=torch.float16).dtype == torch.float16
    slopes = am.alibi_slopes(4)

    def score_mod(score, b, h, q_idx, kv_idx):
        return torch.where(kv_idx <= q_idx, score - slopes[h] * (q_idx - kv_idx), float("-inf"))

    q, k, v = (torch.randn(1, 4, 9, 8) for _ in range(3))
    dense = torch.softmax(q @ k.transpose(-2, -1) / 8**0.5 + full, dim=-1) @ v
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        flex = flex_attention(q, k, v, score_mod=score_mod)
    torch.testing.assert_close(flex, dense)


def test_left_padded_generation_equals_each_row_alone():
    torch.manual_seed(0)
    lm = am.TinyDecoder(am.ModelConfig(vocab_size=11, d_model=32, n_heads=2, max_len=32)).eval()
    rows = [torch.randint(0, 11, (n,)) for n in (6, 2, 4)]
    idx = torch.stack([F.pad(r, (6 - len(r), 0)) for r in rows])
    keep = torch.arange(6)[None] >= torch.tensor([6 - len(r) for r in rows])[:, None]
    batched = am.generate_left_padded(lm, idx, keep, 5)[:, 6:]
    for r, b in zip(rows, batched):
        assert torch.equal(lm.generate(r[None], 5)[0, len(r):], b)


def _trivial(name):
    """Implementations that compute nothing: constants, random values, inputs handed back."""
    if name == "left_padding_position_ids":
        return [lambda keep: torch.zeros(keep.shape, dtype=torch.long, device=keep.device),
                lambda keep: keep.long(),
                lambda keep: torch.arange(keep.shape[1], device=keep.device).expand(keep.shape).clone()]
    if name == "packed_labels":
        return [lambda t, d, ignore_index=-100: torch.full_like(t, ignore_index),
                lambda t, d, ignore_index=-100: t.clone(),
                lambda t, d, ignore_index=-100: torch.randint(0, 50, t.shape, device=t.device)]
    if name == "gqa_attention":
        shape = lambda q, v: (*q.shape[:3], v.shape[-1])  # noqa: E731 -- (B, Hq, Lq, dv)
        return [lambda q, k, v, mask=None: torch.zeros(shape(q, v), dtype=q.dtype, device=q.device),
                lambda q, k, v, mask=None: torch.randn(shape(q, v), device=q.device).to(q.dtype),
                lambda q, k, v, mask=None: am.gqa_attention(q, k, v)]  # the mask ignored
    return [lambda n, Lq, Lk, *, device=None, dtype=torch.float32: torch.zeros(n, Lq, Lk, device=device,
                                                                                dtype=dtype),
            lambda n, Lq, Lk, *, device=None, dtype=torch.float32:
                am.to_additive(am.causal_mask(Lq, n_keys=Lk, device=device), dtype).expand(n, Lq, Lk).clone()]


@pytest.mark.parametrize("name", CH9)
def test_trivial_implementations_pass_no_value_check(name):
    checks = EXERCISES[name].make_checks(2, hidden=True)
    values = {c.name for c in checks if c.kind == "value"}
    assert values
    for fn in _trivial(name):
        passed = {n for n, v in grade(fn, checks).items() if v.passed}
        assert not passed & values, f"{name}: a trivial implementation passes {sorted(passed & values)}"


def test_meta_checks_cover_default_arguments():
    """Functions that build tensors are called on meta with optional args left out."""
    for name in CH9:
        meta = [c for c in EXERCISES[name].make_checks(0) if "meta" in c.name]
        assert meta, name
        calls = [call for c in meta for call in c.calls]
        if name == "alibi_bias":
            assert any(set(call.kwargs) == {"device"} for call in calls)
        elif name == "gqa_attention":
            assert any(len(call.args) == 3 and call.device == "meta" for call in calls)


def test_enable_gqa_and_alibi_helpers_are_off_limits():
    src = ("import torch.nn.functional as F\n"
           "def gqa_attention(q, k, v, mask=None):\n"
           "    return sdpa(q, k, v, enable_gqa=True)\n"
           "def alibi_bias(n, Lq, Lk):\n"
           "    return build_alibi_tensor(n, Lq, Lk)\n")
    found = {f.exercise: f.what for f in scan_trees([(ast.parse(src), "cell 1", 0)], CH9)}
    assert found == {"gqa_attention": "enable_gqa", "alibi_bias": "build_alibi_tensor"}
