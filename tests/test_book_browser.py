"""The book as a reader gets it: built clean, every link inside it resolving, and
checked in a real browser (headless Chromium driven by Playwright) from a local HTTP
server.

The book is built by this module into a temporary folder, from the notebooks' stored
outputs, with warnings as errors: the tests never depend on someone having run `make
book`, and never write into the repository's `_build/` (except the landing-page
screenshot, _build/screenshots/landing.png). The pages come from `_toc.yml`, so new
chapters are checked as soon as they are listed there."""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import yaml

from tests.nbtools import toc_pages

ROOT = Path(__file__).resolve().parents[1]
# Debian's package
CHROMIUM = Path(os.environ.get("SMOL_CHROMIUM", "/usr/bin/chromium"))
SCREENSHOT = ROOT / "_build" / "screenshots" / "landing.png"
CHROMIUM_ARGS = [  # Playwright adds --headless itself; nothing may reach the network
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def config() -> dict:
    return yaml.safe_load((ROOT / "_config.yml").read_text())


def source_of(page: str) -> Path:
    for suffix in (".ipynb", ".md"):
        if (ROOT / page).with_suffix(suffix).exists():
            return (ROOT / page).with_suffix(suffix)
    raise FileNotFoundError(f"_toc.yml names {page}, which has no .ipynb or .md file")


def image_outputs(notebook: Path) -> int:
    import nbformat

    nb = nbformat.read(notebook, as_version=4)
    return sum(
        1
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
        if any(k.startswith("image/") for k in out.get("data", {}))
    )


@dataclass
class Book:
    html: Path
    returncode: int
    log: str


@pytest.fixture(scope="module")
def book(tmp_path_factory) -> Book:
    out = tmp_path_factory.mktemp("book")
    exe = Path(sys.executable).with_name("jupyter-book")
    cmd = [
        str(exe) if exe.exists() else (shutil.which("jupyter-book") or "jupyter-book"),
        "build",
        str(ROOT),
        "--path-output",
        str(out),
        "-W",
        "--keep-going",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    html = out / "_build" / "html"
    assert (html / "index.html").exists(), (
        f"the book did not build:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return Book(html, proc.returncode, proc.stdout + proc.stderr)


def test_book_builds_without_warnings(book):
    warnings = [
        line for line in book.log.splitlines() if "WARNING" in line or "ERROR" in line
    ]
    assert book.returncode == 0 and not warnings, (
        "jupyter-book build -W --keep-going:\n"
        + "\n".join(warnings or book.log.splitlines()[-40:])
    )


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids: set[str] = set()
        self.refs: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for name in ("id", "name") if tag == "a" else ("id",):
            if attrs.get(name):
                self.ids.add(attrs[name])
        for name in ("href", "src"):
            if attrs.get(name) and tag in (
                "a",
                "img",
                "link",
                "script",
                "source",
                "iframe",
            ):
                self.refs.append(attrs[name])


def test_internal_links_and_assets_resolve(book):
    """What `sphinx -b linkcheck` would do for links inside the book, without the
    network: every relative href/src names a file of the build, and every #fragment an
    id on its page."""
    parsed = {}
    for path in book.html.rglob("*.html"):
        if path.relative_to(book.html).parts[0] == "_static":
            continue  # the themes' template fragments, not pages
        parser = _Links()
        parser.feed(path.read_text(errors="replace"))
        parsed[path.resolve()] = parser
    broken = []
    for path, parser in parsed.items():
        for ref in parser.refs:
            parts = urlsplit(ref)
            if (
                parts.scheme
                or parts.netloc
                or ref.startswith(("mailto:", "javascript:", "data:"))
            ):
                continue
            target = (
                (path.parent / unquote(parts.path)).resolve() if parts.path else path
            )
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                broken.append(f"{path.relative_to(book.html)}: {ref} (no such file)")
            elif (
                parts.fragment
                and target.suffix == ".html"
                and target in parsed
                and unquote(parts.fragment) not in parsed[target].ids
            ):
                broken.append(f"{path.relative_to(book.html)}: {ref} (no such anchor)")
    assert not broken, "broken links inside the book:\n" + "\n".join(
        sorted(set(broken))
    )


def test_repository_url_lives_in_config():
    """_config.yml holds the repository URL and branch; the setup cell
    (tests/test_notebooks.py checks every notebook against it), the README and the
    book's pages must agree with it."""
    from tests import nbtools

    repo = config()["repository"]
    url, branch = repo["url"].rstrip("/"), repo.get("branch", "main")
    assert f"git+{url}@{branch}" in nbtools.setup_cell_source()
    owner_repo = urlsplit(url).path.strip("/")
    readme = (ROOT / "README.md").read_text()
    assert url in readme, "README.md does not name the repository of _config.yml"
    for path in [ROOT / "README.md", *sorted((ROOT / "book").glob("*.md"))]:
        text = path.read_text()
        for found in re.findall(
            r"colab\.research\.google\.com/github/([^/\s)]+/[^/\s)]+)/blob/([^/\s)]+)/",
            text,
        ):
            assert found == (owner_repo, branch), (
                f"{path.name}: a Colab link to {found}, not {owner_repo}@{branch}"
            )
        for found in re.findall(r"git clone (\S+)", text):
            assert found.removesuffix(".git") == url, (
                f"{path.name}: `git clone {found}`, not {url}"
            )


def _require_browser():
    reason = None
    if not CHROMIUM.exists():
        reason = (
            f"no Chromium at {CHROMIUM}: `make chromium` (as root) installs Debian's "
            "chromium"
        )
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            reason = "the playwright package is missing: `make setup` installs it"
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI must run the browser test")
        pytest.skip(reason)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def served(book):
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(book.html))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


WAIT_FOR_IMAGES = """async () => {
    const images = Array.from(document.images);
    images.forEach(img => { img.loading = "eager"; });
    const settled = img => img.complete ? null : new Promise(done => {
        img.addEventListener("load", done); img.addEventListener("error", done); });
    const timeout = new Promise(done => setTimeout(done, 10000));
    await Promise.race([Promise.all(images.map(settled)), timeout]);
    return images.map(img => [img.getAttribute("src"), img.naturalWidth]);
}"""

RENDER_MATH = """async () => {
    await MathJax.startup.promise;
    return [document.querySelectorAll("mjx-container").length,
            document.querySelectorAll("mjx-merror").length];
}"""


# What a reader trips over, checked on every page. Each check returns the problems it
# finds, and test_reader_checks_catch_broken_pages proves each one on a deliberately
# broken page.
PHONE = {"width": 390, "height": 844}

WIDER_THAN_BOX = """() => {
    const found = [];
    // unfold folded cells
    document.querySelectorAll("article details").forEach(d => { d.open = true; });
    for (const pre of document.querySelectorAll("article pre")) {
        if (pre.clientWidth === 0) continue;  // not shown: a folded cell
        if (pre.scrollWidth > pre.clientWidth + 1) {
            const kind = pre.closest("div.cell_output, div.output") ? "output" : "code";
            const longest = pre.innerText.split("\\n")
                .reduce((a, b) => b.length > a.length ? b : a, "");
            found.push(`${kind} line wider than its box `
                       + `(${pre.scrollWidth} > ${pre.clientWidth} px): `
                       + longest.trim().slice(0, 90));
        }
    }
    return found;
}"""

SHRUNK_IMAGES = """() => [...document.querySelectorAll("article img")]
    .filter(img => img.naturalWidth > 0 && img.clientWidth > 0)
    .filter(img => !/\\.svg([?#]|$)|^data:image\\/svg/i.test(img.currentSrc || img.src))
    .filter(img => img.clientWidth < img.naturalWidth / 2)
    .map(img => `${img.getAttribute("src").slice(0, 80)}: `
                + `drawn ${img.naturalWidth} px wide, shown at ${img.clientWidth} px `
                + "(a raster picture shrunk below half: illegible)")"""

CUT_OFF_ON_A_PHONE = """() => {
    const found = [];
    const article = document.querySelector("article");
    if (!article) return ["no article"];
    const right = article.getBoundingClientRect().right;
    const wide = "table, div.math, mjx-container[display='true']";
    for (const el of article.querySelectorAll(wide)) {
        if (el.getClientRects().length === 0) continue;
        let scrolls = false;
        for (let e = el; e && e !== article; e = e.parentElement) {
            const overflow = getComputedStyle(e).overflowX;
            if (overflow === "auto" || overflow === "scroll") { scrolls = true; break; }
        }
        const cut = el.scrollWidth > el.clientWidth + 1
                    || el.getBoundingClientRect().right > right + 1;
        if (cut && !scrolls) {
            found.push(`a ${el.tagName.toLowerCase()} is cut off at the right edge: `
                       + el.textContent.trim().slice(0, 60));
        }
    }
    return found;
}"""

PAGE_TEXT = "() => document.body.textContent"
LINKS_IN_TEXT = (
    "() => [...document.querySelectorAll('article a[href]')].map(a => a.href)"
)

# BibTeX styles lowercase titles; these must keep their capitals on the references page.
ACRONYMS = [
    "GQA",
    "SmolLM2",
    "PyTorch",
    "PaLM",
    "FlashAttention",
    "FlashAttention-2",
    "RoFormer",
    "GLU",
    "SGDR",
    "LLaMA",
    "MiniCPM",
    "BFLOAT16",
    "GPT-2",
    "LoRA",
    "BPE",
    "GGUF",
]


def lowercased_acronyms(text: str) -> list[str]:
    found = set()
    for acronym in ACRONYMS:
        for match in re.finditer(
            rf"(?<![\w-]){re.escape(acronym)}(?![\w])", text, re.IGNORECASE
        ):
            if match.group() != acronym:
                found.add(f"{match.group()!r} should read {acronym!r}")
    return sorted(found)


def links_to(hrefs: list[str], page: str) -> bool:
    """True if one of the links leads to the book's page `page` (e.g.
    "exercises/01_rmsnorm")."""
    return any(urlsplit(h).path.endswith(f"/{page}.html") for h in hrefs)


def mentions_iprogress(text: str) -> bool:
    return "IProgress" in text


def exercise_links(doc: str) -> tuple[str | None, str | None]:
    """(the page `doc` must link to, why), from the declared chapter -> exercise map."""
    from tests.nbtools import CHAPTER_EXERCISES

    folder, _, stem = doc.partition("/")
    if folder == "chapters" and CHAPTER_EXERCISES.get(stem):
        return f"exercises/{CHAPTER_EXERCISES[stem]}", "its exercise"
    if folder == "exercises":
        back = [c for c, e in CHAPTER_EXERCISES.items() if e == stem]
        return (f"chapters/{back[0]}", "its chapter") if back else (None, None)
    return None, None


MATHJAX_STARTED = "() => window.MathJax && MathJax.startup && MathJax.startup.promise"


@dataclass
class RepoLinks:
    """Where the book's buttons must lead, from _config.yml."""

    url: str
    branch: str
    book_path: str
    colab: str

    @classmethod
    def from_config(cls) -> RepoLinks:
        cfg = config()
        repo = cfg["repository"]
        return cls(
            url=repo["url"].rstrip("/"),
            branch=repo.get("branch", "main"),
            book_path=(repo.get("path_to_book") or "").strip("/"),
            colab=cfg["launch_buttons"]["colab_url"].rstrip("/"),
        )

    def colab_link(self, doc: str) -> str:
        owner_repo = urlsplit(self.url).path.strip("/")
        nb_path = "/".join(p for p in (self.book_path, f"{doc}.ipynb") if p)
        return f"{self.colab}/github/{owner_repo}/blob/{self.branch}/{nb_path}"


def _is_local(url: str, served: str) -> bool:
    return url.startswith(served + "/")


def _favicon(u: str) -> bool:
    return urlsplit(u).path == "/favicon.ico"  # browsers ask for it; the book has none


def _record_page_errors(page, served: str, errors: list[str], current: dict) -> None:
    """Append to errors what the page itself reports: uncaught exceptions, and console
    errors, failed loads and HTTP errors of the book's own files."""

    def own(url: str) -> bool:
        return _is_local(url, served) and not _favicon(url)

    def console(msg):
        url = msg.location.get("url")
        if msg.type == "error" and own(url or ""):
            errors.append(f"{current['page']}: console: {msg.text} ({url})")

    def failed(req):
        if own(req.url):
            errors.append(f"{current['page']}: failed to load {req.url}")

    def response(res):
        if res.status >= 400 and own(res.url):
            errors.append(f"{current['page']}: HTTP {res.status} for {res.url}")

    page.on(
        "pageerror", lambda exc: errors.append(f"{current['page']}: uncaught {exc}")
    )
    page.on("console", console)
    page.on("requestfailed", failed)
    page.on("response", response)


def _button_problems(page, doc: str, links: RepoLinks) -> list[str]:
    """The repository and issue buttons, and on a notebook page the Colab launch link
    behind the rocket button."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    problems = []
    if page.locator(f'a[href="{links.url}"]').count() < 1:
        problems.append(f"{doc}: no repository button")
    if page.locator(f'a[href^="{links.url}/issues/new"]').count() < 1:
        problems.append(f"{doc}: no issue button")
    if source_of(doc).suffix != ".ipynb":
        return problems
    want = links.colab_link(doc)
    launch = page.locator(".dropdown-launch-buttons")
    hrefs = launch.locator(f'a[href^="{links.colab}/"]').evaluate_all(
        "els => els.map(e => e.href)"
    )
    if hrefs != [want]:
        return [*problems, f"{doc}: Colab launch links {hrefs}, expected [{want}]"]
    # the rocket button opens its menu
    launch.locator("button").first.click()
    try:
        launch.locator(f'a[href="{want}"]').wait_for(state="visible", timeout=5000)
    except PlaywrightTimeout:
        problems.append(f"{doc}: the rocket button does not show the Colab link")
    page.keyboard.press("Escape")
    return problems


def _image_problems(page, doc: str) -> list[str]:
    """Every picture loaded; a notebook page shows at least the images its cells'
    stored outputs hold."""
    images = page.evaluate(WAIT_FOR_IMAGES)
    problems = []
    if not all(width > 0 for _, width in images):
        problems.append(f"{doc}: images not loaded: {[s for s, w in images if not w]}")
    source = source_of(doc)
    if source.suffix == ".ipynb":
        shown = sum(1 for src, _ in images if src and "_images/" in src)
        stored = image_outputs(source)
        if shown < stored:
            problems.append(f"{doc}: {shown} pictures shown, the notebook has {stored}")
    return problems


def _math_problems(page, doc: str, n_math: int) -> tuple[list[str], bool]:
    """The page's n_math formulas rendered by the book's own MathJax: (problems,
    whether MathJax ran)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function(MATHJAX_STARTED, timeout=15000)
        containers, merrors = page.evaluate(RENDER_MATH)
    except PlaywrightTimeout:
        problem = f"{doc}: {n_math} formulas, and MathJax never started"
        return [f"{problem} (is _static/mathjax there?)"], False
    if containers >= n_math and not merrors:
        return [], True
    problem = f"{doc}: {n_math} formulas, {containers} rendered by MathJax"
    return [f"{problem}, {merrors} with errors"], True


def _reader_problems(page, doc: str) -> list[str]:
    """What a reader trips over: cut-off lines, shrunken pictures, tqdm's notice,
    missing chapter <-> exercise links, lowercased acronyms in the references."""
    found = page.evaluate(WIDER_THAN_BOX) + page.evaluate(SHRUNK_IMAGES)
    if mentions_iprogress(page.evaluate(PAGE_TEXT)):
        found.append("the page shows tqdm's IProgress notice")
    target, what = exercise_links(doc)
    if target and not links_to(page.evaluate(LINKS_IN_TEXT), target):
        found.append(f"no link to {what}, {target}")
    if doc == "book/references":
        found += lowercased_acronyms(page.locator("article").inner_text())
    return [f"{doc}: {problem}" for problem in found]


def _phone_problems(phone, url: str, doc: str, has_math: bool) -> list[str]:
    """The same page at a phone's width: nothing cut off at the right edge."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    phone.goto(url, wait_until="load")
    if has_math:
        try:
            phone.wait_for_function(MATHJAX_STARTED, timeout=15000)
            phone.evaluate(RENDER_MATH)
        except PlaywrightTimeout:
            pass  # reported at desktop width
    width = PHONE["width"]
    return [f"{doc} at {width} px: {p}" for p in phone.evaluate(CUT_OFF_ON_A_PHONE)]


def _page_problems(page, phone, doc: str, links: RepoLinks) -> tuple[list[str], bool]:
    """Every check of one page, at a desktop's and at a phone's width: (the problems
    found, whether MathJax rendered formulas on it)."""
    problems = []
    if not page.locator("article h1").first.is_visible():
        problems.append(f"{doc}: no visible title")
    problems += _button_problems(page, doc, links)
    problems += _image_problems(page, doc)
    n_math, rendered = page.locator(".math").count(), False
    if n_math:
        found, rendered = _math_problems(page, doc, n_math)
        problems += found
    problems += _reader_problems(page, doc)
    problems += _phone_problems(phone, page.url, doc, n_math > 0)
    return problems, rendered


@contextlib.contextmanager
def _book_in_chromium(served: str, profile: Path, errors: list[str], current: dict):
    """A Chromium that loads nothing but the book's own files (the book must work
    offline): yields (page, phone), a desktop-sized page that reports its errors into
    errors, and a phone-sized one."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(profile),
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 900},
        )
        try:
            context.route(
                "**/*",
                lambda route: (
                    route.continue_()
                    if _is_local(route.request.url, served)
                    else route.abort()
                ),
            )
            page = context.pages[0] if context.pages else context.new_page()
            _record_page_errors(page, served, errors, current)
            phone = context.new_page()
            phone.set_viewport_size(PHONE)
            page.bring_to_front()
            yield page, phone
        finally:
            context.close()


