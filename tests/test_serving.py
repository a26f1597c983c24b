"""attnmask.serving against loops written from the definitions, and chapter 10's
exercises against code that does nothing: it scores 0."""

from __future__ import annotations

import pytest
import torch
from buggy import grade

import attnmask as am
from grader.checks import EXERCISES
from grader.results import CheckResult, score_of

CH10 = ("image_text_mask", "rolling_cache_mask", "paged_attention", "tree_mask")


def test_image_text_mask_follows_its_definition_cell_by_cell():
    gen = torch.Generator().manual_seed(0)
    is_image = torch.rand(3, 9, generator=gen) < 0.5
    att = (torch.rand(3, 9, generator=gen) < 0.8).long()
    got = am.image_text_mask(is_image, att)
    for b in range(3):
        for i in range(9):
            for j in range(9):
                lo, hi = min(i, j), max(i, j)
                same_run = bool(is_image[b, lo : hi + 1].all())
                assert bool(got[b, 0, i, j]) == (bool(att[b, j]) and (j <= i or same_run))


def test_rolling_cache_decoding_equals_full_sliding_window_attention():
    torch.manual_seed(0)
    L, W, window, d = 11, 4, 4, 8
    q, k, v = (torch.randn(1, 2, L, d) for _ in range(3))
    full, _ = am.attention(q, k, v, am.sliding_window_mask(L, window))
    k_ring, v_ring = torch.zeros(1, 2, W, d), torch.zeros(1, 2, W, d)
    for t in range(L):
        k_ring[:, :, t % W], v_ring[:, :, t % W] = k[:, :, t], v[:, :, t]
        slot_pos = am.rolling_slot_positions(torch.tensor([t + 1]), W)  # (1, W)
        mask = am.rolling_cache_mask(slot_pos, torch.tensor([[t]]), window)
        out, _ = am.attention(q[:, :, t : t + 1], k_ring, v_ring, mask)
        assert torch.allclose(out, full[:, :, t : t + 1], atol=1e-6)


def test_paged_attention_equals_dense_causal_attention_of_each_sequence():
    torch.manual_seed(0)
    H, d, S, Lq = 2, 4, 3, 2
    cache = am.PagedKVCache(16, S, H, d, seed=3)
    lens, kv = [7, 2, 9], []
    for s, n in enumerate(lens):
        k, v = torch.randn(H, n, d), torch.randn(H, n, d)
        cache.append(s, k, v)
        kv.append((k, v))
    q = torch.randn(3, H, Lq, d)
    out = am.paged_attention(q, cache.k, cache.v, cache.block_table([0, 1, 2]), cache.context_lens([0, 1, 2]))
    for s, (k, v) in enumerate(kv):
        want, _ = am.attention(q[s : s + 1], k[None], v[None], am.causal_mask(Lq, n_keys=lens[s]))
        assert torch.allclose(out[s : s + 1], want, atol=1e-6)


