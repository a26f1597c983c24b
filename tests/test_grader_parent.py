"""The grading parent treats every byte from a submission as hostile.

What a submission's code writes to the worker's status pipe and records, and
what its notebook files hold, is read with bounded lengths, numbers and counts:
anything malformed is that submission's verdict ("sent data the grader cannot
read"), never the grader's crash or a usage error, the results file is always
written, and no deadline moves for anything the worker says.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from grader import engine
from grader.results import CRASHED, FAILED, PASSED, TIMED_OUT
from grader.runners.single import cli
from grader.sandbox import channel, status
from grader.sandbox.limits import ChannelError

SUBMISSIONS = Path(__file__).parent / "submissions"
FORGED = ("causal_mask", "padding_mask", "decoder_mask", "document_mask", "sliding_window_mask",
          "prefix_lm_mask")


@pytest.mark.slow
def test_a_submission_that_writes_to_the_grader_s_pipe_is_charged_not_the_grader(tmp_path):
    """tests/submissions/forger.py: a 5000-digit number, a line that never ends, "start" every half
    second for two minutes past the alarm, a record of 10**400 seconds, a record that would copy
    300 MB, and bytes that are not ASCII. Each costs its own exercise; the grading ends in time."""
    out = tmp_path / "results.json"
    args = [str(SUBMISSIONS / "forger.py"), "--json", str(out), "--timeout", "2", "--quiet"]
    code = cli.main([*args, *(a for name in FORGED for a in ("--exercise", name))])
    assert code == 0
    results = json.loads(out.read_text())
    tests = {t["name"].split()[0]: t for t in results["tests"]}
    assert set(tests) == set(FORGED)
    for name in FORGED:
        assert tests[name]["score"] == 0, (name, tests[name]["output"])
        assert tests[name]["status"] in (CRASHED, TIMED_OUT, FAILED), (name, tests[name]["status"])
    for name in ("causal_mask", "padding_mask", "decoder_mask", "prefix_lm_mask"):
        assert status.UNREADABLE in tests[name]["output"], tests[name]["output"]
    assert results["execution_time"] < 90  # decoder_mask alone would hold a moving deadline 120 s


def test_a_notebook_nested_100000_deep_is_that_submission_s_message(tmp_path):
    (tmp_path / "deep.ipynb").write_text("[" * 100_000 + "]" * 100_000)
    (tmp_path / "old.ipynb").write_text(json.dumps({"nbformat": 3, "worksheets": [{"cells": []}]}))
    (tmp_path / "wide.ipynb").write_text(json.dumps({"cells": "x"}))
    (tmp_path / "utf16.ipynb").write_bytes(json.dumps({"cells": []}).encode("utf-16"))
    report = engine.grade(tmp_path, exercises=["causal_mask"])
    text = "\n".join(report.notes)
    assert "deep.ipynb is not a readable notebook: its JSON nests deeper than Python can read" in text
    assert "old.ipynb is not a readable notebook: it is in the old notebook format 3" in text
    assert "wide.ipynb is not a readable notebook: no list of cells" in text
    assert "utf16.ipynb could not be read: it is UTF-16 text" in text
    assert not report.usage_error and report.exercise("causal_mask").score == 0


def test_a_chain_of_helpers_deeper_than_python_s_stack_is_read(tmp_path):
    """The rules' scan follows helpers with a stack of its own."""
    chain = "\n".join(f"def h{i}():\n    return h{i + 1}()\n" for i in range(3000))
    (tmp_path / "chain.py").write_text(f"{chain}\ndef h3000():\n    return 1\n\n"
                                       "def causal_mask(n, *, device=None):\n    return h0()\n")
    report = engine.grade(tmp_path / "chain.py", exercises=["causal_mask"], timeout=2)
    assert report.exercise("causal_mask").status != PASSED and not report.error


# --------------------------------------------------------------------------- the readers, one by one

