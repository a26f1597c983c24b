"""Class mode: a whole class graded in parallel, one row per student whatever they did.

Most tests drive class mode with a fake grader command (a tiny script with the
engine's CLI shape), so they test class mode's own duties -- discovery, the
process-group kill, the manifest, grades.csv -- in a second or two. The last test
runs the real engine on real notebooks end to end.
"""

from __future__ import annotations

import base64
import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grader.runners.classmode import classroom, processes, scores
from grader.runners.classmode.classroom import grade_class
from grader.runners.classmode.roster import discover
from grader.runners.classmode.scores import exercise_of
from grader.runners.platforms import github
from grader.runners.platforms.github import runtime_requirements
from grader.sandbox import procs

REPO = Path(__file__).resolve().parent.parent
EXERCISES = ("causal_mask", "attention", "multi_head_attention")

# The fake grader: scores come from "name=points" lines in the submission; HANG hangs
# (with a grandchild in its own session that must die too), OS_EXIT kills the process, a notebook that is
# not JSON gets a zero with a message, as the engine does.
FAKE = r'''
import json, os, subprocess, sys, time
from pathlib import Path

sub, out, seed, extra = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
with open(os.environ["FAKE_CALLS"], "a") as fh:
    fh.write(json.dumps({"sub": sub.name if sub.name != "exercises" else sub.parent.name,
                         "seed": seed, "extra": extra, "cpus": sorted(os.sched_getaffinity(0))}) + "\n")
files = [sub] if sub.is_file() else sorted(p for p in sub.rglob("*") if p.is_file())
text = "\n".join(p.read_text(errors="replace") for p in files)
names = ["causal_mask", "attention", "multi_head_attention"]
if "HANG" in text:
    # In a session of its own, as the engine starts its sandbox: a kill of the group misses it.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    Path(os.environ["FAKE_PIDS"]).open("a").write(f"{child.pid}\n")
    print("importing the submission...", flush=True)
    time.sleep(600)
if "FORGE" in text:  # plant a perfect results.json where class mode keeps them, then die
    Path("results.json").write_text(json.dumps({"score": 30, "max_score": 30, "tests": [
        {"name": n, "score": 10, "max_score": 10} for n in names]}))
    os._exit(3)
if "OS_EXIT" in text:
    print("worker died: segmentation fault", flush=True)
    os._exit(3)
for p in files:
    if p.suffix == ".ipynb":
        try:
            json.loads(p.read_text())
        except ValueError:
            why = f"{p.name} is not a valid notebook (corrupt JSON)"
            out.write_text(json.dumps({"score": 0, "output": why,
                                       "tests": [{"name": f"{n}", "score": 0, "max_score": 10,
                                                  "output": "not found"} for n in names]}))
            sys.exit(0)
scores = {n: 0.0 for n in names}
for line in text.splitlines():
    if "=" in line and line.split("=")[0].strip() in scores:
        scores[line.split("=")[0].strip()] = float(line.split("=")[1])
tests = [{"name": f"{n} (chapter {i})", "score": s, "max_score": 10,
          "output": "passed" if s == 10 else f"{n}: diagonal excluded\ngrid..."}
         for i, (n, s) in enumerate(scores.items())]
out.write_text(json.dumps({"score": sum(scores.values()), "max_score": 30, "tests": tests}))
'''


@pytest.fixture
def fake(tmp_path, monkeypatch):
    script = tmp_path / "fake_grader.py"
    script.write_text(FAKE)
    calls, pids = tmp_path / "calls.jsonl", tmp_path / "pids.txt"
    calls.touch()
    pids.touch()
    monkeypatch.setenv("FAKE_CALLS", str(calls))
    monkeypatch.setenv("FAKE_PIDS", str(pids))

    def command(sub, results, seed, extra):
        return [sys.executable, str(script), str(sub), str(results), str(seed), *extra]

    def calls_made():
        return [json.loads(line) for line in calls.read_text().splitlines()]

    command.calls = calls_made
    command.pids = lambda: [int(x) for x in pids.read_text().split()]
    return command


