"""The roster and the late policy: every student on the roster has a row, and lateness
costs what the policy says, extensions counted.

Class mode runs with a fake grader here (every student scores 20 of 20), so the
scores that come out are the late policy's arithmetic and nothing else.
"""

from __future__ import annotations

import csv
import os
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from grader.runners.classmode import classroom, lateness, merge, rosterfile
from grader.runners.classmode.shards import shard_of
from grader.runners.platforms import repos

FAKE = r'''
import json, sys
from pathlib import Path
tests = [{"name": f"{n} (chapter 1)", "score": 10, "max_score": 10, "output": "ok"}
         for n in ("causal_mask", "attention")]
Path(sys.argv[2]).write_text(json.dumps({"score": 20, "max_score": 20, "tests": tests}))
'''
DUE = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


@pytest.fixture
def fake(tmp_path):
    script = tmp_path / "fake_grader.py"
    script.write_text(FAKE)
    return lambda sub, results, seed, extra: [sys.executable, str(script), str(sub), str(results)]


def _hand_in(subs: Path, name: str, when: datetime) -> None:
    f = subs / name / "ex.py"
    f.parent.mkdir(parents=True)
    f.write_text("causal_mask = 10\n")
    os.utime(f, (when.timestamp(), when.timestamp()))


def _rows(path: Path) -> dict[str, dict[str, str]]:
    with open(path, newline="") as fh:
        return {r["id"] or r["student"]: r for r in csv.DictReader(fh)}


def test_roster_missing_late_and_extended_students_follow_the_policy(tmp_path, fake, capsys):
    subs = tmp_path / "subs"
    _hand_in(subs, "ann", DUE - timedelta(hours=1))  # on time
    _hand_in(subs, "ben", DUE + timedelta(days=1.5))  # 2 started days late, no extension: 20 % off
    _hand_in(subs, "cat", DUE + timedelta(days=2.5))  # late, but has 3 days' extension: nothing off
    _hand_in(subs, "eve", DUE)  # her files say on time; the roster says 5 days late: capped at 25 %
    _hand_in(subs, "zed", DUE)  # on nobody's roster
    roster = tmp_path / "roster.csv"
    roster.write_text("id,name,folder,extension_days,submitted\n"
                      "u1,Ann,ann,,\nu2,Ben,ben,,\nu3,Cat,cat,3,\nu4,Dan,dan,,\n"
                      f"u5,Eve,eve,,{(DUE + timedelta(days=5)).isoformat()}\n")
    code = classroom.main([str(subs), "--out", str(tmp_path / "out"), "--seed", "1", "--jobs", "2",
                           "--no-progress", "--no-report", "--roster", str(roster), "--due", DUE.isoformat(),
                           "--late-policy", "10/day,cap=25", "--trust-student-dates"], command=fake,
                          exercises=("causal_mask", "attention"))
    assert code == 0
    rows = _rows(tmp_path / "out" / "grades.csv")
    assert list(rows) == ["u1", "u2", "u3", "u4", "u5", "zed"]  # roster order, then the strangers
    got = {k: (r["raw"], r["penalty"], r["final"], r["status"]) for k, r in rows.items()}
    assert got == {"u1": ("20", "0", "20", "graded"), "u2": ("20", "4", "16", "graded"),
                   "u3": ("20", "0", "20", "graded"), "u4": ("0", "0", "0", "missing"),
                   "u5": ("20", "5", "15", "graded"), "zed": ("20", "0", "20", "graded")}
    assert rows["u2"]["days_late"] == "2" and rows["u3"]["days_late"] == "0"  # started days, as the penalty
    assert rows["u3"]["due"].startswith("2026-03-04T12:00")  # the due date with the extension
    assert rows["u4"]["name"] == "Dan" and "no submission" in rows["u4"]["message"]
    assert "not on the roster" in rows["zed"]["message"]
    assert "on nobody's roster" in capsys.readouterr().out


def test_a_sharded_roster_gives_each_missing_student_one_row(tmp_path, fake):
    subs = tmp_path / "subs"
    names = [f"st{i}" for i in range(10)]
    for n in names[:6]:
        _hand_in(subs, n, DUE)
    roster = tmp_path / "roster.csv"
    roster.write_text("id,name\n" + "".join(f"{n},{n.upper()}\n" for n in names))
    seen = []
    for i in range(3):
        classroom.main([str(subs), "--out", str(tmp_path / f"s{i}"), "--seed", "1", "--no-progress",
                        "--no-report",
                        "--roster", str(roster), "--shard", f"{i}/3"], command=fake,
                       exercises=("causal_mask", "attention"))
        seen += list(_rows(tmp_path / f"s{i}" / "grades.csv"))
    assert sorted(seen) == names  # every student once, the four missing ones included


@pytest.mark.parametrize(("policy", "seconds", "days", "off"), [
    ("none", 3 * 86400, 3, 0.0), ("10/day", 1, 1, 10.0), ("10/day", 864, 1, 10.0),
    ("10/day", 86400, 1, 10.0), ("10/day", 86401, 2, 20.0), ("10/day,cap=25", 9 * 86400, 9, 25.0),
    ("5%/day, cap=50%", 2 * 86400, 2, 10.0), ("10/day", 0, 0, 0.0), ("10/day", -5, 0, 0.0)])
