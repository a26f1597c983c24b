"""The worker zygote (grader.sandbox.zygote) inside bubblewrap: workers forked from it
look like fresh interpreters, run in namespaces of their own, see nothing of the grader's
side, and die with the grading that asked for them."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from grader.sandbox import allowlist, bubblewrap, namespaces, procs, supervisor, zygote
from grader.sandbox.limits import worker_env
from grader.sandbox.worker import Job
from grader.submission import Cell

pytestmark = pytest.mark.skipif(not hasattr(os, "fork") or not Path("/proc").is_dir()
                                or not bubblewrap.available(),
                                reason="the zygote forks inside bubblewrap; these checks read /proc")

# Facts about the process the student's code runs in, printed as JSON by the student's cell
# (assignments: a submission's top-level expressions are not run).
COURSE_DIR = Path(__file__).resolve().parents[1]
PRIVATE = ("attnmask", "grader.checks", "grader.engine", "grader.diagnose")
FACTS = r'''
import json, os, signal, sys, tempfile
_ = print(json.dumps({
    "signals": [repr(signal.getsignal(getattr(signal, n)))
                for n in ("SIGPIPE", "SIGCHLD", "SIGINT", "SIGTERM")],
    "modules": sorted(m for m in sys.modules if m.split(".")[0] == "attnmask" or m.startswith(PRIVATE)),
    "env": dict(os.environ),
    "cwd": os.getcwd(),
    "tempdir": tempfile.gettempdir(),
    "sid_is_pid": os.getsid(0) == os.getpid(),
    "uid": os.getuid(),
    "pid": os.getpid(),
    "visible": [p for p in VISIBLE if os.path.lexists(p)],
    # the course's folder may exist as the mount point of a venv inside it (its .venv), never with content
    "course": sorted(n for n in (os.listdir(COURSE) if os.path.isdir(COURSE) else [])
                     if not os.path.exists(os.path.join(COURSE, n, "pyvenv.cfg"))),
    "top": sorted(os.listdir("/")),
    "hash_seed": hash("attention"),
    "safe_path": bool(getattr(sys.flags, "safe_path", True)),
    "no_user_site": bool(sys.flags.no_user_site),
    "cpus": sorted(os.sched_getaffinity(0)),
    "fds": {f: os.readlink(f"/proc/self/fd/{f}") for f in os.listdir("/proc/self/fd")
            if os.path.exists(f"/proc/self/fd/{f}")},
}))
'''.replace("PRIVATE", repr(PRIVATE)).replace("COURSE", repr(str(COURSE_DIR))).replace(
    "VISIBLE", repr([*(str(COURSE_DIR / part) for part in
                       ("attnmask", "grader", "solutions", "exercises", "book", "tests", "README.md")),
                     "/run/grader/shared/server.sock", "/run/lock", "/var"]))


@pytest.fixture(scope="module")
def zyg():
    z = zygote.Zygote()
    assert z.wait_ready(), "the zygote did not start"
    yield z
    z.close()


def _spawn(z: zygote.Zygote, tmp: Path, cells: list[Cell], monkeypatch=None
           ) -> tuple[zygote.Forked, int, Path]:
    w = supervisor.Worker(tmp, z, confined=True)
    assert w.start() is None, "the zygote refused a grading's request"
    w.send(Job(cells=cells, exercises=[], cell_budget=20, exercise_budget=20))
    return w.proc, w.status, tmp


def _named(comm: str) -> list[int]:
    """Live processes named ``comm`` (prctl PR_SET_NAME), seen from here."""
    found = []
    for pid in procs.pids():
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == comm and procs.stat_fields(pid)[:1] not in (["Z"], ["X"]):
                    found.append(pid)
        except OSError:
            pass
    return found


def _status(fd: int) -> str:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks).decode()


def test_a_forked_worker_looks_like_a_fresh_one_and_sees_nothing_of_the_grader(zyg, tmp_path, monkeypatch):
    monkeypatch.setenv("GRADER_SEED", "12345")  # a secret the grading has: the worker must not see it
    proc, status, tmp = _spawn(zyg, tmp_path, [Cell("facts.py", 1, FACTS)], monkeypatch)
    assert proc.wait(timeout=60) == 0
    lines = _status(status).split("\n")
    assert lines[0].startswith("ready ") and any(line.startswith("loaded ") for line in lines)
    facts = json.loads((tmp / "stdout.txt").read_text().strip().splitlines()[-1])
    assert facts["modules"] == [], "the reference or the checks are in the worker's memory"
    # Without CUDA the worker also sets TRITON_INTERPRET=1, for chapter 13's kernels (worker.py).
    interpret = {} if torch.cuda.is_available() else {"TRITON_INTERPRET": "1"}
    assert facts["env"] == {**worker_env(Path(namespaces.WORK)), "HOME": namespaces.HOME,
                            "PYTHONPATH": allowlist.sandbox_pythonpath(), **interpret}
    assert "GRADER_SEED" not in facts["env"] and zygote.ZYGOTE_ENV not in facts["env"]
    assert facts["cwd"] == namespaces.WORK and facts["tempdir"] == namespaces.WORK
    assert facts["uid"] == namespaces.UID and facts["pid"] == 1
    assert facts["visible"] == [] and facts["course"] == [], "the course is visible inside the sandbox"
    python_roots = {Path(p).parts[1] for p in (sys.base_prefix, sys.prefix, os.path.realpath(sys.executable))}
    system = {"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "proc", "dev", "tmp", "run"}
    assert set(facts["top"]) <= system | python_roots, facts["top"]
    assert facts["sid_is_pid"], "a session of its own"
    assert facts["no_user_site"]
    # 0-2, the status pipe, the results file and the job's pipe (the calls come on it after the load;
    # listdir's own descriptor is gone by the time it is checked): nothing of the zygote's (its
    # socket, its control pipe, other gradings' connections) leaked in.
    assert len(facts["fds"]) == 6 and {"0", "1", "2"} <= set(facts["fds"]), facts["fds"]


def test_hash_seed_and_signals_match_a_fresh_interpreter(zyg, tmp_path, monkeypatch):
    """Sets iterate in the same order as in a fresh worker (PYTHONHASHSEED=0); SIGPIPE is ignored
    and SIGCHLD default, as Python sets them at start-up."""
    import subprocess

    proc, status, tmp = _spawn(zyg, tmp_path, [Cell("facts.py", 1, FACTS)], monkeypatch)
    proc.wait(timeout=60)
    _status(status)
    forked = json.loads((tmp / "stdout.txt").read_text().strip().splitlines()[-1])
    code = ("import json, signal; print(json.dumps([hash('attention'), "
            "[repr(signal.getsignal(getattr(signal, n))) "
            "for n in ('SIGPIPE', 'SIGCHLD', 'SIGINT', 'SIGTERM')]]))")
    fresh = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                      env={**os.environ, "PYTHONHASHSEED": "0"}).stdout)
    assert forked["hash_seed"] == fresh[0]
    assert forked["signals"] == fresh[1], "signal dispositions differ from a fresh interpreter's"


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity here")
def test_a_worker_runs_on_the_cores_of_its_grading(zyg, tmp_path, monkeypatch):
    """--pin gives a grading one core; its sandbox, forked by the zygote, must stay on it."""
    mine = os.sched_getaffinity(0)
    core = max(mine)
    os.sched_setaffinity(0, {core})
    try:
        proc, status, tmp = _spawn(zyg, tmp_path, [Cell("facts.py", 1, FACTS)], monkeypatch)
    finally:
        os.sched_setaffinity(0, mine)
    proc.wait(timeout=60)
    _status(status)
    assert json.loads((tmp / "stdout.txt").read_text().strip().splitlines()[-1])["cpus"] == [core]


def test_a_worker_dies_with_the_grading_that_asked_for_it(zyg, tmp_path):
    """Even what it forked into a session of its own (a fork-hopper's start): its pid namespace ends."""
    hang = Cell("hang.py", 1, "import ctypes, os, time\nif os.fork() == 0:\n    os.setsid()\n"
                              "    ctypes.CDLL(None).prctl(15, b'grader-hopper')\n    time.sleep(600)\n"
                              "_ = print(os.getpid(), flush=True)\n_ = time.sleep(600)\n")
    proc, status, tmp = _spawn(zyg, tmp_path, [hang])
    deadline = time.monotonic() + 30
    while not (tmp / "stdout.txt").read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.05)
    while not _named("grader-hopper") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None and _named("grader-hopper")
    proc.conn.close()  # what the kernel does when the grading process dies or is killed
    deadline = time.monotonic() + 10
    while _named("grader-hopper") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _named("grader-hopper"), "the worker's child outlived its grading"
    os.close(status)


