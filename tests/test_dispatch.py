"""attention() with a mask function: every kernel attention_plan can choose gives
the explicit path's result (zeros for fully masked rows included), against
PyTorch's math-backend SDPA in float64 on the materialised mask."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.nn.attention.flex_attention import flex_attention
from torch.utils._python_dispatch import TorchDispatchMode

import attnmask as am
import attnmask.dispatch as dispatch
import attnmask.predicates as P

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
B, H, D, DV = 3, 2, 8, 6
# (Lq, Lk): square, a KV cache (Lq < Lk), more queries than keys, one decoded token.
SHAPES = [(37, 37), (20, 45), (45, 20), (1, 45)]


def qkv(Lq, Lk, dtype=torch.float32, device="cpu", *, d=D, dv=DV, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, n, w, generator=g) for n, w in ((Lq, d), (Lk, d), (Lk, dv)))
    return [t.to(dtype=dtype, device=device).requires_grad_(requires_grad) for t in (q, k, v)]


def predicates(Lq, Lk, device="cpu"):
    """One predicate of every kind, sized for (Lq, Lk); several have fully masked rows."""
    L = max(Lq, Lk)
    lengths = torch.tensor([0, Lk // 2, Lk], device=device)  # an empty sequence: fully masked rows
    doc_ids = torch.stack([torch.arange(L) // 10, torch.arange(L) % 3, torch.zeros(L, dtype=torch.long)])
    return {
        "causal": P.causal(),
        "causal_bottom_right": P.causal(Lk - Lq),
        "causal_negative_offset": P.causal(-5),  # the first rows see no key
        "sliding_window": P.sliding_window(4),
        "sliding_window_wider_than_Lq": P.sliding_window(1000),
        "prefix_lm": P.prefix_lm(6),
        "key_padding": P.key_padding(lengths),
        "document": P.document(doc_ids.to(device)),
        "causal_and_padding": P.and_masks(P.causal(Lk - Lq), P.key_padding(lengths)),
        "window_or_prefix": P.or_masks(P.sliding_window(3), P.prefix_lm(2)),
        "custom_per_head": lambda b, h, q_idx, kv_idx: (kv_idx + h) % 3 != 0,
    }


NAMES = list(predicates(4, 4))


def dense(fn, q, k):
    return am.materialize(fn, q.shape[-2], k.shape[-2], B=B, H=H, device=q.device)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("Lq, Lk", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_path_matches_the_explicit_path_and_sdpa_math_float64(name, Lq, Lk, dtype, sdpa64, tol):
    q, k, v = qkv(Lq, Lk, dtype)
    fn = predicates(Lq, Lk)[name]
    mask = dense(fn, q, k)
    ref = sdpa64(q, k, v, attn_mask=mask)  # (B, H, Lq, dv); zeros where a row sees no key
    kernel = am.attention_plan(q, k, v, fn).kernel
    fast, none = am.attention(q, k, v, fn, need_weights=False)
    explicit, w = am.attention(q, k, v, fn)
    assert none is None and w.shape == (B, H, Lq, Lk)
    for path, got in (("explicit", explicit), (kernel, fast)):
        assert got.shape == (B, H, Lq, DV) and got.dtype == dtype, path
        assert not got.isnan().any(), f"{path} gave NaN for {name}: is a fully masked row 0 * -inf?"
        where = f"{path}, {name}"
        torch.testing.assert_close(got.double(), ref, **tol(dtype), msg=lambda m, w=where: f"{w}: {m}")
    empty = ~torch.broadcast_to(mask, (B, H, Lq, Lk)).any(-1)  # (B, H, Lq): rows that see no key
    assert (fast[empty] == 0).all(), f"{kernel} must give zeros for the {int(empty.sum())} fully masked rows"
    assert (explicit[empty] == 0).all()


def test_the_shapes_above_reach_every_cpu_kernel():
    seen = {am.attention_plan(*qkv(Lq, Lk), fn).kernel
            for Lq, Lk in SHAPES for fn in predicates(Lq, Lk).values()}
    assert seen == {"sdpa_is_causal", "sdpa_causal_lower_right", "sdpa_is_causal_last_rows", "sdpa_no_mask",
                    "sdpa_key_padding", "sdpa_dense_mask"}


@pytest.mark.parametrize("name, Lq, Lk, kernel", [
    ("causal", 37, 37, "sdpa_is_causal"),
    ("causal", 20, 45, "sdpa_is_causal"),  # top-left, like is_causal, whatever Lq and Lk
    ("causal_bottom_right", 37, 37, "sdpa_is_causal"),
    ("causal_bottom_right", 20, 45, "sdpa_causal_lower_right"),
    ("causal_bottom_right", 45, 20, "sdpa_is_causal_last_rows"),
    ("causal_bottom_right", 1, 45, "sdpa_no_mask"),  # one decoded token sees the whole cache
    ("causal_negative_offset", 37, 37, "sdpa_dense_mask"),
    ("sliding_window", 37, 37, "sdpa_dense_mask"),
    ("sliding_window_wider_than_Lq", 37, 37, "sdpa_is_causal"),
    ("key_padding", 20, 45, "sdpa_key_padding"),
    ("document", 37, 37, "sdpa_dense_mask"),
    ("causal_and_padding", 20, 45, "sdpa_dense_mask"),
    ("custom_per_head", 37, 37, "sdpa_dense_mask"),
])
def test_attention_plan_on_the_cpu(name, Lq, Lk, kernel):
    q, k, v = qkv(Lq, Lk)
    chosen = am.attention_plan(q, k, v, predicates(Lq, Lk)[name])
    assert isinstance(chosen, am.Plan) and chosen.kernel == kernel, chosen
    assert chosen.reason
    with pytest.raises(AttributeError):
        chosen.kernel = "other"  # frozen


def test_attention_plan_for_tensor_masks_and_need_weights():
    q, k, v = qkv(5, 7)
    assert am.attention_plan(q, k, v).kernel == "sdpa"
    assert am.attention_plan(q, k, v, am.causal_mask(5, n_keys=7)).kernel == "sdpa"
    for mask in (None, am.causal_mask(5, n_keys=7), P.causal(), P.sliding_window(2)):
        chosen = am.attention_plan(q, k, v, mask, need_weights=True)
        assert chosen.kernel == "explicit" and "need_weights=True" in chosen.reason
    assert "uncompiled FlexAttention is slower" in am.attention_plan(q, k, v, P.sliding_window(2)).reason


def test_dense_mask_path_explains_cpu_choice():
    q, k, v = qkv(37, 37)
    reason = am.attention_plan(q, k, v, predicates(37, 37)["document"]).reason
    assert "document" in reason and "cpu" in reason and "materialised once" in reason


class _Shapes(TorchDispatchMode):
    """Records the shape of every tensor an aten op returns."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor):
                self.shapes.append((str(func), tuple(t.shape)))
        return out


