"""The grader's machinery: a registry of checks per task, and `grade`, which runs them safely.

A check is a function of the student's object that returns normally when the object passes and
raises (usually `AssertionError` with a message for the student) when it does not. `grade` runs
every check of a task with a per-check time limit, catches everything the student's code can throw
(including `SystemExit`), prints a table and never raises.
"""

from __future__ import annotations

import html
import json
import signal
import sys
import threading
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

MIME = "application/vnd.smol.grade+json"  # the machine-readable result that `python -m smol.grade` reads
DEFAULT_TIMEOUT = 10.0  # seconds per check
NOT_WRITTEN = "NotImplementedError: not written yet"  # a stub was called; its hint stays hidden


@dataclass(frozen=True)
class Check:
    task: str
    name: str
    points: int
    hint: str
    fn: Callable[[Any], None]


@dataclass
class Task:
    name: str
    notebook: str  # the topic (solutions/NN_<topic>.ipynb) the task belongs to
    title: str
    checks: list[Check] = field(default_factory=list)

    @property
    def points(self) -> int:
        return sum(c.points for c in self.checks)


TASKS: dict[str, Task] = {}


def task(name: str, notebook: str, title: str) -> Task:
    if name in TASKS:
        raise ValueError(f"task {name!r} is registered twice")
    TASKS[name] = Task(name, notebook, title)
    return TASKS[name]


def check(task_names: str | tuple[str, ...], name: str, points: int, hint: str):
    """Decorator: register `fn(obj)` as a check of one task (or the same check for several)."""
    names = (task_names,) if isinstance(task_names, str) else task_names

    def register(fn):
        for t in names:
            TASKS[t].checks.append(Check(t, name, points, hint, fn))
        return fn

    return register


class CheckTimeout(Exception):
    pass


class ExitRefused(Exception):
    """Raised in place of os._exit / os.abort while a check runs, so the kernel survives."""


@dataclass
class Row:
    check: str
    points: int
    earned: int
    passed: bool
    hint: str
    message: str = ""


@dataclass
class Result:
    task: str
    rows: list[Row]
    error: str = ""  # a problem with the call itself (an unknown task name)

    @property
    def score(self) -> int:
        return sum(r.earned for r in self.rows)

    @property
    def total(self) -> int:
        return sum(r.points for r in self.rows) if self.rows else (TASKS[self.task].points if self.task in TASKS else 0)

    def to_json(self) -> dict:
        return {"task": self.task, "score": self.score, "total": self.total,
                "checks": [{"check": r.check, "points": r.points, "passed": r.passed, "message": r.message}
                           for r in self.rows], "error": self.error}

    def table(self) -> str:
        lines = [f"{self.task}: {self.score}/{self.total} points"]
        if self.error:
            return lines[0] + "\n  " + self.error
        width = max(len(r.check) for r in self.rows) if self.rows else 5
        for r in self.rows:
            mark = "pass" if r.passed else "FAIL"
            line = f"  {mark}  {r.earned}/{r.points}  {r.check:<{width}}"
            if not r.passed:
                if r.message != NOT_WRITTEN:
                    line += f"\n              hint: {r.hint}"
                if r.message:
                    line += f"\n              got:  {r.message}"
            lines.append(line)
        return "\n".join(line.rstrip() for line in "\n".join(lines).split("\n"))

    def html(self) -> str:
        head = f"<b>{html.escape(self.task)}: {self.score}/{self.total} points</b>"
        if self.error:
            return head + f"<br><code>{html.escape(self.error)}</code>"
        rows = "".join(
            f"<tr><td>{'✅' if r.passed else '❌'}</td><td>{r.earned}/{r.points}</td>"
            f"<td style='text-align:left'>{html.escape(r.check)}</td><td style='text-align:left'>"
            f"{'' if r.passed else ('' if r.message == NOT_WRITTEN else html.escape(r.hint) + '<br>') + ('<code>' + html.escape(r.message) + '</code>' if r.message else '')}"
            "</td></tr>" for r in self.rows)
        return (f"{head}<table><tr><th></th><th>points</th><th style='text-align:left'>check</th>"
                f"<th style='text-align:left'>hint</th></tr>{rows}</table>")


def _describe(exc: BaseException) -> str:
    if isinstance(exc, (CheckTimeout, ExitRefused)):
        return str(exc)
    if isinstance(exc, SystemExit):
        return f"your code called sys.exit({exc.code!r})"
    if isinstance(exc, AssertionError) and str(exc):
        return str(exc)
    if isinstance(exc, NotImplementedError):
        return NOT_WRITTEN
    # The last frame of the student's code, so the message points at the line that failed.
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "smol/grading" not in f.filename.replace("\\", "/")]
    where = f" (line {frames[-1].lineno}: {frames[-1].line})" if frames and frames[-1].line else ""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}{where}"[:300]


