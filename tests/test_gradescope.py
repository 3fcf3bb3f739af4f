"""Running the course elsewhere: Gradescope's results.json (checked against a schema
written from Gradescope's autograder specification), the autograder zip run in a
simulated /autograder, hidden checks (the student's view leaves them out, the
instructor's counts them), nbgrader's and Canvas's exports, and one small class that
scores the same through every path."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import jsonschema
import nbformat
import pytest
import torch

from smol.grading import TASKS, core, grade, registry, run_checks
from smol.grading.checks._util import close
from smol.grading.exports import CANVAS, NBGRADER, canvas_csv, nbgrader_csv
from smol.grading.gradescope import (
    exercise_stem,
    find_handin,
    hidden_checks,
    results,
)
from smol.grading.registry import NOT_WRITTEN
from tests.nbtools import ROOT, pinned_torch

SOLVED = ROOT / "solutions" / "01_rmsnorm.ipynb"
# Gradescope's results.json, as its autograder specification documents it
# (gradescope-autograders.readthedocs.io/en/latest/specs/): every key it names, no
# other; the keys smol always writes are required.
VISIBILITY = {"enum": ["hidden", "after_due_date", "after_published", "visible"]}
FORMAT = {"enum": ["text", "simple_format", "html", "md", "ansi"]}
TEST = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "score", "max_score", "status", "visibility", "output"],
    "properties": {
        "score": {"type": "number", "minimum": 0},
        "max_score": {"type": "number", "minimum": 0},
        "status": {"enum": ["passed", "failed"]},
        "name": {"type": "string", "minLength": 1},
        "name_format": FORMAT,
        "number": {"type": "string"},
        "output": {"type": "string"},
        "output_format": FORMAT,
        "tags": {"type": "array", "items": {"type": "string"}},
        "visibility": VISIBILITY,
        "extra_data": {"type": "object"},
    },
}
RESULTS = {
    "type": "object",
    "additionalProperties": False,
    "required": [
        "score",
        "execution_time",
        "output",
        "visibility",
        "stdout_visibility",
        "tests",
    ],
    "properties": {
        "score": {"type": "number", "minimum": 0},
        "execution_time": {"type": "integer", "minimum": 0},
        "output": {"type": "string"},
        "output_format": FORMAT,
        "test_output_format": FORMAT,
        "test_name_format": FORMAT,
        "visibility": VISIBILITY,
        "stdout_visibility": VISIBILITY,
        "extra_data": {"type": "object"},
        "tests": {"type": "array", "items": TEST},
        "leaderboard": {"type": "array"},
    },
}


def valid_results(data: dict) -> dict:
    """`data`, once checked against the schema and Gradescope's arithmetic: the
    score is the tests' sum, each test's score lies in [0, max_score], and a test
    passes exactly when it earns its points."""
    jsonschema.validate(data, RESULTS)
    assert data["score"] == sum(t["score"] for t in data["tests"])
    for t in data["tests"]:
        assert 0 <= t["score"] <= t["max_score"], t
        assert (t["status"] == "passed") == (t["score"] == t["max_score"]), t
    return data


# --- a task with a hidden check (registered here; --tasks tests.test_gradescope) -----

registry.task("hidden_cumsum", "grader_tests", "cumsum(x), one check hidden")


def _judge_values(inputs, out):
    close(out, inputs["x"].cumsum(-1), "cumsum(x)")


def _judge_dtype(inputs, out):
    assert out.dtype == torch.bfloat16, f"bfloat16 in gave {out.dtype} out"


registry.probe_check(
    "hidden_cumsum",
    "values",
    2,
    "add up along the last dimension",
    inputs=lambda: {"x": torch.randn(3, 5)},
    judge=_judge_values,
)(lambda f, inputs: f(inputs["x"]))
registry.probe_check(
    "hidden_cumsum",
    "bfloat16 in, bfloat16 out",
    1,
    "keep the dtype",
    inputs=lambda: {"h": torch.randn(2, 4).to(torch.bfloat16)},
    judge=_judge_dtype,
    hidden=True,
)(lambda f, inputs: f(inputs["h"]))


def upcast(x):  # right values, float32 out: fails the hidden check only
    return x.float().cumsum(-1)


def _env() -> dict:
    """An environment in which `smol grade` and its kernels import this module."""
    paths = [str(ROOT), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def smol_grade(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "smol", "grade", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
        env=_env(),
    )


def test_the_students_view_leaves_a_hidden_check_out(capsys):
    """grade() in a notebook neither runs nor shows the hidden check, nor counts its
    point; the instructor's run_checks (as smol grade) runs and counts it."""
    grade("hidden_cumsum", upcast)
    shown = capsys.readouterr().out
    assert "hidden_cumsum: 2/2 points" in shown and "bfloat16" not in shown, shown
    student = core.RESULTS["hidden_cumsum"]
    assert [r.check for r in student.rows] == ["values"]
    assert (student.score, student.total) == (2, 2)
    core.summary("grader_tests")
    assert "hidden_cumsum    2/2" in capsys.readouterr().out
    everything = run_checks("hidden_cumsum", upcast)
    assert (everything.score, everything.total) == (2, 3), everything.table()
    assert TASKS["hidden_cumsum"].points == 3
    assert TASKS["hidden_cumsum"].shown_points == 2
    # nothing of the course is hidden: the stored notebooks' totals stand
    assert all(
        not c.hidden
        for t in TASKS.values()
        for c in t.checks
        if t.notebook != "grader_tests"
    )


