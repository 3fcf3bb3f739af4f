"""What every notebook shares: the setup cell (made from _config.yml) and the closing source cell."""

from __future__ import annotations

import inspect
import importlib
import textwrap
from pathlib import Path

import nbformat
import yaml

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIRS = ("chapters", "solutions", "exercises")


def repository_url() -> str:
    return yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"]


def setup_cell_source() -> str:
    """The first cell of every notebook. In Colab it installs the course package from the
    repository (torch is already there and is kept); elsewhere it does nothing."""
    return textwrap.dedent(f"""\
        # Setup: in Colab, install the course package (Colab's torch is kept); elsewhere nothing to do.
        import subprocess, sys

        if "google.colab" in sys.modules:
            subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                            "smol @ git+{repository_url()}@main"], check=True)""")


def toc_pages() -> list[str]:
    """Every page of the book in reading order (the order of the "next" links): the root, then
    each `file` of `_toc.yml` depth first."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    pages = [toc["root"]]

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                pages.append(str(node["file"]).removesuffix(".md").removesuffix(".ipynb"))
            if "glob" in node:
                found = sorted({p.with_suffix("") for s in (".md", ".ipynb") for p in ROOT.glob(node["glob"] + s)})
                pages.extend(str(p.relative_to(ROOT)) for p in found)
            for key, value in node.items():
                if key not in ("file", "glob", "root"):
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(toc)
    return pages


def notebooks() -> list[Path]:
    return sorted(p for d in NOTEBOOK_DIRS for p in (ROOT / d).glob("*.ipynb"))


def read(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


def source_cells(nb) -> list[tuple[str, str]]:
    """(header, body) of each code cell whose first line names smol's source it must equal:
    `# smol/norm.py` (the whole module) or `# smol/model.py: SmolLM.tie_weights, SmolLM.reset_parameters`
    (those objects' source, dedented, separated by a blank line)."""
    out = []
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.source.startswith("# smol/"):
            header, _, body = cell.source.partition("\n")
            out.append((header, body))
    return out


def smol_source(header: str) -> str:
    spec = header.removeprefix("# ").strip()
    path, _, names = spec.partition(":")
    text = (ROOT / path).read_text()
    if not names.strip():
        return text
    module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
    parts = []
    for name in names.split(","):
        obj = module
        for attr in name.strip().split("."):
            obj = getattr(obj, attr)
        parts.append(textwrap.dedent(inspect.getsource(obj)).rstrip("\n"))
    return "\n\n".join(parts) + "\n"


def execute(path: Path, timeout: int = 600) -> None:
    """Run a notebook top to bottom in this environment (the shared setup cell first) and store
    its outputs, as nbval expects: with the runner that ships in smol.grading."""
    from smol.grading.make_exercises import execute as run

    nb = read(path)
    if not nb.cells or nb.cells[0].source != setup_cell_source():
        nb.cells.insert(0, nbformat.v4.new_code_cell(setup_cell_source()))
    run(nb, path.parent, timeout, record_timing=True)
    nbformat.write(nb, path)


if __name__ == "__main__":
    import sys

    for arg in sys.argv[1:]:
        execute(Path(arg))
        print("executed", arg)
