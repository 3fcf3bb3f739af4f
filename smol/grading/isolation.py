"""Running one check safely: with a time limit, catching everything the student's code
can throw (including `SystemExit`), and, where the platform allows it, in a process of
its own.

Where the platform can fork (Linux; see `ISOLATE`), every check runs in a forked child
process: the time limit then kills the child, so it stops even a check stuck in one long
torch call, and nothing a check's code does (patching modules, exiting, crashing)
outlives it. Elsewhere the check runs in-process under a timer that interrupts Python
code only, between two C calls.

The child first takes the student's object (from a pickle, for `python -m smol.grade`)
and says so; the check's time limit starts then, so a slow load costs no check time. A
plain check's child then reports its verdict, tagged with a nonce fresh for that check.
A probe check's child reports only what the student's code returned, as plain data
(`smol.grading.plain`), and the parent judges it: nothing the child does can turn into
a pass. When a child sends nothing, the parent says why: its time ran out (and whether
memory was short then, which stalls code that is not looping), a signal killed it (a
SIGKILL that the grader did not send is the out-of-memory killer's), or it exited.
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

from smol.grading import plain, reaper
from smol.grading.registry import NOT_WRITTEN, Check, Row

# fork a child per check by default (safe there)
ISOLATE = sys.platform.startswith("linux")
LOAD_TIMEOUT = 60.0  # seconds to take the student's object, not counted as check time
# the real ones, whatever a check's code patches later
_exit, _write = os._exit, os.write


class CheckTimeout(Exception):
    pass


class ExitRefused(Exception):
    """Raised in place of os._exit / os.abort while a check runs, so the kernel
    survives."""


def out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` says that an allocation failed (Python's or torch's)."""
    text = str(exc).lower()
    return isinstance(exc, MemoryError) or (
        isinstance(exc, RuntimeError)
        and ("can't allocate memory" in text or "out of memory" in text)
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


# --- is memory short? -----------------------------------------------------------------


def _numbers(path: str, unit: int = 1) -> dict[str, int]:
    """The `key: value [kB]` lines of a /proc file, in bytes ({} if unreadable)."""
    out = {}
    try:
        with open(path) as f:
            for line in f:
                key, _, rest = line.partition(":" if ":" in line else " ")
                value = rest.split()
                if value and value[0].isdigit():
                    out[key.strip()] = int(value[0]) * unit
    except OSError:
        pass
    return out


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def memory_shortage(pid: int | None = None) -> str:
    """Why memory looks short right now ("" when it does not): little left available
    to the machine or its container (cgroup), the process's pages swapped out, or tasks
    stalled waiting for memory (pressure stall information)."""
    notes = []
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    ):
        limit, usage = _read_int(limit_file), _read_int(usage_file)
        if limit and usage and limit < 1 << 60 and usage > 0.9 * limit:
            notes.append(f"the container used {usage >> 20} of its {limit >> 20} MiB")
            break
    info = _numbers("/proc/meminfo", 1024)
    total, available = info.get("MemTotal"), info.get("MemAvailable")
    if total and available is not None and available < 0.05 * total:
        notes.append(f"{available >> 20} of {total >> 20} MiB were available")
    if pid is not None:
        swapped = _numbers(f"/proc/{pid}/status", 1024).get("VmSwap", 0)
        if swapped > 64 << 20:
            notes.append(f"{swapped >> 20} MiB of the check's memory were swapped out")
    try:
        with open("/proc/pressure/memory") as f:
            full = next(line for line in f if line.startswith("full"))
        stalled = float(full.split()[1].split("=")[1])
        if stalled >= 10:
            notes.append(f"tasks stalled on memory {stalled:g}% of the last 10 s")
    except (OSError, StopIteration, IndexError, ValueError):
        pass
    return "; ".join(notes)


def _timed_out(timeout: float, pid: int | None) -> str:
    """The message of a check that ran out of time, blaming memory when it was short."""
    short = memory_shortage(pid)
    if short:
        return (
            f"timed out after {timeout:g} s while memory was short ({short}): it "
            "stalled for lack of memory, not necessarily in an endless loop"
        )
    return f"timed out after {timeout:g} s (an endless loop, or one very long call?)"


