"""Helpers of the benchmark scripts: alternating timed runs of named callables (used by
bench/forward.py), and writing a results table (used by every script)."""

from __future__ import annotations

import csv
import statistics
import time
from collections.abc import Callable


def alternate(runs: dict[str, Callable[[], object]], repeats: int, sync=None):
    """Time each run `repeats` times, one of each in turn (so that a busy machine slows
    all alike), after one warm-up each.

    Returns ({name: median seconds}, {name: last output})."""
    sync = sync or (lambda: None)
    times = {name: [] for name in runs}
    outputs = {name: run() for name, run in runs.items()}  # warm-up
    for _ in range(repeats):
        for name, run in runs.items():
            sync()
            start = time.perf_counter()
            outputs[name] = run()
            sync()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}, outputs


def write_csv(path: str, header: list[str], rows: list[list]) -> None:
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([header, *rows])
    print("wrote", path)