def test_the_instructors_view_counts_a_hidden_check(tmp_path):
    """smol grade counts the hidden check (2/3 for code that fails it), and its
    results.json shows that test after the due date, the others always."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(s)
        for s in (
            "from smol.grading import grade\nimport torch",
            "def cumsum(x):\n    return x.float().cumsum(-1)",
            'grade("hidden_cumsum", cumsum)',
        )
    ]
    path = tmp_path / "hw.ipynb"
    nbformat.write(nb, path)
    out = tmp_path / "results.json"
    done = smol_grade(
        str(path),
        "--format",
        "gradescope",
        "--json",
        str(out),
        "--tasks",
        "tests.test_gradescope",
        "--cell-timeout",
        "60",
    )
    assert done.returncode == 0, done.stderr
    data = valid_results(json.loads(out.read_text()))
    tests = {t["name"]: t for t in data["tests"]}
    assert data["score"] == 2 and sum(t["max_score"] for t in tests.values()) == 3
    hidden = tests["hidden_cumsum: bfloat16 in, bfloat16 out"]
    assert (hidden["status"], hidden["visibility"]) == ("failed", "after_due_date")
    assert hidden["output"].startswith("hint: keep the dtype\ngot: ")
    assert tests["hidden_cumsum: values"]["visibility"] == "visible"
    assert data["stdout_visibility"] == "hidden"  # the table shows every check


# --- results.json from reports ---------------------------------------------------


def _report(tasks: list[dict], **more) -> dict:
    return {
        "notebook": "/x/01_rmsnorm.ipynb",
        "score": sum(t["score"] for t in tasks),
        "total": sum(t["total"] for t in tasks),
        "status": "ok",
        "seconds": 3.4,
        "tasks": tasks,
        **more,
    }


def _task(name: str, failing: dict[str, str], graded: bool = True) -> dict:
    """A task's report, the checks in `failing` failed with their messages."""
    checks = [
        {
            "check": c.name,
            "points": c.points,
            "passed": c.name not in failing,
            "message": failing.get(c.name, ""),
        }
        for c in TASKS[name].checks
    ]
    score = sum(c["points"] for c in checks if c["passed"])
    return {
        "task": name,
        "score": score if graded else 0,
        "total": TASKS[name].points,
        "graded": graded,
        "checks": checks if graded else [],
    }