def _load_timed_out() -> str:
    return f"the grader could not load your object in {LOAD_TIMEOUT:g} s"


# --- in this process ------------------------------------------------------------------


def _run_with_timeout(fn: Callable[[], None], timeout: float) -> None:
    """Run fn; raise CheckTimeout after `timeout` seconds. On the main thread of a
    POSIX process (a Jupyter kernel, a script) a SIGALRM timer interrupts the check;
    elsewhere the check runs in a daemon thread that is abandoned when it overruns."""
    main = threading.current_thread() is threading.main_thread()
    if main and hasattr(signal, "setitimer"):

        def on_alarm(signum, frame):
            raise CheckTimeout(_timed_out(timeout, os.getpid()))

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
        raise CheckTimeout(_timed_out(timeout, os.getpid()))
    if box:
        raise box[0]


def _loaded(load: Callable[[], Any]) -> tuple[Any, str]:
    """(the student's object, "") or (None, why it could not be taken)."""
    try:
        return load(), ""
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001
        return None, f"the grader could not load your object: {_describe(exc)}"


def _verdict(c: Check, obj: Any) -> tuple[bool, str]:
    """A plain check run on `obj` (no time limit): (passed, message)."""
    import torch

    torch.manual_seed(0)
    try:
        c.fn(obj)
        return True, ""
    except KeyboardInterrupt:
        raise
    # student code may raise anything, even SystemExit
    except BaseException as exc:  # noqa: BLE001
        return False, _describe(exc)


def outcome(data: bytes | None = None, error: str = "") -> bytes:
    """What a probe hands back: b"O" and its outputs as plain bytes, or b"E" and why
    it has none."""
    return b"O" + data if data is not None else b"E" + error.encode()


def _probed(c: Check, obj: Any, inputs: bytes) -> bytes:
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
            _run_with_timeout(lambda: box.append(_loaded(load)), LOAD_TIMEOUT)
        except CheckTimeout:
            obj, problem = None, _load_timed_out()
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


def run_here(c: Check, load: Callable[[], Any], timeout: float) -> Row:
    """One plain check in this process."""
    out, why = _in_process(
        load,
        lambda obj, problem: (False, problem) if problem else _verdict(c, obj),
        timeout,
    )
    passed, message = out if out is not None else (False, why)
    return Row(c.name, c.points, c.points if passed else 0, passed, c.hint, message)


def probe_here(
    c: Check, load: Callable[[], Any], inputs: bytes, timeout: float
) -> bytes:
    """One probe in this process: its outcome."""
    out, why = _in_process(
        load,
        lambda obj, problem: (
            outcome(error=problem) if problem else _probed(c, obj, inputs)
        ),
        timeout,
    )
    return out if out is not None else outcome(error=why)


# --- in a forked child ----------------------------------------------------------------


def run_in_child(c: Check, load: Callable[[], Any], timeout: float) -> Row:
    """One plain check in a forked child, killed (with anything it started) at the time
    limit. The child reports its verdict, tagged with a nonce fresh for this check."""
    nonce = secrets.token_hex(16)

    def work(obj, problem):
        passed, message = (False, problem) if problem else _verdict(c, obj)
        report = {"nonce": nonce, "passed": passed, "message": message}
        return json.dumps(report).encode()

    data, why = _in_child(load, work, timeout)
    report = _report(data, nonce) if data is not None else None
    if report is None:
        why = why or "the check's process sent a report the grader cannot read"
        return Row(c.name, c.points, 0, False, c.hint, why)
    passed, message = report
    return Row(c.name, c.points, c.points if passed else 0, passed, c.hint, message)


def probe_in_child(
    c: Check, load: Callable[[], Any], inputs: bytes, timeout: float
) -> bytes:
    """One probe in a forked child, killed at the time limit: its outcome, which the
    caller judges (an error when the child sent none)."""

    def work(obj, problem):
        return outcome(error=problem) if problem else _probed(c, obj, inputs)

    data, why = _in_child(load, work, timeout)
    return data if data is not None else outcome(error=why)


