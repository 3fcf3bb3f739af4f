"""Running an exercise notebook in a fresh kernel for `smol grade`, and
grading the objects its check cells name.

The notebook runs top to bottom (errors do not stop it) under a time limit of its own.
After each cell that calls `grade("task", obj)`, the grader grades `obj` itself, in
processes of its own, one per check (`smol.grading.isolation`). A check's probe runs in
a child forked from the kernel, where `obj` lives, on inputs this process chose, and
hands back plain data that this process judges: the object is never copied out, and
nothing of the student's runs here. What the notebook prints or displays is never read:
`collected_results` reads it for the student's eyes and the course's tests only, and
nothing a notebook does to the grading code in its kernel changes its score. The points
at stake are every task of the notebook's topic (known from its file name) and every
task its `grade` calls name (`expected_tasks`). Every process the notebook or a check
started is killed and reaped before its result is returned (`smol.grading.reaper`).
"""

from __future__ import annotations

import ast
import copy
import json
import os
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
from nbclient.exceptions import CellTimeoutError

from smol.grading import NOTEBOOKS, reaper
from smol.grading.core import DEFERRED, chosen_inputs, judged
from smol.grading.files import read_notebook, read_regular
from smol.grading.plain import MAX_BYTES
from smol.grading.registry import DEFAULT_TIMEOUT, MIME, TASKS, Result, Row

GRADE_CALL = re.compile(r"""(?<![\w.])grade\(\s*["'](\w+)["']""")
# a browser's second download of a file ("01_rmsnorm (1)") and Colab's copy of one
COPY = re.compile(r"(?:Copy of )?(.+?)(?: ?\(\d+\))?")


def grade_calls(source: str) -> list[tuple[str, str | None]]:
    """The `grade("task", obj)` calls of a cell, in order: (task, the source of obj or
    None)."""
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


def exercise_name(path: Path) -> str:
    """The exercise a file holds: its name without a student's prefix, a download's
    number or Colab's "Copy of" (alice__02_rope.ipynb, 02_rope (1).ipynb and Copy of
    02_rope.ipynb: 02_rope)."""
    return COPY.fullmatch(path.stem.split("__")[-1])[1]


def topic_tasks(path: Path | None) -> list[str]:
    """The tasks of the exercise a file name stands for (02_rope.ipynb, or
    alice__02_rope.ipynb: the rope tasks)."""
    topics = {stem: topic for topic, stem in NOTEBOOKS.items()}
    topic = topics.get(exercise_name(path)) if path is not None else None
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
    the student's eyes and the course's tests: `smol grade` never counts them.
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


def _failed(task: str, message: str) -> Result:
    checks = TASKS[task].checks if task in TASKS else []
    return Result(
        task,
        [Row(c.name, c.points, 0, False, c.hint, message) for c in checks],
        error="" if checks else message,
    )


def _execute(client, cell_index: int, code: str) -> str:
    """Run the grader's `code` in the kernel (not stored in the notebook); "" or the
    error it raised."""
    cell = nbformat.v4.new_code_cell(code)
    client.execute_cell(cell, cell_index, store_history=False)
    error = next((o for o in cell.outputs if o.get("output_type") == "error"), None)
    return "" if error is None else f"{error.ename}: {error.evalue}"


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
    from nbclient.exceptions import DeadKernelError

    # executed (and its cells replaced by the grader's) as a copy
    nb = copy.deepcopy(nb)
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
    deadline = time.monotonic() + timeout
    env = {**os.environ, DEFERRED: "1"}
    try:
        # The kernel's own stdout and stderr hold only its logs (cell output comes over
        # its channels); neither is this process's, which may carry a report.
        with (
            tempfile.TemporaryDirectory(prefix="smol-grade-") as tmp,
            client.setup_kernel(
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
            ),
        ):
            reaper.KEEP.update(_kernel_pids(client))
            run = _Run(client, Path(tmp), check_timeout, results)
            return results, run.cells(deadline, timeout, cell_timeout)
    except DeadKernelError:
        return results, "stopped: the kernel died"
    # a broken notebook must not stop the others
    except Exception as exc:  # noqa: BLE001
        text = str(exc).strip()
        first = text.splitlines()[0] if text else ""
        return results, f"stopped: {type(exc).__name__}: {first}"
    finally:
        # the kernel is shut down: end whatever the notebook or its checks left
        reaper.KEEP.clear()
        reaper.sweep()


def _kernel_pids(client) -> set[int]:
    """The kernel's process id (the children of this process, if the kernel manager
    does not say)."""
    process = getattr(getattr(client.km, "provisioner", None), "process", None)
    if process is not None:
        return {process.pid}
    me = os.getpid()
    return {pid for pid, parent in reaper._parents().items() if parent == me}


