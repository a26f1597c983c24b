"""Chapter 11: attention with its log-sum-exp, merged partial results, ring attention
(simulated and on real gloo processes) and chunked local attention."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch
from buggy import grade
from hypothesis import given, settings
from hypothesis import strategies as st

import attnmask as am
from grader.checks import EXERCISES
from grader.results import CheckResult, score_of

ROOT = Path(__file__).resolve().parent.parent
CH11 = ("attention_lse", "merge_partials", "zigzag_ring_mask", "chunked_local_mask", "padded_chunked_mask",
        "ring_attention", "cascade_attention")


def _qkv(seed, B=2, H=2, Lq=5, Lk=9, d=4, dv=3):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, Lq, d, generator=gen), torch.randn(B, H, Lk, d, generator=gen),
            torch.randn(B, H, Lk, dv, generator=gen))


def test_attention_lse_is_attention_and_the_log_of_its_softmax_denominator():
    q, k, v = _qkv(0)
    mask = torch.rand(2, 2, 5, 9, generator=torch.Generator().manual_seed(1)) < 0.6
    mask[0, 0, 1] = False  # a fully masked row
    out, lse = am.attention_lse(q, k, v, mask)
    torch.testing.assert_close(out, am.attention(q, k, v, mask)[0])
    s = (q @ k.mT / math.sqrt(4)).masked_fill(~mask, float("-inf"))
    torch.testing.assert_close(lse, torch.logsumexp(s, dim=-1))  # PyTorch's own, -inf on the empty row
    assert lse[0, 0, 1] == float("-inf") and bool((out[0, 0, 1] == 0).all())
    half = am.attention_lse(q.half(), k.half(), v.half(), mask)
    assert half[0].dtype == torch.float16 and half[1].dtype == torch.float32


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), parts=st.integers(1, 6), Lk=st.integers(1, 12))
def test_any_partition_of_the_keys_merged_equals_attention_over_all_keys(seed, parts, Lk):
    """The property the chapter proves: parts in any order, of any sizes, empty parts included."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _qkv(seed, Lk=Lk)
    mask = torch.rand(2, 2, 5, Lk, generator=gen) < 0.5
    owner = torch.randint(0, parts, (Lk,), generator=gen)  # which part each key goes to
    want = am.attention_lse(q, k, v, mask)
    pieces = []
    for p in torch.randperm(parts, generator=gen).tolist():
        keys = (owner == p).nonzero().flatten()
        if len(keys):
            pieces.append(am.attention_lse(q, k[..., keys, :], v[..., keys, :], mask[..., keys]))
        else:  # a part with no key at all: out 0, lse -inf
            pieces.append((torch.zeros(2, 2, 5, 3), torch.full((2, 2, 5), float("-inf"))))
    out, lse = am.merge_all(pieces)
    torch.testing.assert_close(out, want[0])
    torch.testing.assert_close(lse, want[1])


