"""The grader's machinery: a registry of checks per task, and `grade`, which runs them
safely.

A check is a function of the student's object that returns normally when the object
passes and raises (usually `AssertionError` with a message for the student) when it does
not. `grade` runs every check of a task with a per-check time limit, catches everything
the student's code can throw (including `SystemExit`), prints a table and never raises.

Where the platform can fork (Linux; see `ISOLATE`), every check runs in a forked child process:
the time limit then kills the child, so it stops even a check stuck in one long torch call, and
nothing a check's code does (patching modules, exiting, crashing) outlives it. Elsewhere the
check runs in-process under a timer that interrupts Python code only, between two C calls.
"""

from __future__ import annotations

import html
import json
import os
import secrets
import select
import signal
import sys
import threading
import time
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

# the machine-readable result that `python -m smol.grade` reads
MIME = "application/vnd.smol.grade+json"
DEFAULT_TIMEOUT = 10.0  # seconds per check
NOT_WRITTEN = (
    "NotImplementedError: not written yet"  # a stub was called; its hint stays hidden
)


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
    # Run once per process before the task's checks are forked: slow lazy imports (AdamW's
    # first use imports torch._dynamo, seconds) then happen once, not in every child.
    warm_up: Callable[[], None] | None = None

    @property
    def points(self) -> int:
        return sum(c.points for c in self.checks)


TASKS: dict[str, Task] = {}


def task(
    name: str, notebook: str, title: str, warm_up: Callable[[], None] | None = None
) -> Task:
    if name in TASKS:
        raise ValueError(f"task {name!r} is registered twice")
    TASKS[name] = Task(name, notebook, title, warm_up=warm_up)
    return TASKS[name]


_WARM: set = set()  # the warm-up functions already run in this process


def check(task_names: str | tuple[str, ...], name: str, points: int, hint: str):
    """Decorator: register `fn(obj)` as a check of one task (or the same check for
    several)."""
    names = (task_names,) if isinstance(task_names, str) else task_names

    def register(fn):
        for t in names:
            TASKS[t].checks.append(Check(t, name, points, hint, fn))
        return fn

    return register


class CheckTimeout(Exception):
    pass


class ExitRefused(Exception):
    """Raised in place of os._exit / os.abort while a check runs, so the kernel
    survives."""


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
        return (
            sum(r.points for r in self.rows)
            if self.rows
            else (TASKS[self.task].points if self.task in TASKS else 0)
        )

    def to_json(self) -> dict:
        return {
            "task": self.task,
            "score": self.score,
            "total": self.total,
            "checks": [
                {
                    "check": r.check,
                    "points": r.points,
                    "passed": r.passed,
                    "message": r.message,
                }
                for r in self.rows
            ],
            "error": self.error,
        }

    def table(self, hints: bool = True) -> str:
        lines = [f"{self.task}: {self.score}/{self.total} points"]
        if self.error:
            return lines[0] + "\n  " + self.error
        width = max(len(r.check) for r in self.rows) if self.rows else 5
        for r in self.rows:
            mark = "pass" if r.passed else "FAIL"
            line = f"  {mark}  {r.earned}/{r.points}  {r.check:<{width}}"
            if not r.passed:
                if hints and r.message != NOT_WRITTEN:
                    line += f"\n              hint: {r.hint}"
                if r.message:
                    line += f"\n              got:  {r.message}"
            lines.append(line)
        return "\n".join(line.rstrip() for line in "\n".join(lines).split("\n"))

    def html(self, hints: bool = True) -> str:
        head = f"<b>{html.escape(self.task)}: {self.score}/{self.total} points</b>"
        if self.error:
            return head + f"<br><code>{html.escape(self.error)}</code>"
        rows = []
        for r in self.rows:  # plain words, not emoji: they need no emoji font to show
            mark = (
                "<span style='color:#1a7f37'>pass</span>"
                if r.passed
                else "<span style='color:#cf222e;font-weight:bold'>FAIL</span>"
            )
            notes = []
            if not r.passed and hints and r.message != NOT_WRITTEN:
                notes.append(html.escape(r.hint))
            if not r.passed and r.message:
                notes.append(f"<code>{html.escape(r.message)}</code>")
            rows.append(
                f"<tr><td>{mark}</td><td>{r.earned}/{r.points}</td>"
                f"<td style='text-align:left'>{html.escape(r.check)}</td>"
                f"<td style='text-align:left'>{'<br>'.join(notes)}</td></tr>"
            )
        last = "hint" if hints else "what went wrong"
        return (
            f"{head}<table><tr><th></th><th>points</th><th "
            "style='text-align:left'>check</th>"
            f"<th style='text-align:left'>{last}</th></tr>{''.join(rows)}</table>"
        )


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
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if "smol/grading" not in f.filename.replace("\\", "/")
    ]
    where = (
        f" (line {frames[-1].lineno}: {frames[-1].line})"
        if frames and frames[-1].line
        else ""
    )
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}{where}"[:300]