def test_the_late_policy_in_one_place(policy, seconds, days, off):
    late = lateness.days_late(DUE + timedelta(seconds=seconds), DUE)
    assert late == days  # started days: one second late is one day, in the penalty's unit
    assert lateness.LatePolicy.parse(policy).penalty(late, 100.0) == off


@pytest.mark.parametrize("bad", ["10", "ten/day", "10/day,cap=", "150/day"])
def test_a_bad_late_policy_says_what_is_expected(bad):
    with pytest.raises(SystemExit, match="none, P/day"):
        lateness.LatePolicy.parse(bad)


def test_github_classroom_and_gradescope_rosters_are_read_as_they_come(tmp_path):
    gh = tmp_path / "classroom_roster.csv"
    gh.write_text('"identifier","github_username","github_id","name"\n'
                  '"ann@uni.edu","ann-gh","101","Ann A"\n"bob@uni.edu","","",""\n')
    (ann, bob) = rosterfile.read(gh)
    assert (ann.id, ann.name, ann.shard_key) == ("ann@uni.edu", "Ann A", "ann-gh")
    assert bob.keys == ("bob@uni.edu",)  # has not accepted the assignment: no GitHub user yet
    gs = tmp_path / "gradescope_roster.csv"
    gs.write_text("\ufeffFirst Name,Last Name,SID,Email,Role,Sections\n"
                  "Ann,Aa,1001,ann@uni.edu,Student,A\nTed,Tee,,ted@uni.edu,TA,\nCy,Cc,1003,cy@uni.edu,Student,B\n")
    people = rosterfile.read(gs)
    assert [(p.id, p.name) for p in people] == [("1001", "Ann Aa"), ("1003", "Cy Cc")]  # the TA is no student
    owner, strangers = rosterfile.match(people, ["ann", "1003", "someone"])
    assert owner == {"1001": "ann", "1003": "1003"} and strangers == ["someone"]


def test_a_roster_of_unknown_shape_is_refused_in_words(tmp_path):
    bad = tmp_path / "r.csv"
    bad.write_text("login,score\nann,3\n")
    with pytest.raises(SystemExit, match="expected id,name"):
        rosterfile.read(bad)


# --------------------------------------------------------------------------- listing the repositories


class FakeGitHub:
    """GitHub's API as ``gh api`` returns it, for an organisation of many repositories and a
    Classroom 50 team whose members are ``members`` (its ``members_count``: ``count``)."""

    def __init__(self, names, *, members=None, count=None, total=None, incomplete=False, tags=None,
                 releases=None):
        self.names, self.members, self.count, self.total = names, members or [], count, total
        self.incomplete, self.tags, self.releases = incomplete, tags or {}, releases or {}
        self.calls = []

    def __call__(self, path, params):
        self.calls.append((path, dict(params)))
        page, per = int(params.get("page", 1)), int(params.get("per_page", 30))
        if path.startswith("search/"):
            chunk = self.names[(page - 1) * per: page * per]
            return {"total_count": len(self.names) if self.total is None else self.total,
                    "incomplete_results": self.incomplete, "items": [{"name": n} for n in chunk]}
        if path.endswith("/members"):
            return [{"login": m, "id": i} for i, m in enumerate(self.members[(page - 1) * per: page * per])]
        if path.endswith("/releases"):
            return self.releases.get(path.split("/")[2], [])[(page - 1) * per: page * per]
        if "/git/matching-refs/tags/submit/" in path:
            repo = path.split("/")[2]
            return [{"ref": f"refs/tags/{t}", "object": {"sha": "0" * 40}} for t in self.tags.get(repo, [])]
        return {"members_count": len(self.members) if self.count is None else self.count}


def test_the_listing_pages_filters_at_the_source_and_loses_nobody(tmp_path, capsys):
    names = [f"masks-user{i:03d}" for i in range(250)] + ["masks-extra-notes"]
    api = FakeGitHub(names + ["unmasks-x"])  # search matches words, not prefixes
    assert repos.main(["list", "org", "masks", "--roster", str(tmp_path / "r.csv")], api=api) == 0
    listed = capsys.readouterr().out.split()
    assert len(listed) == 251 and "x" not in listed and "user249" in listed
    assert all("org:org masks-" in p["q"] for path, p in api.calls)  # filtered by GitHub, not after
    assert len(api.calls) == 3  # 100 a page
    assert len(rosterfile.read(tmp_path / "r.csv")) == 251


