"""The sandbox: student code that hangs, crashes, hogs, cheats or makes a mess
costs only its own exercise, with a plain message, and never the grade file.

One grading run of ``tests/submissions/hostile.py`` (every exercise misbehaves
differently) serves most tests; a few small runs cover loading problems.
"""

from __future__ import annotations

import ast
import ctypes
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from grader import engine, rules, submission, verdicts
from grader.results import CRASHED, FAILED, NOT_FOUND, PASSED, TIMED_OUT
from grader.runners.single import cli
from grader.sandbox import channel, supervisor
from grader.spec import Call, Check, NotATensor, Outcome, Verdict

SUBMISSIONS = Path(__file__).parent / "submissions"


_PR_SET_CHILD_SUBREAPER = 36
#: Whether the grading of hostile.py ran with this process as the subreaper of what it started.
_ADOPTING: list[bool] = []


def _subreaper(on: bool) -> bool:
    """Make this process (Linux) the one that inherits the orphans of everything it starts, instead of
    init: a process the grading started stays this process's descendant whoever of its parents died."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _processes(*, of: int | None) -> list[tuple[int, list[bytes]]]:
    """``(pid, command line)`` of every live process descended from ``of`` (of every one if None)."""
    parent, cmdline = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue  # gone meanwhile
        parent[int(entry)] = int(stat[stat.rfind(")") + 2:].split()[1])
        if cmd:  # a zombie has none: dead, only not reaped
            cmdline[int(entry)] = cmd.split(b"\0")
    found = []
    for pid, cmd in cmdline.items():
        ancestor = pid
        while of is not None and ancestor not in (of, 0, 1) and ancestor in parent:
            ancestor = parent[ancestor]
        if of is None or ancestor == of:
            found.append((pid, cmd))
    return found


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """Grade hostile.py once, through the CLI, with a secret in the environment, and with this
    process as the subreaper of what the grading starts (see test_no_stray_processes_survive)."""
    out = tmp_path_factory.mktemp("hostile-out")
    old = os.environ.get("GRADER_SEED")
    os.environ["GRADER_SEED"] = "4242"  # a secret the worker must never see
    _ADOPTING[:] = [_subreaper(True)]
    try:
        code = cli.main([str(SUBMISSIONS / "hostile.py"), "--json", str(out / "results.json"),
                         "--timeout", "2", "--memory", "1024", "--quiet"])
    finally:
        _subreaper(False)
        if old is None:
            del os.environ["GRADER_SEED"]
        else:
            os.environ["GRADER_SEED"] = old
    results = json.loads((out / "results.json").read_text())
    tests = {t["name"].split()[0]: t for t in results["tests"]}
    return code, results, tests


@pytest.mark.slow
def test_grading_completes_with_every_exercise_reported(hostile):
    code, results, tests = hostile
    assert code == 0
    defined = {n.name for n in ast.parse((SUBMISSIONS / "hostile.py").read_text()).body
               if isinstance(n, ast.FunctionDef)}
    assert list(tests) == [name for name in engine.load_registry() if name in defined]  # what it hands in
    assert results["extra_data"]["seed"] == 4242  # the seed came from $GRADER_SEED, in the parent


@pytest.mark.slow
def test_interruptible_infinite_loop_times_out(hostile):
    _, results, tests = hostile
    assert results["extra_data"]["status"]["causal_mask"] == TIMED_OUT
    assert "time limit" in tests["causal_mask"]["output"]


@pytest.mark.slow
def test_loop_that_ignores_interruption_is_killed(hostile):
    _, results, tests = hostile
    assert results["extra_data"]["status"]["to_additive"] == TIMED_OUT
    assert "did not finish within 2 s" in tests["to_additive"]["output"]


@pytest.mark.slow
def test_os_exit_is_a_crash_of_that_exercise_only(hostile):
    _, results, tests = hostile
    assert results["extra_data"]["status"]["masked_softmax"] == CRASHED
    assert "os._exit()" in tests["masked_softmax"]["output"]


@pytest.mark.slow
def test_segfault_is_a_crash_of_that_exercise_only(hostile):
    _, results, tests = hostile
    assert results["extra_data"]["status"]["attention"] == CRASHED
    assert "segmentation fault" in tests["attention"]["output"]
    # The line of the crash, read from the dump the worker printed, is the submission's to forge:
    # shown where no hidden case ran, and not beside the hidden ones.
    assert not re.search(r"at line \d+ of", tests["attention"]["output"])
    public = engine.grade(SUBMISSIONS / "hostile.py", exercises=["attention"], public_only=True, timeout=2)
    assert re.search(r"at line \d+ of hostile.py", public.exercise("attention").message)  # from the dump
    assert "Fatal Python error" not in results["output"]


@pytest.mark.slow
def test_sys_exit_and_keyboard_interrupt_fail_their_checks(hostile):
    _, results, tests = hostile
    # Graded with a seed: what the code raised is not named (issue 38: its type could say the case).
    assert results["extra_data"]["status"]["padding_mask"] == FAILED
    assert "raised an exception" in tests["padding_mask"]["output"]
    assert results["extra_data"]["status"]["decoder_mask"] == FAILED
    assert "raised an exception" in tests["decoder_mask"]["output"]


@pytest.mark.slow
def test_memory_hog_is_stopped(hostile):
    _, results, tests = hostile
    assert tests["encoder_decoder_masks"]["score"] == 0
    assert "raised an exception" in tests["encoder_decoder_masks"]["output"]  # a MemoryError, not named


@pytest.mark.slow
def test_patched_comparisons_do_not_fool_the_judges(hostile):
    _, _, tests = hostile
    mha = tests["multi_head_attention"]
    assert mha["score"] < mha["max_score"]
    assert "wrong values" in mha["output"]


@pytest.mark.slow
def test_lying_tensor_subclass_is_refused(hostile):
    _, _, tests = hostile
    kv = tests["kv_cache_attention"]
    assert kv["score"] < kv["max_score"]
    assert "tensor subclass" in kv["output"]
    assert "Liar" not in kv["output"]  # a name the submission chose, not shown beside hidden cases


@pytest.mark.slow
def test_side_effects_that_are_not_cheating_cost_nothing(hostile):
    _, results, tests = hostile
    # Floods of output; stdin read, stray process and thread, cwd and env changed.
    for name in ("sliding_window_mask", "prefix_lm_mask"):
        assert tests[name]["status"] == "passed", tests[name]["output"]
    # hidden cases ran: what it printed is not shown to the student (it may spell a hidden case out)
    assert "chatter" not in results["output"] and "What your code printed is not shown" in results["output"]
    assert len(results["output"]) < 10_000


@pytest.mark.slow
def test_forged_results_files_and_secrets_change_nothing(hostile, tmp_path):
    _, results, tests = hostile
    assert results["max_score"] == sum(t["max_score"] for t in results["tests"])
    assert results["score"] < 50
    # document_mask returns None if $GRADER_SEED leaked into the sandbox, and forges files.
    assert tests["document_mask"]["status"] == "passed", tests["document_mask"]["output"]


@pytest.mark.slow
def test_forbidden_import_in_the_worker_names_the_rule(hostile):
    _, _, tests = hostile
    assert "attnmask is off limits in exercises" in tests["influence_matrix"]["output"]


@pytest.mark.slow
def test_no_stray_processes_survive(hostile):
    """hostile.py starts `sleep 300` and leaves it: the grading must have killed it. Orphaned, it
    was inherited by this process (the subreaper), so it would be among this process's descendants;
    other gradings on the machine (other workers of this run, other runs) do not count."""
    mine = os.getpid() if _ADOPTING == [True] else None  # without a subreaper: every process
    sleeping = [pid for pid, cmd in _processes(of=mine) if cmd[:2] == [b"sleep", b"300"]]
    assert not sleeping, f"stray processes left by the submission: {sleeping}"


def test_the_stray_check_sees_an_orphaned_grandchild():
    """What test_no_stray_processes_survive relies on: a process started by a child that has
    since exited is still found among this process's descendants while it is the subreaper."""
    if not _subreaper(True):
        pytest.skip("no child subreaper here (Linux only)")
    orphans = []
    try:
        # The shell starts sleep in a session of its own and exits at once: sleep is orphaned.
        subprocess.run(["sh", "-c", "setsid sleep 299 </dev/null >/dev/null 2>&1 &"], check=True)
        for _ in range(100):  # setsid may fork: wait for sleep itself
            orphans = [pid for pid, cmd in _processes(of=os.getpid()) if cmd[:2] == [b"sleep", b"299"]]
            if orphans:
                break
            time.sleep(0.05)
    finally:
        _subreaper(False)
    assert orphans, "the orphan was not found among this process's descendants"
    assert all(_parent(pid) == os.getpid() for pid in orphans)  # adopted, not init's
    for pid in orphans:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rfind(")") + 2:].split()[1])