def test_pages_in_chromium(book, served, tmp_path):
    """Open the landing page, then follow the "next" link through every page of
    _toc.yml, checking each at a desktop's and at a phone's width."""
    _require_browser()
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    links, pages = RepoLinks.from_config(), toc_pages()
    errors: list[str] = []  # every problem found; the walk goes on to the last page
    current = {"page": "(landing)"}
    pages_with_math = 0
    start = time.perf_counter()
    browser = _book_in_chromium(served, tmp_path / "profile", errors, current)
    with browser as (page, phone):
        page.goto(served + "/", wait_until="load")
        for i, doc in enumerate(pages):
            current["page"] = doc
            try:
                page.wait_for_url(
                    f"{served}/{doc}.html", wait_until="load", timeout=15000
                )
            except PlaywrightTimeout:
                came_from = (
                    f'the "next" link of {pages[i - 1]}' if i else "the landing URL"
                )
                raise AssertionError(
                    f"{came_from} led to {page.url}, not to {doc}.html\n"
                    + "\n".join(errors)
                ) from None
            problems, rendered = _page_problems(page, phone, doc, links)
            errors += problems
            pages_with_math += rendered
            if i == 0:
                SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(SCREENSHOT), full_page=True)
            # the reader's way on: the "next" link at the bottom
            if i + 1 < len(pages):
                page.locator("a.right-next").first.click()
    problems = "\n".join(errors)
    assert not errors, f"{len(errors)} problems in the book's pages:\n{problems}"
    assert pages_with_math, "no page with math: the MathJax check never ran"
    print(
        f"checked {len(pages)} pages in {time.perf_counter() - start:.1f} s; "
        f"screenshot {SCREENSHOT}"
    )


