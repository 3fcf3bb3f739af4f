"""The trainer: schedules, parameter groups, accumulation, exact resume, checkpoint
errors, NaN, CLI."""

import dataclasses
import json
import math

import pytest
import torch

from smol import SmolConfig, SmolLM
from smol.checkpoint import CheckpointError
from smol.flops import flops_per_token, num_params, peak_flops
from smol.optim import amp_dtype, lr_schedule, param_groups
from smol.train import TrainConfig, Trainer, TrainingDiverged
from smol.train_cli import main

SMALL = {
    "vocab_size": 97,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
}


def small_config(tmp_path, **changes) -> TrainConfig:
    base = dict(
        model_overrides=SMALL,
        steps=6,
        batch_size=4,
        seq_len=16,
        lr=1e-2,
        min_lr=1e-3,
        warmup_steps=2,
        eval_every=3,
        eval_batches=2,
        log_every=1,
        out_dir=str(tmp_path / "run"),
        progress=False,
        sample_tokens=0,
        device="cpu",
    )
    return TrainConfig(**{**base, **changes})


def tokens(n, seed):
    """A learnable stream: one random 40-token phrase, repeated."""
    phrase = torch.randint(
        0, SMALL["vocab_size"], (40,), generator=torch.Generator().manual_seed(0)
    )
    return phrase.repeat(n // 40 + 1)[seed : seed + n]


def trainer(cfg) -> Trainer:
    return Trainer(cfg, train_tokens=tokens(3000, 1), val_tokens=tokens(400, 2))


def weights(t: Trainer) -> dict:
    return {k: v.clone() for k, v in t.model.state_dict().items()}


# Schedules


def test_cosine_schedule_warms_up_then_decays_to_min_lr():
    kw = dict(max_lr=1.0, warmup_steps=10, total_steps=110, min_lr=0.1)
    lrs = [lr_schedule(s, **kw) for s in range(111)]
    assert lrs[:10] == pytest.approx([(s + 1) / 10 for s in range(10)])
    assert lrs[10] == pytest.approx(1.0)
    assert lrs[60] == pytest.approx(0.1 + 0.9 * 0.5)  # halfway through the cosine
    assert lrs[110] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))


def test_wsd_schedule_is_flat_then_decays_linearly():
    kw = dict(
        max_lr=2.0,
        warmup_steps=5,
        total_steps=100,
        min_lr=0.0,
        kind="wsd",
        decay_fraction=0.2,
    )
    lrs = [lr_schedule(s, **kw) for s in range(101)]
    assert lrs[4] == pytest.approx(2.0) and lrs[5:80] == [2.0] * 75
    assert lrs[90] == pytest.approx(1.0)
    assert lrs[100] == 0.0
    assert all(a > b for a, b in zip(lrs[80:100], lrs[81:101]))


@pytest.mark.parametrize(
    "bad",
    [
        dict(warmup_steps=20, total_steps=10),
        dict(min_lr=2.0),
        dict(kind="linear"),
        dict(kind="wsd", decay_fraction=1.5),
    ],
)
def test_schedule_rejects_bad_arguments(bad):
    kw = {**dict(max_lr=1.0, warmup_steps=1, total_steps=10), **bad}
    with pytest.raises(ValueError):
        lr_schedule(5, **kw)


# Parameter groups, FLOPs, peaks


@pytest.mark.parametrize("tied", [True, False])
def test_param_groups_decay_matrices_only_and_count_the_tied_matrix_once(tied):
    model = SmolLM(SmolConfig(**SMALL, tie_word_embeddings=tied))
    decay, no_decay = param_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(
        p.dim() == 1 for p in no_decay["params"]
    )
    ids = [id(p) for p in decay["params"] + no_decay["params"]]
    assert len(ids) == len(set(ids))
    assert (
        sum(p.numel() for p in decay["params"] + no_decay["params"])
        == model.count_params()
    )
    assert any(p is model.model.embed_tokens.weight for p in decay["params"])
    assert any(p is model.lm_head.weight for p in decay["params"])
    # the RMSNorm gains
    assert len(no_decay["params"]) == 2 * SMALL["num_hidden_layers"] + 1


@pytest.mark.parametrize("tied", [True, False])
def test_num_params_from_the_config(tied):
    config = SmolConfig(**SMALL, tie_word_embeddings=tied)
    assert num_params(config) == SmolLM(config).count_params()
    assert num_params(SmolConfig.preset("smollm2-135m")) == 134_515_008


def test_flops_per_token_of_smollm2_135m():
    config = SmolConfig.preset("smollm2-135m")
    assert flops_per_token(config, 2048) == 6 * 134_515_008 + 12 * 30 * 9 * 64 * 2048


@pytest.mark.parametrize(
    "name, peak",
    [
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H200", 989e12),
        ("NVIDIA A100-SXM4-40GB", 312e12),
        ("Tesla T4", 65e12),
        ("NVIDIA L4", 121e12),
        ("NVIDIA L40S", 362e12),
        ("NVIDIA L40", None),
        ("NVIDIA GeForce RTX 3060", None),
    ],
)
def test_peak_flops_table(monkeypatch, name, peak):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert peak_flops("cuda") == peak
    assert peak_flops("cpu") is None