def _class(root: Path) -> Path:
    subs = root / "subs"
    (subs / "alice").mkdir(parents=True)
    (subs / "alice" / "ex.py").write_text("causal_mask=10\nattention=10\nmulti_head_attention=10\n")
    (subs / "bob.py").write_text("causal_mask=4\nattention=10\n")
    (subs / "carol").mkdir()
    (subs / "carol" / "ex.py").write_text("HANG at import\n")
    (subs / "dave").mkdir()
    (subs / "dave" / "ex.py").write_text("OS_EXIT\n")
    (subs / "erin.ipynb").write_bytes(b"\x89PNG not a notebook {")
    (subs / "frank").mkdir()  # empty folder
    (subs / "grace").mkdir()  # a clone of the template repository: only exercises/ is graded
    (subs / "grace" / "exercises").mkdir()
    (subs / "grace" / "exercises" / "ex.py").write_text("causal_mask=10\n")
    (subs / "grace" / "setup.py").write_text("HANG -- not the student's exercise, never graded\n")
    (subs / ".DS_Store").write_text("x")
    (subs / "notes.txt").write_text("not a student")
    return subs


def _alive(pid: int) -> bool:
    return procs.stat_fields(pid)[:1] not in ([], ["Z"], ["X"])  # gone, zombie or dead


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _read_csv(path: Path) -> dict[str, dict[str, str]]:
    with open(path, newline="") as fh:
        return {r["student"]: r for r in csv.DictReader(fh)}


def test_mixed_class_every_row_present_and_says_why(tmp_path, fake, capsys):
    subs = _class(tmp_path)
    out = tmp_path / "out"
    code = classroom.main([str(subs), "--out", str(out), "--jobs", "3", "--seed", "7", "--timeout", "3",
                           "--no-progress"], command=fake, exercises=EXERCISES)
    assert code == 0
    rows = _read_csv(out / "grades.csv")
    assert sorted(rows) == ["alice", "bob", "carol", "dave", "erin", "frank", "grace"]
    with open(out / "grades.csv", newline="") as fh:
        header = next(csv.reader(fh))
    assert header == ["student", *EXERCISES, "total", "max", "status", "isolation", "message"]
    assert rows["frank"]["isolation"] == ""  # nothing ran (the fake grader writes no isolation block)

    assert rows["alice"]["status"] == "graded" and rows["alice"]["total"] == "30"
    assert rows["alice"]["message"] == "full marks"
    assert rows["bob"]["causal_mask"] == "4" and rows["bob"]["attention"] == "10"
    assert rows["bob"]["multi_head_attention"] == "0" and rows["bob"]["total"] == "14"
    assert "causal_mask: causal_mask: diagonal excluded" in rows["bob"]["message"]
    assert rows["carol"]["status"] == "timeout" and "longer than 3 s" in rows["carol"]["message"]
    assert "importing the submission" in rows["carol"]["message"]  # the log's last line says where
    assert rows["dave"]["status"] == "crashed" and "code 3" in rows["dave"]["message"]
    assert "segmentation fault" in rows["dave"]["message"]
    assert rows["erin"]["status"] == "graded" and rows["erin"]["total"] == "0"
    assert "not a valid notebook" in (out / "erin" / "results.json").read_text()
    assert rows["frank"]["status"] == "empty" and "nothing to grade" in rows["frank"]["message"]
    assert rows["grace"]["status"] == "graded" and rows["grace"]["total"] == "10"
    for r in rows.values():  # failures are scored against the class's max too
        assert r["max"] == "30"
    for name in rows:  # every student has a valid results.json, failures included
        data = json.loads((out / name / "results.json").read_text())
        assert "score" in data and isinstance(data["tests"], list)

    # The hanging submission's grandchild died too, though it had left the process group.
    assert fake.pids() and not any(_alive(p) for p in fake.pids())
    # How much three workers overlap is a speed goal: scripts/bench_classroom.py measures it, no test
    # asserts on wall time (a loaded machine made this one red).

    printed = capsys.readouterr().out
    assert "seed 7" in printed and "failures" in printed and "carol" in printed
    calls = fake.calls()
    assert {c["sub"] for c in calls} == {"alice", "bob.py", "carol", "dave", "erin.ipynb", "grace"}
    assert all(c["seed"] == 7 for c in calls)


