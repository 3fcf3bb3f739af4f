"""`smol grade SUBMISSIONS --gradebook CSV`: a class graded (smol/grading/gradebook.py
grades each notebook in a process of its own), after the checks of its outputs: the
gradebook, the class report beside it and the feedback pages are written only over
what an earlier run wrote, as it wrote it (the report records the submissions folder
and each file's SHA-256); one changed since, another class's, or one no report records
takes --overwrite."""

from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path

from smol.checkpoint import missing_folder, not_a_folder
from smol.commands.common import UsageError
from smol.commands.grade_files import report_problem, write_output, write_report
from smol.commands.runs import check_out
from smol.grading import exports, gradebook, reaper
from smol.grading.files import (
    earlier_grades,
    earlier_notebooks,
    earlier_students,
    output_problem,
    sha256_of,
    written_record,
)


def gradebook_problem(args) -> str:
    """What makes a class's grading unusable ("" when nothing does)."""
    if args.strict:
        return "--strict does not apply to --gradebook (the CSV holds every score)"
    if len(args.paths) != 1 or not Path(args.paths[0]).is_dir():
        return "--gradebook grades one folder of submissions: name only that folder"
    try:
        args.submissions = gradebook.find_submissions(Path(args.paths[0]))
        args.empty = gradebook.empty_folders(Path(args.paths[0]))
    except (ValueError, OSError) as exc:
        return str(exc)
    for student in args.empty:
        print(
            f"smol grade: warning: {student}/ holds no notebook: {student} hands in "
            "nothing (every exercise missing)",
            file=sys.stderr,
            flush=True,
        )
    for _, path, ours, what in _exports(args):
        problem = output_problem(path, ours, what)
        if problem:
            return f"cannot write the {what} to {path}: {problem}"
    named = [p.resolve() for _, p, _, _ in _exports(args)]
    if len(set(named)) < len(named):
        return "--gradebook, --nbgrader and --canvas must name files of their own"
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
        if problem := not_a_folder(folder):
            return f"--feedback: {problem}"
        if not folder.exists() and not folder.parent.is_dir():
            return f"--feedback: {missing_folder(folder.parent)}"
        try:  # the pages are written after the grading: found unwritable before it
            check_out(folder, "--feedback")
        except UsageError as exc:
            return str(exc)
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
    record = written_record(args.json)
    folder = str(Path(args.paths[0]).resolve())
    pages = record.get("feedback") if isinstance(record.get("feedback"), dict) else {}
    outputs = [(p, record.get(o[2:]), o) for o, p, _, _ in _exports(args)]
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


def _exports(args) -> list[tuple[str, Path, object, str]]:
    """(option, path, whether a file there is one of ours, what it is) of each CSV
    to write."""
    out = [("--gradebook", args.gradebook, gradebook.is_gradebook, "gradebook")]
    if args.nbgrader is not None:
        out.append(
            ("--nbgrader", args.nbgrader, exports.is_nbgrader_export, "nbgrader export")
        )
    if args.canvas is not None:
        out.append(("--canvas", args.canvas, exports.is_canvas_export, "Canvas export"))
    return out


def grade_class(args) -> int:
    """Grade a class's submissions; write the gradebook, the report and the pages."""
    start = time.monotonic()
    grader = gradebook.fingerprint(args)
    previous = {} if args.regrade else earlier_grades(args.json, grader)
    reports = gradebook.grade_class(args.submissions, args, previous)
    reaper.KEEP.clear()
    reaper.sweep()  # nothing a submission started outlives its grading
    for r in reports:
        r["grader"] = grader
    # a student or an exercise of the last report whose notebooks are gone stays,
    # marked missing
    earlier = earlier_notebooks(args.json)
    # a student whose folder holds no notebook is in the gradebook, missing all
    students = earlier_students(args.json) | set(args.empty)
    rows = gradebook.gradebook_rows(reports, students, earlier)
    print(gradebook.summary(reports, rows, time.monotonic() - start))
    score, total = sum(r[3] for r in rows), sum(r[4] for r in rows)
    # what this run wrote, for the next one to know its own files from edited ones
    written = {"submissions": str(Path(args.paths[0]).resolve()), "feedback": {}}
    texts = {
        "--gradebook": gradebook.csv_text(rows),
        "--nbgrader": exports.nbgrader_csv(rows),
        "--canvas": exports.canvas_csv(rows),
    }
    ok = True
    for option, path, _, what in _exports(args):
        if write_output(path, texts[option], what):
            written[option[2:]] = _sha256(texts[option])
        else:
            ok = False
    if args.feedback is not None:
        args.feedback.mkdir(exist_ok=True)
        for student in sorted({r["student"] for r in reports}):
            page = gradebook.feedback_page(student, reports, rows)
            name = gradebook.feedback_name(student)
            if write_output(args.feedback / name, page, "feedback"):
                written["feedback"][name] = _sha256(page)
            else:
                ok = False
    missing = missing_entries(rows)  # missing at the next run too
    extra = {"written": written, "missing": missing}
    ok &= write_report(args.json, score, total, reports, extra)
    if ok:
        print(f"gradebook written to {args.gradebook}")
    return 0 if ok else 1


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def missing_entries(rows: list[list]) -> list[dict]:
    """The notebooks the gradebook's rows mark missing, as the class report keeps
    them (student, exercise, each task with its points at stake), so that the next
    run marks them missing too."""
    out: dict[tuple[str, str], dict] = {}
    for student, exercise, task, _, total, status in rows:
        if status == "missing":
            entry = out.setdefault(
                (student, exercise),
                {"student": student, "exercise": exercise, "tasks": []},
            )
            entry["tasks"].append({"task": task, "total": total})
    return list(out.values())