# --------------------------------------------------------------------------- loading


@pytest.mark.slow
def test_hang_at_import_costs_everything_but_ends_in_time():
    report = engine.grade(SUBMISSIONS / "hang_at_import.py", exercises=["causal_mask"], timeout=1,
                          load_timeout=3)
    e = report.exercise("causal_mask")
    assert (e.status, e.score) == (TIMED_OUT, 0)
    assert "did not finish within 3 s" in e.message and "before any exercise" in e.message
    assert report.execution_time < 60


@pytest.mark.slow
def test_slow_statement_at_import_is_stopped_and_the_rest_graded():
    report = engine.grade(SUBMISSIONS / "slow_import.py", exercises=["causal_mask"], timeout=2)
    assert report.exercise("causal_mask").status == PASSED
    assert any("ran longer than 2 s" in n for n in report.notes)


def test_parent_never_runs_student_code(tmp_path):
    sub = tmp_path / "spy.py"
    sub.write_text(
        "import os\n"
        "PID = print('ran in', os.getpid())\n"  # an assignment: it runs (a bare print() is skipped)
        "def causal_mask(n, *, device=None):\n"
        "    import torch\n"
        "    return torch.ones(n, n, dtype=torch.bool, device=device).tril()\n"
    )
    before = set(sys.modules)
    report = engine.grade(sub, exercises=["causal_mask"])
    assert report.exercise("causal_mask").status == PASSED
    pid = re.search(r"ran in (\d+)", report.output)
    assert pid and int(pid.group(1)) != os.getpid()
    assert not any(m.startswith("submission") for m in set(sys.modules) - before)


