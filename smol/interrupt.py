"""Stopping a run cleanly: SIGTERM (a preempted job) or SIGINT (Ctrl-C) is noted while
training runs, and the loop stops at the next step boundary, after a checkpoint. Under
DDP a signal may reach one rank only, so the ranks agree on stopping (any_rank_caught)
at steps where they all sync."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable
from pathlib import Path


class TrainingInterrupted(Exception):
    """SIGTERM or SIGINT (Ctrl-C) stopped training at a step boundary, after saving a
    checkpoint."""

    def __init__(self, signal_name: str, step: int, path: Path):
        self.signal_name, self.step, self.path = signal_name, step, path
        super().__init__(
            f"stopped by {signal_name} after step {step}: saved {path}; "
            f"continue with --resume (resume=True)"
        )


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the code runs as Ctrl-C raises KeyboardInterrupt (so that
    what cleans up after Ctrl-C cleans up after it too); a command exits 143 on it."""


@contextlib.contextmanager
def stop_on_signals(notice: Callable[[str], None] | None = None):
    """While the block runs, SIGTERM and SIGINT only note that they came, by name, in
    the list it yields (the first also calls `notice` with its name); the loop stops at
    the next step boundary. A second one raises KeyboardInterrupt at once (Terminated
    for SIGTERM). Signals go to
    the main thread only: on another thread the list stays empty."""
    caught: list[str] = []
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return

    def note(signum, frame):
        name = signal.Signals(signum).name
        if caught:  # SIGTERM stays SIGTERM: a scheduler reads the status
            stop = Terminated if signum == signal.SIGTERM else KeyboardInterrupt
            raise stop(f"a second {name}: stopped at once")
        caught.append(name)
        if notice is not None:
            notice(name)

    previous = {s: signal.signal(s, note) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield caught
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def any_rank_caught(caught: list[str], device) -> bool:
    """Whether a signal reached any rank; every rank must call it at the same step."""
    import torch  # here: the commands import Terminated from this module, not torch
    import torch.distributed as dist

    flag = torch.tensor(float(bool(caught)), device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return flag.item() > 0