def _in_child(
    load: Callable[[], Any], work: Callable[[Any, str], bytes], timeout: float
) -> tuple[bytes | None, str]:
    """work(obj, load problem) in a forked child: (the bytes it returned, "") or (None,
    why it sent none). The time limit starts once the child has its object."""
    read_fd, write_fd = os.pipe()
    with warnings.catch_warnings():
        # "This process is multi-threaded, use of fork() may lead to deadlocks" (3.12+)
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        _child(load, work, read_fd, write_fd)
    os.close(write_fd)
    try:
        data, why = _receive(read_fd, pid, timeout)
    finally:
        os.close(read_fd)
        # a child that ended by itself (why == "") gets a moment to be reaped as it is
        status, killed = _end(pid, grace=0.5 if data is None and not why else 0.0)
        reaper.sweep()  # whatever it started and left behind
    if data is not None:
        return data, ""
    return None, why or _how_it_ended(status, killed)


def _receive(fd: int, pid: int, timeout: float) -> tuple[bytes | None, str]:
    """The child's result from `fd`: b"L" once it has its object, then b"R", 8 bytes of
    length and the result. (result, "") or (None, why) when the time ran out or the
    pipe broke the protocol; (None, "") when the child closed it before its result."""
    data, start = b"", None
    deadline = time.monotonic() + LOAD_TIMEOUT
    while True:
        if start is None and data[:1] == b"L":
            data, start = data[1:], time.monotonic()
            deadline = start + timeout
        if start is not None and len(data) >= 9:
            size = int.from_bytes(data[1:9], "little")
            if data[:1] != b"R" or size > plain.MAX_BYTES + (1 << 20):
                return None, "the check's process sent the grader something else"
            if len(data) >= 9 + size:
                return data[9 : 9 + size], ""
        if data and data[:1] not in (b"L", b"R"):
            return None, "the check's process sent the grader something else"
        left = deadline - time.monotonic()
        if left <= 0:
            if start is None:
                return None, _load_timed_out()
            return None, _timed_out(timeout, pid)
        if select.select([fd], [], [], left)[0]:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return None, ""
            data += chunk


def _end(pid: int, grace: float) -> tuple[int, bool]:
    """End the child and its process group: its wait status, and whether the grader
    had to kill it (rather than it ending within `grace` seconds by itself)."""
    deadline = time.monotonic() + grace
    killed = False
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() >= deadline:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            killed = True
            status = os.waitpid(pid, 0)[1]
            break
        time.sleep(0.005)
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)  # whatever it started in its group
    return status, killed


def _report(data: bytes, nonce: str) -> tuple[bool, str] | None:
    """(passed, message) from the child's report, if it is a valid one tagged with
    this check's nonce."""
    try:
        report = json.loads(data)
        if report.pop("nonce") != nonce:
            return None
        return bool(report["passed"]), str(report["message"])
    except Exception:  # noqa: BLE001 - no (valid) report
        return None


def _how_it_ended(status: int, killed: bool) -> str:
    """Why a child sent no result: a signal killed it, or it exited."""
    if killed:
        return "the check's process stopped reporting to the grader before it finished"
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        if number == signal.SIGKILL:
            return (
                "the check's process was killed by SIGKILL, which the grader did not "
                "send: most likely the system ran out of memory (its out-of-memory "
                "killer ends the largest process)"
            )
        known = number in signal.Signals._value2member_map_
        name = signal.Signals(number).name if known else number
        return f"the check's process was killed by signal {name} (a crash?)"
    return (
        f"the check's process ended (exit status {os.WEXITSTATUS(status)}) before it "
        "finished"
    )


def _send(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[_write(fd, view) :]


def _child(
    load: Callable[[], Any],
    work: Callable[[Any, str], bytes],
    read_fd: int,
    write_fd: int,
) -> None:
    """The forked child: take the object, say so, run the work with output discarded,
    send its bytes, never return."""
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
        obj, problem = _loaded(load)
        _send(write_fd, b"L")
        data = work(obj, problem)
        _send(write_fd, b"R" + len(data).to_bytes(8, "little") + data)
    finally:
        _exit(0)
        os.kill(os.getpid(), signal.SIGKILL)