def _run_with_timeout(fn: Callable[[], None], timeout: float) -> None:
    """Run fn; raise CheckTimeout after `timeout` seconds. On the main thread of a POSIX process (a
    Jupyter kernel, a script) a SIGALRM timer interrupts the check; elsewhere the check runs in a
    daemon thread that is abandoned when it overruns."""
    message = f"timed out after {timeout:g} s (an endless loop?)"
    main = threading.current_thread() is threading.main_thread()
    if main and hasattr(signal, "setitimer"):
        def on_alarm(signum, frame):
            raise CheckTimeout(message)

        previous = signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            fn()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        return
    box: list[BaseException] = []

    def target():
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the caller
            box.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise CheckTimeout(message)
    if box:
        raise box[0]


def run_checks(task_name: str, obj: Any, timeout: float = DEFAULT_TIMEOUT) -> Result:
    """Every check of `task_name` against `obj`; never raises (except KeyboardInterrupt)."""
    if task_name not in TASKS:
        return Result(task_name, [], error=f"unknown task {task_name!r}; tasks are {', '.join(sorted(TASKS))}")
    import os

    import torch

    def refuse(name):
        def stand_in(*args):
            raise ExitRefused(f"your code called os.{name}{args!r}: that would kill the kernel")
        return stand_in

    saved_exit, saved_abort = os._exit, os.abort
    os._exit, os.abort = refuse("_exit"), refuse("abort")
    try:
        return Result(task_name, _run_all(TASKS[task_name].checks, obj, timeout, torch))
    finally:
        os._exit, os.abort = saved_exit, saved_abort


def _run_all(checks, obj, timeout, torch) -> list[Row]:
    rows = []
    for c in checks:
        state = torch.random.get_rng_state()
        threads = torch.get_num_threads()
        try:
            torch.manual_seed(0)
            _run_with_timeout(lambda: c.fn(obj), timeout)
            rows.append(Row(c.name, c.points, c.points, True, c.hint))
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - student code may raise anything, even SystemExit
            rows.append(Row(c.name, c.points, 0, False, c.hint, _describe(exc)))
        finally:
            torch.random.set_rng_state(state)
            torch.set_num_threads(threads)
    return rows


RESULTS: dict[str, Result] = {}  # the latest graded result of each task in this process


def _in_ipython() -> bool:
    ipython = sys.modules.get("IPython")
    return ipython is not None and ipython.get_ipython() is not None


def _show(result: Result, counted: bool) -> None:
    payload = {**result.to_json(), "counted": counted}
    text = result.table() + ("" if counted else "\n  (a preview: not counted in your score)")
    if _in_ipython():
        from IPython.display import display

        bundle = {"text/plain": text, "text/html": result.html() if counted else
                  result.html() + "<br><i>(a preview: not counted in your score)</i>"}
        if counted:
            bundle[MIME] = payload
        display(bundle, raw=True)
    else:
        print(text)


def grade(task_name: str, obj: Any = None, *, timeout: float = DEFAULT_TIMEOUT, show: bool = True) -> None:
    """Grade `obj` (your function or class) on the checks of `task_name`; show the table.

    Never raises: a check that fails, raises, hangs or exits costs its own points only. Returns
    None (so a notebook shows only the table); the result is kept in `RESULTS[task_name]`.
    """
    try:
        result = run_checks(task_name, obj, timeout)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - the grader itself must never break a notebook
        result = Result(task_name, [], error=f"the grader failed: {_describe(exc)}")
    RESULTS[task_name] = result
    if show:
        try:
            _show(result, counted=True)
        except Exception as exc:  # noqa: BLE001
            print(f"{task_name}: {result.score}/{result.total} points ({exc})")


def preview(task_name: str, obj: Any = None, *, timeout: float = DEFAULT_TIMEOUT) -> None:
    """Run the checks of `task_name` on an object without counting it (to see a buggy version fail)."""
    try:
        result = run_checks(task_name, obj, timeout)
    except BaseException as exc:  # noqa: BLE001
        result = Result(task_name, [], error=f"the grader failed: {_describe(exc)}")
    _show(result, counted=False)


def summary(notebook: str | None = None) -> None:
    """The total of every task graded so far (or of one notebook's tasks, ungraded ones as zero)."""
    names = [t.name for t in TASKS.values() if t.notebook == notebook] if notebook else list(RESULTS)
    rows = []
    for name in names:
        r = RESULTS.get(name)
        total = r.total if r and r.total else TASKS[name].points if name in TASKS else 0
        rows.append((name, r.score if r else 0, total, r is not None))
    score, total = sum(r[1] for r in rows), sum(r[2] for r in rows)
    width = max([len(r[0]) for r in rows] + [5])
    lines = [f"{'task':<{width}}  points"] + [
        f"{n:<{width}}  {s:>3}/{t:<3}{'' if graded else '  (not graded yet)'}" for n, s, t, graded in rows]
    lines.append(f"{'total':<{width}}  {score:>3}/{total:<3}")
    print("\n".join(line.rstrip() for line in lines))
