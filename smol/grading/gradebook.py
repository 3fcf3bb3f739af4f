"""Grading a class: `smol grade submissions/ --gradebook grades.csv
--feedback feedback/` grades every student's notebooks and writes one gradebook (a CSV
row per student, exercise and task) and one feedback page per student.

A submissions folder holds one sub-folder per student (`alice/02_rope.ipynb`), or
notebooks named with the student in front (`alice__02_rope.ipynb`), or both. Each
notebook is graded by a process of its own (`smol grade NOTEBOOK --json -`),
`--jobs` of them at once: a notebook that breaks, hangs or attacks its grader costs its
own rows only, and whatever such a process leaves behind is killed before anything is
written. The JSON report of the class keeps each notebook's content hash (SHA-256) and
the grader's fingerprint (its source and settings): a rerun grades again only what
changed, and takes the rest from that report.
"""

from __future__ import annotations

import csv
import hashlib
import importlib.util
import io
import json
import re
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import nbformat
import torch

from smol.grading import TASKS, reaper
from smol.grading.registry import NOT_WRITTEN
from smol.grading.files import first_line, read_notebook
from smol.grading.runner import exercise_name, expected_tasks, score_notebook

HEADER = ["student", "exercise", "task", "points", "max_points", "status"]
MARK = "<!-- feedback written by smol grade -->"
# what the grader wrote as `python -m smol.grade`: its feedback files are its own too
EARLIER_MARK = "<!-- feedback written by python -m smol.grade -->"
SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass
class Submission:
    student: str
    exercise: str  # the file's name without the student and .ipynb: 02_rope
    path: Path
    sha256: str = ""