def test_amp_dtype_bf16_where_native_else_fp16_on_cuda_fp32_on_cpu(monkeypatch):
    assert amp_dtype(torch.device("cpu")) == torch.float32
    assert amp_dtype(torch.device("cpu"), "bf16") == torch.bfloat16
    with pytest.raises(ValueError, match="fp16 with a GradScaler needs a CUDA device"):
        amp_dtype(torch.device("cpu"), "fp16")
    with pytest.raises(ValueError, match="dtype must be one of"):
        amp_dtype(torch.device("cpu"), "half")
    # an A100, a T4
    for native, expected in ((True, torch.bfloat16), (False, torch.float16)):
        monkeypatch.setattr(
            torch.cuda,
            "is_bf16_supported",
            lambda including_emulation=True, n=native: n,
        )
        assert amp_dtype(torch.device("cuda")) == expected


# Training


def test_loss_falls_and_history_is_recorded(tmp_path):
    t = trainer(small_config(tmp_path, steps=12, eval_every=6))
    h = t.fit()
    assert h["step"] == list(range(1, 13)) and len(h["lr"]) == 12
    assert h["val_step"] == [6, 12]
    assert h["loss"][-1] < h["loss"][0] - 0.2
    assert (
        tmp_path / "run" / "checkpoints" / "latest"
    ).read_text().strip() == "step_0000012"


def test_accumulation_equals_one_big_batch(tmp_path):
    big = trainer(
        small_config(tmp_path / "a", batch_size=4, grad_accum=1, eval_every=0)
    )
    acc = trainer(
        small_config(tmp_path / "b", batch_size=2, grad_accum=2, eval_every=0)
    )
    big.fit(), acc.fit()
    assert acc.history["loss"] == pytest.approx(big.history["loss"], rel=1e-5)
    for k, v in weights(big).items():
        torch.testing.assert_close(weights(acc)[k], v, atol=1e-5, rtol=1e-4)


def test_resume_is_bit_exact(tmp_path):
    full = trainer(small_config(tmp_path / "full", grad_accum=2))
    full.fit()
    cfg = small_config(tmp_path / "split", grad_accum=2)
    first = trainer(cfg)
    first.fit(until=4)  # stop after step 4, as a preempted job would, with a checkpoint
    assert first.step == 4
    second = trainer(dataclasses.replace(cfg, resume=True))
    assert (
        second.step == 4
        and second.train_batches.position == first.train_batches.position
    )
    second.fit()
    assert second.history["loss"] == full.history["loss"]
    assert second.history["val_loss"] == full.history["val_loss"]
    for k, v in weights(full).items():
        assert torch.equal(weights(second)[k], v), k
    for a, b in zip(full.optimizer.state.values(), second.optimizer.state.values()):
        assert all(torch.equal(a[key], b[key]) for key in a)


def test_checkpoints_keep_the_newest_and_load_tied_weights(tmp_path):
    t = trainer(
        small_config(tmp_path, steps=6, ckpt_every=2, keep_checkpoints=2, eval_every=0)
    )
    t.fit()
    root = tmp_path / "run" / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == [
        "latest",
        "step_0000004",
        "step_0000006",
    ]
    again = trainer(dataclasses.replace(t.cfg, resume=True))
    assert again.model.lm_head.weight is again.model.model.embed_tokens.weight
    assert torch.equal(again.model.lm_head.weight, t.model.lm_head.weight)