def test_a_worker_that_kills_what_it_can_ends_only_its_own_grading(zyg, tmp_path):
    """Process 1 of its own pid namespace: its parent is out of its reach, and the zygote with it."""
    killer = Cell("killer.py", 1, "import os, signal\nfor pid in range(1, 64):\n    try:\n"
                                  "        os.kill(pid, 9)\n    except OSError:\n        pass\n")
    (tmp_path / "a").mkdir()
    proc, status, _ = _spawn(zyg, tmp_path / "a", [killer])
    proc.wait(timeout=60)
    os.close(status)
    assert zyg.proc.poll() is None, "the zygote died"
    (tmp_path / "b").mkdir()
    proc, status, tmp = _spawn(zyg, tmp_path / "b", [Cell("facts.py", 1, FACTS)])
    assert proc.wait(timeout=60) == 0
    _status(status)
    assert json.loads((tmp / "stdout.txt").read_text().strip().splitlines()[-1])["modules"] == []


def test_exit_status_is_reported_like_popen(zyg, tmp_path):
    crash = Cell("crash.py", 1, "import ctypes\n_ = ctypes.string_at(0)\n")
    proc, status, _ = _spawn(zyg, tmp_path, [crash])
    assert proc.wait(timeout=60) == -signal.SIGSEGV
    os.close(status)


