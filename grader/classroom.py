"""Class mode: grade a whole class in parallel, and GitHub Classroom outputs.

``python -m grader class SUBMISSIONS_DIR`` treats every sub-folder (or single
``.ipynb`` / ``.py`` file) of SUBMISSIONS_DIR as one student and grades them in
a pool of workers. Each student is graded by the engine's CLI (the arguments of
``python -m grader SUB --json RESULTS --seed S``), forked from a server process
that has imported torch and the grader once (:class:`Preloaded`), or with
``--no-preload`` in a fresh interpreter. Every grading has its own session, so a
submission that hangs, crashes or floods memory costs only its own row: the
wall-time limit is enforced here by killing the grading's whole process tree.

Outputs in ``--out`` (default ``SUBMISSIONS_DIR/../grader-results``):
``STUDENT/results.json`` (Gradescope format, one per student, also for failures),
``STUDENT/grader.log`` (the grader's own output), ``grades.csv`` and
``manifest.json``, which lets a rerun skip students whose files, seed, options
and grader code have not changed.

``python -m grader.classroom gh-outputs results.json`` turns a results.json into
the base64 ``result`` output that GitHub Classroom's
``autograding-grading-reporter`` action reads; ``python -m grader.classroom
template DEST`` builds the student template repository with its workflow.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import json
import os
import queue
import random
import re
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

#: Files the engine grades; anything else in SUBMISSIONS_DIR is not a student.
SOURCE_SUFFIXES = (".ipynb", ".py")
#: Folders that never belong to a submission's content (editor and VCS debris).
_SKIP_DIRS = {"__pycache__", ".ipynb_checkpoints", ".git"}
MANIFEST_VERSION = 1
DEFAULT_TIMEOUT = 300.0
_PACKAGE_ROOT = Path(__file__).resolve().parent.parent

# A grader command: (submission path, results.json path, seed, extra CLI args) -> argv.
GraderCommand = Callable[[Path, Path, int, Sequence[str]], list[str]]


def engine_args(submission: Path, results: Path, seed: int, extra: Sequence[str]) -> list[str]:
    """Arguments of the engine's CLI, the one stable seam between class mode and the engine."""
    return [str(submission), "--json", str(results), "--seed", str(seed), *extra]


def engine_command(submission: Path, results: Path, seed: int, extra: Sequence[str]) -> list[str]:
    """``python -m grader ARGS``: the engine's CLI in a fresh interpreter."""
    return [sys.executable, "-m", "grader", *engine_args(submission, results, seed, extra)]


# --------------------------------------------------------------------------- students


@dataclass
class Student:
    name: str  # as it appears in grades.csv: folder name or file stem
    path: Path  # the sub-folder or file in SUBMISSIONS_DIR
    slug: str  # safe folder name for OUT/slug/


def _is_hidden(p: Path) -> bool:
    return p.name.startswith(".")


def discover(submissions: Path, out: Path | None = None) -> tuple[list[Student], list[Path]]:
    """Students of SUBMISSIONS_DIR, sorted by name, and the entries that are not students."""
    if not submissions.is_dir():
        raise SystemExit(f"class mode expected a folder of submissions (one sub-folder or notebook per "
                         f"student); got {str(submissions)!r}, which is "
                         f"{'a file' if submissions.exists() else 'missing'}. Pass the folder that holds "
                         f"the students' submissions.")
    entries, ignored = [], []
    out_resolved = out.resolve() if out is not None else None
    for p in sorted(submissions.iterdir()):
        if _is_hidden(p) or p.name in _SKIP_DIRS or (out_resolved and p.resolve() == out_resolved):
            continue
        if p.is_dir() or (p.is_file() and p.suffix in SOURCE_SUFFIXES):
            entries.append(p)
        else:
            ignored.append(p)
    stems: dict[str, int] = {}
    for p in entries:
        key = p.name if p.is_dir() else p.stem
        stems[key] = stems.get(key, 0) + 1
    students, slugs = [], set()
    for p in entries:
        name = p.name if p.is_dir() or stems[p.stem] > 1 else p.stem
        slug = re.sub(r"[^A-Za-z0-9._@+-]", "_", name) or "_"
        base, k = slug, 2
        while slug in slugs:  # two names that differ only in unsafe characters
            slug, k = f"{base}-{k}", k + 1
        slugs.add(slug)
        students.append(Student(name=name, path=p, slug=slug))
    return students, ignored


def _source_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    found = []
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("."))
        found += [Path(root) / f for f in sorted(files) if not f.startswith(".")]
    return found


