"""The job a worker is sent arrives as it was built: every tensor with its dtype, shape,
strides, storage offset, shared storage and requires_grad, whatever its bytes (NaN, -0.0)."""

from __future__ import annotations

import pickle

import torch

from grader.checks import EXERCISES
from grader.sandbox import jobwire
from grader.spec import Call


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes of ``t``'s elements: equal even where the values are NaN."""
    return t.detach().reshape(-1).contiguous().view(torch.uint8)


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return (type(b) is torch.Tensor and a.dtype == b.dtype and a.shape == b.shape
                and a.stride() == b.stride() and a.storage_offset() == b.storage_offset()
                and a.requires_grad == b.requires_grad and a.device == b.device
                and (a.device.type == "meta" or torch.equal(bits(a), bits(b))))
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if hasattr(a, "__dict__") and not isinstance(a, type):
        return type(a) is type(b) and same(vars(a), vars(b))
    return a == b


def test_tensors_keep_everything_that_a_check_can_depend_on():
    base = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
    base[0, 0, 0] = float("nan")
    base[0, 0, 1] = -0.0
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    job = {
        "transposed": base.transpose(1, 2),  # strides that are not contiguous
        "sliced": base[1, 1:],  # a storage offset
        "expanded": torch.ones(4, dtype=torch.bool)[None].expand(3, 4),  # stride 0
        "leaf": x,
        "empty": torch.empty(0, 5, dtype=torch.int64),
        "scalar": torch.tensor(3, dtype=torch.int32),
        "half": torch.randn(2, 2).to(torch.bfloat16),
        "meta": torch.empty(2, 3, device="meta"),  # not a CPU tensor: torch pickles it itself
        "call": Call((base, 5), {"window": 3}, device="meta"),
    }
    back = jobwire.loads(jobwire.dumps(job))
    assert same(job, back)
    assert back["leaf"].is_leaf and back["leaf"].requires_grad


def test_views_of_one_storage_still_share_it():
    base = torch.zeros(6)
    a, b = base[:3], base[3:]
    back_a, back_b, back_base = jobwire.loads(jobwire.dumps((a, b, base)))
    back_base.fill_(1.0)
    assert back_a.sum() == 3 and back_b.sum() == 3  # one storage, as torch's own pickle keeps it


def test_a_whole_grading_job_equals_what_pickle_gives():
    """Every exercise's hidden and public calls (the real payload) come back identical."""
    calls = {name: [c.calls for c in ex.make_checks(7, hidden=True)] for name, ex in EXERCISES.items()}
    assert same(pickle.loads(pickle.dumps(calls)), jobwire.loads(jobwire.dumps(calls)))
