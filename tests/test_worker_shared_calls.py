"""A call that two checks share (one object in the job) is made once in the worker, and both checks
get its outcome; calls that only look alike are made each time."""

from __future__ import annotations

import os

import torch

from grader.sandbox import channel, jobwire, readback
from grader.sandbox.worker import CheckJob, _run_exercise, _Status
from grader.spec import Call


def test_a_call_two_checks_share_runs_once_and_both_get_its_outcome(tmp_path):
    made = []

    def fn(x):
        made.append(1)
        return x * len(made)

    shared = Call((torch.ones(2),))
    alike = Call((torch.ones(2),))
    checks = [CheckJob(0, [shared, alike]), CheckJob(1, [shared]), CheckJob(2, [shared], want_grads=True)]
    # through the job's own wire, as the worker gets them: pickle keeps the shared call one object
    checks = jobwire.loads(jobwire.dumps(checks))
    assert checks[0].calls[0] is checks[1].calls[0] and checks[0].calls[1] is not checks[0].calls[0]
    r, w = os.pipe()
    path = tmp_path / "results"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        _run_exercise(0, fn, checks, 60.0, _Status(w), channel.Log(fd), ("start", "half"))
    finally:
        os.close(fd)
        os.close(w)
        lines = os.read(r, 1 << 16).decode().split("\n")
        os.close(r)
    records = [line.split(" ", 3)[3] for line in lines if line.startswith("check ")]
    outs = [[channel.outcome_from_data(d).output for d in readback.receive_record(path, where)]
            for where in records]
    # the shared call made once for checks 0 and 1 (x * 1), the look-alike once more (x * 2), and again
    # for the check that wants gradients (a different call of the function)
    assert len(made) == 3
    assert outs[0][0].tolist() == outs[1][0].tolist() == [1.0, 1.0]
    assert outs[0][1].tolist() == [2.0, 2.0]
