"""The built book: it builds offline from the stored outputs, every page renders
in a real browser (headless Chromium) with its title and its figures, no page
shows an error, and every chapter links its exercise notebook.

The site is built into a temporary folder; screenshots of the chapters go to
``book/_build/screenshots/`` for a person to look at.

Without Chromium the browser tests are skipped, except in CI (``CI`` set),
where ``.ci/run`` installs it and a missing browser is a failure.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import struct
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "book"
SCREENSHOTS = BOOK / "_build" / "screenshots"

pytestmark = pytest.mark.slow

_spec = importlib.util.spec_from_file_location("build_book", ROOT / "scripts" / "build_book.py")
build_book = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build_book)

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--hide-scrollbars", "--mute-audio",
]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if path := shutil.which(name):
            return path
    return None


@pytest.fixture(scope="module")
def browser() -> str:
    path = chromium()
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("Chromium is not installed; .ci/run must install it (apt-get install chromium)")
        pytest.skip("Chromium is not installed (apt-get install chromium); the browser tests run in CI")
    return path


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """Build the book once into a temporary folder; return its HTML root."""
    out = tmp_path_factory.mktemp("book")
    code, report = build_book.build(out)
    assert code == 0, "book build failed:\n" + "\n".join(report["problems"])
    # No bound on the build's wall time: it depends on the machine's load, and a test that fails on a
    # busy machine says nothing about the book. scripts/build_book.py prints the time.
    print(f"book built in {report['seconds']:.0f} s")
    return out / "_build" / "html"


def pages() -> list[str]:
    """Toc entries whose source exists (missing chapters are reported by
    test_every_listed_chapter_exists, not here)."""
    return [e for e in build_book.toc_files() if build_book.source_of(e) is not None]


def source_title(entry: str) -> str:
    """The first level-1 heading of a chapter's source."""
    path = build_book.source_of(entry)
    if path.suffix == ".ipynb":
        nb = nbformat.read(path, as_version=4)
        text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    else:
        text = path.read_text()
    m = re.search(r"^# (.+)$", text, flags=re.M)
    assert m, f"{path.name} has no '# Title' heading"
    return m.group(1).strip()


def stored_figures(entry: str) -> int:
    path = build_book.source_of(entry)
    if path.suffix != ".ipynb":
        return 0
    nb = nbformat.read(path, as_version=4)
    return sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code"
               for o in c.get("outputs", []))


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == PNG_MAGIC, f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])


# --- the build ----------------------------------------------------------------


def test_every_listed_chapter_exists():
    """The final book lists every chapter in book/_toc.yml, and each must exist."""
    missing = [e for e in build_book.toc_files() if build_book.source_of(e) is None]
    assert not missing, f"listed in book/_toc.yml but missing: {missing}"


def test_no_tex_between_dollars_in_the_chapters():
    """The book loads no math renderer (offline, see below) and MyST's dollarmath is off, so
    `$\\text{lse}$` would reach the reader as raw TeX: formulas are written in Unicode."""
    tex = re.compile(r"\$\$|\$[^$\n]*\\[A-Za-z]+[^$\n]*\$|\$[^$\s`][^$\n`]{0,40}\$")
    code = re.compile(r"```.*?```|`[^`\n]*`", re.S)
    found = []
    for path in sorted(BOOK.glob("*.ipynb")):
        for i, cell in enumerate(nbformat.read(path, as_version=4).cells):
            if cell.cell_type == "markdown" and tex.search(code.sub("", cell.source)):
                found.append(f"{path.name} cell {i}: {tex.search(code.sub('', cell.source)).group(0)!r}")
    assert not found, f"TeX the book cannot render: {found}"


