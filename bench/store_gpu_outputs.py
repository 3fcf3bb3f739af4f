"""Store a GPU's outputs in the chapters: for each cell tagged `gpu-output`, the outputs
of the same cell in a copy that bench/run_notebooks.py executed on a CUDA GPU. Such a
cell is also tagged `nbval-ignore-output` (a CPU prints something else there), so the
stored text is the book's, and a CPU run (`make test`, `python -m tests.nbtools`) keeps
it.

    python bench/store_gpu_outputs.py DIR     # DIR: the executed copies

A copy whose cell source differs from the chapter's, or that was not executed on a
GPU, is refused: its outputs would not be this cell's on a GPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import nbtools  # noqa: E402

TAG = nbtools.GPU_TAG
EXECUTED_ON = "smol_executed_on"  # notebook metadata bench/run_notebooks.py writes


def gpu_cells(nb) -> list[int]:
    return [
        i
        for i, cell in enumerate(nb.cells)
        if cell.cell_type == "code" and TAG in cell.metadata.get("tags", [])
    ]


def store(chapter: Path, executed: Path) -> int:
    """Copy the gpu-output cells' outputs of `executed` into `chapter`; how many."""
    nb, run = nbtools.read(chapter), nbtools.read(executed)
    device = run.metadata.get(EXECUTED_ON, "")
    if not device or device.startswith("CPU"):
        raise SystemExit(f"{executed}: not executed on a GPU ({device or 'unknown'})")
    cells = gpu_cells(nb)
    for i in cells:
        cell = nb.cells[i]
        if "nbval-ignore-output" not in cell.metadata.get("tags", []):
            raise SystemExit(
                f"{chapter.name} cell {i}: {TAG} without nbval-ignore-output"
            )
        if i >= len(run.cells) or run.cells[i].source != cell.source:
            raise SystemExit(
                f"{executed.name} cell {i} is not the chapter's: execute it again"
            )
        cell.outputs = run.cells[i].outputs
        cell.execution_count = run.cells[i].execution_count
        cell.metadata["gpu"] = device
    if cells:
        nbtools.settle_streams(nb)
        nbformat.write(nb, chapter)
    return len(cells)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("executed", type=Path, help="folder of executed copies")
    args = parser.parse_args()
    stored = 0
    for chapter in sorted((ROOT / "chapters").glob("*.ipynb")):
        tagged = gpu_cells(nbtools.read(chapter))
        copy = args.executed / chapter.name
        if not tagged:
            continue
        if not copy.is_file():
            print(f"{chapter.name}: no executed copy in {args.executed}; left as it is")
            continue
        n = store(chapter, copy)
        stored += n
        print(f"{chapter.name}: {n} GPU outputs stored")
    print(f"{stored} cells in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
