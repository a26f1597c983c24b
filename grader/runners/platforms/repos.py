"""The students' repositories of one assignment, without losing any.

``gh repo list ORG --limit 4000`` lists the whole organisation and cuts it off at 4000
without a word; filtering by prefix afterwards loses students silently once the
organisation holds more. This module asks GitHub for the assignment's students only,
page by page, and fails when the count it got is not the count GitHub reports:

* ``--team SLUG`` (best): Classroom 50's class is the members of the team
  ``classroom50-<classroom>``, and each one's repository is ``<classroom>-<assignment>-<user>``
  (``PREFIX`` is ``<classroom>-<assignment>``). The members are listed from
  ``/orgs/ORG/teams/SLUG/members`` and checked against the team's ``members_count``; a member
  with no repository (never accepted) still gets a roster row, and so a "missing" grade;
* else the search API, ``org:ORG PREFIX- in:name``, filtered again to names that start
  with ``PREFIX-`` and checked against ``total_count`` and ``incomplete_results``.
  Search returns at most 1000 results: more is a failure that says to use ``--team``.

(GitHub Classroom's ``/assignments/ID/accepted_assignments``, which ``--assignment`` read,
went with GitHub Classroom, retired on 2026-08-28.)

``python -m grader repos list ORG PREFIX [--team SLUG] [--roster roster.csv]`` prints
one student name (the repository's name without ``PREFIX-``) per line and can write
them as a roster; ``python -m grader repos tag ORG REPO`` prints the tag of the repository's latest
submission: of its ``submit/*`` Releases, the one GitHub published last (``published_at``,
GitHub's own clock when Classroom 50's runner published it). A tag's name looks like a time
(``submit/<UTC-timestamp>-<short-sha>``) but the student can push any tag name, so the
greatest name is not trusted to be the latest; only a repository with submit tags and no
Release at all falls back to it, and then has no hand-in time.
``python -m grader repos tags ORG PREFIX --roster roster.csv`` does that for every student
of the roster (``login tag`` lines, the clone list) and writes the roster's ``submitted``
column: the Release's ``published_at``. That is the hand-in time late penalties count from.
GitHub documents a Release's ``created_at`` as the date of the commit it tags, which the student
sets, and a tag's name and a commit's date are written by the student: none is trusted for it.
``python -m grader repos shard roster.csv --shard i/N`` prints the names of one shard
(:mod:`~grader.runners.classmode.shards`), so each job of a matrix clones only its own.
Every call goes through ``gh api`` (the GitHub CLI, authenticated by ``$GH_TOKEN``).
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..classmode import rosterfile, shards

PER_PAGE = 100
SEARCH_CAP = 1000
#: ``(path, params) -> parsed JSON``: one GitHub API call (``gh api``, or a fake in tests).
Api = Callable[[str, dict[str, str]], Any]


def gh_api(path: str, params: dict[str, str]) -> Any:
    cmd = ["gh", "api", "-X", "GET", path, "-H", "Accept: application/vnd.github+json"]
    for k, v in params.items():
        cmd += ["-f", f"{k}={v}"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except FileNotFoundError:
        raise SystemExit("the GitHub CLI `gh` is not installed (https://cli.github.com/); it lists the "
                         "repositories.") from None
    if proc.returncode != 0:
        raise SystemExit(f"`gh api {path}` failed: {proc.stderr.strip()[:500]}")
    return json.loads(proc.stdout)


def by_team(api: Api, org: str, team: str, prefix: str) -> list[str]:
    """Repository names ``PREFIX-<login>`` of the team's members, checked against ``members_count``."""
    expected = int(api(f"orgs/{org}/teams/{team}", {}).get("members_count", -1))
    logins: list[str] = []
    page = 1
    while True:
        batch = api(f"orgs/{org}/teams/{team}/members", {"per_page": str(PER_PAGE), "page": str(page)})
        logins += [m["login"] for m in batch if isinstance(m, dict) and isinstance(m.get("login"), str)]
        if len(batch) < PER_PAGE:
            break
        page += 1
    if expected >= 0 and len(logins) != expected:
        raise SystemExit(f"the team {org}/{team} reports {expected} members but listed {len(logins)}: the "
                         f"listing is incomplete; nothing was graded. Run it again.")
    return [f"{prefix}-{login}" for login in logins]


