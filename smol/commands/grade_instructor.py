"""The options of `smol grade` for running a course elsewhere: Gradescope's
results.json (--format gradescope), the checks shown only after the due date
(--hidden), one student's hand-in of an exercise (--exercise), Gradescope's
autograder zip (--autograder) and the class's gradebook in nbgrader's and Canvas's
columns (--nbgrader, --canvas)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from smol.grading.gradescope import VISIBILITIES


def add_options(p) -> None:
    """The instructor's options, on the parser of `smol grade`."""
    p.add_argument(
        "--format",
        choices=("smol", "gradescope"),
        default="smol",
        help="the report's format (--json): smol's own (default), or Gradescope's "
        "results.json, a test per check",
    )
    p.add_argument(
        "--hidden",
        action="append",
        default=[],
        metavar="TASK[/CHECK]",
        help="with --format gradescope or --autograder: show this task's checks (or "
        "the one whose name starts with CHECK) to students only after the due date; "
        "they count all the same (repeatable)",
    )
    p.add_argument(
        "--visibility",
        choices=VISIBILITIES,
        default=None,
        help="with --format gradescope or --autograder: when students see the "
        "results (Gradescope's visibility; default visible)",
    )
    p.add_argument(
        "--exercise",
        metavar="NAME",
        help="the one path is a student's hand-in of exercise NAME (01, rmsnorm or "
        "01_rmsnorm): a notebook, or a folder holding it (found by name or by its "
        "check cells); graded as NAME whatever the file is called",
    )
    p.add_argument(
        "--autograder",
        type=Path,
        metavar="ZIP",
        help="write Gradescope's autograder for the exercise the one path names "
        "(01, rmsnorm or 01_rmsnorm) to ZIP, with these time limits, --hidden and "
        "--visibility",
    )
    p.add_argument(
        "--nbgrader",
        type=Path,
        metavar="CSV",
        help="with --gradebook: the class's points also in nbgrader's export columns",
    )
    p.add_argument(
        "--canvas",
        type=Path,
        metavar="CSV",
        help="with --gradebook: the class's points also as a CSV for Canvas's "
        "gradebook import",
    )


def instructor_problem(args) -> str:
    """What makes the instructor's options unusable ("" when nothing does); resolves
    --exercise, --hidden and --visibility."""
    from smol.grading.gradescope import exercise_stem, hidden_checks

    gradescope = args.format == "gradescope" or args.autograder is not None
    for option in ("hidden", "visibility"):
        if getattr(args, option) and not gradescope:
            return f"--{option} needs --format gradescope or --autograder"
    args.visibility = args.visibility or "visible"
    for option in ("nbgrader", "canvas"):
        if getattr(args, option) is not None and args.gradebook is None:
            return f"--{option} needs --gradebook"
    if args.gradebook is not None:
        for option in ("exercise", "autograder"):
            if getattr(args, option) is not None:
                return f"--{option} does not apply to --gradebook"
        if args.format != "smol":
            return "--format gradescope grades one student: not with --gradebook"
    try:
        args.hidden_checks = hidden_checks(args.hidden)
        if args.autograder is not None:
            return _autograder_problem(args)
        if args.exercise is not None:
            args.exercise = exercise_stem(args.exercise)
    except ValueError as exc:
        return str(exc)
    if args.exercise is not None:
        if len(args.paths) != 1:
            return "--exercise grades one hand-in: name one notebook or folder"
        path = Path(args.paths[0])
        if not (path.is_dir() or (path.is_file() and path.suffix.lower() == ".ipynb")):
            return f"--exercise: {path} is neither a folder nor a notebook"
    return ""


def _autograder_problem(args) -> str:
    from smol.grading import autograder
    from smol.grading.files import output_problem
    from smol.grading.gradescope import exercise_stem

    for option in ("exercise", "json", "tasks", "feedback", "strict", "regrade"):
        if getattr(args, option):
            return f"--{option} does not apply to --autograder"
    if args.format != "smol":
        return "--autograder writes its own --format gradescope: leave --format out"
    if len(args.paths) != 1:
        return "--autograder builds one exercise's: name only the exercise (01)"
    args.exercise = exercise_stem(args.paths[0])
    problem = autograder.repository_problem() or output_problem(
        args.autograder, autograder.is_autograder_zip, "autograder zip"
    )
    if problem:
        return f"cannot write the autograder to {args.autograder}: {problem}"
    if args.autograder.suffix.lower() != ".zip":
        return f"--autograder {args.autograder}: Gradescope takes a .zip file"
    return ""


def build_autograder(args) -> int:
    """Write the autograder zip; its contents on stdout."""
    from smol.commands.grade_files import write_output
    from smol.grading.autograder import autograder_zip

    options = [
        *("--timeout", f"{args.timeout:g}", "--cell-timeout", f"{args.cell_timeout:g}"),
        *("--check-timeout", f"{args.check_timeout:g}"),
        *(f"--hidden={spec}" for spec in args.hidden),
        *(("--visibility", args.visibility) if args.visibility != "visible" else ()),
    ]
    data = autograder_zip(args.exercise, options)
    if not write_output(args.autograder, data, "autograder"):
        return 1
    print(
        f"autograder for {args.exercise} written to {args.autograder} "
        f"({len(data) / 1e6:.1f} MB): upload it to the assignment's "
        "Configure Autograder page"
    )
    return 0


def handin(args) -> tuple[list[Path], dict | None]:
    """The notebook of --exercise in the one path (a folder or a notebook), or the
    report of a hand-in that holds none (or several), its tasks at zero."""
    from smol.grading.gradescope import find_handin
    from smol.grading.runner import error_report

    path = Path(args.paths[0])
    if not path.is_dir():
        return [path], None
    try:
        return [find_handin(path, args.exercise)], None
    except ValueError as exc:
        return [], error_report(path, str(exc), args.exercise)


def write_gradescope(args, reports: list[dict], seconds: float) -> bool:
    """Write Gradescope's results.json of the reports (to stdout for -)."""
    from smol.commands.grade_files import write_output
    from smol.grading.gradescope import results

    data = results(reports, seconds, args.hidden_checks, args.visibility)
    text = json.dumps(data, indent=1) + "\n"
    if str(args.json) == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return True
    if not write_output(args.json, text, "results"):
        return False
    print(f"Gradescope results written to {args.json}")
    return True
