"""The one command line, `smol VERB` (smol/commands/): the console script that
pyproject.toml declares lists every verb; each verb's `--help` has the same shape and
each verb's usage error is one line with exit status 2, through that script; and every
`smol` command that the README, CONTRIBUTING.md, the book's pages and the chapters show
parses as written."""

from __future__ import annotations

import importlib
import os
import re
import shlex
import subprocess
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

import nbformat
import pytest

from smol.commands import VERBS
from smol.commands.common import EXIT_STATUS, UsageError

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(sysconfig.get_path("scripts")) / "smol"
# Each verb's usage error, found before anything is loaded.
USAGE_ERRORS = {
    "generate": (["generate", ""], "the prompt is empty"),
    "chat": (["chat", "Hi", "--top-p", "2"], "--top-p must lie in (0, 1], got 2.0"),
    "train": (["train", "--set", "layers=2"], "unknown model setting 'layers'"),
    "finetune": (["finetune"], "the following arguments are required: --data"),
    "dpo": (["dpo", "--data", "p.jsonl", "--beta", "0"], "--beta must be between"),
    "grpo": (["grpo", "--task", "divide"], "--task: unknown task 'divide'"),
    "eval": (["eval", "mmlu", "--limit", "0"], "--limit must be >= 1, got 0"),
    "export": (["export", "smollm2", "model.bin"], "OUT must end in .gguf"),
    "grade": (["grade", "no-such-folder"], "neither a folder nor a notebook"),
}
OLD_FORMS = re.compile(r"-m smol\.(train|finetune|eval|export|grade)\b|smol\.__main__")


def smol(*argv: str) -> subprocess.CompletedProcess:
    """The console script, on this checkout's code."""
    if not SCRIPT.exists():
        pytest.fail(
            f"no console script {SCRIPT}: install the package (`make setup`, or "
            "`pip install -e .`) so that pyproject.toml's [project.scripts] is made"
        )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [str(SCRIPT), *argv], capture_output=True, text=True, env=env, timeout=120
    )


def test_the_console_script_is_the_one_pyproject_declares():
    pyproject = (ROOT / "pyproject.toml").read_text()
    scripts = re.search(r"(?ms)^\[project\.scripts\]\n(.*?)^$", pyproject)[1]
    assert scripts == 'smol = "smol.commands:main"\n'

    installed = metadata.entry_points(group="console_scripts", name="smol")
    assert [e.value for e in installed] == ["smol.commands:main"], (
        "reinstall the package (`make setup`): its `smol` script is not pyproject's"
    )
    assert smol("--help").returncode == 0


def test_smol_help_lists_every_verb_and_python_m_smol_says_the_same():
    listed = smol("--help")
    assert listed.returncode == 0 and listed.stderr == ""
    verbs = re.findall(r"^  (\w+)  ", listed.stdout, re.M)
    assert (
        verbs
        == list(VERBS)
        == [
            "generate",
            "chat",
            "train",
            "finetune",
            "dpo",
            "grpo",
            "eval",
            "export",
            "grade",
        ]
    )
    module = subprocess.run(
        [sys.executable, "-m", "smol", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=60,
    )
    assert module.returncode == 0 and module.stdout == listed.stdout


@pytest.mark.parametrize("verb", ["train", "finetune"])
def test_python_m_a_library_module_names_its_command_and_exits_2(verb, tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", f"smol.{verb}", "--steps", "2"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.splitlines() == [
        f"smol.{verb} is a library module: run `smol {verb}`"
    ]
    assert list(tmp_path.iterdir()) == []  # nothing ran


@pytest.mark.parametrize("argv", [[], ["speak", "Hi"], ["Generate", "Hi"]])
def test_no_verb_or_an_unknown_one_is_a_usage_error(argv):
    result = smol(*argv)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("smol: error:")
    assert all(verb in result.stderr for verb in VERBS)


def _each_verb(argvs: list[list[str]]) -> list[subprocess.CompletedProcess]:
    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(lambda argv: smol(*argv), argvs))