def test_rerun_skips_unchanged_and_regrade_forces(tmp_path, fake):
    subs = tmp_path / "subs"
    for name, body in [("alice", "causal_mask=10\n"), ("bob", "attention=3\n"), ("carol", "attention=10\n")]:
        (subs / name).mkdir(parents=True)
        (subs / name / "ex.py").write_text(body)
    out = tmp_path / "out"

    def run(*extra):
        classroom.main([str(subs), "--out", str(out), "--jobs", "2", "--timeout", "20", "--no-progress",
                        *extra], command=fake, exercises=EXERCISES)
        return _read_csv(out / "grades.csv")

    first = run("--seed", "1")
    assert len(fake.calls()) == 3
    second = run("--seed", "1")
    assert len(fake.calls()) == 3, "nothing changed, nothing regraded"
    assert second == first  # skipped rows come back from the manifest unchanged

    (subs / "bob" / "ex.py").write_text("attention=9\n")
    third = run("--seed", "1")
    assert [c["sub"] for c in fake.calls()[3:]] == ["bob"]
    assert third["bob"]["attention"] == "9" and third["alice"] == first["alice"]

    run()  # no --seed: the manifest's seed is reused, so still nothing to do
    assert len(fake.calls()) == 4
    run("--seed", "2")  # a new seed regrades everyone
    assert len(fake.calls()) == 7 and all(c["seed"] == 2 for c in fake.calls()[4:])
    run("--seed", "2", "--exercise", "attention")  # other options: other grades
    assert len(fake.calls()) == 10 and fake.calls()[-1]["extra"] == ["--exercise", "attention"]
    run("--seed", "2", "--exercise", "attention", "--regrade")
    assert len(fake.calls()) == 13


def test_a_changed_grader_regrades(tmp_path, fake, monkeypatch):
    subs = tmp_path / "subs"
    (subs / "alice").mkdir(parents=True)
    (subs / "alice" / "ex.py").write_text("causal_mask=10\n")
    for version in ("v1", "v1", "v2"):
        monkeypatch.setattr(classroom, "grader_fingerprint", lambda v=version: v)
        grade_class(subs, tmp_path / "out", jobs=1, seed=0, timeout=20, command=fake, exercises=EXERCISES,
                    progress=False)
    assert len(fake.calls()) == 2  # v1, (v1 unchanged: skipped), v2