def test_merge_is_stable_at_large_lse_and_exact_where_both_parts_are_empty():
    x = torch.randn(4, 3)
    lse1 = torch.tensor([1e4, -1e4, float("-inf"), float("-inf")])
    lse2 = torch.tensor([1e4, -1e4 + 1, float("-inf"), 0.0])
    out, lse = am.merge_partials(x, lse1, 2 * x, lse2)
    assert bool(torch.isfinite(out).all())
    torch.testing.assert_close(lse[:2], torch.logaddexp(lse1[:2].double(), lse2[:2].double()).float())
    assert lse[2] == float("-inf") and bool((out[2] == 0).all())
    torch.testing.assert_close(out[3], 2 * x[3])
    parts = [t.clone().requires_grad_() for t in (x, lse1, 2 * x, lse2)]
    out, lse = am.merge_partials(*parts)
    (out.sum() + lse[torch.isfinite(lse)].sum()).backward()
    assert all(bool(torch.isfinite(p.grad).all()) for p in parts)
    with pytest.raises(ValueError, match="out1"):
        am.merge_partials(x, lse1, x[:2], lse2[:2])


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
def test_simulated_ring_equals_full_causal_attention(world, layout):
    q, k, v = _qkv(world, Lq=4 * world, Lk=4 * world)
    out, lse, steps = am.ring_attention(q, k, v, world, layout)
    want = am.attention_lse(q, k, v, am.causal_mask(4 * world))
    torch.testing.assert_close(out, want[0])
    torch.testing.assert_close(lse, want[1])
    # each rank's steps: the shards with an allowed key, in ring order, each its partial result alone
    for r in range(world):
        mine = am.shard_positions(4 * world, world, r, layout)
        sources = [(r - s) % world for s in range(world)
                   if am.ring_step_mask(4 * world, world, r, s, layout).any()]
        assert len(steps[r]) == len(sources) == (world if layout == "zigzag" else r + 1)
        for (o, s_lse), src in zip(steps[r], sources):
            theirs = am.shard_positions(4 * world, world, src, layout)
            m = mine[:, None] >= theirs[None, :]
            ref = am.attention_lse(q[..., mine, :], k[..., theirs, :], v[..., theirs, :], m)
            torch.testing.assert_close(o, ref[0])
            torch.testing.assert_close(s_lse, ref[1])
        merged = am.merge_all(steps[r])
        torch.testing.assert_close(merged[0], out[..., mine, :])


def test_cascade_attention_is_attention_over_prefix_and_real_suffix():
    gen = torch.Generator().manual_seed(3)
    N, H, P, S, d, dv = 4, 2, 6, 3, 4, 5
    q, pk = torch.randn(N, H, d, generator=gen), torch.randn(H, P, d, generator=gen)
    pv = torch.randn(H, P, dv, generator=gen)
    sk, sv = torch.randn(N, H, S, d, generator=gen), torch.randn(N, H, S, dv, generator=gen)
    lengths = torch.tensor([0, 3, 1, 2])
    out, lse = am.cascade_attention(q, pk, pv, sk, sv, lengths)
    for n in range(N):
        k = torch.cat([pk, sk[n, :, : lengths[n]]], dim=1)[None]  # (1, H, P + len, d)
        v = torch.cat([pv, sv[n, :, : lengths[n]]], dim=1)[None]
        want = torch.nn.functional.scaled_dot_product_attention(q[n][None, :, None], k, v)  # PyTorch's own
        torch.testing.assert_close(out[n], want[0, :, 0])
        s = q[n][:, None] @ k[0].mT / math.sqrt(d)  # (H, 1, P + len)
        torch.testing.assert_close(lse[n], torch.logsumexp(s, dim=-1)[:, 0])
    with pytest.raises(ValueError, match="suffix_lengths"):
        am.cascade_attention(q, pk, pv, sk, sv, torch.tensor([0, 4, 1, 2]))
    with pytest.raises(ValueError, match="expected q"):
        am.cascade_attention(q, pk, pv, sk[:3], sv[:3], lengths)


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_every_key_reaches_every_later_query_exactly_once_over_the_ring(world):
    L = 2 * world * 2
    seen = torch.zeros(L, L, dtype=torch.long)  # [query position, key position]: how often it is attended
    for r in range(world):
        q_pos = am.shard_positions(L, world, r)
        for s in range(world):
            k_pos = am.shard_positions(L, world, (r - s) % world)
            m = am.zigzag_ring_mask(L, world, r, s)
            seen[q_pos[:, None].expand_as(m)[m], k_pos[None, :].expand_as(m)[m]] += 1
    assert torch.equal(seen, am.causal_mask(L).long())