def content_hash(path: Path) -> str:
    """sha256 over the submission's files (relative names and bytes)."""
    h = hashlib.sha256()
    base = path if path.is_dir() else path.parent
    for f in _source_files(path):
        h.update(str(f.relative_to(base)).encode() + b"\0")
        try:
            h.update(f.read_bytes())
        except OSError as e:  # an unreadable file still changes the hash if it changes
            h.update(f"<unreadable: {e}>".encode())
        h.update(b"\0")
    return h.hexdigest()


def grading_target(path: Path) -> Path | None:
    """What to hand to the engine: the student's file or folder, or their ``exercises/``
    when they submitted a whole clone of the template repository. None when there is
    no notebook or .py file anywhere in it."""
    if path.is_file():
        return path
    if not any(f.suffix in SOURCE_SUFFIXES for f in _source_files(path)):
        return None
    exercises = path / "exercises"
    # A clone of the template repository also holds its own grader/ and attnmask/:
    # only the student's exercises are theirs to be graded.
    if exercises.is_dir() and any(f.suffix in SOURCE_SUFFIXES for f in _source_files(exercises)):
        return exercises
    return path


def grader_fingerprint() -> str:
    """Hash of the grader's and the reference package's sources: a new grader regrades."""
    h = hashlib.sha256()
    import importlib.util

    roots = [Path(__file__).parent]
    spec = importlib.util.find_spec("attnmask")  # finds the package without importing torch
    if spec is not None and spec.origin:
        roots.append(Path(spec.origin).parent)
    for root in roots:
        for f in sorted(root.rglob("*.py")):
            h.update(f.relative_to(root.parent).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


# --------------------------------------------------------------------------- running


@dataclass
class RunResult:
    returncode: int | None  # None when killed for time
    timed_out: bool
    seconds: float


def run_limited(argv: Sequence[str], *, timeout: float, log: Path, env: dict[str, str] | None = None,
                cwd: Path | None = None, cpus: set[int] | None = None) -> RunResult:
    """Run ``argv`` in its own process group with stdout+stderr to ``log``; kill the whole
    group when it runs past ``timeout`` seconds, and after it exits (stray children).
    ``cpus``: the cores it (and every process it starts) may run on (Linux)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(log, "wb") as fh:
        proc = subprocess.Popen(list(argv), stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, cwd=cwd, start_new_session=True)
        with _RUNNING_LOCK:
            _RUNNING.add(proc.pid)
        if cpus and hasattr(os, "sched_setaffinity"):
            # Set before the grader starts its own worker (it is still importing Python by
            # then), so the worker inherits it: the whole grading stays on these cores.
            try:
                os.sched_setaffinity(proc.pid, cpus)
            except OSError:
                pass
        try:
            timed_out = not _wait_unreaped(proc, timeout)
        finally:
            # The pid is not reaped yet (alive or a zombie), so it cannot have been reused:
            # killing its group and its descendants cannot hit an unrelated process.
            _kill_group(proc.pid)
            with _RUNNING_LOCK:
                _RUNNING.discard(proc.pid)
        rc = proc.wait()
    return RunResult(returncode=None if timed_out else rc, timed_out=timed_out,
                     seconds=time.perf_counter() - t0)


def _wait_unreaped(proc: subprocess.Popen, timeout: float) -> bool:
    """Wait up to ``timeout`` s for ``proc`` to exit without reaping it; True if it exited."""
    if not hasattr(os, "waitid"):  # no WNOWAIT here: fall back to reaping (macOS)
        try:
            proc.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False
    deadline = time.monotonic() + timeout
    pause = 0.005
    while os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
    return True


# Process groups being graded: their own sessions do not receive the terminal's Ctrl-C,
# so an interrupted class run kills them itself.
_RUNNING: set[int] = set()
_RUNNING_LOCK = threading.Lock()


def kill_running() -> None:
    with _RUNNING_LOCK:
        for pgid in list(_RUNNING):
            _kill_group(pgid)


class Preloaded:
    """Runs the engine's CLI (``grader.cli.main(ARGS)``, the same arguments as
    ``python -m grader ARGS``) in processes forked from a server that has imported torch,
    the reference and the grader once.

    Half of a fresh ``python -m grader``'s CPU time is those imports; in a class they are
    paid once instead of once per student. Each forked grading is what a fresh process
    would be: its own session, its own log as stdout/stderr, no stdin, one thread, and the
    same wall-time limit and whole-tree kill. The server is ``python -m grader.classroom
    _forkserver``: single-threaded (fork is safe there), it forks on request and reports
    each child's pid and exit status on its stdout.
    """

    def __init__(self) -> None:
        env = single_thread_env()
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_PACKAGE_ROOT), env.get("PYTHONPATH", "")]))
        self.server = subprocess.Popen([sys.executable, "-m", "grader.classroom", "_forkserver"],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True,
                                       bufsize=1)
        self.lock = threading.Lock()
        self.next_id = 0
        self.started: dict[int, int] = {}
        self.exited: dict[int, int] = {}
        self.changed = threading.Condition(self.lock)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.server.stdout:
            kind, rid, value = line.split()
            with self.changed:
                (self.started if kind == "started" else self.exited)[int(rid)] = int(value)
                self.changed.notify_all()
        with self.changed:  # the server is gone: nothing more will start or exit
            self.changed.notify_all()

    def _wait_for(self, table: dict[int, int], rid: int, timeout: float | None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.changed:
            while rid not in table:
                if self.server.poll() is not None:
                    raise RuntimeError(f"class mode's fork server stopped (exit {self.server.returncode})")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self.changed.wait(0.5 if left is None else min(left, 0.5))
            return table.pop(rid)

    def run(self, args: Sequence[str], *, timeout: float, log: Path, cwd: Path,
            cpus: set[int] | None = None) -> RunResult:
        log.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        with self.lock:
            rid, self.next_id = self.next_id, self.next_id + 1
            self.server.stdin.write(json.dumps({"id": rid, "args": list(args), "log": str(log),
                                                "cwd": str(cwd)}) + "\n")
            self.server.stdin.flush()
        pid = self._wait_for(self.started, rid, None)
        with _RUNNING_LOCK:
            _RUNNING.add(pid)
        if cpus and hasattr(os, "sched_setaffinity"):
            try:
                os.sched_setaffinity(pid, cpus)
            except OSError:
                pass
        rc = None
        try:
            rc = self._wait_for(self.exited, rid, timeout)
        finally:
            if rc is None:  # past the limit (or interrupted): still running, so its pid is its own
                _kill_group(pid)
            with _RUNNING_LOCK:
                _RUNNING.discard(pid)
        timed_out = rc is None
        if timed_out:
            self._wait_for(self.exited, rid, None)
        return RunResult(returncode=None if timed_out else rc, timed_out=timed_out,
                         seconds=time.perf_counter() - t0)

    def close(self) -> None:
        """Stop the server and reap it (its children's CPU time then counts as ours)."""
        try:
            self.server.stdin.close()
        except OSError:
            pass
        try:
            self.server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.server.kill()
            self.server.wait()


def _forkserver() -> None:
    """``python -m grader.classroom _forkserver``: import once, fork a grading per request."""
    import select

    import torch

    torch.set_num_threads(1)
    import attnmask  # noqa: F401 -- imported here once, for every child
    from grader import cli, engine, report  # noqa: F401

    children: dict[int, int] = {}  # pid -> request id
    stdin = sys.stdin.fileno()
    buf, eof = b"", False
    while not eof or children:
        ready, _, _ = select.select([] if eof else [stdin], [], [], 0.02)
        if ready:
            chunk = os.read(stdin, 65536)
            eof = not chunk
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                req = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    _cli_in_child(req["args"], req["log"], req["cwd"])
                children[pid] = req["id"]
                print("started", req["id"], pid, flush=True)
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            print("exited", children.pop(pid), os.waitstatus_to_exitcode(status), flush=True)


def _cli_in_child(args: list[str], log: str, cwd: str) -> None:
    """Body of a forked grading: become a fresh-looking process, run the CLI, exit with its status."""
    code = 1
    try:
        os.setsid()  # a session of its own, as start_new_session gives a subprocess
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        os.close(null)
        os.chdir(cwd)
        from grader import cli

        code = cli.main(args)
    except SystemExit as e:  # argparse's usage errors
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 -- reported in the log, like a crashed interpreter
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(code)


def _kill_group(pgid: int) -> None:
    """Kill the process group ``pgid`` and every process descended from its leader,
    including those that moved to sessions of their own (the grader's sandbox does), which
    a kill of the group alone would leave running when the grader is stopped for time."""
    for _ in range(2):  # a second pass for anything started while the first one ran
        for pid in [pgid, *_descendants(pgid)]:
            for kill in (os.killpg, os.kill):
                try:
                    kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass


def _descendants(root: int) -> list[int]:
    """Processes descended from ``root``, from /proc (empty where there is no /proc)."""
    children: dict[int, list[int]] = {}
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    for d in proc.iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def single_thread_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for one grading process: one BLAS/OpenMP thread, so N workers use
    N cores instead of fighting over them."""
    env = dict(os.environ if base is None else base)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
        env[var] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("NO_COLOR", "1")
    return env


def log_tail(log: Path, limit: int = 300) -> str:
    """The last meaningful line of a log, for a one-line message."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return ""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:limit] if lines else ""


# --------------------------------------------------------------------------- results


def read_results(path: Path) -> dict[str, Any] | None:
    """A results.json as written by the engine, or None when missing or not valid."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("tests", []), list):
        return None
    if "score" not in data and not data.get("tests"):
        return None
    return data


def failure_results(message: str) -> dict[str, Any]:
    """A valid Gradescope results.json for a submission the grader could not grade."""
    return {"score": 0.0, "output": message, "tests": [], "extra_data": {"failure": message}}


def total_score(results: dict[str, Any]) -> float:
    if "score" in results:
        return float(results["score"])
    return float(sum(float(t.get("score", 0) or 0) for t in results.get("tests", [])))


def max_score(results: dict[str, Any]) -> float | None:
    if results.get("max_score") is not None:
        return float(results["max_score"])
    tests = results.get("tests", [])
    if tests and all(t.get("max_score") is not None for t in tests):
        return float(sum(float(t["max_score"]) for t in tests))
    return None


def exercise_of(test_name: str, exercises: Sequence[str]) -> str | None:
    """The contract function a test entry is about: its name contains the function name
    as a whole identifier ("attention" does not match "multi_head_attention")."""
    hits = [e for e in exercises if re.search(rf"(?<![A-Za-z0-9_]){re.escape(e)}(?![A-Za-z0-9_])", test_name)]
    return max(hits, key=len) if hits else None


def per_exercise(results: dict[str, Any], exercises: Sequence[str]) -> dict[str, float]:
    scores: dict[str, float] = {}
    for t in results.get("tests", []):
        ex = exercise_of(str(t.get("name", "")), exercises)
        if ex is not None:
            scores[ex] = scores.get(ex, 0.0) + float(t.get("score", 0) or 0)
    return scores


def summarize(results: dict[str, Any], exercises: Sequence[str], limit: int = 300) -> str:
    """One line: what cost the student points, after the grader's notes on the whole
    submission (e.g. a file that ran too long at import), which say why better."""
    notes = [ln.strip() for ln in str(results.get("output", "")).splitlines()
             if ln.strip().lower().startswith(("note:", "error:", "warning:"))]
    lost = []
    for t in results.get("tests", []):
        score, top = float(t.get("score", 0) or 0), t.get("max_score")
        if top is not None and score < float(top):
            first = next((ln.strip() for ln in str(t.get("output", "")).splitlines() if ln.strip()), "")
            ex = exercise_of(str(t.get("name", "")), exercises) or str(t.get("name", "?"))
            lost.append(f"{ex}: {first}" if first else ex)
    if not lost:
        if not results.get("tests") and results.get("output"):
            return str(results["output"]).strip().splitlines()[0][:limit]
        return "full marks"
    line = "; ".join(notes + lost)
    return line if len(line) <= limit else line[: limit - 1] + "…"


# --------------------------------------------------------------------------- class mode


@dataclass
class Row:
    student: str
    slug: str
    status: str  # graded | not graded | timeout | crashed | empty
    message: str
    total: float = 0.0
    max: float | None = None
    scores: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    skipped: bool = False  # unchanged since the last run: not regraded


def grade_student(student: Student, out: Path, *, seed: int, timeout: float, extra: Sequence[str],
                  command: GraderCommand, exercises: Sequence[str], cores: queue.Queue | None = None,
                  preloaded: Preloaded | None = None) -> Row:
    """Grade one student in a killable process group; always leaves a results.json.
    ``cores``: free core ids; the grading takes one for itself while it runs.
    ``preloaded``: run the engine's CLI forked from it instead of in a fresh interpreter."""
    folder = out / student.slug
    folder.mkdir(parents=True, exist_ok=True)
    results_path, log = folder / "results.json", folder / "grader.log"
    results_path.unlink(missing_ok=True)  # a stale file must never pass for this run's result
    target = grading_target(student.path)
    if target is None:
        message = f"no .ipynb or .py file in the submission {student.path.name!r}: nothing to grade"
        results_path.write_text(json.dumps(failure_results(message), indent=2))
        log.write_text(message + "\n")
        return Row(student.name, student.slug, "empty", message)
    # The grader writes to a name nobody can guess; results.json is written from it here,
    # so a file the student's code planted cannot pass for a grade if the grader dies.
    private = out / ".private" / f"{student.slug}-{secrets.token_hex(16)}.json"
    private.parent.mkdir(exist_ok=True)
    env = single_thread_env()
    # The grader class mode itself runs, whatever the working directory holds.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_PACKAGE_ROOT), env.get("PYTHONPATH", "")]))
    core = cores.get() if cores is not None else None
    try:
        cpus = None if core is None else {core}
        # cwd: the student's own output folder, so stray files land there.
        if preloaded is not None and command is engine_command:
            args = engine_args(target.resolve(), private.resolve(), seed, extra)
            res = preloaded.run(args, timeout=timeout, log=log, cwd=folder, cpus=cpus)
        else:
            res = run_limited(command(target.resolve(), private.resolve(), seed, extra), timeout=timeout,
                              log=log, env=env, cwd=folder, cpus=cpus)
    finally:
        if core is not None:
            cores.put(core)
    results = None if res.timed_out else read_results(private)
    private.unlink(missing_ok=True)
    if res.timed_out:
        status = "timeout"
        message = (f"grading took longer than {timeout:g} s and was stopped (whole process group killed); "
                   f"last output: {log_tail(log) or '(none)'}")
    elif results is None:
        status = "crashed"
        message = (f"the grader exited with code {res.returncode} without writing results.json; "
                   f"last output: {log_tail(log) or '(none)'} (see {log})")
    if results is None:
        results_path.write_text(json.dumps(failure_results(message), indent=2))
        return Row(student.name, student.slug, status, message, seconds=res.seconds)
    results_path.write_text(json.dumps(results, indent=2))
    # A results file with no test entries means the grader refused to grade (e.g. a bad
    # option): say so instead of passing it off as a zero.
    status = "graded" if results.get("tests") else "not graded"
    return Row(student.name, student.slug, status, summarize(results, exercises),
               total=total_score(results), max=max_score(results), scores=per_exercise(results, exercises),
               seconds=res.seconds)


class Manifest:
    """OUT/manifest.json: per student, the key of the last grading (files, seed, options,
    grader) and its row, so a rerun can skip what has not changed."""

    def __init__(self, path: Path):
        self.path, self.lock = path, threading.Lock()
        self.data: dict[str, Any] = {"version": MANIFEST_VERSION, "seed": None, "students": {}}
        try:
            loaded = json.loads(path.read_text())
            if isinstance(loaded, dict) and loaded.get("version") == MANIFEST_VERSION:
                self.data = loaded
        except (OSError, ValueError):
            pass

    def unchanged(self, slug: str, key: str, out: Path) -> Row | None:
        entry = self.data["students"].get(slug)
        if not entry or entry.get("key") != key or read_results(out / slug / "results.json") is None:
            return None
        row = Row(**entry["row"])
        row.skipped = True
        return row

    def record(self, row: Row, key: str) -> None:
        with self.lock:
            saved = asdict(row)
            saved["skipped"] = False
            self.data["students"][row.slug] = {"key": key, "row": saved}
            tmp = self.path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(self.data, indent=1, sort_keys=True))
            tmp.replace(self.path)  # a killed run never leaves half a manifest