def test_grader_fingerprint_follows_the_sources(tmp_path, monkeypatch):
    fp = classroom.grader_fingerprint()
    assert fp == classroom.grader_fingerprint() and len(fp) == 16
    fake_pkg = tmp_path / "grader"
    shutil.copytree(REPO / "grader", fake_pkg, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(classroom, "__file__", str(fake_pkg / "runners" / "classmode" / "classroom.py"))
    same = classroom.grader_fingerprint()
    changed = fake_pkg / "sandbox" / "worker.py"  # any of the grader's files, in any of its folders
    changed.write_text(changed.read_text() + "# changed\n")
    assert classroom.grader_fingerprint() != same


def test_a_refusal_by_the_grader_is_not_a_zero(tmp_path):
    """The real engine, called with an exercise that does not exist, writes a results file
    that grades nothing: the row says so."""
    subs = tmp_path / "subs"
    _ex01(subs / "alice")
    rows = grade_class(subs, tmp_path / "out", jobs=1, seed=0, timeout=120, progress=False,
                       extra=["--exercise", "causal_masks"])
    assert rows[0].status == "not graded" and "causal_masks" in rows[0].message, rows[0]


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux CPU affinity and two cores")
def test_pin_gives_each_grading_a_core_of_its_own(tmp_path, fake):
    subs = tmp_path / "subs"
    for i in range(4):
        (subs / f"s{i}").mkdir(parents=True)
        (subs / f"s{i}" / "ex.py").write_text("causal_mask=10\n")
    grade_class(subs, tmp_path / "free", jobs=2, seed=0, command=fake, exercises=EXERCISES, progress=False)
    assert all(c["cpus"] == sorted(os.sched_getaffinity(0)) for c in fake.calls())
    grade_class(subs, tmp_path / "pinned", jobs=2, seed=0, command=fake, exercises=EXERCISES, progress=False,
                pin=True)
    pinned = fake.calls()[4:]
    assert len(pinned) == 4 and all(len(c["cpus"]) == 1 for c in pinned)
    assert {c["cpus"][0] for c in pinned} <= set(os.sched_getaffinity(0))


def test_a_planted_results_file_is_not_a_grade(tmp_path, fake):
    subs = tmp_path / "subs"
    (subs / "mallory").mkdir(parents=True)
    (subs / "mallory" / "ex.py").write_text("FORGE\n")
    rows = grade_class(subs, tmp_path / "out", jobs=1, seed=0, timeout=20, command=fake, exercises=EXERCISES,
                       progress=False)
    assert rows[0].status == "crashed" and rows[0].total == 0
    assert json.loads((tmp_path / "out" / "mallory" / "results.json").read_text())["score"] == 0


def test_results_file_is_this_runs_not_a_stale_one(tmp_path, fake):
    subs = tmp_path / "subs"
    (subs / "dave").mkdir(parents=True)
    (subs / "dave" / "ex.py").write_text("OS_EXIT\n")
    out = tmp_path / "out"
    (out / "dave").mkdir(parents=True)
    (out / "dave" / "results.json").write_text(json.dumps({"score": 30, "max_score": 30, "tests": []}))
    rows = grade_class(subs, out, jobs=1, seed=0, timeout=20, command=fake, exercises=EXERCISES,
                       progress=False)
    assert rows[0].status == "crashed" and rows[0].total == 0
    assert json.loads((out / "dave" / "results.json").read_text())["score"] == 0


def test_discovery_names_and_collisions(tmp_path):
    subs = tmp_path / "subs"
    subs.mkdir()
    for name in ["zoe.py", "amy.ipynb", "amy.py", "bo b", "bo?b", "readme.md"]:
        p = subs / name
        p.mkdir() if "." not in name else p.write_text("")
    students, ignored = discover(subs)
    assert [s.name for s in students] == ["amy.ipynb", "amy.py", "bo b", "bo?b", "zoe"]
    assert len({s.slug for s in students}) == len(students)
    assert all("/" not in s.slug and " " not in s.slug and "?" not in s.slug for s in students)
    assert [p.name for p in ignored] == ["readme.md"]
    with pytest.raises(SystemExit, match="expected a folder of submissions"):
        discover(tmp_path / "nope")


def test_grades_csv_columns_are_the_contract():
    import attnmask

    assert scores.contract_exercises() == attnmask.CONTRACT


def test_exercise_of_matches_whole_names():
    names = ("attention", "multi_head_attention", "kv_cache_attention", "causal_mask")
    assert exercise_of("multi_head_attention (ch. 5)", names) == "multi_head_attention"
    assert exercise_of("ch2: attention", names) == "attention"
    assert exercise_of("kv_cache_attention", names) == "kv_cache_attention"
    assert exercise_of("causal_masks", names) is None


def test_gh_outputs_format_read_by_the_classroom_reporter(tmp_path):
    results = {"score": 14.5, "max_score": 30, "tests": [
        {"name": "causal_mask", "score": 10, "max_score": 10, "output": "ok"},
        {"name": "attention", "score": 4.5, "max_score": 10, "output": "mask applied after the softmax"},
        {"name": "multi_head_attention", "score": 0, "max_score": 10, "output": "not implemented yet"}]}
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results))
    gh_out = tmp_path / "github_output"
    gh_out.write_text("earlier=1\n")
    proc = subprocess.run([sys.executable, "-m", "grader", "gh-outputs", str(path)],
                          capture_output=True, text=True, env={**os.environ, "GITHUB_OUTPUT": str(gh_out)},
                          cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    lines = gh_out.read_text().splitlines()
    assert lines[0] == "earlier=1" and lines[1].startswith("result=")
    payload = json.loads(base64.b64decode(lines[1].removeprefix("result=")))
    # What the reporter reads: top-level max_score and status, tests[].score/status/name/message.
    assert payload["max_score"] == 30 and payload["status"] == "fail"
    assert sum(t["score"] for t in payload["tests"]) == 14.5
    assert [t["status"] for t in payload["tests"]] == ["pass", "fail", "fail"]
    assert payload["tests"][1]["message"] == "mask applied after the softmax"
    assert "Points 14.5/30" in proc.stderr

    missing = github.classroom_result(scores.read_results(tmp_path / "nope.json"))
    assert missing["status"] == "error" and missing["max_score"] == 0


def test_runtime_requirements_drop_dev_tools_keep_pins():
    text = (REPO / "requirements.txt").read_text()
    kept = runtime_requirements(text, keep_editable=False)
    assert "torch==2.13.0" in kept and "nbformat" in kept and "rich" in kept
    assert not any(line.startswith(("ruff", "pytest", "jupyter-book", "nbval", "hypothesis", "-e"))
                   for line in kept.splitlines())
    assert "-e ." in runtime_requirements(text)


def test_template_repository_has_no_solutions(tmp_path):
    dest = github.build_template(REPO, tmp_path / "template")
    assert (dest / ".github" / "workflows" / "classroom.yml").is_file()
    assert (dest / "grader" / "__init__.py").is_file() and not (dest / "attnmask").exists()
    assert not (dest / "solutions").exists() and not (dest / "tests").exists()
    assert not list(dest.rglob("__pycache__"))


def test_an_internal_failure_costs_one_row_only(tmp_path, fake):
    subs = tmp_path / "subs"
    for name in ("alice", "bob"):
        (subs / name).mkdir(parents=True)
        (subs / name / "ex.py").write_text("causal_mask=10\n")

    def flaky(sub, results, seed, extra):
        if "bob" in str(sub):
            raise OSError("disk full")
        return fake(sub, results, seed, extra)

    rows = grade_class(subs, tmp_path / "out", jobs=2, seed=0, timeout=20, command=flaky, exercises=EXERCISES,
                       progress=False)
    assert [r.status for r in rows] == ["graded", "crashed"]
    assert "disk full" in rows[1].message
    shutil.rmtree(tmp_path / "out")


def _ex01(folder: Path, *, bug: bool = False) -> None:
    import nbformat

    folder.mkdir(parents=True)
    nb = nbformat.read(REPO / "solutions" / "ex01_leakage.ipynb", as_version=4)
    if bug:
        good = "return pos[None, :] <= pos[:, None]"
        cells = [c for c in nb.cells if c.cell_type == "code" and good in c.source]
        assert cells, f"{good!r} is no longer in solutions/ex01_leakage.ipynb: update this test's planted bug"
        cells[0].source = cells[0].source.replace(good, "return pos[None, :] < pos[:, None]")
    nbformat.write(nb, folder / "ex01_leakage.ipynb")


@pytest.mark.slow
def test_real_engine_on_a_mixed_class(tmp_path, capsys, monkeypatch):
    """End to end: the engine's CLI on correct, buggy, hanging, crashing, corrupt and empty work."""
    # Pinned: colleagues editing grader/ meanwhile would (rightly) make the rerun regrade.
    monkeypatch.setattr(classroom, "grader_fingerprint", lambda: "pinned")
    subs = tmp_path / "subs"
    _ex01(subs / "alice")
    _ex01(subs / "bob", bug=True)
    (subs / "hank.py").write_text("import time\nimport torch\n\n\n"
                                  "def causal_mask(n, *, device=time.sleep(10**6)):  # hangs at import\n"
                                  "    return torch.ones(n, n, dtype=torch.bool).tril()\n")
    (subs / "cate.py").write_text("import os\n\n\ndef causal_mask(n, *, device=None):\n    os._exit(1)\n")
    (subs / "cory.ipynb").write_bytes(b"\x89PNG\r\n\x1a\n\x00 not a notebook")
    (subs / "emma").mkdir()
    out = tmp_path / "out"
    argv = [str(subs), "--out", str(out), "--jobs", "2", "--seed", "5", "--timeout", "60",
            "--exercise", "causal_mask", "--exercise-timeout", "3", "--no-progress"]
    assert classroom.main(argv) == 0
    rows = _read_csv(out / "grades.csv")
    assert sorted(rows) == ["alice", "bob", "cate", "cory", "emma", "hank"]
    assert rows["alice"]["causal_mask"] == rows["alice"]["total"] == rows["alice"]["max"]
    assert rows["alice"]["message"] == "full marks"
    assert float(rows["bob"]["total"]) == 0  # wrong on every case: properties alone earn nothing
    assert "diagonal" in rows["bob"]["message"]
    whys = [("hank", "longer than"), ("cate", "os._exit"), ("cory", "cory.ipynb"), ("emma", "nothing")]
    for name, why in whys:
        assert rows[name]["total"] == "0", (name, rows[name])
        assert why in rows[name]["message"], (name, rows[name]["message"])
    for name in rows:
        json.loads((out / name / "results.json").read_text())
    printed = capsys.readouterr()
    assert "seed 5" in printed.out
    # one story for the seed: the environment (any process can read a command line)
    assert "GRADER_SEED=5" in printed.out and "--seed 5 to reproduce" not in printed.out
    assert "warning: --seed is on the command line" in printed.err

    # Forked from a preloaded server (the default) or a fresh interpreter: the same results.
    pair, fresh = tmp_path / "pair", tmp_path / "fresh"
    for name in ("alice", "bob"):
        shutil.copytree(subs / name, pair / name)
    assert classroom.main([str(pair), "--out", str(fresh), "--jobs", "2", "--seed", "5", "--timeout", "60",
                           "--exercise", "causal_mask", "--no-progress", "--no-preload"]) == 0
    for name in ("alice", "bob"):
        a, b = (json.loads((o / name / "results.json").read_text().replace(str(d), "<class>"))
                for o, d in ((out, subs), (fresh, pair)))
        for d in (a, b):
            d.pop("execution_time", None)
            for t in d["tests"]:
                t.pop("execution_time", None)
        assert a == b, name

    # Nothing changed: a rerun grades nobody and gives the same grades.csv.
    before = (out / "grades.csv").read_text()
    rerun = grade_class(subs, out, jobs=2, seed=5, timeout=60, progress=False,
                        extra=["--exercise", "causal_mask", "--timeout", "3"])
    assert all(r.skipped for r in rerun)
    assert (out / "grades.csv").read_text() == before


def test_ctrl_c_stops_the_class_at_once_and_a_rerun_resumes(tmp_path, fake):
    subs = tmp_path / "subs"
    for name, body in [("alice", "causal_mask=10\n"), ("hank", "HANG\n"), ("hugo", "HANG\n")]:
        (subs / name).mkdir(parents=True)
        (subs / name / "ex.py").write_text(body)
    out = tmp_path / "out"
    driver = tmp_path / "driver.py"
    driver.write_text(
        "import sys\nfrom grader.runners.classmode import classroom\n"
        f"cmd = lambda s, r, seed, e: [sys.executable, {str(tmp_path / 'fake_grader.py')!r}, str(s), str(r), "
        "str(seed), *e]\n"
        f"classroom.main([{str(subs)!r}, '--out', {str(out)!r}, '--jobs', '3', '--seed', '1',"
        f" '--timeout', '300', '--no-progress'], command=cmd, exercises={EXERCISES!r})\n")
    proc = subprocess.Popen([sys.executable, str(driver)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while len(fake.pids()) < 2 or "alice" not in _text(out / "manifest.json"):  # both hang, alice done
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)  # well under the 300 s the hanging students would take
    assert proc.returncode != 0 and "run the same command again" in err
    assert not any(_alive(p) for p in fake.pids())
    manifest = json.loads((out / "manifest.json").read_text())
    assert list(manifest["students"]) == ["alice"]  # finished rows kept; the others will be regraded


@pytest.mark.parametrize("preload", [True, False], ids=["forked", "fresh"])
@pytest.mark.slow
def test_real_engine_past_the_class_time_limit_is_killed_tree_and_all(tmp_path, monkeypatch, preload):
    """The grader itself runs too long: class mode stops it, and its sandbox (in a session
    of its own) with it -- a descendant of the grading, or of the zygote it was forked from."""
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "hank.py").write_text("import time\n\n\ndef causal_mask(n, *, device=time.sleep(10**6)):\n"
                                  "    pass\n")
    killed: list[int] = []
    zygotes: list[classroom.Zygote] = []
    kill = processes.kill_tree

    class RecordingZygote(classroom.Zygote):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            zygotes.append(self)

    def recording_kill(pgid: int) -> None:
        killed.extend(procs.descendants(pgid))
        for z in zygotes:
            killed.extend(procs.descendants(z.proc.pid))
        kill(pgid)

    monkeypatch.setattr(processes, "kill_tree", recording_kill)
    monkeypatch.setattr(classroom, "Zygote", RecordingZygote)
    rows = grade_class(subs, tmp_path / "out", jobs=1, seed=0, timeout=6, progress=False, preload=preload,
                       extra=["--exercise", "causal_mask", "--timeout", "60"])
    assert rows[0].status == "timeout" and "longer than 6 s" in rows[0].message
    assert killed, "the grader had started its sandbox: there was a tree to kill"
    assert len(zygotes) == (1 if preload else 0)
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in killed) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in killed)


