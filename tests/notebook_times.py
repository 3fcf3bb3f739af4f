"""How long each notebook takes under nbval: a pytest plugin (`-p tests.notebook_times`
in pyproject.toml) that adds up the time of every cell of a notebook, prints a table at
the end of the run and writes it to `_build/notebook_times/<kernels>.csv`.

`python -m tests.notebook_times` copies the chapters' times of the last run into
`bench/results/notebook_times.csv`, the table the set-up page shows: the run times the
book states are measured by `make test`, never typed.
"""

from __future__ import annotations

import csv
import os
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "_build" / "notebook_times"
RESULTS = ROOT / "bench" / "results" / "notebook_times.csv"
COLUMNS = ["notebook", "seconds", "cells"]

_seconds: dict[str, float] = defaultdict(float)
_cells: dict[str, int] = defaultdict(int)


def kernels() -> str:
    """The CPU kernel set of this run, as `tests/kernels.py` sets it."""
    return os.environ.get("ATEN_CPU_CAPABILITY", "native")


def pytest_runtest_logreport(report) -> None:
    path = report.nodeid.split("::")[0]
    if path.endswith(".ipynb"):
        _seconds[path] += report.duration
        _cells[path] += report.when == "call"


def pytest_terminal_summary(terminalreporter) -> None:
    if not _seconds:
        return
    rows = [
        {"notebook": p, "seconds": f"{_seconds[p]:.0f}", "cells": _cells[p]}
        for p in sorted(_seconds)
    ]
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / f"{kernels()}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    terminalreporter.section(f"notebook run times ({kernels()} CPU kernels)")
    for row in sorted(rows, key=lambda r: -float(r["seconds"]))[:15]:
        terminalreporter.write_line(f"{row['seconds']:>6} s  {row['notebook']}")
    total = sum(_seconds.values())
    terminalreporter.write_line(f"{total:6.0f} s  in all ({len(rows)} notebooks)")


def publish() -> None:
    """The chapters' rows of the last native-kernel run, into bench/results."""
    source = OUT / "native.csv"
    if not source.exists():
        sys.exit(f"{source} is missing: run `make test` first")
    with open(source) as f:
        rows = [r for r in csv.DictReader(f) if r["notebook"].startswith("chapters/")]
    with open(RESULTS, "w", newline="") as f:
        writer = csv.DictWriter(f, ["chapter", "seconds on a CPU"], lineterminator="\n")
        writer.writeheader()
        for r in rows:
            name = Path(r["notebook"]).stem
            writer.writerow({"chapter": name, "seconds on a CPU": r["seconds"]})
    print(f"wrote {RESULTS.relative_to(ROOT)} ({len(rows)} chapters)")


if __name__ == "__main__":
    publish()
