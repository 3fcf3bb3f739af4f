"""Grade exercise notebooks from the shell: each runs in a fresh kernel, then the scores
are added up.

    smol grade exercises/                       # every notebook in the folder
    smol grade exercises/02_rope.ipynb --strict  # exit 1 below full marks
    smol grade solutions/ --json report.json
    smol grade submissions/ --gradebook grades.csv --feedback feedback/
    smol grade submissions/ --gradebook grades.csv --nbgrader nb.csv --canvas cv.csv
    smol grade hw.ipynb --format gradescope --json results.json  # Gradescope's
    smol grade 01 --autograder autograder.zip --hidden rmsnorm_bug

Each notebook runs top to bottom (errors do not stop it) under a time limit of its own.
After each cell that calls `grade("task", obj)`, the grader grades `obj` itself, in
processes of its own, one per check, each killed at `--check-timeout`. What the
notebook prints or displays is never read, and nothing a notebook does to the grading
code in its kernel changes its score. The points at stake are every task of the
notebook's topic (known from its file name) and every task its `grade` calls name: a
task whose check cell never ran, a notebook that hangs, or one whose kernel dies scores
zero on what it did not finish, and costs no other notebook anything. A file that is not
a notebook is reported as an error (its tasks score zero) and the others are graded.
Every process a notebook or a check started is ended before the report is written, and
the report is written at once (never a part of it), never over a notebook or a file that
is not an earlier report.

With --gradebook, the one path is a class's submissions folder (a folder per student, or
notebooks named STUDENT__EXERCISE.ipynb): each notebook is graded by a process of its
own, --jobs at a time; the CSV gets a row per student, exercise and task, --feedback a
Markdown page per student, and the JSON report (by default next to the CSV) the details,
from which a rerun takes every notebook that has not changed. The report also records
the submissions folder and the gradebook and pages as written: one changed since (a
regrade or a note by hand), another class's, or one no report records is replaced only
with --overwrite. A student or an exercise of the last report whose notebooks are gone
gets rows marked missing. --nbgrader and --canvas write the same points in nbgrader's
export columns and for Canvas's gradebook import.

--format gradescope writes Gradescope's results.json (a test per check) in place of the
report; --hidden shows checks only after the due date. --exercise NAME grades one
student's hand-in as exercise NAME, its notebook found in a folder by name or by its
check cells; --autograder writes Gradescope's autograder zip for an exercise, which runs
that. The book's Instructors page says how to run a course with them.

Below full marks, --strict exits with 1, as a notebook that could not be read or an
output that could not be written does. Ctrl-C or SIGTERM ends every process it started
first."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

from smol.commands.common import Parser, UsageError, parser, run
from smol.commands.grade_files import report_problem, write_report
from smol.commands.grade_instructor import (
    add_options,
    build_autograder,
    handin,
    instructor_problem,
    write_gradescope,
)
from smol.grading import reaper
from smol.grading.core import DEFAULT_TIMEOUT, timeout_problem
from smol.grading.runner import grade_notebook


def notebook_paths(args: list[str]) -> list[Path]:
    """The notebooks named, folders expanded (a hand-in may end in .IPYNB: any case
    of the suffix is a notebook's); ValueError for an argument that names none, and
    for a notebook named twice (its score would count twice)."""
    paths = []
    for arg in args:
        p = Path(arg)
        if p.is_dir():
            found = sorted(
                q
                for q in p.iterdir()
                if q.suffix.lower() == ".ipynb" and not q.name.startswith(".")
            )
            if not found:
                raise ValueError(f"{arg} is a folder without notebooks (*.ipynb)")
            paths += found
        elif p.suffix.lower() == ".ipynb" and p.exists():
            paths.append(p)
        else:
            raise ValueError(f"{arg} is neither a folder nor a notebook")
    seen = set()
    for path in paths:
        if path.resolve() in seen:
            raise ValueError(f"{path} is named twice: name each notebook once")
        seen.add(path.resolve())
    return paths


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


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"expected a positive whole number, got {text!r}"
        )
    return value


def build_parser() -> Parser:
    """The parser of `smol grade`."""
    p = parser("grade", __doc__)
    p.add_argument("paths", nargs="+", help="notebooks, or folders of notebooks")
    p.add_argument(
        "--timeout",
        type=_seconds,
        default=300,
        help="seconds per notebook (default 300)",
    )
    p.add_argument(
        "--cell-timeout",
        type=_seconds,
        default=120,
        help="seconds per cell (default 120)",
    )
    p.add_argument(
        "--check-timeout",
        type=_seconds,
        default=DEFAULT_TIMEOUT,
        help=f"seconds per check (default {DEFAULT_TIMEOUT:g}); the check's process "
        "is killed",
    )
    p.add_argument(
        "--json",
        type=Path,
        default=None,
        help="where to write the report (default grade_report.json, or with "
        "--gradebook its name with .json); - writes it to standard output",
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 unless every notebook has full marks",
    )
    p.add_argument("--quiet", action="store_true", help="one line per notebook")
    p.add_argument(
        "--gradebook",
        type=Path,
        help="grade a class: the one path is a folder of submissions; write a CSV row "
        "per student, exercise and task here",
    )
    p.add_argument(
        "--feedback",
        type=Path,
        help="with --gradebook: a folder for one Markdown page per student",
    )
    p.add_argument(
        "--jobs",
        type=_count,
        default=os.cpu_count() or 1,
        help="with --gradebook: notebooks graded at once (default: the CPU count)",
    )
    p.add_argument(
        "--regrade",
        action="store_true",
        help="with --gradebook: grade every notebook, changed or not",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="with --gradebook: replace a gradebook or feedback page changed since "
        "smol grade wrote it (a regrade or a note by hand), or written for another "
        "submissions folder or with another --json",
    )
    p.add_argument(
        "--tasks",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first: it registers tasks of its own (repeatable)",
    )
    add_options(p)
    return p


def _usage_problem(args) -> str:
    """What makes the command unusable before any grading ("" when nothing does)."""
    try:
        # the kernels hand the graded objects over with it
        import cloudpickle  # noqa: F401
    except ImportError:
        return "grading needs cloudpickle in this environment: pip install cloudpickle"
    for name in args.tasks:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - any failure to import is a usage error
            return f"cannot import --tasks {name}: {type(exc).__name__}: {exc}"
    problem = instructor_problem(args)
    if problem or args.autograder is not None:
        return problem
    if args.gradebook is not None:
        from smol.commands.grade_class import gradebook_problem

        return gradebook_problem(args)
    for option in ("feedback", "regrade", "overwrite"):
        if getattr(args, option):
            return f"--{option} needs --gradebook"
    try:
        if args.exercise is None:
            args.paths = notebook_paths(args.paths)
    except ValueError as exc:
        return str(exc)
    if args.json is None:
        args.json = Path("grade_report.json")
    if str(args.json) == "-":
        return ""
    problem = report_problem(args.json)
    if problem:
        return (
            f"cannot write the report to {args.json}: {problem} (choose another --json)"
        )
    return ""


def _grade_all(args) -> list[dict]:
    """The report of each notebook (with --exercise, of the hand-in's), with a line on
    stderr as each one is done."""
    paths, reports = args.paths, []
    if args.exercise is not None:
        paths, missing = handin(args)
        if missing:
            print(f"could not grade: {missing['error']}", file=sys.stderr, flush=True)
            reports.append(missing)
    for path in paths:
        limits = (args.timeout, args.cell_timeout, args.check_timeout)
        r = grade_notebook(path, *limits, args.exercise)
        print(
            f"graded {path} in {r['seconds']:.1f}s: {r['score']}/{r['total']}"
            if "error" not in r
            else f"could not grade {path}: {r['error']}",
            file=sys.stderr,
            flush=True,
        )
        reports.append(r)
    return reports


def _parse(argv) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    problem = _usage_problem(args)
    if problem:
        raise UsageError(problem)
    return args


def _grade(args) -> int:
    """Grade, every process it started ended at the end (Ctrl-C and SIGTERM too)."""
    with reaper.reaping():
        if args.gradebook is not None:
            from smol.commands.grade_class import grade_class

            return grade_class(args)
        if args.autograder is not None:
            return build_autograder(args)
        reports = _grade_all(args)
        reaper.KEEP.clear()
        reaper.sweep()  # nothing a notebook or a check started outlives it
        return _finish(args, reports)


def main(argv: list[str] | None = None) -> int:
    return run("smol grade", lambda: _parse(argv), _grade, ())


def _finish(args, reports: list[dict]) -> int:
    """Show the scores and write the report; the exit status."""
    score, total = sum(r["score"] for r in reports), sum(r["total"] for r in reports)
    out = sys.stderr if str(args.json) == "-" else sys.stdout
    print(table(reports, verbose=not args.quiet), file=out)
    code = 1 if args.strict and score < total else 0
    unreadable = [r for r in reports if "error" in r]
    if unreadable:
        files = f"{len(unreadable)} file{'s' if len(unreadable) > 1 else ''}"
        line = f"{files} could not be graded (scored zero): " + "; ".join(
            r["error"] for r in unreadable
        )
        if out is not sys.stderr:  # under the table, and as the error it is
            print(line, file=out)
        print(f"smol grade: error: {line}", file=sys.stderr, flush=True)
        code = 1
    if args.format == "gradescope":
        seconds = sum(r["seconds"] for r in reports)
        code |= not write_gradescope(args, reports, seconds)
    elif not write_report(args.json, score, total, reports):
        code = 1
    return code