def test_forbidden_apis_are_reported_and_score_zero():
    names = ["causal_mask", "padding_mask", "attention", "multi_head_attention", "sliding_window_mask"]
    report = engine.grade(SUBMISSIONS / "forbidden.py", exercises=names)
    statuses = {e.name: e.status for e in report.exercises}
    assert statuses["sliding_window_mask"] == PASSED
    rule = "is off limits in exercises: it would be the answer"
    for name in names[:-1]:
        e = report.exercise(name)
        assert e.score == 0, name
        assert rule in e.message, (name, e.message)
        assert any(rule in n for n in e.notes), (name, e.notes)  # the static scan names the line
    assert "line 14 of forbidden.py" in " ".join(report.exercise("padding_mask").notes)  # via a helper


def test_the_original_of_a_forbidden_function_is_nowhere_in_the_worker():
    """Issue 38: the real multi_head_attention_forward, kept in grader.sandbox.worker._HELD to be
    restored, was reachable through sys.modules and ran with need_weights=True on plain
    operators: 3.5/5. The worker now drops the originals; the submission searches sys.modules'
    saved lists, closures, generators' frames, gc.get_objects (frozen ones too) and
    gc.get_referrers, and finds nothing to call."""
    report = engine.grade(SUBMISSIONS / "held_original.py", exercises=["multi_head_attention"])
    e = report.exercise("multi_head_attention")
    assert e.score == 0, (e.status, e.message)


# --------------------------------------------------------------------------- the channel


