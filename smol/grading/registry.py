"""What the grader knows: the registry of tasks and their checks, and the result of
running a task's checks, as a table for the terminal, HTML for a notebook, and JSON for
`smol grade`.

A check (`probe_check`) splits running from judging: `inputs()` chooses the data
(grader side), `probe(obj, inputs)` runs the student's code on it and returns plain data
(tensors, numbers, strings; `smol.grading.plain`) from a process of its own, and
`judge(inputs, outputs)` decides (grader side), never touching the student's object.
The modules of `smol.grading.checks` register theirs with `task` and `probe_check`.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any, Callable

# the machine-readable result that `smol grade` reads
MIME = "application/vnd.smol.grade+json"
DEFAULT_TIMEOUT = 10.0  # seconds per check
# the message of a stub that was called; its hint stays hidden
NOT_WRITTEN = "NotImplementedError: not written yet"


@dataclass(frozen=True)
class Check:
    task: str
    name: str
    points: int
    hint: str
    # inputs() -> plain data; probe(obj, inputs) -> plain data, in the student's
    # process; judge(inputs, outputs) raises AssertionError on a failure
    inputs: Callable[[], Any]
    probe: Callable[[Any, Any], Any]
    judge: Callable[[Any, Any], None]
    # hidden from the student: `grade` in a notebook neither runs nor shows it, and
    # Gradescope shows it after the due date; `smol grade` runs and counts it
    hidden: bool = False


@dataclass
class Task:
    name: str
    notebook: str  # the topic (solutions/NN_<topic>.ipynb) the task belongs to
    title: str
    checks: list[Check] = field(default_factory=list)
    # Run once per process before the task's checks: slow lazy imports (AdamW's first
    # use imports torch._dynamo, seconds) then happen once, outside every check's time
    # limit, whether the checks run in forked children or in this process.
    warm_up: Callable[[], None] | None = None

    @property
    def points(self) -> int:
        return sum(c.points for c in self.checks)

    @property
    def shown_points(self) -> int:
        """The points of the checks a student sees (not hidden)."""
        return sum(c.points for c in self.checks if not c.hidden)


TASKS: dict[str, Task] = {}


def task(
    name: str, notebook: str, title: str, warm_up: Callable[[], None] | None = None
) -> Task:
    if name in TASKS:
        raise ValueError(f"task {name!r} is registered twice")
    TASKS[name] = Task(name, notebook, title, warm_up=warm_up)
    return TASKS[name]


def probe_check(
    task_names: str | tuple[str, ...],
    name: str,
    points: int,
    hint: str,
    *,
    judge: Callable[[Any, Any], None],
    inputs: Callable[[], Any] = lambda: None,
    hidden: bool = False,
):
    """Decorator: register `probe(obj, inputs)` as the half of a check that runs the
    student's object, with `inputs()` choosing its data (none by default) and
    `judge(inputs, outputs)` deciding. Inputs and outputs are plain data
    (`smol.grading.plain`). The module that registers the check must be importable:
    `smol grade` imports it in the notebook's kernel to run the probe
    there. A `hidden` check is left out of the student's `grade`."""
    names = (task_names,) if isinstance(task_names, str) else task_names

    def register(probe):
        for t in names:
            TASKS[t].checks.append(
                Check(t, name, points, hint, inputs, probe, judge, hidden)
            )
        return probe

    return register


@dataclass
class Row:
    check: str
    points: int
    earned: int
    passed: bool
    hint: str
    message: str = ""


# plain words, not emoji: they need no emoji font to show
PASS_HTML = "<span style='color:#1a7f37'>pass</span>"
FAIL_HTML = "<span style='color:#cf222e;font-weight:bold'>FAIL</span>"
LEFT = "style='text-align:left'"


@dataclass
class Result:
    task: str
    rows: list[Row]
    error: str = ""  # a problem with the call itself (an unknown task name)

    @property
    def score(self) -> int:
        return sum(r.earned for r in self.rows)

    @property
    def total(self) -> int:
        if self.rows or not self.error:
            return sum(r.points for r in self.rows)
        return TASKS[self.task].points if self.task in TASKS else 0

    def to_json(self) -> dict:
        checks = [
            {
                "check": r.check,
                "points": r.points,
                "passed": r.passed,
                "message": r.message,
            }
            for r in self.rows
        ]
        return {
            "task": self.task,
            "score": self.score,
            "total": self.total,
            "checks": checks,
            "error": self.error,
        }

    def table(self, hints: bool = True) -> str:
        lines = [f"{self.task}: {self.score}/{self.total} points"]
        if self.error:
            return lines[0] + "\n  " + self.error
        width = max(len(r.check) for r in self.rows) if self.rows else 5
        for r in self.rows:
            mark = "pass" if r.passed else "FAIL"
            line = f"  {mark}  {r.earned}/{r.points}  {r.check:<{width}}"
            if not r.passed:
                if hints and r.message != NOT_WRITTEN:
                    line += f"\n              hint: {r.hint}"
                if r.message:
                    line += f"\n              got:  {r.message}"
            lines.append(line)
        return "\n".join(line.rstrip() for line in "\n".join(lines).split("\n"))

    def html(self, hints: bool = True) -> str:
        head = f"<b>{html.escape(self.task)}: {self.score}/{self.total} points</b>"
        if self.error:
            return head + f"<br><code>{html.escape(self.error)}</code>"
        rows = []
        for r in self.rows:
            notes = []
            if not r.passed and hints and r.message != NOT_WRITTEN:
                notes.append(html.escape(r.hint))
            if not r.passed and r.message:
                notes.append(f"<code>{html.escape(r.message)}</code>")
            rows.append(
                f"<tr><td>{PASS_HTML if r.passed else FAIL_HTML}</td>"
                f"<td>{r.earned}/{r.points}</td>"
                f"<td {LEFT}>{html.escape(r.check)}</td>"
                f"<td {LEFT}>{'<br>'.join(notes)}</td></tr>"
            )
        last = "hint" if hints else "what went wrong"
        return (
            f"{head}<table><tr><th></th><th>points</th><th {LEFT}>check</th>"
            f"<th {LEFT}>{last}</th></tr>{''.join(rows)}</table>"
        )
