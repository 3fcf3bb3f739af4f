"""Grade exercise notebooks from the shell: each runs in a fresh kernel, then the scores
are added up.

    python -m smol.grade exercises/                      # every notebook in the folder
    python -m smol.grade exercises/02_rope.ipynb --strict  # exit 1 below full marks
    python -m smol.grade solutions/ --json report.json

Each notebook runs top to bottom (errors do not stop it) under a time limit of its own.
After each cell that calls `grade("task", obj)`, the grader takes `obj` out of the
kernel (pickled) and runs the task's checks itself, in processes of its own, one per
check, each killed at `--check-timeout`. What the notebook prints or displays is never
read, and nothing a notebook does to the grading code in its kernel changes its score.
The points at stake are every task of the notebook's topic (known from its file name)
and every task its `grade` calls name: a task whose check cell never ran, a notebook
that hangs, or one whose kernel dies scores zero on what it did not finish, and costs no
other notebook anything. A file that is not a notebook is reported as an error (its
tasks score zero) and the others are graded. Exit status: 2 for a usage error (found
before any grading), 1 when a notebook could not be read, the report could not be
written, or (with --strict) below full marks, else 0."""

from __future__ import annotations

import argparse
import ast
import copy
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from smol.grading import MIME, NOTEBOOKS, TASKS
from smol.grading.core import DEFAULT_TIMEOUT, Result, Row, run_checks, timeout_problem

GRADE_CALL = re.compile(r"""(?<![\w.])grade\(\s*["'](\w+)["']""")
DEFERRED = (
    "SMOL_GRADE_DEFERRED"  # set in the kernels this command starts (see grading.grade)
)


def grade_calls(source: str) -> list[tuple[str, str | None]]:
    """The `grade("task", obj)` calls of a cell, in order: (task, the source of obj or None)."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager

        python = TransformerManager().transform_cell(source)  # %magics and !commands
        tree = ast.parse(python)
    except Exception:  # noqa: BLE001 - a cell that does not parse: its calls never ran
        return [(name, None) for name in GRADE_CALL.findall(source)]
    calls = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)  # %time grade(...)
            and node.func.attr in ("run_line_magic", "run_cell_magic")
            and node.args
            and isinstance(node.args[-1], ast.Constant)
            and isinstance(node.args[-1].value, str)
        ):
            calls += [
                (node.lineno, node.col_offset, task, expr)
                for task, expr in grade_calls(node.args[-1].value)
            ]
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "grade"
        ):
            continue
        if not (
            node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and re.fullmatch(r"\w+", node.args[0].value)
        ):
            continue
        obj = (
            node.args[1]
            if len(node.args) > 1
            else next((k.value for k in node.keywords if k.arg == "obj"), None)
        )
        expr = "None" if obj is None else ast.get_source_segment(python, obj)
        calls.append((node.lineno, node.col_offset, node.args[0].value, expr))
    return [(task, expr) for _, _, task, expr in sorted(calls)]


def topic_tasks(path: Path | None) -> list[str]:
    """The tasks of the exercise a file name stands for (02_rope.ipynb: the rope tasks)."""
    topics = {stem: topic for topic, stem in NOTEBOOKS.items()}
    topic = topics.get(path.stem) if path is not None else None
    return [t.name for t in TASKS.values() if t.notebook == topic] if topic else []


def expected_tasks(nb, path: Path | None = None) -> list[str]:
    """The tasks a notebook is graded on, in order: its topic's (by file name), then
    those its `grade("task", ...)` calls name. Deleting a check cell does not lower the
    total."""
    names = topic_tasks(path)
    for cell in nb.cells:
        if cell.cell_type == "code":
            for name in GRADE_CALL.findall(cell.source):
                if name not in names:
                    names.append(name)
    return names


def collected_results(nb) -> dict[str, dict]:
    """The grade results a notebook's stored outputs show (the last one per task). For
    the student's eyes and the course's tests: `python -m smol.grade` never counts them.
    """
    results = {}
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            payload = (
                output.get("data", {}).get(MIME)
                if output.get("output_type") in ("display_data", "execute_result")
                else None
            )
            if isinstance(payload, str):
                payload = json.loads(payload)
            if payload and payload.get("counted", True):
                results[payload["task"]] = payload
    return results


def read_notebook(path: Path) -> nbformat.NotebookNode:
    """The notebook at `path`; ValueError saying what the file is instead."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot be read ({exc.strerror or exc})") from None
    if not data.strip():
        raise ValueError("is empty, not a notebook")
    try:
        text = data.decode("utf-8")
        content = json.loads(text)
    except UnicodeDecodeError:
        raise ValueError("is not a notebook (not UTF-8 text)") from None
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"is not a notebook (invalid JSON: {exc.msg} at line {exc.lineno})"
        ) from None
    if not isinstance(content, dict) or "nbformat" not in content:
        raise ValueError("is JSON but not a Jupyter notebook (no nbformat field)")
    try:
        nb = nbformat.reads(text, as_version=4)
        if not isinstance(nb.get("cells"), list) or not all(
            isinstance(c, dict) and "cell_type" in c for c in nb.cells
        ):
            raise ValueError("no list of cells")
        for cell in nb.cells:
            if not isinstance(cell.get("source"), str):
                raise ValueError("a cell without source text")
    except Exception as exc:  # noqa: BLE001 - nbformat raises many kinds
        reason = (
            str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        )
        raise ValueError(f"is not a Jupyter notebook ({reason[:120]})") from None
    return nb