@pytest.mark.parametrize("line", [
    "start " + "9" * 5000, "check 0 1 " + "1" * 4400 + ".0 0 10", "cell -1", "start 1 2", "done x",
    "loaded ../../etc/passwd 0 10", "hello", "check 0 0 1.0 0", "check 0 0 1.0 0 10", "bye " + "9" * 10,
])
def test_status_lines_outside_the_grammar_are_refused(line):
    with pytest.raises(ChannelError):
        status.parse(line)


def test_status_lines_are_bounded_and_ascii():
    lines = status.Lines()
    assert lines.feed(b"start 3\ncheck 3 0 120 40\npartial") == ["start 3", "check 3 0 120 40"]
    assert status.parse("check 3 0 120 40") == ("check", [3, 0, "120 40"])
    # the lines before a bad one are read; the bad one is refused in its place; nothing after it is read
    *good, bad = status.Lines().feed(b"start 3\n" + b"9" * (status.MAX_LINE + 1))
    assert good == ["start 3"]
    with pytest.raises(ChannelError, match="longer than"):
        status.parse(bad)
    lines = status.Lines()
    *good, bad = lines.feed("done 3\ncaf\u00e9\ndone 4\n".encode())
    assert good == ["done 3"] and lines.feed(b"done 5\n") == []
    with pytest.raises(ChannelError, match="ASCII"):
        status.parse(bad)


def _record(tree, raw: bytes = b"") -> bytes:
    entries = {"0": {"dtype": "U8", "shape": [len(raw)], "data_offsets": [0, len(raw)]}} if raw else {}
    meta = {"format": channel.FORMAT, "tree": json.dumps(tree)}
    body = json.dumps({"__metadata__": meta, **entries}).encode()
    return struct.pack("<Q", len(body)) + body + raw


def test_a_record_of_10_to_the_400_seconds_is_a_channel_error():
    with pytest.raises(ChannelError, match="64 bits"):
        channel.decode(_record([{"d": [["output", None], ["seconds", 10**400]]}]))
    for bad in (10**400, float("nan"), float("inf"), -1.0, "1"):
        for field in ("seconds", "cpu"):
            with pytest.raises(ChannelError):
                channel.outcome_from_data({field: bad})


def test_a_record_cannot_make_the_parent_copy_what_it_shares():
    """Long strings, or one tensor's bytes referenced many times: the parent would hold
    gigabytes from a record of kilobytes."""
    big = "x" * (channel.MAX_STRING + 1)
    with pytest.raises(ChannelError, match="header claims|characters"):
        channel.decode(_record([big] * 50))
    node = {"x": 0, "dtype": "float32", "shape": [256]}
    with pytest.raises(ChannelError, match="shared"):
        channel.decode(_record([node] * 1000, raw=bytes(1024)))
    assert channel.decode(_record([node], raw=bytes(1024)))[0].shape == (256,)


def test_the_loaded_record_is_checked_and_cut():
    d = channel.loaded_from_data({"found": {"causal_mask": "x" * 10_000, 3: "y"},
                                  "errors": ["e" * 10_000] * 500})
    assert len(d["found"]["causal_mask"]) == 300 and 3 not in d["found"]
    assert len(d["errors"]) == 50 and all(len(e) == 500 for e in d["errors"])
    for bad in (None, {"found": []}, {"found": {}, "errors": 5}):
        with pytest.raises(ChannelError):
            channel.loaded_from_data(bad)


def test_a_crash_is_placed_only_in_the_submission_s_own_files(tmp_path):
    """stderr is the submission's to write: a fake crash dump naming a "file" of its choosing
    (a hidden case spelled out) is not quoted; a real one in its own file is."""
    from grader.sandbox import supervisor

    w = object.__new__(supervisor.Worker)
    w.dir, w.sites = tmp_path, {"cell 2 of ex01.ipynb"}
    for site, shown in (("cell 2 of ex01.ipynb", True), ("cell 2 of n seven x eleven.ipynb", False)):
        (tmp_path / "stderr.txt").write_text(f'Fatal Python error: Segmentation fault\n\n'
                                             f'  File "<{site}>", line 7 in causal_mask\n')
        assert w.crash_site() == (f"line 7 of {site}" if shown else None)