@pytest.mark.parametrize("stale", [float("nan"), float("inf"), float("-inf")])
def test_paged_attention_never_reads_stale_slots(stale):
    # Slots past context_lens, unused blocks and block 0 (read for -1 entries) hold garbage: the
    # output and the gradients must be those of clean caches, not merely finite where masked.
    torch.manual_seed(0)
    H, d, S, Lq = 2, 4, 3, 2
    cache = am.PagedKVCache(12, S, H, d, seed=1)
    for s, n in enumerate([7, 2, 9]):
        cache.append(s, torch.randn(H, n, d), torch.randn(H, n, d))
    table, lens = cache.block_table([0, 1, 2]), cache.context_lens([0, 1, 2])
    pos = torch.arange(table.shape[1] * S)
    held = torch.zeros(12, S, dtype=torch.bool)
    for b in range(3):
        for p in pos[pos < lens[b]].tolist():
            held[table[b, p // S], p % S] = True
    q = torch.randn(3, H, Lq, d)
    clean = am.paged_attention(q, cache.k, cache.v, table, lens)
    k = torch.where(held[:, None, :, None], cache.k, stale).requires_grad_()
    v = torch.where(held[:, None, :, None], cache.v, stale).requires_grad_()
    out = am.paged_attention(q, k, v, table, lens)
    assert torch.equal(out, clean)
    out.sum().backward()
    assert torch.isfinite(k.grad).all() and torch.isfinite(v.grad).all()
    assert not k.grad.transpose(1, 2)[~held].any() and not v.grad.transpose(1, 2)[~held].any()


def test_tree_verification_in_one_pass_equals_each_branch_decoded_alone():
    torch.manual_seed(0)
    lm = am.TinyDecoder(am.ModelConfig(vocab_size=11, d_model=16, n_heads=2, max_len=32)).eval()
    prompt = torch.tensor([[1, 2, 3, 4]])
    parents = torch.tensor([-1, 0, 0, 1, -1, 4])
    draft = torch.tensor([[5, 6, 7, 8, 9, 10]])
    P = prompt.shape[1]
    with torch.no_grad():
        caches = [am.KVCache() for _ in lm.blocks]
        am.decoder_logits(lm, prompt, am.causal_mask(P), torch.arange(P), caches)
        tree = am.decoder_logits(lm, draft, am.tree_mask(parents, P), am.tree_positions(parents, P), caches)
        anc = am.tree_ancestors(parents)
        for i in range(6):
            path = anc[i].nonzero().flatten()  # i's ancestors and i, in order
            seq = torch.cat([prompt, draft[:, path]], dim=1)
            alone = lm(seq)[:, -1]
            assert torch.allclose(tree[:, i], alone, atol=1e-5)


def test_masks_run_on_meta():
    meta = "meta"
    assert am.image_text_mask(
        torch.zeros(2, 5, dtype=torch.bool, device=meta), torch.ones(2, 5, device=meta)
    ).shape == (2, 1, 5, 5)
    assert am.rolling_cache_mask(
        torch.zeros(2, 4, dtype=torch.long, device=meta), torch.zeros(2, 3, dtype=torch.long, device=meta), 2
    ).shape == (2, 1, 3, 4)
    assert am.tree_mask(torch.tensor([-1, 0], device=meta), 3).shape == (2, 5)


def _trivial(name):
    """Code that computes nothing the exercise asks for."""
    if name == "image_text_mask":
        return [
            lambda img, att: torch.ones(img.shape[0], 1, img.shape[1], img.shape[1], dtype=torch.bool),
            lambda img, att: am.causal_mask(img.shape[1], device=img.device).expand(img.shape[0], 1, -1, -1),
            lambda img, att: am.causal_mask(img.shape[1]) & att.bool()[:, None, None, :],
        ]
    if name == "rolling_cache_mask":
        return [
            lambda s, q, w: torch.ones(s.shape[0], 1, q.shape[1], s.shape[1], dtype=torch.bool),
            lambda s, q, w: (s >= 0)[:, None, None, :].expand(-1, 1, q.shape[1], -1),
            lambda s, q, w: torch.rand(s.shape[0], 1, q.shape[1], s.shape[1]) < 0.5,
        ]
    if name == "paged_attention":

        def unmasked(q, k, v, table, lens):
            B, H, Lq, _ = q.shape
            kk = k[table.clamp(min=0)].permute(0, 2, 1, 3, 4).reshape(B, H, -1, k.shape[-1])
            vv = v[table.clamp(min=0)].permute(0, 2, 1, 3, 4).reshape(B, H, -1, v.shape[-1])
            return am.attention(q, kk, vv)[0]

        return [
            lambda q, k, v, t, n: torch.zeros(*q.shape[:3], v.shape[-1], dtype=q.dtype),
            lambda q, k, v, t, n: torch.randn(*q.shape[:3], v.shape[-1]).to(q.dtype),
            unmasked,
        ]
    return [
        lambda p, n: torch.ones(p.shape[0], n + p.shape[0], dtype=torch.bool),
        lambda p, n: torch.cat(
            [torch.ones(p.shape[0], n, dtype=torch.bool), am.causal_mask(p.shape[0])], dim=1
        ),
        lambda p, n: torch.cat(
            [torch.ones(p.shape[0], n, dtype=torch.bool), torch.eye(p.shape[0], dtype=torch.bool)], dim=1
        ),
    ]


@pytest.mark.parametrize("seed", [0, 7])
@pytest.mark.parametrize("name", CH10)
def test_code_that_does_nothing_scores_zero(name, seed):
    checks = EXERCISES[name].make_checks(seed, hidden=True)
    for fn in _trivial(name):
        verdicts = grade(fn, checks)
        results = [
            CheckResult(c.name, c.public, c.weight, verdicts[c.name].passed, kind=c.kind)
            for c in checks
            if c.name in verdicts
        ]
        assert score_of(results) == 0.0, [r.name for r in results if r.passed and r.kind == "value"]


@pytest.mark.parametrize("chunk", [1, 3, 7])
def test_rolling_cache_with_enough_slots_equals_full_sliding_window_in_chunks(chunk):
    """A ring of W >= window + chunk - 1 slots, written a chunk at a time (a chunk may be longer
    than the ring), gives each query the keys of its window; with fewer slots the first
    queries of a chunk lose keys."""
    torch.manual_seed(1)
    L, window, d = 13, 3, 4
    q, k, v = (torch.randn(1, 1, L, d) for _ in range(3))
    full, _ = am.attention(q, k, v, am.sliding_window_mask(L, window))

    def run(slots):
        ring, outs = am.RollingKVCache(slots), []
        for start in range(0, L, chunk):
            stop = min(start + chunk, L)
            k_ring, v_ring = ring.update(k[:, :, start:stop], v[:, :, start:stop])
            mask = am.rolling_cache_mask(ring.slot_positions()[None], torch.arange(start, stop)[None], window)
            outs.append(am.attention(q[:, :, start:stop], k_ring, v_ring, mask)[0])
        return torch.cat(outs, dim=2)

    assert torch.allclose(run(window + chunk - 1), full, atol=1e-6)
    if chunk > 1:
        assert not torch.allclose(run(window), full, atol=1e-6)
