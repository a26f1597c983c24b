"""Chapter 12: learned sinks against transformers' gpt-oss, top-k selection, the block
diffusion mask against BD3-LM's FlexAttention predicate, and decay masks against the
recurrent scan; code that does nothing scores 0."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from buggy import grade
from hypothesis import given, settings
from hypothesis import strategies as st

import attnmask as am
from grader.checks import EXERCISES
from grader.results import CheckResult, score_of

CH12 = ("sink_attention", "topk_selection_mask", "block_diffusion_mask", "decay_mask")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------- sink_attention

def _gpt_oss_attention(H: int = 4, d: int = 8):
    """transformers' GptOssAttention of a tiny config, with random sinks."""
    from transformers import GptOssConfig
    from transformers.models.gpt_oss import modeling_gpt_oss as gpt_oss

    config = GptOssConfig(hidden_size=H * d, num_attention_heads=H, num_key_value_heads=H, head_dim=d,
                          num_hidden_layers=1, intermediate_size=16, vocab_size=32, num_local_experts=2,
                          num_experts_per_tok=1)
    module = gpt_oss.GptOssAttention(config, 0).eval()
    with torch.no_grad():
        module.sinks.copy_(torch.randn(H, generator=_gen(5)) * 2)
    return module, gpt_oss.eager_attention_forward


@pytest.mark.parametrize("masked", ["none", "causal", "per_head_with_empty_rows"])
def test_sink_attention_is_gpt_oss_eager_attention(masked):
    module, eager = _gpt_oss_attention()
    gen = _gen(1)
    B, H, Lq, Lk, d = 2, 4, 5, 7, 8
    q, k, v = (torch.randn(B, H, n, d, generator=gen) for n in (Lq, Lk, Lk))
    mask = {"none": None, "causal": am.causal_mask(Lq, n_keys=Lk),
            "per_head_with_empty_rows": torch.rand(B, H, Lq, Lk, generator=gen) < 0.5}[masked]
    if mask is not None and masked != "causal":
        mask[0, 1, 2] = False  # a fully masked row: gpt-oss gives it weight 0 on every key
    additive = None if mask is None else am.to_additive(torch.broadcast_to(mask, (B, H, Lq, Lk)))
    want, weights = eager(module, q, k, v, additive, scaling=module.scaling)  # (B, Lq, H, d)
    got = am.sink_attention(q, k, v, module.sinks.detach(), mask)
    torch.testing.assert_close(got, want.transpose(1, 2))
    w, sink = am.sink_weights(q, k, module.sinks.detach(), mask)
    torch.testing.assert_close(w, weights)
    torch.testing.assert_close(w.sum(-1) + sink, torch.ones(B, H, Lq))


def test_a_fully_masked_row_gives_zero_and_finite_gradients_to_every_input():
    gen = _gen(2)
    q, k, v = (torch.randn(1, 2, 3, 4, generator=gen, requires_grad=True) for _ in range(3))
    sinks = torch.tensor([0.5, -1.0], requires_grad=True)
    mask = torch.ones(1, 2, 3, 3, dtype=torch.bool)
    mask[0, 0, 1] = False
    out = am.sink_attention(q, k, v, sinks, mask)
    assert torch.equal(out[0, 0, 1], torch.zeros(4))
    out.square().sum().backward()
    for t in (q, k, v, sinks):
        assert t.grad is not None and torch.isfinite(t.grad).all()


def test_a_sink_of_minus_infinity_is_chapter_2_attention_and_half_precision_is_computed_in_float32():
    gen = _gen(3)
    q, k, v = (torch.randn(2, 3, 4, 5, generator=gen) for _ in range(3))
    mask = torch.rand(2, 3, 4, 4, generator=gen) < 0.7
    mask[..., 0] = True
    out = am.sink_attention(q, k, v, torch.full((3,), -1e4), mask)
    torch.testing.assert_close(out, am.attention(q, k, v, mask)[0])
    half = am.sink_attention(q.half(), k.half(), v.half(), torch.zeros(3), mask)
    assert half.dtype == torch.float16
    torch.testing.assert_close(half.float(), am.sink_attention(q.half().float(), k.half().float(),
                                                               v.half().float(), torch.zeros(3), mask),
                               atol=1e-3, rtol=1e-3)


# --------------------------------------------------------------------------- topk_selection_mask

