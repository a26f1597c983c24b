"""The class report: a class of fake students with known mistakes, graded by the real
engine, and a report that counts each mistake right, in Markdown and in a browser."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from grader.runners.classmode import classreport, classroom

REPO = Path(__file__).resolve().parent.parent
CORRECT = (REPO / "tests" / "buggy" / "correct.py").read_text()
BUGS = {
    "diagonal_excluded": "def causal_mask(n, *, device=None):\n"
                         "    return torch.ones(n, n, dtype=torch.bool, device=device).tril(-1)\n",
    "top_left": "def kv_cache_attention(q, k_new, v_new, k_cache, v_cache):\n"
                "    k = torch.cat([k_cache, k_new], dim=2)\n"
                "    v = torch.cat([v_cache, v_new], dim=2)\n"
                "    mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()\n"
                "    return attention(q, k, v, mask)[0], k, v\n",
    "padding_off_by_one": "def padding_mask(lengths, max_len):\n"
                          "    return torch.arange(max_len, device=lengths.device)[None, :]"
                          " <= lengths[:, None]\n",
}
#: student -> the mistakes they make (in otherwise correct code)
CLASS = {"s1": ["top_left"], "s2": ["top_left", "diagonal_excluded"], "s3": [], "s4": ["top_left"],
         "s5": ["diagonal_excluded", "padding_off_by_one"], "s6": ["top_left"], "s7": []}
EXERCISES = ("causal_mask", "padding_mask", "kv_cache_attention")
WHERE = {"diagonal_excluded": "causal_mask", "top_left": "kv_cache_attention",
         "padding_off_by_one": "padding_mask"}


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("report")
    subs = root / "subs"
    subs.mkdir()
    for name, bugs in CLASS.items():
        (subs / f"{name}.py").write_text(CORRECT + "".join("\n\n" + BUGS[b] for b in bugs))
    out = root / "out"
    args = [str(subs), "--out", str(out), "--jobs", "2", "--no-progress"]
    for e in EXERCISES:
        args += ["--exercise", e]
    old = os.environ.get("GRADER_SEED")
    os.environ["GRADER_SEED"] = "161803398874989484820458683436563811772"
    try:
        assert classroom.main(args) == 0
    finally:
        os.environ.pop("GRADER_SEED") if old is None else os.environ.__setitem__("GRADER_SEED", old)
    return out


def _expected() -> dict[tuple[str, str], int]:
    counts: dict[tuple[str, str], int] = {}
    for bugs in CLASS.values():
        for b in bugs:
            counts[(WHERE[b], b)] = counts.get((WHERE[b], b), 0) + 1
    return counts


def test_each_mistake_is_counted_once_per_student_who_made_it(graded):
    stats = classreport.gather(graded, json.loads((graded / "class-run.json").read_text()))
    got = {(e, m): c for e, s in stats.items() for m, c in s.mistakes.items()}
    assert got == _expected()  # top_left: 4 of 7 students; nothing else is named
    assert sorted(stats) == sorted(EXERCISES) and all(len(s.shares) == len(CLASS) for s in stats.values())
    # No example grid: graded with the instructor's seed, results.json shows students no case,
    # public or hidden (tests/test_hidden_channel.py), so there is none to copy.
    assert not any(s.example for s in stats.values())
    md = (graded / "class-report.md").read_text()
    assert "| kv_cache_attention | top_left | 4 | 57% |" in md
    assert "| causal_mask | diagonal_excluded | 2 | 29% |" in md
    assert "| padding_mask | padding_off_by_one | 1 | 14% |" in md
    assert "information, not a grade change" in md


def test_the_html_report_is_self_contained(graded):
    page = (graded / "class-report.html").read_text()
    srcs = re.findall(r"<img [^>]*src='([^']+)'", page)
    assert len(srcs) == 2 + len(EXERCISES)
    for src in srcs:  # every figure is an embedded PNG, nothing is fetched
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    assert not re.search(r"(src|href)=['\"](https?:|/|\.\.?/)", page)


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if path := shutil.which(name):
            return path
    return None


FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--hide-scrollbars", "--mute-audio"]


@pytest.mark.slow
def test_the_report_opens_from_file_in_a_browser(graded):
    browser = _chromium()
    if browser is None:
        if os.environ.get("CI"):
            pytest.fail("Chromium is not installed; .ci/run must install it (apt-get install chromium)")
        pytest.skip("Chromium is not installed (apt-get install chromium)")
    url = (graded / "class-report.html").as_uri()
    proc = subprocess.run([browser, *FLAGS, "--dump-dom", url], capture_output=True, text=True, timeout=120)
    dom = proc.stdout
    assert "<h1>Class report</h1>" in dom, proc.stderr[-2000:]
    for (exercise, mistake), count in _expected().items():
        section = dom.split(f"<h2>{exercise}</h2>", 1)[1].split("</section>", 1)[0]
        assert re.search(rf"<td>{mistake}</td><td>{count}</td>", section), (exercise, mistake)
    shot = graded / "class-report.png"  # for a person to look at
    subprocess.run([browser, *FLAGS, f"--screenshot={shot}", "--window-size=1280,2000", url],
                   capture_output=True, timeout=120)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_report_shows_what_students_wrote_never_the_reference(tmp_path):
    """A student flagged against the reference: the report shows the student's function, not
    the reference's (solutions/ holds 'BEGIN SOLUTION' blocks), and is the instructor's alone."""
    from grader.runners.classmode import similarity

    refs = similarity.references(["multi_head_attention"])["multi_head_attention"]
    solution = next(src for where, src in refs if "solutions/" in where)
    mine = "\n".join(ln for ln in solution.splitlines() if "SOLUTION" not in ln)
    out = tmp_path / "out"
    (out / "s1").mkdir(parents=True)
    (out / "s1" / similarity.FUNCTIONS_FILE).write_text(json.dumps({"multi_head_attention": mine}))
    (out / "s1" / "results.json").write_text(json.dumps({"tests": [
        {"name": "multi_head_attention (chapter 5)", "score": 7.0, "max_score": 7.0, "output": ""}]}))
    record = {"exercises": ["multi_head_attention"],
              "rows": [{"student": "s1", "slug": "s1", "status": "graded"}]}
    old = os.umask(0o022)
    try:
        page, md = classreport.write_report(out, record)
    finally:
        os.umask(old)
    html = page.read_text()
    assert "reference: solutions/" in html  # the flag is there
    assert "BEGIN SOLUTION" not in html and "END SOLUTION" not in html
    assert not [src for _, src in refs if src.strip() in html]
    assert all((p.stat().st_mode & 0o777) == 0o600 for p in (page, md))