def test_every_verb_has_help_of_the_same_shape():
    for verb, result in zip(VERBS, _each_verb([[v, "--help"] for v in VERBS])):
        assert result.returncode == 0 and result.stderr == "", (verb, result.stderr)
        assert result.stdout.startswith(f"usage: smol {verb} "), result.stdout
        # the module's docstring with an example in the one form, then the statuses
        assert f"\n    smol {verb} " in result.stdout, verb
        assert " ".join(result.stdout.split()).endswith(" ".join(EXIT_STATUS.split()))


def test_every_verb_s_usage_error_is_one_line_with_status_2():
    assert USAGE_ERRORS.keys() == VERBS.keys()
    results = _each_verb([argv for argv, _ in USAGE_ERRORS.values()])
    for (verb, (argv, says)), result in zip(USAGE_ERRORS.items(), results):
        err = result.stderr
        assert result.returncode == 2, (argv, result.returncode, err)
        assert err.count("\n") == 1 and err.startswith(f"smol {verb}: error: "), err
        assert says in err and "Traceback" not in err and result.stdout == "", err


# --- every documented command parses as written -------------------------------------


def _code(text: str) -> tuple[list[str], list[str]]:
    """The lines of the fenced code blocks of Markdown, and its inline code spans."""
    fenced = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
    lines = [line for block in fenced.findall(text) for line in block.splitlines()]
    spans = re.findall(r"`([^`]+)`", fenced.sub("", text))
    return lines, [" ".join(span.split()) for span in spans]


