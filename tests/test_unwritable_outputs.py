"""One rule for an output a command cannot write, on every command that writes one
(smol/commands/common.py): a usage error, exit status 2, one line on stderr naming
the path, found before any work (nothing is loaded, graded or tokenized first), and
nothing left behind. An output is unwritable in a folder no one may write (/sys,
which even root cannot), or under a file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from smol.commands import main
from tests.bad_inputs import PAIR, conversation

UNWRITABLE = "/sys"
EMPTY_NOTEBOOK = {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def inputs(root: Path) -> None:
    """A conversation and a DPO pair to tune on, a text to train on, a class of one,
    an earlier run's question file to compare, and file.txt, a file of the user's."""
    (root / "chat.jsonl").write_text(json.dumps(conversation()) + "\n")
    (root / "pairs.jsonl").write_text(json.dumps(PAIR) + "\n")
    (root / "plays.txt").write_text("To be, or not to be.\n\nThat is the question.\n")
    (root / "class" / "alice").mkdir(parents=True)
    notebook = root / "class" / "alice" / "01_rmsnorm.ipynb"
    notebook.write_text(json.dumps(EMPTY_NOTEBOOK))
    (root / "run").mkdir()
    (root / "run" / "mmlu_questions.csv").write_text(
        "question,subject,answer,correct,correct normalised\n0,x,A,1,1\n"
    )
    (root / "file.txt").write_text("the user's file\n")


# (the command line, OUT standing for the output; the suffix OUT takes)
OUTPUTS = [
    ("train --out-dir OUT", ""),
    ("train --data {r}/plays.txt --shards OUT", ""),
    ("finetune --data {r}/chat.jsonl --out OUT", ""),
    ("dpo --data {r}/pairs.jsonl --out OUT", ""),
    ("grpo --task add --out OUT", ""),
    ("eval mmlu --out OUT", ""),
    ("eval compare {r}/run {r}/run --csv OUT", ".csv"),
    ("export smollm2 OUT", ".gguf"),
    ("grade {r}/class/alice/01_rmsnorm.ipynb --json OUT", ".json"),
    ("grade {r}/class --gradebook OUT", ".csv"),
    ("grade {r}/class --gradebook {r}/b.csv --canvas OUT", ".csv"),
    ("grade {r}/class --gradebook {r}/b.csv --nbgrader OUT", ".csv"),
    ("grade {r}/class --gradebook {r}/b.csv --feedback OUT", ""),
    ("grade 01 --autograder OUT", ".zip"),
]


@pytest.mark.parametrize("where", ["unwritable", "under a file", "deeper"])
@pytest.mark.parametrize("line, suffix", OUTPUTS, ids=[line for line, _ in OUTPUTS])
def test_an_output_that_cannot_be_written_is_a_usage_error(
    tmp_path, capsys, line, suffix, where
):
    """Before the fix, `grade --feedback /sys/fb` graded the class, wrote the
    gradebook and then failed with a traceback (status 1) making the folder, and
    `train --shards` under a file or in /sys failed with status 1 once the run had
    begun; a command that checked its output only as it wrote it fails here. Under a
    file every output says so in one wording (smol.checkpoint.not_a_folder): grade's
    outputs and eval compare's --csv said "the folder F does not exist" of the file,
    export "no such folder", the others "Not a directory". Deeper (file.txt/a/OUT)
    the file is still the one named, not the folder a that is not there."""
    inputs(tmp_path)
    folder = UNWRITABLE if where == "unwritable" else str(tmp_path / "file.txt")
    out = f"{folder}{'/a' if where == 'deeper' else ''}/smol-out{suffix}"
    argv = [out if a == "OUT" else a.format(r=tmp_path) for a in line.split()]
    before = sorted(p.name for p in tmp_path.iterdir())
    status = main(argv)
    err = capsys.readouterr().err
    assert status == 2, err
    assert err.count("\n") == 1 and err.startswith(f"smol {argv[0]}: error: "), err
    assert folder in err, err
    if where != "unwritable":
        assert f": {folder} is a file, not a folder" in err, err
    assert (tmp_path / "file.txt").read_text() == "the user's file\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written
