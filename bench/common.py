"""Helpers of the benchmark scripts: a parser with --threads, alternating timed runs of
named callables (used by bench/forward.py), writing a results table (used by every
script), and a memory figure of the process with a table of measures to print (used
by bench/data.py and bench/data_shard.py)."""

from __future__ import annotations

import argparse
import csv
import statistics
import time
from collections.abc import Callable
from pathlib import Path


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


def status_kb(field: str) -> int:
    """A memory figure of this process (VmHWM, RssAnon) in /proc/self/status, in kB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def show_measures(header: list[str], rows: list[list], path: str | None) -> None:
    """Print rows that start (measure, value, unit) as aligned lines; write them all
    under `header` to the CSV file `path`, if given."""
    width = max(len(r[0]) for r in rows)
    digits = max(len(f"{r[1]:,}") for r in rows)
    for row in rows:
        print(f"{row[0]:<{width}}  {row[1]:>{digits},} {row[2]}")
    if path:
        write_csv(path, header, rows)