def test_a_worker_cannot_reach_the_zygote(zyg, tmp_path):
    """Its socket lies in a folder the worker's namespace covers, by either name."""
    probe = Cell("probe.py", 1, (
        "import socket\n"
        "def probe(path):\n"
        "    try:\n"
        "        s = socket.socket(socket.AF_UNIX)\n"
        "        s.connect(path)\n"
        "        return 'connected'\n"
        "    except Exception as e:\n"
        "        return 'refused ' + type(e).__name__\n"
        f"_ = print([probe(p) for p in ({str(zyg.socket)!r}, '/run/grader/shared/server.sock')],"
        " flush=True)\n"))
    proc, status, tmp = _spawn(zyg, tmp_path, [probe])
    rc = proc.wait(timeout=60)
    said = _status(status)
    out = (tmp / "stdout.txt").read_text() + (tmp / "stderr.txt").read_text()
    assert rc == 0, f"exit {rc}; status {said!r}"
    assert "connected" not in out and out.count("refused ") == 2, out


def test_grading_through_a_class_zygote_gives_the_same_report(zyg, monkeypatch):
    from grader import grade

    target = Path(__file__).resolve().parent / "submissions" / "mistakes.py"
    monkeypatch.delenv(zygote.ZYGOTE_ENV, raising=False)
    own = grade(target, seed=3)
    monkeypatch.setenv(zygote.ZYGOTE_ENV, str(zyg.socket))
    forked = grade(target, seed=3)
    summary = lambda r: [(e.name, e.status, e.score, e.message) for e in r.exercises]  # noqa: E731
    assert summary(forked) == summary(own)
    assert own.isolation["seed_protected"] and forked.isolation["measured"]["uid"] == str(namespaces.UID)


