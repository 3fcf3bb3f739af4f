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

from tests.nbtools import pinned_torch, toc_pages

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
    # every host name but the book's server fails to resolve, in the browser itself
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
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


def test_measurement_figures_are_drawn_from_the_csvs_at_build_time(book, tmp_path):
    """The Benchmarks page's figures in the built book are what bench/plot_results.py
    draws from today's CSVs, byte for byte: they cannot show an older run than the
    tables beside them.
    No figure of measurements is stored in the repository."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "plot_results", ROOT / "bench" / "plot_results.py"
    )
    plot_results = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plot_results)
    for name, draw in [
        ("benchmarks", plot_results.main),
        ("card", plot_results.draw_card),
    ]:
        fresh = tmp_path / f"{name}.svg"
        draw(fresh)
        built = list((book.html / "_images").glob(f"{name}*.svg"))
        assert len(built) == 1, built
        assert built[0].read_bytes() == fresh.read_bytes(), name
    tracked = subprocess.run(
        ["git", "ls-files", "book/images"], cwd=ROOT, capture_output=True, text=True
    ).stdout.split()
    assert tracked == ["book/images/smollm2.svg"], tracked  # a drawing, not data


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


class _Text(HTMLParser):
    """The text a reader sees on a page: no scripts, no style sheets."""

    def __init__(self):
        super().__init__()
        self.skip = 0
        self.parts: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.skip += tag in ("script", "style")

    def handle_endtag(self, tag):
        self.skip -= tag in ("script", "style") and self.skip > 0

    def handle_data(self, data):
        if not self.skip:
            self.parts.append(data)


# A dash glued to the word after it is a command-line flag that typography turned into
# an en or em dash (`--limit` shown as "–limit"): copied, the command does not run.
DASHED_FLAG = re.compile(r"(?<![\w–—])[–—][a-z][a-z-]*")


def dashed_flags(text: str) -> list[str]:
    return [
        text[max(0, m.start() - 40) : m.end()].replace("\n", " ")
        for m in DASHED_FLAG.finditer(text)
    ]


def test_no_flag_is_shown_with_a_typographic_dash(book):
    """`--limit` in a caption or a table must reach the reader as two hyphens. Sphinx's
    smart quotes turn `--` into an en dash in prose (captions included) unless
    `smartquotes_action` leaves dashes alone; this looks at every built page."""
    found = []
    for path in sorted(book.html.rglob("*.html")):
        if path.relative_to(book.html).parts[0].startswith("_"):
            continue
        parser = _Text()
        parser.feed(path.read_text(errors="replace"))
        found += [
            f"{path.relative_to(book.html)}: ...{hit}"
            for hit in dashed_flags("".join(parser.parts))
        ]
    assert not found, "flags shown with a dash a reader cannot type:\n" + "\n".join(
        found
    )


def test_dashed_flag_check_catches_an_en_dash():
    assert dashed_flags("python bench/card.py –limit 200") == [
        "python bench/card.py –limit"
    ]
    assert dashed_flags("run it with —dtype bfloat16")
    # ranges and dashes between words are prose
    assert not dashed_flags("Chapters 1–5 and pages 3–4, a pause — then")
    assert not dashed_flags("smol eval --limit 200")


def page_text(book: Book, page: str) -> str:
    parser = _Text()
    parser.feed((book.html / f"{page}.html").read_text(errors="replace"))
    return " ".join("".join(parser.parts).split())


def test_the_pages_list_the_package_and_the_installs_of_today(book):
    """The landing page's module table, the set-up page's list of what the setup
    cell installs and each chapter's reading time are made at build time
    (book/_ext/generated.py) from the package, smol.commands.VERBS, pyproject.toml,
    the Makefile and the notebooks: a module, a verb, an install or a paragraph added
    there reaches the built pages without anyone editing them."""
    from smol.commands import VERBS
    from tests.nbtools import (
        benchmarks_requirement,
        data_requirement,
        pyproject_list,
        requirement_name,
        weights_requirement,
    )

    intro = page_text(book, "book/intro")
    modules = [p.stem for p in (ROOT / "smol").glob("*.py") if p.stem[0] != "_"]
    assert len(modules) > 30
    missing = [m for m in modules if f"{m} " not in intro]
    missing += [f"smol {v}" for v in VERBS if f"smol {v} " not in intro]
    assert not missing, f"the landing page does not name {missing}"
    rows = re.search(r"The package has (\d+) modules", intro)
    assert rows and int(rows[1]) == len(modules), rows
    setup = page_text(book, "book/setup")
    wanted = [requirement_name(r) for r in pyproject_list("notebooks")]
    wanted += [weights_requirement(), data_requirement(), benchmarks_requirement()]
    assert [w for w in wanted if w not in setup] == []
    sys.path.insert(0, str(ROOT / "book" / "_ext"))
    try:
        from generated import reading
    finally:
        sys.path.remove(str(ROOT / "book" / "_ext"))
    for notebook in sorted((ROOT / "chapters").glob("*.ipynb")):
        minutes, words, _ = reading(notebook)
        text = page_text(book, f"chapters/{notebook.stem}")
        assert f"Reading time: about {minutes} minutes ({words:,} words" in text


def chapter_titles() -> dict[int, str]:
    """Each chapter of _toc.yml by its number, with its title: its notebook's first
    heading, "# 7. The tokenizer"."""
    import nbformat

    titles = {}
    for page in toc_pages():
        if not page.startswith("chapters/"):
            continue
        nb = nbformat.read(source_of(page), as_version=4)
        heading = next(
            line
            for cell in nb.cells
            if cell.cell_type == "markdown"
            for line in cell.source.splitlines()
            if line.startswith("# ")
        )
        number, _, title = heading.removeprefix("# ").partition(". ")
        titles[int(number)] = title.strip()
    return titles


def landing_figure() -> Path:
    """The picture of the model on the landing page."""
    intro = (ROOT / f"{toc_pages()[0]}.md").read_text()
    (name,) = re.findall(r"```\{figure\}\s+(\S+)", intro)
    return (ROOT / toc_pages()[0]).parent / name


FIGURE_LABEL = re.compile(r"ch\. (\d+) · (.+)")


def figure_label_problems(svg: str, titles: dict[int, str]) -> list[str]:
    """The figure's chapter labels ("ch. 7 · The tokenizer") against the chapters:
    each label names a chapter by its number and title, and every chapter has one."""
    import xml.etree.ElementTree as ET

    texts = [
        "".join(t.itertext()).strip()
        for t in ET.fromstring(svg).iter("{http://www.w3.org/2000/svg}text")
    ]
    labels = [m.groups() for m in map(FIGURE_LABEL.fullmatch, texts) if m]
    problems = [
        f"label 'ch. {n} · {title}': chapter {n} is "
        + (f"'{titles[int(n)]}'" if int(n) in titles else "not in _toc.yml")
        for n, title in labels
        if titles.get(int(n)) != title
    ]
    missing = sorted(set(titles) - {int(n) for n, _ in labels})
    problems += [f"no label for chapter {n}, '{titles[n]}'" for n in missing]
    return problems


def test_landing_figure_labels_the_chapters():
    """The landing figure says which chapter builds each part, in the chapters' own
    numbers and titles, and leaves none out."""
    titles = chapter_titles()
    assert len(titles) >= 13, titles
    problems = figure_label_problems(landing_figure().read_text(), titles)
    assert not problems, f"{landing_figure().name}:\n" + "\n".join(problems)


def test_figure_label_check_catches_old_labels():
    """The label check fails on a renumbered chapter, a title that no longer matches,
    and a missing chapter."""
    svg = """<svg xmlns="http://www.w3.org/2000/svg"><text>ch. 1 · RMSNorm</text>
        <text>ch. 2 · RoPE</text><text>ch. 3 · The tokenizer</text></svg>"""
    titles = {1: "RMSNorm", 2: "Rotary position embeddings (RoPE)", 7: "The tokenizer"}
    assert figure_label_problems(svg, titles) == [
        "label 'ch. 2 · RoPE': chapter 2 is 'Rotary position embeddings (RoPE)'",
        "label 'ch. 3 · The tokenizer': chapter 3 is not in _toc.yml",
        "no label for chapter 7, 'The tokenizer'",
    ]


# every text of a picture inside its frame, and no two texts on top of each other
TEXT_IN_PICTURE = """() => {
    const svg = document.documentElement;
    const frame = svg.getBoundingClientRect();  // as drawn: rotated texts too
    const boxes = [...svg.querySelectorAll("text")]
        .map(t => [t.textContent, t.getBoundingClientRect()]);
    const found = [];
    for (const [text, b] of boxes) {
        if (b.left < frame.left - 0.5 || b.top < frame.top - 0.5
                || b.right > frame.right + 0.5 || b.bottom > frame.bottom + 0.5) {
            found.push(`"${text}" reaches outside the picture`);
        }
    }
    boxes.forEach(([text, a], i) => boxes.slice(i + 1).forEach(([other, b]) => {
        const apart = a.right <= b.left || b.right <= a.left
                      || a.bottom <= b.top || b.bottom <= a.top;
        if (!apart) found.push(`"${text}" overlaps "${other}"`);
    }));
    return found;
}"""


def test_landing_figure_text_fits(tmp_path):
    """Drawn by the browser, the landing figure's texts lie inside the picture and
    apart from each other (a longer label would run off its right edge)."""
    _require_browser()

    bad = tmp_path / "bad.svg"
    bad.write_text(
        '<svg xmlns="http://www.w3.org/2000/svg" width="100" height="40">'
        '<text x="60" y="15">ch. 3 · Attention</text>'
        '<text x="2" y="20">one</text><text x="4" y="22">two</text></svg>'
    )
    with _chromium() as browser:
        page = browser.new_page()
        page.goto(landing_figure().as_uri())
        problems = page.evaluate(TEXT_IN_PICTURE)
        page.goto(bad.as_uri())
        broken = page.evaluate(TEXT_IN_PICTURE)
    assert not problems, f"{landing_figure().name}:\n" + "\n".join(problems)
    assert broken == [
        '"ch. 3 · Attention" reaches outside the picture',
        '"one" overlaps "two"',
    ], broken


class _Anchors(HTMLParser):
    """Every link of a page, as (href, text)."""

    def __init__(self):
        super().__init__()
        self.links: list[tuple[str, str]] = []
        self._open: list[list[str]] = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self._open.append([dict(attrs).get("href") or "", ""])

    def handle_data(self, data):
        for link in self._open:
            link[1] += data

    def handle_endtag(self, tag):
        if tag == "a" and self._open:
            href, text = self._open.pop()
            self.links.append((href, " ".join(text.split())))


# "Kingma and Ba, 2015", "Allal et al., 2025", "Dao, 2024"
CITATION = re.compile(
    r"[A-Z][\w'’-]*(?: and [A-Z][\w'’-]*| et al\.)?, (?:19|20)\d\d[a-z]?"
)


def citation_problems(pages: dict[str, list[tuple[str, str]]], listed: set[str]):
    """(the citations found, what is wrong with them): each citation must link to the
    paper itself, at an address the references page lists. pages: each page's links as
    _Anchors finds them; listed: the addresses of the references page's entries."""
    cited, problems = 0, []
    for page, links in sorted(pages.items()):
        for href, text in links:
            if not CITATION.fullmatch(text):
                continue
            cited += 1
            if href not in listed:
                problems.append(
                    f"{page}: ({text}) links to {href}, not to a paper listed"
                )
    return cited, problems