def test_channel_round_trips_outcomes(tmp_path):
    o = Outcome(output=(torch.ones(2), NotATensor("list")), devices=("cpu", None), error=None,
                args_after=({"value": torch.zeros(1), "grad_set": False}, None), grads={0: torch.ones(3)})
    (tmp_path / "x.pt").write_bytes(channel.encode([channel.outcome_to_data(o)]))
    (back,) = [channel.outcome_from_data(d) for d in supervisor.receive(tmp_path / "x.pt")]
    assert torch.equal(back.output[0], torch.ones(2)) and back.output[1] == NotATensor("list")
    assert back.args_after[0]["grad_set"] is False and torch.equal(back.grads[0], torch.ones(3))


def _forge(tree, raw: bytes = b"", entries: dict | None = None, header_len: int | None = None) -> bytes:
    """A record in the channel's format around any tree and entries, as a forger would write it."""
    import json

    if entries is None:
        entries = {"0": {"dtype": "U8", "shape": [len(raw)], "data_offsets": [0, len(raw)]}} if raw else {}
    meta = {"format": channel.FORMAT, "tree": json.dumps(tree)}
    header = json.dumps({"__metadata__": meta, **entries}).encode()
    return (len(header) if header_len is None else header_len).to_bytes(8, "little") + header + raw


def test_channel_round_trips_every_plain_kind(tmp_path):
    t = torch.arange(12.0).reshape(3, 4).T  # not contiguous
    obj = [{"t": t, 7: (torch.tensor([True, False]), torch.zeros(0, 3), torch.tensor(2.5),
                        torch.tensor([1.5, -2.0], dtype=torch.bfloat16), torch.tensor([1 + 2j]),
                        torch.arange(3, dtype=torch.int8)),
            "c": 1 + 2j, "n": None, "f": float("inf"), "s": "héllo", "b": False}]
    (tmp_path / "x").write_bytes(channel.encode(obj))
    back = supervisor.receive(tmp_path / "x")
    assert torch.equal(back[0]["t"], t) and back[0]["t"].shape == (4, 3)
    for got, want in zip(back[0][7], obj[0][7]):
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    assert {k: v for k, v in back[0].items() if k not in ("t", 7)} == {k: v for k, v in obj[0].items()
                                                                        if k not in ("t", 7)}
    assert type(back[0][7]) is tuple


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_channel_carries_every_dtype_a_student_might_return(tmp_path):
    values = [torch.arange(6).reshape(2, 3).to(d) for d in channel._DTYPES.values() if d != torch.bool]
    values.append(torch.tensor([[True, False]]))
    assert {v.dtype for v in values} >= {torch.uint16, torch.float8_e4m3fn, torch.complex32, torch.uint64}
    (tmp_path / "x").write_bytes(channel.encode(values))
    for got, want in zip(supervisor.receive(tmp_path / "x"), values):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)) if want.dtype != torch.bool \
            else torch.equal(got, want)


class _Forged:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_channel_refuses_pickles_objects_and_foreign_formats(tmp_path):
    """A pickle (the old format, or any) is not read at all: no code runs, nothing is built."""
    path, marker = tmp_path / "forged.pt", tmp_path / "pwned"
    for protocol in (2, pickle.HIGHEST_PROTOCOL):
        body = pickle.dumps([_Forged(marker)], protocol=protocol)
        for data in (body, b"attnmask-channel-1\n" + len(body).to_bytes(8, "little") + body):
            path.write_bytes(data)
            with pytest.raises(channel.ChannelError, match="header|record"):
                supervisor.receive(path)
    assert not marker.exists(), "unpickling ran code"
    torch.save([torch.ones(2)], path)  # not our format at all
    with pytest.raises(channel.ChannelError):
        supervisor.receive(path)
    for tree in ({"__class__": "os.system"}, {"t": [1], "d": []}, {"c": ["1", 2]}, {"d": [[[1], 2]]},
                 {"d": [[None, 2]]}, {"x": 0, "dtype": "float32"}):
        path.write_bytes(_forge(tree))
        with pytest.raises(channel.ChannelError):
            supervisor.receive(path)
    with pytest.raises(channel.ChannelError):
        channel.outcome_from_data({"error": 3})