def published(release: Any) -> datetime | None:
    """When GitHub published ``release`` (its ``published_at``, GitHub's clock), or None for a
    draft, a Release never published, or anything that is not one."""
    when = release.get("published_at") if isinstance(release, dict) else None
    try:
        t = datetime.fromisoformat(when.replace("Z", "+00:00")) if isinstance(when, str) and when else None
    except ValueError:
        return None
    return t if t is None or t.tzinfo else t.replace(tzinfo=timezone.utc)


def latest_release(releases: Sequence[Any]) -> dict[str, Any] | None:
    """Of ``releases``, the ``submit/*`` one GitHub published last (ties: the greater tag), or None."""
    found = [r for r in releases if isinstance(r, dict) and isinstance(r.get("tag_name"), str)
             and r["tag_name"].startswith("submit/") and published(r) is not None]
    return max(found, key=lambda r: (published(r), r["tag_name"])) if found else None


def submit_releases(api: Api, org: str, repo: str) -> list[dict[str, Any]]:
    """Every Release of the repository, page by page."""
    out: list[dict[str, Any]] = []
    page = 1
    while True:
        batch = api(f"repos/{org}/{repo}/releases", {"per_page": str(PER_PAGE), "page": str(page)})
        batch = batch if isinstance(batch, list) else []
        out += [r for r in batch if isinstance(r, dict)]
        if len(batch) < PER_PAGE:
            return out
        page += 1


def latest_submission(api: Api, org: str, repo: str) -> tuple[str, str] | None:
    """(tag, hand-in time) of the repository's latest submission: the ``submit/*`` Release
    published last, with its ``published_at``; a repository with submit tags and no published
    Release gives its greatest tag name and no time (""); None when it has neither."""
    release = latest_release(submit_releases(api, org, repo))
    if release is not None:
        return release["tag_name"], release["published_at"]
    refs = api(f"repos/{org}/{repo}/git/matching-refs/tags/submit/", {})
    tags = [r["ref"].removeprefix("refs/tags/") for r in refs if isinstance(r, dict)
            and isinstance(r.get("ref"), str) and r["ref"].startswith("refs/tags/submit/")]
    return (max(tags), "") if tags else None


def latest_submit_tag(api: Api, org: str, repo: str) -> str | None:
    """The tag of the repository's latest submission (:func:`latest_submission`), or None."""
    found = latest_submission(api, org, repo)
    return found[0] if found else None


def stamp_roster(api: Api, org: str, prefix: str, path: Path) -> list[tuple[str, str]]:
    """Each roster student's latest submit tag, and the roster rewritten with their hand-in
    times (the tags' Releases'); returns the (student, tag) pairs to clone."""
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    if not rows or "id" not in rows[0]:
        raise SystemExit(f"{path} is not a roster this command writes (id,name,folder): write it with "
                         "`python -m grader repos list ORG PREFIX --roster FILE` first.")
    pairs = []
    for row in rows:
        login = (row.get("folder") or row["id"]).strip()
        found = latest_submission(api, org, f"{prefix}-{login}")
        row["submitted"] = ""
        if found is not None:
            pairs.append((login, found[0]))
            row["submitted"] = found[1]
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=[*[k for k in rows[0] if k != "submitted"], "submitted"])
        w.writeheader()
        w.writerows(rows)
    return pairs