def test_citations_link_to_the_papers_the_references_list(book):
    """A citation ("Kingma and Ba, 2015") links to the paper itself, so that it works
    in Jupyter and Colab too, at an address that the references page lists; and the
    references page says so."""
    pages = {}
    for path in book.html.rglob("*.html"):
        if path.relative_to(book.html).parts[0] == "_static":
            continue
        parser = _Anchors()
        parser.feed(path.read_text(errors="replace"))
        pages[str(path.relative_to(book.html))] = parser.links
    references = (book.html / "book" / "references.html").read_text()
    entries = references.partition('class="citation-list"')[2]
    listed = {h for h, _ in pages["book/references.html"] if urlsplit(h).scheme} & {
        h for h in re.findall(r'href="([^"]+)"', entries)
    }
    assert len(listed) >= 20, listed
    cited, problems = citation_problems(pages, listed)
    assert cited >= 30, f"only {cited} citations found: is CITATION out of date?"
    assert not problems, "\n".join(problems)
    text = " ".join(re.sub(r"<[^>]+>", " ", references).split())
    assert "A citation in the text" in text and "links to the paper itself" in text, (
        "book/references.md must say where a citation leads: to the paper itself"
    )


def test_citation_check_catches_wrong_links():
    """The citation check fails on a citation that links into the references page, and
    on one whose paper the references page does not list."""
    listed = {"https://arxiv.org/abs/1412.6980"}
    pages = {
        "a.html": [
            ("https://arxiv.org/abs/1412.6980", "Kingma and Ba, 2015"),
            ("references.html#id8", "Allal et al., 2025"),
            ("https://arxiv.org/abs/9999.99999", "Dao, 2024"),
            ("intro.html", "Chapter 7, 2024 edition"),
        ]
    }
    assert citation_problems(pages, listed) == (
        3,
        [
            "a.html: (Allal et al., 2025) links to references.html#id8, "
            + "not to a paper listed",
            "a.html: (Dao, 2024) links to https://arxiv.org/abs/9999.99999, "
            + "not to a paper listed",
        ],
    )