@pytest.mark.parametrize("name, Lq, Lk", [
    ("causal", 48, 48), ("causal_bottom_right", 80, 48), ("causal_bottom_right", 1, 48),
    ("sliding_window_wider_than_Lq", 48, 80), ("key_padding", 48, 80),
])
def test_fast_kernels_build_no_query_by_key_tensor(name, Lq, Lk):
    q, k, v = qkv(Lq, Lk)
    fn = predicates(Lq, Lk)[name]
    with torch.inference_mode(), _Shapes() as seen:
        am.attention(q, k, v, fn, need_weights=False)
    big = [(op, s) for op, s in seen.shapes if len(s) >= 2 and s[-2:] == (Lq, Lk)]
    assert not big, f"{name}: tensors of (..., Lq, Lk) = (..., {Lq}, {Lk}) were built: {big}"
    if name == "key_padding":
        masks = {s for op, s in seen.shapes if len(s) == 4 and s[-1] == Lk and s[-2] != Lk}
        assert masks == {(B, 1, 1, Lk)}, f"the key padding mask should be (B, 1, 1, Lk): {seen.shapes}"


def test_predicate_parts_and_labels():
    assert P.kind_of(P.causal(3)) == ("causal", {"offset": 3})
    assert P.kind_of(P.sliding_window(4)) == ("sliding_window", {"window": 4})
    assert P.kind_of(P.prefix_lm(2)) == ("prefix_lm", {"prefix_len": 2})
    kind, params = P.kind_of(P.and_masks(P.causal(), P.sliding_window(2)))
    assert kind == "and" and [P.kind_of(p)[0] for p in params["parts"]] == ["causal", "sliding_window"]
    assert P.kind_of(lambda b, h, q, kv: kv <= q) == ("custom", {})
    # Labels ride on plain functions: FlexAttention still takes them as mask_mod.
    assert type(P.causal()).__name__ == "function"