def _topk_by_loops(scores: torch.Tensor, k: int, causal: bool) -> torch.Tensor:
    """The contract read literally, one query at a time (sorted() is stable: ties keep index order)."""
    B, Lq, Lk = scores.shape
    out = torch.zeros(B, Lq, Lk, dtype=torch.bool)
    for b in range(B):
        for i in range(Lq):
            seen = [j for j in range(Lk)
                    if (not causal or j <= Lk - Lq + i) and not math.isnan(scores[b, i, j])]
            for j in sorted(seen, key=lambda j: -float(scores[b, i, j]))[:k]:
                out[b, i, j] = True
    return out


@settings(max_examples=40, deadline=None)
@given(Lq=st.integers(1, 6), extra=st.integers(0, 5), k=st.integers(1, 8), causal=st.booleans(),
       levels=st.integers(1, 4), nan=st.booleans(), seed=st.integers(0, 2**16))
def test_topk_selection_mask_is_the_contract_read_literally(Lq, extra, k, causal, levels, nan, seed):
    gen = _gen(seed)
    scores = torch.randint(0, levels, (2, Lq, Lq + extra), generator=gen).float()  # many ties
    if nan:
        scores[torch.rand(scores.shape, generator=gen) < 0.3] = float("nan")
    got = am.topk_selection_mask(scores, k, causal=causal)
    assert got.dtype == torch.bool
    assert torch.equal(got, _topk_by_loops(scores, k, causal))


def test_topk_rejects_k_below_one_and_runs_on_meta():
    with pytest.raises(ValueError, match="k >= 1"):
        am.topk_selection_mask(torch.zeros(1, 2, 3), 0)
    assert am.topk_selection_mask(torch.zeros(2, 3, 5, device="meta"), 2).shape == (2, 3, 5)


def test_selected_blocks_become_a_block_mask_whose_tiles_are_full_or_empty():
    from torch.nn.attention.flex_attention import create_block_mask

    gen = _gen(4)
    block, nb = 4, 4
    block_scores = torch.randn(1, nb, nb, generator=gen)
    chosen = am.topk_selection_mask(block_scores, 2)  # (1, nb, nb): two key blocks per query block
    fn = am.selected_blocks(chosen, block)
    dense = am.materialize(fn, nb * block, nb * block, B=1)
    assert torch.equal(dense[0, 0], chosen[0].repeat_interleave(block, 0).repeat_interleave(block, 1))
    bm = create_block_mask(fn, 1, None, nb * block, nb * block, device="cpu", BLOCK_SIZE=block)
    assert torch.equal(bm.to_dense()[0, 0].bool(), chosen[0])


# --------------------------------------------------------------------------- block_diffusion_mask

def _bd3lm_predicate(L: int, block: int):
    """BD3-LM's training mask as the Block Diffusion paper states it (arXiv 2503.09573): the
    union of a block-diagonal mask within each copy, an offset block-causal mask from the
    noisy copy to earlier clean blocks, and a block-causal mask within the clean copy."""

    def mask_mod(b, h, q_idx, kv_idx):
        q_x0, kv_x0 = q_idx >= L, kv_idx >= L
        q_blk = torch.where(q_x0, q_idx - L, q_idx) // block
        kv_blk = torch.where(kv_x0, kv_idx - L, kv_idx) // block
        diagonal = (q_blk == kv_blk) & (q_x0 == kv_x0)
        offset = (q_blk > kv_blk) & kv_x0 & ~q_x0
        causal = (q_blk >= kv_blk) & kv_x0 & q_x0
        return diagonal | offset | causal

    return mask_mod


@pytest.mark.parametrize(("L", "block"), [(8, 2), (12, 4), (6, 1), (5, 5)])
def test_block_diffusion_mask_drives_flex_attention_like_bd3lm_predicate(L, block):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    bm = create_block_mask(_bd3lm_predicate(L, block), None, None, 2 * L, 2 * L, device="cpu",
                           BLOCK_SIZE=block)
    ours = am.block_diffusion_mask(L, block)
    assert ours.shape == (2 * L, 2 * L) and ours.dtype == torch.bool
    gen = _gen(L)
    q, k, v = (torch.randn(1, 2, 2 * L, 8, generator=gen) for _ in range(3))
    with warnings.catch_warnings():  # flex_attention without torch.compile: the unfused reference path
        warnings.simplefilter("ignore", UserWarning)
        want = flex_attention(q, k, v, block_mask=bm)
    got = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=ours)
    torch.testing.assert_close(got, want)
    # the same predicate, materialised cell by cell, is the same mask
    assert torch.equal(am.materialize(_bd3lm_predicate(L, block), 2 * L, 2 * L), ours)