def glossary_terms(markdown: str) -> dict[str, str]:
    """The terms of a page's {glossary} block, each with its definition."""
    (block,) = re.findall(r"```\{glossary\}\n(.*?)\n```", markdown, re.DOTALL)
    terms, term = {}, None
    for line in block.splitlines():
        if line and not line[0].isspace():
            term = line.strip()
            terms[term] = ""
        elif term:
            terms[term] += line.strip() + " "
    return terms


def glossary_problems(terms: dict[str, str], chapters: list[str]) -> list[str]:
    """Each term must link to a chapter that explains it, and each chapter (e.g.
    "chapters/07_the_tokenizer") must have a term."""
    linked = {
        t: set(re.findall(r"<\.\./(chapters/[^>]+)>`", d)) for t, d in terms.items()
    }
    problems = [f"'{t}' names no chapter" for t, cs in linked.items() if not cs]
    problems += [
        f"'{t}' names {c}, not a chapter"
        for t, cs in linked.items()
        for c in sorted(cs - set(chapters))
    ]
    every = set().union(*linked.values())
    problems += [f"no term from {c}" for c in chapters if c not in every]
    return problems


def test_glossary_has_terms_from_every_chapter():
    """The glossary's terms link to the chapters that explain them, and every chapter
    of _toc.yml contributes terms (the tokenizer's, fast generation's and LoRA's
    too)."""
    chapters = [p for p in toc_pages() if p.startswith("chapters/")]
    terms = glossary_terms((ROOT / "book" / "glossary.md").read_text())
    problems = glossary_problems(terms, chapters)
    assert not problems, "book/glossary.md:\n" + "\n".join(problems)
    assert len(terms) >= 20, terms
    bad = glossary_problems(
        {"BPE": "Merges pairs.", "RoPE": "({doc}`chapter 2 <../chapters/02_rope>`)"},
        ["chapters/02_rope", "chapters/07_the_tokenizer"],
    )
    assert bad == ["'BPE' names no chapter", "no term from chapters/07_the_tokenizer"]


def torch_versions(text: str) -> list[str]:
    """The PyTorch releases a text says it uses ("PyTorch 2.13.0", "torch==2.13.0"),
    leaving out the release a feature first came in ("since PyTorch 2.5")."""
    return [
        m.group(1)
        for m in re.finditer(
            r"(?i)(?<!since )\b(?:pytorch|torch)\s*(?:==\s*)?(\d+\.\d+(?:\.\d+)?)", text
        )
    ]


def test_chapters_quote_the_pinned_pytorch():
    """A chapter that names the PyTorch release it runs names the Makefile's pin; the
    GPU chapter, whose kernels change between releases, names it."""
    import nbformat

    pin = pinned_torch()
    wrong, named = [], set()
    for page in toc_pages():
        if not page.startswith("chapters/"):
            continue
        nb = nbformat.read(source_of(page), as_version=4)
        prose = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
        for version in torch_versions(prose):
            named.add(page)
            if not f"{pin}.".startswith(f"{version}."):
                wrong.append(f"{page}: PyTorch {version}, the Makefile pins {pin}")
    assert not wrong, "\n".join(wrong)
    assert "chapters/11_sdpa_on_a_gpu" in named, "chapter 11 names no PyTorch release"
    assert torch_versions(
        "Since PyTorch 2.5, SDPA groups heads. Measured under PyTorch 2.11; "
        "`torch==2.13.0` is pinned, and torch 2.13 too."
    ) == ["2.11", "2.13.0", "2.13"]


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