def _run_with_timeout(fn: Callable[[], None], timeout: float) -> None:
    """Run fn; raise CheckTimeout after `timeout` seconds. On the main thread of a POSIX
    process (a Jupyter kernel, a script) a SIGALRM timer interrupts the check; elsewhere
    the check runs in a daemon thread that is abandoned when it overruns."""
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


ISOLATE = sys.platform.startswith(
    "linux"
)  # fork a child per check by default (safe there)
_exit, _write = (
    os._exit,
    os.write,
)  # the real ones, whatever a check's code patches later


def timeout_problem(timeout: Any) -> str:
    """Why `timeout` is not a usable time limit in seconds ("" when it is)."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        return f"the timeout must be a number of seconds, got {type(timeout).__name__}"
    if not timeout > 0 or timeout == float("inf"):
        return (
            f"the timeout must be a positive, finite number of seconds, got {timeout!r}"
        )
    return ""


def can_isolate() -> bool:
    """Whether checks can run in forked children here: a POSIX fork, and no CUDA context (a
    forked child cannot use its parent's)."""
    torch = sys.modules.get("torch")
    return hasattr(os, "fork") and not (
        torch is not None and torch.cuda.is_initialized()
    )


def run_checks(
    task_name: str,
    obj: Any = None,
    timeout: float = DEFAULT_TIMEOUT,
    *,
    isolate: bool | None = None,
    payload: bytes | None = None,
) -> Result:
    """Every check of `task_name` against `obj`; never raises (except KeyboardInterrupt).

    isolate: run each check in a forked child that is killed at the time limit (default: on
    Linux, where the platform allows it). payload: the object as `cloudpickle` bytes instead of
    `obj`, unpickled inside each child, so that its code never runs in this process.
    """
    if task_name not in TASKS:
        return Result(
            task_name,
            [],
            error=f"unknown task {task_name!r}; tasks are {', '.join(sorted(TASKS))}",
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

    def refuse(name):
        def stand_in(*args):
            raise ExitRefused(
                f"your code called os.{name}{args!r}: that would kill the kernel"
            )

        return stand_in

    warm_up = TASKS[task_name].warm_up
    if isolate and warm_up is not None and warm_up not in _WARM:
        _WARM.add(warm_up)
        try:
            warm_up()
        except Exception:  # noqa: BLE001 - only a speed-up
            pass
    saved_exit, saved_abort = os._exit, os.abort
    os._exit, os.abort = refuse("_exit"), refuse("abort")
    try:
        run = _run_in_child if isolate else _run_here
        return Result(
            task_name, [run(c, load, timeout) for c in TASKS[task_name].checks]
        )
    finally:
        os._exit, os.abort = saved_exit, saved_abort


def _check(c: Check, load: Callable[[], Any]) -> Row:
    """Run one check (no time limit); the row it earns."""
    import torch

    torch.manual_seed(0)
    try:
        obj = load()
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001
        return Row(
            c.name,
            c.points,
            0,
            False,
            c.hint,
            f"the grader could not load your object: {_describe(exc)}",
        )
    try:
        c.fn(obj)
        return Row(c.name, c.points, c.points, True, c.hint)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - student code may raise anything, even SystemExit
        return Row(c.name, c.points, 0, False, c.hint, _describe(exc))


def _run_here(c: Check, load: Callable[[], Any], timeout: float) -> Row:
    """One check in this process, under a timer that interrupts Python code (not a C call)."""
    import torch

    state, threads, box = torch.random.get_rng_state(), torch.get_num_threads(), []
    try:
        _run_with_timeout(lambda: box.append(_check(c, load)), timeout)
        return box[0]
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - the timeout, or a raise from a stray thread
        return Row(c.name, c.points, 0, False, c.hint, _describe(exc))
    finally:
        torch.random.set_rng_state(state)
        torch.set_num_threads(threads)


def _run_in_child(c: Check, load: Callable[[], Any], timeout: float) -> Row:
    """One check in a forked child, killed (with anything it started) at the time limit. The
    child reports its row over a pipe, tagged with a nonce fresh for this check."""
    nonce = secrets.token_hex(16)
    read_fd, write_fd = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter(
            "ignore", DeprecationWarning
        )  # "multi-threaded process" (3.12+)
        pid = os.fork()
    if pid == 0:
        _child(c, load, read_fd, write_fd, nonce)
    os.close(write_fd)
    data, timed_out, deadline = b"", False, time.monotonic() + timeout
    try:
        while b"\n" not in data:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            if select.select([read_fd], [], [], left)[0]:
                chunk = os.read(read_fd, 1 << 16)
                if not chunk:
                    break
                data += chunk
    finally:
        os.close(read_fd)
        for kill in (
            lambda: os.killpg(pid, signal.SIGKILL),
            lambda: os.kill(pid, signal.SIGKILL),
        ):
            try:
                kill()
            except OSError:
                pass
        status = os.waitpid(pid, 0)[1]
    try:
        message = json.loads(data.split(b"\n")[0])
        assert message.pop("nonce") == nonce
        return Row(
            c.name,
            c.points,
            c.points if message["passed"] else 0,
            bool(message["passed"]),
            c.hint,
            str(message["message"]),
        )
    except Exception:  # noqa: BLE001 - no (valid) report: say how the child ended
        pass
    if timed_out:
        why = f"timed out after {timeout:g} s (an endless loop, or one very long call?)"
    elif os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        name = (
            signal.Signals(number).name
            if number in signal.Signals._value2member_map_
            else number
        )
        why = f"the check's process was killed by signal {name} (a crash, or out of memory?)"
    else:
        why = f"the check's process ended (exit status {os.WEXITSTATUS(status)}) before it finished"
    return Row(c.name, c.points, 0, False, c.hint, why)


def _child(
    c: Check, load: Callable[[], Any], read_fd: int, write_fd: int, nonce: str
) -> None:
    """The forked child: run the check with output discarded, report one line, never return."""
    try:
        os.close(read_fd)
        os.setpgid(0, 0)  # its own process group: the parent kills whatever it starts
        import faulthandler

        faulthandler.disable()  # a crash is reported by the parent, not dumped on its stderr
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - the process ends soon
        import torch

        torch.set_num_threads(1)  # an OpenMP pool does not survive a fork
        row = _check(c, load)
        line = json.dumps(
            {"nonce": nonce, "passed": row.passed, "message": row.message}
        )
        _write(write_fd, line.encode() + b"\n")
    finally:
        _exit(0)
        os.kill(os.getpid(), signal.SIGKILL)


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

        bundle = {
            "text/plain": text,
            "text/html": result.html(hints=counted)
            if counted
            else result.html(hints=False) + f"<br><i>{note}</i>",
        }
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
    """Grade `obj` (your function or class) on the checks of `task_name`; show the table.

    Never raises: a check that fails, raises, hangs or exits costs its own points only. Returns
    None (so a notebook shows only the table); the result is kept in `RESULTS[task_name]`.
    In a kernel started by `python -m smol.grade` it only says so: that command grades `obj`
    itself, in processes of its own, right after this cell.
    """
    if os.environ.get("SMOL_GRADE_DEFERRED"):
        print(f"{task_name}: graded by python -m smol.grade after this cell")
        return
    try:
        result = run_checks(task_name, obj, timeout)
    except KeyboardInterrupt:
        raise
    # noqa: BLE001 - the grader itself must never break a notebook
    except BaseException as exc:
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
    """Run the checks of `task_name` on an object without counting it (to see a buggy version fail)."""
    try:
        result = run_checks(task_name, obj, timeout)
    except BaseException as exc:  # noqa: BLE001
        result = Result(task_name, [], error=f"the grader failed: {_describe(exc)}")
    _show(result, counted=False)


def summary(notebook: str | None = None) -> None:
    """The total of every task graded so far (or of one notebook's tasks, ungraded ones as zero)."""
    names = (
        [t.name for t in TASKS.values() if t.notebook == notebook]
        if notebook
        else list(RESULTS)
    )
    rows = []
    for name in names:
        r = RESULTS.get(name)
        total = r.total if r and r.total else TASKS[name].points if name in TASKS else 0
        rows.append((name, r.score if r else 0, total, r is not None))
    score, total = sum(r[1] for r in rows), sum(r[2] for r in rows)
    width = max([len(r[0]) for r in rows] + [5])
    lines = [f"{'task':<{width}}  points"] + [
        f"{n:<{width}}  {s:>3}/{t:<3}{'' if graded else '  (not graded yet)'}"
        for n, s, t, graded in rows
    ]
    lines.append(f"{'total':<{width}}  {score:>3}/{total:<3}")
    print("\n".join(line.rstrip() for line in lines))