def test_results_hold_a_test_per_check_with_the_hint_of_each_failure():
    first, second = (c.name for c in TASKS["rms"].checks[:2])
    rms = _task("rms", {first: "shape (2, 3) != (2, 1)", second: NOT_WRITTEN})
    bug = _task("rmsnorm_bug", {}, graded=False)
    report = _report([rms, bug], status="ran, 1 cell raised")
    data = valid_results(results([report], 3.4))
    tests = {t["name"]: t for t in data["tests"]}
    assert len(tests) == len(TASKS["rms"].checks) + len(TASKS["rmsnorm_bug"].checks)
    assert data["score"] == report["score"] and data["execution_time"] == 3
    hint = TASKS["rms"].checks[0].hint
    assert (
        tests[f"rms: {first}"]["output"] == f"hint: {hint}\ngot: shape (2, 3) != (2, 1)"
    )
    # code not written yet: no hint, as the notebook's table shows it
    assert tests[f"rms: {second}"]["output"] == f"got: {NOT_WRITTEN}"
    for c in TASKS["rmsnorm_bug"].checks:  # its check cell never ran: all at zero
        t = tests[f"rmsnorm_bug: {c.name}"]
        assert (t["score"], t["max_score"], t["status"]) == (0, c.points, "failed")
        assert "did not run (ran, 1 cell raised)" in t["output"]
    assert data["output"] == "01_rmsnorm.ipynb: ran, 1 cell raised"


def test_hidden_tests_are_shown_no_sooner_than_the_rest():
    report = _report([_task("rms", {})])
    secret = hidden_checks(["rms/eps"])
    assert len(secret) == 1
    for top, hidden in (
        ("visible", "after_due_date"),
        ("after_published", "after_published"),
        ("hidden", "hidden"),
    ):
        data = valid_results(results([report], 1.0, secret, top))
        shown = {
            t["visibility"] for t in data["tests"] if t["name"].startswith("rms: eps")
        }
        rest = {
            t["visibility"]
            for t in data["tests"]
            if not t["name"].startswith("rms: eps")
        }
        assert (shown, rest, data["visibility"]) == ({hidden}, {top}, top)


def test_hidden_names_a_task_or_the_start_of_one_check():
    assert hidden_checks(["rmsnorm_bug"]) == {
        ("rmsnorm_bug", c.name) for c in TASKS["rmsnorm_bug"].checks
    }
    with pytest.raises(ValueError, match="no task 'rmss'"):
        hidden_checks(["rmss"])
    with pytest.raises(ValueError, match="no check of rms start with 'zz'"):
        hidden_checks(["rms/zz"])
    with pytest.raises(ValueError, match="2 checks of rmsnorm start with 'float'"):
        hidden_checks(["rmsnorm/float"])
    assert hidden_checks(["rmsnorm/float16"]) == {("rmsnorm", FLOAT16.name)}


def test_an_exercise_is_named_by_number_topic_or_stem():
    assert {exercise_stem(n) for n in ("01", "1", "rmsnorm", "01_rmsnorm")} == {
        "01_rmsnorm"
    }
    with pytest.raises(ValueError, match="no exercise '17'"):
        exercise_stem("17")


def test_the_hand_in_is_found_by_name_then_by_its_check_cells(tmp_path):
    sub = tmp_path / "submission"
    (sub / "__MACOSX").mkdir(parents=True)
    shutil.copy(SOLVED, sub / "__MACOSX" / "01_rmsnorm.ipynb")  # macOS's zip junk
    (sub / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match=r"no notebook of 01_rmsnorm \(no notebook\)"):
        find_handin(sub, "01_rmsnorm")
    shutil.copy(SOLVED, sub / "Copy of 01_rmsnorm.ipynb")  # Colab's name
    assert find_handin(sub, "01_rmsnorm") == sub / "Copy of 01_rmsnorm.ipynb"
    (sub / "Copy of 01_rmsnorm.ipynb").rename(sub / "homework.ipynb")
    shutil.copy(ROOT / "solutions" / "02_rope.ipynb", sub / "rope.ipynb")
    assert find_handin(sub, "01_rmsnorm") == sub / "homework.ipynb"  # its checks
    (sub / "homework.ipynb").rename(sub / "01_rmsnorm.ipynb")
    shutil.copy(SOLVED, sub / "01_rmsnorm (1).ipynb")  # a second download
    with pytest.raises(ValueError, match="holds 2 notebooks of 01_rmsnorm") as refused:
        find_handin(sub, "01_rmsnorm")
    assert str(refused.value).endswith("hand in one")