def test_zigzag_balances_the_work_that_contiguous_sharding_does_not():
    for world in (2, 4, 8):
        zig, cont = am.ring_work(16 * world, world, "zigzag"), am.ring_work(16 * world, world, "contiguous")
        assert int(zig.sum()) == int(cont.sum())  # the same blocks in all
        assert len(set(zig.tolist())) == 1 and cont.tolist() == sorted(set(cont.tolist()))
    with pytest.raises(ValueError, match="divisible"):
        am.zigzag_ring_mask(10, 2, 0, 0)
    with pytest.raises(ValueError, match="step"):
        am.zigzag_ring_mask(8, 2, 0, 2)


def test_chunked_local_mask_is_transformers_chunked_causal_mask():
    pytest.importorskip("transformers")
    from transformers.masking_utils import chunked_causal_mask_function, sdpa_mask

    for Lq, Lk, chunk in [(10, 10, 4), (3, 11, 4), (1, 9, 3), (5, 5, 1), (4, 7, 9)]:
        fn = chunked_causal_mask_function(chunk, torch.zeros(1, dtype=torch.long))
        hf = sdpa_mask(batch_size=1, q_length=Lq, kv_length=Lk, q_offset=Lk - Lq, mask_function=fn,
                       allow_is_causal_skip=False)
        assert torch.equal(hf[0, 0], am.chunked_local_mask(Lq, Lk, chunk)), (Lq, Lk, chunk)
    for bad in [(0, 4, 2), (5, 4, 2), (3, 4, 0)]:
        with pytest.raises(ValueError):
            am.chunked_local_mask(*bad)


def test_padded_chunked_mask_is_transformers_chunked_causal_mask_with_left_padding():
    pytest.importorskip("transformers")
    from transformers import Llama4TextConfig
    from transformers.masking_utils import chunked_causal_mask_function, create_chunked_causal_mask, sdpa_mask
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    gen = torch.Generator().manual_seed(0)
    for chunk in (1, 2, 3, 4, 11):
        config = Llama4TextConfig(hidden_size=16, intermediate_size=32, intermediate_size_mlp=32,
                                  num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                  head_dim=8, vocab_size=32, attention_chunk_size=chunk)
        config._attn_implementation = "sdpa"
        B, L = 5, 10
        pads = torch.tensor([0, 2, 5, 9, 10])  # a row of padding only, too
        mask = torch.arange(L)[None, :] >= pads[:, None]
        mask[1, 6] = False  # a masked key after the first real token: it shifts no chunk
        hf = create_chunked_causal_mask(config=config, inputs_embeds=torch.zeros(B, L, 16),
                                        attention_mask=mask.long(), cache=None,
                                        position_ids=torch.arange(L)[None].expand(B, -1),
                                        allow_is_causal_skip=False)
        assert torch.equal(hf, am.padded_chunked_mask(mask, L, chunk)), chunk
        # the last Lq queries, after a cache (q_offset), with the same left padding
        left = (mask.long().cumsum(-1) == 0).sum(-1)
        for Lq in (1, 3):
            hf = sdpa_mask(batch_size=B, q_length=Lq, kv_length=L, q_offset=L - Lq,
                           mask_function=chunked_causal_mask_function(chunk, left), attention_mask=mask,
                           allow_is_causal_skip=False)
            assert torch.equal(hf, am.padded_chunked_mask(mask, Lq, chunk)), (chunk, Lq)
    assert torch.equal(am.padded_chunked_mask(torch.ones(1, 7, dtype=torch.bool), 7, 3)[0, 0],
                       am.chunked_local_mask(7, 7, 3))  # no padding: chapter 11.4's mask
    del gen
    for bad in [(0, 2), (11, 2), (3, 0)]:
        with pytest.raises(ValueError):
            am.padded_chunked_mask(torch.ones(2, 10, dtype=torch.bool), *bad)
    with pytest.raises(ValueError, match="bool"):
        am.padded_chunked_mask(torch.ones(2, 10, dtype=torch.long), 3, 2)


def test_builders_run_on_meta():
    assert am.zigzag_ring_mask(16, 4, 1, 2, device="meta").shape == (4, 4)
    assert am.chunked_local_mask(3, 8, 4, device="meta").shape == (3, 8)


