"""Fuzzing the parent's readers: 10,000 random and adversarial inputs, not one crash.

Every reader of bytes a submission controls -- its notebook files, the worker's
status lines, the records the worker writes -- either returns what it read or
says why not in its own words (a problem for the report, a ChannelError), and
never raises anything else: that is what keeps one submission's bytes that
submission's verdict. Hypothesis draws random bytes and text, and structures
that are almost right (notebooks with odd fields, status lines from the grammar
in any order, pickles of plain data with bytes flipped), which reach deeper
than noise does.
"""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grader import submission
from grader.sandbox import channel, status, supervisor
from grader.sandbox.limits import ChannelError, Limits

pytestmark = pytest.mark.slow  # 10,000 examples: about a minute in all


def fast(n: int) -> settings:
    """``n`` examples, the same ones on every run, with no per-example deadline (a loaded CI machine)."""
    return settings(max_examples=n, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
                    database=None)

# --------------------------------------------------------------------------- notebooks

_json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                       st.text(max_size=40))
_json = st.recursive(_json_leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=10), inner, max_size=5)), max_leaves=8)
_source = st.one_of(st.text(max_size=200), st.lists(st.text(max_size=60), max_size=6), _json,
                    st.sampled_from(["def causal_mask(n):\n    return 1\n", "%%bash\nls", "!pip install x",
                                     "x = (" * 300, "%time y = 1", "\x00", "def f(:\n"]))
_cell = st.fixed_dictionaries({"cell_type": st.sampled_from(["code", "markdown", "raw", 3, None]),
                               "source": _source}, optional={"outputs": _json, "metadata": _json})
_notebook = st.fixed_dictionaries({"cells": st.one_of(st.lists(_cell, max_size=6), _json)},
                                  optional={"nbformat": st.one_of(st.integers(), _json_leaf),
                                            "worksheets": _json, "metadata": _json})


def _deep(depth: int, opener: str, closer: str) -> str:
    return opener * depth + closer * depth


_notebook_text = st.one_of(
    st.text(max_size=300),
    _notebook.map(json.dumps),
    _notebook.map(lambda nb: json.dumps(nb)[: len(json.dumps(nb)) // 2]),  # cut short
    st.integers(1, 200_000).map(lambda d: _deep(d, "[", "]")),
    st.integers(1, 200_000).map(lambda d: '{"cells": ' + _deep(d, "[", "]") + "}"),
    st.integers(1, 50_000).map(lambda d: '{"cells": [' + '{"a": ' * d + "1" + "}" * d + "]}"),
    st.integers(1, 6000).map(lambda n: '{"cells": [], "nbformat": ' + "9" * n + "}"),
)


def _read_notebook(text: str) -> None:
    try:
        cells = submission.notebook_cells(text, "fuzz.ipynb")
    except ValueError:
        return
    for cell in cells:
        submission.syntax_error(cell)
        submission.defined_names(cell)


@fast(1500)
@given(_notebook.map(json.dumps))
def test_almost_notebooks_are_read_or_refused(text):
    _read_notebook(text)


@fast(1500)
@given(_notebook_text)
def test_notebook_text_deep_cut_or_random_is_read_or_refused(text):
    _read_notebook(text)


@fast(1500)
@given(st.binary(max_size=400))
def test_reading_any_file_as_a_submission_never_crashes(tmp_path_factory, data):
    folder = tmp_path_factory.getbasetemp() / "fuzz-files"
    folder.mkdir(exist_ok=True)
    for name in ("a.ipynb", "b.py"):
        (folder / name).write_bytes(data)
    src = submission.read(folder)
    assert len(src.files) == 2
    for cell, _ in src.trees():
        submission.defined_names(cell)


# --------------------------------------------------------------------------- status lines

_word = st.sampled_from(["ready", "refused", "cell", "loaded", "start", "check", "half", "public", "resume",
                         "done", "bye", "hello", ""])
_field = st.one_of(st.integers(-5, 12).map(str), st.text("0123456789.,= -", max_size=12),
                   st.integers(1, 6000).map(lambda n: "9" * n), st.just("0 40"), st.just("uid=0"),
                   st.just("caps=none"), st.just("pid=1"), st.just("net=lo"), st.just("seen=0"))
_line = st.builds(lambda w, fs: " ".join([w, *fs]), _word, st.lists(_field, max_size=5))


class _Handler:
    """Stands for the engine: takes whatever the supervisor reports."""

    def __getattr__(self, name):
        return lambda *args: None


class _Worker:
    """Stands for a worker whose status lines are fed by hand: confined, so that "ready" is read
    as the sandbox's measurements."""

    def __init__(self, results: Path):
        self.results, self.confined, self.measured = results, True, {}
        self.limited = "none"  # which limits held (grader.sandbox.cgroups): none here

    def stop(self) -> None:
        pass

    def send(self, part, last: bool = False) -> None:
        pass


@fast(2500)
@given(st.lists(st.one_of(_line.map(str.encode), st.binary(max_size=80)), max_size=12),
       st.lists(st.integers(0, 5), min_size=1, max_size=4))
def test_status_lines_in_any_order_are_read_or_refused(tmp_path_factory, chunks, pending):
    """Lines from the grammar in any order, and noise: each is handled or is a ChannelError."""
    worker = _Worker(tmp_path_factory.getbasetemp() / "results.bin")
    drive = supervisor._Drive(worker, Limits(timeout=1.0), _Handler(), str, pending, first=True)
    lines = status.Lines()
    for chunk in chunks:
        for line in lines.feed(chunk + b"\n"):
            try:
                drive.handle(line)
            except ChannelError:
                return  # the submission's verdict: the supervisor stops reading here
            assert drive.deadline <= time.monotonic() + supervisor.STARTUP_TIMEOUT


# --------------------------------------------------------------------------- records

_plain = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(), st.text(max_size=20),
              st.complex_numbers(allow_nan=True)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.tuples(inner, inner),
                            st.dictionaries(st.one_of(st.text(max_size=8), st.integers(0, 9)), inner,
                                            max_size=4)),
    max_leaves=10)