def test_stopping_the_zygote_stops_its_workers(tmp_path):
    z = zygote.Zygote()
    assert z.wait_ready()
    hang = Cell("hang.py", 1, "import time\n_ = time.sleep(600)\n")
    proc, status, _ = _spawn(z, tmp_path, [hang])
    root = z.proc.pid
    assert procs.descendants(root)
    z.close()  # returns: a close that waited on its workers would hang here (pytest's timeout)
    deadline = time.monotonic() + 60  # a wait for the kernel to reap them, not a speed goal
    while procs.descendants(root) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not procs.descendants(root)
    assert not z.socket.exists()
    os.close(status)


def test_a_socket_nobody_serves_is_not_waited_on(tmp_path):
    path = tmp_path / "dead.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))  # bound, never listening: connect is refused at once
    # refused at once; a spawn that waited on the socket would hang here (pytest's timeout)
    assert zygote.spawn(path, stdout=1, stderr=2, status=2, results=2, header={"cwd": str(tmp_path)}) is None
    s.close()


@pytest.mark.parametrize("pending, sent, code", [
    (b"exit 3\n", b"", 3),  # arrived with the "pid" line: a worker that died at once
    (b"", b"exit -11\n", -signal.SIGSEGV),
    (b"ex", b"it 0\n", 0),  # split across reads
    (b"", b"nonsense\n", -signal.SIGKILL),
    (b"", b"", -signal.SIGKILL),  # the minder closed without a word
    (b"rss 1000\n", b"rss 2000\nexit 0\n", 0),  # memory reports before the end
    (b"", b"exit " + b"9" * 5000 + b"\n", -signal.SIGKILL),  # a number no exit code is
    (b"", b"x" * 100_000, -signal.SIGKILL),  # no line of the minder's is this long
])
def test_exit_reports_are_read_whatever_their_framing(pending, sent, code):
    ours, theirs = socket.socketpair()
    proc = zygote.Forked(ours, 1234, None, pending)
    theirs.sendall(sent)
    theirs.close()
    assert proc.wait(timeout=5) == code and proc.poll() == code


@pytest.mark.cuda
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_checks_run_in_a_forked_worker(zyg, monkeypatch):  # pragma: no cover -- GPU only
    """The zygote never touches CUDA, so a worker forked from it can initialise it: on a GPU
    machine the CUDA checks run and count in class mode too."""
    from grader import engine

    monkeypatch.setenv(zygote.ZYGOTE_ENV, str(zyg.socket))
    report = engine.grade(Path(__file__).resolve().parent / "submissions" / "correct.py",
                          exercises=["causal_mask", "attention", "kv_cache_attention"])
    for e in report.exercises:
        cuda = [c for c in e.checks if "CUDA" in c.name]
        assert cuda and all(c.passed and not c.skipped for c in cuda), (e.name, [c.message for c in cuda])
        assert e.status == "passed"


def test_a_long_temporary_folder_still_gives_a_reachable_socket(tmp_path, monkeypatch):
    """A Unix socket's address holds about 108 bytes: under a deep TMPDIR (pytest-xdist's own
    folders come close) the zygote's socket moves to /tmp rather than become unreachable."""
    from grader.sandbox import forkserver

    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    folder = forkserver.socket_folder("grader-zygote-")
    try:
        assert len(os.fsencode(folder / "server.sock")) <= forkserver.SOCKET_PATH_MAX
        assert folder.parent == Path("/tmp") and oct(folder.stat().st_mode & 0o777) == "0o700"
    finally:
        folder.rmdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path.parent))  # short enough: it stays there
    near = forkserver.socket_folder("grader-zygote-")
    try:
        assert near.parent == tmp_path.parent
    finally:
        near.rmdir()