BROKEN_PAGE = """<!doctype html><html><head><style>
  pre { font: 14px monospace; margin: 0; }
  .box { width: 240px; }
  table { border-collapse: collapse; }
</style></head><body><article class="bd-article" style="width: 300px">
  <div class="cell_input box"><pre style="overflow-x: auto">CODE</pre></div>
  <div class="cell_output box"><pre style="overflow-x: auto">OUTPUT</pre></div>
  <div class="cell_output box">
    <pre style="white-space: pre-wrap; overflow-wrap: anywhere">OUTPUT</pre></div>
  <img id="raster" src="RASTER" style="width: 100px">
  <img id="vector" src="VECTOR" style="width: 100px">
  <p>TqdmWarning: IProgress not found. Please update jupyter and ipywidgets.</p>
  <table><tr><td>
    a_cell_far_too_wide_for_a_phone_screen_of_three_hundred_and_ninety_pixels_at_all
  </td></tr></table>
  <div class="scrolls" style="overflow-x: auto"><table><tr><td>
    a_cell_far_too_wide_for_a_phone_screen_of_three_hundred_and_ninety_pixels
  </td></tr></table></div>
  <p>Ainslie et al. Gqa: training generalized multi-query transformer models.
     Pytorch 2. SmolLM2.</p>
  <p><a href="../chapters/01_rmsnorm.html">chapter 1</a></p>
</article></body></html>"""
# the broken page's lines that are too long for their boxes, and a vector picture
BROKEN_PAGE_PARTS = {
    "CODE": 'model = SmolLM(SmolConfig.preset("smollm2-135m")).to(device).eval()',
    "OUTPUT": "SmolConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536)",
    "VECTOR": (
        "data:image/svg+xml;utf8,&lt;svg xmlns='http://www.w3.org/2000/svg' "
        "width='400' height='40'/&gt;"
    ),
}