def test_no_status_line_moves_a_deadline_twice_or_past_the_grading_s_end(tmp_path):
    from grader.sandbox import supervisor
    from grader.sandbox.limits import Limits

    class Worker:
        results, confined, measured = tmp_path / "results.bin", False, {}
        sent: list = []

        def send(self, part, last=False):
            self.sent.append((part, last))

    class Handler:
        def __getattr__(self, name):
            return lambda *args: None

    drive = supervisor._Drive(Worker(), Limits(timeout=1.0), Handler(), str, [0, 1], first=False)
    drive.parts, drive.found_of = ["public", "hidden"], lambda: {0, 1}
    for line in ("ready unconfined", "cell 0", "loaded 0 1"):
        drive.handle(line)
    assert Worker.sent == [("public", False)]  # the calls come only after the load
    end = drive.until
    assert end < float("inf")
    for line in ("start 0", "half 0", "start 1"):
        drive.handle(line)
        assert drive.deadline <= end
    with pytest.raises(ChannelError):  # exercise 1's public checks have not all run: no hidden calls yet
        drive.handle("public")
    assert Worker.sent == [("public", False)]
    drive.handle("half 1")
    drive.handle("public")
    assert Worker.sent[-1] == ("hidden", True)
    drive.handle("resume 0")
    drive.handle("done 0")
    drive.handle("resume 1")
    for again in ("start 1", "start 0", "half 1", "resume 0", "public", "done 0", "cell 0", "loaded 0 1",
                  "ready unconfined"):
        with pytest.raises(ChannelError):  # said again, or out of order: the submission's verdict
            drive.handle(again)
    drive.handle("done 1")
    drive.handle("bye 0")
    assert drive.bye and drive.until == end


_MEASURE = """
import resource, sys
from grader.sandbox import supervisor
from grader.sandbox.limits import ChannelError
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
for path in sys.argv[1:]:
    try:
        supervisor.receive(path)
    except ChannelError as e:
        print("refused", path, e)
    else:
        print("read", path)
print("growth_kib", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
"""


def test_records_built_to_exhaust_the_parent_are_refused_before_they_allocate(tmp_path):
    """Issue 38: a 9-byte pickle whose LONG_BINPUT targets memo index 110 M made the parent
    allocate 1.9 GiB; 20 M EMPTY_DICT opcodes did the same. Records are no pickles now, and a
    header's sizes are checked before anything is built: the peak memory of a process that reads
    them all grows by little more than the largest file's own bytes (20 MB here)."""
    long_binput = b"\x80\x04N" + b"r" + (110_000_000).to_bytes(4, "little") + b"."
    assert len(long_binput) == 9
    tb = 2**40
    attacks = {
        "long_binput": long_binput,
        "long_binput_framed": b"attnmask-channel-1\n" + struct.pack("<Q", 9) + long_binput,
        "empty_dicts": b"\x80\x04" + b"}" * 20_000_000 + b".",
        "header_claims_a_terabyte": struct.pack("<Q", 2**40) + b"{}",
        "entry_claims_a_terabyte": _record([{"x": 0, "dtype": "uint8", "shape": [tb]}], raw=bytes(8)).replace(
            b'"shape": [8], "data_offsets": [0, 8]', f'"shape": [{tb}], "data_offsets": [0, {tb}]'.encode()),
        "shape_overflows": _record([{"x": 0, "dtype": "float64", "shape": [2**39] * 3}], raw=bytes(8)),
        "700k_dicts": struct.pack("<Q", 2 * 2**20) + (b"[" + b"{}," * 699_000).ljust(2 * 2**20, b" "),
        "200k_lists": _record([[]] * (channel.MAX_NODES + 10)),
    }
    paths = []
    for name, data in attacks.items():
        (tmp_path / name).write_bytes(data)
        paths.append(str(tmp_path / name))
    proc = subprocess.run([sys.executable, "-c", _MEASURE, *paths], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert sum(line.startswith("refused ") for line in lines) == len(attacks), proc.stdout
    growth = int(lines[-1].split()[1]) * 1024
    assert growth < 100 * 2**20, f"reading the attacks grew the parent's peak memory by {growth >> 20} MiB"