# --- exports ---------------------------------------------------------------------

ROWS = [
    ["ada", "01_rmsnorm", "rms", 4, 4, "graded"],
    ["ada", "01_rmsnorm", "rmsnorm", 3, 7, "graded"],
    ["ada", "02_rope", "rope", 0, 9, "missing"],
    ["bob", "01_rmsnorm", "rms", 0, 4, "error: x.ipynb is empty, not a notebook"],
    ["bob", "01_rmsnorm", "rmsnorm", 0, 7, "error: x.ipynb is empty, not a notebook"],
    ["bob", "02_rope", "rope", 9, 9, "graded"],
]


def _table(text: str) -> list[dict]:
    return list(csv.DictReader(io.StringIO(text)))


def test_the_nbgrader_export_has_its_columns_and_the_gradebooks_points():
    text = nbgrader_csv(ROWS)
    assert text.splitlines()[0].split(",") == NBGRADER
    rows = _table(text)
    # nbgrader's order: each assignment, then each student
    assert [(r["assignment"], r["student_id"]) for r in rows] == [
        ("01_rmsnorm", "ada"),
        ("01_rmsnorm", "bob"),
        ("02_rope", "ada"),
        ("02_rope", "bob"),
    ]
    got = [(r["raw_score"], r["score"], r["max_score"]) for r in rows]
    assert got == [
        ("7.0", "7.0", "11.0"),
        ("0.0", "0.0", "11.0"),
        ("0.0", "0.0", "9.0"),
        ("9.0", "9.0", "9.0"),
    ]
    assert {r["late_submission_penalty"] for r in rows} == {"0.0"}


def test_the_canvas_import_has_a_column_per_exercise_and_the_gradebooks_points():
    text = canvas_csv(ROWS)
    header = text.splitlines()[0].split(",")
    assert header == CANVAS + ["01_rmsnorm", "02_rope"]
    lines = list(csv.reader(io.StringIO(text)))
    assert lines[1] == ["    Points Possible", "", "", "", "", "11", "9"]
    assert lines[2:] == [
        ["ada", "", "", "ada", "", "7", "0"],
        ["bob", "", "", "bob", "", "0", "9"],
    ]


# --- the autograder zip --------------------------------------------------------------


def test_the_autograder_installs_the_pinned_cpu_torch_and_the_course_pins(tmp_path):
    """What setup.sh installs, read (the test installs nothing): the Makefile's
    torch as the CPU wheel, smol from the source in the zip, requirements.txt's
    pins; both scripts executable, at the root of the zip."""
    out = tmp_path / "autograder.zip"
    done = smol_grade("01", "--autograder", str(out), "--hidden", "rmsnorm_bug")
    assert done.returncode == 0, done.stderr
    with zipfile.ZipFile(out) as zf:
        setup = zf.read("setup.sh").decode()
        run = zf.read("run_autograder").decode()
        pins = zf.read("constraints.txt").decode().split()
        for name in ("setup.sh", "run_autograder"):
            assert zf.getinfo(name).external_attr >> 16 & stat.S_IXUSR, name
        names = set(zf.namelist())
    torch_pin = (
        f"torch=={pinned_torch()} --index-url https://download.pytorch.org/whl/cpu"
    )
    assert torch_pin in setup
    assert '-c "$source_dir/constraints.txt" "$source_dir/smol-source"' in setup
    assert "nbclient==0.11.0" in pins and "cloudpickle==3.1.3" in pins
    assert not any(p.startswith("torch==") for p in pins)
    assert {"smol-source/pyproject.toml", "smol-source/smol/grading/runner.py"} <= names
    assert not any("__pycache__" in n for n in names)
    assert "--exercise 01_rmsnorm" in run and "--hidden=rmsnorm_bug" in run
    # built twice, the same bytes
    again = tmp_path / "again.zip"
    assert smol_grade("01", "--autograder", str(again)).returncode == 0
    assert smol_grade("01", "--autograder", str(out)).returncode == 0  # its own file
    assert again.read_bytes() == out.read_bytes()