@pytest.mark.parametrize("name", NAMES)
def test_meta_device_runs_every_kernel_without_leaving_it(name):
    Lq, Lk = 20, 45
    q, k, v = (torch.empty(B, H, n, w, device="meta") for n, w in ((Lq, D), (Lk, D), (Lk, DV)))
    fn = predicates(Lq, Lk, device="meta")[name]
    assert am.attention_plan(q, k, v, fn).kernel != "flex_attention"
    for need_weights in (False, True):
        out, _ = am.attention(q, k, v, fn, need_weights=need_weights)
        assert out.device.type == "meta" and out.shape == (B, H, Lq, DV)


def test_closed_over_tensors_must_fit_the_inputs():
    q, k, v = qkv(5, 7)
    with pytest.raises(ValueError, match=r"lengths is on meta but q is on cpu"):
        lengths = torch.empty(B, dtype=torch.long, device="meta")
        am.attention(q, k, v, P.key_padding(lengths), need_weights=False)
    with pytest.raises(ValueError, match=r"lengths has shape \(2,\); expected \(B,\) = \(3,\)"):
        am.attention(q, k, v, P.key_padding(torch.tensor([1, 2])), need_weights=False)
    with pytest.raises(ValueError, match=r"doc_ids has shape \(3, 5\); expected \(B, L\)"):
        am.attention(q, k, v, P.and_masks(P.causal(), P.document(torch.zeros(3, 5, dtype=torch.long))))
    with pytest.raises(ValueError, match=r"needs q \(B, H, Lq, d\); got q of shape \(2, 5, 8\)"):
        am.attention(q[0], k[0], v[0], P.causal(), need_weights=False)


@pytest.mark.parametrize("name", ["causal_bottom_right", "key_padding", "document", "causal_and_padding"])
@pytest.mark.parametrize("Lq, Lk", [(20, 45), (45, 20)])
def test_gradients_of_fast_paths_equal_the_explicit_path(name, Lq, Lk):
    fn = predicates(Lq, Lk)[name]
    grads = []
    for need_weights in (True, False):
        q, k, v = qkv(Lq, Lk, torch.float64, requires_grad=True)
        out, _ = am.attention(q, k, v, fn, need_weights=need_weights)
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape)).sum().backward()
        grads.append([t.grad for t in (q, k, v)])
    for explicit, fast in zip(*grads):
        assert torch.isfinite(fast).all()
        torch.testing.assert_close(fast, explicit)


@pytest.mark.parametrize("name", ["sliding_window", "document", "causal_and_padding", "custom_per_head",
                                  "causal_negative_offset"])
def test_flex_kernel_matches_explicit_path(name, monkeypatch, tol):
    """The CUDA kernel's code path, run here with eager FlexAttention instead of the compiled one."""
    Lq, Lk = 45, 45
    q, k, v = qkv(Lq, Lk, d=16, dv=16)
    fn = predicates(Lq, Lk)[name]
    monkeypatch.setattr(dispatch, "_compiled_flex", flex_attention)
    with warnings.catch_warnings():
        # Eager FlexAttention on the CPU warns that it is unfused.
        warnings.simplefilter("ignore", UserWarning)
        out = dispatch.run(dispatch.Plan("flex_attention", "test"), q, k, v, fn, scale=0.3)
    explicit, _ = am.attention(q, k, v, fn, scale=0.3)
    torch.testing.assert_close(out, explicit, **tol(torch.float32))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", ["causal", "causal_bottom_right", "sliding_window", "key_padding",
                                  "document", "causal_negative_offset"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("Lq, Lk", [(256, 256), (64, 256), (256, 64)])
