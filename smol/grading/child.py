"""A check's probe in a forked child of its own, and the pipe that brings its outcome
back.

The child leaves the parent's process group for one of its own, discards its output,
takes the student's object and says so (b"L"); the check's time limit starts then, so a
slow load costs no check time. It then sends its outcome, framed (b"R", 8 bytes of
length, the bytes), and never returns. The parent reads no more than a framed outcome
of bounded size, kills the child and its group at the time limit and reaps whatever it
left behind; when a child sends nothing, the parent says why: its time ran out (and
whether memory was short then), a signal killed it (a SIGKILL that the grader did not
send is the out-of-memory killer's), or it exited.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import time
import warnings
from typing import Any, Callable

from smol.grading import isolation, plain, reaper
from smol.grading.memory import timed_out
from smol.grading.registry import Check

_exit, _write = os._exit, os.write  # the real ones, whatever a check's code patches


def probe_in_child(
    c: Check, load: Callable[[], Any], inputs: bytes, timeout: float
) -> bytes:
    """One probe in a forked child, killed at the time limit: its outcome, which the
    caller judges (an error when the child sent none)."""

    def work(obj, problem):
        return (
            isolation.outcome(error=problem)
            if problem
            else isolation.probed(c, obj, inputs)
        )

    data, why = _in_child(load, work, timeout)
    return data if data is not None else isolation.outcome(error=why)


def _in_child(
    load: Callable[[], Any], work: Callable[[Any, str], bytes], timeout: float
) -> tuple[bytes | None, str]:
    """work(obj, load problem) in a forked child: (the bytes it returned, "") or (None,
    why it sent none). The time limit starts once the child has its object."""
    read_fd, write_fd = os.pipe()
    try:
        pid = _fork()
    except BlockingIOError:
        os.close(read_fd)
        os.close(write_fd)
        return None, (
            "the grader could not start a process for this check: the machine is at "
            "its limit of processes (not this code's fault); grade it again"
        )
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


FORK_TRIES = (0.1, 0.3, 1.0, 3.0)  # seconds to wait between tries


def _fork() -> int:
    """os.fork(), tried again while the machine is at its limit of processes
    (BlockingIOError, EAGAIN: others' processes, or the ones a check just left, still
    being reaped)."""
    for wait in FORK_TRIES:
        try:
            return _fork_once()
        except BlockingIOError:
            reaper.sweep()
            time.sleep(wait)
    return _fork_once()


def _fork_once() -> int:
    with warnings.catch_warnings():
        # "This process is multi-threaded, use of fork() may lead to deadlocks" (3.12+)
        warnings.simplefilter("ignore", DeprecationWarning)
        return os.fork()


def _receive(fd: int, pid: int, timeout: float) -> tuple[bytes | None, str]:
    """The child's result from `fd`: b"L" once it has its object, then b"R", 8 bytes of
    length and the result. (result, "") or (None, why) when the time ran out or the
    pipe broke the protocol; (None, "") when the child closed it before its result."""
    data, start = b"", None
    deadline = time.monotonic() + isolation.LOAD_TIMEOUT
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
                return None, isolation.load_timed_out()
            return None, timed_out(timeout, pid)
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
        obj, problem = isolation.loaded(load)
        _send(write_fd, b"L")
        data = work(obj, problem)
        _send(write_fd, b"R" + len(data).to_bytes(8, "little") + data)
    finally:
        _exit(0)
        os.kill(os.getpid(), signal.SIGKILL)