@pytest.mark.parametrize("preload", [True, False], ids=["forked", "fresh"])
@pytest.mark.slow
def test_the_seed_is_not_on_any_command_line_student_code_can_read(tmp_path, preload):
    """Every process can read another's /proc/PID/cmdline: none it can see may hold the seed.
    The spy reads every command line in its /proc (inside the sandbox: the zygote's and its
    helpers') and reports how many of the grader's it read and whether one held the seed; it
    judges by itself, so no scrubbing of its output could hide a leak."""
    seed = 987654321
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "spy.py").write_text(
        "import os\n\nimport torch\n\n\ndef causal_mask(n, *, device=None):\n"
        "    read, leaks = 0, 0\n"
        "    for pid in [p for p in os.listdir('/proc') if p.isdigit()]:\n"
        "        try:\n"
        "            cmd = open(f'/proc/{pid}/cmdline', 'rb').read().decode(errors='replace')\n"
        "        except OSError:\n"
        "            continue\n"
        "        read += 'grader' in cmd\n"
        f"        leaks += {str(seed)[::-1]!r}[::-1] in cmd\n"
        "    print('SPY', 'read', 'grader' * read, 'leaks', 'seed' * leaks)\n"
        "    return torch.ones(n, n, dtype=torch.bool, device=device).tril()\n")
    rows = grade_class(subs, tmp_path / "out", jobs=1, seed=seed, progress=False, preload=preload,
                       extra=["--exercise", "causal_mask"])
    log = (tmp_path / "out" / rows[0].slug / "grader.log").read_text()
    said = [line.split() for line in log.splitlines() if line.startswith("SPY read")]
    assert said, "the spy did not report"
    # A worker's /proc now holds only itself (tests/test_sandbox_proc.py), so the spy reads no other
    # process's command line at all; where it could read some, none may hold the seed.
    assert all(words[2] in ("leaks",) or words[2].startswith("grader") for words in said), said
    assert all(words[-1] == "leaks" for words in said), "a command line holds the seed"
    assert "--seed is on the command line" not in log, "class mode passed the seed as an argument"