def test_resume_without_a_checkpoint_says_so(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint to resume from"):
        trainer(small_config(tmp_path, resume=True))


def test_resume_from_another_config_is_refused(tmp_path):
    trainer(small_config(tmp_path, steps=2)).fit()
    other = small_config(
        tmp_path, steps=2, resume=True, model_overrides={**SMALL, "hidden_size": 48}
    )
    with pytest.raises(ValueError, match="hidden_size: checkpoint 32, now 48"):
        trainer(other)
    with pytest.raises(ValueError, match="seq_len: checkpoint 16, now 8"):
        trainer(small_config(tmp_path, steps=2, resume=True, seq_len=8))


@pytest.mark.parametrize("victim", ["model.safetensors", "state.pt"])
def test_corrupted_checkpoint_is_detected(tmp_path, victim):
    trainer(small_config(tmp_path, steps=2)).fit()
    path = tmp_path / "run" / "checkpoints" / "step_0000002" / victim
    blob = bytearray(path.read_bytes())
    blob[len(blob) // 2] ^= 0xFF  # flip one byte in the middle
    path.write_bytes(
        bytes(blob[: len(blob) - 7]) if victim == "state.pt" else bytes(blob)
    )
    with pytest.raises(CheckpointError, match="corrupted"):
        trainer(small_config(tmp_path, steps=2, resume=True))


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    t = trainer(small_config(tmp_path, steps=6, ckpt_every=2, eval_every=0))
    t.fit(until=2)
    with torch.no_grad():
        t.model.model.norm.weight.fill_(float("nan"))
    with pytest.raises(TrainingDiverged, match="loss is nan at step 3.*step_0000002"):
        t.fit()
    root = tmp_path / "run" / "checkpoints"
    assert (root / "latest").read_text().strip() == "step_0000002"
    again = trainer(dataclasses.replace(t.cfg, resume=True))
    assert again.step == 2 and all(
        torch.isfinite(p).all() for p in again.model.parameters()
    )


def test_batches_that_do_not_fit_the_data_are_refused(tmp_path):
    with pytest.raises(ValueError, match="lower batch_size or seq_len"):
        Trainer(
            small_config(tmp_path, batch_size=64, seq_len=60),
            train_tokens=tokens(1000, 0),
            val_tokens=tokens(1000, 1),
        )
    with pytest.raises(ValueError, match="does not fit"):
        Trainer(
            small_config(tmp_path, seq_len=32),
            train_tokens=tokens(3000, 0),
            val_tokens=tokens(20, 1),
        )
    with pytest.raises(ValueError, match="longer than the model's context"):
        trainer(small_config(tmp_path, seq_len=128))


def test_bf16_autocast_trains_float32_weights(tmp_path):
    t = trainer(small_config(tmp_path, steps=3, dtype="bf16"))
    t.fit()
    assert t.amp_dtype == torch.bfloat16 and all(
        math.isfinite(x) for x in t.history["loss"]
    )
    assert all(p.dtype == torch.float32 for p in t.model.parameters())
    assert t.mfu(1000.0) is None  # a CPU has no peak in the table
    t.peak = 100e12
    assert t.mfu(1000.0) == pytest.approx(t.flops_per_token * 1000 / 100e12)


def test_a_crash_while_saving_leaves_the_last_checkpoint_intact(tmp_path, monkeypatch):
    t = trainer(small_config(tmp_path, steps=4, ckpt_every=2, eval_every=0))
    t.fit(until=2)

    def crash(*args, **kwargs):
        raise KeyboardInterrupt("killed while saving")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        t.fit()
    monkeypatch.undo()
    root = tmp_path / "run" / "checkpoints"
    assert (root / "latest").read_text().strip() == "step_0000002"
    assert not (root / "step_0000004").exists()
    again = trainer(dataclasses.replace(t.cfg, resume=True))
    assert again.step == 2
    again.fit()
    assert sorted(p.name for p in root.iterdir()) == [
        "latest",
        "step_0000002",
        "step_0000004",
    ]  # no leftovers


def test_compile_keeps_eval_and_generation_working(tmp_path, monkeypatch):
    compile_ = torch.compile
    monkeypatch.setattr(
        torch, "compile", lambda m, **kw: compile_(m, backend="eager", **kw)
    )
    t = trainer(small_config(tmp_path, steps=2, compile=True))
    t.fit()
    assert t.train_model is t.eval_model and t.eval_model is not t.model
    assert math.isfinite(t.history["val_loss"][-1])
    from smol.generate import generate

    out = generate(t.model, torch.zeros(1, 3, dtype=torch.long), 5, temperature=0)
    assert out.shape == (1, 8)


# The command line, on the real corpus


def test_cli_trains_the_tiny_preset(tmp_path, capsys):
    out = tmp_path / "cli"
    args = [
        "--preset",
        "tiny",
        "--set",
        "num_hidden_layers=1",
        "--set",
        "hidden_size=64",
        "--steps",
        "4",
        "--warmup-steps",
        "1",
        "--batch-size",
        "4",
        "--seq-len",
        "32",
        "--eval-every",
        "2",
        "--eval-batches",
        "2",
        "--sample-tokens",
        "8",
        "--out-dir",
        str(out),
        "--no-progress",
        "--device",
        "cpu",
    ]
    assert main(args) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert (
        summary["step"] == 4
        and summary["mfu"] is None
        and math.isfinite(summary["val_loss"])
    )
    assert (out / "loss.png").stat().st_size > 0
    printed = capsys.readouterr().out
    assert "tokens/s" in printed and "sample: 'Romeo." in printed
    assert main(args + ["--steps", "6", "--resume", "--sample-tokens", "0"]) == 0
    assert json.loads((out / "summary.json").read_text())["step"] == 6


def test_cli_reports_bad_input_without_a_traceback(tmp_path, capsys):
    assert (
        main(
            [
                "--out-dir",
                str(tmp_path / "none"),
                "--resume",
                "--no-progress",
                "--device",
                "cpu",
            ]
        )
        == 1
    )
    assert "error: no checkpoint to resume from" in capsys.readouterr().err
    assert (
        main(["--seq-len", "1024", "--out-dir", str(tmp_path / "x"), "--device", "cpu"])
        == 1
    )
    assert "longer than the model's context" in capsys.readouterr().err
