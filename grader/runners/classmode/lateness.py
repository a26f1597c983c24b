"""Due dates, extensions and the late policy: the one place where lateness costs points.

The policy is one string, ``--late-policy``, stated back in words by
:meth:`LatePolicy.describe` wherever grades are shown:

* ``none`` (the default): lateness is recorded, nothing is taken off;
* ``P/day``: P percent of the maximum off per started day late (one second to 24 h after
  the due date is one day, 24 h and one second two: :func:`days_late`, the count grades.csv
  shows);
* ``P/day,cap=C``: the same, never more than C percent in all.

A student's due date is the roster's ``due`` column when it has one, else ``--due``, plus
the roster's ``extension_days``. When they handed in is the roster's ``submitted`` column: the
platform's time (Classroom 50's submission Release, which ``python -m grader repos tags`` writes
there; an LMS's upload time). Without it, the time of the last commit when the submission is a
git clone, else the newest modification time of its files (a copy keeps it only with ``cp -p``
or ``rsync -t``): both are set by the student's own machine. Such a claim is recorded and shown
(grades.csv's ``submitted_from`` says whose time it is: :data:`CLAIMS`) but it counts for no
lateness unless the instructor says to trust it (``--trust-student-dates``): a commit backdated
by its author would otherwise make them on time while a classmate who handed in with them, and
dated their commit honestly, is late. The class report counts those rows.
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

DAY = 86400.0


@dataclass(frozen=True)
class LatePolicy:
    per_day: float = 0.0  # percent of the maximum per started day late
    cap: float | None = None  # percent of the maximum, in all

    @classmethod
    def parse(cls, text: str | None) -> LatePolicy:
        t = (text or "none").strip().lower().replace(" ", "")
        if t in ("none", "0", ""):
            return cls()
        m = re.fullmatch(r"(\d+(?:\.\d+)?)%?/day(?:,cap=(\d+(?:\.\d+)?)%?)?", t)
        if not m:
            raise SystemExit(f"--late-policy must be none, P/day or P/day,cap=C (percent of the maximum), "
                             f"e.g. 10/day,cap=50; got {text!r}.")
        per_day, cap = float(m.group(1)), (float(m.group(2)) if m.group(2) else None)
        if per_day > 100 or (cap is not None and cap > 100):
            raise SystemExit(f"--late-policy (none, P/day or P/day,cap=C) takes percentages of at most 100; "
                             f"got {text!r}.")
        return cls(per_day, cap)

    def describe(self) -> str:
        if not self.per_day:
            return "late policy: none (lateness is recorded; no points are taken off)"
        cap = f", at most {self.cap:g}% in all" if self.cap is not None else ""
        return f"late policy: {self.per_day:g}% of the maximum off per started day late{cap}"

    def penalty(self, days_late: int, max_points: float) -> float:
        """Points off for ``days_late`` started days (:func:`days_late`; 0 when on time)."""
        if days_late <= 0 or not self.per_day:
            return 0.0
        percent = self.per_day * days_late
        if self.cap is not None:
            percent = min(percent, self.cap)
        return round(max_points * min(percent, 100.0) / 100, 2)


def parse_time(text: str, what: str) -> datetime:
    """ISO 8601 -> an aware datetime (a time without a zone is taken as UTC)."""
    try:
        t = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise SystemExit(f"{what} must be a date and time in ISO 8601, e.g. 2026-12-01T23:59:00+01:00; "
                         f"got {text!r}.") from None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


#: git's configuration, fixed on the command line (``-c`` wins over every file git reads): no
#: key of the student's ``.git/config`` may make git run a program. git verifies a signature
#: with ``gpg.program`` (or its ssh and x509 twins), asks ``core.fsmonitor``, runs hooks from
#: ``core.hooksPath`` and pipes through ``core.pager``; here each is off or a no-op.
GIT_SAFE_CONFIG = ("core.hooksPath=/dev/null", "core.fsmonitor=false", "core.pager=cat",
                   "gpg.program=false", "gpg.ssh.program=false", "gpg.x509.program=false",
                   "log.showSignature=false", "safe.directory=*", "core.sshCommand=false",
                   "credential.helper=")
#: Seconds git may take; a FIFO or a huge pack planted in .git costs this student this, no more.
GIT_TIMEOUT = 10.0


def git_env(git_dir: Path) -> dict[str, str]:
    """The whole environment of a git run on a student's repository: nothing of ours (no
    ``GRADER_SEED``, no token, no HOME), no system or user configuration, no pager, no prompt."""
    return {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "LC_ALL": "C",
            "GIT_DIR": str(git_dir), "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null",
            "GIT_CONFIG_SYSTEM": "/dev/null", "GIT_PAGER": "cat", "PAGER": "cat", "GIT_TERMINAL_PROMPT": "0",
            "GIT_OPTIONAL_LOCKS": "0", "GIT_NO_REPLACE_OBJECTS": "1", "GIT_ASKPASS": "/bin/false"}


def last_commit_time(path: Path) -> datetime | None:
    """The committer time of HEAD in ``path/.git``, read by git under :data:`GIT_SAFE_CONFIG` and
    :func:`git_env`, or None. Only a real ``.git`` folder counts: a ``.git`` file or link (which
    points git at another repository) is not followed."""
    git_dir = path / ".git"
    git = shutil.which("git")
    if git is None or git_dir.is_symlink() or not git_dir.is_dir():
        return None
    argv = [git, "--no-pager", "--no-replace-objects"]
    for setting in GIT_SAFE_CONFIG:
        argv += ["-c", setting]
    argv += ["log", "-1", "--no-show-signature", "--format=%ct", "HEAD", "--"]
    try:
        proc = subprocess.run(argv, cwd=git_dir, env=git_env(git_dir.absolute()), stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=GIT_TIMEOUT)
        stamp = proc.stdout.decode("ascii", "replace").strip()[:20]
        if proc.returncode == 0 and stamp.isdigit():
            return datetime.fromtimestamp(int(stamp), timezone.utc)
    except (OSError, subprocess.SubprocessError, ValueError, OverflowError):
        pass
    return None


#: Where a hand-in time came from (grades.csv's ``submitted_from``): the platform's, or the student's claim.
FROM_ROSTER = "roster (the platform's time)"
FROM_COMMIT = "last commit's date (the student's claim)"
FROM_FILES = "file times (the student's claim)"
CLAIMS = (FROM_COMMIT, FROM_FILES)
#: How an uncounted claim reads in grades.csv's ``submitted_from``.
NOT_COUNTED = "; not counted: no platform time (--trust-student-dates counts it)"


def uncounted(source: str) -> str:
    """``submitted_from`` for a claim that no lateness was counted from."""
    return source + NOT_COUNTED


def is_claim(source: str | None) -> bool:
    """True when ``submitted_from`` names a time the student wrote, counted or not."""
    return bool(source) and source.removesuffix(NOT_COUNTED) in CLAIMS


def submitted_from(path: Path | None) -> tuple[datetime | None, str]:
    """When a submission was handed in as far as its files tell, and where that came from."""
    if path is None or not path.exists():
        return None, ""
    if path.is_dir() and not path.is_symlink():
        when = last_commit_time(path)
        if when is not None:
            return when, FROM_COMMIT
    files = [path] if path.is_file() else [f for f in path.rglob("*")
                                           if f.is_file() and ".git" not in f.parts]
    stamps = [f.stat().st_mtime for f in files]
    return (datetime.fromtimestamp(max(stamps), timezone.utc), FROM_FILES) if stamps else (None, "")


def submitted_at(path: Path | None) -> datetime | None:
    """When a submission was handed in, as far as its files tell (see the module docstring)."""
    return submitted_from(path)[0]


def due_for(due: datetime | None, own_due: str | None, extension_days: float) -> datetime | None:
    base = parse_time(own_due, "the roster's due column") if own_due else due
    return None if base is None else base + timedelta(days=extension_days)


def days_late(submitted: datetime | None, due: datetime | None) -> int:
    """Started days late: 0 on time, 1 from one second after the due date to 24 h after it, 2
    from 24 h and one second. The one rule of rounding lateness: grades.csv's ``days_late`` is
    this count, the unit the penalty is counted in."""
    if submitted is None or due is None or submitted <= due:
        return 0
    return math.ceil((submitted - due).total_seconds() / DAY)
