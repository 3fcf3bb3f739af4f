"""Grade a generated class with `smol grade --gradebook`, twice, and time it.

    python bench/gradebook.py --csv bench/results/gradebook.csv

The class hands in every exercise of solutions/ once per student: "solved" hands in the
solutions, "untouched" the exercises as generated, "mutant" each solution with its first
solution region raising, and "mixed" a solution where one of four things happened to
it, in turn: the file is cut short, a cell loops forever, a cell starts a process that
leaves its group and parent and rewrites the gradebook once it appears, or the notebook
displays a forged full score and patches the grader in its kernel. The second run
grades nothing (every notebook unchanged). The table holds the wall times, the counts
of the gradebook's statuses and each student's points.
"""

from __future__ import annotations

import argparse
import copy
import csv
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import write_csv  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BEGIN = "### BEGIN SOLUTION"
ESCAPE = """import os, time
def _escape(target):
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            while not os.path.exists(target):
                time.sleep(0.1)
            time.sleep(0.5)
            with open(target, "w") as f:
                f.write("forged")
        os._exit(0)
_escape(GRADEBOOK)"""
FORGE = """from IPython.display import display
import smol.grading as g
for name, t in g.TASKS.items():
    display({g.MIME: {"task": name, "score": t.points, "total": t.points,
                       "counted": True, "error": "", "checks": []}}, raw=True)
    t.checks.clear()"""


def mutant(nb):
    """The solution with its first solution region raising at its start."""
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        if cell.cell_type == "code" and BEGIN in cell.source:
            lines = cell.source.split("\n")
            i = next(k for k, line in enumerate(lines) if line.strip() == BEGIN)
            indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
            lines.insert(i + 1, f'{indent}raise RuntimeError("a mutant")')
            cell.source = "\n".join(lines)
            return nb
    return nb


def mixed(nb, turn: int, gradebook: Path):
    """A solution with one of four mishaps, by `turn`; None for a file cut short."""
    nb = copy.deepcopy(nb)
    kind = turn % 4
    if kind == 0:
        return None
    if kind == 1:
        cell = nbformat.v4.new_code_cell("while True:\n    pass")
    elif kind == 2:
        source = f"GRADEBOOK = {str(gradebook)!r}\n{ESCAPE}"
        cell = nbformat.v4.new_code_cell(source)
    else:
        cell = nbformat.v4.new_code_cell(FORGE)
    nb.cells.insert(len(nb.cells) // 2, cell)
    return nb


def build(folder: Path, gradebook: Path) -> int:
    """Write the class into `folder`; the number of notebooks."""
    solutions = sorted((ROOT / "solutions").glob("*.ipynb"))
    count = 0
    for student in ("solved", "untouched", "mutant", "mixed"):
        (folder / student).mkdir(parents=True)
        for turn, path in enumerate(solutions):
            target = folder / student / path.name
            nb = nbformat.read(path, as_version=4)
            if student == "untouched":
                nb = nbformat.read(ROOT / "exercises" / path.name, as_version=4)
            elif student == "mutant":
                nb = mutant(nb)
            elif student == "mixed":
                nb = mixed(nb, turn, gradebook)
            if nb is None:
                target.write_text(path.read_text()[:500])
            else:
                nbformat.write(nb, target)
            count += 1
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count())
    parser.add_argument("--cell-timeout", default="60")
    parser.add_argument("--csv", default="bench/results/gradebook.csv")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="smol-class-") as tmp:
        tmp = Path(tmp)
        grades, feedback = tmp / "grades.csv", tmp / "feedback"
        notebooks = build(tmp / "submissions", grades)
        command = [sys.executable, "-m", "smol", "grade", str(tmp / "submissions")]
        command += ["--gradebook", str(grades), "--feedback", str(feedback)]
        command += ["--jobs", str(args.jobs), "--cell-timeout", args.cell_timeout]
        times = []
        for _ in range(2):
            start = time.monotonic()
            subprocess.run(command, check=True, cwd=ROOT)
            times.append(time.monotonic() - start)
        time.sleep(2)  # an escaped process would have rewritten the gradebook
        intact = grades.read_text().startswith("student,exercise,task,")
        with open(grades, newline="") as f:
            rows = list(csv.DictReader(f)) if intact else []
        pages = len(list(feedback.glob("*.md")))
    statuses = Counter(r["status"].split(":")[0] for r in rows)
    points = Counter()
    for r in rows:
        points[r["student"], "points"] += int(r["points"])
        points[r["student"], "max"] += int(r["max_points"])
    table = [
        ["notebooks", notebooks],
        ["students", 4],
        ["jobs", args.jobs],
        ["CPU cores", os.cpu_count()],
        ["seconds, first run", f"{times[0]:.0f}"],
        ["seconds, second run (nothing changed)", f"{times[1]:.1f}"],
        ["gradebook intact after the run", "yes" if intact else "no"],
        ["gradebook rows", len(rows)],
        *[[f"rows {status}", n] for status, n in sorted(statuses.items())],
        ["feedback pages", pages],
        *[
            [f"points of {s}", f"{points[s, 'points']}/{points[s, 'max']}"]
            for s in ("solved", "untouched", "mutant", "mixed")
        ],
    ]
    for name, value in table:
        print(f"{name:<40} {value}")
    write_csv(args.csv, ["quantity", "value"], table)


if __name__ == "__main__":
    main()
