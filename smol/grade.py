"""Grade exercise notebooks from the shell: each runs in a fresh kernel, then the scores are added up.

    python -m smol.grade exercises/                      # every notebook in the folder
    python -m smol.grade exercises/02_rope.ipynb --strict  # exit 1 below full marks
    python -m smol.grade solutions/ --json report.json

Each notebook runs top to bottom (errors do not stop it) under a time limit of its own. The scores
come from the results that `smol.grading.grade` shows in the executed notebook; the points at stake
come from the `grade("task", ...)` calls in its source, so a task whose check cell never ran, a
notebook that hangs, or one whose kernel dies (sys.exit in a cell, os._exit, a crash) scores zero on
what it did not finish, and costs no other notebook anything.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import nbformat

from smol.grading import MIME, TASKS

GRADE_CALL = re.compile(r"""(?<![\w.])grade\(\s*["'](\w+)["']""")


def expected_tasks(nb) -> list[str]:
    """The tasks a notebook grades, in order: from its `grade("task", ...)` calls."""
    names = []
    for cell in nb.cells:
        if cell.cell_type == "code":
            for name in GRADE_CALL.findall(cell.source):
                if name not in names:
                    names.append(name)
    return names


def collected_results(nb) -> dict[str, dict]:
    """The counted grade results in an executed notebook's outputs (the last one per task)."""
    results = {}
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            payload = output.get("data", {}).get(MIME) if output.get("output_type") in ("display_data", "execute_result") else None
            if isinstance(payload, str):
                payload = json.loads(payload)
            if payload and payload.get("counted", True):
                results[payload["task"]] = payload
    return results


def run_notebook(path: Path, timeout: float, cell_timeout: float) -> tuple[nbformat.NotebookNode, str]:
    """Execute a copy of the notebook in a fresh kernel; return it and a status line."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    client = NotebookClient(nb, timeout=int(cell_timeout), kernel_name="python3", allow_errors=True,
                            record_timing=False, interrupt_on_timeout=False,
                            resources={"metadata": {"path": str(path.parent.resolve())}})
    status, errors = "ok", 0
    deadline = time.monotonic() + timeout
    try:
        # The kernel's own stderr holds only its logs (cell output comes over its channels).
        with client.setup_kernel(stderr=subprocess.DEVNULL):
            for index, cell in enumerate(nb.cells):
                if cell.cell_type != "code":
                    continue
                remaining = deadline - time.monotonic()
                if remaining < 1:
                    return nb, f"stopped: the notebook ran past its {timeout:g} s limit"
                client.timeout = int(max(1, min(cell_timeout, remaining)))
                try:
                    client.execute_cell(cell, index)
                except CellTimeoutError:
                    return nb, f"stopped: cell {index} ran past its time limit ({client.timeout} s)"
                except DeadKernelError:
                    return nb, f"stopped: the kernel died in cell {index} (sys.exit, os._exit or a crash?)"
                errors += any(o.get("output_type") == "error" for o in cell.outputs)
    except DeadKernelError:
        return nb, "stopped: the kernel died"
    except Exception as exc:  # noqa: BLE001 - a broken notebook must not stop the others
        return nb, f"stopped: {type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    if errors:
        status = f"ran, {errors} cell{'s' if errors > 1 else ''} raised"
    return nb, status


def score_notebook(path: Path, nb, status: str, seconds: float) -> dict:
    results = collected_results(nb)
    tasks = []
    for name in expected_tasks(nb):
        r = results.get(name)
        total = TASKS[name].points if name in TASKS else (r["total"] if r else 0)
        tasks.append({"task": name, "score": r["score"] if r else 0, "total": total, "graded": r is not None,
                      "checks": r["checks"] if r else []})
    return {"notebook": str(path), "score": sum(t["score"] for t in tasks), "total": sum(t["total"] for t in tasks),
            "status": status, "seconds": round(seconds, 1), "tasks": tasks}


def notebook_paths(args: list[str]) -> list[Path]:
    paths = []
    for arg in args:
        p = Path(arg)
        if p.is_dir():
            paths += sorted(p.glob("*.ipynb"))
        elif p.suffix == ".ipynb" and p.exists():
            paths.append(p)
        else:
            raise SystemExit(f"smol.grade: {arg} is neither a folder nor a notebook")
    return paths


def _name(path: str) -> str:
    p = Path(path)
    return f"{p.parent.name}/{p.name}" if p.parent.name else p.name


def table(reports: list[dict], verbose: bool = True) -> str:
    width = max([len(_name(r["notebook"])) for r in reports] + [len(t["task"]) + 2 for r in reports for t in r["tasks"]] + [8])
    lines = [f"{'notebook':<{width}}  {'points':>9}  {'time':>6}  status"]
    for r in reports:
        lines.append(f"{_name(r['notebook']):<{width}}  {r['score']:>4}/{r['total']:<4}  {r['seconds']:>5.1f}s  {r['status']}")
        if verbose:
            for t in r["tasks"]:
                mark = "" if t["graded"] else "  (no result: its check cell did not run)"
                lines.append(f"  {t['task']:<{width - 2}}  {t['score']:>4}/{t['total']:<4}{mark}")
    score, total = sum(r["score"] for r in reports), sum(r["total"] for r in reports)
    lines.append(f"{'total':<{width}}  {score:>4}/{total:<4}")
    return "\n".join(line.rstrip() for line in lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m smol.grade", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", help="notebooks, or folders of notebooks")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per notebook (default 300)")
    parser.add_argument("--cell-timeout", type=float, default=120, help="seconds per cell (default 120)")
    parser.add_argument("--json", type=Path, default=Path("grade_report.json"), help="where to write the report")
    parser.add_argument("--strict", action="store_true", help="exit 1 unless every notebook has full marks")
    parser.add_argument("--quiet", action="store_true", help="one line per notebook")
    args = parser.parse_args(argv)
    reports = []
    for path in notebook_paths(args.paths):
        start = time.monotonic()
        nb, status = run_notebook(path, args.timeout, args.cell_timeout)
        reports.append(score_notebook(path, nb, status, time.monotonic() - start))
        print(f"graded {path} in {reports[-1]['seconds']:.1f}s: {reports[-1]['score']}/{reports[-1]['total']}",
              file=sys.stderr, flush=True)
    score, total = sum(r["score"] for r in reports), sum(r["total"] for r in reports)
    args.json.write_text(json.dumps({"score": score, "total": total, "notebooks": reports}, indent=1) + "\n")
    print(table(reports, verbose=not args.quiet))
    print(f"report written to {args.json}")
    return 1 if args.strict and score < total else 0


if __name__ == "__main__":
    sys.exit(main())
