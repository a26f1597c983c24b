"""The user a grading's student code runs as, when the grader is root.

:func:`claim_user` picks a uid no account has, held for the grading (an abstract
socket named after it), and :meth:`User.release` kills every process left
running as it at the end, so student code cannot write the grader's files,
site-packages or another student's worker. If Python itself is not readable by
such a user (installed under /root), the worker keeps just CAP_DAC_READ_SEARCH;
if that is not available either, the worker runs as root and says so once on
stderr. ``GRADER_NO_PRIVDROP=1`` turns this off for debugging.
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import rules
from . import confine
from .limits import note
from .procs import processes_of

#: Set (to anything but 0) to run workers as the grader's own user even when it is root: for debugging.
NO_PRIVDROP_ENV = "GRADER_NO_PRIVDROP"
#: uids for workers when the grader is root, one per grading, none of them an account's: the gap systemd
#: leaves between systemd-homed's users (60001-60513) and DynamicUser= (61184-65519).
SANDBOX_UIDS = range(60600, 61100)
_CAP_DAC_READ_SEARCH = 2
_mode: list[bool | None] = []  # decided once per process: None (no switch), or whether to keep the cap


@dataclass
class User:
    """The unprivileged user a grading's workers run as; its uid is this grading's alone."""

    uid: int
    keep_read: bool  # keep CAP_DAC_READ_SEARCH: Python's own files are not readable by an ordinary user
    lock: socket.socket  # an abstract socket named after the uid: held while grading, freed if we die
    dropped: bool = True  # every worker so far said it switched
    hidden: bool | None = None  # every worker so far hid the course (sandbox.confine); None: none said

    @property
    def gid(self) -> int:
        return self.uid

    @property
    def arg(self) -> str:
        return f"{self.uid}:{self.gid}:{int(self.keep_read)}"

    @property
    def writer(self) -> tuple[int, int] | None:
        """Who student code ran as, for :meth:`grader.sandbox.integrity.Guard.verify` (None: as us)."""
        return (self.uid, self.gid) if self.dropped else None

    def release(self) -> None:
        """Kill whatever still runs as our uid (double-forked children included), free the uid."""
        kill_uid(self.uid)
        self.lock.close()


def claim_user() -> User | None:
    """A user for this grading's workers, or None: they run as the grader (not root, or not possible)."""
    if not _mode:
        _mode.append(_decide_mode())
    if _mode[0] is None:
        return None
    import grp
    import pwd

    start = os.getpid() % len(SANDBOX_UIDS)
    for k in range(len(SANDBOX_UIDS)):
        uid = SANDBOX_UIDS[(start + k) % len(SANDBOX_UIDS)]
        try:
            pwd.getpwuid(uid)
            continue  # an account: its files would be the student's to write
        except KeyError:
            pass
        try:
            grp.getgrgid(uid)
            continue
        except KeyError:
            pass
        lock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            lock.bind(f"\0grader-worker-uid-{uid}")
        except OSError:
            lock.close()
            continue  # another grading holds it
        kill_uid(uid)  # left behind by a grading that was killed before it could clean up
        return User(uid, _mode[0], lock)
    note(f"all of the worker uids {SANDBOX_UIDS.start}-{SANDBOX_UIDS.stop - 1} are in use: student code runs "
         "as root this time, and only the integrity check protects the grader's files")
    return None


def _decide_mode() -> bool | None:
    if os.environ.get(NO_PRIVDROP_ENV, "") not in ("", "0"):
        return None
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        return None  # not root: the worker cannot be anyone less than us
    blocked = unreachable(SANDBOX_UIDS.start, SANDBOX_UIDS.start)
    if not blocked:
        return False
    if _has_capability(_CAP_DAC_READ_SEARCH):
        return True
    note(f"student code runs as root: an unprivileged user could not read {blocked[0]} to run Python, "
         "and CAP_DAC_READ_SEARCH is not available; only the integrity check protects the grader's files")
    return None


