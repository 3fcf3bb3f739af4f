"""`smol dpo` end to end on a tiny model folder: the merged model it writes loads, an
earlier run is not written over, each bad input is one named line with its exit
status, and a run stopped by SIGTERM resumes to the uninterrupted run's adapter."""

import json
import signal
from functools import partial

import pytest
import torch

from smol import SmolLM
from smol.commands.dpo import main
from tests import tuning_runs as tuning
from tests.test_dpo import PAIRS, pair
from tests.tiny_models import with_real_vocab


@pytest.fixture(scope="module")
def base(tokenizer, tmp_path_factory):
    """A tiny model folder with SmolLM2's tokenizer, and the pairs as JSONL."""
    return tuning.make_base(
        tmp_path_factory.mktemp("base"), tokenizer, "pairs.jsonl", PAIRS
    )


def dpo(base, out, *options, capsys=None):
    """main() on the base model and pairs: (exit status, stdout, stderr)."""
    data, model = base / "pairs.jsonl", base / "model"
    return tuning.run_main(main, data, model, out, ["--lr", "1e-2", *options], capsys)


@pytest.mark.parametrize("lora", ["2", "0"], ids=["lora", "full"])
def test_the_command_writes_a_merged_model_that_loads(
    base, tmp_path, capsys, tokenizer, lora
):
    from smol.lora import lora_layers
    from smol.pretrained import load_pretrained

    out = tmp_path / "out"
    options = ["--val-data", str(base / "pairs.jsonl"), "--eval-every", "3"]
    code, printed, err = dpo(base, out, "--lora-r", lora, *options, capsys=capsys)
    assert code == 0, err
    assert printed.startswith("4 training pairs, 4 validation")
    reference = "the model with its adapter off" if lora != "0" else "the start"
    assert f"reference {reference}" in printed and "the merged model is in" in printed
    assert "val accuracy" in printed
    assert (out / "adapter").exists() == (lora != "0")
    assert json.loads((out / "training" / "dpo.json").read_text())["beta"] == 0.1
    model, tok = load_pretrained(out, device="cpu")
    assert not lora_layers(model) and tok.chat_template == tokenizer.chat_template
    start, _ = load_pretrained(base / "model", device="cpu")
    moved = [
        not torch.equal(p, start.state_dict()[n]) for n, p in model.state_dict().items()
    ]
    assert any(moved)  # the policy left its reference


def test_another_reference_is_used_and_one_of_another_config_refused(
    base, tmp_path, capsys, tokenizer
):
    from smol.pretrained import save_pretrained

    torch.manual_seed(1)
    save_pretrained(SmolLM(with_real_vocab(2048)), tokenizer, tmp_path / "ref")
    code, printed, err = dpo(
        base, tmp_path / "a", "--reference", str(tmp_path / "ref"), capsys=capsys
    )
    assert code == 0 and f"reference {tmp_path / 'ref'}" in printed, err
    save_pretrained(SmolLM(with_real_vocab(512)), tokenizer, tmp_path / "other")
    code, _, err = dpo(
        base, tmp_path / "b", "--reference", str(tmp_path / "other"), capsys=capsys
    )
    assert code == 1 and err.count("\n") == 1
    assert f"--reference {tmp_path / 'other'} has another config" in err


@pytest.mark.parametrize(
    "options, says",
    [
        (["--beta", "0"], "--beta must be between 0.0001 and 1000, got 0.0"),
        (["--beta", "-0.5"], "--beta must be between 0.0001 and 1000, got -0.5"),
        (["--beta", "nan"], "--beta must be between 0.0001 and 1000, got nan"),
        # a beta that underflows to 0 (trained nothing), one that overflows
        (["--beta", "1e-320"], "--beta must be between 0.0001 and 1000, got 1e-320"),
        (["--beta", "1e308"], "--beta must be between 0.0001 and 1000, got 1e"),
        (["--beta", "1000.5"], "--beta must be between"),
        (["--out", "{model}"], "is the model being tuned"),
        (["--reference", "{out}"], "is the reference model"),
        (["--reference", ""], "--reference is empty: name a .gguf file"),
        *tuning.USAGE_ERRORS,
    ],
)
def test_usage_errors_exit_2_before_any_work(base, capsys, monkeypatch, options, says):
    out = base / "unused"
    options = [o.format(model=base / "model", out=out) for o in options]
    run = partial(dpo, base, capsys=capsys)
    tuning.check_usage_error("dpo", run, out, options, says, monkeypatch)


