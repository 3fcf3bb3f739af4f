"""A number in prose is a claim: it is printed by the code cell right above it, or it
cites the row of a CSV under bench/results/ that holds it.

A citation is an HTML comment right after the number (invisible in the book, Jupyter
and Colab):

    2.12x<!-- cite bench/results/generate.csv: path=smol, bf16; prompt=story
    -> vs transformers float32 -->

The filters (`column=value`, separated by `;`) pick exactly one row; the number must
equal the cell of the column after `->`, rounded to the decimals the prose shows. Words
count as numbers ("twice" is 2). In a chapter, a measured number (a ratio such as 2.5x
or "3 times", a percentage, a time, a rate) that cites nothing must appear in the
stored output of the code cells right above its markdown cell (a number of two digits or
more may be printed by any code cell above: a summary restates what the chapter
printed), unless `<!-- setting -->` follows it: a value the text chooses (a
schedule's 20%), not one it measured, or `<!-- exact -->`: a value that follows from
the format, the configuration or the cited numbers beside it (float32's 538 MB a token),
not from a measurement. A goal, a limit and an interval's level ("Goals: at least 40%
MFU", "a time limit of 300 s", "95% interval") are settings without a mark.

The measured numbers are ratios (2.5x, "3 times as fast", "twice as", "half as"),
percentages, times (s, ms, seconds, minutes), rates (tokens/s, GB/s) and sizes (kB,
MB, GB, MiB, GiB). On the book's pages, the README and CONTRIBUTING.md, which have no
outputs, each must cite its row or be a setting.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

import nbformat
import pytest

from tests.nbtools import ROOT

CITE = re.compile(
    r"<!--\s*cite\s+(?P<file>[^:\s]+):(?P<filters>.*?)->(?P<column>.*?)-->", re.S
)
WORDS = {"twice": 2.0, "half": 0.5, "three times": 3.0, "four times": 4.0}
# the number (or word) a citation follows, with at most a short unit between them
CITED = re.compile(
    r"(?P<num>\d[\d,]*(?:\.\d+)?|twice|half|three times|four times)"
    r"(?P<unit>[^\d<>]{0,16})$",
    re.I,
)
# what a chapter's prose must back with an output above it or a citation
MEASURED = re.compile(
    r"(?<![\w.,$])(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
    r"|twice as|half as|(?:three|four) times as)\s*"
    r"(?:(?<=as)|x\b(?!\s*\d)|times (?:as|faster|slower|the|more|`)|%|tokens/s|ms\b|s\b"
    r"|seconds?\b|minutes?\b|[kMG]i?B(?:/s\b|\b(?!/)))"
    r"(?!\s*<!--\s*(?:setting|exact)\s*-->)(?!\s*\x00)"
)
# what makes a number a setting without a mark: a goal, a limit, an interval's level
SETTING_BEFORE = re.compile(
    r"(?:\bgoals?\b|\bgoal of|\bat least|time limit|stops after)[^.]{0,50}$",
    re.IGNORECASE,
)
SETTING_AFTER = re.compile(r"\s*(?:interval|confidence)\b", re.IGNORECASE)


def is_setting(text: str, m: re.Match) -> bool:
    """A goal or a limit the text sets ("Goals: at least 40% MFU", "a time limit of 300
    s"), or an interval's confidence level (95%)."""
    return bool(
        SETTING_BEFORE.search(text[max(0, m.start() - 60) : m.start()])
        or SETTING_AFTER.match(text, m.end())
    )


def prose_sources() -> list[tuple[str, str]]:
    """(where, text) of every piece of prose: README, CONTRIBUTING.md, the book's pages,
    each markdown cell of every chapter."""
    out = [
        (name, (ROOT / name).read_text()) for name in ("README.md", "CONTRIBUTING.md")
    ]
    out += [
        (str(p.relative_to(ROOT)), p.read_text())
        for p in sorted(ROOT.glob("book/*.md"))
    ]
    for path in sorted(ROOT.glob("chapters/*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        for i, cell in enumerate(nb.cells):
            if cell.cell_type == "markdown":
                out.append((f"{path.relative_to(ROOT)} cell {i}", cell.source))
    return out


def citations() -> list[tuple[str, str, re.Match]]:
    """(where, text before the citation, the citation) for every citation."""
    return [
        (where, text[: m.start()], m)
        for where, text in prose_sources()
        for m in CITE.finditer(text)
    ]


def number(text: str) -> float:
    """The first number in a CSV cell ("2.54", "33.7%", "1,234")."""
    found = re.search(r"-?\d[\d,]*(?:\.\d+)?", text)
    if found is None:
        raise AssertionError(f"the cell {text!r} holds no number")
    return float(found[0].replace(",", ""))


def decimals(text: str) -> int:
    return len(text.partition(".")[2]) if "." in text else 0


def cited_value(m: re.Match) -> tuple[str, float]:
    """The CSV cell a citation names: (description, value)."""
    path = ROOT / m["file"]
    assert path.is_file() and path.parent == ROOT / "bench" / "results", (
        f"a citation names {m['file']}, which is not a CSV under bench/results/"
    )
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    filters = [
        tuple(part.strip() for part in item.split("=", 1))
        for item in m["filters"].split(";")
        if item.strip()
    ]
    for item in filters:
        assert len(item) == 2 and item[0] in rows[0], (
            f"{m['file']} has no column {item[0]!r} (filters: {m['filters'].strip()})"
        )
    column = m["column"].strip()
    assert column in rows[0], f"{m['file']} has no column {column!r}"
    hits = [r for r in rows if all(r[k].strip() == v for k, v in filters)]
    assert len(hits) == 1, (
        f"the filters {m['filters'].strip()!r} pick {len(hits)} rows of "
        f"{m['file']}, not one"
    )
    return f"{m['file']}, {m['filters'].strip()} -> {column}", number(hits[0][column])


CITATIONS = citations()


def test_there_are_citations():
    """The claims below are checked at all: the prose cites measured rows."""
    assert len(CITATIONS) >= 5


@pytest.mark.parametrize(
    "where, before, m",
    CITATIONS,
    ids=[f"{w}:{m['column'].strip()}" for w, _, m in CITATIONS],
)
def test_citation_matches_its_row(where, before, m):
    said = CITED.search(before.rstrip())
    assert said, (
        f"{where}: a citation of {m['file']} follows no number: ...{before[-60:]!r}"
    )
    where_in_csv, value = cited_value(m)
    text = said["num"].lower()
    if text in WORDS:
        assert round(value) == WORDS[text] or round(value, 1) == WORDS[text], (
            f"{where}: the prose says {text!r} where {where_in_csv} holds {value}"
        )
        return
    stated = float(text.replace(",", ""))
    if before.rstrip()[: said.start()].endswith(("-", "\u2212")):  # a minus sign
        stated = -stated
    assert round(value, decimals(text)) == stated, (
        f"{where}: the prose says {text} where {where_in_csv} holds {value}"
    )


def strip_code_and_math(text: str) -> str:
    text = CITE.sub("\x00", text)  # a cited number is followed by \x00
    text = re.sub(r"```.*?```", " ", text, flags=re.S)
    text = re.sub(r"\$\$.*?\$\$", " ", text, flags=re.S)
    text = re.sub(r"\$[^$\n]+\$", " ", text)
    return re.sub(r"`[^`\n]+`", " ", text)


def outputs_text(cells) -> str:
    parts = []
    for cell in cells:
        for out in cell.get("outputs", []):
            if out.output_type == "stream":
                parts.append(out.text)
            elif "data" in out:
                parts.append(str(out.data.get("text/plain", "")))
    return "\n".join(parts)


def printed(value: str, output: str) -> bool:
    """Is `value` (as the prose states it) in the output, exactly or rounded?"""
    value = value.replace(",", "")
    word = value.lower().removesuffix(" as")
    if word in WORDS:
        value = str(int(WORDS[word]))
    target = float(value)
    for found in re.findall(r"(?<![\w.-])\d+(?:\.\d+)?", output.replace(",", "")):
        if round(float(found), decimals(value)) == target:
            return True
    return False


def uncited_measurements() -> list[tuple[str, str]]:
    """(where, the sentence) of each measured number in a chapter's prose that neither
    cites a row nor appears in the output of the code cells above it."""
    missing = []
    for path in sorted(ROOT.glob("chapters/*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        for i, cell in enumerate(nb.cells):
            if cell.cell_type != "markdown":
                continue
            earlier = outputs_text(c for c in nb.cells[:i] if c.cell_type == "code")
            above = []
            for prev in reversed(nb.cells[:i]):
                if prev.cell_type != "code":
                    break
                above.append(prev)
            above = outputs_text(above)
            text = cell.source
            for m in MEASURED.finditer(strip_code_and_math(text)):
                if is_setting(strip_code_and_math(text), m):
                    continue
                # a small number or a word is found in any long output by chance: it
                # must be printed right above
                digits = re.sub(r"\D", "", m["num"]).lstrip("0")
                output = earlier if len(digits) >= 2 else above
                if not printed(m["num"], output):
                    where = f"{path.relative_to(ROOT)} cell {i}"
                    s = strip_code_and_math(text)
                    missing.append((where, s[max(0, m.start() - 50) : m.end() + 10]))
    return missing


def uncited_page_measurements() -> list[tuple[str, str]]:
    """(where, the sentence) of each measured number on a page with no outputs (the
    book's pages, the README, CONTRIBUTING.md) that cites no row and is not marked as
    a setting."""
    missing = []
    for where, text in prose_sources():
        if where.startswith("chapters/"):
            continue
        s = strip_code_and_math(text)
        for m in MEASURED.finditer(s):
            if not is_setting(s, m):
                missing.append((where, s[max(0, m.start() - 50) : m.end() + 10]))
    return missing


def test_page_numbers_are_cited_or_settings():
    """On a page without outputs a measured number cites its row, or is a setting."""
    missing = uncited_page_measurements()
    assert not missing, "measured numbers that cite nothing:\n" + (
        "\n".join(f"  {w}: ...{s!r}" for w, s in missing)
    )


def test_chapter_numbers_are_printed_above_or_cited():
    missing = uncited_measurements()
    assert not missing, "measured numbers with no output above and no citation:\n" + (
        "\n".join(f"  {w}: ...{s!r}" for w, s in missing)
    )


def test_a_wrong_citation_fails():
    """The check rejects a number its row does not hold, and filters that pick no
    row."""
    rows = list(csv.DictReader(open(ROOT / "bench/results/forward.csv")))
    row = rows[0]
    filters = "; ".join(f"{k}={row[k]}" for k in ("preset", "B x T", "pass"))
    wrong = number(row["smol / transformers"]) + 0.5
    cite = f"cite bench/results/forward.csv: {filters} -> smol / transformers"
    text = f"{wrong:.2f}x<!-- {cite} -->"
    m = CITE.search(text)
    with pytest.raises(AssertionError, match="holds"):
        test_citation_matches_its_row("test", text[: m.start()], m)
    bad = CITE.search(
        "1.00x<!-- cite bench/results/forward.csv: preset=none -> smol / transformers"
        " -->"
    )
    with pytest.raises(AssertionError, match="pick 0 rows"):
        cited_value(bad)


def test_a_citation_reads_the_sign_it_follows():
    """A negative value is cited with its minus sign, and a number without one does
    not cite it: the check once read only digits, so -0.38 and 0.38 cited alike."""
    measure = "held-out plays loss, after - before (paired by window)"
    cite = (
        "<!-- cite bench/results/continued_pretraining.csv: "
        f"measure={measure} -> after -->"
    )
    _, value = cited_value(CITE.search(cite))
    assert value < 0
    for sign in ("-", "\u2212"):
        text = f"{sign}{abs(value):.2f}{cite}"
        test_citation_matches_its_row(
            "test", text[: CITE.search(text).start()], CITE.search(text)
        )
    text = f"lower by {abs(value):.2f}{cite}"
    with pytest.raises(AssertionError, match="holds"):
        test_citation_matches_its_row(
            "test", text[: CITE.search(text).start()], CITE.search(text)
        )


def test_run_time_table_lists_every_chapter():
    """The set-up page's run times (bench/results/notebook_times.csv, written by
    `python -m tests.notebook_times` from `make test`'s measurement) cover exactly the
    chapters there are, so a new chapter cannot go unmeasured."""
    with open(ROOT / "bench/results/notebook_times.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    chapters = sorted(p.stem for p in ROOT.glob("chapters/*.ipynb"))
    assert sorted(r["chapter"] for r in rows) == chapters
    assert all(float(r["seconds on a CPU"]) > 0 for r in rows)


def test_measured_numbers_are_found_in_prose():
    """What the checks count as a measured number, and what they let pass: a page's
    time, size, rate, ratio or comparison that cites nothing is reported; a cited
    one, a marked setting or exact value, a goal, a limit, an interval's level and a
    matrix's shape are not."""
    page = (
        "Loading took 12.5 s and 1,026 MiB, at 7.4 GB/s; it ran 2.3x faster, twice as"
        " fast as before, in 85% of the time."
    )
    found = [m["num"] for m in MEASURED.finditer(strip_code_and_math(page))]
    assert found == ["12.5", "1,026", "7.4", "2.3", "twice as", "85"], found
    fine = (
        "It took 1.22 times<!-- cite bench/results/x.csv: a=b -> c --> as long; a 20%"
        "<!-- setting --> warm-up; 538 MB<!-- exact --> a token. **Goals**: at least"
        " 40% MFU. A time limit (300 s a notebook). 60.0% (95% interval 50 to 70)."
        " A 1536 x 576 product."
    )
    s = strip_code_and_math(fine)
    left = [m["num"] for m in MEASURED.finditer(s) if not is_setting(s, m)]
    assert left == ["60.0"], left
