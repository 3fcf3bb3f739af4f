"""Every process that grading starts ends before a report is written.

A check's child runs in a process group of its own, and killing the group ends what it
started; but code can leave the group (`setsid`) and its parent (a double fork), and
would then live on to rewrite a report. So `smol grade` makes its process a
*child subreaper* (Linux's `prctl(PR_SET_CHILD_SUBREAPER)`): a process whose parent dies
is handed to it instead of to init, wherever it went. `sweep` then kills every
descendant outside the processes it is told to keep (the notebook's kernel while the
notebook runs, the workers of a class) and reaps them; after a notebook, nothing is
kept. All this holds while the command runs, inside `reaping`.

The same process makes itself non-dumpable (`PR_SET_DUMPABLE` 0), which it passes on to
the children it forks: another process of the same user can then neither read nor
write its memory, nor open its pipes, through /proc or ptrace.

Elsewhere than Linux both are unavailable and `sweep` does nothing; run graded work in
a container there.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

PR_GET_DUMPABLE, PR_SET_DUMPABLE = 3, 4
PR_SET_CHILD_SUBREAPER, PR_GET_CHILD_SUBREAPER = 36, 37
_ACTIVE = False  # set while `reaping`: only then does sweep kill anything
KEEP: set[int] = set()  # children that a sweep leaves running, with their descendants


def _prctl(option: int, value: int = 0) -> int | None:
    """prctl(option, value); for the GET options that write through a pointer, pass
    value -1 to read it. None where it failed or the platform has none."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if value == -1:
            box = ctypes.c_int(0)
            done = libc.prctl(option, ctypes.byref(box), 0, 0, 0)
            return box.value if done == 0 else None
        done = libc.prctl(option, value, 0, 0, 0)
        return done if done >= 0 else None
    except (OSError, AttributeError):
        return None


@contextlib.contextmanager
def reaping():
    """While the block runs, this process is the reaper of whatever its descendants
    leave behind, and non-dumpable; at its end (an interrupt included) every
    descendant is killed and reaped, and both settings are restored. Yields whether
    the platform allowed it. Only a grader's own process uses this: `sweep` kills its
    children."""
    global _ACTIVE
    dumpable = _prctl(PR_GET_DUMPABLE)
    adopting = _prctl(PR_GET_CHILD_SUBREAPER, -1)
    _prctl(PR_SET_DUMPABLE, 0)
    _ACTIVE = _prctl(PR_SET_CHILD_SUBREAPER, 1) is not None
    try:
        yield _ACTIVE
    finally:
        KEEP.clear()
        sweep()
        _ACTIVE = False
        if adopting is not None:
            _prctl(PR_SET_CHILD_SUBREAPER, adopting)
        if dumpable is not None:
            _prctl(PR_SET_DUMPABLE, dumpable)


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process in /proc."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # it ended meanwhile
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses
        fields = stat[stat.rfind(b")") + 2 :].split()
        out[int(name)] = int(fields[1])
    return out


def descendants(root: int, parents: dict[int, int] | None = None) -> list[int]:
    """Every process below `root`, parents before their children."""
    parents = _parents() if parents is None else parents
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def sweep(keep: set[int] | None = None, limit: float = 10.0) -> int:
    """Kill and reap every descendant of this process except the children in `keep`
    (default KEEP) and theirs; how many it killed. A no-op outside `reaping`."""
    if not _ACTIVE:
        return 0
    keep = KEEP if keep is None else keep
    me, killed, deadline = os.getpid(), 0, time.monotonic() + limit
    while time.monotonic() < deadline:
        parents = _parents()
        roots = [p for p, pp in parents.items() if pp == me and p not in keep]
        doomed = roots + [d for r in roots for d in descendants(r, parents)]
        if not doomed:
            break
        for pid in doomed:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        killed += len(doomed)
        for pid in roots:  # their children come to this process, for the next round
            _reap(pid, deadline)
    return killed


def _reap(pid: int, deadline: float) -> None:
    """Wait for a killed child of this process (not past the deadline)."""
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # reaped elsewhere, or not a child
            return
        if done or time.monotonic() > deadline:
            return
        time.sleep(0.002)


class Workers:
    """Processes that work for this one (a class's graders: one notebook each). It
    keeps them from its sweeps while they run, and sweeps after each one: what a
    worker left behind (handed to this process when the worker ended) is killed."""

    def __init__(self):
        self.lock = threading.Lock()

    def run(self, command: list[str], limit: float, log) -> tuple[bytes, str]:
        """(its standard output, "") or (what it had written, why it failed)."""
        with self.lock:
            proc = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log
            )
            KEEP.add(proc.pid)
        why = ""
        try:
            out, _ = proc.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            proc.kill()
            with self.lock:
                sweep()
            why = f"its grader ran past {limit:g} s and was stopped"
            try:
                out, _ = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                out = b""
        finally:
            with self.lock:
                KEEP.discard(proc.pid)
                sweep()
        if not why and proc.returncode not in (0, 1):
            why = f"its grader ended with exit status {proc.returncode}"
        return out, why
