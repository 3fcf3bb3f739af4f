"""Grade exercise notebooks from the shell: each runs in a fresh kernel, then the scores
are added up.

    smol grade exercises/                       # every notebook in the folder
    smol grade exercises/02_rope.ipynb --strict  # exit 1 below full marks
    smol grade solutions/ --json report.json
    smol grade submissions/ --gradebook grades.csv --feedback feedback/

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
gets rows marked missing.

Below full marks, --strict exits with 1, as a notebook that could not be read or an
output that could not be written does. Ctrl-C or SIGTERM ends every process it started
first."""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import sys
import time
from pathlib import Path

from smol.commands.common import Parser, UsageError, parser, run
from smol.grading import reaper
from smol.grading.core import DEFAULT_TIMEOUT, timeout_problem
from smol.grading.files import (
    earlier_grades,
    earlier_notebooks,
    earlier_students,
    is_report,
    output_problem,
    sha256_of,
    write_atomic,
    written_record,
)
from smol.grading.runner import grade_notebook


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
    return output_problem(path, is_report, "report of smol grade")


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
    if args.gradebook is not None:
        return _gradebook_problem(args)
    for option in ("feedback", "regrade", "overwrite"):
        if getattr(args, option):
            return f"--{option} needs --gradebook"
    try:
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


def _gradebook_problem(args) -> str:
    """What makes a class's grading unusable ("" when nothing does)."""
    from smol.grading import gradebook

    if args.strict:
        return "--strict does not apply to --gradebook (the CSV holds every score)"
    if len(args.paths) != 1 or not Path(args.paths[0]).is_dir():
        return "--gradebook grades one folder of submissions: name only that folder"
    try:
        args.submissions = gradebook.find_submissions(Path(args.paths[0]))
    except (ValueError, OSError) as exc:
        return str(exc)
    problem = output_problem(args.gradebook, gradebook.is_gradebook, "gradebook")
    if problem:
        return f"cannot write the gradebook to {args.gradebook}: {problem}"
    if args.json is None:
        args.json = args.gradebook.with_suffix(".json")
    if str(args.json) == "-" or args.json.resolve() == args.gradebook.resolve():
        return "--json must name a file of its own next to --gradebook"
    problem = report_problem(args.json)
    if problem:
        return (
            f"cannot write the report to {args.json}: {problem} (choose another --json)"
        )
    if args.feedback is not None:
        folder = args.feedback
        if folder.exists() and not folder.is_dir():
            return f"--feedback {folder} is a file, not a folder"
        if not folder.exists() and not folder.parent.is_dir():
            return f"--feedback: the folder {folder.parent} does not exist"
        for student in sorted({s.student for s in args.submissions}):
            page = folder / gradebook.feedback_name(student)
            if page.exists() and not gradebook.is_feedback(page):
                return (
                    f"--feedback: {page} exists and is not an earlier feedback page, "
                    "which the output would replace"
                )
    return "" if args.overwrite else _changed_output(args)


def _changed_output(args) -> str:
    """Why an earlier gradebook or feedback page of the grader's must stay ("" when
    none must): the class report (--json) records what its run wrote, and for which
    submissions folder; a file it does not record as it is now (edited by hand,
    another class's, written with another --json) takes --overwrite."""
    from smol.grading import gradebook

    record = written_record(args.json)
    folder = str(Path(args.paths[0]).resolve())
    pages = record.get("feedback") if isinstance(record.get("feedback"), dict) else {}
    outputs = [(args.gradebook, record.get("gradebook"), "--gradebook")]
    if args.feedback is not None:
        outputs += [
            (args.feedback / name, pages.get(name), "--feedback")
            for name in sorted(
                {gradebook.feedback_name(s.student) for s in args.submissions}
            )
        ]
    ask = "give another {} or --overwrite to replace it"
    if record and record.get("submissions") != folder:
        return (
            f"{args.json} holds the grades of {record.get('submissions')}, not of "
            f"{folder} (another class's?): {ask.format('--gradebook')}"
        )
    for path, sha, option in outputs:
        if not path.exists():
            continue
        if not record:
            return (
                f"{path} was not written by a run that {args.json} records (another "
                f"class's, or one with another --json): {ask.format(option)}"
            )
        if sha256_of(path) != sha:
            return (
                f"{path} was changed since smol grade wrote it (a regrade or a note "
                f"by hand?): {ask.format(option)}"
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


def _write(path: Path, text: str, what: str) -> bool:
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


def _write_report(
    path: Path, score: int, total: int, reports: list[dict], written: dict | None = None
) -> bool:
    """Write the JSON report (to stdout for -), with the record of what a class's
    run wrote; whether that worked."""
    report = {"score": score, "total": total, "notebooks": reports}
    if written is not None:
        report["written"] = written
    if str(path) == "-":
        sys.stdout.write(json.dumps(report) + "\n")
        sys.stdout.flush()
        return True
    if not _write(path, json.dumps(report, indent=1) + "\n", "report"):
        return False
    print(f"report written to {path}")
    return True


def _gradebook(args) -> int:
    """Grade a class's submissions; write the gradebook, the report and the pages."""
    from smol.grading import gradebook as book

    start = time.monotonic()
    grader = book.fingerprint(args)
    previous = {} if args.regrade else earlier_grades(args.json, grader)
    reports = book.grade_class(args.submissions, args, previous)
    reaper.KEEP.clear()
    reaper.sweep()  # nothing a submission started outlives its grading
    for r in reports:
        r["grader"] = grader
    # a student or an exercise of the last report whose notebooks are gone stays,
    # marked missing
    earlier = earlier_notebooks(args.json)
    rows = book.gradebook_rows(reports, earlier_students(args.json), earlier)
    print(book.summary(reports, rows, time.monotonic() - start))
    score, total = sum(r[3] for r in rows), sum(r[4] for r in rows)
    # what this run wrote, for the next one to know its own files from edited ones
    written = {"submissions": str(Path(args.paths[0]).resolve()), "feedback": {}}
    text = book.csv_text(rows)
    ok = _write(args.gradebook, text, "gradebook")
    if ok:
        written["gradebook"] = _sha256(text)
    if args.feedback is not None:
        args.feedback.mkdir(exist_ok=True)
        for student in sorted({r["student"] for r in reports}):
            page = book.feedback_page(student, reports, rows)
            name = book.feedback_name(student)
            if _write(args.feedback / name, page, "feedback"):
                written["feedback"][name] = _sha256(page)
            else:
                ok = False
    ok &= _write_report(args.json, score, total, reports, written)
    if ok:
        print(f"gradebook written to {args.gradebook}")
    return 0 if ok else 1


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


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
            return _gradebook(args)
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
    if not _write_report(args.json, score, total, reports):
        code = 1
    return code
