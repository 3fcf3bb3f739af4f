"""Notebook consistency: the shared setup cell, the table of contents, and shown code == smol's code."""

import pytest
import yaml

from tests import nbtools


def test_there_are_notebooks():
    assert any(p.parent.name == "chapters" for p in nbtools.notebooks())


@pytest.mark.parametrize("path", nbtools.notebooks(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_first_cell_is_the_shared_setup_cell(path):
    nb = nbtools.read(path)
    first = nb.cells[0]
    assert first.cell_type == "code", "the first cell must be the setup cell"
    assert first.source == nbtools.setup_cell_source(), (
        f"{path.name}: the first cell differs from the setup cell made from _config.yml's repository url")
    assert nbtools.repository_url() in first.source


@pytest.mark.parametrize("path", nbtools.notebooks(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_shown_smol_source_is_smols_source(path):
    for header, body in nbtools.source_cells(nbtools.read(path)):
        assert body.rstrip("\n") == nbtools.smol_source(header).rstrip("\n"), (
            f"{path.name}: the cell '{header}' and smol's source have drifted apart")


def test_chapters_have_closing_source_cells():
    for path in nbtools.notebooks():
        if path.parent.name == "chapters":
            if not path.stem.startswith("00_"):  # the overview chapter builds nothing
                assert nbtools.source_cells(nbtools.read(path)), f"{path.name} has no closing `# smol/...` cell"


def _toc_files(node):
    if isinstance(node, dict):
        if "file" in node:
            yield node["file"]
        for value in node.values():
            yield from _toc_files(value)
    elif isinstance(node, list):
        for item in node:
            yield from _toc_files(item)


def test_toc_lists_every_chapter_and_nothing_missing():
    toc = yaml.safe_load((nbtools.ROOT / "_toc.yml").read_text())
    files = set(_toc_files(toc)) | {toc["root"]}
    chapters = {f"chapters/{p.stem}" for p in (nbtools.ROOT / "chapters").glob("*.ipynb")}
    assert chapters <= files, f"not in _toc.yml: {sorted(chapters - files)}"
    for f in files:
        assert any((nbtools.ROOT / f).with_suffix(s).exists() for s in (".md", ".ipynb")), f"_toc.yml names {f}, which does not exist"