@contextlib.contextmanager
def _chromium():
    """A headless Chromium of CHROMIUM, offline (CHROMIUM_ARGS), closed on the way
    out."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield browser
        finally:
            browser.close()


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
NEXT_FRAME = "() => new Promise(done => requestAnimationFrame(() => done()))"

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

PAGE_WIDER_THAN_SCREEN = """() => {
    const screen = document.documentElement.clientWidth;
    const width = document.documentElement.scrollWidth;
    if (width <= screen + 1) return [];
    // what sticks out: the innermost elements past the right edge that no box clips
    const out = [];
    for (const el of document.querySelectorAll("body *")) {
        if (el.getClientRects().length === 0) continue;
        if (el.getBoundingClientRect().right <= screen + 1) continue;
        let free = true;  // neither clipped by a box nor fixed to the screen
        for (let e = el; e && e !== document.body; e = e.parentElement) {
            const s = getComputedStyle(e);
            if (s.position === "fixed" || (e !== el && s.overflowX !== "visible")) {
                free = false;
                break;
            }
        }
        if (free) out.push(el);
    }
    const leaves = out.filter(el => !out.some(o => o !== el && el.contains(o)));
    const names = leaves.slice(0, 3).map(el => `${el.tagName.toLowerCase()} `
        + `"${el.textContent.trim().slice(0, 50)}"`);
    return [`the page is ${width} px wide on a ${screen} px screen: `
            + (names.join(", ") || "(no single element)")];
}"""

WIDER_THAN_COLUMN = """() => {
    const article = document.querySelector("article");
    if (!article) return ["no article"];
    const style = getComputedStyle(article);
    const box = article.getBoundingClientRect();
    const right = box.right - parseFloat(style.paddingRight);
    const found = [];
    const reported = [];  // once per equation: its div.math or its mjx-container
    for (const el of article.querySelectorAll(
            "table, div.math, mjx-container[display='true']")) {
        if (el.getClientRects().length === 0) continue;
        if (reported.some(r => r.contains(el) || el.contains(r))) continue;
        const hidden = el.scrollWidth - el.clientWidth;  // behind a sideways scroll
        const over = el.getBoundingClientRect().right - right;  // past the column
        if (hidden > 1 || over > 1) {
            reported.push(el);
            found.push(`a ${el.tagName.toLowerCase()} is wider than the text column by `
                       + `${Math.round(Math.max(hidden, over))} px: `
                       + el.textContent.trim().slice(0, 60));
        }
    }
    return found;
}"""

# a notebook's raster pictures as shown: (address, width shown, width drawn) in px
RASTER_FIGURES = """() => [...document.querySelectorAll("article div.cell_output img")]
    .filter(img => !/\\.svg([?#]|$)/i.test(img.currentSrc || img.src))
    .filter(img => img.naturalWidth > 0 && img.clientWidth > 0)
    .map(img => [img.currentSrc || img.src, img.clientWidth, img.naturalWidth])"""

# Tables printed as text (book/_ext/legible.py's is_text_table: three or more lines of
# at most 88 characters sharing a column edge) whose rows wrap as shown: each one's box
# is measured as it is and again with its lines kept whole.
WRAPPED_TEXT_TABLES = """() => {
    const found = [];
    for (const pre of document.querySelectorAll("article div.cell_output pre")) {
        if (pre.getClientRects().length === 0) continue;
        const lines = pre.textContent.split("\\n").filter(l => l.trim());
        if (lines.length < 3 || Math.max(...lines.map(l => l.length)) > 88) continue;
        const edges = new Map();
        for (const line of lines) {
            const at = new Set();
            for (const m of line.matchAll(/(?<=  )\\S/g)) at.add(m.index);
            for (const m of line.matchAll(/\\S(?=  )/g)) at.add(-(m.index + 1));
            for (const a of at) edges.set(a, (edges.get(a) || 0) + 1);
        }
        if (Math.max(0, ...edges.values()) < 3) continue;
        const shown = pre.scrollHeight;
        const before = pre.style.whiteSpace;
        pre.style.whiteSpace = "pre";
        const whole = pre.scrollHeight;
        pre.style.whiteSpace = before;
        if (shown > whole + 1) {
            found.push("a table printed as text wraps its rows: "
                       + lines[0].trim().slice(0, 60));
        }
    }
    return found;
}"""

# the vector figures of a page as shown: (address, width in px)
SVG_FIGURES = """() => [...document.querySelectorAll("article img")]
    .filter(img => /\\.svg([?#]|$)/i.test(img.currentSrc || img.src))
    .filter(img => img.clientWidth > 0)
    .map(img => [img.currentSrc || img.src, img.clientWidth])"""

# A picture opened by itself, at its own size: each label's text and the height in px of
# its font once the picture is shown `shown` px wide. Labels are <text> elements, or, as
# matplotlib draws them, glyph paths scaled by fontsize / 100 inside a g#text_N (the
# label's text in a comment before them).
LABEL_SIZES = """shown => {
    const svg = document.documentElement;
    const scale = shown / svg.getBoundingClientRect().width;
    const out = [];
    for (const t of svg.querySelectorAll("text")) {
        if (t.getClientRects().length === 0 || !t.textContent.trim()) continue;
        const size = parseFloat(getComputedStyle(t).fontSize);
        out.push([t.textContent.trim().slice(0, 40), size * scale]);
    }
    for (const g of svg.querySelectorAll("g[id^='text_']")) {
        const glyphs = [...g.querySelectorAll("g[transform*='scale(']")]
            .filter(e => e.querySelector("use"));
        if (!glyphs.length) continue;
        const note = [...g.childNodes].find(n => n.nodeType === Node.COMMENT_NODE);
        const size = Math.min(...glyphs.map(e => {
            const m = e.getCTM();
            return 100 * Math.hypot(m.a, m.b);
        }));
        out.push([note ? note.textContent.trim().slice(0, 40) : g.id, size * scale]);
    }
    return out;
}"""
MIN_LABEL_PX = 8


def small_labels(context, figures: list) -> list[str]:
    """The labels of each figure (address, shown width) whose font is under
    MIN_LABEL_PX px high as shown, each figure opened by itself in a page of its own."""
    found = []
    page = context.new_page()
    try:
        for src, shown in figures:
            page.goto(src)
            small = sorted(
                (size, text)
                for text, size in page.evaluate(LABEL_SIZES, shown)
                if size < MIN_LABEL_PX
            )
            name = urlsplit(src).path.rsplit("/", 1)[-1]
            found += [
                f"{name} shown {shown} px wide: {len(small)} labels under "
                f"{MIN_LABEL_PX} px, '{text}' {size:.1f} px"
                for size, text in small[:1]
            ]
    finally:
        page.close()
    return found


SET_THEME = """theme => {  // what the theme's light/dark switch does
    const html = document.documentElement;
    const before = html.dataset.theme === undefined ? null : html.dataset.theme;
    if (theme === null) delete html.dataset.theme; else html.dataset.theme = theme;
    return before;
}"""

# Every element of a table or a cell's output that holds text of its own: the text, its
# colour, and the background colour and image of each box from <html> down to it.
TEXT_ON_BACKGROUND = """() => {
    const found = [];
    const seen = new Set();
    const roots = document.querySelectorAll("article table, article div.cell_output");
    for (const root of roots) {
        for (const el of [root, ...root.querySelectorAll("*")]) {
            if (seen.has(el)) continue;
            seen.add(el);
            if (el.getClientRects().length === 0) continue;
            const own = [...el.childNodes].filter(n => n.nodeType === Node.TEXT_NODE)
                .map(n => n.textContent).join("").trim();
            if (!own) continue;
            const layers = [];
            for (let e = el; e; e = e.parentElement) {
                const s = getComputedStyle(e);
                layers.unshift([s.backgroundColor, s.backgroundImage]);
            }
            found.push([own.slice(0, 40), getComputedStyle(el).color, layers]);
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


# WCAG 2's minimum contrast for body text
MIN_CONTRAST = 4.5
Colour = tuple[float, float, float]


def css_colours(text: str) -> list[tuple[float, float, float, float]]:
    """The rgb()/rgba() colours in a computed style value, as (r, g, b, alpha)."""
    other = re.search(r"\b(?:color|lab|lch|oklab|oklch|hsla?|hwb)\(", text)
    if other:
        raise ValueError(f"a colour that is not rgb() or rgba(): {text!r}")
    colours = []
    for args in re.findall(r"rgba?\(([^)]*)\)", text):
        parts = [float(x) for x in re.split(r"[\s,/]+", args.strip()) if x]
        colours.append((*parts[:3], parts[3] if len(parts) > 3 else 1.0))
    return colours


def over(top: tuple[float, float, float, float], below: Colour) -> Colour:
    """`top` painted over the opaque colour `below`."""
    *rgb, alpha = top
    return tuple(alpha * t + (1 - alpha) * b for t, b in zip(rgb, below))


def contrast(a: Colour, b: Colour) -> float:
    """WCAG 2's contrast ratio of two opaque sRGB colours (1 to 21)."""

    def luminance(c: Colour) -> float:
        lin = [
            v / 12.92 if v <= 0.04045 else ((v + 0.055) / 1.055) ** 2.4
            for v in (x / 255 for x in c)
        ]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]

    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def backdrops(layers: list[list[str]]) -> set[Colour]:
    """Every colour that can lie behind an element's text, from the background colour
    and image of each box from <html> down to it (pairs of computed styles): each
    background colour painted over what lies below, and each colour stop of a
    background image that is at least half opaque (the covers of the scroll shadows,
    not the faint shadows themselves) painted over that."""
    found = {(255.0, 255.0, 255.0)}  # the browser's canvas
    for colour, image in layers:
        for c in css_colours(colour):
            found = {over(c, b) for b in found}
        stops = [c for c in css_colours(image) if c[3] >= 0.5]
        found |= {over(c, b) for c in stops for b in found}
    return found


def low_contrast(items: list, theme: str) -> list[str]:
    """The texts whose colour contrasts with something behind them by less than
    MIN_CONTRAST; items as TEXT_ON_BACKGROUND returns them."""
    found = []
    for text, colour, layers in items:
        (fg,) = css_colours(colour)
        worst = min((contrast(over(fg, b), b), b) for b in backdrops(layers))
        if worst[0] < MIN_CONTRAST:
            behind = "#" + "".join(f"{round(v):02x}" for v in worst[1])
            found.append(
                f"in {theme} mode {text!r} ({colour}) on {behind}: contrast "
                f"{worst[0]:.1f} < {MIN_CONTRAST}"
            )
    return found


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
    """What a reader trips over: cut-off lines, tables and equations wider than the
    text column, shrunken pictures, tqdm's notice, missing chapter <-> exercise links,
    lowercased acronyms in the references."""
    found = page.evaluate(WIDER_THAN_BOX) + page.evaluate(WIDER_THAN_COLUMN)
    found += page.evaluate(SHRUNK_IMAGES)
    if mentions_iprogress(page.evaluate(PAGE_TEXT)):
        found.append("the page shows tqdm's IProgress notice")
    target, what = exercise_links(doc)
    if target and not links_to(page.evaluate(LINKS_IN_TEXT), target):
        found.append(f"no link to {what}, {target}")
    if doc == "book/references":
        found += lowercased_acronyms(page.locator("article").inner_text())
    return [f"{doc}: {problem}" for problem in found]


def png_pictures(notebook: Path) -> dict[str, tuple[float, float]]:
    """Each PNG a notebook's outputs hold, by the name the book gives its file (the
    sha256 of its bytes): (the smallest font size its cell gives matplotlib, in
    points; its dpi)."""
    import base64
    import hashlib

    import nbformat

    sys.path.insert(0, str(ROOT / "book" / "_ext"))
    try:
        from legible import png_size, smallest_points
    finally:
        sys.path.remove(str(ROOT / "book" / "_ext"))
    found = {}
    for cell in nbformat.read(notebook, as_version=4).cells:
        for out in cell.get("outputs", []):
            data = out.get("data", {}).get("image/png")
            if data:
                raw = base64.b64decode(data)
                found[hashlib.sha256(raw).hexdigest()] = (
                    smallest_points(cell.source),
                    png_size(raw)[1],
                )
    return found


def raster_label_problems(doc: str, figures: list) -> list[str]:
    """The notebook pictures whose smallest labels are under MIN_LABEL_PX px high as
    shown: a label of p points drawn at d dpi is p * d / 72 pixels high in the
    picture, and the picture is shown at (width shown / width drawn) of its size."""
    source = source_of(doc)
    known = png_pictures(source) if source.suffix == ".ipynb" else {}
    found = []
    for src, shown, drawn in figures:
        name = urlsplit(src).path.rsplit("/", 1)[-1].removesuffix(".png")
        if name not in known:
            continue  # not a cell's output picture (a logo, a drawing of the book's)
        points, dpi = known[name]
        px = points * dpi / 72 * shown / drawn
        if px < MIN_LABEL_PX:
            found.append(
                f"{name[:12]}.png shown {shown} of {drawn} px wide: its"
                f" {points:g}-point labels are {px:.1f} px high"
            )
    return found


def _phone_problems(page, doc: str) -> list[str]:
    """The same page at a phone's width: nothing cut off at the right edge, every
    label of a figure (vector or a notebook's raster picture) at least MIN_LABEL_PX px
    high as shown, every display equation within the text column (set on several
    lines where one is too wide, rather than scrolled), and no table printed as text
    wrapping its rows. The page
    is laid out again at that width (the theme's narrow layout is CSS alone), then
    given back its own."""
    desktop = page.viewport_size
    page.set_viewport_size(PHONE)
    try:
        page.evaluate(NEXT_FRAME)
        found = page.evaluate(CUT_OFF_ON_A_PHONE) + page.evaluate(
            PAGE_WIDER_THAN_SCREEN
        )
        found += small_labels(page.context, page.evaluate(SVG_FIGURES))
        # a table may scroll in its shadowed box; an equation must fit, or wrap
        found += [
            p for p in page.evaluate(WIDER_THAN_COLUMN) if not p.startswith("a table")
        ]
        found += raster_label_problems(doc, page.evaluate(RASTER_FIGURES))
        found += page.evaluate(WRAPPED_TEXT_TABLES)
    finally:
        page.set_viewport_size(desktop)
    return [f"{doc} at {PHONE['width']} px: {p}" for p in found]


def _theme_problems(page, doc: str, most: int = 5) -> list[str]:
    """Text in tables and cells' outputs that does not stand out from what lies behind
    it, in the light theme and in the dark one."""
    found = []
    before = page.evaluate(SET_THEME, "light")
    try:
        for theme in ("light", "dark"):
            page.evaluate(SET_THEME, theme)
            low = low_contrast(page.evaluate(TEXT_ON_BACKGROUND), theme)
            found += low[:most] + [f"... and {len(low) - most} more"] * (
                len(low) > most
            )
    finally:
        page.evaluate(SET_THEME, before)
    return [f"{doc}: {p}" for p in found]


def _page_problems(page, doc: str, links: RepoLinks) -> tuple[list[str], bool]:
    """Every check of one page, at a desktop's and at a phone's width, in the light and
    the dark theme: (the problems found, whether MathJax rendered formulas on it)."""
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
    problems += _theme_problems(page, doc)
    problems += _phone_problems(page, doc)
    return problems, rendered


@contextlib.contextmanager
def _book_in_chromium(served: str, profile: Path, errors: list[str], current: dict):
    """A Chromium that loads nothing but the book's own files (the book must work
    offline: CHROMIUM_ARGS leave it no other host): yields a desktop-sized page that
    reports its errors into errors."""
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
            page = context.pages[0] if context.pages else context.new_page()
            _record_page_errors(page, served, errors, current)
            yield page
        finally:
            context.close()


def test_pages_in_chromium(book, served, tmp_path):
    """Open the landing page, then follow the "next" link through every page of
    _toc.yml, checking each at a desktop's and at a phone's width, and the colours of
    its tables and outputs in the light and the dark theme."""
    _require_browser()
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    links, pages = RepoLinks.from_config(), toc_pages()
    errors: list[str] = []  # every problem found; the walk goes on to the last page
    current = {"page": "(landing)"}
    pages_with_math = 0
    start = time.perf_counter()
    browser = _book_in_chromium(served, tmp_path / "profile", errors, current)
    with browser as page:
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
            problems, rendered = _page_problems(page, doc, links)
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


def test_the_browser_reaches_the_book_and_no_other_host(served):
    """The book's server answers at 127.0.0.1; the same server under another name
    (localhost) does not, as no host on the internet would: what the book needs must
    be in the book."""
    _require_browser()
    from playwright.sync_api import Error

    with _chromium() as browser:
        page = browser.new_page()
        assert page.goto(served + "/").ok
        other = served.replace("127.0.0.1", "localhost")
        with pytest.raises(Error, match="ERR_NAME_NOT_RESOLVED"):
            page.goto(other + "/")


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

    png = io.BytesIO()
    plt.imsave(png, [[0.0] * 400] * 20, format="png")  # a 400 x 20 raster picture
    html = BROKEN_PAGE.replace(
        "RASTER", "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()
    )
    for placeholder, text in BROKEN_PAGE_PARTS.items():
        html = html.replace(placeholder, text)
    with _chromium() as browser:
        page = browser.new_page(viewport=PHONE)
        page.set_content(html)
        page.wait_for_function("() => [...document.images].every(i => i.complete)")
        wide = page.evaluate(WIDER_THAN_BOX)
        assert len(wide) == 2, wide
        assert wide[0].startswith("code line") and wide[1].startswith("output line"), (
            wide
        )
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
    assert exercise_links("chapters/01_rmsnorm") == (
        "exercises/01_rmsnorm",
        "its exercise",
    )
    assert exercise_links("exercises/01_rmsnorm") == (
        "chapters/01_rmsnorm",
        "its chapter",
    )
    assert exercise_links("chapters/00_the_model_at_a_glance") == (None, None)


BROKEN_LAYOUT_PAGE = """<!doctype html><html><head><style>
  body { margin: 0; font: 16px sans-serif; }
  td.band { color: #222832; background: linear-gradient(to right, #14181e 30%,
            transparent) left / 2.5rem 100% no-repeat, #ced6dd; }
  td.fine { color: #cf222e; background: linear-gradient(to right, #f3f4f5 30%,
            transparent) left / 2.5rem 100% no-repeat, radial-gradient(farthest-side
            at 0 50%, rgba(0, 0, 0, 0.25), transparent) left / 0.8rem 100% no-repeat,
            #f3f4f5; }
  html[data-theme="dark"] td.pink { background: #ced6dd; color: #f3c7ee; }
</style></head><body><article style="width: 300px">
  <table><tr>
    <td style="color: #cf222e; background: #ced6dd">FAIL</td><td class="band">rms</td>
    <td class="fine">values</td><td class="pink">not written</td>
  </tr></table>
  <div style="overflow-x: auto"><table style="width: 500px"><tr><td>
    a table wider than the column, scrolling in its own box</td></tr></table></div>
  <div class="math" style="overflow-x: auto">
    <span style="display: inline-block; width: 500px">x = 1</span></div>
  <p>See <code class="literal"><span class="pre" style="white-space: nowrap"
    >torch.nn.functional.scaled_dot_product_attention_of_a_long_name</span></code>.</p>
</article></body></html>"""


def test_layout_and_theme_checks_catch_broken_pages():
    """The checks of tables, equations, page width and colours, each on a page made
    to break it: low-contrast text (red on grey, a dark band over the first letters,
    and pale pink on grey in the dark theme only; the same red on a lighter box, under
    a faint scroll shadow, passes), a table and an equation wider than the text column
    even inside their own scrolling box, and a long unbreakable name that makes a
    phone's page wider than its screen (the same name allowed to break passes)."""
    _require_browser()

    with _chromium() as browser:
        page = browser.new_page(viewport=PHONE)
        page.set_content(BROKEN_LAYOUT_PAGE)
        colours = _theme_problems(page, "broken")
        theme_after = page.evaluate("() => document.documentElement.dataset.theme")
        column = page.evaluate(WIDER_THAN_COLUMN)
        screen = page.evaluate(PAGE_WIDER_THAN_SCREEN)
        page.locator("span.pre").evaluate(
            "el => { el.style.whiteSpace = 'pre-wrap';"
            " el.parentElement.style.overflowWrap = 'break-word'; }"
        )
        screen_fixed = page.evaluate(PAGE_WIDER_THAN_SCREEN)
    assert [p.split(" (")[0] for p in colours] == [
        "broken: in light mode 'FAIL'",
        "broken: in light mode 'rms'",
        "broken: in dark mode 'FAIL'",
        "broken: in dark mode 'rms'",
        "broken: in dark mode 'not written'",
    ], colours
    assert theme_after is None  # the page's own theme is put back
    assert [p.split(" is wider")[0] for p in column] == ["a table", "a div"], column
    assert len(screen) == 1 and "torch.nn.functional" in screen[0], screen
    assert screen_fixed == []
    assert round(contrast((255, 255, 255), (0, 0, 0)), 1) == 21.0
    # the lightest grey with WCAG's 4.5 on white, as WebAIM's checker gives it
    assert round(contrast((0x76, 0x76, 0x76), (255, 255, 255)), 2) == 4.54


def test_label_check_catches_small_labels(tmp_path):
    """The label check measures a drawn <text> and a matplotlib label (glyph paths):
    each is reported shown too narrow for 8 px labels, and passes shown wide enough."""
    _require_browser()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn = tmp_path / "drawn.svg"
    drawn.write_text(
        '<svg xmlns="http://www.w3.org/2000/svg" width="920" height="100">'
        '<text x="10" y="50" font-size="12">ch. 1 · RMSNorm</text></svg>'
    )
    fig, ax = plt.subplots(figsize=(8, 2))  # 576 pt wide
    ax.set_title("a label", fontsize=9)
    plotted = tmp_path / "plotted.svg"
    fig.savefig(plotted)
    plt.close(fig)
    with _chromium() as browser:
        context = browser.new_context()
        narrow = small_labels(context, [(drawn.as_uri(), 342), (plotted.as_uri(), 342)])
        wide = small_labels(context, [(drawn.as_uri(), 640), (plotted.as_uri(), 640)])
    assert len(narrow) == 2, narrow
    assert "drawn.svg shown 342 px wide" in narrow[0], narrow
    assert "'ch. 1 · RMSNorm' 4.5 px" in narrow[0], narrow
    assert "plotted.svg shown 342 px wide" in narrow[1], narrow
    assert "'a label' 5.3 px" in narrow[1], narrow
    assert wide == [], wide


def _legible():
    sys.path.insert(0, str(ROOT / "book" / "_ext"))
    try:
        import legible
    finally:
        sys.path.remove(str(ROOT / "book" / "_ext"))
    return legible


def test_legible_widths_come_from_the_picture_and_its_cell(tmp_path):
    """book/_ext/legible.py: a cell's smallest font (matplotlib's 10 points, or less
    where the code asks), a PNG's width and dpi as matplotlib writes them, and the
    width at which such labels are 8 px high; a text table told from prose."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    legible = _legible()
    assert legible.smallest_points("plt.plot(x)\nbatch_size=4; figsize=(9, 3)") == 10
    assert legible.smallest_points("ax.set_title('a', fontsize=8)") == 8
    assert legible.smallest_points('ax.legend(fontsize="small")') == pytest.approx(8.33)
    assert legible.smallest_points("ax.tick_params(labelsize=14)") == 10
    fig, ax = plt.subplots(figsize=(9.9, 2.9), dpi=100)
    ax.plot([0, 1])
    fig.savefig(tmp_path / "f.png")
    plt.close(fig)
    assert legible.png_size((tmp_path / "f.png").read_bytes()) == (990, 100.0)
    # 10 points at 100 dpi are 13.9 px as drawn: 8 px at 990 * 8 / 13.9 = 571 px
    assert legible.legible_width(990, 100.0, 10) == 571
    assert legible.legible_width(300, 100.0, 10) == 173
    assert legible.legible_width(300, 50.0, 5) == 300  # never wider than drawn
    with pytest.raises(ValueError):
        legible.png_size(b"GIF89a")
    table = "step  loss   acc\n   1  2.31  0.10\n   2  1.95  0.25\n"
    assert legible.is_text_table(table)
    assert not legible.is_text_table("loss 2.31 after 1 step\nthen 1.95\n")
    # three long lines of sampled text with a double space are no table
    prose = "correct  'Once upon a time, in a village by the sea, there lived'\n"
    assert not legible.is_text_table(prose * 3 + "x" * 89)
    assert not legible.is_text_table("a  b\nab  c\nabc  d\n")


def test_raster_label_check_reads_the_pictures_of_a_chapter():
    """The phone check of a notebook's pictures: chapter 15's first picture shown at a
    third of its width has 5 px labels and is reported; shown at the width legible.py
    gives it, it passes; a picture the notebook does not hold is left alone."""
    legible = _legible()
    doc = "chapters/15_preference_tuning"
    name, (points, dpi) = next(iter(png_pictures(source_of(doc)).items()))
    drawn = 890
    third = raster_label_problems(doc, [(f"x/_images/{name}.png", drawn // 3, drawn)])
    assert len(third) == 1 and "labels are 4.6 px high" in third[0], third
    wide = legible.legible_width(drawn, dpi, points)
    assert raster_label_problems(doc, [(f"x/_images/{name}.png", wide, drawn)]) == []
    assert raster_label_problems(doc, [("x/_static/logo.png", 10, drawn)]) == []


WRAPPING_TABLE_PAGE = """<!doctype html><html><head><style>
  pre { font: 14px monospace; white-space: pre-wrap; overflow-wrap: anywhere; }
  .keep pre { white-space: pre; overflow-x: auto; }
</style></head><body><article style="width: 240px">
<div class="cell_output"><div class="wrap"><pre>model       accuracy   interval
untuned     24.3%      18.9 to 30.6
dpo         40.3%      33.8 to 47.1</pre></div></div>
<div class="cell_output"><div class="keep"><pre>model       accuracy   interval
untuned     24.3%      18.9 to 30.6
dpo         40.3%      33.8 to 47.1</pre></div></div>
<div class="cell_output"><pre>a line of prose that wraps, no table at all</pre></div>
</article></body></html>"""


def test_text_table_check_catches_wrapped_rows():
    """A table printed as text in a box narrower than its rows is reported where its
    rows wrap, and passes where they are kept whole (and scroll); prose may wrap."""
    _require_browser()
    with _chromium() as browser:
        page = browser.new_page(viewport=PHONE)
        page.set_content(WRAPPING_TABLE_PAGE)
        found = page.evaluate(WRAPPED_TEXT_TABLES)
    assert found == [
        "a table printed as text wraps its rows: model       accuracy   interval"
    ], found


def test_reading_time_counts_what_a_reader_meets(tmp_path):
    """book/_ext/generated.py's reading time: words of text without the citations'
    comments and the folded <details>, lines of code the book shows (not the folded
    ones, not blank ones), at
    200 words and 20 lines a minute, rounded up."""
    import nbformat

    sys.path.insert(0, str(ROOT / "book" / "_ext"))
    try:
        from generated import reading
    finally:
        sys.path.remove(str(ROOT / "book" / "_ext"))
    nb = nbformat.v4.new_notebook()
    prose = (
        " ".join(["word"] * 390)
        + " 41.6%<!-- cite bench/results/card.csv: a=b -> c -->"
    )
    folded = "<details>\n<summary>More</summary>\n\n" + "deep " * 500 + "\n</details>"
    nb.cells = [
        nbformat.v4.new_markdown_cell(prose + "\n\n" + folded),
        nbformat.v4.new_code_cell("x = 1\n\ny = 2\n"),
        nbformat.v4.new_code_cell("\n".join(["z = 3"] * 50)),
    ]
    nb.cells[2].metadata["tags"] = ["hide-input"]
    path = tmp_path / "c.ipynb"
    nbformat.write(nb, path)
    assert reading(path) == (3, 391, 2)  # 391 / 200 + 2 / 20 = 2.06, rounded up
