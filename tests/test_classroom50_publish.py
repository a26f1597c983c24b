"""``python -m grader classroom50 publish``: a class run's grades in Classroom 50's gradebook.

Classroom 50's gradebook rules are written here as facts, from their ``scores/v1`` and
``result/v1`` schemas and ``collect_scores.py`` (their files are not copied):

* scores.json is ``{"schema": "classroom50/scores/v1", "assignments": {slug: bucket}}``; a slug
  matches ``^[a-z0-9][a-z0-9-]{1,99}$``; a bucket is ``{"type": "individual"|"group", "entries": []}``
  and may carry ``collected_at``;
* an entry needs ``owner`` (non-empty) and ``submissions`` (at least one, newest first);
  ``override`` is a boolean; owners are unique in a bucket, compared lowercased;
* a submission record is a result/v1 payload without ``assignment``: schema, classroom,
  assignment_type, owner, submission (``submit/...``), commit, release, review, datetime
  (``YYYY-MM-DDTHH:MM:SSZ``), score and max-score (non-negative integers, score <= max-score),
  tests (each: test-name, passed bool, score <= max-score, integers); ``graded_at`` as datetime;
  extra keys are kept (``additionalProperties``);
* the file holds no NaN or Infinity (``strict_json_loads``);
* collection replaces every entry of a student it collects, except an entry with
  ``"override": true``, which it keeps verbatim.
"""

from __future__ import annotations

import base64
import io
import json
import re
import sys
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import unquote

import pytest

from grader.runners.classmode import classroom, feedback
from grader.runners.platforms import classroom50, classroom50_publish

SLUG = re.compile(r"^[a-z0-9][a-z0-9-]{1,99}$")
STAMP = re.compile(r"^\d{4}-\d{2}-\d{2}T([01]\d|2[0-3]):[0-5]\d:[0-5]\dZ$")
RECORD_KEYS = {
    "schema",
    "classroom",
    "assignment_type",
    "owner",
    "submission",
    "commit",
    "release",
    "review",
    "datetime",
    "score",
    "max-score",
    "tests",
}
ORG, CLASSROOM, ASSIGNMENT = "ml-org", "ml-fall", "attention-masks"
SEED = 271828182845904523536


