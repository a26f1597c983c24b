"""Class data that a student or a shard controls, held to what class mode itself writes.

* a forged shard's folder (a total of 1000 where the maximum is 10, ``nan``, two rows of one
  student, a row whose folder is another student's) is refused by the merge, naming the shard
  and the row; an honest merge still goes through;
* two students whose names differ only by case are refused at discovery, both named;
* accents are transliterated in a student's folder name (``Zoë`` -> ``Zoe``);
* a hand-in time read from the student's own commit is marked as their claim, in grades.csv
  and in the class report; the roster's (the platform's) is not;
* the class report counts an exercise the grader did not find as "not found".

The class is graded by a fake grader (the scores a submission's lines name), as in
``test_class_shards``.
"""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from grader.runners.classmode import classreport, classroom, lateness, merge, roster

EXERCISES = ("causal_mask", "attention")
FAKE = r"""
import json, sys
from pathlib import Path
sub, out = Path(sys.argv[1]), Path(sys.argv[2])
text = sub.read_text() if sub.is_file() else "\n".join(p.read_text() for p in sorted(sub.rglob("*.py")))
scores = {"causal_mask": 0.0, "attention": 0.0}
for line in text.splitlines():
    name, _, value = line.partition("=")
    if name in scores:
        scores[name] = float(value)
tests = [{"name": f"{n} (chapter 1)", "score": s, "max_score": 10, "output": "ok"} for n, s in scores.items()]
out.write_text(json.dumps({"score": sum(scores.values()), "max_score": 20, "tests": tests}))
"""


@pytest.fixture
def fake(tmp_path):
    script = tmp_path / "fake_grader.py"
    script.write_text(FAKE)
    return lambda sub, results, seed, extra: [sys.executable, str(script), str(sub), str(results)]


def _grade(fake, subs: Path, out: Path, *more: str) -> int:
    return classroom.main(
        [str(subs), "--out", str(out), "--jobs", "2", "--seed", "5", "--no-progress", "--no-report", *more],
        command=fake,
        exercises=EXERCISES,
    )


@pytest.fixture
def two_shards(tmp_path, fake, monkeypatch) -> list[Path]:
    monkeypatch.setattr(classroom, "grader_fingerprint", lambda: "pinned")
    subs = tmp_path / "subs"
    subs.mkdir()
    for i, name in enumerate(["alice", "bob", "carol", "dave", "erin", "mallory"]):
        (subs / f"{name}.py").write_text(f"causal_mask={i}\nattention={10 - i}\n")
    outs = [tmp_path / f"shard{i}" for i in range(2)]
    for i, out in enumerate(outs):
        assert _grade(fake, subs, out, "--shard", f"{i}/2") == 0
    return outs


def _record(out: Path) -> dict:
    return json.loads((out / "class-run.json").read_text())


def _forge(out: Path, change) -> None:
    record = _record(out)
    change(record)
    (out / "class-run.json").write_text(json.dumps(record))


def _holding(outs: list[Path], student: str) -> Path:
    return next(o for o in outs if any(r["student"] == student for r in _record(o)["rows"]))


def test_an_honest_merge_goes_through_and_records_the_maxima(two_shards, tmp_path):
    assert merge.main([*map(str, two_shards), "--out", str(tmp_path / "m"), "--no-report"]) == 0
    assert _record(two_shards[0])["maxima"] == {"causal_mask": 10, "attention": 10}


def _refused(outs, tmp_path, *words):
    with pytest.raises(SystemExit) as e:
        merge.merge(outs, tmp_path / "m", report=False)
    assert all(w in str(e.value) for w in ("refusing to merge", *words)), str(e.value)


def test_points_above_the_maximum_are_refused(two_shards, tmp_path):
    shard = _holding(two_shards, "mallory")
    (shard / "mallory" / "results.json").write_text(
        json.dumps(
            {
                "score": 1000,
                "max_score": 1000,
                "tests": [{"name": "causal_mask (chapter 1)", "score": 1000, "max_score": 1000}],
            }
        )
    )
    _refused(two_shards, tmp_path, str(shard), "'mallory'", "causal_mask", "maximum is 10")


@pytest.mark.parametrize("where", ["row", "results"])
def test_a_total_that_is_not_a_number_is_refused(two_shards, tmp_path, where):
    shard = _holding(two_shards, "bob")
    if where == "row":
        _forge(shard, lambda r: [row.update(total=math.nan) for row in r["rows"] if row["student"] == "bob"])
    else:
        (shard / "bob" / "results.json").write_text(
            '{"score": NaN, "max_score": 20, "tests": [{"name": "causal_mask (chapter 1)", "score": NaN, '
            '"max_score": 10}]}'
        )
    _refused(two_shards, tmp_path, str(shard), "'bob'")