_outcome = st.fixed_dictionaries({}, optional={
    "output": _plain, "error": st.one_of(st.none(), st.text(max_size=50), st.integers()),
    "seconds": st.one_of(st.floats(), st.integers(-2**70, 2**70), st.just(10**400), st.text(max_size=3)),
    "args_after": _plain, "grads": _plain, "devices": _plain, "where": _plain})


def _record(body: bytes, raw: bytes = b"", n: int | None = None) -> bytes:
    """A channel record whose header is ``body`` (its length ``n`` if given) and bytes ``raw``."""
    return struct.pack("<Q", len(body) if n is None else n) + body + raw


def _header(tree, raw: bytes = b"", entry: dict | None = None) -> bytes:
    entry = entry or {"dtype": "U8", "shape": [len(raw)], "data_offsets": [0, len(raw)]}
    entries = {"0": entry} if raw else {}
    meta = {"format": channel.FORMAT, "tree": json.dumps(tree)}
    return json.dumps({"__metadata__": meta, **entries}).encode()


def _read_record(data: bytes) -> None:
    try:
        value = channel.decode(data)
    except ChannelError:
        return
    for reader in (channel.loaded_from_data, lambda v: [channel.outcome_from_data(d) for d in v]):
        try:
            reader(value)
        except (ChannelError, TypeError):
            pass  # TypeError: iterating a value that is not a list, which the supervisor checks first


_flips = st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)), max_size=4)


@fast(1000)
@given(_plain, _flips, st.binary(max_size=64))
def test_plain_data_flipped_or_cut_is_read_or_refused(value, flips, raw):
    try:
        body = bytearray(channel.encode(value))
    except (ValueError, TypeError):
        return
    for at, byte in flips:
        if body:
            body[at % len(body)] = byte
    _read_record(bytes(body) + raw)
    _read_record(bytes(body)[: len(body) // 2])


@fast(1000)
@given(st.lists(_outcome, max_size=3), _flips, st.binary(max_size=64))
def test_records_flipped_cut_or_forged_are_read_or_refused(outcomes, flips, raw):
    body = bytearray(_header(channel._Writer().tree(outcomes), raw))
    for at, byte in flips:
        if body:
            body[at % len(body)] = byte
    _read_record(_record(bytes(body), raw))
    _read_record(_record(bytes(body), raw)[: len(body) // 2])


@fast(1000)
@given(st.binary(max_size=300), st.integers(0, 2**64 - 1),
       st.tuples(st.text(max_size=10), st.lists(st.integers(-3, 2**41), max_size=4), st.integers(-5, 300)),
       st.tuples(st.lists(st.integers(-3, 2**41), max_size=3), st.integers(-5, 2**41),
                 st.integers(-5, 2**41)))
def test_random_bytes_and_forged_tensor_headers_are_read_or_refused(noise, n, node, entry):
    _read_record(noise)
    _read_record(_record(noise, n=n))
    dtype, shape, index = node
    tree = [{"output": {"x": index, "dtype": dtype, "shape": shape}, "seconds": 0.0}] * 3
    shape, start, end = entry
    _read_record(_record(_header(tree, noise or b"x", {"dtype": "U8", "shape": shape,
                                                      "data_offsets": [start, end]}), noise))


@pytest.mark.parametrize("opcodes", [b"(" * 100_000, b"]" + b"2" * 1_000_000,
                                     b"}" + b"(" * 50_000 + b"t" * 50_000], ids=["marks", "dups", "tuples"])
def test_pickles_that_nest_or_duplicate_without_end_are_refused(opcodes):
    """MARK 100,000 deep; DUP a million times; tuples of tuples 50,000 deep: not read as pickles at all."""
    with pytest.raises(ChannelError):
        channel.decode(b"\x80\x05" + opcodes + b".")
    with pytest.raises(ChannelError):
        channel.decode(_record(b"\x80\x05" + opcodes + b"."))
