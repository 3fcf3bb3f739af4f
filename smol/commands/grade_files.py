"""The outputs of `smol grade` (a notebook's or a class's): where a report may be
written, and each output written at once (smol.grading.files.write_atomic), a failure
said on stderr rather than raised, since the scores are shown already."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from smol.grading.files import is_report, output_problem, write_atomic


def report_problem(path: Path) -> str:
    """Why the report cannot be written to `path` ("" when it can); leaves no file
    behind."""
    return output_problem(path, is_report, "report of smol grade")


def write_output(path: Path, text: str | bytes, what: str) -> bool:
    """Write an output atomically; whether that worked (if not, say so on stderr)."""
    try:
        write_atomic(path, text)
    except OSError as exc:
        print(
            f"smol grade: could not write the {what} to {path}: "
            f"{exc.strerror or exc}; the scores above are all there is",
            file=sys.stderr,
        )
        return False
    return True


def write_report(
    path: Path, score: int, total: int, reports: list[dict], extra: dict | None = None
) -> bool:
    """Write the JSON report (to stdout for -), with a class's `extra` keys (what
    its run wrote, the notebooks missing); whether that worked."""
    report = {"score": score, "total": total, "notebooks": reports, **(extra or {})}
    if str(path) == "-":
        sys.stdout.write(json.dumps(report) + "\n")
        sys.stdout.flush()
        return True
    if not write_output(path, json.dumps(report, indent=1) + "\n", "report"):
        return False
    print(f"report written to {path}")
    return True