@pytest.mark.parametrize(
    "bad, says",
    [
        ({"prompt": "q", "chosen": "a"}, "line 2: the pair has no 'rejected'"),
        ({"prompt": "q", "chosen": "", "rejected": "b"}, "line 2: chosen is an empty"),
        ({"prompt": "q", "chosen": "x", "rejected": "x"}, "line 2: chosen and reject"),
        ("{oops", "line 2: not valid JSON"),
    ],
)
def test_a_bad_pair_is_named_by_file_and_line_and_exits_1(
    base, tmp_path, capsys, bad, says
):
    data = tuning.write_jsonl(tmp_path / "bad.jsonl", [PAIRS[0], bad])
    code, _, err = dpo(base, tmp_path / "out", "--data", str(data), capsys=capsys)
    assert code == 1 and err.count("\n") == 1 and "Traceback" not in err
    assert f"{data}, {says}" in err
    assert not (tmp_path / "out").exists()


def test_pairs_too_long_are_named_and_none_left_fails(base, tmp_path, capsys):
    long = pair("Tell me a story. " * 30, "Once upon a time.", "No.")
    data = tuning.write_jsonl(tmp_path / "data.jsonl", PAIRS[:2] + ["", long])
    code, printed, err = dpo(base, tmp_path / "a", "--data", str(data), capsys=capsys)
    assert code == 0, err
    assert (
        "warning: 1 of 3 training pairs have a reply with no token within --max-len "
        f"64 tokens and are left out: {data}, lines 4"
    ) in err
    assert printed.startswith("2 training pairs")
    only = tuning.write_jsonl(tmp_path / "long.jsonl", [long])
    code, _, err = dpo(base, tmp_path / "b", "--data", str(only), capsys=capsys)
    assert code == 1 and err.count("\n") == 1
    assert f"no pair of {only} has both replies within --max-len 64 tokens" in err


def test_an_earlier_run_is_not_written_over_unasked(base, tmp_path, capsys):
    out, run = tmp_path / "out", partial(dpo, base, capsys=capsys)
    tuning.check_an_earlier_run_is_kept(run, out)
    code, _, err = run(out, "--resume", "--beta", "0.5")
    assert code == 1 and "beta: the run's 0.1, now 0.5" in err
    tuning.check_overwrite_starts_over(run, out)


def test_a_diverged_run_is_one_line_and_keeps_only_finite_checkpoints(
    base, tmp_path, capsys
):
    """A learning rate of 1e30 makes the weights NaN at step 2 (its checkpoint was
    saved, all NaN, and named the last good one): the run stops there in one line
    naming --lr and the checkpoint of step 1, the last whose weights are finite, and
    writes no merged model."""
    from safetensors.torch import load_file

    out = tmp_path / "out"
    options = ["--lr", "1e30", "--lora-r", "0", "--ckpt-every", "1"]
    code, _, err = dpo(base, out, *options, capsys=capsys)
    kept = out / "training" / "checkpoints" / "step_0000001"
    assert code == 1 and err.count("\n") == 1 and "Traceback" not in err
    assert (
        "smol dpo: error: training diverged: a trained weight is nan at step 2" in err
    )
    assert err.rstrip().endswith(
        f"the last good checkpoint is kept: {kept}). Try a lower --lr (now 1e+30)."
    )
    saved = sorted((out / "training" / "checkpoints").glob("step_*"))
    assert saved == [kept] and not (out / "model.safetensors").exists()
    weights = load_file(kept / "model.safetensors").values()
    assert all(torch.isfinite(w).all() for w in weights)


SIGNAL_OPTIONS = (
    "--lora-r 2 --steps 30 --batch-size 2 --max-len 64 --eval-every 0 --device cpu "
    "--no-progress --log-every 5 --lr 1e-2"
).split()


def run_dpo(base, out, *extra, signal_at=None):
    """`smol dpo` in a subprocess; with signal_at, SIGTERM once the checkpoint of
    that step exists."""
    data, model = base / "pairs.jsonl", base / "model"
    return tuning.run_in_subprocess(
        "dpo", data, model, SIGNAL_OPTIONS, out, extra, signal_at, signal.SIGTERM
    )


def test_sigterm_saves_and_the_resume_gives_the_uninterrupted_adapter(base, tmp_path):
    code, _, err = run_dpo(base, tmp_path / "whole")
    assert code == 0, err
    whole = tuning.adapter_of(tmp_path / "whole")
    run = partial(run_dpo, base)
    tuning.check_a_stop_resumes_to(
        whole, run, tmp_path / "stopped", signal.SIGTERM, 143
    )
