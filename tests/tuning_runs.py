"""What the tests of `smol finetune` and `smol dpo` share: a tiny model folder with
SmolLM2's tokenizer beside its data as JSONL, the command run on them in this process
or in a subprocess (stopped by a signal), the adapter it wrote, and the check that a
bad command line is one line with exit status 2 before anything is loaded."""

import json
import re
import signal

import pytest
import torch

from smol import SmolLM
from tests.cli_args import run_smol
from tests.tiny_models import with_real_vocab

# the run's size: a few steps of small batches on the CPU, LoRA of rank 2
OPTIONS = (
    "--device cpu --no-progress --eval-every 0 --steps 3 --batch-size 2 --max-len 64 "
    "--lora-r 2"
).split()


def write_jsonl(path, lines):
    """Each line as JSON (a string as it is); the path."""
    path.write_text(
        "\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n"
    )
    return path


def make_base(folder, tokenizer, data: str, rows):
    """In `folder`: a tiny model folder `model` with SmolLM2's tokenizer and a context
    of 2048, and `rows` as the JSONL file `data`."""
    from smol.pretrained import save_pretrained

    torch.manual_seed(0)
    save_pretrained(SmolLM(with_real_vocab(2048)), tokenizer, folder / "model")
    write_jsonl(folder / data, rows)
    return folder


def run_main(main, data, model, out, options, capsys=None):
    """main() on the data and model with OPTIONS, then `options`: (exit status,
    stdout, stderr)."""
    code = main(
        ["--data", str(data), "--model", str(model), "--out", str(out)]
        + OPTIONS
        + list(options)
    )
    captured = capsys.readouterr() if capsys else None
    return code, captured.out if capsys else "", captured.err if capsys else ""


def adapter_of(out):
    from safetensors.torch import load_file

    return load_file(out / "adapter" / "adapter_model.safetensors")


# the usage errors that both commands find the same way, and what they say
USAGE_ERRORS = [
    (["--lora-r", "0", "--lora-alpha", "4"], "--lora-alpha set LoRA, but --lora-r 0"),
    (["--resume", "--overwrite"], "resume and overwrite exclude each other"),
    (["--steps", "0"], "steps must be a positive int"),
    (["--model", ""], "--model is empty: name a .gguf file, a folder or a hub id"),
    (["--seed", str(2**64)], r"seed must lie in \[0, 2\*\*64 - 1\]"),
]


def check_usage_error(verb, run, out, options, says, monkeypatch):
    """`run(out, *options)` (`smol VERB` in this process, its stdout and stderr
    captured) exits 2 with one line matching `says` on stderr, before loading
    anything or writing `out`."""
    import smol.pretrained

    monkeypatch.setattr(
        smol.pretrained,
        "load_pretrained",
        lambda *a, **k: pytest.fail("nothing is loaded for a bad command line"),
    )
    code, printed, err = run(out, *options)
    assert code == 2 and printed == "" and err.count("\n") == 1, err
    assert err.startswith(f"smol {verb}: error:") and re.search(says, err)
    assert not out.exists()


def files(folder) -> dict:
    """Every file below `folder`, with its bytes."""
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def check_an_earlier_run_is_kept(run, out):
    """After a run into `out` (`run(out, *options)`), another one there is refused in
    one line that names --overwrite (a usage error, 2), and writes nothing."""
    assert run(out)[0] == 0
    before = files(out)
    code, _, err = run(out, "--seed", "5")
    assert code == 2 and err.count("\n") == 1
    assert f"--out {out} already holds a fine-tune" in err and "--overwrite" in err
    assert files(out) == before


def check_overwrite_starts_over(run, out, failing=("--lr", "1e30"), says="diverged"):
    """--overwrite replaces the LoRA run in `out` once the new run is done: a full
    fine-tune leaves no adapter of it. Until then the earlier run stays: a
    replacement that fails once its trainer is made (with the options `failing`,
    saying `says`) leaves it as it was, and nothing beside it."""
    from smol.commands.runs import staging

    before, beside = files(out), sorted(out.parent.iterdir())
    code, _, err = run(out, "--overwrite", "--lora-r", "0", *failing)
    assert code == 1 and says in err, err
    assert f"the earlier run in {out} is as it was" in err
    assert str(staging(out)) not in err  # no word of a checkpoint there: it is gone
    assert files(out) == before and sorted(out.parent.iterdir()) == beside
    code, _, err = run(out, "--overwrite", "--lora-r", "0")
    assert code == 0, err
    assert f"overwrite: replaced the earlier run's config.json" in err
    assert not (out / "adapter").exists() and (out / "model.safetensors").exists()
    assert not staging(out).exists() and sorted(out.parent.iterdir()) == beside


def check_a_stop_resumes_to(whole, run, out, sig, status):
    """`run(out, *options, signal_at=...)` (in a subprocess) stopped by `sig` once its
    checkpoint of step 3 exists: one line saying where it saved, exit status
    `status`; --resume then gives the adapter `whole` of the run never
    stopped, bit for bit."""
    name = signal.Signals(sig).name
    code, _, err = run(out, "--ckpt-every", "1", signal_at=3)
    assert code == status, err
    assert "Traceback" not in err and err.strip().count("\n") == 1, err
    saved = re.search(rf"stopped by {name} after step (\d+): saved (\S+);", err)
    step = int(saved.group(1))
    assert 3 <= step < 30 and saved.group(2) == str(
        out / "training" / "checkpoints" / f"step_{step:07d}"
    )
    assert not (out / "adapter").exists()
    code, printed, err = run(out, "--ckpt-every", "1", "--resume")
    assert code == 0, err
    assert f"from step {step}" in printed
    resumed = adapter_of(out)
    assert whole.keys() == resumed.keys()
    assert all(torch.equal(whole[k], resumed[k]) for k in whole)


def run_in_subprocess(verb, data, model, options, out, extra, signal_at, sig):
    """`smol VERB` in a subprocess; with signal_at, send `sig` once the checkpoint of
    that step exists."""
    argv = [verb, "--data", str(data), "--model", str(model)]
    argv += [*options, "--out", str(out), *extra]
    checkpoints = out / "training" / "checkpoints"
    mark = checkpoints / f"step_{signal_at:07d}" if signal_at is not None else None
    return run_smol(argv, mark, sig)
