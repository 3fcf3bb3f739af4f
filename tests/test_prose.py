"""Prose a newcomer can follow, and that does not contradict itself.

- Every code cell of a chapter follows a markdown cell: a sentence says what the cell
  does before the reader meets it. The one exception is the shared setup cell, the
  first cell of every notebook (folded in the book), which comes before the title.
- One quantity has one value: where two pages (or two places on one page) state the
  same quantity, they agree. QUANTITIES names each quantity the book states in more than
  one place with the words that state it; a new quantity is one more entry. The
  chapters are found by a glob, so a new chapter is checked as soon as it exists.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest

from tests import nbtools
from tests.test_claims import CITE, prose_sources

ROOT = Path(__file__).resolve().parents[1]


def chapters() -> list[Path]:
    return sorted((ROOT / "chapters").glob("*.ipynb"))


def uninvited_code_cells(nb, name: str) -> list[str]:
    """The code cells of a notebook that no markdown cell introduces: each follows
    another code cell (or opens the notebook without being its setup cell)."""
    found = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        if i == 0 and nbtools.is_setup_cell(cell):
            continue  # the shared setup cell, before the title
        before = nb.cells[i - 1] if i else None
        if (
            before is None
            or before.cell_type != "markdown"
            or not before.source.strip()
        ):
            first = cell.source.strip().partition("\n")[0][:70]
            found.append(f"{name} cell {i}: {first!r} follows no sentence")
    return found


@pytest.mark.parametrize("path", chapters(), ids=lambda p: p.stem)
def test_every_code_cell_is_introduced(path):
    """A sentence before every code cell: what it computes, or why it is there."""
    nb = nbformat.read(path, as_version=4)
    problems = uninvited_code_cells(nb, path.name)
    assert not problems, "\n".join(problems)


def test_the_introduction_check_catches_two_code_cells_in_a_row():
    """The check fails on a chapter with two code cells in a row, and on one whose
    first cell is code but not the setup cell; an empty markdown cell introduces
    nothing."""
    nb = nbformat.read(chapters()[0], as_version=4)
    assert not uninvited_code_cells(nb, "chapter")
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and i > 0]
    doubled = nbformat.from_dict(nb)
    doubled.cells.insert(code[0] + 1, nbformat.v4.new_code_cell("print(1 + 1)"))
    assert uninvited_code_cells(doubled, "mutant") == [
        f"mutant cell {code[0] + 1}: 'print(1 + 1)' follows no sentence"
    ]
    headless = nbformat.from_dict(nb)
    headless.cells[0] = nbformat.v4.new_code_cell("import torch")
    assert uninvited_code_cells(headless, "mutant") == [
        "mutant cell 0: 'import torch' follows no sentence"
    ]
    blank = nbformat.from_dict(nb)
    blank.cells[code[0] - 1] = nbformat.v4.new_markdown_cell("  \n")
    assert len(uninvited_code_cells(blank, "mutant")) == 1


# --- one quantity, one value ------------------------------------------------------

WORD_VALUES = {
    "two thirds": 2 / 3,
    "three quarters": 3 / 4,
    "three fifths": 3 / 5,
    "half": 1 / 2,
    "a fifth": 1 / 5,
    "seven": 7,
    "eight": 8,
}
NUMBER = r"\d[\d,]*(?:\.\d+)?"
WORDS = "|".join(sorted(WORD_VALUES, key=len, reverse=True))
# a stretch of text that does not leave the quantity's own sentence
NEAR = r"(?:(?!\.\s)[^;]){0,%d}?"


@dataclass(frozen=True)
class Quantity:
    """A quantity the book states in more than one place: each of `patterns` finds
    statements of it, its group `value` the value stated (a number or WORD_VALUES'
    words)."""

    name: str
    patterns: tuple[str, ...]

    def __init__(self, name: str, *patterns: str):
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "patterns", patterns)


QUANTITIES = [
    Quantity(
        "bfloat16's stored mantissa bits",
        # "bfloat16 ... only 7 stored mantissa bits", never crossing a float16 of
        # its own
        rf"bfloat16(?:(?!\bfloat16|\bfloat32\b has)[\s\S]){{0,200}}?"
        rf"\b(?P<value>\d+|{WORDS})\s+(?:stored\s+)?mantissa bits",
    ),
    Quantity(
        "seconds to load the bundled Q4_1 file as float32 (median)",
        # its sentence may run on past a semicolon
        r"(?:bundled Q4_1 file|bundled file)(?:(?!\.\s)[\s\S]){0,220}?"
        rf"(?:median|as float32|dequantized to float32){NEAR % 120}"
        rf"(?P<value>{NUMBER})\s*s\b",
    ),
    Quantity(
        "size of the two held-out plays (kB)",
        rf"held-out plays{NEAR % 20}\((?:about\s+)?(?P<value>{NUMBER})\s*kB",
    ),
    Quantity(
        "time to train the tokenizer, over tokenizers' time",
        rf"\btrain\w*{NEAR % 160}(?P<value>{NUMBER})\s*(?:times|x)\s+"
        r"(?:as long as|the time of) tokenizers'? trainer",
    ),
    Quantity(
        "SmolLM2-135M's parameters",
        r"(?P<value>1\d\d,\d{3},\d{3}) parameters",
    ),
    Quantity(
        "the MLPs' share of a layer",
        rf"MLPs?{NEAR % 80}(?P<value>{WORDS}|{NUMBER}%) of (?:a|every|each) layer",
    ),
    Quantity(
        "characters in the whole Shakespeare corpus (millions)",
        rf"Shakespeare(?:'s plays)? (?:has|holds) (?P<value>{NUMBER}) million"
        r" characters",
        rf"(?:whole corpus|published them \() ?(?P<value>{NUMBER}) million",
    ),
    Quantity(
        "the Python the set-up needs",
        r"Python (?:is )?(?P<value>3\.\d+)(?:\+| or (?:newer|later))",
    ),
    Quantity(
        "MMLU's test questions",
        rf"(?:MMLU's|all of MMLU's)\s+(?P<value>{NUMBER})\s+test questions",
    ),
    Quantity(
        "the tied embedding's share of the parameters",
        rf"(?:tied|token) embedding (?:holds|is) (?P<value>{WORDS}|{NUMBER}%)",
        rf"(?P<value>{WORDS}|{NUMBER}%) of the model is the (?:tied |token )?embedding",
    ),
]


def value_of(text: str) -> float:
    text = text.lower()
    if text in WORD_VALUES:
        return WORD_VALUES[text]
    return float(text.replace(",", "").rstrip("%")) / (100 if text.endswith("%") else 1)


def flat(text: str) -> str:
    """Prose as one line, citations, links' addresses and markup left out."""
    text = CITE.sub("", text)
    text = re.sub(r"\]\([^)\s]*\)", "]", text)  # [a paper](https://...): its words
    text = re.sub(r"[*`]", "", text)
    return " ".join(text.split())