@pytest.mark.parametrize("node, why", [
    ({"x": 0, "dtype": "float32", "shape": [4]}, "more bytes than the entry holds"),
    ({"x": 0, "dtype": "float32", "shape": [1]}, "fewer bytes than the entry holds"),
    ({"x": 0, "dtype": "float32", "shape": [-1]}, "negative size"),
    ({"x": 0, "dtype": "object", "shape": [2]}, "dtype not on the list"),
    ({"x": 1, "dtype": "float32", "shape": [2]}, "no such entry"),
    ({"x": "0", "dtype": "float32", "shape": [2]}, "index not an integer"),
    ({"x": 0, "dtype": "float32", "shape": "2"}, "shape not a list"),
    ({"x": 0, "dtype": "float32", "shape": [2**39, 2**39]}, "a shape whose size overflows"),
])
def test_channel_refuses_malformed_tensor_records(tmp_path, node, why):
    (tmp_path / "f").write_bytes(_forge([node], b"\0" * 8))
    with pytest.raises(channel.ChannelError):
        supervisor.receive(tmp_path / "f")


@pytest.mark.parametrize("entry, why", [
    ({"dtype": "U8", "shape": [16], "data_offsets": [0, 16]}, "more bytes than the record holds"),
    ({"dtype": "U8", "shape": [2**40], "data_offsets": [0, 2**40]}, "a terabyte claimed"),
    ({"dtype": "U8", "shape": [8], "data_offsets": [4, 12]}, "a gap before it"),
    ({"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "not raw bytes"),
    ({"dtype": "U8", "shape": [4], "data_offsets": [0, 8]}, "byte count not the shape's"),
])
def test_channel_refuses_entries_that_do_not_match_the_bytes(tmp_path, entry, why):
    (tmp_path / "f").write_bytes(_forge([{"x": 0, "dtype": "uint8", "shape": [8]}], b"\0" * 8, {"0": entry}))
    with pytest.raises(channel.ChannelError):
        supervisor.receive(tmp_path / "f")


def test_channel_forged_bools_are_bools(tmp_path):
    (tmp_path / "f").write_bytes(_forge([{"x": 0, "dtype": "bool", "shape": [3]}], bytes([0, 2, 255])))
    (t,) = supervisor.receive(tmp_path / "f")
    assert t.dtype == torch.bool and t.tolist() == [False, True, True] and t.to(torch.uint8).max() == 1


def test_channel_one_entry_makes_one_tensor(tmp_path):
    """The same bytes referenced many times would be gigabytes from megabytes."""
    node = {"x": 0, "dtype": "float32", "shape": [2]}
    (tmp_path / "f").write_bytes(_forge([node, node], b"\0" * 8))
    with pytest.raises(channel.ChannelError, match="shared"):
        supervisor.receive(tmp_path / "f")


def test_channel_refuses_headers_too_big_or_too_busy(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(_forge([1], header_len=2**62))  # claims exabytes: refused on its 8 bytes
    with pytest.raises(channel.ChannelError, match="claims"):
        supervisor.receive(path)
    node: list = [1]
    for _ in range(channel.MAX_DEPTH + 2):
        node = [node]
    path.write_bytes(_forge(node))
    with pytest.raises(channel.ChannelError, match="deeper"):
        supervisor.receive(path)
    path.write_bytes(_forge([[]] * (channel.MAX_NODES + 1)))
    with pytest.raises(channel.ChannelError, match="items"):
        supervisor.receive(path)


def test_channel_log_records_are_read_back_exactly_as_announced(tmp_path, monkeypatch):
    monkeypatch.setattr(channel, "MAX_FILE_BYTES", 4000)
    results = tmp_path / "results.bin"
    log = channel.Log(os.open(results, os.O_WRONLY | os.O_CREAT, 0o600))
    values = [torch.full((100,), float(i)) for i in range(6)]  # ~550 bytes each
    where = [log.append(v) for v in values]
    for w, v in zip(where, values):
        assert torch.equal(supervisor.receive_record(results, w), v)
    with pytest.raises(ValueError, match="limit"):
        log.append(torch.zeros(2000))  # one record over the limit is refused on the worker's side
    with pytest.raises(ValueError, match="results would pass"):
        for i in range(10):  # and so is one that would take the whole file past it
            log.append(torch.full((100,), float(i)))
    offset, length = where[-1].split()
    for forged in (f"{offset} {int(length) + 10**6}",  # past what was written
                   f"{int(offset) + 1} {length}",  # not where a record starts
                   f"../results.bin {offset} {length}", f"1.0 {offset} {length}", "", "0 -5"):
        with pytest.raises(channel.ChannelError):
            supervisor.receive_record(results, forged)


def test_channel_log_whose_descriptor_was_closed_writes_nowhere_else(tmp_path):
    """Student code that closes the grader's descriptor (os.closerange(3, ...)) loses its own
    records: the log opens no other file (the worker has no folder to open one in)."""
    results = tmp_path / "results.bin"
    log = channel.Log(os.open(results, os.O_WRONLY | os.O_CREAT, 0o600))
    first = log.append(torch.ones(2))
    os.close(log.fd)
    with pytest.raises(OSError):
        log.append(torch.zeros(3))
    assert torch.equal(supervisor.receive_record(results, first), torch.ones(2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.bin"]


def test_channel_refuses_oversized_files(tmp_path, monkeypatch):
    monkeypatch.setattr(channel, "MAX_FILE_BYTES", 1000)
    (tmp_path / "big.pt").write_bytes(channel.encode(torch.zeros(1000)))
    with pytest.raises(channel.ChannelError, match="limit"):
        supervisor.receive(tmp_path / "big.pt")


def test_judge_exception_becomes_an_internal_error_verdict():
    def broken(calls, outcomes):
        raise KeyError("oops")

    check = Check("broken judge", [Call((3,))], broken)
    verdict = verdicts.judge(check, [Outcome(output=torch.ones(3))])
    assert isinstance(verdict, Verdict) and not verdict.passed
    assert "internal grader error" in verdict.message and "KeyError" in verdict.message


# --------------------------------------------------------------------------- static rules


def test_static_scan_follows_helpers_and_imports():
    src = (
        "import attnmask as am\n"
        "from torch.nn.functional import scaled_dot_product_attention as sdpa\n"
        "def helper(x):\n    return am.causal_mask(x)\n"
        "def causal_mask(n):\n    return helper(n)\n"
        "def attention(q, k, v, mask=None):\n    return sdpa(q, k, v), None\n"
        "def padding_mask(lengths, max_len):\n    return lengths\n"
    )
    cell = submission.Cell("x.py", 1, src)
    tree = submission.parse(src)
    found = {f.exercise: f for f in rules.scan_trees([(tree, cell.label, 0)], ["causal_mask", "attention",
                                                                                "padding_mask"])}
    assert set(found) == {"causal_mask", "attention"}
    assert found["causal_mask"].what == "attnmask" and "line 1" in found["causal_mask"].where
    assert found["attention"].what == "scaled_dot_product_attention"


def test_worker_environment_is_scrubbed(monkeypatch, tmp_path):
    from grader.sandbox.limits import worker_env

    monkeypatch.setenv("GRADER_SEED", "7")
    monkeypatch.setenv("GITHUB_TOKEN", "secret")
    env = worker_env(tmp_path)
    assert "GRADER_SEED" not in env and "GITHUB_TOKEN" not in env
    assert env["TMPDIR"] == str(tmp_path) and env["PYTHONHASHSEED"] == "0"


@pytest.mark.slow
def test_not_found_exercises_say_so(hostile):
    import ast

    _, results, _ = hostile
    defined = {n.name for n in ast.parse((SUBMISSIONS / "hostile.py").read_text()).body
               if isinstance(n, ast.FunctionDef)}
    statuses = results["extra_data"]["status"]
    assert {name for name, status in statuses.items() if status == NOT_FOUND} == set(statuses) - defined


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the worker's CUDA path)")
def test_cuda_checks_run_in_the_worker():
    """On a GPU machine the CUDA checks run (no address-space limit to break CUDA) and count."""
    report = engine.grade(SUBMISSIONS / "correct.py", exercises=["causal_mask", "attention"])
    for e in report.exercises:
        cuda = [c for c in e.checks if "CUDA" in c.name]
        assert cuda and all(c.passed and not c.skipped for c in cuda), (e.name, [c.message for c in cuda])
        assert e.status == PASSED