def _fmt(x: float | None) -> str:
    return "" if x is None else f"{x:.2f}".rstrip("0").rstrip(".")


def write_csv(rows: list[Row], path: Path, exercises: Sequence[str]) -> None:
    """grades.csv: student, one column per contract exercise, total, max, status, message.
    Rows with no max of their own (failures) get the class's max, so totals compare."""
    maxes = [r.max for r in rows if r.max is not None]
    class_max = statistics.mode(maxes) if maxes else None
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["student", *exercises, "total", "max", "status", "message"])
        for r in rows:
            w.writerow([r.student, *(_fmt(r.scores.get(e, 0.0)) for e in exercises), _fmt(r.total),
                        _fmt(r.max if r.max is not None else class_max), r.status, r.message])


def contract_exercises() -> tuple[str, ...]:
    """``attnmask.CONTRACT``, read from the source: importing attnmask imports torch, which
    would cost class mode seconds of serial start-up before any worker starts."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec("attnmask")
    if spec is not None and spec.origin:
        for node in ast.parse(Path(spec.origin).read_text()).body:
            names = [getattr(t, "id", None) for t in getattr(node, "targets", [])]
            if isinstance(node, ast.Assign) and "CONTRACT" in names:
                return tuple(ast.literal_eval(node.value))
    from attnmask import CONTRACT

    return tuple(CONTRACT)


def grade_class(submissions: Path, out: Path, *, jobs: int, seed: int, timeout: float = DEFAULT_TIMEOUT,
                regrade: bool = False, extra: Sequence[str] = (), command: GraderCommand = engine_command,
                exercises: Sequence[str] | None = None, progress: bool = True,
                pin: bool = False, preload: bool = True) -> list[Row]:
    """Grade every student of ``submissions`` into ``out``; returns one row per student.

    With ``pin`` (and no more jobs than cores) each grading runs on a core of its own, so
    ``--jobs N`` uses exactly N cores and leaves the rest of a shared machine alone. Not the
    default: one grading overlaps its sandbox's start-up with its own on a second core, and
    letting the OS schedule that freely grades a class faster (scripts/bench_classroom.py).

    With ``preload`` (and the engine's own command), gradings are forked from a server that
    has imported torch and the grader once (:class:`Preloaded`); else each is a fresh
    ``python -m grader``.
    """
    exercises = tuple(exercises) if exercises is not None else contract_exercises()
    out.mkdir(parents=True, exist_ok=True)
    students, ignored = discover(submissions, out)
    if ignored:
        names = ", ".join(p.name for p in ignored[:5]) + (" …" if len(ignored) > 5 else "")
        print(f"note: ignored {len(ignored)} entries that are neither folders nor .ipynb/.py files: {names}",
              file=sys.stderr)
    manifest = Manifest(out / "manifest.json")
    fingerprint = grader_fingerprint()
    rows: dict[str, Row] = {}
    todo: list[tuple[Student, str]] = []
    for s in students:
        ident = [content_hash(s.path), seed, list(extra), fingerprint]
        key = hashlib.sha256(json.dumps(ident).encode()).hexdigest()
        row = None if regrade else manifest.unchanged(s.slug, key, out)
        if row is not None:
            row.student = s.name
            rows[s.slug] = row
        else:
            todo.append((s, key))
    manifest.data["seed"] = seed

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    with Progress(TextColumn("[bold]grading[/bold] {task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, disable=not progress or not todo) as bar:
        task = bar.add_task(f"{len(todo)} of {len(students)} students ({jobs} workers)", total=len(todo))
        cores = _core_pool(jobs) if pin else None
        preloaded = Preloaded() if preload and command is engine_command and todo else None
        pool = ThreadPoolExecutor(max_workers=max(1, jobs))
        job = dict(seed=seed, timeout=timeout, extra=extra, command=command, exercises=exercises, cores=cores,
                   preloaded=preloaded)
        futures = {pool.submit(grade_student, s, out, **job): (s, key) for s, key in todo}
        try:
            for fut in as_completed(futures):
                s, key = futures[fut]
                try:
                    row = fut.result()
                except Exception as e:  # noqa: BLE001 -- one broken row must not sink the class
                    message = f"class mode failed on this submission: {type(e).__name__}: {e}"
                    (out / s.slug).mkdir(parents=True, exist_ok=True)
                    (out / s.slug / "results.json").write_text(json.dumps(failure_results(message)))
                    row = Row(s.name, s.slug, "crashed", message)
                rows[s.slug] = row
                manifest.record(row, key)
                bar.update(task, advance=1, description=f"{s.name}: {row.status}")
        except BaseException:
            # Ctrl-C: stop now, not after the running students finish. Finished rows are
            # in the manifest, so the same command resumes where this run stopped.
            pool.shutdown(wait=False, cancel_futures=True)
            kill_running()
            if preloaded is not None:
                preloaded.close()
            print(f"\ninterrupted after {len(rows) - (len(students) - len(todo))} of {len(todo)} students; "
                  f"run the same command again to grade the rest", file=sys.stderr)
            raise
        pool.shutdown()
        if preloaded is not None:
            preloaded.close()
    ordered = [rows[s.slug] for s in students]
    write_csv(ordered, out / "grades.csv", exercises)
    return ordered


def _core_pool(jobs: int) -> queue.Queue | None:
    """A queue of ``jobs`` distinct core ids, or None where pinning is not possible."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    available = sorted(os.sched_getaffinity(0))
    if jobs > len(available):  # oversubscription was asked for: let the OS share the cores
        return None
    q: queue.Queue = queue.Queue()
    for c in available[:jobs]:
        q.put(c)
    return q


def print_summary(rows: list[Row], *, seed: int, out: Path, wall: float, jobs: int) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:  # a log file or a pipe: room for the whole table
        console = Console(width=110)
    totals = [r.total for r in rows]
    maxes = [r.max for r in rows if r.max is not None]
    top = statistics.mode(maxes) if maxes else None
    failures = [r for r in rows if r.status != "graded"]
    skipped = sum(r.skipped for r in rows)

    def pts(x: float) -> str:
        return f"{x:.1f}" + (f"/{_fmt(top)}" if top else "")

    t = Table(title="Class grading summary")
    for col in ("students", "graded", "unchanged", "mean", "median", "full marks", "zero", "failures"):
        t.add_column(col, justify="right")
    full = sum(1 for r in rows if r.max and r.total >= r.max)
    zero = sum(1 for r in rows if r.total == 0)
    t.add_row(str(len(rows)), str(len(rows) - skipped), str(skipped),
              pts(statistics.fmean(totals)) if totals else "-",
              pts(statistics.median(totals)) if totals else "-",
              str(full), str(zero), str(len(failures)))
    console.print(t)
    if failures:
        f = Table(title="Submissions that could not be graded")
        for col in ("student", "status", "why"):
            f.add_column(col, overflow="fold")
        for r in failures:
            f.add_row(r.student, r.status, r.message)
        console.print(f)
    console.print(f"seed {seed} (pass --seed {seed} to reproduce) · {jobs} workers · {wall:.1f} s wall · "
                  f"grades: {out / 'grades.csv'}")


def _resolve_seed(arg: int | None, out: Path) -> tuple[int, str]:
    if arg is not None:
        return arg, "--seed"
    if os.environ.get("GRADER_SEED", "").strip():
        try:
            return int(os.environ["GRADER_SEED"]), "$GRADER_SEED"
        except ValueError:
            raise SystemExit(f"GRADER_SEED must be an integer; got {os.environ['GRADER_SEED']!r}. "
                             f"Set it to the term's secret seed, e.g. GRADER_SEED=20250901.") from None
    try:
        seed = json.loads((out / "manifest.json").read_text()).get("seed")
        if isinstance(seed, int):
            return seed, f"the last run's manifest in {out}"
    except (OSError, ValueError):
        pass
    return random.SystemRandom().randrange(2**31), "drawn at random (none given)"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m grader class",
        description="Grade a whole class: every sub-folder (or single .ipynb/.py) of SUBMISSIONS_DIR is one "
                    "student. Writes OUT/STUDENT/results.json, OUT/grades.csv and a manifest that lets a "
                    "rerun skip unchanged submissions.")
    p.add_argument("submissions", type=Path, metavar="SUBMISSIONS_DIR")
    p.add_argument("--out", type=Path, help="output folder (default: SUBMISSIONS_DIR/../grader-results)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                   help="students graded at once (default: the number of cores, %(default)s)")
    p.add_argument("--seed", type=int,
                   help="hidden-case seed (default: $GRADER_SEED, else the last run's, else drawn at random; "
                        "printed either way)")
    p.add_argument("--regrade", action="store_true", help="grade every student, even unchanged ones")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                   help="wall-time limit per student in seconds (default %(default)s)")
    p.add_argument("--exercise-timeout", type=float, metavar="S",
                   help="the grader's own time limit per exercise (its --timeout; default: the grader's)")
    p.add_argument("--exercise", action="append", default=[], metavar="NAME",
                   help="grade only this exercise (repeatable); passed to the grader")
    p.add_argument("--public-only", action="store_true", help="run only the public checks")
    p.add_argument("--pin", action="store_true",
                   help="give each grading one core of its own, so --jobs N uses exactly N cores "
                        "(on a shared machine); a little slower when all cores are free")
    p.add_argument("--no-preload", action="store_true",
                   help="grade each student with a fresh `python -m grader` instead of forking graders "
                        "from one that has imported torch already (slower; for comparison)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: Sequence[str] | None = None, *, command: GraderCommand = engine_command,
         exercises: Sequence[str] | None = None) -> int:
    """``python -m grader class ...``. Exit status 0 when every student got a row."""
    args = build_parser().parse_args(argv)
    if args.jobs < 1:
        raise SystemExit(f"--jobs must be at least 1; got {args.jobs}.")
    if args.timeout <= 0:
        raise SystemExit(f"--timeout must be a positive number of seconds; got {args.timeout}.")
    out = args.out if args.out is not None else args.submissions.resolve().parent / "grader-results"
    seed, origin = _resolve_seed(args.seed, out)
    print(f"seed {seed} ({origin})", file=sys.stderr)
    extra: list[str] = []
    for name in args.exercise:
        extra += ["--exercise", name]
    if args.public_only:
        extra.append("--public-only")
    if args.exercise_timeout is not None:
        extra += ["--timeout", f"{args.exercise_timeout:g}"]
    t0 = time.perf_counter()
    rows = grade_class(args.submissions, out, jobs=args.jobs, seed=seed, timeout=args.timeout,
                       regrade=args.regrade, extra=extra, command=command, exercises=exercises,
                       progress=not args.no_progress, pin=args.pin,
                       preload=not args.no_preload)
    print_summary(rows, seed=seed, out=out, wall=time.perf_counter() - t0, jobs=args.jobs)
    return 0


