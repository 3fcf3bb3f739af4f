"""Code is formatted by ruff and no line of it is wider than the book's code box (88
characters, the line length in pyproject.toml): smol/, tests/, bench/ and every
notebook's code cells, the closing `# smol/...` cells included.

`make format` formats them all. What formatting cannot shorten (a long string, comment
or docstring) is wrapped by hand; the only lines allowed to stay longer are those that
cannot be wrapped: a line that is one word, or that ends with a URL or a pragma comment
(`# type: ignore`, ...) starting within the 88 characters."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.nbtools import ROOT

FORMATTED = ["smol", "tests", "bench", "chapters", "solutions", "exercises"]
# ruff's check for lines over the line length (E501). It passes over the lines that
# cannot be wrapped (see above); --ignore-noqa: a `# noqa` comment excuses no line.
TOO_WIDE = ["check", "--select", "E501", "--ignore-noqa", "--no-cache"]


def _ruff() -> str:
    exe = Path(sys.executable).with_name("ruff")
    found = str(exe) if exe.exists() else shutil.which("ruff")
    if not found:
        pytest.fail("ruff is missing: `make setup` installs it (requirements.txt)")
    return found


def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [_ruff(), *args], cwd=cwd, capture_output=True, text=True, check=False
    )


def test_code_and_notebooks_are_formatted():
    proc = _run(ROOT, "format", "--check", *FORMATTED)
    assert proc.returncode == 0, (
        f"run `make format`:\n{proc.stdout[-3000:]}{proc.stderr}"
    )


def test_no_code_line_is_wider_than_the_book_shows():
    proc = _run(ROOT, *TOO_WIDE, "--output-format", "concise", *FORMATTED)
    assert proc.returncode == 0, (
        "lines over 88 characters: wrap them (a comment goes above its code line)\n"
        f"{proc.stdout[-6000:]}{proc.stderr}"
    )


def test_format_check_catches_unformatted_code(tmp_path):
    """The same check fails on a file and on a notebook cell that ruff would rewrite."""
    import nbformat

    (tmp_path / "module.py").write_text("x = {  'a':1 }\n")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("y=[1,\n2]")])
    nbformat.write(nb, tmp_path / "cells.ipynb")
    config = str(ROOT / "pyproject.toml")
    proc = _run(tmp_path, "format", "--check", "--config", config, ".")
    assert proc.returncode == 1
    assert "module.py" in proc.stdout and "cells.ipynb" in proc.stdout


def test_width_check_catches_long_lines_and_allows_only_unwrappable_ones(tmp_path):
    """Formatted code can still hold long lines (strings, comments, docstrings): the
    width check fails on each, in a file and in a notebook cell, `# noqa` or not; a line
    that ends with a long URL passes."""
    import nbformat

    words = " ".join(["word"] * 20)  # 99 characters
    too_wide = [
        f"# {words}",
        f'MESSAGES = [\n    "{words}",\n]',
        f"x = 1  # {words}",
        f'NOTE = "{words}"  # noqa: E501',
        f'def f():\n    """{words}"""',
    ]
    url = "# see https://example.org/" + "a-very-long-path/" * 6
    (tmp_path / "module.py").write_text("\n\n\n".join([url, *too_wide]) + "\n")
    cell = nbformat.v4.new_code_cell(f'print(\n    "{words}",\n)')
    nbformat.write(nbformat.v4.new_notebook(cells=[cell]), tmp_path / "cells.ipynb")
    config = str(ROOT / "pyproject.toml")
    assert _run(tmp_path, "format", "--check", "--config", config, ".").returncode == 0
    proc = _run(tmp_path, *TOO_WIDE, "--output-format", "json", "--config", config, ".")
    assert proc.returncode == 1
    rows = sorted(
        (Path(v["filename"]).name, v["location"]["row"])
        for v in json.loads(proc.stdout)
    )
    module = (tmp_path / "module.py").read_text().splitlines()
    expected = [i for i, line in enumerate(module, 1) if words in line]
    assert rows == [("cells.ipynb", 2)] + [("module.py", i) for i in expected]
    assert len(expected) == len(too_wide) and len(module[0]) > 88