def _trivial(name):
    """Code that computes nothing the exercise asks for."""
    if name == "attention_lse":
        def unmasked(q, k, v, mask=None):
            s = q.float() @ k.float().mT / math.sqrt(q.shape[-1])
            return (torch.softmax(s, -1) @ v.float()).to(q.dtype), torch.logsumexp(s, -1)

        return [lambda q, k, v, mask=None: (torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype),
                                            torch.zeros(q.shape[:-1])), unmasked]
    if name == "merge_partials":
        return [lambda o1, l1, o2, l2: (o1, l1), lambda o1, l1, o2, l2: (o1 + o2, torch.maximum(l1, l2)),
                lambda o1, l1, o2, l2: (torch.zeros_like(o1), torch.zeros_like(l1))]
    if name == "zigzag_ring_mask":
        return [lambda L, w, r, s, *, device=None: am.causal_mask(L // w, device=device).fill_(True),
                lambda L, w, r, s, *, device=None: am.causal_mask(L // w, device=device)]
    if name == "padded_chunked_mask":
        return [lambda m, Lq, c: am.causal_mask(Lq, n_keys=m.shape[-1]).expand(m.shape[0], 1, -1, -1),
                lambda m, Lq, c: m[:, None, None, :].expand(-1, 1, Lq, -1),
                lambda m, Lq, c: torch.ones(m.shape[0], 1, Lq, m.shape[-1], dtype=torch.bool)]
    if name == "ring_attention":
        def one_pass(q, k, v, world, layout="zigzag"):  # right out and lse, no ring
            out, lse = am.attention_lse(q, k, v, am.causal_mask(q.shape[-2]))
            return out, lse, [[(out, lse)] for _ in range(world)]

        return [one_pass,
                lambda q, k, v, w, layout="zigzag": (torch.zeros_like(v), torch.zeros(q.shape[:-1]), [])]
    if name == "cascade_attention":
        return [lambda q, pk, pv, sk, sv, n: (torch.zeros(*q.shape[:-1], pv.shape[-1], dtype=q.dtype),
                                              torch.zeros(q.shape[:-1])),
                lambda q, pk, pv, sk, sv, n: am.attention_lse(q.transpose(0, 1)[None], pk[None], pv[None])]
    return [lambda Lq, Lk, c, *, device=None: am.causal_mask(Lq, n_keys=Lk, device=device),
            lambda Lq, Lk, c, *, device=None: torch.ones(Lq, Lk, dtype=torch.bool, device=device)]


@pytest.mark.parametrize("seed", [0, 7])
@pytest.mark.parametrize("name", CH11)
def test_code_that_does_nothing_scores_zero(name, seed):
    checks = EXERCISES[name].make_checks(seed, hidden=True)
    for fn in _trivial(name):
        verdicts = grade(fn, checks)
        results = [CheckResult(c.name, c.public, c.weight, verdicts[c.name].passed, kind=c.kind)
                   for c in checks if c.name in verdicts]
        assert score_of(results) == 0.0, [r.name for r in results if r.passed and r.kind == "value"]


def _ring_script():
    spec = importlib.util.spec_from_file_location("ring_attention", ROOT / "scripts" / "ring_attention.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("world", [2, 4])
def test_ring_on_gloo_processes_equals_full_causal_attention(world):
    """scripts/ring_attention.py: W real processes, send/recv round the ring, the same answer."""
    q, k, v = _qkv(world, B=1, Lq=8 * world, Lk=8 * world)
    out, lse, steps = _ring_script().run_ring(q, k, v, world)
    want = am.attention_lse(q, k, v, am.causal_mask(8 * world))
    torch.testing.assert_close(out, want[0])
    torch.testing.assert_close(lse, want[1])
    assert steps == [world] * world  # zigzag: every step of every rank has work
