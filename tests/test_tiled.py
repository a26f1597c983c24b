"""tiled_attention() against PyTorch's math-backend SDPA in float64, for every tile size;
its skip of fully masked tiles; and the grader's record of the largest floating tensor
a call creates (grader.sandbox.execute.Allocations), which holds the exercise to no
(Lq, Lk) intermediate."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attnmask as am
from grader.checks.common import live_memory as LM
from grader.sandbox import channel
from grader.sandbox.execute import execute
from grader.spec import Call, Outcome

B, H, LQ, LK, D, DV = 2, 3, 5, 11, 4, 3  # B != H != Lq != Lk, d != dv


def qkv(dtype=torch.float64, *, Lq=LQ, Lk=LK, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    ts = (torch.randn(B, H, Lq, D, generator=g), torch.randn(B, H, Lk, D, generator=g),
          torch.randn(B, H, Lk, DV, generator=g))
    return [t.to(dtype).requires_grad_(requires_grad) for t in ts]


def mask_with_hard_rows(seed=1) -> torch.Tensor:
    """(B, H, Lq, Lk): random, plus a fully masked row, a row whose first tiles are all
    blocked, and a row that sees only the last key."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(B, H, LQ, LK, generator=g) < 0.5
    mask[..., 0, :] = True  # no key tile is blocked for every row: nothing is skipped
    mask[0, 1, 1] = False
    mask[1, :, 2, :6] = False
    mask[:, 0, 3] = False
    mask[:, 0, 3, -1] = True
    return mask


def sdpa(q, k, v, mask):
    """The oracle: PyTorch's math backend (zeros for a fully masked row, torch >= 2.5)."""
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("tile", [1, 2, 3, 4, 5, 10, 11, 12, 64])
def test_matches_sdpa_for_every_tile_size(tile):
    q, k, v = qkv()
    mask = mask_with_hard_rows()
    for m in (mask, mask[:, :1], mask[0, 0], None):
        out = am.tiled_attention(q, k, v, m, tile)
        torch.testing.assert_close(out, sdpa(q, k, v, m), rtol=1e-12, atol=1e-12)
    assert (am.tiled_attention(q, k, v, mask, tile)[0, 1, 1] == 0).all()  # the fully masked row


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_half_precision_keeps_its_dtype_and_is_accurate(dtype):
    q, k, v = qkv()
    mask = mask_with_hard_rows()
    out = am.tiled_attention(*(t.to(dtype) for t in (q, k, v)), mask, 3)
    assert out.dtype == dtype and torch.isfinite(out).all()
    tol = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 4e-2}[dtype]
    torch.testing.assert_close(out.double(), sdpa(q, k, v, mask), rtol=tol, atol=tol)


def test_gradients_are_finite_and_match_sdpa_with_fully_masked_rows():
    q, k, v = qkv(requires_grad=True)
    mask = mask_with_hard_rows()
    w = torch.randn(B, H, LQ, DV, dtype=torch.float64)
    mine = torch.autograd.grad((am.tiled_attention(q, k, v, mask, 4) * w).sum(), (q, k, v))
    ref = torch.autograd.grad((sdpa(q, k, v, mask) * w).sum(), (q, k, v))
    for g, r in zip(mine, ref):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-10)


def test_fully_masked_tiles_are_never_read():
    q, k, v = qkv()
    mask = torch.ones(LQ, LK, dtype=torch.bool)
    mask[:, 3:9] = False  # tiles of 3: [3, 6) and [6, 9) are blocked for every query
    k, v = k.clone(), v.clone()
    k[..., 3:9, :] = float("nan")
    v[..., 3:9, :] = float("nan")
    out = am.tiled_attention(q, k, v, mask, 3)
    keep = mask[0]
    torch.testing.assert_close(out, sdpa(q, k[..., keep, :], v[..., keep, :], None))
    assert am.tiled_attention(q, k, v, mask, 2).isnan().any()  # [2, 4) is read: 0 * NaN


