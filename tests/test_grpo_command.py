"""`smol grpo` end to end on a tiny model folder whose replies are digits or nothing
(tests/test_grpo_train.py's digit lover), rewarded for a right answer and for a reply
that is a number only: the merged model it writes loads, an earlier run is not
written over, each bad input is one named line with its exit status, and a run
stopped by SIGTERM resumes to the uninterrupted run's adapter."""

import json
import re
import signal
from functools import partial

import pytest
import torch

from smol.commands.grpo import main
from tests import tuning_runs as tuning
from tests.cli_args import run_smol
from tests.test_grpo_train import digit_lover

# the tuning commands' few steps (tuning.OPTIONS) of 2 questions, 4 replies each
OPTIONS = [*tuning.OPTIONS, "--task", "add", "--group-size", "4", "--lr", "1e-2"]
OPTIONS += ["--max-new-tokens", "4", "--format-weight", "1"]


@pytest.fixture(scope="module")
def model(tokenizer, tmp_path_factory):
    """The digit lover as a model folder with SmolLM2's tokenizer."""
    from smol.pretrained import save_pretrained

    folder = tmp_path_factory.mktemp("base") / "model"
    save_pretrained(digit_lover(), tokenizer, folder)
    return folder


def grpo(model, out, *options, capsys=None):
    """main() on the model with OPTIONS, then `options`: (exit status, stdout,
    stderr)."""
    code = main(["--model", str(model), "--out", str(out), *OPTIONS, *options])
    captured = capsys.readouterr() if capsys else None
    return code, captured.out if capsys else "", captured.err if capsys else ""


@pytest.mark.parametrize("lora", ["2", "0"], ids=["lora", "full"])
def test_the_command_writes_a_merged_model_that_loads(
    model, tmp_path, capsys, tokenizer, lora
):
    from smol.lora import lora_layers
    from smol.pretrained import load_pretrained

    out = tmp_path / "out"
    options = ["--lora-r", lora, "--eval-every", "3", "--log-every", "1"]
    code, printed, err = grpo(model, out, *options, capsys=capsys)
    assert code == 0, err
    reference = "the model with its adapter off" if lora != "0" else "the starting"
    assert printed.startswith("add: 241 training questions, 4 replies each, 16 held")
    assert f"reference {reference}" in printed and "from step 0" in printed
    assert "held-out accuracy 0.000; the merged model is in" in printed
    assert (out / "adapter").exists() == (lora != "0")
    settings = json.loads((out / "training" / "grpo.json").read_text())
    assert settings["task"] == "add" and settings["group_size"] == 4
    assert "data" not in settings
    assert settings["num_iterations"] == 1  # a resume keeps it
    tuned, tok = load_pretrained(out, device="cpu")
    assert not lora_layers(tuned) and tok.chat_template == tokenizer.chat_template
    start = load_pretrained(model, device="cpu")[0].state_dict()
    moved = [not torch.equal(p, start[n]) for n, p in tuned.state_dict().items()]
    assert any(moved)  # the policy left its reference