def test_two_rows_of_one_student_in_a_shard_are_refused(two_shards, tmp_path):
    shard = _holding(two_shards, "alice")
    _forge(shard, lambda r: r["rows"].append(next(dict(x) for x in r["rows"] if x["student"] == "alice")))
    _refused(two_shards, tmp_path, str(shard), "repeats the student")


def test_a_row_naming_another_students_folder_is_refused(two_shards, tmp_path):
    shard = _holding(two_shards, "mallory")
    _forge(shard, lambda r: [row.update(slug="alice") for row in r["rows"] if row["student"] == "mallory"])
    _refused(two_shards, tmp_path, str(shard), "'mallory'", "'alice'")


def test_the_shards_maxima_must_agree(two_shards, tmp_path):
    _forge(two_shards[1], lambda r: r["maxima"].update(causal_mask=1000))
    _refused(two_shards, tmp_path, "different maxima")


def test_names_that_differ_only_by_case_are_refused_at_discovery(tmp_path, fake):
    subs = tmp_path / "subs"
    for name in ("Bob", "bob", "carol"):
        (subs / name).mkdir(parents=True)
        (subs / name / "ex.py").write_text("causal_mask=1\n")
    with pytest.raises(SystemExit, match="differ only by case: 'Bob' and 'bob'"):
        roster.discover(subs)
    proc = subprocess.run(
        [sys.executable, "-m", "grader", "class", str(subs), "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "'Bob' and 'bob'" in proc.stderr and not (tmp_path / "o").exists()


def test_accents_are_transliterated_in_folder_names(tmp_path):
    subs = tmp_path / "subs"
    for name in ("Zoë", "Zoé", "Łukasz"):
        (subs / name).mkdir(parents=True)
    slugs = {s.name: s.slug for s in roster.discover(subs)[0]}
    assert (
        slugs["Zoë"] in ("Zoe", "Zoe-2") and slugs["Zoé"] in ("Zoe", "Zoe-2") and slugs["Zoë"] != slugs["Zoé"]
    )
    assert slugs["Łukasz"] == "_ukasz"  # no decomposition: only what NFKD can spell in ASCII


def _git_commit(folder: Path, when: str) -> None:
    env = {
        "GIT_AUTHOR_DATE": when,
        "GIT_COMMITTER_DATE": when,
        "HOME": str(folder),
        "GIT_AUTHOR_NAME": "s",
        "GIT_AUTHOR_EMAIL": "s@x",
        "GIT_COMMITTER_NAME": "s",
        "GIT_COMMITTER_EMAIL": "s@x",
        "PATH": "/usr/bin:/bin",
    }
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "work"]):
        subprocess.run(["git", *args], cwd=folder, env=env, check=True)


def test_a_commit_date_is_the_students_claim_and_the_roster_time_is_not(tmp_path, fake):
    subs = tmp_path / "subs"
    for name in ("ann", "ben"):
        (subs / name).mkdir(parents=True)
        (subs / name / "ex.py").write_text("causal_mask=3\n")
        _git_commit(subs / name, "2026-02-26T12:00:00+00:00")  # dated three days early
    roster_csv = tmp_path / "roster.csv"
    roster_csv.write_text("id,name,folder,submitted\nann,Ann,ann,2026-03-02T12:00:00+00:00\nben,Ben,ben,\n")
    out = tmp_path / "out"
    assert (
        classroom.main(
            [
                str(subs),
                "--out",
                str(out),
                "--seed",
                "5",
                "--no-progress",
                "--roster",
                str(roster_csv),
                "--due",
                "2026-03-01T12:00:00+00:00",
                "--late-policy",
                "10/day",
            ],
            command=fake,
            exercises=EXERCISES,
        )
        == 0
    )
    with open(out / "grades.csv", newline="") as fh:
        rows = {r["id"]: r for r in csv.DictReader(fh)}
    assert (rows["ann"]["days_late"], rows["ann"]["submitted_from"]) == ("1", lateness.FROM_ROSTER)
    uncounted = lateness.uncounted(lateness.FROM_COMMIT)
    assert (rows["ben"]["days_late"], rows["ben"]["submitted_from"]) == ("0", uncounted)
    report = (out / "class-report.md").read_text()
    assert "1 hand-in times are the student's own claim" in report and "not counted for lateness" in report


