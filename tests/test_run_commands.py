"""What every command that writes a run or a result shares (smol/commands/runs.py): an
--out it cannot write is a usage error (2) in every command; a run is resumed only by
the command that made it, refused before anything is loaded or written; smol train's
--overwrite keeps the earlier run until the new one is done."""

import json

import pytest
import torch

import smol.pretrained
from smol import resume
from smol.commands import main
from tests.test_train import small_config, trainer

UNWRITABLE = "/sys"  # a folder that even root cannot write into


def nothing_is_loaded(monkeypatch):
    monkeypatch.setattr(
        smol.pretrained,
        "load_pretrained",
        lambda *a, **k: pytest.fail("nothing is loaded for a refused command line"),
    )


# each command that takes an output folder or file, with the rest of its command line
OUTS = {
    "train": lambda out: ["train", "--out-dir", out, "--device", "cpu"],
    "finetune": lambda out: ["finetune", "--data", "{data}", "--out", out],
    "dpo": lambda out: ["dpo", "--data", "{data}", "--out", out],
    "grpo": lambda out: ["grpo", "--task", "add", "--out", out],
    "eval": lambda out: ["eval", "mmlu", "--limit", "1", "--out", out],
    "export": lambda out: ["export", "smollm2", f"{out}.gguf"],
}


@pytest.mark.parametrize("where", ["unwritable", "under a file"])
@pytest.mark.parametrize("verb", sorted(OUTS))
def test_an_out_that_cannot_be_written_is_a_usage_error_everywhere(
    tmp_path, capsys, monkeypatch, verb, where
):
    """The same rule in every command: found before any work, so exit status 2 (it
    was 1 in finetune, dpo, grpo and train, 2 in eval and export), one line naming
    the folder."""
    nothing_is_loaded(monkeypatch)
    (tmp_path / "data.jsonl").write_text("{}\n")
    (tmp_path / "file.txt").write_text("a file\n")
    parent = UNWRITABLE if where == "unwritable" else str(tmp_path / "file.txt")
    argv = [a.format(data=tmp_path / "data.jsonl") for a in OUTS[verb](f"{parent}/o")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"smol {verb}: error:"), err
    assert parent in err and "Traceback" not in err
    assert (tmp_path / "file.txt").read_text() == "a file\n"


def a_run_of(verb: str, folder):
    """A folder as `smol VERB` leaves it (its settings file, a model file, a
    checkpoint folder): what a resume by another command must not touch."""
    training = folder if verb == "train" else folder / "training"
    (training / "checkpoints" / "step_0000003").mkdir(parents=True)
    if verb == "train":
        (folder / "summary.json").write_text("{}")
    else:
        (training / f"{verb}.json").write_text(json.dumps({"model": None}))
        (folder / "model.safetensors").write_bytes(b"weights")
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    "made, resumed",
    [
        ("grpo", "dpo"),
        ("finetune", "dpo"),
        ("dpo", "grpo"),
        ("dpo", "finetune"),
        ("dpo", "train"),
        ("train", "dpo"),
    ],
)
def test_a_run_is_resumed_only_by_the_command_that_made_it(
    tmp_path, capsys, monkeypatch, made, resumed
):
    """`smol dpo --resume` of a grpo run loaded it, wrote the merged model over
    the grpo run's, then ended in a KeyError: now one line naming both commands,
    exit status 2, before anything is loaded or written."""
    nothing_is_loaded(monkeypatch)
    out = tmp_path / "run"
    kept = a_run_of(made, out)
    (tmp_path / "data.jsonl").write_text("{}\n")
    argv = [a.format(data=tmp_path / "data.jsonl") for a in OUTS[resumed](str(out))]
    assert main([*argv, "--resume"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"holds a `smol {made}` run, not a `smol {resumed}` one" in err
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == kept


def test_a_checkpoint_resumes_only_in_the_trainer_kind_that_saved_it(
    tmp_path, monkeypatch
):
    """The checkpoint itself records its trainer's kind (a resume from a checkpoint
    PATH finds no settings file to tell): one of another kind is refused before the
    weights are put back; one of the same kind resumes."""
    t = trainer(small_config(tmp_path, steps=2, eval_every=0))
    t.fit()
    start = {k: v.clone() for k, v in t.model.state_dict().items()}
    monkeypatch.setattr(resume, "trainer_kind", lambda trainer: "GRPOTrainer")
    saved = resume.save_trainer(t, tmp_path / "other")
    monkeypatch.undo()
    with torch.no_grad():
        for p in t.model.parameters():
            p.add_(1.0)
    moved = {k: v.clone() for k, v in t.model.state_dict().items()}
    with pytest.raises(ValueError, match="is a GRPOTrainer's run, not a Trainer's"):
        resume.restore_trainer(t, saved)
    assert all(torch.equal(moved[k], v) for k, v in t.model.state_dict().items())
    resume.restore_trainer(t, t.last_checkpoint)
    assert all(torch.equal(start[k], v) for k, v in t.model.state_dict().items())


TRAIN = (
    "--preset tiny --set num_hidden_layers=1 --steps 2 --warmup-steps 1 --batch-size 2"
)
TRAIN += " --seq-len 16 --eval-every 0 --sample-tokens 0 --no-progress --device cpu"


def test_train_overwrite_keeps_the_earlier_run_until_the_new_one_is_done(
    tmp_path, capsys
):
    """A replacement that fails (it diverges) leaves the earlier run's checkpoints
    and summary as they were, and nothing beside them; one that finishes takes
    their place."""
    from smol.commands.runs import staging

    out = tmp_path / "run"
    assert main(["train", *TRAIN.split(), "--out-dir", str(out)]) == 0
    capsys.readouterr()
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    failing = ["--overwrite", "--lr", "1e30", "--min-lr", "1e29", "--steps", "4"]
    assert main(["train", *TRAIN.split(), "--out-dir", str(out), *failing]) == 1
    err = capsys.readouterr().err
    assert "diverged" in err and f"the earlier run in {out} is as it was" in err
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert sorted(tmp_path.iterdir()) == [out]
    again = ["--overwrite", "--seed", "1"]
    assert main(["train", *TRAIN.split(), "--out-dir", str(out), *again]) == 0
    printed = capsys.readouterr()
    assert f"; {out / 'summary.json'}" in printed.out
    assert "overwrite: replaced the earlier run's checkpoints" in printed.err
    after = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after.keys() == before.keys() and after != before
    assert not staging(out).exists() and sorted(tmp_path.iterdir()) == [out]


def test_a_run_saved_before_a_setting_existed_resumes_with_its_old_value(tmp_path):
    """A GRPO run saved before --num-iterations existed trained one step a batch: its
    settings file lacks the key, and a resume with the default is the same run, where
    a resume with another value is refused (the mutant that reads the missing key as
    None refuses both)."""
    from argparse import Namespace

    from smol.commands.tuning import check_resumed_settings

    path = tmp_path / "grpo.json"
    path.write_text(json.dumps({"group_size": 8, "beta": 0.04}))
    args = Namespace(allow_changed_settings=False)
    same = {"group_size": 8, "beta": 0.04, "num_iterations": 1}
    check_resumed_settings(args, same, path, "GRPO run")
    with pytest.raises(ValueError, match="num_iterations: the run's 1, now 2"):
        check_resumed_settings(args, {**same, "num_iterations": 2}, path, "GRPO run")