def test_the_grader_needs_nothing_the_autograder_leaves_out():
    """setup.sh installs smol without its notebooks extra: the grader and every
    check import none of it (a fresh process, as run_autograder starts)."""
    extra = ("transformers", "peft", "trl", "datasets", "pyarrow", "pandas")
    code = (
        "import sys, smol.commands.grade, smol.grading.gradebook\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({extra!r})))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300
    )
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


# --- one class, every path -----------------------------------------------------------


def _mutant() -> nbformat.NotebookNode:
    """Exercise 1 solved but for RMSNorm's float32 upcast (tests/test_grading.py's
    "missing fp32 upcast" mutant)."""
    nb = nbformat.read(SOLVED, as_version=4)
    cell = next(c for c in nb.cells if c.source.startswith("class RMSNorm(nn.Module)"))
    cell.source = (
        "class RMSNorm(nn.Module):\n"
        "    def __init__(self, dim, eps=1e-5):\n"
        "        super().__init__()\n"
        "        self.eps = eps\n"
        "        self.weight = nn.Parameter(torch.ones(dim))\n\n"
        "    def forward(self, x):\n"
        "        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)\n"
        "        return self.weight * x"
    )
    return nb


def _broken() -> nbformat.NotebookNode:
    """Exercise 1 with a syntax error in rms and a cell that raises in RMSNormFixed."""
    nb = nbformat.read(SOLVED, as_version=4)
    for cell in nb.cells:
        if cell.source.startswith("def rms("):
            cell.source = "def rms(x, eps=1e-5):\n    return torch.sqrt("
        if cell.source.startswith("class RMSNormFixed("):
            cell.source = 'raise RuntimeError("not today")'
    return nb


FLOAT16, GENERATED = (
    next(c for c in TASKS["rmsnorm"].checks if c.name.startswith(start))
    for start in ("float16 activations", "generated inputs")
)
# the mutant fails both: the targeted float16 check and the differential one
MUTANT_FAILS = [f"rmsnorm: {c.name}" for c in (FLOAT16, GENERATED)]
TOTAL = sum(TASKS[t].points for t in ("rms", "rmsnorm", "rmsnorm_bug"))
EXPECTED = {  # student -> the points each path must give exercise 1
    "solved": TOTAL,
    "mutant": TOTAL - FLOAT16.points - GENERATED.points,
    "broken": TASKS["rmsnorm"].points,
    "absent": 0,
}