@pytest.mark.parametrize("bad", [0, -1, 2.0, True])
def test_tile_must_be_a_positive_int(bad):
    with pytest.raises(ValueError, match="tile must be an int >= 1"):
        am.tiled_attention(*qkv(), None, bad)


def test_bad_masks_are_refused_with_the_shapes():
    q, k, v = qkv()
    with pytest.raises(TypeError, match="torch.bool"):
        am.tiled_attention(q, k, v, torch.ones(LQ, LK))
    with pytest.raises(ValueError, match=r"mask has shape \(5, 7\)"):
        am.tiled_attention(q, k, v, torch.ones(LQ, 7, dtype=torch.bool))


# --------------------------------------------------------------------------- the allocation record

def _recorded(fn, *args, **kwargs) -> tuple[int, ...] | None:
    return execute(fn, Call(args, kwargs, allocations=True)).largest


def test_the_record_sees_the_score_matrix_of_explicit_attention_and_not_of_the_tiled_loop():
    q, k, v = qkv(torch.float32, Lq=16, Lk=64)
    mask = torch.rand(16, 64, generator=torch.Generator().manual_seed(0)) < 0.8
    explicit = _recorded(lambda q, k, v, mask: am.attention(q, k, v, mask)[0], q, k, v, mask)
    tiled = _recorded(am.tiled_attention, q, k, v, mask, tile=4)
    assert torch.Size(explicit).numel() >= 16 * 64  # (B·H, Lq, Lk) scores from bmm
    assert tiled == (B, H, 16, 4) or torch.Size(tiled).numel() < 16 * 64, tiled


def test_the_record_counts_new_floating_tensors_only():
    x = torch.randn(50, 40)
    assert _recorded(lambda x: x.expand(3, 50, 40)[..., :5].mT, x) == ()  # views allocate nothing
    assert _recorded(lambda x: x > 0, x) == ()  # bool results are not counted
    assert _recorded(lambda x: x.add_(1), x) == ()  # in place: no new tensor
    assert _recorded(lambda x: (x[:2] * 2, torch.zeros(9, 10)), x) == (9, 10)  # the largest wins
    assert execute(lambda x: x * 2, Call((x,))).largest is None  # only when the call asks


def test_the_one_shard_judge_fails_a_rank_over_every_key_and_an_unrecorded_call():
    """11.6's largest-tensor rule (the ring's steps read one shard each), judged from the record."""
    from grader.checks.ch11_parallel.ring import RING_ATT

    judge = LM.one_shard_judge(RING_ATT, "all keys at once")
    L, world = 32, 4  # a rank holds L / world = 8 queries; the bound is 2·8·32 / 2 = 256 entries
    q = torch.zeros(1, 2, L, 2)
    call = Call((q, q, q, world), allocations=True)
    step = Outcome(output=(q, q[..., 0], []), largest=(1, 2, 8, 8))  # one step's scores: 128
    rank = Outcome(output=(q, q[..., 0], []), largest=(1, 2, 8, 32))  # a rank over every key: 512
    assert judge([call], [step]).passed
    verdict = judge([call], [rank])
    assert not verdict.passed and verdict.message == "all keys at once" and "(1, 2, 8, 32)" in verdict.detail
    assert not judge([call], [Outcome(output=step.output)]).passed


def test_the_record_crosses_the_channel_and_a_forged_one_is_refused():
    data = channel.outcome_to_data(Outcome(output=torch.ones(2), largest=(2, 3), peak=17))
    back = channel.outcome_from_data(channel.decode(channel.encode(data)))
    assert (back.largest, back.peak) == ((2, 3), 17)
    for forged in ((2, -1), ("2",), [1.5]):
        with pytest.raises(channel.ChannelError):
            channel.outcome_from_data({**data, "largest": forged})
    for forged in (-1, 1.5, "3", 2**64, True):
        with pytest.raises(channel.ChannelError):
            channel.outcome_from_data({**data, "peak": forged})