def test_reader_checks_catch_broken_pages(tmp_path):
    """Each check of test_pages_in_chromium fails on a page made to break it, and passes
    the same page's good parts: a code line and an unwrapped output line wider than
    their box (a wrapped one passes), a raster picture shown at a quarter of its width
    (a vector one passes), tqdm's notice, a wide table that cannot scroll (one inside a
    scrolling box passes), lowercased acronyms, and a chapter without a link to its
    exercise."""
    _require_browser()
    import base64
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from playwright.sync_api import sync_playwright

    png = io.BytesIO()
    plt.imsave(png, [[0.0] * 400] * 20, format="png")  # a 400 x 20 raster picture
    html = BROKEN_PAGE.replace(
        "RASTER", "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()
    )
    for placeholder, text in BROKEN_PAGE_PARTS.items():
        html = html.replace(placeholder, text)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        try:
            page = browser.new_page(viewport=PHONE)
            page.set_content(html)
            page.wait_for_function("() => [...document.images].every(i => i.complete)")
            wide = page.evaluate(WIDER_THAN_BOX)
            assert len(wide) == 2, wide
            assert wide[0].startswith("code line") and wide[1].startswith(
                "output line"
            ), wide
            shrunk = page.evaluate(SHRUNK_IMAGES)
            assert len(shrunk) == 1 and "drawn 400 px" in shrunk[0], shrunk
            cut = page.evaluate(CUT_OFF_ON_A_PHONE)
            assert len(cut) == 1 and "table" in cut[0], cut
            text = page.evaluate(PAGE_TEXT)
            assert mentions_iprogress(text)
            references = page.locator("p").nth(1).inner_text()
            assert lowercased_acronyms(references) == [
                "'Gqa' should read 'GQA'",
                "'Pytorch' should read 'PyTorch'",
            ]
            hrefs = page.evaluate(LINKS_IN_TEXT)
            assert not links_to(hrefs, "exercises/01_rmsnorm") and links_to(
                hrefs, "chapters/01_rmsnorm"
            )
        finally:
            browser.close()
    assert exercise_links("chapters/01_rmsnorm") == (
        "exercises/01_rmsnorm",
        "its exercise",
    )
    assert exercise_links("exercises/01_rmsnorm") == (
        "chapters/01_rmsnorm",
        "its chapter",
    )
    assert exercise_links("chapters/00_the_model_at_a_glance") == (None, None)