def by_search(api: Api, org: str, prefix: str) -> list[str]:
    """Repository names in ``org`` starting with ``prefix-``, from the search API, checked."""
    query = f"org:{org} {prefix}- in:name fork:true"
    names, total, page = [], None, 1
    while True:
        data = api("search/repositories", {"q": query, "per_page": str(PER_PAGE), "page": str(page)})
        if data.get("incomplete_results"):
            raise SystemExit("GitHub's search timed out and returned incomplete results; nothing was graded. "
                             "Run it again, or list by team (--team classroom50-CLASSROOM).")
        total = int(data.get("total_count", 0))
        if total > SEARCH_CAP:
            raise SystemExit(f"the search finds {total} repositories, over the {SEARCH_CAP} GitHub's search "
                             f"returns: list by team instead (--team classroom50-CLASSROOM).")
        items = data.get("items", [])
        names += [i["name"] for i in items]
        if len(items) < PER_PAGE or len(names) >= total:
            break
        page += 1
    if len(names) != total:
        raise SystemExit(f"the search reports {total} repositories but listed {len(names)}: the listing is "
                         f"incomplete; nothing was graded. Run it again.")
    return [n for n in names if n.startswith(f"{prefix}-")]


def student_names(repos: Sequence[str], prefix: str) -> list[str]:
    """``prefix-alice`` -> ``alice``: the folder the workflow clones into and the student's name."""
    return sorted({r[len(prefix) + 1:] if r.startswith(f"{prefix}-") else r for r in repos})


def write_roster(names: Sequence[str], path: Path) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["id", "name", "folder"])
        w.writerows([n, n, n] for n in names)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m grader repos",
                                description="List an assignment's student repositories completely, or one "
                                            "shard of a roster.")
    sub = p.add_subparsers(dest="action", required=True)
    ls = sub.add_parser("list", help="the assignment's students, one per line")
    ls.add_argument("org")
    ls.add_argument("prefix", help="the assignment's repository prefix (repositories are PREFIX-USER)")
    ls.add_argument("--team", help="Classroom 50's team (classroom50-CLASSROOM): its members are the class")
    ls.add_argument("--roster", type=Path, help="also write them as a roster CSV (id,name,folder)")
    tg = sub.add_parser("tag", help="a repository's latest submit/* tag (exit 1 when it has none)")
    tg.add_argument("org")
    tg.add_argument("repo")
    ts = sub.add_parser("tags", help="'student tag' per roster student with a submission; writes the "
                                     "roster's submitted column (when GitHub published each Release)")
    ts.add_argument("org")
    ts.add_argument("prefix")
    ts.add_argument("--roster", type=Path, required=True, help="the roster `repos list --roster` wrote")
    sh = sub.add_parser("shard", help="the roster's students in one shard, one per line")
    sh.add_argument("roster", type=Path)
    sh.add_argument("--shard", required=True, metavar="i/N")
    return p


def main(argv: Sequence[str] | None = None, *, api: Api = gh_api) -> int:
    args = build_parser().parse_args(argv)
    if args.action == "shard":
        shard = shards.parse(args.shard)
        for e in rosterfile.read(args.roster):
            if shard.holds(e.shard_key):
                print(e.shard_key)
        return 0
    if args.action == "tags":
        pairs = stamp_roster(api, args.org, args.prefix, args.roster)
        print("\n".join(f"{u} {t}" for u, t in pairs))
        print(f"{len(pairs)} students handed something in; hand-in times written to {args.roster}",
              file=sys.stderr)
        return 0
    if args.action == "tag":
        tag = latest_submit_tag(api, args.org, args.repo)
        if tag is None:
            print(f"{args.org}/{args.repo} has no submit/* tag: nothing was handed in", file=sys.stderr)
            return 1
        print(tag)
        return 0
    if args.team:
        repos = by_team(api, args.org, args.team, args.prefix)
    else:
        repos = by_search(api, args.org, args.prefix)
    names = student_names(repos, args.prefix)
    if args.roster is not None:
        write_roster(names, args.roster)
    print("\n".join(names))
    print(f"{len(names)} repositories of {args.org}/{args.prefix}-*", file=sys.stderr)
    return 0