@pytest.mark.parametrize("trust", [False, True])
def test_a_backdated_commit_never_makes_its_author_earlier_than_an_honest_classmate(tmp_path, fake, trust):
    """Two students hand in together, a day after the due date, with no platform time: one
    backdates the commit by three days. Unless the instructor trusts the students' dates, neither
    date counts, and the two get the same lateness; trusted, each date counts as written."""
    subs = tmp_path / "subs"
    for name, when in (("liar", "2026-02-26T12:00:00+00:00"), ("honest", "2026-03-02T12:00:00+00:00")):
        (subs / name).mkdir(parents=True)
        (subs / name / "ex.py").write_text("causal_mask=3\n")
        _git_commit(subs / name, when)
    out = tmp_path / "out"
    argv = [str(subs), "--out", str(out), "--seed", "5", "--no-progress",
            "--due", "2026-03-01T12:00:00+00:00", "--late-policy", "10/day",
            *(["--trust-student-dates"] if trust else [])]
    assert classroom.main(argv, command=fake, exercises=EXERCISES) == 0
    with open(out / "grades.csv", newline="") as fh:
        rows = {r["student"]: r for r in csv.DictReader(fh)}
    late = {name: (rows[name]["days_late"], float(rows[name]["penalty"])) for name in ("liar", "honest")}
    if trust:
        assert late["liar"][0] == "0" and late["honest"][0] == "1" and late["honest"][1] > 0
    else:
        assert late["liar"] == late["honest"] == ("0", 0.0)
        assert all(lateness.is_claim(rows[n]["submitted_from"]) for n in late)


def test_the_class_report_counts_not_found_as_its_own_category(tmp_path):
    (tmp_path / "s1").mkdir()
    (tmp_path / "s1" / "results.json").write_text(
        json.dumps(
            {
                "score": 0,
                "max_score": 20,
                "extra_data": {"status": {"causal_mask": "not found", "attention": "failed"}},
                "tests": [
                    {
                        "name": "causal_mask (chapter 1)",
                        "score": 0,
                        "max_score": 10,
                        "output": "not found in s1",
                    },
                    {"name": "attention (chapter 1)", "score": 0, "max_score": 10, "output": "wrong"},
                ],
            }
        )
    )
    record = {"exercises": list(EXERCISES), "rows": [{"student": "s1", "slug": "s1", "status": "graded"}]}
    stats = classreport.gather(tmp_path, record)
    assert stats["causal_mask"].mistakes == {classreport.NOT_FOUND: 1}
    assert stats["attention"].mistakes == {classreport.OTHER: 1}


def test_the_hand_in_time_is_the_releases_not_the_tags_name_nor_the_commits(tmp_path, capsys):
    """``repos tags``: the clone list, and the roster's submitted column from each tag's Release:
    when GitHub published it (``published_at``), not its ``created_at`` (GitHub documents it as the
    tagged commit's date, which the student sets); a student without a tag is not cloned and has no time."""
    from grader.runners.classmode import rosterfile
    from grader.runners.platforms import repos

    release = {"tag_name": "submit/2026-02-20T00-00-00Z-aaaaaaa", "created_at": "2026-02-20T00:00:00Z",
               "published_at": "2026-03-02T12:00:00Z"}
    calls = []

    def api(path, params):
        calls.append(path)
        if path == "repos/org/ml-masks-ann/releases":
            return [release]
        if path == "repos/org/ml-masks-ben/releases":
            return []
        if path == "repos/org/ml-masks-ben/git/matching-refs/tags/submit/":
            return []
        raise AssertionError(path)

    roster_csv = tmp_path / "roster.csv"
    roster_csv.write_text("id,name,folder\nann,ann,ann\nben,ben,ben\n")
    assert repos.main(["tags", "org", "ml-masks", "--roster", str(roster_csv)], api=api) == 0
    assert capsys.readouterr().out.split("\n")[0] == "ann submit/2026-02-20T00-00-00Z-aaaaaaa"
    stamped = {e.id: e.submitted for e in rosterfile.read(roster_csv)}
    assert stamped == {"ann": "2026-03-02T12:00:00Z", "ben": None}


def test_the_canvas_export_matches_exactly_and_refuses_two_matches():
    from grader.runners.platforms import export

    person = {"Student": "Bob Roe", "ID": "7", "SIS User ID": "", "SIS Login ID": "bob", "Section": ""}
    rows = [{"student": "Bob", "total": 0.0}, {"student": "bob", "total": 2.5}]
    assert export._match(person, rows)["total"] == 2.5  # exactly "bob", not the first case-insensitive
    with pytest.raises(SystemExit, match="matches 2 graded rows: 'BOB', 'Bob'"):
        export._match(person, [{"student": "BOB", "total": 0.0}, {"student": "Bob", "total": 2.5}])
