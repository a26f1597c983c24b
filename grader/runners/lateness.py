"""Due dates, extensions and the late policy: the one place where lateness costs points.

The policy is one string, ``--late-policy``, stated back in words by
:meth:`LatePolicy.describe` wherever grades are shown:

* ``none`` (the default): lateness is recorded, nothing is taken off;
* ``P/day``: P percent of the maximum off per started day late (24 h after the due date
  is one day, 24 h and one second two);
* ``P/day,cap=C``: the same, never more than C percent in all.

A student's due date is the roster's ``due`` column when it has one, else ``--due``, plus
the roster's ``extension_days``. When they handed in is the roster's ``submitted`` column,
else the time of the last commit when the submission is a git clone, else the newest
modification time of its files (a copy keeps it only with ``cp -p`` or ``rsync -t``). A commit time is
set by the student's own machine: the grader trusts it as GitHub Classroom's own deadline
view does not; check a surprising one against the push time in GitHub's UI.
"""

from __future__ import annotations

import math
import re
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

    def penalty(self, days_late: float, max_points: float) -> float:
        """Points off for ``days_late`` days (0 when on time)."""
        if days_late <= 0 or not self.per_day:
            return 0.0
        percent = self.per_day * math.ceil(days_late - 1e-9)
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


def submitted_at(path: Path | None) -> datetime | None:
    """When a submission was handed in, as far as its files tell (see the module docstring)."""
    if path is None or not path.exists():
        return None
    if path.is_dir() and (path / ".git").exists():
        try:
            proc = subprocess.run(["git", "-C", str(path), "log", "-1", "--format=%ct"], capture_output=True,
                                  text=True, timeout=30)
            if proc.returncode == 0 and proc.stdout.strip():
                return datetime.fromtimestamp(int(proc.stdout.strip()), timezone.utc)
        except (OSError, subprocess.SubprocessError, ValueError):
            pass
    files = [path] if path.is_file() else [f for f in path.rglob("*")
                                           if f.is_file() and ".git" not in f.parts]
    stamps = [f.stat().st_mtime for f in files]
    return datetime.fromtimestamp(max(stamps), timezone.utc) if stamps else None


def due_for(due: datetime | None, own_due: str | None, extension_days: float) -> datetime | None:
    base = parse_time(own_due, "the roster's due column") if own_due else due
    return None if base is None else base + timedelta(days=extension_days)


def days_late(submitted: datetime | None, due: datetime | None) -> float:
    if submitted is None or due is None:
        return 0.0
    return max(0.0, (submitted - due).total_seconds() / DAY)