@pytest.fixture(scope="module")
def one_class(tmp_path_factory):
    """A class graded four ways: the gradebook (with its exports), smol grade over
    the notebooks, and the autograder zip run on each hand-in in a simulated
    /autograder."""
    tmp = tmp_path_factory.mktemp("class")
    subs = tmp / "submissions"
    for student, nb in (("solved", None), ("mutant", _mutant()), ("broken", _broken())):
        (subs / student).mkdir(parents=True)
        path = subs / student / "01_rmsnorm.ipynb"
        shutil.copy(SOLVED, path) if nb is None else nbformat.write(nb, path)
    (subs / "absent").mkdir()  # a folder without a notebook: hands in nothing
    book = smol_grade(
        str(subs),
        "--gradebook",
        str(tmp / "grades.csv"),
        "--nbgrader",
        str(tmp / "nbgrader.csv"),
        "--canvas",
        str(tmp / "canvas.csv"),
        "--jobs",
        "2",
    )
    notebooks = [
        str(subs / s / "01_rmsnorm.ipynb") for s in ("solved", "mutant", "broken")
    ]
    direct = smol_grade(*notebooks, "--json", str(tmp / "report.json"))
    zip_path = tmp / "autograder.zip"
    built = smol_grade("01", "--autograder", str(zip_path))
    assert built.returncode == 0, built.stderr
    gradescope = {}
    for student in ("solved", "mutant", "broken", "absent", "junk"):
        root = tmp / f"autograder-{student}"  # Gradescope's layout
        with zipfile.ZipFile(zip_path) as zf:
            zf.extractall(root / "source")
        shutil.copy(root / "source" / "run_autograder", root / "run_autograder")
        (root / "submission" / "upload").mkdir(parents=True)
        if student == "junk":
            (root / "submission" / "01_rmsnorm.ipynb").write_text('{"cells": [')
        for nb in (subs / student).glob("*.ipynb"):
            shutil.copy(nb, root / "submission" / "upload" / "my work.ipynb")
        env = {
            **_env(),
            "SMOL_AUTOGRADER_ROOT": str(root),
            "SMOL_AUTOGRADER_PYTHON": sys.executable,
        }
        ran = subprocess.run(
            ["bash", str(root / "run_autograder")],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=root,
            env=env,
        )
        assert ran.returncode == 0, ran.stdout + ran.stderr
        gradescope[student] = json.loads(
            (root / "results" / "results.json").read_text()
        )
    return tmp, book, direct, gradescope


def test_every_path_gives_a_class_the_same_points(one_class):
    tmp, book, direct, gradescope = one_class
    assert book.returncode == 0, book.stderr
    assert "absent/ holds no notebook" in book.stderr
    assert direct.returncode == 0, direct.stderr
    rows = list(csv.reader(io.StringIO((tmp / "grades.csv").read_text())))[1:]
    by_book = {}
    for student, _, _, points, _, _ in rows:
        by_book[student] = by_book.get(student, 0) + int(points)
    report = json.loads((tmp / "report.json").read_text())["notebooks"]
    by_grade = {Path(n["notebook"]).parent.name: n["score"] for n in report}
    by_gradescope = {s: valid_results(r)["score"] for s, r in gradescope.items()}
    nbgrader = {
        r["student_id"]: float(r["score"])
        for r in _table((tmp / "nbgrader.csv").read_text())
    }
    canvas = list(csv.reader(io.StringIO((tmp / "canvas.csv").read_text())))
    by_canvas = {r[0]: int(r[5]) for r in canvas[2:]}
    assert by_book == by_canvas == EXPECTED
    assert nbgrader == {s: float(p) for s, p in EXPECTED.items()}
    assert by_grade == {s: p for s, p in EXPECTED.items() if s != "absent"}
    assert {s: by_gradescope[s] for s in EXPECTED} == EXPECTED
    assert by_gradescope["junk"] == 0
    # the exports say the gradebook's maximum too
    assert canvas[1][5] == str(TOTAL)
    assert {r["max_score"] for r in _table((tmp / "nbgrader.csv").read_text())} == {
        f"{TOTAL}.0"
    }


def test_the_autograder_writes_results_for_any_hand_in(one_class):
    _, _, _, gradescope = one_class
    names = {c.name for t in ("rms", "rmsnorm", "rmsnorm_bug") for c in TASKS[t].checks}
    for student, data in gradescope.items():
        assert {t["name"].split(": ", 1)[1] for t in data["tests"]} == names, student
        assert sum(t["max_score"] for t in data["tests"]) == TOTAL, student
    mutant = [t for t in gradescope["mutant"]["tests"] if t["status"] == "failed"]
    assert [t["name"] for t in mutant] == MUTANT_FAILS
    assert mutant[0]["output"].startswith(f"hint: {FLOAT16.hint}")
    assert "holds no notebook of 01_rmsnorm" in gradescope["absent"]["output"]
    assert "is not a notebook (invalid JSON" in gradescope["junk"]["output"]
    # rms's cell, its check cell (rms is not defined), the raise, the bug's check cell
    assert gradescope["broken"]["output"] == "my work.ipynb: ran, 4 cells raised"