# --------------------------------------------------------------------------- GitHub Classroom


def classroom_result(results: dict[str, Any] | None, *, missing: str = "") -> dict[str, Any]:
    """Gradescope results.json -> the JSON that ``autograding-grading-reporter`` reads.

    The reporter sums ``tests[].score`` against the top-level ``max_score`` and posts
    "Points X/Y" for GitHub Classroom; a test is ``pass`` only at full marks.
    """
    if results is None:
        message = missing or "the grader wrote no results.json"
        return {"version": 1, "status": "error", "max_score": 0,
                "tests": [{"name": "grader", "status": "error", "score": 0, "message": message,
                           "test_code": "", "filename": "", "line_no": 0, "execution_time": ""}]}
    tests = []
    for t in results.get("tests", []):
        score, top = float(t.get("score", 0) or 0), float(t.get("max_score", 0) or 0)
        tests.append({"name": str(t.get("name", "")), "status": "pass" if score >= top else "fail",
                      "score": score, "message": str(t.get("output", ""))[:4000], "test_code": "",
                      "filename": "", "line_no": 0, "execution_time": ""})
    if not tests:  # e.g. a corrupt notebook: one failing entry that says why
        tests.append({"name": "submission", "status": "fail", "score": total_score(results),
                      "message": str(results.get("output", "nothing was graded")), "test_code": "",
                      "filename": "", "line_no": 0, "execution_time": ""})
    top = max_score(results) or 0.0
    status = "pass" if tests and all(t["status"] == "pass" for t in tests) else "fail"
    return {"version": 1, "status": status, "max_score": top, "tests": tests}