def transformers_imports() -> dict[str, set[str]]:
    """{module: names} of every `from transformers... import ...` in the chapters' code cells."""
    stmt = re.compile(r"^from (transformers[\w.]*) import \(?([^)]*?)\)?\s*(?:#.*)?$", re.M | re.S)
    found: dict[str, set[str]] = {}
    for path in sorted(BOOK.glob("*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type != "code":
                continue
            # join parenthesised imports onto one line, then read each statement
            source = re.sub(r"\(\s*([^)]*?)\s*\)", lambda m: "(" + " ".join(m.group(1).split()) + ")",
                            cell.source)
            for line in source.splitlines():
                if m := stmt.match(line.strip()):
                    names = {n.strip().split(" as ")[0] for n in m.group(2).split(",") if n.strip()}
                    found.setdefault(m.group(1), set()).update(names)
            for name in re.findall(r"\bmasking_utils\.(\w+)", cell.source):  # attributes read off the module
                found.setdefault("transformers.masking_utils", set()).add(name)
    return found


def test_installed_transformers_is_in_the_pinned_range_and_has_what_the_chapters_import():
    """The chapters print what transformers' own (partly private) code does: the stored outputs hold
    for the release range requirements.txt allows, and every name a chapter imports must exist."""
    from importlib import import_module
    from importlib.metadata import version

    from packaging.requirements import Requirement

    lines = (ROOT / "requirements.txt").read_text().splitlines()
    spec = next(Requirement(ln) for ln in lines if re.match(r"transformers\b", ln.strip()))
    assert spec.specifier, "requirements.txt must bound transformers: the chapters call private functions"
    installed = version("transformers")
    assert spec.specifier.contains(installed), (
        f"transformers {installed} is installed; the chapters' stored outputs were made within "
        f"{spec.specifier}. Install that range, or re-run chapters 2, 7, 9, 10 and 11 and check their text "
        "(book/instructors.md, 'When transformers changes') before moving the pin.")
    imports = transformers_imports()
    assert "transformers.masking_utils" in imports, "the chapters' transformers imports were not found"
    missing = [f"{mod}.{name}" for mod, names in sorted(imports.items()) for name in sorted(names)
               if not hasattr(import_module(mod), name)]
    assert not missing, f"transformers {installed} lacks names the chapters import: {missing}"


def test_build_is_offline_and_self_contained(site):
    """No page loads a script, stylesheet or font from the network: the book
    must render on a machine without internet (e.g. math through a CDN would
    break that -- write formulas in Unicode)."""
    remote = re.compile(r"<(?:script|link|img)\b[^>]*\b(?:src|href)=\"(https?://[^\"]+)\"")
    for page in site.glob("*.html"):
        found = remote.findall(page.read_text())
        assert not found, f"{page.name} loads remote resources: {found}"


def test_chapters_link_their_exercise_notebook(site):
    """Chapter NN links exercises/exNN_*.ipynb, and the link works in the built site."""
    for entry in pages():
        m = re.match(r"(0[1-9]|1\d)_", entry)  # every chapter has an exercise notebook
        if not m:
            continue
        html = (site / f"{entry}.html").read_text()
        links = re.findall(rf'href="(_downloads/[^"]+/ex{m.group(1)}_[^"]+\.ipynb)"', html)
        assert links, f"{entry}.html does not link its exercise notebook exercises/ex{m.group(1)}_*.ipynb"
        for link in set(links):
            target = site / link
            assert target.exists(), f"{entry}.html links {link}, which is not in the built site"
            nbformat.read(target, as_version=4)  # a real notebook, not an empty file


# --- in the browser -------------------------------------------------------------

# Loads each page in an iframe (same origin thanks to --allow-file-access-from-files),
# waits for its images, and writes what it found as JSON into <pre id="result">.
HARNESS = """<!doctype html><html><body><pre id="result">pending</pre><script>
const pages = %s;
const results = {};
function settle(img) {
  return img.complete ? Promise.resolve()
                      : new Promise(r => { img.onload = r; img.onerror = r; });
}
function next(i) {
  if (i >= pages.length) {
    document.getElementById("result").textContent = JSON.stringify(results);
    return;
  }
  const frame = document.createElement("iframe");
  frame.style.width = "1280px";
  frame.style.height = "2000px";
  frame.onload = () => {
    const doc = frame.contentDocument;
    const imgs = Array.from(doc.images);
    Promise.all(imgs.map(settle)).then(() => {
      const h1 = doc.querySelector("article h1, main h1, h1");
      results[pages[i]] = {
        title: doc.title,
        h1: h1 ? h1.textContent : null,
        images: imgs.map(im => [im.getAttribute("src"), im.naturalWidth, im.naturalHeight]),
        alts: imgs.map(im => [im.getAttribute("src"), im.getAttribute("alt") || ""]),
        // code or output blocks wider than their column, which would scroll sideways
        wide_blocks: Array.from(doc.querySelectorAll("pre"))
          .filter(e => e.scrollWidth > e.clientWidth + 1)
          .map(e => e.textContent.split("\\n")[0].slice(0, 60)),
        search_boxes: Array.from(doc.querySelectorAll(".search-button-field, .search-button"))
          .filter(e => { const r = e.getBoundingClientRect(); return r.width > 0 && r.height > 0; }).length,
        error_nodes: doc.querySelectorAll(
          ".traceback, .output.error, .output.stderr, .system-message, .problematic").length,
        traceback: doc.body.innerText.includes("Traceback (most recent call last)"),
        text_length: doc.body.innerText.length,
      };
      frame.remove();
      next(i + 1);
    });
  };
  frame.src = pages[i] + ".html";
  document.body.appendChild(frame);
}
next(0);
</script></body></html>
"""


@pytest.fixture(scope="module")
def rendered(site, browser) -> dict:
    harness = site / "_render_check.html"
    harness.write_text(HARNESS % json.dumps(pages()))
    proc = subprocess.run(
        [browser, *CHROMIUM_FLAGS, "--allow-file-access-from-files", "--virtual-time-budget=30000",
         "--dump-dom", harness.as_uri()],
        capture_output=True, text=True, timeout=180,
    )
    m = re.search(r'<pre id="result">(.*?)</pre>', proc.stdout, flags=re.S)
    assert m and m.group(1) != "pending", f"the render check did not finish:\n{proc.stderr[-2000:]}"
    return json.loads(m.group(1).replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">"))


@pytest.mark.parametrize("entry", pages())
def test_page_renders_title_figures_and_no_errors(entry, rendered, site):
    page = rendered.get(entry)
    assert page is not None, f"{entry}.html was not rendered"
    title = source_title(entry)
    assert title in page["title"], f"<title> is {page['title']!r}; expected it to contain {title!r}"
    assert page["h1"] and title in page["h1"], f"first heading is {page['h1']!r}; expected {title!r}"
    assert page["text_length"] > 500, f"{entry}.html renders almost no text"
    assert page["error_nodes"] == 0, f"{entry}.html shows {page['error_nodes']} error/stderr outputs"
    assert not page["traceback"], f"{entry}.html shows a Python traceback"

    broken = [src for src, w, h in page["images"] if w == 0 or h == 0]
    assert not broken, f"{entry}.html has images the browser could not decode: {broken}"
    figures = [src for src, _, _ in page["images"] if src.startswith("_images/")]
    assert len(figures) >= stored_figures(entry), (
        f"{entry}.html shows {len(figures)} figures; the notebook stores {stored_figures(entry)}"
    )
    for src in figures:
        path = site / src
        assert path.stat().st_size > 1000, f"{src} is suspiciously small"
        png_size(path)


@pytest.mark.parametrize("entry", pages())
def test_page_fits_1280_px_with_one_search_box(entry, rendered):
    """At 1280 px no code or output block scrolls sideways (book/_static/course.css wraps
    long lines), and the page shows one search box, not the sidebar's and the top bar's."""
    page = rendered[entry]
    assert not page["wide_blocks"], f"{entry}.html has blocks that scroll sideways: {page['wide_blocks']}"
    assert page["search_boxes"] == 1, f"{entry}.html shows {page['search_boxes']} search boxes"


@pytest.mark.parametrize("entry", pages())
def test_figures_have_alt_text(entry, rendered):
    """Every figure says in words what it shows (cell metadata mystnb.image.alt),
    instead of the default alt text, its file name."""
    unnamed = [src for src, alt in rendered[entry]["alts"]
               if src.startswith("_images/") and (not alt or alt.endswith(src.rsplit("/", 1)[-1]))]
    assert not unnamed, (f"{entry}.html: {len(unnamed)} figures have no alt text; give each figure cell "
                         f"metadata {{\"mystnb\": {{\"image\": {{\"alt\": \"...\"}}}}}}")


def test_screenshots_of_every_chapter(site, browser):
    """Screenshots (1280 x 2000) for a person to look at, in book/_build/screenshots/."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    def shoot(entry: str) -> Path:
        out = SCREENSHOTS / f"{entry}.png"
        out.unlink(missing_ok=True)
        subprocess.run(
            [browser, *CHROMIUM_FLAGS, f"--screenshot={out}", "--window-size=1280,2000",
             "--virtual-time-budget=5000", (site / f"{entry}.html").as_uri()],
            capture_output=True, timeout=120,
        )
        return out

    with ThreadPoolExecutor(max_workers=3) as pool:
        shots = list(pool.map(shoot, pages()))
    for shot in shots:
        assert shot.exists(), f"no screenshot was written to {shot}"
        assert png_size(shot) == (1280, 2000), f"{shot} has size {png_size(shot)}"
        assert shot.stat().st_size > 20_000, f"{shot} looks blank ({shot.stat().st_size} bytes)"


# --- the web build (scripts/build_book.py --repo-url) ----------------------------

def test_the_default_build_has_no_repository_or_colab_links(site):
    for page in site.glob("*.html"):
        text = page.read_text()
        assert "colab.research.google.com" not in text and "exercise-links" not in text, page.name


@pytest.mark.timeout(1200)  # a build: about a minute, far more on a loaded machine
def test_the_web_build_links_each_chapter_s_exercises_on_github_and_in_colab(tmp_path):
    """One chapter built with --repo-url (a book of one page keeps it cheap): under its title its
    exercise notebook on GitHub and in Colab, and the committed config untouched."""
    book = tmp_path / "book"
    book.mkdir()
    for name in ("_config.yml", "03_padding.ipynb"):
        shutil.copy2(ROOT / "book" / name, book / name)
    shutil.copytree(ROOT / "book" / "_static", book / "_static")
    (book / "_toc.yml").write_text("format: jb-book\nroot: 03_padding\n")
    committed = (ROOT / "book" / "_config.yml").read_text()
    url = "https://github.com/someone/attnmask-course"
    code, report = build_book.build(tmp_path / "out", repo_url=url, branch="term-1", book=book)
    assert code == 0, "\n".join(report["problems"])
    html = (tmp_path / "out" / "_build" / "html" / "03_padding.html").read_text()
    block = re.search(r'<div class="admonition tip exercise-links">.*?</div>', html, flags=re.S)
    assert block, "no exercise links under the chapter's title"
    assert f'href="{url}/blob/term-1/exercises/ex03_padding.ipynb"' in block.group(0)
    assert ('href="https://colab.research.google.com/github/someone/attnmask-course/blob/term-1/'
            'exercises/ex03_padding.ipynb"') in block.group(0)
    assert html.index("</h1>") < html.index("exercise-links")
    assert (ROOT / "book" / "_config.yml").read_text() == committed


def test_the_web_build_refuses_a_url_that_is_not_a_repository_s():
    with pytest.raises(ValueError, match="expected the repository's web address"):
        build_book.web_config("github.com/someone/course")
