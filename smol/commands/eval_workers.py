"""`smol eval --workers N`: the scoring in N processes of their own, each with its own
copy of the model (loaded as the command loads its own) and its share of the CPU
threads, scoring whole batches (evaluate.row_batches) as each frees up. On 2 cores,
2 processes of 1 thread score about 1.2 times as fast as 1 process of 2 threads: a
batch's matrix products are too small for two threads to share without waiting on
each other. The batches are the ones a single process scores, and each batch's
scores are evaluate.score's.

The workers ignore Ctrl-C and SIGTERM, which reach a whole process group: the
command's process handles them (and keeps what was scored); when the scoring stops, the
batches not begun are cancelled and the workers finish the ones they hold (a second or
so each), then exit. Should the command's process be killed outright, each exits as it
sees that process gone."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool

import torch

from smol import evaluate

_model = None  # a worker's model


def _start(source, dtype: torch.dtype, threads: int) -> None:
    """A worker's first step: its threads, and its own copy of the model."""
    global _model
    for signum in (signal.SIGINT, signal.SIGTERM):  # the command's to handle
        signal.signal(signum, signal.SIG_IGN)
    # killed outright, the command closes no queue: the worker then exits with it
    parent = multiprocessing.parent_process()
    threading.Thread(target=_exit_with, args=(parent,), daemon=True).start()
    torch.set_num_threads(threads)
    from smol.pretrained import load_pretrained

    _model, _ = load_pretrained(source, device="cpu", dtype=dtype)


def _exit_with(parent) -> None:
    parent.join()  # returns when the command's process has ended
    os._exit(1)


def _ready() -> int:
    return os.getpid()


def _score(requests: list, token_budget: int) -> tuple[int, list[list[float]]]:
    """One batch's scores (as lists: a float32 comes back exactly), and who scored."""
    found = evaluate.score(_model, requests, token_budget)
    return os.getpid(), [s.tolist() for s in found]


class Workers:
    """N worker processes (spawned, so that no thread of this one is copied) with
    `threads` threads each, every one holding the model `source` in `dtype`."""

    def __init__(self, source, dtype: torch.dtype, workers: int, threads: int):
        self.pids: set[int] = set()  # the processes that scored a batch
        self.executor = ProcessPoolExecutor(
            workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_start,
            initargs=(source, dtype, threads),
        )
        # each submit here starts a worker: they start with Ctrl-C ignored, so
        # that one pressed while they import does not print their tracebacks
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            started = [self.executor.submit(_ready) for _ in range(workers)]
        finally:
            signal.signal(signal.SIGINT, previous)
        try:
            for f in started:
                f.result()
        except BrokenProcessPool:
            self.close()
            raise RuntimeError(
                "a scoring worker could not load the model (its error is above)"
            ) from None
        except BaseException:
            self.close()
            raise

    def scores(
        self, batches, requests: list, token_budget: int
    ) -> Iterator[tuple[list[int], list[torch.Tensor]]]:
        """(batch, its scores) for every batch, as the workers finish them. Stopped
        early (an interruption), the batches not begun are cancelled."""
        futures = {
            self.executor.submit(_score, [requests[i] for i in b], token_budget): b
            for b in batches
        }
        try:
            for f in as_completed(futures):
                try:
                    pid, found = f.result()
                except BrokenProcessPool:
                    raise RuntimeError(
                        "a scoring worker stopped before its batch was done (killed "
                        "for memory?): try fewer --workers"
                    ) from None
                self.pids.add(pid)
                yield futures[f], [torch.tensor(s) for s in found]
        finally:
            for f in futures:
                f.cancel()

    def close(self) -> None:
        """Cancel what has not begun; wait for the workers to finish theirs and
        exit."""
        self.executor.shutdown(wait=True, cancel_futures=True)