def _permits(st: os.stat_result, uid: int, gid: int, bits: int) -> bool:
    """Whether ``uid``/``gid`` (no other groups) have all of ``bits`` (4 r, 2 w, 1 x) on ``st``."""
    shift = 6 if st.st_uid == uid else 3 if st.st_gid == gid else 0
    return (st.st_mode >> shift) & bits == bits


def unreachable(uid: int, gid: int, paths: list[tuple[Path, int]] | None = None) -> list[str]:
    """What a worker needs (Python, the standard library, site-packages, torch, the grader) that
    ``uid`` could not read, as "PATH (why)"; ``paths`` replaces the list, as (path, bits) pairs."""
    if paths is None:
        import importlib.util

        paths = [(Path(sys.executable), 5), (Path(os.path.realpath(sys.executable)), 5),
                 (Path(os.__file__), 4), (Path(__file__), 4), (Path(__file__).with_name("worker.py"), 4)]
        for key in ("stdlib", "platstdlib", "purelib", "platlib"):
            paths.append((Path(sysconfig.get_path(key)), 5))
        paths.append((Path(sysconfig.get_path("platstdlib")) / "lib-dynload", 5))
        spec = importlib.util.find_spec("torch")
        if spec is not None and spec.origin:
            paths += [(Path(spec.origin), 4), (Path(spec.origin).parent / "lib", 5)]
        paths += [(Path(p), 5) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        paths.append((Path(tempfile.gettempdir()), 1))  # the way to the worker's folders
    blocked = []
    for path, bits in paths:
        path = Path(os.path.abspath(path))
        try:
            st = os.stat(path)
        except OSError:
            continue  # not there: not needed
        for folder in reversed(path.parents):
            if not _permits(os.stat(folder), uid, gid, 1):
                blocked.append(f"{path} (cannot enter {folder})")
                break
        else:
            if not _permits(st, uid, gid, bits):
                blocked.append(f"{path} (mode {stat.filemode(st.st_mode)})")
    return blocked


def _has_capability(cap: int) -> bool:
    try:
        with open("/proc/self/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return all(int(fields[k].strip(), 16) >> cap & 1 for k in ("CapEff", "CapBnd"))
    except (OSError, KeyError, ValueError):
        return False


def kill_uid(uid: int) -> None:
    """SIGKILL every process running as ``uid``, until none is left (one that forks is caught next round)."""
    for _ in range(200):
        pids = processes_of(uid)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.002)


def isolation(user: User | None) -> dict[str, Any]:
    """What kept the seed and the reference answers from student code in this grading."""
    if user is None or not user.dropped:
        why = ("student code ran as the grader's own user (the grader is not root, or it could not switch): "
               "it could read the seed from the grader's environment and the reference answers from the "
               "course's files. Run the grader as root (sudo -E) so that student code runs as a user of "
               "its own; see the instructor guide, 'Keeping the hidden cases hidden'.")
        return {"seed_protected": False, "references_protected": False, "why": why}
    if user.hidden:
        caveat = ("" if not user.keep_read else
                  "student code kept CAP_DAC_READ_SEARCH (Python is installed where only root can read it), "
                  "which a determined submission could use to open hidden files by handle "
                  "(open_by_handle_at); install Python where every user can read it to close that")
        return {"seed_protected": True, "references_protected": True, "why": "", **(
            {"caveat": caveat} if caveat else {})}
    why = ("student code ran as a user of its own, but the course's files could not be hidden from it "
           "(no mount namespace: the container lacks CAP_SYS_ADMIN)")
    if user.keep_read:
        return {"seed_protected": False, "references_protected": False,
                "why": why + ", and it could read every file (Python is installed where only root can read "
                             "it, so the worker kept CAP_DAC_READ_SEARCH)"}
    answers = rules.reference_folders(confine.private_paths())  # attnmask/ and solutions/
    blocked = {p.split(" (")[0] for p in unreachable(user.uid, user.gid, [(Path(p), 5) for p in answers])}
    readable = [p for p in answers if p not in blocked]
    if readable:
        return {"seed_protected": True, "references_protected": False,
                "why": why + f"; it could read {readable[0]} (make it unreadable to other users: "
                             "chmod -R go-rwx)"}
    return {"seed_protected": True, "references_protected": True, "why": ""}