def test_a_classroom50_team_is_the_class_every_member_listed(tmp_path, capsys):
    """Classroom 50: the team classroom50-<classroom> is the class; repositories follow
    <classroom>-<assignment>-<user>. A member who never accepted is still listed (a roster row,
    then "missing"), and a repository of someone off the team is not."""
    members = [f"user{i:03d}" for i in range(230)]
    api = FakeGitHub(["ml-masks-stranger"], members=members)
    assert repos.main(["list", "org", "ml-masks", "--team", "classroom50-ml", "--roster",
                       str(tmp_path / "r.csv")], api=api) == 0
    listed = capsys.readouterr().out.split()
    assert listed == members and "stranger" not in listed
    assert [p for p, _ in api.calls] == ["orgs/org/teams/classroom50-ml"] + [
        "orgs/org/teams/classroom50-ml/members"] * 3  # 100 a page
    assert [e.keys[0] for e in rosterfile.read(tmp_path / "r.csv")] == members


def test_a_team_listing_short_of_the_team_size_fails():
    with pytest.raises(SystemExit, match="reports 120 members but listed 100"):
        repos.main(["list", "org", "m", "--team", "classroom50-x"],
                   api=FakeGitHub([], members=[f"u{i}" for i in range(100)], count=120))


def test_the_class_is_graded_at_each_repository_s_latest_submit_tag(capsys):
    api = FakeGitHub([], tags={"ml-masks-ann": ["submit/20261101T090000Z-aaaaaaa",
                                                "submit/20261103T170000Z-ccccccc",
                                                "submit/20261102T120000Z-bbbbbbb"]})
    assert repos.main(["tag", "org", "ml-masks-ann"], api=api) == 0
    assert capsys.readouterr().out.strip() == "submit/20261103T170000Z-ccccccc"
    assert repos.main(["tag", "org", "ml-masks-bob"], api=api) == 1  # nothing handed in: not cloned
    assert "no submit/* tag" in capsys.readouterr().err


def test_the_latest_submission_is_the_release_github_published_last_not_the_greatest_tag_name(capsys):
    """The student names tags (and backdates commits, which sets a Release's created_at); GitHub
    sets published_at. A draft, never published, is no submission."""
    def rel(tag, created, published):
        return {"tag_name": tag, "created_at": created, "published_at": published}

    tags = {"ml-masks-ann": ["submit/29991231T000000Z-zzzzzzz"]}
    api = FakeGitHub([], tags=tags, releases={"ml-masks-ann": [
        rel("submit/29991231T000000Z-zzzzzzz", "2026-11-01T09:00:00Z", "2026-11-01T09:00:05Z"),
        rel("submit/20261102T120000Z-bbbbbbb", "2026-10-01T00:00:00Z", "2026-11-02T12:00:05Z"),
        rel("submit/20261103T170000Z-ccccccc", "2026-11-03T17:00:00Z", None)]})  # a draft
    assert repos.main(["tag", "org", "ml-masks-ann"], api=api) == 0
    assert capsys.readouterr().out.strip() == "submit/20261102T120000Z-bbbbbbb"
    assert repos.latest_submission(api, "org", "ml-masks-ann") == ("submit/20261102T120000Z-bbbbbbb",
                                                                   "2026-11-02T12:00:05Z")


@pytest.mark.parametrize(("fake", "says"), [
    (FakeGitHub([f"m-{i}" for i in range(150)], total=151), "listed 150"),
    (FakeGitHub([f"m-{i}" for i in range(10)], incomplete=True), "incomplete results"),
    (FakeGitHub([f"m-{i}" for i in range(10)], total=4000), "over the 1000"),
])
def test_a_listing_that_looks_truncated_fails(fake, says):
    with pytest.raises(SystemExit, match=says):
        repos.main(["list", "org", "m"], api=fake)


def test_shards_that_each_cloned_only_their_own_students_merge_into_the_roster(tmp_path, fake):
    """As the matrix workflow runs: a GitHub Classroom roster (id = e-mail, folder = GitHub
    user), each shard's folder holding only its own students' clones; one student never
    accepted the assignment. The merge has every roster student once, in roster order."""
    users = [f"user{i}" for i in range(9)]
    roster = tmp_path / "classroom_roster.csv"
    roster.write_text("identifier,github_username,github_id,name\n" + "".join(
        f"{u}@uni.edu,{u if u != 'user4' else ''},{i},Student {i}\n" for i, u in enumerate(users)))
    outs = []
    for i in range(3):
        subs = tmp_path / f"clones{i}"
        subs.mkdir()
        for e in rosterfile.read(roster):  # what `python -m grader repos shard` prints for this shard
            if shard_of(e.shard_key, 3) == i and e.shard_key != "user4@uni.edu":
                _hand_in(subs, e.shard_key, DUE)
        outs.append(tmp_path / f"shard{i}")
        classroom.main([str(subs), "--out", str(outs[-1]), "--seed", "3", "--no-progress", "--no-report",
                        "--roster", str(roster), "--shard", f"{i}/3"], command=fake,
                       exercises=("causal_mask", "attention"))
    assert merge.main([*map(str, outs), "--out", str(tmp_path / "merged"), "--no-report"]) == 0
    rows = _rows(tmp_path / "merged" / "grades.csv")
    assert list(rows) == [f"{u}@uni.edu" for u in users]
    assert rows["user4@uni.edu"]["status"] == "missing"
    assert {r["status"] for k, r in rows.items() if k != "user4@uni.edu"} == {"graded"}