def test_block_diffusion_mask_rejects_blocks_that_do_not_tile_and_runs_on_meta():
    for bad in ((10, 4), (6, 0), (3, 5)):
        with pytest.raises(ValueError):
            am.block_diffusion_mask(*bad)
    assert am.block_diffusion_mask(8, 2, device="meta").shape == (16, 16)


# --------------------------------------------------------------------------- decay_mask

@pytest.mark.parametrize("docs", [False, True])
def test_linear_attention_with_the_decay_mask_is_the_recurrent_scan(docs):
    gen = _gen(6)
    B, L, d, dv = 2, 40, 4, 3
    q, k = torch.randn(B, L, d, generator=gen), torch.randn(B, L, d, generator=gen)
    v = torch.randn(B, L, dv, generator=gen)
    log_gates = -torch.rand(B, L, generator=gen)
    ids = torch.tensor([[0] * 10 + [1] * 25 + [2] * 5, [0] * 3 + [1] * 37]) if docs else None
    D = am.decay_mask(log_gates, ids)
    torch.testing.assert_close(am.linear_attention(q, k, v, D), am.decay_scan(q, k, v, log_gates, ids))


def test_decay_mask_on_long_sequences_and_closed_gates_has_no_nan_and_matches_float64():
    gen = _gen(7)
    log_gates = -torch.rand(1, 600, generator=gen) * 2  # the cumulative sum reaches about -600
    log_gates[0, 100] = float("-inf")
    D = am.decay_mask(log_gates)
    assert D.dtype == torch.float32 and not torch.isnan(D).any()
    assert torch.equal(D.diagonal(dim1=-2, dim2=-1), torch.ones(1, 600))
    assert (D[0, 100:, :100] == 0).all()  # nothing crosses a closed gate
    torch.testing.assert_close(D, am.decay_mask(log_gates.double()).float())
    ratio = torch.exp(log_gates.cumsum(-1))  # what exp of a cumulative sum gives
    assert torch.isnan(ratio[:, :, None] / ratio[:, None, :]).any()


def test_decay_mask_gradients_reach_the_gates_and_it_runs_on_meta():
    log_gates = (-torch.rand(2, 6, generator=_gen(8))).requires_grad_(True)
    am.decay_mask(log_gates, torch.tensor([[0, 0, 0, 1, 1, 1]] * 2)).sum().backward()
    assert torch.isfinite(log_gates.grad).all() and (log_gates.grad != 0).any()
    assert am.decay_mask(torch.zeros(2, 5, device="meta")).device.type == "meta"


# --------------------------------------------------------------------------- code that does nothing

def _block_diagonal(L, block, *, device=None):
    return torch.block_diag(*[torch.ones(block, block, dtype=torch.bool)] * (2 * L // block))


def _trivial(name):
    """Code that computes nothing the exercise asks for."""
    if name == "sink_attention":
        def plain(q, k, v, sinks, mask=None):
            return am.attention(q, k, v, mask)[0]

        return [lambda q, k, v, sinks, mask=None: torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype),
                plain,
                lambda q, k, v, sinks, mask=None: am.attention(q, k, v)[0]]
    if name == "topk_selection_mask":
        def visible(s, k, *, causal=True):
            return am.causal_mask(s.shape[1], n_keys=s.shape[2]).expand(s.shape) if causal else s == s

        return [visible, lambda s, k, *, causal=True: torch.ones(s.shape, dtype=torch.bool),
                lambda s, k, *, causal=True: torch.zeros(s.shape, dtype=torch.bool)]
    if name == "block_diffusion_mask":
        return [lambda L, b, *, device=None: am.causal_mask(2 * L, device=device),
                lambda L, b, *, device=None: torch.ones(2 * L, 2 * L, dtype=torch.bool, device=device),
                _block_diagonal]
    return [lambda g, doc_ids=None: am.causal_mask(g.shape[1]).float().expand(g.shape[0], -1, -1),
            lambda g, doc_ids=None: torch.eye(g.shape[1]).expand(g.shape[0], -1, -1),
            lambda g, doc_ids=None: torch.zeros(g.shape[0], g.shape[1], g.shape[1])]


@pytest.mark.parametrize("seed", [0, 7])
@pytest.mark.parametrize("name", CH12)
def test_code_that_does_nothing_scores_zero(name, seed):
    checks = EXERCISES[name].make_checks(seed, hidden=True)
    for fn in _trivial(name):
        verdicts = grade(fn, checks)
        results = [CheckResult(c.name, c.public, c.weight, verdicts[c.name].passed, kind=c.kind)
                   for c in checks if c.name in verdicts]
        assert score_of(results) == 0.0, [r.name for r in results if r.passed and r.kind == "value"]
