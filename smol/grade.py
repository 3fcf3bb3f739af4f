"""Grade exercise notebooks from the shell: each runs in a fresh kernel, then the scores
are added up.

    python -m smol.grade exercises/                      # every notebook in the folder
    python -m smol.grade exercises/02_rope.ipynb --strict  # exit 1 below full marks
    python -m smol.grade solutions/ --json report.json

Each notebook runs top to bottom (errors do not stop it) under a time limit of its own.
After each cell that calls `grade("task", obj)`, the grader takes `obj` out of the
kernel (pickled) and runs the task's checks itself, in processes of its own, one per
check, each killed at `--check-timeout`. What the notebook prints or displays is never
read, and nothing a notebook does to the grading code in its kernel changes its score.
The points at stake are every task of the notebook's topic (known from its file name)
and every task its `grade` calls name: a task whose check cell never ran, a notebook
that hangs, or one whose kernel dies scores zero on what it did not finish, and costs no
other notebook anything. A file that is not a notebook is reported as an error (its
tasks score zero) and the others are graded. Exit status: 2 for a usage error (found
before any grading), 1 when a notebook could not be read, the report could not be
written, or (with --strict) below full marks, else 0."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from smol.grading.core import DEFAULT_TIMEOUT, timeout_problem

# Running a notebook and grading it lives in smol.grading.runner; these names stay
# importable from here.
from smol.grading.runner import (  # noqa: F401
    DEFERRED,
    GRADE_CALL,
    collected_results,
    expected_tasks,
    grade_calls,
    grade_notebook,
    read_notebook,
    run_notebook,
    score_notebook,
    topic_tasks,
)


def notebook_paths(args: list[str]) -> list[Path]:
    """The notebooks named, folders expanded; ValueError for an argument that names
    none."""
    paths = []
    for arg in args:
        p = Path(arg)
        if p.is_dir():
            found = sorted(p.glob("*.ipynb"))
            if not found:
                raise ValueError(f"{arg} is a folder without notebooks (*.ipynb)")
            paths += found
        elif p.suffix == ".ipynb" and p.exists():
            paths.append(p)
        else:
            raise ValueError(f"{arg} is neither a folder nor a notebook")
    return paths


def report_problem(path: Path) -> str:
    """Why the report cannot be written to `path` ("" when it can); leaves no file
    behind."""
    if path.is_dir():
        return "it is a folder"
    folder = path.parent
    if not folder.is_dir():
        return f"the folder {folder} does not exist"
    existed = path.exists()
    try:
        with open(path, "a"):
            pass
    except OSError as exc:
        return exc.strerror or str(exc)
    if not existed:
        path.unlink(missing_ok=True)
    return ""


def _name(path: str) -> str:
    p = Path(path)
    return f"{p.parent.name}/{p.name}" if p.parent.name else p.name


def table(reports: list[dict], verbose: bool = True) -> str:
    width = max(
        [len(_name(r["notebook"])) for r in reports]
        + [len(t["task"]) + 2 for r in reports for t in r["tasks"]]
        + [8]
    )
    lines = [f"{'notebook':<{width}}  {'points':>9}  {'time':>6}  status"]
    for r in reports:
        lines.append(
            f"{_name(r['notebook']):<{width}}  {r['score']:>4}/{r['total']:<4}  "
            f"{r['seconds']:>5.1f}s  {r['status']}"
        )
        if verbose:
            for t in r["tasks"]:
                mark = (
                    "" if t["graded"] else "  (no result: its check cell did not run)"
                )
                lines.append(
                    f"  {t['task']:<{width - 2}}  {t['score']:>4}/{t['total']:<4}{mark}"
                )
    score, total = sum(r["score"] for r in reports), sum(r["total"] for r in reports)
    lines.append(f"{'total':<{width}}  {score:>4}/{total:<4}")
    return "\n".join(line.rstrip() for line in lines)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number of seconds, got {text!r}"
        ) from None
    problem = timeout_problem(value)
    if problem:
        raise argparse.ArgumentTypeError(
            f"expected a positive number of seconds, got {text!r}"
        )
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m smol.grade",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("paths", nargs="+", help="notebooks, or folders of notebooks")
    parser.add_argument(
        "--timeout",
        type=_seconds,
        default=300,
        help="seconds per notebook (default 300)",
    )
    parser.add_argument(
        "--cell-timeout",
        type=_seconds,
        default=120,
        help="seconds per cell (default 120)",
    )
    parser.add_argument(
        "--check-timeout",
        type=_seconds,
        default=DEFAULT_TIMEOUT,
        help=f"seconds per check (default {DEFAULT_TIMEOUT:g}); the check's process "
        "is killed",
    )
    parser.add_argument(
        "--json",
        type=Path,
        default=Path("grade_report.json"),
        help="where to write the report",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 unless every notebook has full marks",
    )
    parser.add_argument("--quiet", action="store_true", help="one line per notebook")
    return parser


def _usage_problem(args) -> str:
    """What makes the command unusable before any grading ("" when nothing does)."""
    try:
        # the kernels hand the graded objects over with it
        import cloudpickle  # noqa: F401
    except ImportError:
        return "grading needs cloudpickle in this environment: pip install cloudpickle"
    try:
        args.paths = notebook_paths(args.paths)
    except ValueError as exc:
        return str(exc)
    problem = report_problem(args.json)
    if problem:
        return (
            f"cannot write the report to {args.json}: {problem} (choose another --json)"
        )
    return ""


def _grade_all(args) -> list[dict]:
    """The report of each notebook, with a line on stderr as each one is done."""
    reports = []
    for path in args.paths:
        r = grade_notebook(path, args.timeout, args.cell_timeout, args.check_timeout)
        print(
            f"graded {path} in {r['seconds']:.1f}s: {r['score']}/{r['total']}"
            if "error" not in r
            else f"could not grade {path}: {r['error']}",
            file=sys.stderr,
            flush=True,
        )
        reports.append(r)
    return reports


def _write_report(path: Path, score: int, total: int, reports: list[dict]) -> bool:
    """Write the JSON report; whether that worked (if not, say so on stderr)."""
    report = {"score": score, "total": total, "notebooks": reports}
    try:
        path.write_text(json.dumps(report, indent=1) + "\n")
    except OSError as exc:
        print(
            f"smol.grade: could not write the report to {path}: "
            f"{exc.strerror or exc}; the scores above are all there is",
            file=sys.stderr,
        )
        return False
    print(f"report written to {path}")
    return True


def main(argv=None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    problem = _usage_problem(args)
    if problem:
        parser.error(problem)
    reports = _grade_all(args)
    score, total = sum(r["score"] for r in reports), sum(r["total"] for r in reports)
    print(table(reports, verbose=not args.quiet))
    code = 1 if args.strict and score < total else 0
    unreadable = [r for r in reports if "error" in r]
    if unreadable:
        files = f"{len(unreadable)} file{'s' if len(unreadable) > 1 else ''}"
        print(
            f"{files} could not be graded (scored zero): "
            + "; ".join(r["error"] for r in unreadable)
        )
        code = 1
    if not _write_report(args.json, score, total, reports):
        code = 1
    return code


if __name__ == "__main__":
    sys.exit(main())