@pytest.mark.parametrize(
    "options, says",
    [
        (["--task", "divide"], "--task: unknown task 'divide', expected one of add"),
        (["--group-size", "1"], "--group-size must be at least 2, got 1"),
        (["--beta", "-0.1"], r"--beta must be 0 \(no KL term\) or between 0.0001 and"),
        (["--beta", "1e-320"], r"--beta must be 0 \(no KL.* and 1000, got 1e-320"),
        (["--beta", "1e308"], r"--beta must be 0 \(no KL.* and 1000, got 1e\+308"),
        (["--batch-size", "1000000"], "--batch-size 1000000 is more than the"),
        (["--beta", "nan"], "--beta must be a finite number, got nan"),
        (["--epsilon", "0"], "--epsilon must be a finite number > 0, got 0.0"),
        (["--epsilon-high", "inf"], "--epsilon-high must be a finite number > 0"),
        (["--temperature", "0"], "--temperature must be a finite number > 0"),
        (["--format-weight", "nan"], "--format-weight must be a finite number"),
        (["--loss-type", "ppo"], "--loss-type: unknown 'ppo', expected one of grpo"),
        (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1, got 0"),
        (["--num-iterations", "0"], "--num-iterations must be >= 1, got 0"),
        (["--out", "{model}"], "is the model being tuned"),
        *tuning.USAGE_ERRORS,
    ],
)
def test_usage_errors_exit_2_before_any_work(
    model, tmp_path, capsys, monkeypatch, options, says
):
    out = tmp_path / "unused"
    options = [o.format(model=model) for o in options]
    run = partial(grpo, model, capsys=capsys)
    tuning.check_usage_error("grpo", run, out, options, says, monkeypatch)


def test_the_task_is_required(model, tmp_path, capsys):
    code = main(["--model", str(model), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "the following arguments are required: --task" in err


def test_a_max_len_too_short_for_a_prompt_and_its_reply_is_named(
    model, tmp_path, capsys
):
    code, _, err = grpo(model, tmp_path / "out", "--max-len", "48", capsys=capsys)
    assert code == 1 and err.count("\n") == 1
    assert "the longest prompt of add (" in err and "--max-new-tokens 4" in err
    assert err.rstrip().endswith("do not fit in --max-len 48: raise --max-len")


def test_an_earlier_run_is_not_written_over_unasked(model, tmp_path, capsys):
    out, run = tmp_path / "out", partial(grpo, model, capsys=capsys)
    tuning.check_an_earlier_run_is_kept(run, out)
    code, _, err = run(out, "--resume", "--group-size", "3")
    assert code == 1 and "group_size: the run's 4, now 3" in err
    failing = ("--max-len", "20")  # found as the task's questions are read
    tuning.check_overwrite_starts_over(run, out, failing, "do not fit in --max-len")
    # one that diverges after its first checkpoint: that checkpoint is discarded too
    failing = ("--lr", "1e30", "--ckpt-every", "1")
    tuning.check_overwrite_starts_over(run, out, failing)


def test_weights_that_overflow_stop_the_run_in_one_line_naming_the_lr(
    model, tmp_path, capsys
):
    """--lr 1e30: the first step's weights are finite, but the logits they give are
    not, which the next step's sampling met with a traceback (torch.multinomial's
    RuntimeError). Now one line says so, names --lr and the checkpoint that holds
    those weights, and exits 1."""
    out = tmp_path / "out"
    options = ("--lr", "1e30", "--ckpt-every", "1")
    code, _, err = grpo(model, out, *options, capsys=capsys)
    step_1 = out / "training" / "checkpoints" / "step_0000001"
    assert code == 1 and err.count("\n") == 1 and "Traceback" not in err
    assert err == (
        "smol grpo: error: training diverged: a next-token logit of the policy is "
        f"NaN or inf after step 1; stopping (the last checkpoint, {step_1}, holds "
        "the weights that diverged). Try a lower --lr (now 1e+30).\n"
    )
    assert not (out / "model.safetensors").exists()


def test_a_kl_term_that_overflows_names_beta(model, tmp_path, capsys):
    """Three updates a batch at --lr 10 take the policy so far from the reference
    that exp in the KL term overflows at step 2 (inf, or nan as inf - inf; so it does
    at --beta 0.04, and --beta 0 runs): the line names the KL term, --lr and --beta
    0, where the loss alone would have named only --lr."""
    options = ["--lr", "10", "--num-iterations", "3", "--beta", "1", "--lora-r", "0"]
    code, _, err = grpo(model, tmp_path / "out", *options, capsys=capsys)
    assert code == 1 and err.count("\n") == 1 and "Traceback" not in err
    assert re.search(
        "diverged: the KL term to the reference is (inf|nan) at step 2;", err
    )
    assert err.rstrip().endswith(
        "Try a lower --lr (now 10) or --beta 0 (now 1): no KL term."
    )


SIGNAL_OPTIONS = [*OPTIONS, "--steps", "30", "--log-every", "5"]


def run_grpo(model, out, *extra, signal_at=None):
    """`smol grpo` in a subprocess; with signal_at, SIGTERM once the checkpoint of
    that step exists."""
    argv = ["grpo", "--model", str(model), *SIGNAL_OPTIONS, "--out", str(out), *extra]
    checkpoints = out / "training" / "checkpoints"
    mark = checkpoints / f"step_{signal_at:07d}" if signal_at is not None else None
    return run_smol(argv, mark, signal.SIGTERM)


def test_sigterm_saves_and_the_resume_gives_the_uninterrupted_adapter(model, tmp_path):
    code, _, err = run_grpo(model, tmp_path / "whole")
    assert code == 0, err
    whole = tuning.adapter_of(tmp_path / "whole")
    assert any(v.abs().sum() > 0 for k, v in whole.items() if "lora_B" in k)
    run = partial(run_grpo, model)
    tuning.check_a_stop_resumes_to(
        whole, run, tmp_path / "stopped", signal.SIGTERM, 143
    )


def test_replies_whose_kv_cache_exceeds_the_memory_are_refused_before_sampling():
    """--group-size 1000000000 asked for 736 GB and ended in a traceback: the KV cache
    of a step's replies is counted against the memory available first, in one line
    naming both sizes; a step that fits goes on."""
    from types import SimpleNamespace

    from smol import SmolConfig, SmolLM
    from smol.commands.grpo import _available_memory, check_memory

    model = SmolLM(SmolConfig.preset("tiny"))
    c = model.config
    per_reply = 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * 4 * 64
    fits = _available_memory() // per_reply // 2  # replies in half the memory
    check_memory(SimpleNamespace(group_size=fits, batch_size=1, max_len=64), model)
    args = SimpleNamespace(group_size=fits * 4, batch_size=1, max_len=64)
    with pytest.raises(ValueError, match=rf"--group-size {fits * 4} x --batch-size 1"):
        check_memory(args, model)