def _readme_commands(text: str) -> list[str]:
    """The commands of the README's bash blocks, comments dropped."""
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    return [line.split("#")[0].strip() for block in blocks for line in block.splitlines()
            if line.split("#")[0].strip()]


@pytest.mark.slow
def test_template_readme_is_for_students_and_its_commands_work(tmp_path):
    dest = github.build_template(REPO, tmp_path / "template")
    readme = (dest / "README.md").read_text()
    assert readme != (REPO / "README.md").read_text()
    assert "solutions/" not in readme and "build_book" not in readme and "pytest" not in readme
    # Every path it names is in the template.
    for path in re.findall(r"`([\w.-]*(?:/[\w.-]*)+|[\w-]+\.(?:txt|ipynb|md|yml|toml))`", readme):
        assert (dest / path).exists(), path
    commands = _readme_commands(readme)
    assert any(c.startswith("pip install") and "download.pytorch.org/whl/cpu" in c for c in commands)
    assert "jupyter lab exercises/" in commands and "git push" in commands
    # What can run offline here: importing check, and grading the stubs (total 0, exit 0).
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GRADER_SEED")}
    code = "from grader import check; import grader; print(grader.__file__)"
    p = subprocess.run([sys.executable, "-c", code], cwd=dest, capture_output=True, text=True, timeout=120,
                       env=env)
    assert p.returncode == 0 and str(dest) in p.stdout, p.stderr
    graded = [c for c in commands if c.startswith("python -m grader ")]
    assert "python -m grader exercises/" in graded
    for command in graded:
        out = tmp_path / "r.json"
        p = subprocess.run([sys.executable, *command.split()[1:], "--json", str(out)], cwd=dest,
                           capture_output=True, text=True, timeout=300, env=env)
        assert p.returncode == 0, p.stderr
        assert json.loads(out.read_text())["score"] == 0 and "next: exercise 1.1 causal_mask" in p.stdout
    # exercises/README.md speaks to students too: no maintainer's note.
    students = (dest / "exercises" / "README.md").read_text()
    assert "don't edit" not in students and "grader release" not in students
    for path in re.findall(r"`(ex\d+_\w+\.ipynb)`", students):
        assert (dest / "exercises" / path).is_file(), path


