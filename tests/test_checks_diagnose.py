"""The shared comparison helpers: errors in plain words, grids, tolerances, shapes."""

from __future__ import annotations

import pytest
import torch

from grader import diagnose as dg
from grader import errors
from grader.mistakes import MISTAKES
from grader.spec import NotATensor


@pytest.mark.parametrize("error, key", [
    ("RuntimeError: Tensor.item() cannot be called on meta tensors", "not_vectorised"),
    ("NotImplementedError: Cannot copy out of meta tensor; no data!", "not_vectorised"),
    ("RuntimeError: value cannot be converted to type c10::Half without overflow", "fill_overflow"),
    ("RuntimeError: a leaf Variable that requires grad is being used in an in-place operation.", "in_place"),
    ("RuntimeError: Tensor on device cpu is not on the expected device meta!", "mixed_devices"),
    ("RuntimeError: expected m1 and m2 to have the same dtype, but got: c10::Half != float", "mixed_dtypes"),
])
def test_errors_are_explained_in_plain_words(error, key):
    text = errors.explain_error(error)
    assert MISTAKES[key] in text and error.split(": ", 1)[1][:30] in text


def test_not_implemented_and_unknown_errors():
    assert errors.explain_error("NotImplementedError: fill in causal_mask").startswith("not implemented yet")
    assert errors.explain_error("ValueError: boom") == "it raised ValueError: boom"


def test_grids_show_expected_and_got_with_wrong_cells_marked():
    want = torch.ones(3, 3, dtype=torch.bool).tril()
    got = want.clone()
    got[0, 1] = True
    lines = dg.grids(want, got).splitlines()
    assert "expected" in lines[1] and "got" in lines[1]
    assert lines[2].split() == ["■", "·", "·", "■", "■", "·", ".", "✗", "."]
    assert dg.mask_detail(want[None, None].expand(2, 1, 3, 3), got[None, None].expand(2, 1, 3, 3),
                          "n=3").startswith("2 wrong cell(s)")


def test_tolerances_accept_rounding_and_reject_real_errors():
    want = torch.tensor([0.5, 1.0, 0.0], dtype=torch.float64)
    assert dg.close(want.half(), want, torch.float16) and dg.close(want.bfloat16(), want, torch.bfloat16)
    assert not dg.close(want + 0.05, want, torch.float16)
    assert not dg.close(torch.tensor([0.5, float("nan"), 0.0]), want, torch.float32)
    assert dg.close(torch.tensor([float("-inf")]), torch.tensor([float("-inf")]), torch.float32)
    detail = dg.number_detail(torch.tensor([[0.1, 0.9]]), torch.tensor([[0.5, 0.5]]), torch.float32, "w", "x")
    assert "w[0, 0]" in detail and "w[0, :]" in detail


def test_shapes_and_values_are_read_without_raising():
    t, msg = dg.fit_shape(torch.ones(1, 4, dtype=torch.bool), (2, 3, 4), "mask", "(B, Lq, Lk)")
    assert msg is None and t.shape == (2, 3, 4)
    _, msg = dg.fit_shape(torch.ones(4, 1), (2, 3, 4), "mask", "(B, Lq, Lk)")
    assert "does not broadcast to (B, Lq, Lk) = (2, 3, 4)" in msg
    _, msg = dg.mask_values(torch.tensor([0.0, float("-inf")]), "mask")
    assert "additive" in msg
    m, msg = dg.mask_values(torch.tensor([0.0, 1.0]), "mask")
    assert m is None and "masks nothing" in msg  # a wrong dtype is a wrong mask
    m, msg = dg.mask_values(torch.tensor([False, True]), "mask")
    assert msg is None and m.dtype == torch.bool
    _, msg = dg.unpack(NotATensor("list"), ("mask",))
    assert msg == "returned a list; expected mask as a plain torch.Tensor"
    assert "expected a tuple (out, weights)" in dg.unpack(torch.ones(2), ("out", "weights"))[1]


def test_torch_missing_kernel_is_not_mistaken_for_a_stub():
    from grader.spec import Outcome
    from grader.verdicts import all_not_implemented

    torch_error = "NotImplementedError: \"tril\" not implemented for 'UInt16'"
    stub_error = "NotImplementedError: causal_mask: build the mask (see exercise 1.2)"
    assert errors.is_stub_error(stub_error) and errors.is_stub_error("NotImplementedError: ")
    assert not errors.is_stub_error(torch_error) and not errors.is_stub_error(None)
    assert "no kernel" in errors.explain_error(torch_error) and "UInt16" in errors.explain_error(torch_error)
    assert "not implemented yet" in errors.explain_error(stub_error)
    assert all_not_implemented([Outcome(error=stub_error)])
    assert not all_not_implemented([Outcome(error=torch_error)])