# --------------------------------------------------------------------------- the backward from the lse

def _grads_of_sdpa(q, k, v, mask, d_out):
    """The oracle: autograd through PyTorch's math-backend SDPA, in float64."""
    q, k, v = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    return torch.autograd.grad(sdpa(q, k, v, mask), (q, k, v), d_out.double())


def _saved(q, k, v, mask):
    """What a forward kernel saves: out in the inputs' dtype and lse in float32 (float64 here)."""
    out, lse = am.attention_lse(q, k, v, mask)
    return out, lse


@pytest.mark.parametrize("tile", [1, 2, 3, 4, 5, 10, 11, 12, 64])
def test_backward_matches_autograd_for_every_tile_size(tile):
    q, k, v = qkv()
    mask = mask_with_hard_rows()
    d_out = torch.randn(B, H, LQ, DV, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    for m in (mask, mask[:, :1], mask[0, 0], None):
        out, lse = _saved(q, k, v, m)
        got = am.tiled_attention_backward(q, k, v, out, lse, d_out, m, tile)
        for g, want in zip(got, _grads_of_sdpa(q, k, v, m, d_out)):
            torch.testing.assert_close(g, want, rtol=1e-10, atol=1e-10)


def test_backward_gives_zero_gradients_to_fully_masked_rows():
    q, k, v = qkv()
    mask = mask_with_hard_rows()
    d_out = torch.randn(B, H, LQ, DV, dtype=torch.float64)
    out, lse = _saved(q, k, v, mask)
    assert lse[0, 1, 1] == float("-inf")
    dq, dk, dv = am.tiled_attention_backward(q, k, v, out, lse, d_out, mask, 3)
    assert (dq[0, 1, 1] == 0).all()
    assert all(torch.isfinite(g).all() for g in (dq, dk, dv))
    # the row's d_out changes nothing: it reaches no key
    d2 = d_out.clone()
    d2[0, 1, 1] = 1e3
    for a, b in zip(am.tiled_attention_backward(q, k, v, out, lse, d2, mask, 3), (dq, dk, dv)):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize(("Lq", "Lk"), [(3, 11), (7, 5)])
def test_backward_with_lq_not_lk_and_a_bottom_right_causal_mask(Lq, Lk):
    q, k, v = qkv(Lq=Lq, Lk=Lk)
    mask = am.causal_mask(Lq, n_keys=Lk) if Lq <= Lk else torch.rand(Lq, Lk) < 0.6
    d_out = torch.randn(B, H, Lq, DV, dtype=torch.float64)
    out, lse = _saved(q, k, v, mask)
    got = am.tiled_attention_backward(q, k, v, out, lse, d_out, mask, 4)
    for g, want in zip(got, _grads_of_sdpa(q, k, v, mask, d_out)):
        torch.testing.assert_close(g, want, rtol=1e-10, atol=1e-10)


def test_backward_never_reads_a_fully_masked_tile():
    q, k, v = qkv()
    mask = torch.ones(LQ, LK, dtype=torch.bool)
    mask[:, 3:9] = False  # tiles of 3: [3, 6) and [6, 9) are blocked for every query
    out, lse = _saved(q, k, v, mask)
    k, v = k.clone(), v.clone()
    k[..., 3:9, :] = float("nan")
    v[..., 3:9, :] = float("nan")
    d_out = torch.randn(B, H, LQ, DV, dtype=torch.float64)
    dq, dk, dv = am.tiled_attention_backward(q, k, v, out, lse, d_out, mask, 3)
    assert all(torch.isfinite(g).all() for g in (dq, dk, dv))
    assert (dk[..., 3:9, :] == 0).all() and (dv[..., 3:9, :] == 0).all()
    assert am.tiled_attention_backward(q, k, v, out, lse, d_out, mask, 2)[0].isnan().any()  # [2, 4) read


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_backward_in_half_precision_keeps_the_dtypes_and_is_accurate(dtype):
    q, k, v = qkv()
    mask = mask_with_hard_rows()
    d_out = torch.randn(B, H, LQ, DV, dtype=torch.float64)
    lo = [t.to(dtype) for t in (q, k, v, d_out)]
    out, lse = am.attention_lse(*lo[:3], mask)
    assert lse.dtype == torch.float32
    got = am.tiled_attention_backward(*lo[:3], out, lse, lo[3], mask, 4)
    tol = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 8e-2}[dtype]
    for g, want, x in zip(got, _grads_of_sdpa(*lo[:3], mask, lo[3]), lo[:3]):
        assert g.dtype == dtype and g.shape == x.shape
        torch.testing.assert_close(g.double(), want, rtol=tol, atol=tol)


