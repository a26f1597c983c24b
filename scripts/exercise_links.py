"""Sphinx extension of the book's web build: under each chapter's title, its exercise notebook on
GitHub and an "Open in Colab" link for it.

Only ``python scripts/build_book.py --repo-url URL`` loads it (through a temporary config, see
:func:`build_book.web_config`); the default build is offline and has no such links. Chapter NN's
exercises are ``exercises/exNN_*.ipynb`` on the branch the site is built from; Colab opens a
notebook of a public GitHub repository at ``colab.research.google.com/github/OWNER/REPO/blob/
BRANCH/PATH``.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COLAB = "https://colab.research.google.com/github"
_CHAPTER = re.compile(r"^(\d\d)_")
_GITHUB = re.compile(r"https://github\.com/(?P<repo>[^/\s]+/[^/\s]+?)(?:\.git)?/?")


def exercise_links(repo_url: str, branch: str, chapter: str, exercises: Path = ROOT / "exercises") -> str:
    """The HTML block for chapter ``chapter`` ("03"): one line per exercise notebook, or "" if none."""
    github = _GITHUB.fullmatch(repo_url)
    lines = []
    for path in sorted(exercises.glob(f"ex{chapter}_*.ipynb")):
        where = f"blob/{branch}/exercises/{path.name}"
        parts = [f'<a class="reference external" href="{html.escape(repo_url.rstrip("/"))}/{where}">'
                 f"<code>exercises/{path.name}</code></a>"]
        if github:
            parts.append(f'<a class="reference external colab-link" href="{COLAB}/{github["repo"]}/{where}">'
                         "Open in Colab</a>")
        lines.append(" · ".join(parts))
    if not lines:
        return ""
    return ('<div class="admonition tip exercise-links"><p class="admonition-title">Exercises</p>'
            + "".join(f"<p>{line}</p>" for line in lines) + "</div>")


def _add_links(app, pagename, templatename, context, doctree) -> None:
    m = _CHAPTER.match(pagename)
    if not (m and app.config.course_repo_url and "body" in context):
        return
    block = exercise_links(app.config.course_repo_url, app.config.course_branch, m.group(1))
    if block:  # under the chapter's title
        context["body"] = re.sub(r"(</h1>)", lambda t: t.group(1) + block, context["body"], count=1)


def setup(app):
    app.add_config_value("course_repo_url", "", "html")
    app.add_config_value("course_branch", "main", "html")
    app.connect("html-page-context", _add_links)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
