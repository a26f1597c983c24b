"""``python -m grader classroom50 publish GRADES_DIR``: the instructor's grades in Classroom 50's gradebook.

Classroom 50 keeps each classroom's gradebook in its config repository, ``ORG/classroom50``,
as ``<classroom>/scores.json`` (schema ``classroom50/scores/v1``), written by its
``collect_scores.py``: per assignment a bucket ``{"type", "entries"}``, one entry per student
repository keyed by ``owner``, each with ``submissions`` (result/v1 records, newest first).
Collection replaces an entry on every run *unless* it carries ``"override": true``: those it
keeps verbatim. That is the one place a grade from outside its runner can live, so this
command writes each graded student's entry as an override whose newest submission record is
the instructor's grade (the class run's, with the secret seed), at the submission the class
was graded at (its ``submit/*`` tag). The records keep result/v1's rules: integer points
(:func:`~grader.runners.platforms.classroom50.whole_scores`, the grade rounded to the nearest point), a
``datetime`` that is the graded commit's committer date, ``graded_at`` the class run's time.

Each student's feedback file (``GRADES_DIR/STUDENT/feedback.md``, no seed and no hidden case)
goes onto the graded submission's Release as the asset ``grader-feedback.md`` (a Release-safe
name, not ``result.json`` nor ``release-body.md``, as Classroom 50's ``release_assets`` rules
ask). A Classroom 50 regrade edits the Release in place: publish again after one.

Either way it first prints a preview, one row per student: the graded total, the whole points
published, the graded Release, when GitHub published it, the commit's date, and who is not
published and why. The graded Release is the ``--tags`` one, else the ``submit/*`` Release GitHub
published last (``published_at``; a tag's name is the student's choice, and so is a Release's
``created_at``, the tagged commit's date); a commit dated more than :data:`EARLY` before its
Release was published is flagged (a student's date, worth a look, never used for lateness).
``--dry-run`` prints the preview and the uploads it would make and writes nothing; with
``--tags`` it asks GitHub nothing at all (the preview then shows the tags, not the Releases'
dates); ``--show-json`` adds the scores.json it would write. Every GitHub call goes through
``gh api`` (authenticated by ``$GH_TOKEN``: read the student repositories' releases, write the
config repository's contents and the releases' assets); no SDK is needed for six endpoints.
"""

from __future__ import annotations

import argparse
import base64
import json
import subprocess
import sys
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

from ..classmode import shards
from ..classmode.scores import read_results
from .classroom50 import DEFAULT_ASSIGNMENT, SCHEMA, whole_scores
from .classroom50 import main as classroom50_main
from .repos import latest_release, published

#: A commit dated this long before its Release was published is flagged in the preview.
EARLY = timedelta(days=1)

SCORES_SCHEMA = "classroom50/scores/v1"
FEEDBACK_ASSET = "grader-feedback.md"
FEEDBACK_FILE = "feedback.md"


class GitHub(Protocol):
    """The calls publishing makes; :class:`GhApi` makes them with ``gh api``, tests with a fake."""

    def get(self, path: str) -> Any: ...
    def put(self, path: str, body: dict[str, Any]) -> Any: ...
    def delete(self, path: str) -> Any: ...
    def upload(self, url: str, data: bytes, content_type: str) -> Any: ...


class GhApi:
    """GitHub's REST API through the GitHub CLI."""

    def _run(self, args: list[str], data: bytes | None = None) -> Any:
        try:
            proc = subprocess.run(["gh", "api", *args, "-H", "Accept: application/vnd.github+json"],
                                  input=data, capture_output=True, timeout=120)
        except FileNotFoundError:
            raise SystemExit("the GitHub CLI `gh` is not installed (https://cli.github.com/); publishing "
                             "talks to GitHub through it.") from None
        if proc.returncode != 0:
            raise SystemExit(f"`gh api {args[0]} {args[1] if len(args) > 1 else ''}` failed: "
                             f"{proc.stderr.decode(errors='replace').strip()[:500]}")
        return json.loads(proc.stdout or b"null")

    def get(self, path: str) -> Any:
        return self._run([path])

    def put(self, path: str, body: dict[str, Any]) -> Any:
        return self._run([path, "-X", "PUT", "--input", "-"], json.dumps(body).encode())

    def delete(self, path: str) -> Any:
        return self._run([path, "-X", "DELETE"])

    def upload(self, url: str, data: bytes, content_type: str) -> Any:
        return self._run([url, "-X", "POST", "-H", f"Content-Type: {content_type}", "--input", "-"], data)