def gh_outputs_main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m grader.classroom gh-outputs",
        description="Write the base64 `result` output for classroom-resources/autograding-grading-reporter "
                    "from a results.json (to $GITHUB_OUTPUT when set, and to stdout).")
    p.add_argument("results", type=Path)
    p.add_argument("--github-output", type=Path, default=os.environ.get("GITHUB_OUTPUT") or None,
                   help="file to append `result=...` to (default: $GITHUB_OUTPUT)")
    args = p.parse_args(argv)
    results = read_results(args.results)
    payload = classroom_result(results, missing=f"{args.results} is missing or not valid JSON: the grader "
                                                f"did not finish (see the grading step's log)")
    encoded = base64.b64encode(json.dumps(payload).encode()).decode()
    line = f"result={encoded}"
    if args.github_output is not None:
        with open(args.github_output, "a") as fh:
            fh.write(line + "\n")
    print(line)
    total = sum(t["score"] for t in payload["tests"])
    print(f"Points {_fmt(total)}/{_fmt(payload['max_score'])}", file=sys.stderr)
    return 0


# --------------------------------------------------------------------------- template repo

#: What a student's template repository holds. No solutions/, no tests/, no book/.
TEMPLATE_PATHS = ("exercises", "attnmask", "grader", "pyproject.toml", "README.md")
#: Development tools in requirements.txt that grading never imports; left out of the
#: student template and the Gradescope image, which install on every run or build.
DEV_ONLY = {"jupyter-book", "nbval", "pytest", "pytest-xdist", "pytest-benchmark", "hypothesis", "ruff"}


