"""Running one check safely: with a time limit, catching everything the student's code
can throw (including `SystemExit`), and, where the platform allows it, in a process of
its own.

Where the platform can fork (Linux; see `ISOLATE`), every check runs in a forked child
process: the time limit then kills the child, so it stops even a check stuck in one long
torch call, and nothing a check's code does (patching modules, exiting, crashing)
outlives it. The child reports its row over a pipe, tagged with a nonce fresh for that
check. Elsewhere the check runs in-process under a timer that interrupts Python code
only, between two C calls.
"""

from __future__ import annotations

import contextlib
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
from typing import Any, Callable

from smol.grading.registry import NOT_WRITTEN, Check, Row

# fork a child per check by default (safe there)
ISOLATE = sys.platform.startswith("linux")
# the real ones, whatever a check's code patches later
_exit, _write = os._exit, os.write


class CheckTimeout(Exception):
    pass


class ExitRefused(Exception):
    """Raised in place of os._exit / os.abort while a check runs, so the kernel
    survives."""


def _describe(exc: BaseException) -> str:
    if isinstance(exc, (CheckTimeout, ExitRefused)):
        return str(exc)
    if isinstance(exc, SystemExit):
        return f"your code called sys.exit({exc.code!r})"
    if isinstance(exc, AssertionError) and str(exc):
        return str(exc)
    if isinstance(exc, NotImplementedError):
        return NOT_WRITTEN
    # The last frame of the student's code, so the message points at the line that
    # failed.
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if "smol/grading" not in f.filename.replace("\\", "/")
    ]
    last = frames[-1] if frames else None
    where = f" (line {last.lineno}: {last.line})" if last and last.line else ""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}{where}"[:300]


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
    """Whether checks can run in forked children here: a POSIX fork, and no CUDA
    context (a forked child cannot use its parent's)."""
    torch = sys.modules.get("torch")
    cuda = torch is not None and torch.cuda.is_initialized()
    return hasattr(os, "fork") and not cuda


@contextlib.contextmanager
def exits_refused():
    """os._exit and os.abort raise ExitRefused instead, while the block runs."""

    def refuse(name):
        def stand_in(*args):
            raise ExitRefused(
                f"your code called os.{name}{args!r}: that would kill the kernel"
            )

        return stand_in

    saved_exit, saved_abort = os._exit, os.abort
    os._exit, os.abort = refuse("_exit"), refuse("abort")
    try:
        yield
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
        message = f"the grader could not load your object: {_describe(exc)}"
        return Row(c.name, c.points, 0, False, c.hint, message)
    try:
        c.fn(obj)
        return Row(c.name, c.points, c.points, True, c.hint)
    except KeyboardInterrupt:
        raise
    # student code may raise anything, even SystemExit
    except BaseException as exc:  # noqa: BLE001
        return Row(c.name, c.points, 0, False, c.hint, _describe(exc))


def _run_with_timeout(fn: Callable[[], None], timeout: float) -> None:
    """Run fn; raise CheckTimeout after `timeout` seconds. On the main thread of a
    POSIX process (a Jupyter kernel, a script) a SIGALRM timer interrupts the check;
    elsewhere the check runs in a daemon thread that is abandoned when it overruns."""
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


def run_here(c: Check, load: Callable[[], Any], timeout: float) -> Row:
    """One check in this process, under a timer that interrupts Python code (not a C
    call)."""
    import torch

    state, threads, box = torch.random.get_rng_state(), torch.get_num_threads(), []
    try:
        _run_with_timeout(lambda: box.append(_check(c, load)), timeout)
        return box[0]
    except KeyboardInterrupt:
        raise
    # the timeout, or a raise from a stray thread
    except BaseException as exc:  # noqa: BLE001
        return Row(c.name, c.points, 0, False, c.hint, _describe(exc))
    finally:
        torch.random.set_rng_state(state)
        torch.set_num_threads(threads)


def run_in_child(c: Check, load: Callable[[], Any], timeout: float) -> Row:
    """One check in a forked child, killed (with anything it started) at the time
    limit. The child reports its row over a pipe, tagged with a nonce fresh for this
    check."""
    nonce = secrets.token_hex(16)
    read_fd, write_fd = os.pipe()
    with warnings.catch_warnings():
        # "This process is multi-threaded, use of fork() may lead to deadlocks" (3.12+)
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        _child(c, load, read_fd, write_fd, nonce)
    os.close(write_fd)
    try:
        data, timed_out = _read_line(read_fd, time.monotonic() + timeout)
    finally:
        os.close(read_fd)
        status = _kill(pid)
    report = _report(data, nonce)
    if report is None:
        why = _how_it_ended(status, timed_out, timeout)
        return Row(c.name, c.points, 0, False, c.hint, why)
    passed, message = report
    return Row(c.name, c.points, c.points if passed else 0, passed, c.hint, message)


def _read_line(fd: int, deadline: float) -> tuple[bytes, bool]:
    """What arrives on `fd` until a newline, the end of the pipe or the deadline; and
    whether the deadline passed first."""
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0:
            return data, True
        if select.select([fd], [], [], left)[0]:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            data += chunk
    return data, False


def _kill(pid: int) -> int:
    """Kill the child and its process group (whatever it started); its wait status."""
    for kill in (
        lambda: os.killpg(pid, signal.SIGKILL),
        lambda: os.kill(pid, signal.SIGKILL),
    ):
        try:
            kill()
        except OSError:
            pass
    return os.waitpid(pid, 0)[1]


def _report(data: bytes, nonce: str) -> tuple[bool, str] | None:
    """(passed, message) from the child's report line, if it sent a valid one tagged
    with this check's nonce."""
    try:
        report = json.loads(data.split(b"\n")[0])
        if report.pop("nonce") != nonce:
            return None
        return bool(report["passed"]), str(report["message"])
    except Exception:  # noqa: BLE001 - no (valid) report
        return None


def _how_it_ended(status: int, timed_out: bool, timeout: float) -> str:
    """Why a child sent no report: its time ran out, a signal killed it, or it
    exited."""
    if timed_out:
        return (
            f"timed out after {timeout:g} s (an endless loop, or one very long call?)"
        )
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        known = number in signal.Signals._value2member_map_
        name = signal.Signals(number).name if known else number
        why = f"was killed by signal {name} (a crash, or out of memory?)"
    else:
        why = f"ended (exit status {os.WEXITSTATUS(status)}) before it finished"
    return f"the check's process {why}"


def _child(
    c: Check, load: Callable[[], Any], read_fd: int, write_fd: int, nonce: str
) -> None:
    """The forked child: run the check with output discarded, report one line, never
    return."""
    try:
        os.close(read_fd)
        os.setpgid(0, 0)  # its own process group: the parent kills whatever it starts
        import faulthandler

        # a crash is reported by the parent, not dumped on its stderr
        faulthandler.disable()
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        # the process ends soon: no need to close it
        sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115
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