def documents() -> list[tuple[str, str]]:
    """(name, Markdown) of the README, CONTRIBUTING.md, the book's pages and every
    chapter's markdown cells."""
    out = [(p.name, (ROOT / p).read_text()) for p in (Path("README.md"),)]
    out.append(("CONTRIBUTING.md", (ROOT / "CONTRIBUTING.md").read_text()))
    out += [(f"book/{p.name}", p.read_text()) for p in sorted(ROOT.glob("book/*.md"))]
    for path in sorted(ROOT.glob("chapters/*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        text = "\n\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
        out.append((f"chapters/{path.name}", text))
    return out


def documented_commands(inline: bool = False) -> list[tuple[str, list[str]]]:
    """(where, the arguments after `smol`) of each `smol ...`, `python -m smol ...` or
    `torchrun ... -m smol ...` command of a code block (with `inline`, of the inline
    code spans too, which may hold placeholders: `--shots K`); a last `...` (more
    options) is left out, and a placeholder verb (`smol VERB`) is not a command."""
    found = []
    for where, text in documents():
        blocks, spans = _code(text)
        for code in blocks + spans * inline:
            code = code.split(" # ")[0].strip()
            m = re.match(r"(?:smol|python -m smol|torchrun .*?-m smol)(\s.*|$)", code)
            if m is None:
                continue
            argv = shlex.split(m[1])
            argv = argv[:-1] if argv[-1:] == ["..."] else argv
            if argv and argv[0].isupper():
                continue
            found.append((where, argv))
    return found


def test_the_documents_show_every_verb_in_the_one_form_only():
    commands = documented_commands(inline=True)
    assert {argv[0] for _, argv in commands if argv} >= VERBS.keys()
    for where, text in documents():
        assert not OLD_FORMS.search(text), (where, OLD_FORMS.search(text)[0])


def test_every_documented_command_parses_as_written():
    for where, argv in documented_commands():
        if argv in ([], ["--help"]):
            continue
        verb, *args = argv
        assert verb in VERBS, f"{where}: `smol {' '.join(argv)}`: no verb {verb!r}"
        parser = importlib.import_module(f"smol.commands.{verb}").build_parser()
        try:
            parser.parse_args(args)
        except UsageError as e:
            pytest.fail(f"{where}: `smol {' '.join(argv)}`: {e}")
        except SystemExit:  # --help
            assert "--help" in args or "-h" in args, (where, argv)


def test_every_documented_command_s_help_runs_through_the_script():
    """`smol VERB --help` (and `smol eval TASK --help`) for each command shown."""
    shown = set()
    for where, argv in documented_commands(inline=True):
        if argv in ([], ["--help"]):
            continue
        assert argv[0] in VERBS, f"{where}: `smol {' '.join(argv)}`: no such verb"
        task = argv[1:2] if argv[0] == "eval" and argv[1:2] != ["--help"] else []
        shown.add((argv[0], *task))
    shown = sorted(shown)
    for command, result in zip(shown, _each_verb([[*c, "--help"] for c in shown])):
        usage = f"usage: smol {' '.join(command)}"
        assert result.returncode == 0 and result.stdout.startswith(usage), command


def test_a_feedback_page_of_either_marker_is_the_graders(tmp_path):
    """Feedback pages written as `python -m smol.grade` (before the one entry point)
    are still the grader's to rewrite; a page an instructor wrote is not."""
    from smol.grading.gradebook import EARLIER_MARK, MARK, is_feedback

    for i, first in enumerate([MARK, EARLIER_MARK, "# notes on ada"]):
        page = tmp_path / f"{i}.md"
        page.write_text(f"{first}\n# ada: 3/4 points\n", encoding="utf-8")
        assert is_feedback(page) is (i < 2), first


def test_every_hand_in_is_found_nested_or_in_capitals(tmp_path):
    """Unzipped hand-ins nest their notebooks, and some end in .IPYNB: each is the
    student's; Jupyter's checkpoints and other hidden files are not; an exercise
    handed in twice, once nested, is refused by name."""
    from smol.grading.gradebook import find_submissions

    (tmp_path / "ada" / "hw2" / ".ipynb_checkpoints").mkdir(parents=True)
    (tmp_path / "ada" / "hw2" / "02_rope.IPYNB").write_text("{}", encoding="utf-8")
    checkpoint = tmp_path / "ada" / "hw2" / ".ipynb_checkpoints" / "02_rope.ipynb"
    checkpoint.write_text("{}", encoding="utf-8")
    (tmp_path / "ada" / "notes.txt").write_text("x", encoding="utf-8")
    (tmp_path / "bob__04_swiglu.IPYNB").write_text("{}", encoding="utf-8")
    found = {(s.student, s.exercise): s.path for s in find_submissions(tmp_path)}
    assert found == {
        ("ada", "02_rope"): tmp_path / "ada" / "hw2" / "02_rope.IPYNB",
        ("bob", "04_swiglu"): tmp_path / "bob__04_swiglu.IPYNB",
    }
    (tmp_path / "ada" / "02_rope.ipynb").write_text("{}", encoding="utf-8")
    with pytest.raises(ValueError, match="ada hands in 02_rope twice"):
        find_submissions(tmp_path)


def test_a_student_whose_notebooks_are_gone_stays_in_the_gradebook(tmp_path):
    """A student of the last class report who hands in nothing now keeps a row per
    task, marked missing, instead of dropping out of the gradebook."""
    import json

    from smol.grading.files import earlier_students
    from smol.grading.gradebook import gradebook_rows

    task = {"task": "rms", "score": 3, "total": 4, "graded": True}
    bob = {"student": "bob", "exercise": "01_rmsnorm", "tasks": [task]}
    report = tmp_path / "class.json"
    report.write_text(
        json.dumps({"notebooks": [dict(bob, student="ada"), bob]}), encoding="utf-8"
    )
    assert earlier_students(report) == {"ada", "bob"}
    assert earlier_students(tmp_path / "none.json") == set()
    rows = gradebook_rows([bob], earlier_students(report))
    assert [r[0] for r in rows] == ["ada", "bob"]
    assert rows[0][1:] == ["01_rmsnorm", "rms", 0, 4, "missing"]
    assert [r[0] for r in gradebook_rows([bob])] == ["bob"]  # no report: no roster
