"""Helpers of the benchmark scripts: a parser with --threads, alternating timed runs of
named callables (used by bench/forward.py), and writing a results table (used by every
script)."""

from __future__ import annotations

import argparse
import csv
import statistics
import time
from collections.abc import Callable


def threads_parser(doc: str) -> argparse.ArgumentParser:
    """The parser of a benchmark script: its docstring `doc` as the description, kept
    as written, and --threads (default 2); parse with parse_and_set_threads."""
    parser = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=2)
    return parser


def parse_and_set_threads(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """The command line's arguments, torch's threads set to --threads."""
    import torch

    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    return args


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
