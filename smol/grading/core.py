"""The grader's front: `run_checks` runs every check of a task against an object and
never raises; `grade`, `preview` and `summary` show the results in a notebook.

The registry of tasks and checks and the results live in `smol.grading.registry`; how a
single check runs safely (a time limit, a forked child per check where the platform
allows it) in `smol.grading.isolation`. A probe check runs in three steps here:
`chosen_inputs` (its data), a probe in a child, and `judged` (the verdict, in this
process); `serve_probes` is the middle step as `smol grade` runs it inside a
notebook's kernel.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from smol.grading import plain
from smol.grading.child import probe_in_child
from smol.grading.isolation import (
    ISOLATE,
    _describe,
    can_isolate,
    exits_refused,
    outcome,
    probe_here,
    timeout_problem,
)
from smol.grading.registry import DEFAULT_TIMEOUT, MIME, TASKS, Check, Result, Row, Task

# set in the kernels that `smol grade` starts: there `grade` leaves the
# grading to that command
DEFERRED = "SMOL_GRADE_DEFERRED"
_WARM: set = set()  # the warm-up functions already run in this process


def run_checks(
    task_name: str,
    obj: Any = None,
    timeout: float = DEFAULT_TIMEOUT,
    *,
    isolate: bool | None = None,
    payload: bytes | None = None,
    hidden: bool = True,
) -> Result:
    """Every check of `task_name` against `obj` (without `hidden`, those a student
    sees); never raises (except KeyboardInterrupt).

    isolate: run each check in a forked child that is killed at the time limit
    (default: on Linux, where the platform allows it). payload: the object as
    `cloudpickle` bytes instead of `obj`, unpickled inside each child, so that its code
    never runs in this process.
    """
    if task_name not in TASKS:
        known = ", ".join(sorted(TASKS))
        return Result(
            task_name, [], error=f"unknown task {task_name!r}; tasks are {known}"
        )
    problem = timeout_problem(timeout)
    if problem:
        return Result(task_name, [], error=problem)
    if isolate is None:
        isolate = ISOLATE
    isolate = isolate and can_isolate()
    if payload is not None:
        import cloudpickle

        def load():
            return cloudpickle.loads(payload)
    else:

        def load():
            return obj

    _warm_up(TASKS[task_name])
    checks = [c for c in TASKS[task_name].checks if hidden or not c.hidden]
    with exits_refused():
        return Result(task_name, [check_row(c, load, timeout, isolate) for c in checks])


def check_row(c: Check, load, timeout: float, isolate: bool) -> Row:
    """The row one check earns, `load()` giving the student's object: its probe runs
    in a child (or here), and this process judges what it returned."""
    chosen = chosen_inputs(c)
    if isinstance(chosen, Row):
        return chosen
    inputs, sent = chosen
    run = probe_in_child if isolate else probe_here
    return judged(c, inputs, run(c, load, sent, timeout))


def chosen_inputs(c: Check) -> tuple[Any, bytes] | Row:
    """A check's inputs (seeded) as the probe will see them, and as bytes; or a
    failed row, if the check cannot make them."""
    import torch

    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            sent = plain.encode(c.inputs())
        return plain.decode(sent), sent
    except Exception as exc:  # noqa: BLE001 - a broken check costs its own row
        message = f"the check could not make its inputs: {_describe(exc)}"
        return Row(c.name, c.points, 0, False, c.hint, message)


def judged(c: Check, inputs: Any, data: bytes | None) -> Row:
    """The row of a check, from its probe's outcome (`isolation.outcome`): its
    outputs are judged here; an error fails with its message."""
    import torch

    def row(passed: bool, message: str = "") -> Row:
        return Row(c.name, c.points, c.points if passed else 0, passed, c.hint, message)

    if not data or data[:1] not in (b"O", b"E"):
        return row(False, "the grader got no result for this check")
    if data[:1] == b"E":
        return row(False, data[1:501].decode(errors="replace"))
    try:
        out = plain.decode(data[1:])
    except plain.NotPlain as exc:
        return row(False, f"the grader cannot read the check's result: {exc}")
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            c.judge(inputs, out)
        return row(True)
    except Exception as exc:  # noqa: BLE001 - outputs of any shape reach the judge
        return row(False, _describe(exc))


def serve_probes(
    task_name: str,
    obj: Any,
    folder: str,
    indices: list[int],
    timeout: float,
    modules: tuple[str, ...] = (),
) -> None:
    """For `smol grade`, inside a notebook's kernel: run the probes of
    `task_name`'s checks `indices` on `obj`, each on the inputs in `folder`/in-<i>,
    writing its outcome to `folder`/out-<i>. `modules` register the task. The grader
    judges what this writes; nothing here decides a score."""
    import importlib
    from pathlib import Path

    where = Path(folder)
    with exits_refused():
        for index in indices:
            try:
                for name in modules:
                    importlib.import_module(name)
                c = TASKS[task_name].checks[index]
                isolate = ISOLATE and can_isolate()
                _warm_up(TASKS[task_name])
                run = probe_in_child if isolate else probe_here
                out = run(c, lambda: obj, (where / f"in-{index}").read_bytes(), timeout)
            except Exception as exc:  # noqa: BLE001
                problem = (
                    f"the notebook's kernel could not run the check: {_describe(exc)}"
                )
                out = outcome(error=problem)
            (where / f"out-{index}").write_bytes(out)


def _warm_up(t: Task) -> None:
    """Run the task's warm-up once in this process, before its checks: outside their
    time limit, whether they then run in forked children or here."""
    if t.warm_up is not None and t.warm_up not in _WARM:
        _WARM.add(t.warm_up)
        try:
            t.warm_up()
        except Exception:  # noqa: BLE001 - only a speed-up
            pass


RESULTS: dict[str, Result] = {}  # the latest graded result of each task in this process


def _in_ipython() -> bool:
    ipython = sys.modules.get("IPython")
    return ipython is not None and ipython.get_ipython() is not None


def _show(result: Result, counted: bool) -> None:
    """The table of a graded result, or of a preview: a preview shows which checks fail
    and how, but not their hints, which would give away the bug the student is asked to
    find."""
    payload = {**result.to_json(), "counted": counted}
    note = "(a preview: not counted in your score; hints are shown when you grade)"
    text = result.table(hints=counted) + ("" if counted else f"\n  {note}")
    if _in_ipython():
        from IPython.display import display

        page = result.html(hints=counted) + ("" if counted else f"<br><i>{note}</i>")
        bundle = {"text/plain": text, "text/html": page}
        if counted:
            bundle[MIME] = payload
        display(bundle, raw=True)
    else:
        print(text)


def grade(
    task_name: str,
    obj: Any = None,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    show: bool = True,
) -> None:
    """Grade `obj` (your function or class) on the checks of `task_name`; show the
    table.

    Never raises: a check that fails, raises, hangs or exits costs its own points only.
    Hidden checks are neither run nor shown: `smol grade` runs and counts them.
    Returns None (so a notebook shows only the table); the result is kept in
    `RESULTS[task_name]`. In a kernel started by `smol grade` it only says so:
    that command grades `obj` itself, in processes of its own, right after this cell.
    """
    if os.environ.get(DEFERRED):
        print(f"{task_name}: graded by smol grade after this cell")
        return
    try:
        result = run_checks(task_name, obj, timeout, hidden=False)
    except KeyboardInterrupt:
        raise
    # the grader itself must never break a notebook
    except BaseException as exc:  # noqa: BLE001
        result = Result(task_name, [], error=f"the grader failed: {_describe(exc)}")
    RESULTS[task_name] = result
    if show:
        try:
            _show(result, counted=True)
        except Exception as exc:  # noqa: BLE001
            print(f"{task_name}: {result.score}/{result.total} points ({exc})")


def preview(
    task_name: str, obj: Any = None, *, timeout: float = DEFAULT_TIMEOUT
) -> None:
    """Run the checks of `task_name` on an object without counting it (to see a buggy
    version fail)."""
    try:
        result = run_checks(task_name, obj, timeout, hidden=False)
    except BaseException as exc:  # noqa: BLE001
        result = Result(task_name, [], error=f"the grader failed: {_describe(exc)}")
    _show(result, counted=False)


def summary(notebook: str | None = None) -> None:
    """The total of every task graded so far (or of one notebook's tasks, ungraded ones
    as zero), over the checks a student sees."""
    names = (
        [t.name for t in TASKS.values() if t.notebook == notebook]
        if notebook
        else list(RESULTS)
    )
    rows = []
    for name in names:
        r = RESULTS.get(name)
        known = TASKS[name].shown_points if name in TASKS else 0
        total = r.total if r and r.total else known
        rows.append((name, r.score if r else 0, total, r is not None))
    score, total = sum(r[1] for r in rows), sum(r[2] for r in rows)
    width = max([len(r[0]) for r in rows] + [5])
    lines = [f"{'task':<{width}}  points"] + [
        f"{n:<{width}}  {s:>3}/{t:<3}{'' if graded else '  (not graded yet)'}"
        for n, s, t, graded in rows
    ]
    lines.append(f"{'total':<{width}}  {score:>3}/{total:<3}")
    print("\n".join(line.rstrip() for line in lines))
