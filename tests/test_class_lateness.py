"""When a student handed in, read from their own ``.git`` without running anything of theirs.

A submission folder may carry a ``.git`` of the student's making (an LMS zip, an upload).
Its ``config`` can name programs git runs: ``gpg.program`` (to verify a signed commit,
when ``log.showSignature`` asks), ``core.fsmonitor``, ``core.hooksPath``, ``core.pager``.
Class mode runs as root with the seed in its environment; the git it runs to date a
submission must run none of them and see none of ours.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from grader.runners.classmode import classroom, lateness

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")

WHEN = 1772366400  # 2026-03-01T12:00:00Z, the signed commit's committer time
SEED = "271828182845904523536"


def _git(repo: Path, *args: str, stdin: bytes | None = None) -> str:
    env = {"PATH": os.environ["PATH"], "HOME": str(repo.parent), "GIT_CONFIG_NOSYSTEM": "1"}
    done = subprocess.run(["git", "-C", str(repo), *args], input=stdin, capture_output=True, env=env,
                          check=True)
    return done.stdout.decode().strip()


def hostile_repo(folder: Path, marker: Path) -> Path:
    """A student folder whose .git has one signed commit and a config that names ``evil.sh``
    (which writes ``marker`` and its environment) as every program git may run."""
    folder.mkdir(parents=True)
    (folder / "ex.py").write_text("def causal_mask(n):\n    return None\n")
    evil = folder.parent / "evil.sh"
    evil.write_text(f"#!/bin/sh\nenv > {marker}\necho ran \"$@\" >> {marker}\ncat >/dev/null\n")
    evil.chmod(0o755)
    hooks = folder.parent / "hooks"
    hooks.mkdir()
    for hook in ("post-checkout", "pre-commit", "post-index-change", "reference-transaction"):
        shutil.copy(evil, hooks / hook)
    _git(folder, "init", "-q")
    _git(folder, "add", "ex.py")
    tree = _git(folder, "write-tree")
    who = f"S <s@example.org> {WHEN} +0000"
    signed = (f"tree {tree}\nauthor {who}\ncommitter {who}\n"
              "gpgsig -----BEGIN PGP SIGNATURE-----\n \n iQEzBAABCAAdFiEEAAAAAAAAAAAAAAAAAAAAAAAAAAAFAmAA\n"
              " =AAAA\n -----END PGP SIGNATURE-----\n\nhand in\n")
    sha = _git(folder, "hash-object", "-t", "commit", "-w", "--stdin", stdin=signed.encode())
    _git(folder, "update-ref", "HEAD", sha)
    for key, value in (("gpg.program", evil), ("gpg.format", "openpgp"), ("log.showSignature", "true"),
                       ("core.fsmonitor", evil), ("core.hooksPath", hooks), ("core.pager", evil),
                       ("gpg.ssh.program", evil), ("gpg.x509.program", evil)):
        _git(folder, "config", key, str(value))
    return folder


@pytest.fixture
def attack(tmp_path, monkeypatch):
    marker = tmp_path / "MARKER"
    folder = hostile_repo(tmp_path / "subs" / "mallory", marker)
    monkeypatch.setenv("GRADER_SEED", SEED)
    return folder, marker


def test_the_attack_is_real_for_a_git_run_as_before(attack):
    """Without the fixed configuration, git runs the student's gpg.program, seed in its environment."""
    folder, marker = attack
    subprocess.run(["git", "-C", str(folder), "log", "-1", "--format=%ct"], capture_output=True,
                   env=dict(os.environ, GIT_CONFIG_NOSYSTEM="1", HOME=str(folder.parent)), timeout=30)
    assert marker.exists() and SEED in marker.read_text()


def test_the_commit_time_is_read_and_nothing_of_the_students_runs(attack):
    folder, marker = attack
    assert lateness.submitted_at(folder) == datetime.fromtimestamp(WHEN, timezone.utc)
    assert not marker.exists()


def test_no_variable_of_ours_reaches_git(attack, tmp_path, monkeypatch):
    """The seed, a token, HOME: the git child gets the fixed environment of lateness.git_env only."""
    folder, marker = attack
    record = tmp_path / "git-env"
    wrapper = tmp_path / "bin" / "git"
    wrapper.parent.mkdir()
    wrapper.write_text(f"#!/bin/sh\nenv > {record}\nexec {shutil.which('git')} \"$@\"\n")
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{wrapper.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("GH_TOKEN", "ghp_secret")
    assert lateness.submitted_at(folder) == datetime.fromtimestamp(WHEN, timezone.utc)
    seen = record.read_text()
    assert "GIT_CONFIG_NOSYSTEM=1" in seen  # the wrapper saw the real call
    assert SEED not in seen and "GRADER_SEED" not in seen and "ghp_secret" not in seen
    assert not marker.exists()


def test_a_git_file_pointing_elsewhere_is_not_followed(tmp_path):
    """``.git`` as a file (``gitdir: /other/repo``) would date the submission by another repository."""
    other = hostile_repo(tmp_path / "other" / "repo", tmp_path / "MARKER")
    folder = tmp_path / "subs" / "eve"
    folder.mkdir(parents=True)
    (folder / "ex.py").write_text("x = 1\n")
    os.utime(folder / "ex.py", (1_700_000_000, 1_700_000_000))
    (folder / ".git").write_text(f"gitdir: {other}/.git\n")
    assert lateness.submitted_at(folder) == datetime.fromtimestamp(1_700_000_000, timezone.utc)


FAKE = r'''
import json, sys
from pathlib import Path
Path(sys.argv[2]).write_text(json.dumps({"score": 3, "max_score": 3, "tests": [
    {"name": "causal_mask (chapter 1)", "score": 3, "max_score": 3, "output": "ok"}]}))
'''


def test_class_mode_with_a_due_date_runs_nothing_of_the_students(attack, tmp_path):
    folder, marker = attack
    script = tmp_path / "fake_grader.py"
    script.write_text(FAKE)
    due = datetime.fromtimestamp(WHEN, timezone.utc) - timedelta(seconds=1)
    def command(sub, res, seed, extra):
        return [sys.executable, str(script), str(sub), str(res)]

    code = classroom.main([str(folder.parent), "--out", str(tmp_path / "out"), "--seed", "1", "--no-progress",
                           "--no-report", "--due", due.isoformat(), "--late-policy", "10/day",
                           "--trust-student-dates"],
                          command=command, exercises=("causal_mask",))
    assert code == 0
    grades = (tmp_path / "out" / "grades.csv").read_text()
    assert ",1,2026-03-01T12:00:00+00:00," in grades  # one second late: one started day, from the commit
    assert not marker.exists()
