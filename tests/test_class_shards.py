"""Sharded class mode and the merge: a class split over N machines grades as one run does.

The fast tests drive class mode with a fake grader (scores from "name=points" lines), so
they test the split, the records and the merge's refusals in seconds; the slow test grades
40 real submissions with the real engine, in 4 shards and in one run, and compares.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from grader.runners.classmode import classroom, merge, shards
from grader.runners.classmode.scores import _fmt

REPO = Path(__file__).resolve().parent.parent
EXERCISES = ("causal_mask", "attention")
FAKE = r'''
import json, sys
from pathlib import Path
sub, out = Path(sys.argv[1]), Path(sys.argv[2])
text = sub.read_text() if sub.is_file() else "\n".join(p.read_text() for p in sorted(sub.rglob("*.py")))
scores = {"causal_mask": 0.0, "attention": 0.0}
for line in text.splitlines():
    name, _, value = line.partition("=")
    if name in scores:
        scores[name] = float(value)
tests = [{"name": f"{n} (chapter 1)", "score": s, "max_score": 10, "output": "ok" if s == 10 else "wrong"}
         for n, s in scores.items()]
out.write_text(json.dumps({"score": sum(scores.values()), "max_score": 20, "tests": tests}))
'''


@pytest.fixture
def fake(tmp_path):
    script = tmp_path / "fake_grader.py"
    script.write_text(FAKE)

    def command(sub, results, seed, extra):
        return [sys.executable, str(script), str(sub), str(results), str(seed), *extra]

    return command


def _class(root: Path, n: int) -> Path:
    subs = root / "subs"
    subs.mkdir(parents=True)
    for i in range(n):
        (subs / f"student{i:02d}.py").write_text(f"causal_mask={i % 11}\nattention={(3 * i) % 11}\n")
    return subs


def _grades(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _run(fake, subs: Path, out: Path, *more: str, seed: str = "918273645546372819") -> int:
    return classroom.main([str(subs), "--out", str(out), "--jobs", "2", "--seed", seed, "--no-progress",
                           "--no-report", *more], command=fake, exercises=EXERCISES)


def test_the_split_is_sha256_of_the_name_and_the_same_in_every_process():
    names = [f"student{i}" for i in range(200)]
    split = [shards.shard_of(n, 7) for n in names]
    assert split == [int.from_bytes(hashlib.sha256(n.encode()).digest()[:8], "big") % 7 for n in names]
    assert set(split) == set(range(7))  # 200 names reach every shard
    # Python's own hash() is salted per process: the split must not depend on it.
    code = ("from grader.runners.classmode.shards import shard_of; "
            "print([shard_of(f'student{i}', 7) for i in range(200)])")
    for salt in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": salt, "PYTHONPATH": str(REPO)}
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                             check=True)
        assert json.loads(out.stdout) == split


@pytest.mark.parametrize(("env", "expected"), [
    ({"GRADER_SHARD": "2/5"}, (2, 5)),
    ({"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_COUNT": "4"}, (3, 4)),
    ({"SLURM_ARRAY_TASK_ID": "4", "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_MIN": "1"}, (3, 4)),
    ({"JOB_COMPLETION_INDEX": "0", "GRADER_SHARD_COUNT": "8"}, (0, 8)),
    ({}, None),
])
def test_the_shard_comes_from_the_engines_environment(env, expected):
    found = shards.from_env(env)
    assert (None if found is None else (found[0].index, found[0].count)) == expected


@pytest.mark.parametrize("env", [{"GRADER_SHARD": "4/4"}, {"GRADER_SHARD": "x"},
                                 {"JOB_COMPLETION_INDEX": "1"},
                                 {"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "4",
                                  "SLURM_ARRAY_TASK_STEP": "2"}])
def test_a_bad_shard_is_refused_in_words(env):
    with pytest.raises(SystemExit) as e:
        shards.from_env(env)
    words = str(e.value)
    assert "0 <= i < N" in words or "--array=0-3" in words or "GRADER_SHARD_COUNT" in words, words


def test_shards_merge_into_the_one_run_grades(tmp_path, fake, capsys):
    subs = _class(tmp_path, 12)
    assert _run(fake, subs, tmp_path / "whole") == 0
    for i in range(3):
        assert _run(fake, subs, tmp_path / f"shard{i}", "--shard", f"{i}/3") == 0
    per_shard = [{r["student"] for r in _grades(tmp_path / f"shard{i}" / "grades.csv")} for i in range(3)]
    assert all(per_shard) and sum(map(len, per_shard)) == 12 and set.union(*per_shard) == {
        f"student{i:02d}" for i in range(12)}
    code = merge.main([*(str(tmp_path / f"shard{i}") for i in range(3)), "--out", str(tmp_path / "merged"),
                       "--no-report"])
    assert code == 0
    assert _grades(tmp_path / "merged" / "grades.csv") == _grades(tmp_path / "whole" / "grades.csv")
    # The seed is compared by a keyed hash; it is never written into the record.
    record = (tmp_path / "shard0" / "class-run.json").read_text()
    assert "918273645546372819" not in record and json.loads(record)["seed_tag"]


def test_a_missing_shard_fails_the_merge_naming_its_students(tmp_path, fake, capsys):
    subs = _class(tmp_path, 12)
    for i in range(3):
        _run(fake, subs, tmp_path / f"shard{i}", "--shard", f"{i}/3")
    lost = sorted(r["student"] for r in _grades(tmp_path / "shard2" / "grades.csv"))
    capsys.readouterr()
    code = merge.main([str(tmp_path / "shard0"), str(tmp_path / "shard1"), "--out", str(tmp_path / "m")])
    err = capsys.readouterr().err
    assert code == 1 and not (tmp_path / "m" / "grades.csv").exists()
    assert all(name in err for name in lost) and f"{len(lost)} students have no row" in err
    # --allow-partial writes what there is and says who is missing, in grades.csv too.
    code = merge.main([str(tmp_path / "shard0"), str(tmp_path / "shard1"), "--out", str(tmp_path / "m"),
                       "--allow-partial", "--no-report"])
    rows = {r["student"]: r for r in _grades(tmp_path / "m" / "grades.csv")}
    assert code == 0 and len(rows) == 12
    assert {n for n, r in rows.items() if r["status"] == "not merged"} == set(lost)


def test_a_shard_given_twice_is_a_duplicate(tmp_path, fake, capsys):
    subs = _class(tmp_path, 6)
    for i in range(2):
        _run(fake, subs, tmp_path / f"shard{i}", "--shard", f"{i}/2")
    code = merge.main([str(tmp_path / "shard0"), str(tmp_path / "shard1"), str(tmp_path / "shard0"),
                       "--out", str(tmp_path / "m")])
    assert code == 1 and "in more than one shard" in capsys.readouterr().err


@pytest.mark.parametrize("differ", ["seed", "options", "split"])
def test_shards_graded_differently_are_refused(tmp_path, fake, differ):
    subs = _class(tmp_path, 6)
    _run(fake, subs, tmp_path / "a", "--shard", "0/2")
    other = {"seed": dict(seed="1234567890123"), "options": {}, "split": {}}[differ]
    more = {"seed": ["--shard", "1/2"], "options": ["--shard", "1/2", "--public-only"],
            "split": ["--shard", "1/3"]}[differ]
    _run(fake, subs, tmp_path / "b", *more, **other)
    with pytest.raises(SystemExit) as e:
        merge.merge([tmp_path / "a", tmp_path / "b"], tmp_path / "m")
    words = {"seed": "seed (compared by keyed hash)", "options": "grading options",
             "split": "different splits"}
    assert words[differ] in str(e.value) and "1234567890123" not in str(e.value)


def test_merge_of_a_folder_that_is_no_class_run_says_so(tmp_path):
    with pytest.raises(SystemExit) as e:
        merge.merge([tmp_path], tmp_path / "m")
    assert "class-run.json" in str(e.value)


MATRIX = REPO / "classroom" / "instructor" / ".github" / "workflows" / "grade-class-matrix.yml"


def test_the_matrix_workflow_grades_shards_and_merges_them():
    wf = yaml.safe_load(MATRIX.read_text())
    grade, final = wf["jobs"]["grade"], wf["jobs"]["merge"]
    shards_listed = grade["strategy"]["matrix"]["shard"]
    assert shards_listed == list(range(len(shards_listed))) and grade["strategy"]["fail-fast"] is False
    assert final["needs"] == "grade"
    run = "\n".join(s.get("run", "") for s in grade["steps"])
    env = {k: v for s in grade["steps"] for k, v in (s.get("env") or {}).items()}
    assert env["GRADER_SHARD"] == "${{ matrix.shard }}/${{ strategy.job-total }}" and "GRADER_SEED" in env
    assert "--preserve-env=GRADER_SEED,GRADER_SHARD," in run and "--roster roster.csv" in run
    assert "-m grader merge" in "\n".join(s.get("run", "") for s in final["steps"])
    # the class-mode command line parses, and the shard it reads from the environment is valid
    line = run.replace("\\\n", " ").split("-m grader class", 1)[1].splitlines()[0]
    args = classroom.build_parser().parse_args(shlex.split(line.replace('"$DUE"', "''")))
    assert args.submissions.name == "submissions" and args.roster.name == "roster.csv"
    assert shards.from_env({"GRADER_SHARD": "3/4"})[0] == shards.Shard(3, 4)


# --------------------------------------------------------------------------- the real engine


def _real_class(root: Path, n: int) -> Path:
    correct = (REPO / "tests" / "buggy" / "correct.py").read_text()
    bugs = ["", "\n\ndef causal_mask(n, *, device=None):\n    return torch.ones(n, n, dtype=torch.bool, "
                "device=device).tril(-1)\n",
            "\n\ndef padding_mask(lengths, max_len):\n    return torch.arange(max_len, device=lengths.device)"
            "[None, :] <= lengths[:, None]\n"]
    subs = root / "subs"
    subs.mkdir()
    for i in range(n):
        (subs / f"s{i:02d}.py").write_text(correct + bugs[i % 3])
    return subs


@pytest.mark.slow
def test_forty_students_in_four_shards_grade_as_one_run(tmp_path, monkeypatch):
    subs = _real_class(tmp_path, 40)
    monkeypatch.setenv("GRADER_SEED", "271828182845904523536028747135266249775")
    common = ["--jobs", "2", "--no-progress", "--exercise", "causal_mask", "--exercise", "padding_mask"]
    assert classroom.main([str(subs), "--out", str(tmp_path / "whole"), *common]) == 0
    for i in range(4):
        monkeypatch.setenv("GRADER_SHARD", f"{i}/4")  # as the matrix workflow passes it
        assert classroom.main([str(subs), "--out", str(tmp_path / f"shard{i}"), *common]) == 0
    monkeypatch.delenv("GRADER_SHARD")
    outs = [str(tmp_path / f"shard{i}") for i in range(4)]
    assert merge.main([*outs, "--out", str(tmp_path / "merged")]) == 0
    whole, merged = _grades(tmp_path / "whole" / "grades.csv"), _grades(tmp_path / "merged" / "grades.csv")
    assert len(merged) == 40 and merged == whole
    top = _fmt(__import__("grader.checks", fromlist=["POINTS"]).POINTS["causal_mask"])  # as grades.csv has it
    assert {r["causal_mask"] for r in merged} == {"0", top} and {r["status"] for r in merged} == {"graded"}
    # Each student's results.json came across, and the merged class report counts the whole class.
    assert all((tmp_path / "merged" / r["student"] / "results.json").is_file() for r in merged)
    report = (tmp_path / "merged" / "class-report.md").read_text()
    assert "| causal_mask | diagonal_excluded | 13 |" in report
    assert "| padding_mask | padding_off_by_one | 13 |" in report
    # A merge that lacks shard 3 fails, naming shard 3's students.
    lost = [r["student"] for r in _grades(tmp_path / "shard3" / "grades.csv")]
    proc = subprocess.run([sys.executable, "-m", "grader", "merge", *outs[:3], "--out", str(tmp_path / "m")],
                          capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 1 and lost and all(n in proc.stderr for n in lost), proc.stderr


def _guide_block(after: str) -> str:
    """The first ```bash block of the guide's page after the line containing ``after``."""
    text = (REPO / "book" / "grading_large_class.md").read_text()
    rest = text.split(after, 1)[1]
    return rest.split("```bash\n", 1)[1].split("```", 1)[0]


@pytest.mark.slow
def test_the_guides_slurm_script_grades_and_merges_a_class(tmp_path):
    """The sbatch script of book/grading_large_class.md, run as written, one array task after
    another with the variables Slurm sets, then the merge line of its submission block."""
    script = _guide_block("Save this as `grade.sbatch`")
    assert "#SBATCH --array=0-15" in script
    tasks = 3  # as with --array=0-2
    subs = _real_class(tmp_path, 6)
    (tmp_path / "grade.sbatch").write_text(script)
    # `python` in the script is this test's interpreter, wherever it lies (a venv need not be activated)
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    env = {**os.environ, "PATH": path, "PYTHONPATH": str(REPO),
           "GRADER_SEED": "314159265358979323846264338327950288419",
           "SUBMISSIONS": str(subs), "OUT": str(tmp_path / "grading"), "SLURM_ARRAY_TASK_COUNT": str(tasks),
           "SLURM_ARRAY_TASK_MIN": "0", "SLURM_CPUS_PER_TASK": "2"}
    for i in range(tasks):
        proc = subprocess.run(["bash", str(tmp_path / "grade.sbatch")], cwd=REPO, capture_output=True,
                              text=True, env={**env, "SLURM_ARRAY_TASK_ID": str(i)}, timeout=600)
        assert proc.returncode == 0 and f"shard {i}/{tasks}" in proc.stderr, proc.stderr[-2000:]
    submit = _guide_block("and submit it")
    merge_line = submit.split("--wrap '", 1)[1].rsplit("'", 1)[0]
    proc = subprocess.run(["bash", "-c", merge_line], cwd=REPO, capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = _grades(tmp_path / "grading" / "grades" / "grades.csv")
    assert sorted(r["student"] for r in rows) == [f"s{i:02d}" for i in range(6)]
    assert all(r["status"] == "graded" for r in rows)