def _count(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def scores_problems(doc) -> list[str]:
    """Every rule of classroom50/scores/v1 (see the module) that ``doc`` breaks."""
    bad: list[str] = []
    if not isinstance(doc, dict) or doc.get("schema") != "classroom50/scores/v1":
        return ["schema"]
    if set(doc) - {"schema", "assignments"} or not isinstance(doc.get("assignments"), dict):
        return ["top-level keys"]
    for slug, bucket in doc["assignments"].items():
        if not SLUG.match(slug):
            bad.append(f"slug {slug!r}")
        if (
            not isinstance(bucket, dict)
            or bucket.get("type") not in ("individual", "group")
            or not isinstance(bucket.get("entries"), list)
            or set(bucket) - {"type", "entries", "collected_at"}
        ):
            bad.append(f"bucket {slug}")
            continue
        owners = [str(e.get("owner", "")).lower() for e in bucket["entries"] if isinstance(e, dict)]
        if len(owners) != len(set(owners)):
            bad.append(f"{slug}: an owner twice")
        for e in bucket["entries"]:
            if (
                not isinstance(e, dict)
                or not e.get("owner")
                or not isinstance(e.get("submissions"), list)
                or not e["submissions"]
            ):
                bad.append(f"{slug}: entry {e!r:.60}")
                continue
            if "override" in e and not isinstance(e["override"], bool):
                bad.append(f"{slug}/{e['owner']}: override")
            for s in e["submissions"]:
                bad += [f"{slug}/{e['owner']}: {p}" for p in record_problems(s)]
    return bad


def record_problems(s) -> list[str]:
    bad = [f"missing {k}" for k in sorted(RECORD_KEYS - set(s))]
    if bad:
        return bad
    if s["schema"] != "classroom50/result/v1" or "assignment" in s:
        bad.append("schema/assignment")
    if s["assignment_type"] not in ("individual", "group") or not str(s["submission"]).startswith("submit/"):
        bad.append("type or submission")
    if not all(isinstance(s[k], str) and s[k] for k in ("classroom", "owner", "commit", "release", "review")):
        bad.append("identity strings")
    for k in ("datetime", "graded_at"):
        if k in s and not STAMP.match(str(s[k])):
            bad.append(k)
    if not (_count(s["score"]) and _count(s["max-score"])) or s["score"] > s["max-score"]:
        bad.append(f"score {s['score']!r} of {s['max-score']!r}")
    for t in s["tests"]:
        if not (
            isinstance(t.get("test-name"), str)
            and t["test-name"]
            and isinstance(t.get("passed"), bool)
            and _count(t.get("score"))
            and _count(t.get("max-score"))
            and t["score"] <= t["max-score"]
        ):
            bad.append(f"test {t!r:.80}")
    return bad


def collect(doc: dict, slug: str, collected: list[dict]) -> dict:
    """What Classroom 50's collection does to ``doc`` (a fact of the module): every collected
    entry replaces its owner's, except one marked ``"override": true``."""
    doc = json.loads(json.dumps(doc))
    entries = doc["assignments"].setdefault(slug, {"type": "individual", "entries": []})["entries"]
    for new in collected:
        at = [i for i, e in enumerate(entries) if e["owner"].lower() == new["owner"].lower()]
        if not at:
            entries.append(new)
        elif entries[at[0]].get("override") is not True:
            entries[at[0]] = new
    return doc


def test_the_rules_can_fail():
    good = {
        "schema": "classroom50/scores/v1",
        "assignments": {
            ASSIGNMENT: {
                "type": "individual",
                "entries": [
                    {
                        "owner": "a",
                        "submissions": [
                            {
                                "schema": "classroom50/result/v1",
                                "classroom": "c",
                                "assignment_type": "individual",
                                "owner": "a",
                                "submission": "submit/x",
                                "commit": "c",
                                "release": "r",
                                "review": "v",
                                "datetime": "2026-11-01T10:00:00Z",
                                "score": 1,
                                "max-score": 2,
                                "tests": [],
                            }
                        ],
                    }
                ],
            }
        },
    }
    assert scores_problems(good) == []
    rec = good["assignments"][ASSIGNMENT]["entries"][0]["submissions"][0]
    for broken in (
        {"score": 1.5},
        {"score": 3},
        {"datetime": "2026-11-01"},
        {"assignment": ASSIGNMENT},
        {"submission": "v1"},
        {"tests": [{"test-name": "t", "passed": 1, "score": 0, "max-score": 1}]},
    ):
        doc = json.loads(json.dumps(good))
        doc["assignments"][ASSIGNMENT]["entries"][0]["submissions"][0] = {**rec, **broken}
        assert scores_problems(doc), broken
    doc = json.loads(json.dumps(good))
    doc["assignments"][ASSIGNMENT]["entries"].append(
        {**doc["assignments"][ASSIGNMENT]["entries"][0], "owner": "A"}
    )
    assert scores_problems(doc) == [f"{ASSIGNMENT}: an owner twice"]


# --------------------------------------------------------------------------- a fake GitHub


class FakeGitHub:
    """GitHub's REST API for three student repositories and the config repository; records calls."""

    def __init__(self, scores: dict | None, releases: dict[str, list] | None = None, committed: str = ""):
        self.calls: list[tuple[str, str]] = []
        self.puts: dict[str, dict] = {}
        self.uploads: dict[str, bytes] = {}
        self.scores = scores
        self.releases = releases or {}
        self.committed = committed or "2026-11-01T09:59:58Z"

    def get(self, path):
        self.calls.append(("GET", path))
        assert "submit/" not in path, f"a tag in a path goes %-encoded (it holds a slash): {path}"
        path = unquote(path)
        m = re.fullmatch(rf"repos/{ORG}/({CLASSROOM}-{ASSIGNMENT}-[a-z]+)/releases/tags/(submit/.+)", path)
        if m:
            return {
                "id": hash(m.group(1)) % 1000,
                "tag_name": m.group(2),
                "created_at": "2026-11-01T10:05:00Z",
                "published_at": "2026-11-01T10:05:00Z",
                "html_url": f"https://github.com/{ORG}/{m.group(1)}/releases/tag/x",
                "assets": [{"id": 7, "name": "result.json"}, {"id": 8, "name": "grader-feedback.md"}],
            }
        m = re.fullmatch(rf"repos/{ORG}/({CLASSROOM}-{ASSIGNMENT}-[a-z]+)/releases\?per_page=100", path)
        if m:
            return self.releases.get(m.group(1), [])
        m = re.fullmatch(rf"repos/{ORG}/({CLASSROOM}-{ASSIGNMENT}-[a-z]+)/commits/(submit/.+)", path)
        if m:
            return {"sha": "abc1234" * 5 + "ab", "commit": {"committer": {"date": self.committed}}}
        if path == f"repos/{ORG}/classroom50/contents/{CLASSROOM}/scores.json":
            if self.scores is None:
                raise SystemExit("gh: Not Found (HTTP 404)")
            return {"sha": "f00", "content": base64.b64encode(json.dumps(self.scores).encode()).decode()}
        raise AssertionError(f"unexpected GET {path}")

    def put(self, path, body):
        self.calls.append(("PUT", path))
        self.puts[path] = body

    def delete(self, path):
        self.calls.append(("DELETE", path))

    def upload(self, url, data, content_type):
        self.calls.append(("POST", url))
        self.uploads[url] = data


FAKE_GRADER = r"""
import json, sys
from pathlib import Path
sub = Path(sys.argv[1])
points = float((sub / "score.txt").read_text())
Path(sys.argv[2]).write_text(json.dumps({"score": points + 4, "max_score": 6.5, "extra_data": {"seed": %d},
  "output": "Score · seed %d", "tests": [
    {"name": "causal_mask (chapter 1)", "score": points, "max_score": 2.5,
     "output": "x\n✗ matches reference (n=4) (public): the diagonal is missing\n    see check()\n"
               "✗ n = 2 (hidden): the diagonal is missing\n    the hidden case n=2 said %d"},
    {"name": "attention (chapter 2)", "score": 4, "max_score": 4, "output": "✓ a (public)\n✓ b (hidden)"}]}))
""".replace("%d", str(SEED))


@pytest.fixture
def class_run(tmp_path, monkeypatch) -> Path:
    """A class of three graded by class mode (a fake grader: each scores its score.txt)."""
    monkeypatch.setattr(classroom, "grader_fingerprint", lambda: "pinned")
    script = tmp_path / "fake_grader.py"
    script.write_text(FAKE_GRADER)
    subs = tmp_path / "subs"
    for login, points in (("alice", 2.5), ("bob", 1.0), ("carol", 0.0)):
        (subs / login).mkdir(parents=True)
        (subs / login / "ex.py").write_text("def causal_mask(n):\n    pass\n")
        (subs / login / "score.txt").write_text(str(points))
    out = tmp_path / "grades"
    command = lambda sub, results, seed, extra: [sys.executable, str(script), str(sub), str(results)]  # noqa: E731
    assert (
        classroom.main(
            [str(subs), "--out", str(out), "--seed", str(SEED), "--no-progress", "--no-report"],
            command=command,
            exercises=("causal_mask", "attention"),
        )
        == 0
    )
    return out


COLLECTED_ALICE = {
    "owner": "alice",
    "submissions": [
        {
            "schema": "classroom50/result/v1",
            "classroom": CLASSROOM,
            "assignment_type": "individual",
            "owner": "alice",
            "submission": "submit/2026-11-01T10-00-00Z-abc1234",
            "commit": "c",
            "release": "r",
            "review": "v",
            "datetime": "2026-11-01T09:59:58Z",
            "score": 7,
            "max-score": 7,
            "tests": [],
        }
    ],
}
TEACHER_DAVE = {
    "owner": "dave",
    "override": True,
    "note": "graded by hand",
    "submissions": [{**COLLECTED_ALICE["submissions"][0], "owner": "dave", "score": 5}],
}


def _publish(class_run, gh, **kw):
    out = io.StringIO()
    tags = {u: "submit/2026-11-01T10-00-00Z-abc1234" for u in ("alice", "bob", "carol")}
    doc = classroom50_publish.publish(
        class_run,
        gh,
        org=ORG,
        classroom=CLASSROOM,
        assignment=ASSIGNMENT,
        tags=tags,
        now=datetime(2026, 11, 3, 8, 0, tzinfo=timezone.utc),
        out=out,
        **kw,
    )
    return doc, out.getvalue()


def test_the_scores_update_of_a_class_of_three_keeps_classroom50s_rules(class_run):
    existing = {
        "schema": "classroom50/scores/v1",
        "assignments": {ASSIGNMENT: {"type": "individual", "entries": [COLLECTED_ALICE, TEACHER_DAVE]}},
    }
    gh = FakeGitHub(existing)
    doc, _ = _publish(class_run, gh)
    assert scores_problems(doc) == []
    entries = {e["owner"]: e for e in doc["assignments"][ASSIGNMENT]["entries"]}
    assert entries["dave"] == TEACHER_DAVE  # another override, untouched
    assert set(entries) == {"alice", "bob", "carol", "dave"}
    got = {u: entries[u]["submissions"][0] for u in ("alice", "bob", "carol")}
    # the grade, in whole points: 6.5 -> 7 (a half rounds up), 5 -> 5, 4 -> 4, out of 7 (2.5 -> 3, 4)
    assert {u: (r["score"], r["max-score"]) for u, r in got.items()} == {
        "alice": (7, 7),
        "bob": (5, 7),
        "carol": (4, 7),
    }
    assert {u: r["grader"]["points"] for u, r in got.items()} == {"alice": 6.5, "bob": 5.0, "carol": 4.0}
    for r in got.values():
        assert sum(t["score"] for t in r["tests"]) == r["score"]
        assert r["datetime"] == "2026-11-01T09:59:58Z"  # the graded commit's committer date
        assert r["graded_at"] == "2026-11-03T08:00:00Z"
        assert r["submission"] == "submit/2026-11-01T10-00-00Z-abc1234"
    assert all(entries[u]["override"] is True for u in ("alice", "bob", "carol"))
    assert entries["alice"]["submissions"][1] == COLLECTED_ALICE["submissions"][0]  # history kept, ours first
    # Classroom 50's next collection (the public-check scores) leaves every grade where it is
    recollected = collect(
        doc, ASSIGNMENT, [{**COLLECTED_ALICE, "owner": u} for u in ("alice", "bob", "dave")]
    )
    assert recollected == doc
    # written once, with the sha it read; the feedback replaces the old asset on each release
    put = gh.puts[f"repos/{ORG}/classroom50/contents/{CLASSROOM}/scores.json"]
    assert put["sha"] == "f00" and json.loads(base64.b64decode(put["content"])) == doc
    assert [c for c in gh.calls if c[0] == "DELETE"] == [
        ("DELETE", f"repos/{ORG}/{CLASSROOM}-{ASSIGNMENT}-{u}/releases/assets/8")
        for u in ("alice", "bob", "carol")
    ]
    assert len(gh.uploads) == 3 and all("name=grader-feedback.md" in url for url in gh.uploads)


def test_the_dry_run_prints_the_preview_and_changes_nothing(class_run):
    gh = FakeGitHub(None)  # no scores.json yet
    doc, printed = _publish(class_run, gh, dry_run=True, show_json=True)
    assert {c[0] for c in gh.calls} == {"GET"}
    table, rest = printed.split("# dry run: would write", 1)
    assert table.splitlines()[0].split() [:3] == ["student", "graded", "published"]
    assert re.search(r"^alice +6\.5 / 6\.5 +7 / 7 +submit/2026-11-01T10-00-00Z-abc1234 +2026-11-01 10:05 +"
                     r"2026-11-01 09:59", table, re.M)
    assert "3 of 3 students published; 0 not published" in table
    assert rest.startswith(f" {ORG}/classroom50:{CLASSROOM}/scores.json")
    body = rest.split("\n", 1)[1]
    assert json.loads(body[: body.index("\n# would attach")]) == doc
    assert scores_problems(doc) == []
    assert printed.count("# would attach grader-feedback.md") == 3
    _, quiet = _publish(class_run, FakeGitHub(None), dry_run=True)
    assert '"schema"' not in quiet and "--show-json prints it" in quiet


def test_a_dry_run_with_tags_asks_github_nothing(class_run, tmp_path, capsys):
    tags = tmp_path / "tags.txt"
    tags.write_text("alice submit/2026-11-01T10-00-00Z-abc1234\nbob submit/2026-11-02T10-00-00Z-def5678\n")
    assert classroom50_publish.command(["publish", str(class_run), "--org", ORG, "--classroom", CLASSROOM,
                                        "--assignment", ASSIGNMENT, "--tags", str(tags), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^bob +5 / 6\.5 +5 / 7 +submit/2026-11-02T10-00-00Z-def5678", out, re.M)
    assert re.search(r"^carol .*not published: no tag in --tags", out, re.M)
    assert "2 of 3 students published; 1 not published (offline" in out


def test_without_tags_the_release_published_last_is_graded_and_an_early_commit_is_flagged(class_run):
    """The student chooses tag names and commit dates; GitHub sets published_at."""
    def rel(tag, published):
        return {"id": 1, "tag_name": tag, "created_at": "2026-10-01T00:00:00Z", "published_at": published,
                "html_url": "h", "assets": []}

    repo = f"{CLASSROOM}-{ASSIGNMENT}-alice"
    gh = FakeGitHub(None, releases={repo: [rel("submit/9999-zzz", "2026-11-01T08:00:00Z"),
                                           rel("submit/2026-11-02-aaa", "2026-11-02T08:00:00Z"),
                                           rel("submit/2026-11-03-bbb", None)]},  # a draft
                    committed="2026-10-29T08:00:00Z")
    out = io.StringIO()
    doc = classroom50_publish.publish(class_run, gh, org=ORG, classroom=CLASSROOM, assignment=ASSIGNMENT,
                                      dry_run=True, out=out)
    entries = {e["owner"]: e for e in doc["assignments"][ASSIGNMENT]["entries"]}
    assert entries["alice"]["submissions"][0]["submission"] == "submit/2026-11-02-aaa"
    flagged = r"^alice .*commit dated 4\.0 days before its Release was published"
    assert re.search(flagged, out.getvalue(), re.M)
    assert re.search(r"^bob .*not published: no published submit/\* release", out.getvalue(), re.M)


def test_the_feedback_file_holds_no_seed_and_no_hidden_case(class_run):
    text = (class_run / "bob" / "feedback.md").read_text()
    assert str(SEED) not in text and "n = 2" not in text and "n=2" not in text
    assert "the diagonal is missing" in text  # the public check's feedback
    assert "| causal_mask (chapter 1) | 1 / 2.5 | 0 of 1 pass | 0 of 1 |" in text
    # results.json and grader.log stay the instructor's: they name the seed
    assert str(SEED) in (class_run / "bob" / "results.json").read_text()
    published = FakeGitHub(None)
    _publish(class_run, published)
    assert all(str(SEED).encode() not in data for data in published.uploads.values())


def test_feedback_keeps_the_late_penalty_and_drops_any_line_with_the_seed():
    results = {
        "score": 2,
        "max_score": 4,
        "extra_data": {"seed": 99991},
        "tests": [
            {
                "name": "x (chapter 1)",
                "score": 2,
                "max_score": 4,
                "output": "✗ p (public): got 99991\n✓ q (hidden)",
            }
        ],
    }
    text = feedback.feedback_text(results, student="s", row={"penalty": 1, "days_late": 1, "total": 1})
    assert "99991" not in text and "final 1 / 4" in text and "| 0 of 1 pass | 1 of 1 |" in text


def test_a_group_assignment_is_refused():
    doc = {"schema": "classroom50/scores/v1", "assignments": {ASSIGNMENT: {"type": "group", "entries": []}}}
    with pytest.raises(SystemExit, match="group assignment"):
        classroom50_publish.updated_scores(doc, ASSIGNMENT, [])


@pytest.mark.parametrize(
    ("scores", "tops", "total", "want"),
    [
        ([2.5, 2.5, 3.0], [2.5, 2.5, 3.0], None, [3, 2, 3]),  # full marks: whole points, 8
        ([2.5, 0.0, 0.0], [2.5, 2.5, 3.0], None, [3, 0, 0]),  # nothing on an exercise with none
        ([2.0, 1.2, 0.0], [2.5, 2.5, 3.0], None, [2, 1, 0]),  # 3.2 -> 3, never full where not full
        ([2.5, 2.5, 3.0], [2.5, 2.5, 3.0], 4.0, [1, 1, 2]),  # a late penalty takes from full ones too
    ],
)
def test_whole_scores_add_up_to_the_grade_rounded(scores, tops, total, want):
    got = classroom50.whole_scores(scores, tops, total=total)
    assert [g for g, _ in got] == want
    assert all(0 <= g <= w for g, w in got)