def is_notebook(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() == ".ipynb"


def notebooks_under(folder: Path) -> list[Path]:
    """Every notebook in folder and its subfolders (unzipped hand-ins nest them), in
    order, whatever the case of its suffix; hidden files and folders, such as
    Jupyter's .ipynb_checkpoints, are left out."""
    return sorted(
        p
        for p in folder.rglob("*")
        if is_notebook(p)
        and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    )


def find_submissions(folder: Path) -> list[Submission]:
    """The notebooks of a submissions folder, by student and exercise: a folder per
    student (its notebooks at any depth), or STUDENT__EXERCISE.ipynb at the top;
    ValueError for a folder that holds none, a name that says no student, an
    exercise twice (a second download, "01_rmsnorm (1).ipynb", included) or macOS's
    __MACOSX folder."""
    found: dict[tuple[str, str], Submission] = {}

    def add(student: str, path: Path) -> None:
        if not SAFE.fullmatch(student):
            raise ValueError(
                f"{path}: the student's name {student!r} must be letters, digits, "
                "'.', '_' or '-' (it names the feedback page)"
            )
        exercise = exercise_name(path)
        if (student, exercise) in found:
            other = found[student, exercise].path
            raise ValueError(f"{student} hands in {exercise} twice: {other} and {path}")
        found[student, exercise] = Submission(student, exercise, path)

    for entry in sorted(folder.iterdir()):
        if entry.name == "__MACOSX":
            raise ValueError(
                f"{entry} is macOS's record of a zip file, not a student's folder: "
                "delete it"
            )
        if entry.name.startswith("."):
            continue
        if entry.is_dir():
            for path in notebooks_under(entry):
                add(entry.name, path)
        elif is_notebook(entry):
            student, sep, exercise = entry.stem.partition("__")
            if not sep or not exercise:
                raise ValueError(
                    f"{entry}: a notebook at the top of a submissions folder is named "
                    "STUDENT__EXERCISE.ipynb (or put it in a folder named for the "
                    "student)"
                )
            add(student, entry)
    if not found:
        raise ValueError(
            f"{folder} holds no submissions: one folder of notebooks per student, or "
            "notebooks named STUDENT__EXERCISE.ipynb"
        )
    return list(found.values())


def empty_folders(folder: Path) -> list[str]:
    """The students of a submissions folder whose folders hold no notebook: they
    hand in nothing (their exercises are missing)."""
    return [
        entry.name
        for entry in sorted(folder.iterdir())
        if entry.is_dir()
        and not entry.name.startswith(".")
        and SAFE.fullmatch(entry.name)
        and not notebooks_under(entry)
    ]


def fingerprint(args) -> str:
    """What a grade depends on besides the notebook: the grader's source (and the
    modules of extra tasks), torch's version and the time limits."""
    digest = hashlib.sha256()
    package = Path(__file__).resolve().parents[1]
    files = sorted((package / "grading").rglob("*.py"))
    files += [
        package / "commands" / name
        for name in ("grade.py", "grade_files.py", "common.py")
    ]
    for name in args.tasks:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            files.append(Path(spec.origin))
    for path in files:
        digest.update(path.read_bytes())
    limits = (args.timeout, args.cell_timeout, args.check_timeout)
    digest.update(f"{torch.__version__} {limits}".encode())
    return digest.hexdigest()[:16]


def _limit(sub: Submission, args) -> float:
    """Seconds the worker of `sub` may take: the notebook's limit, each check's, and
    a margin to start Python and a kernel."""
    try:
        nb = read_notebook(sub.path)
        checks = sum(
            len(TASKS[t].checks) for t in expected_tasks(nb, sub.path) if t in TASKS
        )
    except ValueError:
        checks = 0
    return args.timeout + checks * (args.check_timeout + 5) + 120


def _grade_one(sub: Submission, args, workers: reaper.Workers, logs: Path) -> dict:
    command = [sys.executable, "-m", "smol", "grade", str(sub.path), "--json", "-"]
    command += [
        "--timeout",
        str(args.timeout),
        "--cell-timeout",
        str(args.cell_timeout),
    ]
    command += ["--check-timeout", str(args.check_timeout)]
    for name in args.tasks:
        command += ["--tasks", name]
    log_path = logs / f"{sub.student}__{sub.exercise}.log"
    with open(log_path, "wb") as log:
        out, why = workers.run(command, _limit(sub, args), log)
    if why:  # the last thing it said, for the instructor
        said = log_path.read_bytes().decode(errors="replace").strip().splitlines()
        why += f" ({said[-1][:200]})" if said else ""
    lines = out.strip().splitlines()
    report = None
    if not why and lines:
        try:
            report = json.loads(lines[-1])["notebooks"][0]
        except (ValueError, KeyError, IndexError, TypeError):
            why = "its grader's report could not be read"
    if report is None:
        why = why or "its grader wrote no report"
        try:
            nb = read_notebook(sub.path)
        except ValueError as exc:
            nb, why = nbformat.v4.new_notebook(), f"{sub.path.name} {exc}"
        report = score_notebook(sub.path, nb, f"error: {why}", 0.0, {}, sub.exercise)
        report["error"], report["retry"] = why, True
    return report


def grade_class(subs: list[Submission], args, previous: dict) -> list[dict]:
    """Every submission's report: from `previous` where the notebook and the grader
    are unchanged, else graded now, `args.jobs` at a time."""
    workers = reaper.Workers()
    reports: dict[int, dict] = {}
    todo = []
    for i, sub in enumerate(subs):
        sub.sha256 = hashlib.sha256(sub.path.read_bytes()).hexdigest()
        earlier = previous.get((sub.student, sub.exercise, sub.sha256))
        if earlier is not None:
            reports[i] = {**earlier, "notebook": str(sub.path), "reused": True}
        else:
            todo.append(i)
    with tempfile.TemporaryDirectory(prefix="smol-gradebook-") as tmp:

        def one(i: int) -> None:
            start = time.monotonic()
            report = _grade_one(subs[i], args, workers, Path(tmp))
            report["reused"] = False
            reports[i] = report
            print(
                f"graded {subs[i].path} in {time.monotonic() - start:.1f}s: "
                f"{report['score']}/{report['total']} ({report['status']})",
                file=sys.stderr,
                flush=True,
            )

        pool = ThreadPoolExecutor(max_workers=args.jobs)
        try:
            list(pool.map(one, todo))
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: end the workers, then stop
            pool.shutdown(wait=False, cancel_futures=True)
            with workers.lock:
                reaper.KEEP.clear()
                reaper.sweep()
            raise
        finally:
            pool.shutdown(wait=True)
    out = []
    for i, sub in enumerate(subs):
        report = reports[i]
        report.update(student=sub.student, exercise=sub.exercise, sha256=sub.sha256)
        out.append(report)
    return out


def _status(report: dict, task: dict) -> str:
    if "error" in report:
        return f"error: {report['error']}"
    if task["graded"]:
        return "graded"
    return f"not graded: {report['status']}"


def gradebook_rows(
    reports: list[dict], students: set[str] = frozenset(), earlier: list[dict] = ()
) -> list[list]:
    """One row per student, exercise and task. A notebook that could not be read
    gets its exercise's tasks (as others' notebooks show them) at zero; an exercise
    that some student handed in and another did not gives the latter rows marked
    "missing", and so does every exercise of a student in `students` (the last
    report's) who hands in nothing now, and every exercise of `earlier` (the last
    report's notebooks) that nobody hands in now: a deleted notebook is missing."""
    tasks_of: dict[str, list[tuple[str, int]]] = {}
    for r in [*reports, *earlier]:  # the tasks as this run's notebooks show them
        if r["tasks"] and r["exercise"] not in tasks_of:
            tasks_of[r["exercise"]] = [(t["task"], t["total"]) for t in r["tasks"]]
    rows = []
    exercises = sorted({r["exercise"] for r in [*reports, *earlier]})
    by_key = {(r["student"], r["exercise"]): r for r in reports}
    for student in sorted({r["student"] for r in reports} | set(students)):
        for exercise in exercises:
            r = by_key.get((student, exercise))
            known = tasks_of.get(exercise) or [("", 0)]
            if r is None:
                rows += [[student, exercise, t, 0, n, "missing"] for t, n in known]
            elif not r["tasks"]:
                status = _status(r, {"graded": False})
                rows += [[student, exercise, t, 0, n, status] for t, n in known]
            else:
                rows += [
                    [
                        student,
                        exercise,
                        t["task"],
                        t["score"],
                        t["total"],
                        _status(r, t),
                    ]
                    for t in r["tasks"]
                ]
    return rows


def _cell(text: str) -> str:
    """Text for a Markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _block(text: str) -> str:
    """Text as a fenced Markdown block (a fence longer than any run of backticks in
    it), so that nothing in it is read as Markdown or HTML."""
    fence = "`" * max(3, max((len(m) for m in re.findall(r"`+", text)), default=0) + 1)
    return f"{fence}\n{text}\n{fence}"


def totals(rows: list[list]) -> dict[tuple[str, str], tuple[int, int]]:
    """(student, exercise) -> (points, max points), from the gradebook's rows."""
    out: dict[tuple[str, str], tuple[int, int]] = {}
    for student, exercise, _, points, total, _ in rows:
        got, most = out.get((student, exercise), (0, 0))
        out[student, exercise] = (got + points, most + total)
    return out


def feedback_page(student: str, reports: list[dict], rows: list[list]) -> str:
    """A student's feedback in Markdown: their points per exercise, then each failed
    check with what went wrong and its hint."""
    mine = {r["exercise"]: r for r in reports if r["student"] == student}
    points = {e: t for (s, e), t in totals(rows).items() if s == student}
    exercises = sorted(points)
    score, total = (sum(t[i] for t in points.values()) for i in (0, 1))
    lines = [MARK, f"# {student}: {score}/{total} points", ""]
    lines += ["| exercise | points | status |", "|---|---|---|"]
    for exercise in exercises:
        r = mine.get(exercise)
        got = "{}/{}".format(*points[exercise])
        status = "not handed in" if r is None else _cell(r["status"])
        lines.append(f"| {_cell(exercise)} | {got} | {status} |")
    for exercise in exercises:
        r = mine.get(exercise)
        if r is None:
            continue
        lines += ["", "## {}: {}/{} points".format(exercise, *points[exercise])]
        if "error" in r:
            lines += ["", "This notebook could not be graded:", "", _block(r["error"])]
        for t in r["tasks"]:
            lines += ["", f"### {t['task']}: {t['score']}/{t['total']} points"]
            if not t["graded"]:
                lines += [
                    "",
                    f"Not graded: its check cell did not run ({r['status']}).",
                ]
                continue
            known = TASKS[t["task"]].checks if t["task"] in TASKS else []
            hints = {c.name: c.hint for c in known}
            for c in t["checks"]:
                if c["passed"]:
                    continue
                lines += ["", f"- **failed** ({c['points']} points): {c['check']}"]
                if c["message"] != NOT_WRITTEN and c["check"] in hints:
                    lines.append(f"  - hint: {hints[c['check']]}")
                if c["message"]:
                    lines += ["", _block(c["message"])]
    return "\n".join(lines) + "\n"


def csv_text(rows: list[list]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(HEADER)
    writer.writerows(rows)
    return out.getvalue()


def is_gradebook(path: Path) -> bool:
    """Whether `path` holds a gradebook this command wrote (its header line)."""
    return first_line(path) == ",".join(HEADER)


def is_feedback(path: Path) -> bool:
    """Whether `path` holds a feedback page this command wrote (its first line)."""
    return first_line(path) in (MARK, EARLIER_MARK)


def summary(reports: list[dict], rows: list[list], seconds: float) -> str:
    """Each student's total, and the counts of the run."""
    points: dict[str, tuple[int, int]] = {}
    for (student, _), (got, most) in totals(rows).items():
        before = points.get(student, (0, 0))
        points[student] = (before[0] + got, before[1] + most)
    width = max([len(s) for s in points] + [7])
    lines = [f"{'student':<{width}}  {'points':>9}  notebooks"]
    for s, (got, most) in sorted(points.items()):
        handed = sum(r["student"] == s for r in reports)
        lines.append(f"{s:<{width}}  {got:>4}/{most:<4}  {handed}")
    graded = sum(not r["reused"] for r in reports)
    failed = sum("error" in r for r in reports)
    lines.append(
        f"{len(reports)} notebooks of {len(points)} students: {graded} graded, "
        f"{len(reports) - graded} unchanged since the last run, {failed} could not be "
        f"graded; {seconds:.1f} s"
    )
    return "\n".join(lines)


def feedback_name(student: str) -> str:
    return f"{student}.md"
