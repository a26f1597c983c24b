"""Student code cannot change anyone's grade by modifying files.

Layer 1: as root, the worker runs as an unprivileged uid of its own (writes to
the grader, site-packages are refused). Layer 2, always: the grader's files and
the interpreter's start-up hooks are checked after every exercise and restored.

The end-to-end tests grade ``tests/submissions/tamper.py`` with a *copy* of the
grader run by a venv's Python (so "site-packages" is the venv's own): if the
protection failed, only the copy would be changed, never this working tree.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from grader.sandbox import integrity, limits, procs, users

ROOT = Path(__file__).resolve().parent.parent
SUBMISSIONS = Path(__file__).parent / "submissions"
EXERCISES = ("causal_mask", "to_additive", "padding_mask")  # in grading order; to_additive tampers
STUB = "".join(f"def {name}(*args, **kwargs):\n    raise NotImplementedError\n\n" for name in EXERCISES)
TAMPERED_NOTE = "the submission modified the grader's files"


def _tree_bytes(*roots: Path) -> dict[str, bytes]:
    return {str(p.relative_to(r.parent)): p.read_bytes() for r in roots for p in sorted(r.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


class Copy:
    """The grader and attnmask copied to a folder, and a venv (its own site-packages) to run them."""

    def __init__(self, root: Path):
        self.root = root
        for name in ("grader", "attnmask"):
            shutil.copytree(ROOT / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
        # Not --system-site-packages: under a venv that would see the base Python's
        # packages, not this interpreter's. A .pth line puts this interpreter's
        # site-packages (torch, rich, ...) on the copy's path instead, wherever the
        # interpreter came from (venv, conda, system Python).
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True)
        self.python = root / "venv" / "bin" / "python"
        out = subprocess.run([str(self.python), "-c", "import site; print(site.getsitepackages()[0])"],
                             check=True, capture_output=True, text=True).stdout
        self.site = Path(out.strip())
        assert self.site.is_relative_to(root)
        ours = [p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and Path(p).is_dir()]
        (self.site / "outer_site.pth").write_text("".join(f"{p}\n" for p in ours))
        self.runs = 0

    def files(self) -> dict[str, bytes]:
        hooks = {p.name: p.read_bytes() for p in self.site.iterdir() if p.is_file()}
        return {**_tree_bytes(self.root / "grader", self.root / "attnmask"), **hooks}

    def grade(self, submission: Path, *, privdrop: bool) -> tuple[dict, str]:
        self.runs += 1
        out = self.root / f"results{self.runs}.json"
        env = {k: v for k, v in os.environ.items() if k != users.NO_PRIVDROP_ENV}
        env["PYTHONPATH"] = str(self.root)
        if not privdrop:
            env[users.NO_PRIVDROP_ENV] = "1"
        env["COLUMNS"] = "1000"  # the terminal report, one line per paragraph
        args = [a for name in EXERCISES for a in ("--exercise", name)]
        p = subprocess.run([str(self.python), "-m", "grader", str(submission), "--json", str(out),
                            "--verbose", *args],
                           cwd=self.root, env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr
        results = json.loads(out.read_text())
        # What the submission printed is only in the terminal report: results.json leaves it out
        # when hidden cases ran.
        results["terminal"] = p.stdout
        return results, p.stderr


@pytest.fixture(scope="module")
def copy(tmp_path_factory):
    return Copy(tmp_path_factory.mktemp("grader-copy"))


@pytest.fixture(scope="module")
def stub(tmp_path_factory):
    path = tmp_path_factory.mktemp("stub") / "stub.py"
    path.write_text(STUB)
    return path


def _scores(results: dict) -> dict[str, float]:
    return {t["name"].split()[0]: t["score"] for t in results["tests"]}


def _check_afterwards(copy: Copy, stub: Path, before: dict[str, bytes], privdrop: bool) -> None:
    """The files are as they were; a correct submission scores full marks and a stub scores 0."""
    assert copy.files() == before
    correct, _ = copy.grade(SUBMISSIONS / "correct.py", privdrop=privdrop)
    assert correct["score"] == correct["max_score"] > 0
    stubbed, _ = copy.grade(stub, privdrop=privdrop)
    assert stubbed["score"] == 0 and stubbed["max_score"] == correct["max_score"]


@pytest.mark.skipif(os.geteuid() != 0, reason="the worker switches users only when the grader runs as root")
@pytest.mark.slow
def test_as_root_the_worker_cannot_write_the_grader_or_site_packages(copy, stub):
    before = copy.files()
    results, stderr = copy.grade(SUBMISSIONS / "tamper.py", privdrop=True)
    if "student code runs as root" in stderr:
        pytest.skip(f"this machine cannot run the worker as another user: {stderr.strip()}")
    for what in ("checks/__init__.py", "checks/judges.py", "checks/zz_tamper.py", "site-packages .pth"):
        # refused (PermissionError), or not even there: the grader's files are hidden (FileNotFoundError)
        said = re.search(f"tamper {re.escape(what)}: (PermissionError|FileNotFoundError)",
                         results["terminal"])
        assert said, results["terminal"]
    assert TAMPERED_NOTE not in results["output"]
    assert all(t["score"] == t["max_score"] > 0 for t in results["tests"]), _scores(results)
    _check_afterwards(copy, stub, before, privdrop=True)


@pytest.mark.slow
def test_changes_are_restored_and_exercises_after_them_score_zero(copy, stub):
    before = copy.files()
    results, _ = copy.grade(SUBMISSIONS / "tamper.py", privdrop=False)
    for what in ("checks/__init__.py", "checks/judges.py", "checks/zz_tamper.py", "site-packages .pth"):
        assert f"tamper {what}: done" in results["terminal"], results["terminal"]
    assert TAMPERED_NOTE in results["output"]
    for shown in ("grader/checks/judges.py changed", "grader/checks/__init__.py changed",
                  "grader/checks/zz_tamper.py added", "site-packages/zz_grader_tamper.pth added"):
        assert shown in results["output"], shown
    # Every exercise scores 0, the one graded before the change too (when the grader notices depends on
    # timing), each saying why.
    for t in results["tests"]:
        assert t["score"] == 0 and t["max_score"] > 0, t
        assert TAMPERED_NOTE in t["output"], t
    _check_afterwards(copy, stub, before, privdrop=False)


# --------------------------------------------------------------------------- the guard on its own


def _guarded(tmp_path: Path) -> tuple[Path, Path, integrity.Guard]:
    pkg, hooks = tmp_path / "pkg", tmp_path / "site"
    (pkg / "sub").mkdir(parents=True)
    hooks.mkdir()
    (pkg / "__init__.py").write_text("A = 1\n")
    (pkg / "sub" / "judge.py").write_text("def judge(): return False\n")
    (hooks / "keep.pth").write_text("import os\n")
    (hooks / "torch.py").write_text("not a hook\n")
    return pkg, hooks, integrity.Guard([pkg], [hooks])


def test_guard_restores_changed_removed_and_added_files(tmp_path):
    pkg, hooks, guard = _guarded(tmp_path)
    before = _tree_bytes(pkg) | {p.name: p.read_bytes() for p in hooks.iterdir()}
    (pkg / "__init__.py").write_text("A = 2\n")  # same size: compared by bytes
    os.utime(pkg / "__init__.py", (0, 0))
    (pkg / "sub" / "judge.py").unlink()
    (pkg / "sub" / "judge.py").symlink_to(tmp_path / "elsewhere.py")
    (pkg / "extra.py").write_text("x\n")
    (pkg / "newdir").mkdir()
    (pkg / "__pycache__").mkdir()
    (pkg / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"forged")
    (hooks / "keep.pth").unlink()
    (hooks / "evil.pth").write_text("import os\n")
    (hooks / "sitecustomize.py").write_text("x\n")
    (hooks / "torch.py").write_text("changed, but not watched\n")
    restored, foreign = guard.verify()
    assert not foreign
    assert {str(c) for c in restored} == {
        "pkg/__init__.py changed", "pkg/sub/judge.py changed", "pkg/extra.py added", "pkg/newdir added",
        "site/keep.pth removed", "site/evil.pth added", "site/sitecustomize.py added"}
    after = _tree_bytes(pkg) | {p.name: p.read_bytes() for p in hooks.iterdir()}
    assert after == before | {"torch.py": b"changed, but not watched\n"}
    assert not (pkg / "sub" / "judge.py").is_symlink()
    assert not (pkg / "__pycache__" / "x.cpython-311.pyc").exists()
    assert guard.verify() == ([], [])
    (hooks / "again.pth").write_text("import os\n")  # the folder changed already: still looked at
    assert [str(c) for c in guard.verify()[0]] == ["site/again.pth added"]


def test_guard_restores_a_package_folder_replaced_by_a_link(tmp_path):
    pkg, _, guard = _guarded(tmp_path)
    shutil.move(pkg / "sub", tmp_path / "moved")
    (pkg / "sub").symlink_to(tmp_path / "moved")
    (tmp_path / "moved" / "judge.py").write_text("def judge(): return True\n")
    restored, _ = guard.verify()
    assert "pkg/sub/judge.py removed" in {str(c) for c in restored}
    assert (pkg / "sub").is_dir() and not (pkg / "sub").is_symlink()
    assert (pkg / "sub" / "judge.py").read_text() == "def judge(): return False\n"


def test_guard_leaves_alone_what_the_worker_could_not_have_written(tmp_path):
    """A change to a file the worker's uid may not write is someone else's (an edit): left, not blamed."""
    pkg, hooks, guard = _guarded(tmp_path)
    worker = (60999, 60999)
    (pkg / "__init__.py").write_text("A = 3\n")
    restored, foreign = guard.verify(worker)
    assert restored == [] and [str(c) for c in foreign] == ["pkg/__init__.py changed"]
    assert (pkg / "__init__.py").read_text() == "A = 3\n"
    os.chmod(hooks, 0o777)  # now the worker could add a hook there
    guard = integrity.Guard([pkg], [hooks])
    (hooks / "evil.pth").write_text("import os\n")
    restored, foreign = guard.verify(worker)
    assert [str(c) for c in restored] == ["site/evil.pth added"] and foreign == []


def test_guard_of_the_grader_is_small_and_finds_nothing_to_do():
    guard = integrity.Guard.for_grader()
    names = {str(p) for p in guard.files}
    assert any(n.endswith("grader/checks/judges.py") for n in names)
    assert any(n.endswith("attnmask/__init__.py") for n in names)
    assert len(guard.files) < 200
    assert guard.verify() == ([], [])


# --------------------------------------------------------------------------- the worker's user


def test_unreachable_names_the_folder_that_cannot_be_entered():
    with tempfile.TemporaryDirectory() as top:  # in /tmp itself: every folder above it can be entered
        top = Path(top)
        closed = top / "closed"
        (closed / "inside").mkdir(parents=True)
        (closed / "inside" / "mod.py").write_text("x = 1\n")
        (top / "open.py").write_text("x = 1\n")
        os.chmod(top, 0o755)
        os.chmod(closed, 0o700)
        os.chmod(top / "open.py", 0o600)
        uid = os.getuid() + 1 if os.getuid() else 60999  # anyone but the owner
        found = users.unreachable(uid, uid, [(closed / "inside" / "mod.py", 4), (top / "open.py", 4),
                                               (top / "missing.py", 4), (top, 5)])
        assert found == [f"{closed / 'inside' / 'mod.py'} (cannot enter {closed})",
                         f"{top / 'open.py'} (mode -rw-------)"]


def test_results_the_worker_writes_are_read_only_as_plain_files(tmp_path):
    from grader.sandbox import channel, supervisor

    target = tmp_path / "secret.pt"
    target.write_bytes(channel.encode([1, 2]))
    assert supervisor.receive(target) == [1, 2]
    (tmp_path / "link.pt").symlink_to(target)
    os.mkfifo(tmp_path / "fifo.pt")  # opening it for reading would block a naive reader forever
    for name in ("link.pt", "fifo.pt", "missing.pt"):
        with pytest.raises(channel.ChannelError):
            supervisor.receive(tmp_path / name)


def test_a_worker_never_sees_the_real_home(tmp_path):
    env = limits.worker_env(tmp_path)
    assert env["HOME"] == str(tmp_path)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can switch users")
def test_a_claimed_uid_is_this_gradings_alone_and_its_processes_are_killed():
    if os.environ.get(users.NO_PRIVDROP_ENV, "") not in ("", "0"):
        pytest.skip(f"{users.NO_PRIVDROP_ENV} is set")
    a, b = users.claim_user(), users.claim_user()
    if a is None:
        pytest.skip("this machine cannot run the worker as another user")
    try:
        assert b is not None and a.uid != b.uid
        for user in (a, b):
            with pytest.raises(KeyError):
                pwd.getpwuid(user.uid)
        # A process of a's uid in its own session (as a double-forked daemon would be) is killed on release.
        child = subprocess.Popen(["sleep", "300"], user=a.uid, group=a.gid, extra_groups=[],
                                 start_new_session=True)
        a.release()
        assert child.wait(timeout=10) == -9
        assert procs.processes_of(a.uid) == []
    finally:
        a.release()
        if b is not None:
            b.release()


def test_mode_bits_decide_who_may_write(tmp_path):
    f = tmp_path / "f"
    f.write_text("x")
    os.chmod(f, 0o644)
    st = os.stat(f)
    assert integrity.writable_by(st, st.st_uid, st.st_gid) and not integrity.writable_by(st, 60999, 60999)
    os.chmod(f, 0o646)
    assert integrity.writable_by(os.stat(f), 60999, 60999)
    assert integrity.writable_by(os.stat(f), 0, 0)
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o646