def test_backward_creates_no_floating_tensor_of_lq_lk_entries():
    q, k, v = qkv(torch.float32, Lq=16, Lk=64)
    q, k, v = q[:1, :1], k[:1, :1], v[:1, :1]
    mask = torch.rand(16, 64, generator=torch.Generator().manual_seed(0)) < 0.8
    out, lse = am.attention_lse(q, k, v, mask)
    d_out = torch.randn_like(out)
    largest = _recorded(am.tiled_attention_backward, q, k, v, out, lse, d_out, mask, tile=4)
    assert torch.Size(largest).numel() < 16 * 64, largest


def test_backward_refuses_saved_tensors_of_the_wrong_shape():
    q, k, v = qkv()
    out, lse = _saved(q, k, v, None)
    with pytest.raises(ValueError, match=r"lse has shape \(2, 3, 5, 1\)"):
        am.tiled_attention_backward(q, k, v, out, lse[..., None], out, None, 4)
    with pytest.raises(ValueError, match="tile must be an int >= 1"):
        am.tiled_attention_backward(q, k, v, out, lse, out, None, 0)


# --------------------------------------------------------------------------- grading the backward

def _points(fn, seed):
    from buggy import grade

    from grader.checks import EXERCISES
    from grader.results import CheckResult, score_of

    checks = EXERCISES["tiled_attention_backward"].make_checks(seed, hidden=True)
    verdicts = grade(fn, checks)
    return score_of([CheckResult(c.name, c.public, c.weight, verdicts[c.name].passed, kind=c.kind)
                     for c in checks if c.name in verdicts])


def _unmasked_autograd(q, k, v, out, lse, d_out, mask=None, tile=64):
    q, k, v = (t.detach().float().requires_grad_(True) for t in (q, k, v))
    with torch.enable_grad():
        o = torch.softmax(q @ k.mT / q.shape[-1] ** 0.5, -1) @ v
        return tuple(g.to(d_out.dtype) for g in torch.autograd.grad(o, (q, k, v), d_out.float()))


TRIVIAL_BACKWARD = {
    "zeros": lambda q, k, v, out, lse, d_out, mask=None, tile=64: (
        torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)),
    "inputs": lambda q, k, v, out, lse, d_out, mask=None, tile=64: (q.clone(), k.clone(), v.clone()),
    "random": lambda q, k, v, out, lse, d_out, mask=None, tile=64: (
        torch.randn_like(q), torch.randn_like(k), torch.randn_like(v)),
    "unmasked": _unmasked_autograd,
}


@pytest.mark.parametrize("seed", [0, 7])
@pytest.mark.parametrize("style", sorted(TRIVIAL_BACKWARD))
def test_backward_code_that_does_nothing_scores_zero(style, seed):
    assert _points(TRIVIAL_BACKWARD[style], seed) == 0.0


def test_backward_from_the_whole_weight_matrix_keeps_less_than_half_the_points():
    from buggy import tiled

    assert _points(am.tiled_attention_backward, 3) == 1.0
    assert _points(tiled.backward_autograd, 3) < 0.5