def statements(sources, quantity: Quantity) -> list[tuple[str, str, float]]:
    """(where, what it says, the value) of every statement of the quantity."""
    found = []
    for where, text in sources:
        for pattern in quantity.patterns:
            for m in re.finditer(pattern, flat(text), re.IGNORECASE):
                found.append((where, m["value"], value_of(m["value"])))
    return found


def disagreements(sources) -> list[str]:
    """Each quantity stated with more than one value, with where each value stands."""
    problems = []
    for quantity in QUANTITIES:
        said = statements(sources, quantity)
        # the same value at the precision each statement gives: 0.68 and 0.680 agree
        values = {round(v, 2) for _, _, v in said}
        if len(values) > 1:
            where = "; ".join(f"{w}: {text}" for w, text, _ in said)
            problems.append(f"{quantity.name} is stated as {sorted(values)}: {where}")
    return problems


SOURCES = prose_sources()


@pytest.mark.parametrize("quantity", QUANTITIES, ids=lambda q: q.name)
def test_each_quantity_is_found(quantity):
    """Each entry still finds what it was written for: at least one statement (a
    pattern that matches nothing would pass the test below by saying nothing)."""
    assert statements(SOURCES, quantity), f"no statement of {quantity.name}"


def test_one_quantity_has_one_value():
    problems = disagreements(SOURCES)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    "old, new, name",
    [
        ("7 stored mantissa bits", "8 stored mantissa bits", "mantissa"),
        ("(215 kB", "(about 210 kB", "held-out plays"),
        ("134,515,008 parameters", "134,515,080 parameters", "parameters"),
        # README and the set-up page once asked for 3.10, which the pins cannot use
        ("Python 3.11 or newer", "Python 3.10 or newer", "Python"),
    ],
)
def test_a_second_value_is_caught(old, new, name):
    """The book as it was before its contradictions were fixed: one statement of a
    quantity changed to another value, on one page, makes the check fail and name the
    quantity."""
    changed, done = [], False
    for where, text in SOURCES:
        if not done and old in text:
            text, done = text.replace(old, new, 1), True
        changed.append((where, text))
    assert done, f"no source says {old!r}"
    problems = disagreements(changed)
    assert len(problems) == 1 and name in problems[0], problems