def test_cuda_kernels_match_the_explicit_path(name, dtype, Lq, Lk, sdpa64, tol):
    q, k, v = qkv(Lq, Lk, dtype, "cuda", d=64, dv=64)
    fn = predicates(Lq, Lk, device="cuda")[name]
    if name in ("sliding_window", "document"):
        assert am.attention_plan(q, k, v, fn).kernel == "flex_attention"
    ref = sdpa64(q, k, v, attn_mask=dense(fn, q, k))
    out, _ = am.attention(q, k, v, fn, need_weights=False)
    assert not out.isnan().any()
    torch.testing.assert_close(out.double(), ref, **tol(dtype))


# --------------------------------------------------------------------------- the BlockMask, built once

def test_the_block_mask_is_built_once_per_mask_function_and_sizes():
    doc_ids = (torch.arange(256) // 64).expand(2, 256)  # (B, L): four documents
    fn = P.document(doc_ids)
    first = dispatch.flex_block_mask(fn, 2, 8, 256, 256, "cpu")
    assert dispatch.flex_block_mask(fn, 2, 8, 256, 256, "cpu") is first  # every layer reuses it
    assert dispatch.flex_block_mask(fn, 2, 4, 256, 256, "cpu") is first  # heads do not matter
    assert dispatch.flex_block_mask(fn, 2, 8, 128, 256, "cpu") is not first  # other sizes do
    assert dispatch.flex_block_mask(P.document(doc_ids), 2, 8, 256, 256, "cpu") is not first


def test_a_closed_over_tensor_changed_in_place_gets_a_new_block_mask(monkeypatch, tol):
    """Issue 47: the cache was keyed on the function alone, so after ``doc_ids`` changed in place
    it returned the old BlockMask; its "full" tiles skip mask_mod, and FlexAttention attended
    across the new document borders. Through an ``expand`` view too (views share the version)."""
    L = 256
    base = torch.zeros(1, L, dtype=torch.long)
    doc_ids = base.expand(2, L)  # (B, L): one document
    fn = P.document(doc_ids)
    first = dispatch.flex_block_mask(fn, 2, 8, L, L, "cpu")
    base[0, L // 2:] = 1  # two documents now, changed in place through the base
    again = dispatch.flex_block_mask(fn, 2, 8, L, L, "cpu")
    assert torch.equal(again.to_dense(), P.block_mask(P.document(doc_ids.clone()), L, L, B=2).to_dense())
    assert not torch.equal(again.to_dense(), first.to_dense())
    assert dispatch.flex_block_mask(fn, 2, 8, L, L, "cpu") is again  # unchanged since: reused

    q, k, v = qkv(L, L, d=16, dv=16)
    q, k, v = q[:2], k[:2], v[:2]
    monkeypatch.setattr(dispatch, "_compiled_flex", flex_attention)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # eager FlexAttention on the CPU says it is unfused
        two = dispatch.run(dispatch.Plan("flex_attention", "test"), q, k, v, fn, scale=0.3)
        want_two, _ = am.attention(q, k, v, P.document(doc_ids.clone()), scale=0.3)
        base[0, : L // 4] = 2  # a third document, after the BlockMask of two was kept
        three = dispatch.run(dispatch.Plan("flex_attention", "test"), q, k, v, fn, scale=0.3)
        want_three, _ = am.attention(q, k, v, P.document(doc_ids.clone()), scale=0.3)
    torch.testing.assert_close(two, want_two, **tol(torch.float32))
    torch.testing.assert_close(three, want_three, **tol(torch.float32))


def test_a_custom_predicate_is_never_kept_and_composites_key_on_their_parts():
    """A custom predicate may read anything (here a tensor it closes over), so its BlockMask is
    built on every call; a composite of labelled parts keys on each part's tensors."""
    L = 128
    limit = torch.tensor([L])
    custom = lambda b, h, q_idx, kv_idx: kv_idx < limit[0]  # noqa: E731
    first = dispatch.flex_block_mask(custom, 1, 1, L, L, "cpu")
    limit[0] = 1
    second = dispatch.flex_block_mask(custom, 1, 1, L, L, "cpu")
    assert second is not first
    assert int(second.to_dense().sum()) == L // 128 and int(first.to_dense().sum()) == (L // 128) ** 2
    assert dispatch._state(P.and_masks(P.causal(), custom)) is None

    lengths = torch.tensor([L, L])
    fn = P.and_masks(P.causal(), P.key_padding(lengths))
    full = dispatch.flex_block_mask(fn, 2, 1, L, L, "cpu")
    assert dispatch.flex_block_mask(fn, 2, 1, L, L, "cpu") is full
    lengths[1] = 0  # sequence 1 is all padding now
    emptied = dispatch.flex_block_mask(fn, 2, 1, L, L, "cpu")
    assert int(emptied.to_dense()[1].sum()) == 0 and int(full.to_dense()[1].sum()) == 1


@pytest.mark.parametrize(("name", "batch", "heads"), [("document", 3, 1), ("sliding_window", 1, 1),
                                                      ("causal_and_padding", 3, 1),
                                                      ("custom_per_head", 3, 2)])
def test_the_block_mask_reads_batch_and_heads_only_when_the_predicate_does(name, batch, heads):
    fn = predicates(45, 45)[name]
    bm = dispatch.flex_block_mask(fn, B, H, 45, 45, "cpu")
    assert tuple(bm.kv_num_blocks.shape[:2]) == (batch, heads)
    # broadcast over what it leaves out, it lists the same blocks as one built for every (b, h)
    full = P.block_mask(fn, 45, 45, B=B, H=H)
    assert torch.equal(bm.to_dense().expand(B, H, -1, -1), full.to_dense())


BUILD = """
import sys
import torch
import attnmask as am
from attnmask import dispatch
torch.set_num_threads(1)
B, H, L = 1, 8, int(sys.argv[1])
def status(field):  # this process's own figures (ru_maxrss would start from the parent's peak)
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field))
warm = am.document((torch.arange(256) * 4 // 256).expand(B, 256))
dispatch.flex_block_mask(warm, B, H, 256, 256, "cpu")  # one-time initialisation, not charged
fn = am.document((torch.arange(L) * 4 // L).expand(B, L))  # (B, L): four packed documents
try:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the high-water mark starts again from the current RSS
except OSError:
    pass  # then an earlier peak may show: the figure is an upper bound
before = status("VmRSS:")
dispatch.flex_block_mask(fn, B, H, L, L, "cpu")
print(status("VmHWM:") - before)
"""


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="reads /proc/self/status")
def test_building_a_document_block_mask_does_not_touch_the_whole_b_h_lq_lk_grid():
    """Issue 40: built with B and H, create_mask ran over (B, H, Lq, Lk) (about 300 MiB at L = 2048,
    H = 8); with H=None it runs over (B, 1, Lq, Lk). The bound is 32 bytes per (query, key) pair
    of one (batch, head): four times less than one byte for each of the H = 8 heads' pairs."""
    import subprocess
    import sys

    L = 2048
    run = subprocess.run([sys.executable, "-c", BUILD, str(L)], capture_output=True, text=True, check=True)
    peak = int(run.stdout.strip().splitlines()[-1])
    assert peak < 32 * L * L, f"building the BlockMask raised the peak by {peak / 2**20:.0f} MiB"


@pytest.mark.slow
def test_compiled_flex_attention_is_compiled_twice_at_most_for_any_number_of_lengths():
    """Issue 40: torch.compile(flex_attention, dynamic=False) compiled once per sequence length. Now
    the second length recompiles once with symbolic sizes and the third reuses that graph. (On the
    CPU, the path the CUDA plan takes; compiling takes about a minute here.)"""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    dispatch._compiled_flex = None
    try:
        for L in (256, 384, 512):
            q, k, v = (torch.randn(1, 2, L, 16) for _ in range(3))
            fn = P.document((torch.arange(L) * 4 // L)[None])  # (B, L): four packed documents
            out = dispatch._flex(q, k, v, fn, 0.25)
            torch.testing.assert_close(out, am.attention(q, k, v, fn, scale=0.25)[0], rtol=1e-5, atol=1e-5)
        assert counters["stats"]["unique_graphs"] <= 2, dict(counters["stats"])
    finally:
        dispatch._compiled_flex = None
        torch._dynamo.reset()
