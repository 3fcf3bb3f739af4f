"""The class's gradebook in other tools' columns, made from its rows (student,
exercise, task, points, max_points, status), so that every export adds up the same
points: nbgrader's `nbgrader export` CSV (one row per exercise and student) and a CSV
that Canvas's gradebook import takes (one row per student, one column per exercise).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from smol.grading.files import first_line
from smol.grading.gradebook import totals

# nbgrader's CsvExportPlugin (nbgrader/plugins/export.py), in its order
NBGRADER = [
    "assignment",
    "duedate",
    "timestamp",
    "student_id",
    "last_name",
    "first_name",
    "email",
    "raw_score",
    "late_submission_penalty",
    "score",
    "max_score",
]
# the columns before the assignments in Canvas's gradebook export and import
CANVAS = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
# the second row of Canvas's export, which its import reads back: each maximum
POINTS_POSSIBLE = "    Points Possible"


def _csv(header: list[str], rows: list[list]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return out.getvalue()


def nbgrader_csv(rows: list[list]) -> str:
    """nbgrader's export: a row per exercise (its assignment) and student, in its
    order (assignments, then students), scores as its floats. smol knows no due date,
    time of hand-in, names or e-mail addresses (left empty, as nbgrader leaves what it
    lacks), nor a late penalty (0.0): score is the raw score. A notebook not handed
    in scores 0.0, as in nbgrader."""
    points_of = totals(rows)
    out = []
    for exercise in sorted({e for _, e in points_of}):
        for student in sorted({s for s, _ in points_of}):
            got, most = points_of[student, exercise]
            points = [float(got), 0.0, float(got), float(most)]
            out.append([exercise, "", "", student, "", "", "", *points])
    return _csv(NBGRADER, out)


def canvas_csv(rows: list[list]) -> str:
    """Canvas's gradebook import: a column per exercise (a name Canvas does not know
    makes a new assignment) after Canvas's five columns, the points possible, then a
    row per student. The student's name (their folder's) goes in Student and SIS
    Login ID, which Canvas matches students by; ID, SIS User ID and Section stay
    empty."""
    points_of = totals(rows)
    exercises = sorted({e for _, e in points_of})
    students = sorted({s for s, _ in points_of})
    most = [max(points_of[s, e][1] for s in students) for e in exercises]
    out = [[POINTS_POSSIBLE, "", "", "", "", *most]]
    for student in students:
        points = [points_of[student, e][0] for e in exercises]
        out.append([student, "", "", student, "", *points])
    return _csv(CANVAS + exercises, out)


def is_nbgrader_export(path: Path) -> bool:
    """Whether `path` holds an export of nbgrader's columns (its header line)."""
    return first_line(path) == ",".join(NBGRADER)


def is_canvas_export(path: Path) -> bool:
    """Whether `path` holds a Canvas import file (its five columns first)."""
    line = first_line(path)
    return line is not None and line.startswith(",".join(CANVAS))