def test_a_missing_folder_or_one_without_students_is_one_line_and_exit_2(tmp_path, capsys):
    """Before any seed is drawn or printed, and with nothing written."""
    (tmp_path / "nobody").mkdir()
    (tmp_path / "nobody" / "notes.txt").write_text("not a student")
    for folder in (tmp_path / "missing", tmp_path / "nobody"):
        assert classroom.main([str(folder), "--out", str(tmp_path / "out"), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and err.startswith("python -m grader class: error:"), err
        assert "seed" not in err
    assert not (tmp_path / "out").exists()


def test_the_summary_counts_an_empty_submission_as_a_failure_not_as_graded(tmp_path, capsys):
    rows = [classroom.Row("alice", "alice", "graded", "", total=10, max=100),
            classroom.Row("frank", "frank", "empty", "no notebook or .py file")]
    classroom.print_summary(rows, seed=1, out=tmp_path, wall=1.0, jobs=1)
    out = capsys.readouterr().out
    lines = out.splitlines()
    at = next(i for i, ln in enumerate(lines) if "students" in ln)
    values = next(ln for ln in lines[at + 1:] if ln.startswith("│"))
    names = [c.strip() for c in lines[at].strip("┃ ").split("┃")]
    cells = [c.strip() for c in values.strip("│ ").split("│")]
    summary = dict(zip(names, cells))
    assert summary["students"] == "2" and summary["graded"] == "1" and summary["failures"] == "1", out

