"""Code is formatted by ruff (line length 88, pyproject.toml): smol/, tests/, bench/ and every
notebook's code cells, the closing `# smol/...` cells included. `make format` formats them all."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.nbtools import ROOT

FORMATTED = ["smol", "tests", "bench", "chapters", "solutions", "exercises"]


def _ruff() -> str:
    exe = Path(sys.executable).with_name("ruff")
    found = str(exe) if exe.exists() else shutil.which("ruff")
    if not found:
        pytest.fail("ruff is missing: `make setup` installs it (requirements.txt)")
    return found


def test_code_and_notebooks_are_formatted():
    proc = subprocess.run(
        [_ruff(), "format", "--check", *FORMATTED],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, (
        f"run `make format`:\n{proc.stdout[-3000:]}{proc.stderr}"
    )


def test_format_check_catches_unformatted_code(tmp_path):
    """The same check fails on a file and on a notebook cell that ruff would rewrite."""
    import nbformat

    (tmp_path / "module.py").write_text("x = {  'a':1 }\n")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("y=[1,\n2]")])
    nbformat.write(nb, tmp_path / "cells.ipynb")
    proc = subprocess.run(
        [_ruff(), "format", "--check", "--config", str(ROOT / "pyproject.toml"), "."],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1
    assert "module.py" in proc.stdout and "cells.ipynb" in proc.stdout