def _failed(task: str, message: str) -> Result:
    checks = TASKS[task].checks if task in TASKS else []
    return Result(
        task,
        [Row(c.name, c.points, 0, False, c.hint, message) for c in checks],
        error="" if checks else message,
    )


def _capture(client, cell_index: int, task: str, expr: str, target: Path) -> str:
    """Pickle the object `expr` names in the kernel into `target`; "" or what went wrong."""
    code = (
        f"(lambda b: open({str(target)!r}, 'wb').write(b))"
        f"(__import__('cloudpickle').dumps(({expr})))"
    )
    cell = nbformat.v4.new_code_cell(code)
    client.execute_cell(cell, cell_index, store_history=False)
    error = next((o for o in cell.outputs if o.get("output_type") == "error"), None)
    if error is not None:
        return f"the grader could not take `{expr}` from the notebook: {error.ename}: {error.evalue}"[
            :300
        ]
    if not target.exists() or not target.stat().st_size:
        return f"the grader could not take `{expr}` from the notebook"
    return ""


def run_notebook(
    path: Path,
    nb,
    timeout: float,
    cell_timeout: float,
    check_timeout: float = DEFAULT_TIMEOUT,
) -> tuple[dict[str, dict], str]:
    """Execute a copy of the notebook in a fresh kernel and grade each task after its
    check cell; return the results (task -> Result.to_json()) and a status line."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    nb = copy.deepcopy(
        nb
    )  # executed (and its cells replaced by the grader's) as a copy
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    client = NotebookClient(
        nb,
        timeout=int(cell_timeout),
        kernel_name="python3",
        allow_errors=True,
        record_timing=False,
        interrupt_on_timeout=False,
        resources={"metadata": {"path": str(path.parent.resolve())}},
    )
    results: dict[str, dict] = {}
    errors, deadline = 0, time.monotonic() + timeout
    env = {**os.environ, DEFERRED: "1"}
    try:
        # The kernel's own stderr holds only its logs (cell output comes over its
        # channels).
        with (
            tempfile.TemporaryDirectory(prefix="smol-grade-") as tmp,
            client.setup_kernel(stderr=subprocess.DEVNULL, env=env),
        ):
            for index, cell in enumerate(nb.cells):
                if cell.cell_type != "code":
                    continue
                remaining = deadline - time.monotonic()
                if remaining < 1:
                    return (
                        results,
                        f"stopped: the notebook ran past its {timeout:g} s limit",
                    )
                client.timeout = int(max(1, min(cell_timeout, remaining)))
                try:
                    client.execute_cell(cell, index)
                    errors += any(o.get("output_type") == "error" for o in cell.outputs)
                    for task, expr in grade_calls(cell.source):
                        if expr is None:
                            results[task] = _failed(
                                task, "its check cell does not parse"
                            ).to_json()
                            continue
                        target = Path(tmp) / f"{task}-{index}.pickle"
                        problem = _capture(client, index, task, expr, target)
                        result = (
                            _failed(task, problem)
                            if problem
                            else run_checks(
                                task,
                                payload=target.read_bytes(),
                                timeout=check_timeout,
                                isolate=True,
                            )
                        )
                        results[task] = result.to_json()
                except CellTimeoutError:
                    return (
                        results,
                        f"stopped: cell {index} ran past its time limit "
                        f"({client.timeout} s)",
                    )
                except DeadKernelError:
                    return (
                        results,
                        f"stopped: the kernel died in cell {index} (sys.exit, "
                        "os._exit or a crash?)",
                    )
    except DeadKernelError:
        return results, "stopped: the kernel died"
    except Exception as exc:  # noqa: BLE001 - a broken notebook must not stop the others
        return (
            results,
            f"stopped: {type(exc).__name__}: "
            f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}",
        )
    status = "ok"
    if errors:
        status = f"ran, {errors} cell{'s' if errors > 1 else ''} raised"
    return results, status


def score_notebook(
    path: Path, nb, status: str, seconds: float, results: dict[str, dict]
) -> dict:
    tasks = []
    for name in expected_tasks(nb, path):
        r = results.get(name)
        total = TASKS[name].points if name in TASKS else (r["total"] if r else 0)
        tasks.append(
            {
                "task": name,
                "score": r["score"] if r else 0,
                "total": total,
                "graded": r is not None,
                "checks": r["checks"] if r else [],
            }
        )
    return {
        "notebook": str(path),
        "score": sum(t["score"] for t in tasks),
        "total": sum(t["total"] for t in tasks),
        "status": status,
        "seconds": round(seconds, 1),
        "tasks": tasks,
    }


def grade_notebook(
    path: Path, timeout: float, cell_timeout: float, check_timeout: float
) -> dict:
    """The report of one notebook; an unreadable file gives an error row, never an
    exception."""
    start = time.monotonic()
    try:
        nb = read_notebook(path)
    except ValueError as exc:
        report = score_notebook(
            path, nbformat.v4.new_notebook(), f"error: {path.name} {exc}", 0.0, {}
        )
        report["error"] = f"{path.name} {exc}"
        return report
    results, status = run_notebook(path, nb, timeout, cell_timeout, check_timeout)
    return score_notebook(path, nb, status, time.monotonic() - start, results)


def notebook_paths(args: list[str]) -> list[Path]:
    """The notebooks named, folders expanded; ValueError for an argument that names
    none."""
    paths = []
    for arg in args:
        p = Path(arg)
        if p.is_dir():
            found = sorted(p.glob("*.ipynb"))
            if not found:
                raise ValueError(f"{arg} is a folder without notebooks (*.ipynb)")
            paths += found
        elif p.suffix == ".ipynb" and p.exists():
            paths.append(p)
        else:
            raise ValueError(f"{arg} is neither a folder nor a notebook")
    return paths


def report_problem(path: Path) -> str:
    """Why the report cannot be written to `path` ("" when it can); leaves no file behind."""
    if path.is_dir():
        return "it is a folder"
    folder = path.parent
    if not folder.is_dir():
        return f"the folder {folder} does not exist"
    existed = path.exists()
    try:
        with open(path, "a"):
            pass
    except OSError as exc:
        return exc.strerror or str(exc)
    if not existed:
        path.unlink(missing_ok=True)
    return ""


def _name(path: str) -> str:
    p = Path(path)
    return f"{p.parent.name}/{p.name}" if p.parent.name else p.name


def table(reports: list[dict], verbose: bool = True) -> str:
    width = max(
        [len(_name(r["notebook"])) for r in reports]
        + [len(t["task"]) + 2 for r in reports for t in r["tasks"]]
        + [8]
    )
    lines = [f"{'notebook':<{width}}  {'points':>9}  {'time':>6}  status"]
    for r in reports:
        lines.append(
            f"{_name(r['notebook']):<{width}}  {r['score']:>4}/{r['total']:<4}  "
            f"{r['seconds']:>5.1f}s  {r['status']}"
        )
        if verbose:
            for t in r["tasks"]:
                mark = (
                    "" if t["graded"] else "  (no result: its check cell did not run)"
                )
                lines.append(
                    f"  {t['task']:<{width - 2}}  {t['score']:>4}/{t['total']:<4}{mark}"
                )
    score, total = sum(r["score"] for r in reports), sum(r["total"] for r in reports)
    lines.append(f"{'total':<{width}}  {score:>4}/{total:<4}")
    return "\n".join(line.rstrip() for line in lines)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number of seconds, got {text!r}"
        ) from None
    problem = timeout_problem(value)
    if problem:
        raise argparse.ArgumentTypeError(
            f"expected a positive number of seconds, got {text!r}"
        )
    return value


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m smol.grade",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("paths", nargs="+", help="notebooks, or folders of notebooks")
    parser.add_argument(
        "--timeout",
        type=_seconds,
        default=300,
        help="seconds per notebook (default 300)",
    )
    parser.add_argument(
        "--cell-timeout",
        type=_seconds,
        default=120,
        help="seconds per cell (default 120)",
    )
    parser.add_argument(
        "--check-timeout",
        type=_seconds,
        default=DEFAULT_TIMEOUT,
        help=f"seconds per check (default {DEFAULT_TIMEOUT:g}); the check's process is killed",
    )
    parser.add_argument(
        "--json",
        type=Path,
        default=Path("grade_report.json"),
        help="where to write the report",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 unless every notebook has full marks",
    )
    parser.add_argument("--quiet", action="store_true", help="one line per notebook")
    args = parser.parse_args(argv)
    try:
        import cloudpickle  # noqa: F401 - the kernels hand the graded objects over with it
    except ImportError:
        parser.error(
            "grading needs cloudpickle in this environment: pip install cloudpickle"
        )
    try:
        paths = notebook_paths(args.paths)
    except ValueError as exc:
        parser.error(str(exc))
    problem = report_problem(args.json)
    if problem:
        parser.error(
            f"cannot write the report to {args.json}: {problem} (choose another --json)"
        )
    reports = []
    for path in paths:
        reports.append(
            grade_notebook(path, args.timeout, args.cell_timeout, args.check_timeout)
        )
        r = reports[-1]
        print(
            f"graded {path} in {r['seconds']:.1f}s: {r['score']}/{r['total']}"
            if "error" not in r
            else f"could not grade {path}: {r['error']}",
            file=sys.stderr,
            flush=True,
        )
    score, total = sum(r["score"] for r in reports), sum(r["total"] for r in reports)
    print(table(reports, verbose=not args.quiet))
    code = 1 if args.strict and score < total else 0
    unreadable = [r for r in reports if "error" in r]
    if unreadable:
        print(
            f"{len(unreadable)} file{'s' if len(unreadable) > 1 else ''} could not be "
            "graded "
            "(scored zero): " + "; ".join(r["error"] for r in unreadable)
        )
        code = 1
    try:
        args.json.write_text(
            json.dumps({"score": score, "total": total, "notebooks": reports}, indent=1)
            + "\n"
        )
        print(f"report written to {args.json}")
    except OSError as exc:
        print(
            f"smol.grade: could not write the report to {args.json}: "
            f"{exc.strerror or exc}; "
            "the scores above are all there is",
            file=sys.stderr,
        )
        code = 1
    return code


if __name__ == "__main__":
    sys.exit(main())
