"""Running one check's probe safely: with a time limit, catching everything the
student's code can throw (including `SystemExit`), and, where the platform allows it, in
a process of its own.

Where the platform can fork (Linux; see `ISOLATE`), every probe runs in a forked child
process (`smol.grading.child`): the time limit then kills the child, so it stops even a
probe stuck in one long torch call, and nothing a probe's code does (patching modules,
exiting, crashing) outlives it. Elsewhere the probe runs in this process under a timer
that interrupts Python code only, between two C calls (`probe_here`).

Either way a probe hands back only its outcome: what the student's code returned, as
plain data (`smol.grading.plain`), or why there is none, in words for the student
(`_describe`). The caller judges it: nothing the probe does can turn into a pass.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import traceback
from typing import Any, Callable

from smol.grading import plain
from smol.grading.memory import out_of_memory, timed_out
from smol.grading.registry import NOT_WRITTEN, Check

# fork a child per check by default (safe there)
ISOLATE = sys.platform.startswith("linux")
LOAD_TIMEOUT = 60.0  # seconds to take the student's object, not counted as check time


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
    what = f"{type(exc).__name__}: {text[0] if text else ''}{where}"
    if out_of_memory(exc):
        what = f"ran out of memory ({what})"
    return what[:300]


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


def load_timed_out() -> str:
    return f"the grader could not load your object in {LOAD_TIMEOUT:g} s"


# --- in this process ------------------------------------------------------------------


def _run_with_timeout(fn: Callable[[], None], timeout: float) -> None:
    """Run fn; raise CheckTimeout after `timeout` seconds. On the main thread of a
    POSIX process (a Jupyter kernel, a script) a SIGALRM timer interrupts the check;
    elsewhere the check runs in a daemon thread that is abandoned when it overruns."""
    main = threading.current_thread() is threading.main_thread()
    if main and hasattr(signal, "setitimer"):

        def on_alarm(signum, frame):
            raise CheckTimeout(timed_out(timeout, os.getpid()))

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
        raise CheckTimeout(timed_out(timeout, os.getpid()))
    if box:
        raise box[0]


def loaded(load: Callable[[], Any]) -> tuple[Any, str]:
    """(the student's object, "") or (None, why it could not be taken)."""
    try:
        return load(), ""
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001
        return None, f"the grader could not load your object: {_describe(exc)}"


def outcome(data: bytes | None = None, error: str = "") -> bytes:
    """What a probe hands back: b"O" and its outputs as plain bytes, or b"E" and why
    it has none."""
    return b"O" + data if data is not None else b"E" + error.encode()


def probed(c: Check, obj: Any, inputs: bytes) -> bytes:
    """A probe run on `obj` (no time limit): its outcome."""
    import torch

    try:
        data = plain.decode(inputs)
        torch.manual_seed(0)
        return outcome(plain.encode(c.probe(obj, data)))
    except KeyboardInterrupt:
        raise
    except plain.NotPlain as exc:
        return outcome(error=f"the grader cannot read what it got: {exc}")
    except BaseException as exc:  # noqa: BLE001
        return outcome(error=_describe(exc))


def _in_process(
    load: Callable[[], Any], work: Callable[[Any, str], Any], timeout: float
) -> tuple[Any, str]:
    """work(obj, load problem) here, under a timer that interrupts Python code (not a
    C call): (its result, "") or (None, why it did not finish). The load has a time
    limit of its own."""
    import torch

    state, threads, box = torch.random.get_rng_state(), torch.get_num_threads(), []
    try:
        try:
            _run_with_timeout(lambda: box.append(loaded(load)), LOAD_TIMEOUT)
        except CheckTimeout:
            obj, problem = None, load_timed_out()
        else:
            obj, problem = box.pop()
        _run_with_timeout(lambda: box.append(work(obj, problem)), timeout)
        return box[0], ""
    except KeyboardInterrupt:
        raise
    # the timeout, or a raise from a stray thread
    except BaseException as exc:  # noqa: BLE001
        return None, _describe(exc)
    finally:
        torch.random.set_rng_state(state)
        torch.set_num_threads(threads)


def probe_here(
    c: Check, load: Callable[[], Any], inputs: bytes, timeout: float
) -> bytes:
    """One probe in this process: its outcome."""
    out, why = _in_process(
        load,
        lambda obj, problem: (
            outcome(error=problem) if problem else probed(c, obj, inputs)
        ),
        timeout,
    )
    return out if out is not None else outcome(error=why)