@pytest.mark.parametrize(
    "said, name",
    [
        # chapter 8 once gave the bundled file's load as 6.8 s
        ("Loaded as float32, the bundled Q4_1 file takes a median of 6.8 s.", "Q4_1"),
        # chapter 7 once timed its trainer at 2.9 times tokenizers'
        ("Our training takes 2.9x the time of tokenizers' trainer.", "tokenizer"),
        ("The MLPs are two thirds of every layer.", "share of a layer"),
        ("Of the weights the tied embedding holds 25%.", "embedding"),
        # chapter 7 once gave the training plays' count as the whole corpus's
        ("Shakespeare has 4.6 million characters.", "Shakespeare corpus"),
    ],
)
def test_a_page_that_says_otherwise_is_caught(said, name):
    """A page that states a quantity with another value than the book's, as the book
    once did, fails the check, which names the quantity."""
    problems = disagreements([*SOURCES, ("extra.md", said)])
    assert len(problems) == 1 and name in problems[0], problems


# --- names the prose gives of smol's code exist ------------------------------------

# `smol.module.name`, or `module.name` for a module a chapter imports from smol
DOTTED = re.compile(
    r"`(?:(?P<smol>smol)\.)?(?P<module>[a-z_]+)\.(?P<name>[A-Za-z_]\w*)"
)


def smol_imports(nb) -> set[str]:
    """The names a notebook imports with `from smol import a, b`."""
    found = set()
    for cell in nb.cells:
        if cell.cell_type == "code":
            for m in re.finditer(
                r"^from smol import \(?([\w, \n]+)\)?", cell.source, re.MULTILINE
            ):
                found |= {n.strip() for n in m[1].split(",") if n.strip()}
    return found


def missing_names(where: str, text: str, imported: set[str]) -> list[str]:
    """Each `smol.module.name`, and `module.name` of a module in `imported`, that the
    text names and smol does not hold (a function moved or renamed since)."""
    missing = []
    for m in DOTTED.finditer(text):
        if not m["smol"] and m["module"] not in imported:
            continue
        try:
            module = importlib.import_module(f"smol.{m['module']}")
        except ImportError:
            if m["smol"]:
                missing.append(f"{where}: {m[0]}` names no module of smol")
            continue
        if not hasattr(module, m["name"]):
            missing.append(f"{where}: {m[0]}` is not in smol.{m['module']}")
    return missing


def test_the_prose_names_code_that_exists():
    """A function the prose names by its module is there: chapter 14 once sent the
    reader to `evaluate.wilson_interval` after the interval had moved to smol.stats."""
    missing = []
    for path in chapters():
        nb = nbformat.read(path, as_version=4)
        imported = smol_imports(nb)
        for i, cell in enumerate(nb.cells):
            if cell.cell_type == "markdown":
                name = f"{path.name} cell {i}"
                missing += missing_names(name, cell.source, imported)
    for where, text in prose_sources():
        if not where.startswith("chapters/"):
            missing += missing_names(where, text, set())
    assert not missing, "\n".join(missing)


def test_a_moved_function_is_caught():
    """The stale name fails the check; the same name in its module's place passes."""
    old = "The interval (`evaluate.wilson_interval`) turns a count into a range."
    assert missing_names("page", old, {"evaluate", "stats"}) == [
        "page: `evaluate.wilson_interval` is not in smol.evaluate"
    ]
    assert not missing_names("page", old.replace("evaluate.", "stats."), {"stats"})
    assert missing_names("page", "`smol.evaluation.score`", set())