def repo_name(classroom: str, assignment: str, login: str) -> str:
    """Classroom 50's student repository name (its ``assignment_repo_name``)."""
    return f"{classroom}-{assignment}-{login}".lower()


def _stamp(when: datetime) -> str:
    return when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _time(text: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None


def read_tags(path: Path | None) -> dict[str, str]:
    """``login tag`` lines (the instructor workflow's tags.txt): the tag each student was graded at."""
    if path is None:
        return {}
    tags = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[1].startswith("submit/"):
            tags[parts[0].lower()] = parts[1]
    return tags


class Offline:
    """No GitHub: a dry run with ``--tags`` knows the graded tags and needs nothing else."""

    def get(self, path: str) -> Any:
        raise SystemExit(f"offline: nothing asks GitHub for {path}")

    put = delete = upload = get


def graded_release(gh: GitHub, org: str, repo: str, tag: str | None) -> dict[str, Any] | None:
    """The Release of the submission graded: ``tag``'s, else the ``submit/*`` one GitHub published
    last (:func:`~grader.runners.platforms.repos.latest_release`: never the greatest tag name, which
    the student chooses); offline, a stand-in that holds the tag alone."""
    if isinstance(gh, Offline):
        return {"tag_name": tag} if tag else None
    if tag:
        return gh.get(f"repos/{org}/{repo}/releases/tags/{quote(tag, safe='')}")
    releases = gh.get(f"repos/{org}/{repo}/releases?per_page=100") or []
    return latest_release(releases if isinstance(releases, list) else [])


def _day(when: datetime | None) -> str:
    return when.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M") if when else "–"


def preview_row(row: dict[str, Any], record: dict[str, Any] | None, release: dict[str, Any] | None,
                commit: dict[str, Any], why: str = "") -> list[str]:
    """One line of the preview: student, graded total, points published, release, its publication
    time, the commit's date, and a note (why not published, or a commit dated far before)."""
    login = str(row.get("id") or row.get("student") or "?")
    total = "–" if row.get("status") != "graded" else f"{float(row.get('total') or 0):g}"
    if row.get("max"):
        total += f" / {float(row['max']):g}"
    points = f"{record['score']} / {record['max-score']}" if record else "–"
    out = published(release)
    committed = _time(((commit.get("commit") or {}).get("committer") or {}).get("date"))
    note = f"not published: {why}" if why else ""
    if not why and out and committed and out - committed > EARLY:
        note = (f"commit dated {(out - committed).total_seconds() / 86400:.1f} days before its Release was "
                "published (the student's date; lateness counts from the Release)")
    tag = str((release or {}).get("tag_name") or "–")
    return [login, total, points, tag, _day(out), _day(committed), note]


PREVIEW_HEADER = ["student", "graded", "published points", "release", "release published", "commit date",
                  "note"]


def preview(lines: Sequence[Sequence[str]]) -> str:
    """The preview as an aligned text table."""
    rows = [PREVIEW_HEADER, *lines]
    widths = [max(len(r[i]) for r in rows) for i in range(len(PREVIEW_HEADER) - 1)]
    lines = ("  ".join([*(c.ljust(w) for c, w in zip(r, widths)), r[-1]]).rstrip() for r in rows)
    return "\n".join(lines) + "\n"


def record_for(row: dict[str, Any], results: dict[str, Any], *, classroom: str, org: str, repo: str,
               release: dict[str, Any], commit: dict[str, Any], graded_at: datetime,
               server: str = "https://github.com") -> dict[str, Any]:
    """One result/v1 submission record (minus ``assignment``, as scores.json keeps them) for a row."""
    tests = [t for t in results.get("tests", []) if isinstance(t, dict)]
    scores = [float(t.get("score", 0) or 0) for t in tests]
    tops = [float(t.get("max_score", 0) or 0) for t in tests]
    final = float(row.get("total", sum(scores)) or 0.0)
    points = whole_scores(scores, tops, total=final)
    sha = str(commit.get("sha", ""))
    committed = _time(((commit.get("commit") or {}).get("committer") or {}).get("date"))
    commit_url = f"{server}/{org}/{repo}/commit/{sha}"
    record = {"schema": SCHEMA, "classroom": classroom, "assignment_type": "individual",
              "owner": row["student"], "submission": release["tag_name"], "commit": commit_url,
              "release": release.get("html_url") or commit_url, "review": commit_url,
              "datetime": _stamp(committed or graded_at), "graded_at": _stamp(graded_at),
              "score": sum(p for p, _ in points), "max-score": sum(w for _, w in points),
              "tests": [{"test-name": str(t.get("name", "?")), "passed": s >= top > 0, "score": p,
                         "max-score": w} for t, s, top, (p, w) in zip(tests, scores, tops, points)],
              "grader": {"points": round(final, 2), "max-points": round(sum(tops), 2),
                         "status": row.get("status", ""), "penalty": row.get("penalty", 0.0) or 0.0}}
    return record


def entry_for(existing: dict[str, Any] | None, record: dict[str, Any]) -> dict[str, Any]:
    """The override entry: the existing entry's identity fields kept, our record newest."""
    entry = {k: v for k, v in (existing or {}).items() if k not in ("submissions", "override")}
    entry["owner"] = (existing or {}).get("owner") or record["owner"]
    earlier = [s for s in (existing or {}).get("submissions") or []
               if isinstance(s, dict) and s.get("submission") != record["submission"]]
    same = [s for s in (existing or {}).get("submissions") or []
            if isinstance(s, dict) and s.get("submission") == record["submission"]]
    entry["submissions"] = [record, *same, *earlier]  # ours first: the gradebook shows submissions[0]
    entry["override"] = True
    return entry


def updated_scores(scores: dict[str, Any] | None, assignment: str,
                   records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """scores.json with each record's student as an override entry; everything else as it was."""
    doc = json.loads(json.dumps(scores)) if scores else {"schema": SCORES_SCHEMA, "assignments": {}}
    if doc.get("schema") != SCORES_SCHEMA or not isinstance(doc.get("assignments"), dict):
        raise SystemExit(f"the config repository's scores.json is not {SCORES_SCHEMA} (schema "
                         f"{doc.get('schema')!r}); nothing was written. Run Classroom 50's collect-scores "
                         f"once, or fix the file by hand.")
    bucket = doc["assignments"].setdefault(assignment, {"type": "individual", "entries": []})
    if bucket.get("type") != "individual":
        raise SystemExit(f"the assignment {assignment!r} is a {bucket.get('type')} assignment in Classroom "
                         "50; class mode grades one student per repository: publish only individual "
                         "assignments.")
    entries = bucket.setdefault("entries", [])
    index = {str(e.get("owner", "")).lower(): i for i, e in enumerate(entries) if isinstance(e, dict)}
    for record in records:
        key = record["owner"].lower()
        if key in index:
            entries[index[key]] = entry_for(entries[index[key]], record)
        else:
            index[key] = len(entries)
            entries.append(entry_for(None, record))
    return doc


def _read_scores(gh: GitHub, org: str, config: str, path: str) -> tuple[dict[str, Any] | None, str | None]:
    try:
        got = gh.get(f"repos/{org}/{config}/contents/{path}")
    except SystemExit as e:
        if "404" in str(e) or "Not Found" in str(e):
            return None, None
        raise
    text = base64.b64decode(got.get("content", "")).decode("utf-8")
    return (json.loads(text) if text.strip() else None), got.get("sha")


def publish(grades: Path, gh: GitHub, *, org: str, classroom: str, assignment: str = DEFAULT_ASSIGNMENT,
            config: str = "classroom50", tags: dict[str, str] | None = None, dry_run: bool = False,
            show_json: bool = False, now: datetime | None = None, out=None) -> dict[str, Any]:
    """Publish the class run in ``grades`` (its ``--out``); returns the scores.json written (or not).
    ``gh`` may be :class:`Offline` for a dry run whose ``tags`` name every graded tag."""
    record = shards.read_record(grades)
    out = out or sys.stdout
    now = now or datetime.now(timezone.utc)
    tags = tags or {}
    offline = isinstance(gh, Offline)
    records, uploads, skipped, table = [], [], [], []
    for row in record["rows"]:
        login = str(row.get("id") or row.get("student") or "")
        if row.get("status") not in ("graded",) or not row.get("slug"):
            why = f"{row.get('status')}" + (f" ({row['message']})" if row.get("message") else "")
            skipped.append(f"{login}: {why}")
            table.append(preview_row(row, None, None, {}, why))
            continue
        results = read_results(grades / row["slug"] / "results.json")
        repo = repo_name(classroom, assignment, login)
        release = graded_release(gh, org, repo, tags.get(login.lower()))
        if results is None or release is None:
            why = "no results.json" if results is None else (
                "no tag in --tags" if offline else "no published submit/* release")
            skipped.append(f"{login}: {why}")
            table.append(preview_row(row, None, release, {}, why))
            continue
        at = f"repos/{org}/{repo}/commits/{quote(release['tag_name'], safe='')}"
        commit = {} if offline else gh.get(at) or {}
        records.append(record_for({**row, "student": login}, results, classroom=classroom, org=org, repo=repo,
                                  release=release, commit=commit, graded_at=now))
        table.append(preview_row(row, records[-1], release, commit))
        feedback = grades / row["slug"] / FEEDBACK_FILE
        if feedback.is_file():
            uploads.append((repo, release, feedback))
    path = f"{classroom}/scores.json"
    current, sha = (None, None) if offline else _read_scores(gh, org, config, path)
    doc = updated_scores(current, assignment, records)
    text = json.dumps(doc, indent=2, allow_nan=False) + "\n"
    print(preview(table), file=out, end="")
    print(f"{len(records)} of {len(record['rows'])} students published; "
          f"{len(skipped)} not published" + (" (offline: the tags alone, no Release dates)" if offline
                                              else ""),
          file=out)
    if dry_run:
        print(f"# dry run: would write {org}/{config}:{path} ({len(records)} override entries)"
              + (" over the file GitHub holds (not read offline)" if offline else "")
              + ("" if show_json else "; --show-json prints it"), file=out)
        if show_json:
            print(text, file=out, end="")
        for repo, release, _ in uploads:
            print(f"# would attach {FEEDBACK_ASSET} to {org}/{repo} release {release['tag_name']}", file=out)
    else:
        body = {"message": f"grader: the instructor's grades of {assignment} ({len(records)} students, "
                           f"override entries)", "content": base64.b64encode(text.encode()).decode()}
        if sha:
            body["sha"] = sha
        gh.put(f"repos/{org}/{config}/contents/{path}", body)
        for repo, release, feedback in uploads:
            for asset in release.get("assets") or []:
                if asset.get("name") == FEEDBACK_ASSET:
                    gh.delete(f"repos/{org}/{repo}/releases/assets/{asset['id']}")
            gh.upload(f"https://uploads.github.com/repos/{org}/{repo}/releases/{release['id']}/assets"
                      f"?name={FEEDBACK_ASSET}", feedback.read_bytes(), "text/markdown")
        print(f"wrote {org}/{config}:{path}: {len(records)} override entries; {len(uploads)} feedback files "
              f"attached", file=out)
    return doc


def command(argv: Sequence[str] | None = None, *, gh: GitHub | None = None) -> int:
    """``python -m grader classroom50 ...``: ``publish`` here, ``build`` in :mod:`.classroom50`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "publish":
        return classroom50_main(argv)
    return main(argv[1:], gh=gh)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m grader classroom50 publish",
                                description="Write a class run's grades into Classroom 50's gradebook "
                                            "(scores.json override entries) and attach each student's "
                                            "feedback file to the graded submission's Release.")
    p.add_argument("grades", type=Path, metavar="GRADES_DIR", help="the class run's --out folder")
    p.add_argument("--org", required=True, help="the GitHub organisation")
    p.add_argument("--classroom", required=True, help="the classroom's short name")
    p.add_argument("--assignment", default=DEFAULT_ASSIGNMENT,
                   help="the assignment slug (default %(default)s)")
    p.add_argument("--config-repo", default="classroom50", help="the config repository (default %(default)s)")
    p.add_argument("--tags", type=Path, help="'login submit/TAG' lines: the tag each student was graded at "
                                             "(default: each repository's latest submit/* release)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the preview and what would be written; change nothing (with --tags: ask "
                        "GitHub nothing)")
    p.add_argument("--show-json", action="store_true",
                   help="with --dry-run, also print the scores.json it would write")
    return p


def main(argv: Sequence[str] | None = None, *, gh: GitHub | None = None) -> int:
    args = build_parser().parse_args(argv)
    if gh is None:
        gh = Offline() if args.dry_run and args.tags else GhApi()
    publish(args.grades, gh, org=args.org, classroom=args.classroom.lower(),
            assignment=args.assignment.lower(), config=args.config_repo, tags=read_tags(args.tags),
            dry_run=args.dry_run, show_json=args.show_json)
    return 0