def runtime_requirements(text: str, *, keep_editable: bool = True) -> str:
    """requirements.txt without the development-only tools (pins kept verbatim)."""
    out = []
    for line in text.splitlines():
        m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", line)
        name = m.group(1).lower().replace("_", "-").replace(".", "-") if m else None
        if name in DEV_ONLY:
            continue
        if line.strip().startswith("-e") and not keep_editable:
            continue
        out.append(line)
    return "\n".join(out) + "\n"


def build_template(repo: Path, dest: Path) -> Path:
    """Copy what the student template repository needs, plus the ready workflow."""
    if dest.exists() and any(dest.iterdir()):
        raise SystemExit(f"{dest} is not empty; expected a new or empty folder for the template repository.")
    for rel in TEMPLATE_PATHS:
        src = repo / rel
        if not src.exists():
            raise SystemExit(f"{src} is missing; expected the course repository at {repo} "
                             f"(run this from the repository root).")
        if src.is_dir():
            shutil.copytree(src, dest / rel, ignore=shutil.ignore_patterns("__pycache__", "*.pyc",
                                                                           ".ipynb_checkpoints"))
        else:
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    (dest / "requirements.txt").write_text(runtime_requirements((repo / "requirements.txt").read_text()))
    shutil.copytree(repo / "classroom" / "github", dest, dirs_exist_ok=True)
    return dest


def template_main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m grader.classroom template",
                                description="Build the GitHub Classroom student template repository.")
    p.add_argument("dest", type=Path)
    p.add_argument("--repo", type=Path, default=Path(__file__).resolve().parent.parent)
    args = p.parse_args(argv)
    build_template(args.repo, args.dest)
    print(f"template repository written to {args.dest}: {', '.join(TEMPLATE_PATHS)}, requirements.txt, "
          f".github/workflows/classroom.yml")
    return 0


_COMMANDS = {"class": main, "gh-outputs": gh_outputs_main, "template": template_main}

if __name__ == "__main__":
    if sys.argv[1:2] == ["_forkserver"]:  # internal: see Preloaded
        _forkserver()
        sys.exit(0)
    if len(sys.argv) < 2 or sys.argv[1] not in _COMMANDS:
        print(f"usage: python -m grader.classroom {{{','.join(_COMMANDS)}}} ...", file=sys.stderr)
        sys.exit(2)
    sys.exit(_COMMANDS[sys.argv[1]](sys.argv[2:]))