@dataclass
class _Run:
    """A notebook running in a kernel: its cells executed one by one, each task graded
    right after the cell that calls its `grade`."""

    client: Any
    tmp: Path  # where the kernel writes the objects it hands over
    check_timeout: float
    results: dict[str, dict]  # task -> Result.to_json(), filled as the cells run
    stuck: int | None = None  # the cell whose checks the kernel did not run in time

    def cells(self, deadline: float, timeout: float, cell_timeout: float) -> str:
        """Run every code cell before the deadline; the status line."""
        from nbclient.exceptions import DeadKernelError

        errors = 0
        for index, cell in enumerate(self.client.nb.cells):
            if cell.cell_type != "code":
                continue
            remaining = deadline - time.monotonic()
            if remaining < 1:
                return f"stopped: the notebook ran past its {timeout:g} s limit"
            self.client.timeout = int(max(1, min(cell_timeout, remaining)))
            try:
                self.client.execute_cell(cell, index)
                errors += any(o.get("output_type") == "error" for o in cell.outputs)
                self.grade(index, cell.source)
                if self.stuck is not None:
                    return (
                        f"stopped: the kernel did not finish the checks of cell {index}"
                    )
            except CellTimeoutError:
                return (
                    f"stopped: cell {index} ran past its time limit "
                    f"({self.client.timeout} s)"
                )
            except DeadKernelError:
                return (
                    f"stopped: the kernel died in cell {index} (sys.exit, os._exit or "
                    "a crash?)"
                )
        if errors:
            return f"ran, {errors} cell{'s' if errors > 1 else ''} raised"
        return "ok"

    def grade(self, index: int, source: str) -> None:
        """Grade the tasks that the cell at `index` (just run) calls `grade` on."""
        for task, expr in grade_calls(source):
            if self.stuck is not None:
                return
            if task not in TASKS:
                result = _failed(task, f"unknown task {task!r}")
            elif expr is None:
                result = _failed(task, "its check cell does not parse")
            else:
                result = Result(task, self.rows(index, task, expr))
            self.results[task] = result.to_json()

    def rows(self, index: int, task: str, expr: str) -> list[Row]:
        """The rows of `task`'s checks on the object `expr` names in the kernel."""
        checks = TASKS[task].checks
        rows = self.probed(index, task, expr, list(range(len(checks))))
        return [rows[i] for i in range(len(checks))]

    def probed(
        self, index: int, task: str, expr: str, indices: list[int]
    ) -> dict[int, Row]:
        """The rows of `task`'s probe checks `indices`: their inputs chosen here, their
        probes run in the kernel (each in a child of its own), their outputs judged
        here."""
        if not indices:
            return {}
        checks = TASKS[task].checks
        folder = self.tmp / f"probes-{index}-{task}"
        folder.mkdir()
        rows, inputs = {}, {}
        for i in indices:
            chosen = chosen_inputs(checks[i])
            if isinstance(chosen, Row):
                rows[i] = chosen
                continue
            inputs[i], sent = chosen
            (folder / f"in-{i}").write_bytes(sent)
        modules = tuple(sorted({checks[i].probe.__module__ for i in inputs}))
        code = (
            "__import__('smol.grading.core').grading.core.serve_probes("
            f"{task!r}, ({expr}), {str(folder)!r}, {list(inputs)!r}, "
            f"{self.check_timeout!r}, {modules!r})"
        )
        # each probe gets its time, and its child a moment to start and end
        budget = len(inputs) * (self.check_timeout + 5) + 30
        saved, self.client.timeout = self.client.timeout, int(budget)
        try:
            error = _execute(self.client, index, code)
        except CellTimeoutError:
            why = f"the notebook's kernel did not run the checks within {budget:g} s"
            rows.update({i: _row(checks[i], why) for i in inputs})
            self.stuck = index
            return rows
        finally:
            self.client.timeout = saved
        for i in inputs:
            data = read_regular(folder / f"out-{i}", MAX_BYTES + (1 << 20))
            if data is None and error:
                why = f"the grader could not run `{expr}` in the notebook: {error}"
                rows[i] = _row(checks[i], why[:300])
            else:
                rows[i] = judged(checks[i], inputs[i], data)
        reaper.sweep()
        return rows


def _row(c, message: str) -> Row:
    return Row(c.name, c.points, 0, False, c.hint, message)


def score_notebook(
    path: Path,
    nb,
    status: str,
    seconds: float,
    results: dict[str, dict],
    exercise: str | None = None,
) -> dict:
    """A notebook's report; `exercise` (02_rope) names the exercise whose tasks are
    at stake where the file's name does not."""
    tasks = []
    named = path if exercise is None else Path(f"{exercise}.ipynb")
    for name in expected_tasks(nb, named):
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
    path: Path,
    timeout: float,
    cell_timeout: float,
    check_timeout: float,
    exercise: str | None = None,
) -> dict:
    """The report of one notebook (graded as `exercise`, if given); an unreadable
    file gives an error row, never an exception."""
    start = time.monotonic()
    try:
        nb = read_notebook(path)
    except ValueError as exc:
        return error_report(path, f"{path.name} {exc}", exercise)
    results, status = run_notebook(path, nb, timeout, cell_timeout, check_timeout)
    seconds = time.monotonic() - start
    return score_notebook(path, nb, status, seconds, results, exercise)


def error_report(path: Path, error: str, exercise: str | None = None) -> dict:
    """The report of a notebook that could not be graded: its tasks at zero."""
    nb = nbformat.v4.new_notebook()
    report = score_notebook(path, nb, f"error: {error}", 0.0, {}, exercise)
    report["error"] = error
    return report
