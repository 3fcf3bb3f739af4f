"""Gradescope's side of the grader: the `results.json` an autograder writes (one test
per check, hidden checks shown after the due date) from `smol grade`'s reports, the
checks an instructor hides, and the notebook of one exercise in a student's hand-in
(Gradescope puts whatever the student uploaded under /autograder/submission).

Gradescope's format (gradescope-autograders.readthedocs.io, "Autograder
Specifications"): a top-level `score`, `execution_time` (seconds), `output` (shown to
the student), `visibility` and `stdout_visibility`, and `tests`, each with `name`,
`score`, `max_score`, `status` ("passed" or "failed"), `visibility` and `output`.
"""

from __future__ import annotations

from pathlib import Path

from smol.grading import NOTEBOOKS
from smol.grading.files import read_notebook
from smol.grading.registry import NOT_WRITTEN, TASKS
from smol.grading.runner import GRADE_CALL, exercise_name, topic_tasks

# from the first shown to the last: a hidden check is never shown before the due date
VISIBILITIES = ("visible", "after_due_date", "after_published", "hidden")
GRADED_BY = "smol grade"  # extra_data names the grader: its results are its own


def exercise_stem(name: str) -> str:
    """The exercise `name` stands for: 01_rmsnorm for "01", "1", "rmsnorm" or
    "01_rmsnorm"; ValueError naming the exercises for anything else."""
    for topic, stem in NOTEBOOKS.items():
        number = stem.split("_")[0]
        if name in (topic, stem, number, number.lstrip("0")):
            return stem
    known = ", ".join(NOTEBOOKS.values())
    raise ValueError(f"no exercise {name!r}: name one of {known} (or its number)")


def hidden_checks(specs: list[str]) -> set[tuple[str, str]]:
    """(task, check) of every check that `--hidden TASK` (all its checks) or
    `--hidden TASK/CHECK` (a check's name, or the start of one) names; ValueError
    for a task or check that is not there, or a start that two checks share."""
    out = set()
    for spec in specs:
        name, _, start = spec.partition("/")
        if name not in TASKS:
            raise ValueError(f"--hidden {spec}: no task {name!r}")
        checks = [c.name for c in TASKS[name].checks if c.name.startswith(start)]
        if start and start in checks:
            checks = [start]
        if not checks or (start and len(checks) > 1):
            what = "no check" if not checks else f"{len(checks)} checks"
            raise ValueError(
                f"--hidden {spec}: {what} of {name} start with {start!r} (its checks: "
                + "; ".join(c.name for c in TASKS[name].checks)
                + ")"
            )
        out |= {(name, c) for c in checks}
    return out


def _checks(task: str) -> list:
    return TASKS[task].checks if task in TASKS else []


def _later(a: str, b: str) -> str:
    return max(a, b, key=VISIBILITIES.index)


def _output(passed: bool, hint: str, message: str) -> str:
    """A test's output: on a failure its hint (unless the code is not written yet,
    as the notebook's table shows it) and what went wrong."""
    if passed:
        return ""
    lines = [f"hint: {hint}"] if hint and message != NOT_WRITTEN else []
    return "\n".join(lines + ([f"got: {message}"] if message else []))


def _task_tests(report: dict, task: dict) -> list[dict]:
    """(name, score, max_score, passed, output) of each check of a task's report:
    the checks it ran, or every check of the task at zero where it was not graded."""
    known = {c.name: c for c in _checks(task["task"])}
    if task["graded"]:
        return [
            dict(
                check=c["check"],
                score=c["points"] if c["passed"] else 0,
                max_score=c["points"],
                passed=c["passed"],
                output=_output(
                    c["passed"],
                    known[c["check"]].hint if c["check"] in known else "",
                    c["message"],
                ),
            )
            for c in task["checks"]
        ]
    why = report.get("error") or f"its check cell did not run ({report['status']})"
    checks = [(c.name, c.points) for c in known.values()] or [("", task["total"])]
    return [
        dict(check=name, score=0, max_score=points, passed=False, output=why)
        for name, points in checks
    ]


def results(
    reports: list[dict],
    seconds: float,
    hidden: set[tuple[str, str]] = frozenset(),
    visibility: str = "visible",
) -> dict:
    """Gradescope's results.json of `smol grade`'s notebook reports: a test per check,
    its points as the report has them. A check hidden in the registry or in `hidden`
    is shown after the due date (or later, as `visibility` says); the standard output,
    which shows every check, only to the instructor."""
    tests = []
    lines = []
    for r in reports:
        name = Path(r["notebook"]).name
        lines.append(f"{name}: {r.get('error') or r['status']}")
        for t in r["tasks"]:
            marked = {c.name for c in _checks(t["task"]) if c.hidden}
            for test in _task_tests(r, t):
                check = test.pop("check")
                secret = (t["task"], check) in hidden or check in marked
                shown = _later("after_due_date", visibility) if secret else visibility
                tests.append(
                    {
                        "name": f"{t['task']}: {check}" if check else t["task"],
                        "score": test["score"],
                        "max_score": test["max_score"],
                        "status": "passed" if test["passed"] else "failed",
                        "visibility": shown,
                        "output": test["output"],
                    }
                )
    return {
        "score": sum(t["score"] for t in tests),
        "execution_time": round(seconds),
        "output": "\n".join(lines),
        "output_format": "text",
        "test_output_format": "text",
        "visibility": visibility,
        "stdout_visibility": "hidden",
        "extra_data": {
            "graded_by": GRADED_BY,
            "notebooks": [
                {k: r.get(k) for k in ("notebook", "score", "total", "status")}
                for r in reports
            ],
        },
        "tests": tests,
    }


def find_handin(folder: Path, exercise: str) -> Path:
    """The one notebook of `exercise` (01_rmsnorm) under `folder`: by its name (a
    browser's second download, "01_rmsnorm (1).ipynb", and Colab's "Copy of ..."
    included), else by its check cells (they grade the exercise's tasks), else the
    only notebook there is. ValueError, saying what the folder holds, for none or
    for several."""
    from smol.grading.gradebook import notebooks_under

    notebooks = [p for p in notebooks_under(folder) if "__MACOSX" not in p.parts]
    found = [p for p in notebooks if exercise_name(p) == exercise]
    if not found:
        tasks = set(topic_tasks(Path(f"{exercise}.ipynb")))
        found = [p for p in notebooks if tasks & _graded_tasks(p)]
    if not found and len(notebooks) == 1:
        found = notebooks
    names = ", ".join(str(p.relative_to(folder)) for p in found or notebooks)
    if len(found) > 1:
        raise ValueError(
            f"the submission holds {len(found)} notebooks of {exercise} ({names}): "
            "hand in one"
        )
    if not found:
        held = f"its notebooks: {names}" if names else "no notebook"
        raise ValueError(
            f"the submission holds no notebook of {exercise} ({held}): hand in "
            f"{exercise}.ipynb"
        )
    return found[0]


def _graded_tasks(path: Path) -> set[str]:
    """The tasks a notebook's check cells name (none if it is not a notebook)."""
    try:
        nb = read_notebook(path)
    except ValueError:
        return set()
    return {
        name
        for cell in nb.cells
        if cell.cell_type == "code"
        for name in GRADE_CALL.findall(cell.source)
    }
