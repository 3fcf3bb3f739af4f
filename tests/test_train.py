"""The trainer: schedules, parameter groups, accumulation, exact resume, checkpoint
errors, NaN, CLI."""

import dataclasses
import json
import math
import os
import re
import shutil
import signal
import warnings
import zipfile

import pytest
import torch

from smol import SmolConfig, SmolLM
from smol.checkpoint import CheckpointError
from smol.flops import flops_per_token, num_params, peak_flops
from smol.optim import amp_dtype, lr_schedule, param_groups
from smol.commands.train import main
from smol.train import TrainConfig, Trainer, TrainingDiverged
from tests.cli_args import ONE_LAYER, cli_args, run_smol

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


def one_line_saying(err: str, *parts: str) -> bool:
    """Whether `err` (stderr) is one line that holds every one of `parts`."""
    return err.count("\n") == 1 and all(part in err for part in parts)


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
        dict(warmup_steps=-1),
        dict(warmup_steps=0, total_steps=0),
        dict(min_lr=2.0),
        dict(min_lr=-0.1),
        dict(kind="linear"),
        dict(kind="wsd", decay_fraction=1.5),
    ],
)
def test_schedule_rejects_bad_arguments(bad):
    kw = {**dict(max_lr=1.0, warmup_steps=1, total_steps=10), **bad}
    with pytest.raises(ValueError):
        lr_schedule(5, **kw)


def test_schedule_edges_are_allowed():
    """No warmup starts at max_lr; a warmup as long as training never decays; min_lr =
    max_lr is flat; wsd with no decay stays at max_lr, with all decay falls from the
    first step after warmup."""
    kw = dict(max_lr=1.0, total_steps=10)
    assert lr_schedule(0, warmup_steps=0, **kw) == 1.0
    assert [lr_schedule(s, warmup_steps=10, **kw) for s in (0, 9, 10)] == [0.1, 1.0, 0]
    assert {lr_schedule(s, warmup_steps=2, min_lr=1.0, **kw) for s in range(2, 11)} == {
        1.0
    }
    flat = [
        lr_schedule(s, warmup_steps=0, kind="wsd", decay_fraction=0, **kw)
        for s in range(10)
    ]
    assert flat == [1.0] * 10
    steep = [
        lr_schedule(s, warmup_steps=0, kind="wsd", decay_fraction=1, **kw)
        for s in range(10)
    ]
    assert steep == pytest.approx([1 - s / 10 for s in range(10)])
    # by default wsd decays over the last fifth of the steps
    wsd = [lr_schedule(s, warmup_steps=0, kind="wsd", **kw) for s in range(11)]
    assert wsd == [1.0] * 9 + [0.5, 0.0]
    # one step is a schedule too; from total_steps on, exactly min_lr
    assert lr_schedule(0, max_lr=1.0, warmup_steps=0, total_steps=1) == 1.0
    decayed = dict(max_lr=1e-2, min_lr=1e-3, warmup_steps=0, total_steps=10)
    assert lr_schedule(10, kind="wsd", **decayed) == 1e-3


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


def test_adamw_takes_the_settings_and_is_fused_where_the_device_has_it(monkeypatch):
    """The groups, lr and betas asked for, in one fused kernel (PyTorch has one for the
    CPU too); where fused=True is refused (an error of either kind), the default
    AdamW with the same settings."""
    from smol.optim import adamw

    model = SmolLM(SmolConfig(**SMALL))
    groups = param_groups(model, 0.1)
    opt = adamw(groups, 3e-3, (0.8, 0.95))
    assert opt.defaults["fused"] and opt.defaults["lr"] == 3e-3
    assert opt.defaults["betas"] == (0.8, 0.95)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    real = torch.optim.AdamW
    for error in (RuntimeError, TypeError):

        def no_fused(*args, fused=None, error=error, **kwargs):
            if fused:
                raise error("fused=True is not supported here")
            return real(*args, **kwargs)

        monkeypatch.setattr(torch.optim, "AdamW", no_fused)
        opt = adamw(param_groups(model, 0.1), 3e-3, (0.8, 0.95))
        assert not opt.defaults["fused"] and opt.defaults["betas"] == (0.8, 0.95)
        assert opt.defaults["lr"] == 3e-3


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
    assert amp_dtype(torch.device("cpu"), "fp32") == torch.float32
    assert amp_dtype(torch.device("cuda"), "fp16") == torch.float16  # a T4's choice
    with pytest.raises(ValueError, match="fp16 with a GradScaler needs a CUDA device"):
        amp_dtype(torch.device("cpu"), "fp16")
    with pytest.raises(ValueError, match="dtype must be one of"):
        amp_dtype(torch.device("cpu"), "half")
    # an A100, a T4 (which emulates bfloat16, slowly: it counts only when asked for)
    for native, expected in ((True, torch.bfloat16), (False, torch.float16)):
        monkeypatch.setattr(
            torch.cuda,
            "is_bf16_supported",
            lambda including_emulation=True, n=native: n or including_emulation,
        )
        assert amp_dtype(torch.device("cuda")) == expected


# Training


def test_loss_falls_and_history_is_recorded(tmp_path):
    t = trainer(small_config(tmp_path, steps=12, eval_every=6))
    h = t.fit()
    assert h["step"] == list(range(1, 13)) and len(h["lr"]) == 12
    assert h["val_step"] == [6, 12]
    assert h["loss"][-1] < h["loss"][0] - 0.2
    latest = tmp_path / "run" / "checkpoints" / "latest"
    assert latest.read_text().strip() == "step_0000012"


def test_each_step_takes_its_scheduled_learning_rate(tmp_path):
    """AdamW's first step moves every weight with a gradient by about its learning
    rate: here the first warmup step's, a quarter of the peak lr the optimizer was made
    with. Mutant: a schedule computed but never handed to the optimizer."""
    t = trainer(small_config(tmp_path, warmup_steps=4, weight_decay=0.0))
    before = weights(t)
    t.train_step()
    lr0 = t.lr(0)
    assert lr0 == pytest.approx(t.cfg.lr / 4)
    moved = max((t.model.state_dict()[k] - w).abs().max() for k, w in before.items())
    assert float(moved) == pytest.approx(lr0, rel=1e-3)
    for step in range(1, 4):
        t.train_step()
        assert {g["lr"] for g in t.optimizer.param_groups} == {t.lr(step)}


@pytest.mark.parametrize("clip", [0.5, 1.0, 0.0])
def test_gradients_are_clipped_to_grad_clip_and_freed_after_the_step(tmp_path, clip):
    """The optimizer steps with the whole gradient's norm cut to grad_clip (none cut
    for 0, which turns clipping off: training still moves the weights), then the
    gradients are freed, not kept as zeros. Mutants: a clip that skips 1.0, one that
    clips to 0."""
    t = trainer(small_config(tmp_path, grad_clip=clip, lr=1e-3))
    norms, step = [], t.optimizer.step

    def recorded(*args, **kwargs):
        grads = [p.grad for p in t.model.parameters() if p.grad is not None]
        norms.append(
            float(
                torch.linalg.vector_norm(
                    torch.stack([torch.linalg.vector_norm(g) for g in grads])
                )
            )
        )
        return step(*args, **kwargs)

    t.optimizer.step = recorded
    before = weights(t)
    for _ in range(3):
        t.train_step()
    assert all(p.grad is None for p in t.model.parameters())
    if clip:
        assert max(norms) == pytest.approx(clip, rel=1e-4)  # every step cut
    else:
        assert min(norms) > 1.0  # the raw norms, larger than either clip above
    moved = max((t.model.state_dict()[k] - w).abs().max() for k, w in before.items())
    assert float(moved) > 1e-3


def test_the_history_and_the_progress_bar_report_every_log_step(
    tmp_path, monkeypatch, capsys
):
    """With a clock that moves one second a step, each logged throughput is the tokens
    of the steps since the last log over their seconds: one step's tokens a second. The
    history holds each step's learning rate; the bar, shown when asked, counts the
    steps to cfg.steps from where a resume starts and shows the evaluations. Mutants:
    tokens counted from 1, or only the last step's; the rate not recorded; a bar that
    starts at 0 after a resume or is not handed to the evaluations."""
    import time

    now = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    cfg = small_config(tmp_path, steps=6, log_every=2, eval_every=3, progress=True)

    def timed(t):
        step = t.train_step

        def one_second_a_step():
            now[0] += 1.0
            return step()

        t.train_step = one_second_a_step
        return t

    t = timed(trainer(cfg))
    h = t.fit(until=4)
    assert h["lr"] == [t.lr(s) for s in range(4)]
    # logs after steps 2, 3 (an evaluation) and 4: two steps, one step, one step
    assert h["tokens_per_s"] == [t.tokens_per_step] * 3
    out, err = capsys.readouterr()
    assert "step 3: val loss" in out + err and "4/6" in err and "6/6" not in err
    timed(trainer(dataclasses.replace(cfg, resume=True))).fit()
    out, err = capsys.readouterr()
    assert "train:  67%" in err and "6/6" in err and "step 6: val loss" in out + err


def test_the_last_step_is_evaluated_and_saved_when_no_interval_lands_on_it(
    tmp_path, capsys
):
    """Five steps, an evaluation every 3 and a checkpoint every 4: evaluations after
    steps 3 and 5, checkpoints after 4 and 5, and nothing printed without progress=True.
    Mutants: the last step evaluated only when eval_every divides it; the validation
    loss printed when progress is off."""
    t = trainer(small_config(tmp_path, steps=5, eval_every=3, ckpt_every=4))
    assert t.fit()["val_step"] == [3, 5]
    assert capsys.readouterr() == ("", "")
    saved = sorted(p.name for p in t.checkpoint_root.glob("step_*"))
    assert saved == ["step_0000004", "step_0000005"]


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
    names = sorted(p.name for p in root.iterdir())
    assert names == ["latest", "step_0000004", "step_0000006"]
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


class Moved:
    """A batch tensor that notes the device the trainer moves it to."""

    def __init__(self, tensor, seen: list):
        self.tensor, self.seen = tensor, seen

    def to(self, device, **kwargs):
        self.seen.append(device)
        return self.tensor.to(device, **kwargs)


def test_a_step_makes_its_tensors_on_the_trainers_device_not_the_default(tmp_path):
    """On a GPU, a batch left on the CPU or a loss made on the default device fails or
    copies: each micro-batch goes to the trainer's device and the loss is made there.
    With "meta" as the default device, anything made without naming a device has no
    values, so the step only matches one taken normally when nothing follows the
    default."""
    cfg = small_config(tmp_path, steps=3, eval_every=0, grad_accum=2, grad_clip=1.0)
    a, b = trainer(cfg), trainer(dataclasses.replace(cfg, out_dir=str(tmp_path / "b")))
    for t in (a, b):  # the optimizer makes its state (on the default device) first
        t.train_step()
        t.step += 1
    expected = a.train_step()
    seen = []
    b.train_batches = iter(
        [[Moved(t, seen) for t in next(b.train_batches)] for _ in range(2)]
    )
    torch.set_default_device("meta")
    try:
        loss = b.train_step()
    finally:
        torch.set_default_device(None)
    assert seen == [b.device] * 4  # x and y of two micro-batches
    assert loss.device == b.device and torch.equal(loss, expected)
    wa, wb = weights(a), weights(b)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_clipping_sees_the_true_gradients_under_a_grad_scaler(tmp_path):
    """fp16 training scales the loss (a GradScaler) and must unscale the gradients
    before clipping them, or it clips gradients 4096 times too large. fp16 needs a
    GPU; a GradScaler on the CPU follows the same path, and since scaling by a power
    of two is exact, the step equals an unscaled one bit for bit."""
    cfg = small_config(tmp_path, steps=3, eval_every=0, grad_clip=0.5)
    plain = trainer(cfg)
    scaled = trainer(dataclasses.replace(cfg, out_dir=str(tmp_path / "scaled")))
    scaled.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
    for t in (plain, scaled):
        for _ in range(2):
            t.train_step()
            t.step += 1
    assert scaled.scaler.get_scale() == 2.0**12  # no step was skipped
    wp, ws = weights(plain), weights(scaled)
    assert all(torch.equal(wp[k], ws[k]) for k in wp)


@pytest.fixture
def fp16_default_autocast():
    """CPU autocast with fp16 as the device's default dtype, as CUDA's is."""
    before = torch.get_autocast_dtype("cpu")
    torch.set_autocast_dtype("cpu", torch.float16)
    yield
    torch.set_autocast_dtype("cpu", before)


def test_autocast_computes_in_the_trainers_dtype_and_fp32_stays_quiet(
    tmp_path, fp16_default_autocast
):
    """CUDA autocasts to fp16 by default: a bf16 run whose autocast left the dtype to
    the device would compute in fp16 with no GradScaler. Here the CPU's default is
    fp16 too, and bf16 must still be what runs. An fp32 run turns autocast off rather
    than asking for fp32, which autocast does not support (and warns about)."""
    x = torch.ones(2, 2)
    bf16 = trainer(small_config(tmp_path, dtype="bf16"))
    with bf16.autocast():
        assert (x @ x).dtype == torch.bfloat16
    fp32 = trainer(small_config(tmp_path / "fp32", dtype="fp32"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with fp32.autocast():
            assert (x @ x).dtype == torch.float32


def test_a_new_trainers_settings_follow_its_config(tmp_path, monkeypatch):
    """What the trainer derives from its config: tokens per step count every
    micro-batch, the data order follows the seed, a context-long seq_len is allowed,
    a run id of 12 hex digits, no checkpoint yet, a GradScaler only for fp16, and an
    MFU peak only for bf16 or fp16 (an fp32 run would be measured against the wrong
    peak)."""
    monkeypatch.setattr("smol.flops.peak_flops", lambda device: 1e15)
    t = trainer(small_config(tmp_path, grad_accum=2, seed=1))
    assert t.tokens_per_step == 4 * 16 * 2
    assert re.fullmatch("[0-9a-f]{12}", t.run_id) and t.last_checkpoint is None
    assert not t.scaler.is_enabled() and t.peak is None
    other = trainer(small_config(tmp_path / "2", grad_accum=2, seed=2))
    assert not torch.equal(next(t.train_batches)[0], next(other.train_batches)[0])
    bf16 = trainer(small_config(tmp_path / "bf16", dtype="bf16", seq_len=64))
    assert bf16.cfg.seq_len == bf16.model_config.max_position_embeddings
    assert not bf16.scaler.is_enabled() and bf16.peak == 1e15


def test_evaluation_reads_the_first_validation_windows_in_order(tmp_path):
    t = trainer(small_config(tmp_path, eval_batches=2))  # 2 batches of 4 windows
    val = tokens(400, 2)
    windows = torch.stack([val[16 * i : 16 * i + 17] for i in range(8)])
    with torch.no_grad():
        _, loss = t.model(windows[:, :-1], windows[:, 1:])
    assert t.evaluate() == pytest.approx(loss.item(), rel=1e-6)


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
    # no leftovers
    names = sorted(p.name for p in root.iterdir())
    assert names == ["latest", "step_0000002", "step_0000004"]


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
    args = cli_args(
        {"num_hidden_layers": 1, "hidden_size": 64},
        "--steps 4 --warmup-steps 1 --batch-size 4 --seq-len 32 --eval-every 2 "
        "--eval-batches 2 --sample-tokens 8 --sample-every 2",
        "--out-dir",
        str(out),
    )
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
    # samples before the first step and every sample_every steps
    assert all(f"step {n} sample: 'Romeo." in printed for n in (0, 2, 4))
    # Training longer changes the schedule: allowed when asked, with a warning.
    longer = args + ["--steps", "6", "--resume", "--sample-tokens", "0"]
    assert main(longer) == 1
    assert "steps: checkpoint 4, now 6" in capsys.readouterr().err
    assert main(longer + ["--allow-changed-settings"]) == 0
    assert "warning: resuming with changed settings" in capsys.readouterr().err
    assert json.loads((out / "summary.json").read_text())["step"] == 6


def test_a_finished_run_saves_its_model_which_generate_and_load_pretrained_read(
    tmp_path, capsys
):
    """A finished run's out-dir holds model/ (the last step's weights, the run's
    tokenizer); `smol generate --source OUT_DIR` and load_pretrained read it. A run
    without it (stopped: checkpoints only) is refused in one line that says how to
    finish it. The mutant this rejects: no model saved, or the first checkpoint's."""
    from smol.checkpoint import load
    from smol.commands import main as smol
    from smol.pretrained import load_pretrained

    out = tmp_path / "run"
    args = cli_args(ONE_LAYER, "--steps 3 --warmup-steps 1 --batch-size 2 --seq-len 16")
    assert main(args + ["--out-dir", str(out), "--ckpt-every", "1"]) == 0
    assert f"model: {out / 'model'}" in capsys.readouterr().out
    weights, state = load(out / "checkpoints" / "step_0000003")
    model, tokenizer = load_pretrained(out, device="cpu")
    saved = model.state_dict()
    assert state["step"] == 3 and weights.keys() <= saved.keys()
    assert all(torch.equal(saved[k], v) for k, v in weights.items())
    assert tokenizer.encode("Romeo.") == load_pretrained(out / "model")[1].encode(
        "Romeo."
    )
    assert (
        smol(
            [
                "generate",
                "Romeo.",
                "--source",
                str(out),
                "--device",
                "cpu",
                "--max-new-tokens",
                "4",
            ]
        )
        == 0
    )
    assert capsys.readouterr().out.startswith("Romeo.")
    shutil.rmtree(out / "model")  # as a run stopped before its end leaves it
    for source, says in [
        (out, f"{out} is a training run that has not finished"),
        (out / "checkpoints" / "step_0000002", "is a training run's checkpoint"),
    ]:
        assert smol(["generate", "Hi", "--source", str(source), "--device", "cpu"]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says in err
        assert f"smol train --resume --out-dir {out}" in err


def test_cli_reports_bad_input_without_a_traceback(tmp_path, capsys):
    on_cpu = ["--no-progress", "--device", "cpu"]
    assert main(["--out-dir", str(tmp_path / "none"), "--resume", *on_cpu]) == 1
    assert "error: no checkpoint to resume from" in capsys.readouterr().err
    assert main(["--seq-len", "1024", "--out-dir", str(tmp_path / "x"), *on_cpu]) == 2
    assert "longer than the model's context" in capsys.readouterr().err


def test_cli_keeps_an_earlier_run_s_results_without_a_flag(tmp_path, capsys):
    """An out-dir holding an earlier run's summary.json (its checkpoints moved away or
    deleted) is refused before any work, naming it; the summary stays as it was."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "summary.json").write_text('{"step": 300}')
    argv = ["--out-dir", str(out), "--no-progress", "--device", "cpu"]
    assert main(argv) == 2  # a usage error, found before any work
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"out_dir {out} holds an earlier run's" in err
    assert (out / "summary.json").read_text() == '{"step": 300}'
    assert sorted(p.name for p in out.iterdir()) == ["summary.json"]


# Output folders, existing runs, damaged checkpoints


def test_clearing_removes_every_checkpoint_latest_and_leftovers(tmp_path):
    from smol import checkpoint

    t = trainer(small_config(tmp_path, steps=2, ckpt_every=1, eval_every=0))
    t.fit()
    root = tmp_path / "run" / "checkpoints"
    (root / ".step_0000003.tmp-123").mkdir()  # a save that crashed
    (root / "notes.txt").write_text("not the trainer's")
    assert checkpoint.clear(root) == [root / "step_0000001", root / "step_0000002"]
    assert sorted(p.name for p in root.iterdir()) == ["notes.txt"]
    assert checkpoint.clear(root) == []  # nothing left, no latest: no error


def test_save_alone_makes_its_root_keeps_two_and_outlives_what_it_cannot_delete(
    tmp_path, monkeypatch
):
    """checkpoint.save called on its own: it makes a root that does not exist yet,
    its manifest records the step and the run id ("" unless given), it keeps the two
    newest by default, and a save already on disk is not failed by a leftover it
    cannot remove (a file named like a crashed save's folder) or by an old checkpoint
    that vanishes before rotation deletes it (another process cleaning the folder)."""
    from smol import checkpoint

    torch.manual_seed(0)
    model = SmolLM(SmolConfig.preset("tiny"))
    root = tmp_path / "not" / "yet" / "there"
    path = checkpoint.save(root, 1, model, {"step": 1})
    assert path == root / "step_0000001"
    manifest = checkpoint.read_manifest(path)
    assert (manifest["step"], manifest["run_id"]) == (1, "")
    (root / ".step_0000009.tmp-1").write_text("a file, not a folder")
    checkpoint.save(root, 2, model, {"step": 2})
    checkpoint.save(root, 3, model, {"step": 3})
    assert [p.name for p in checkpoint.checkpoints(root)] == [
        "step_0000002",
        "step_0000003",
    ]
    read_run_id = checkpoint._run_id

    def vanishing(p):  # another process deletes step 2 while rotation reads it
        run_id = read_run_id(p)
        shutil.rmtree(root / "step_0000002", ignore_errors=True)
        return run_id

    monkeypatch.setattr(checkpoint, "_run_id", vanishing)
    checkpoint.save(root, 4, model, {"step": 4})
    assert [p.name for p in checkpoint.checkpoints(root)] == [
        "step_0000003",
        "step_0000004",
    ]
    assert (root / "latest").read_text().strip() == "step_0000004"


def test_a_checkpoint_loads_on_the_cpu_with_its_run_id_and_refuses_code(tmp_path):
    """checkpoint.load: weights on the CPU unless told, the state with the run id
    the manifest records ("" for a checkpoint that records none), and a state.pt that
    holds more than tensors and plain values (a pickle can run code) refused."""
    from smol import checkpoint

    t = trainer(small_config(tmp_path, steps=2, eval_every=0))
    t.fit()
    path = tmp_path / "run" / "checkpoints" / "step_0000002"
    weights, state = checkpoint.load(path)
    assert state["run_id"] == t.run_id and state["step"] == 2
    assert weights["model.norm.weight"].device == torch.device("cpu")
    manifest = checkpoint.read_manifest(path)
    del manifest["run_id"]
    (path / "manifest.json").write_text(json.dumps(manifest))
    assert checkpoint.load(path)[1]["run_id"] == ""
    torch.save({"step": 1, "hook": print}, path / "state.pt")
    manifest["sha256"]["state.pt"] = checkpoint.file_sha256(path / "state.pt")
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="corrupted.*[Ww]eights.only"):
        checkpoint.load(path)


def test_saved_files_say_what_they_are_and_errors_name_the_folders_kind(tmp_path):
    """A safetensors file carries format "pt", without which transformers refuses it;
    a damaged manifest or a missing file is named as a checkpoint's, or as the kind of
    folder the caller says (an adapter, a model folder)."""
    from safetensors import safe_open

    from smol import checkpoint

    checkpoint.write_safetensors({"w": torch.ones(2)}, tmp_path / "w.safetensors")
    with safe_open(tmp_path / "w.safetensors", "pt") as f:
        assert f.metadata() == {"format": "pt"}
    t = trainer(small_config(tmp_path, steps=2, eval_every=0))
    t.fit()
    path = tmp_path / "run" / "checkpoints" / "step_0000002"
    (path / "state.pt").unlink()
    with pytest.raises(CheckpointError, match=r"^checkpoint .* is incomplete"):
        checkpoint.verify(path)
    (path / "manifest.json").write_text("{")
    with pytest.raises(CheckpointError, match=r"^checkpoint .* cannot read manifest"):
        checkpoint.verify(path)
    with pytest.raises(CheckpointError, match=r"^adapter .* cannot read manifest"):
        checkpoint.verify_saved(path, "adapter")


def test_an_output_folder_that_cannot_be_written_stops_before_the_first_step(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    with pytest.raises(OSError, match=r"cannot write to out_dir .*a_file/run"):
        trainer(small_config(tmp_path, out_dir=str(blocker / "run")))
    (tmp_path / "run" / "checkpoints").parent.mkdir()
    (tmp_path / "run" / "checkpoints").write_text("a file where the checkpoints go")
    with pytest.raises(
        OSError, match=r"cannot write to the checkpoint folder .*run/checkpoints"
    ):
        trainer(small_config(tmp_path))


def test_a_folder_that_holds_a_run_is_not_trained_over_without_asking(tmp_path):
    trainer(small_config(tmp_path, steps=2, eval_every=0)).fit()
    root = tmp_path / "run" / "checkpoints"
    with pytest.raises(
        FileExistsError, match="already holds a run.*--resume.*--overwrite"
    ):
        trainer(small_config(tmp_path, steps=2, eval_every=0))
    assert (root / "step_0000002").is_dir()  # untouched
    again = trainer(small_config(tmp_path, steps=3, eval_every=0, overwrite=True))
    assert again.step == 0 and not (root / "step_0000002").exists()
    again.fit()
    steps = sorted(p.name for p in root.iterdir() if p.name.startswith("step_"))
    assert steps == ["step_0000003"]


def test_rotation_deletes_only_this_runs_checkpoints(tmp_path):
    from smol import checkpoint

    t = trainer(
        small_config(tmp_path, steps=6, ckpt_every=1, keep_checkpoints=2, eval_every=0)
    )
    t.fit(until=1)
    root = tmp_path / "run" / "checkpoints"
    foreign = root / "step_0000000"  # another run's work, put there by hand
    shutil.copytree(root / "step_0000001", foreign)
    manifest = json.loads((foreign / "manifest.json").read_text())
    (foreign / "manifest.json").write_text(
        json.dumps({**manifest, "run_id": "someone-else"})
    )
    t.fit()
    names = sorted(p.name for p in root.iterdir())
    assert names == ["latest", "step_0000000", "step_0000005", "step_0000006"]
    assert checkpoint.read_manifest(root / "step_0000006")["run_id"] == t.run_id


def flip_a_byte_of_the_largest_record(path):
    """Flip one byte inside the largest tensor record of a torch.save zip (an optimizer
    moment)."""
    with zipfile.ZipFile(path) as zf:
        info = max(
            (i for i in zf.infolist() if "/data/" in i.filename),
            key=lambda i: i.file_size,
        )
    blob = bytearray(path.read_bytes())
    at = info.header_offset
    start = (
        at
        + 30
        + int.from_bytes(blob[at + 26 : at + 28], "little")
        + int.from_bytes(blob[at + 28 : at + 30], "little")
    )
    blob[start + info.file_size // 2] ^= 0x01
    path.write_bytes(bytes(blob))


def test_a_flipped_byte_in_the_optimizer_state_is_detected(tmp_path):
    trainer(small_config(tmp_path, steps=2, eval_every=0)).fit()
    path = tmp_path / "run" / "checkpoints" / "step_0000002" / "state.pt"
    flip_a_byte_of_the_largest_record(path)
    torch.load(path, weights_only=True)  # still loads: only a checksum can tell
    with pytest.raises(CheckpointError, match="step_0000002.*state.pt does not match"):
        trainer(small_config(tmp_path, steps=2, eval_every=0, resume=True))


def test_resume_falls_back_to_the_newest_intact_checkpoint_and_says_so(
    tmp_path, capsys
):
    t = trainer(
        small_config(tmp_path, steps=6, ckpt_every=2, keep_checkpoints=3, eval_every=0)
    )
    t.fit(until=4)
    root = tmp_path / "run" / "checkpoints"
    flip_a_byte_of_the_largest_record(root / "step_0000004" / "state.pt")
    capsys.readouterr()
    again = trainer(
        small_config(
            tmp_path,
            steps=6,
            ckpt_every=2,
            keep_checkpoints=3,
            eval_every=0,
            resume=True,
        )
    )
    assert again.step == 2
    err = capsys.readouterr().err
    assert one_line_saying(err, "step_0000004 is corrupted: state.pt", "step_0000002")
    # A named checkpoint is taken as named: a damaged one is an error, not a fallback.
    with pytest.raises(CheckpointError, match="step_0000004"):
        trainer(
            small_config(
                tmp_path, steps=6, eval_every=0, resume=str(root / "step_0000004")
            )
        )
    named = trainer(
        small_config(tmp_path, steps=6, eval_every=0, resume=str(root / "step_0000002"))
    )
    assert named.step == 2


def test_cli_resumes_from_a_named_checkpoint(tmp_path, capsys):
    args = cli_args(
        ONE_LAYER,
        "--steps 4 --warmup-steps 1 --batch-size 2 --seq-len 16 --eval-every 0 "
        "--sample-tokens 0 --ckpt-every 2",
        "--out-dir",
        str(tmp_path),
    )
    assert main(args) == 0
    assert (
        main(args + ["--resume", str(tmp_path / "checkpoints" / "step_0000002")]) == 0
    )
    assert "from step 2" in capsys.readouterr().out
    assert main(args + ["--resume", "latest"]) == 0
    assert "from step 4" in capsys.readouterr().out


# Settings that change on resume


@pytest.mark.parametrize(
    "change, named",
    [
        (dict(lr=2e-2), "lr: checkpoint 0.01, now 0.02"),
        (dict(steps=8), "steps: checkpoint 6, now 8"),
        (dict(batch_size=2), "batch_size: checkpoint 4, now 2"),
        (dict(grad_accum=2), "grad_accum: checkpoint 1, now 2"),
        (dict(schedule="wsd"), "schedule: checkpoint 'cosine', now 'wsd'"),
        (dict(seed=1), "seed: checkpoint 0, now 1"),
        (dict(weight_decay=0.0), "weight_decay: checkpoint 0.1, now 0.0"),
    ],
)
def test_resume_with_settings_that_break_exactness_is_refused(tmp_path, change, named):
    trainer(small_config(tmp_path, eval_every=0)).fit(until=2)
    with pytest.raises(ValueError, match=f"{named}.*--allow-changed-settings"):
        trainer(small_config(tmp_path, eval_every=0, resume=True, **change))


def test_resume_names_every_changed_setting_and_allows_them_when_asked(
    tmp_path, capsys
):
    trainer(small_config(tmp_path, eval_every=0)).fit(until=2)
    with pytest.raises(
        ValueError, match="steps: checkpoint 6, now 8; lr: checkpoint 0.01, now 0.02"
    ):
        trainer(small_config(tmp_path, eval_every=0, resume=True, lr=2e-2, steps=8))
    capsys.readouterr()
    t = trainer(
        small_config(
            tmp_path, eval_every=0, resume=True, steps=8, allow_changed_settings=True
        )
    )
    assert t.step == 2
    err = capsys.readouterr().err
    warned = "warning: resuming with changed settings"
    assert one_line_saying(err, warned, "steps: checkpoint 6, now 8"), err
    t.fit()
    assert t.step == 8


def test_resume_may_change_what_is_logged_evaluated_and_saved(tmp_path, capsys):
    trainer(small_config(tmp_path)).fit(until=2)
    capsys.readouterr()
    # settings that MAY_CHANGE allows to differ from the first run's
    may_change = {"log_every": 2, "eval_every": 2, "eval_batches": 1, "ckpt_every": 1}
    may_change |= {"keep_checkpoints": 3, "sample_every": 0, "progress": False}
    t = trainer(small_config(tmp_path, resume=True, **may_change))
    assert t.step == 2 and capsys.readouterr().err == ""


# Settings checked before any work


@pytest.mark.parametrize(
    "bad, says",
    [
        (dict(schedule="linear"), "schedule must be 'cosine' or 'wsd', got 'linear'"),
        (dict(log_every=0), "log_every must be a positive int, got 0"),
        (dict(preset="huge"), "unknown preset 'huge'"),
        (
            dict(model_overrides={"hidden_sise": 8}),
            "unknown model setting 'hidden_sise'",
        ),
        (
            dict(model_overrides={"hidden_size": "abc"}),
            "hidden_size must be a positive int, got 'abc'",
        ),
        (dict(seq_len=0), "seq_len must be a positive int, got 0"),
        (dict(eval_batches=0), "eval_batches must be a positive int, got 0"),
        (dict(weight_decay=-1.0), "weight_decay must be >= 0, got -1.0"),
        (dict(lr=-1e-3), "lr must be a positive number, got -0.001"),
        (dict(lr=float("nan")), "lr must be a positive number, got nan"),
        (dict(min_lr=1.0), r"min_lr \(1.0\) must lie in \[0, lr"),
        (dict(warmup_steps=10, steps=5), r"warmup_steps \(10\) must lie in \[0, steps"),
        (dict(steps=0), "steps must be a positive int, got 0"),
        (dict(steps=2.5), "steps must be a positive int, got 2.5"),
        (dict(batch_size=True), "batch_size must be a positive int, got True"),
        (dict(grad_accum=0), "grad_accum must be a positive int, got 0"),
        (dict(beta2=1.0), r"beta2 must lie in \[0, 1\), got 1.0"),
        (dict(grad_clip=-1.0), "grad_clip must be >= 0"),
        (dict(decay_fraction=1.5), r"decay_fraction must lie in \[0, 1\], got 1.5"),
        (dict(eval_every=-1), "eval_every must be an int >= 0, got -1"),
        (dict(keep_checkpoints=0), "keep_checkpoints must be a positive int, got 0"),
        (dict(dtype="half"), "dtype must be one of"),
        (dict(device="gpu"), "device must be 'auto' or a torch device"),
        (dict(tokenizer="gpt2"), "tokenizer must be one of"),
        (dict(resume=True, overwrite=True), "resume and overwrite exclude each other"),
        (dict(seq_len=512), "longer than the model's context"),
    ],
)
def test_settings_are_checked_when_the_config_is_made(tmp_path, bad, says):
    with pytest.raises(ValueError, match=says):
        small_config(tmp_path, **bad)


@pytest.mark.parametrize(
    "args, says",
    [
        (["--schedule", "linear"], "schedule must be 'cosine' or 'wsd'"),
        (["--log-every", "0"], "log_every must be a positive int"),
        (["--preset", "huge"], "unknown preset 'huge'"),
        (["--set", "hidden_size=abc"], "--set hidden_size=abc: expected an int"),
        (
            ["--set", "hidden_sise=8"],
            "--set hidden_sise=8: unknown model setting 'hidden_sise'",
        ),
        (["--set", "tie_word_embeddings=maybe"], "expected true or false"),
        (["--seq-len", "0"], "seq_len must be a positive int, got 0"),
        (["--eval-batches", "0"], "eval_batches must be a positive int"),
        (["--weight-decay", "-1"], "weight_decay must be >= 0"),
        (["--lr", "-1"], "lr must be a positive number"),
        (["--warmup-steps", "400"], r"warmup_steps \(400\) must lie in \[0, steps"),
        (["--steps", "ten"], "argument --steps: invalid int value: 'ten'"),
        (["--sample-prompt", ""], "sample_prompt is empty: give a text"),
        # a byte that is not UTF-8 reaches Python as a lone surrogate
        (["--sample-prompt", "caf\udce9"], "sample_prompt is not UTF-8 text"),
        (["--seed", str(2**64)], rf"seed must lie in \[0, 2\*\*64 - 1\], got {2**64}"),
    ],
)
def test_cli_usage_errors_are_one_line_and_exit_status_2(tmp_path, capsys, args, says):
    assert main(args + ["--out-dir", str(tmp_path / "x"), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert re.search(says, err), err
    assert not (tmp_path / "x").exists()  # nothing was done


def test_sigterm_before_the_first_step_exits_143(tmp_path, capsys, monkeypatch):
    """SIGTERM while the run is set up (its data, its model): the status of a process
    SIGTERM stopped, as a scheduler expects, not Ctrl-C's 130."""
    import smol.commands.train as train_cli

    def terminated(cfg):
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(train_cli, "Trainer", terminated)
    assert main(["--out-dir", str(tmp_path / "run"), "--device", "cpu"]) == 143
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "stopped by SIGTERM; nothing was saved", err


# SIGTERM and Ctrl-C

SIGNAL_ARGS = cli_args(
    {"num_hidden_layers": 2},
    "--steps 60 --warmup-steps 5 --batch-size 4 --seq-len 32 --eval-every 0 "
    "--sample-tokens 0 --log-every 5",
)


def run_train(out_dir, *extra, signal_at=None, sig=signal.SIGTERM):
    """Run `smol train` in a subprocess; with signal_at, send `sig` once the
    checkpoint of that step exists (checkpoints every step make the run slow enough to
    catch mid-way)."""
    mark = (
        None if signal_at is None else out_dir / "checkpoints" / f"step_{signal_at:07d}"
    )
    return run_smol(
        ["train", *SIGNAL_ARGS, "--out-dir", str(out_dir), *extra], mark, sig
    )


def final_weights(out_dir):
    from safetensors.torch import load_file

    return load_file(out_dir / "checkpoints" / "step_0000060" / "model.safetensors")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("uninterrupted")
    code, out, err = run_train(out_dir)
    assert code == 0, err
    return final_weights(out_dir)


@pytest.mark.parametrize("sig, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_saves_at_the_next_step_and_the_resume_is_bit_exact(
    tmp_path, uninterrupted, sig, status
):
    out_dir = tmp_path / "run"
    code, out, err = run_train(
        out_dir, "--ckpt-every", "1", "--keep-checkpoints", "1", signal_at=3, sig=sig
    )
    assert code == status, err
    name = signal.Signals(sig).name
    assert "Traceback" not in err and err.strip().count("\n") == 1, err
    assert err.startswith(f"{name} received: saving a checkpoint after step"), err
    saved = re.search(
        rf"stopped by {name} after step (\d+): saved (\S+); continue with --resume", err
    )
    assert saved, err
    step = int(saved.group(1))
    assert 3 <= step < 60 and saved.group(2) == str(
        out_dir / "checkpoints" / f"step_{step:07d}"
    )
    code, out, err = run_train(out_dir, "--resume")
    assert code == 0, err
    assert f"from step {step}" in out
    resumed = final_weights(out_dir)
    assert resumed.keys() == uninterrupted.keys()
    for k, v in uninterrupted.items():
        assert torch.equal(resumed[k], v), k


def signalled_during(t: Trainer, step: int, sig=signal.SIGTERM) -> None:
    """Make `t` send itself `sig` while it takes step `step` (counting from 1)."""
    take = t.train_step

    def train_step():
        if t.step + 1 == step:
            os.kill(os.getpid(), sig)
        return take()

    t.train_step = train_step


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_second_signal_stops_at_once_and_says_which(tmp_path, sig):
    """The signal sent twice in one step: the second stops the run at once, as
    Terminated for SIGTERM (a command exits 143 on it, the status a scheduler reads;
    it was Ctrl-C's KeyboardInterrupt, 130) and KeyboardInterrupt for Ctrl-C."""
    from smol.interrupt import Terminated

    t = trainer(small_config(tmp_path, steps=6, ckpt_every=4, log_every=3))
    take = t.train_step

    def train_step():
        if t.step + 1 == 2:
            os.kill(os.getpid(), sig)
            os.kill(os.getpid(), sig)
        return take()

    t.train_step = train_step
    name = signal.Signals(sig).name
    with pytest.raises(KeyboardInterrupt, match=f"a second {name}") as stop:
        t.fit()
    assert isinstance(stop.value, Terminated) == (sig == signal.SIGTERM)


def test_a_signal_stops_after_its_step_with_a_checkpoint_in_process(tmp_path, capsys):
    """The loop as the command line runs it, in this process: SIGTERM during step 2 of
    6 saves step 2 (not a checkpoint interval) and raises TrainingInterrupted, which
    names the signal, the step and the folder. Handlers are put back afterwards."""
    from smol.interrupt import TrainingInterrupted

    before = signal.getsignal(signal.SIGTERM)
    t = trainer(small_config(tmp_path, steps=6, ckpt_every=4, log_every=3))
    signalled_during(t, 2)
    with pytest.raises(TrainingInterrupted) as stop:
        t.fit()
    assert (stop.value.signal_name, stop.value.step) == ("SIGTERM", 2)
    assert stop.value.path == tmp_path / "run" / "checkpoints" / "step_0000002"
    assert t.step == 2 and t.history["step"] == [1, 2]  # the losses are read back
    err = capsys.readouterr().err
    assert (
        "SIGTERM received: saving a checkpoint after step 2, then stopping (send it "
        "again to stop at once)" in err
    )
    assert signal.getsignal(signal.SIGTERM) == before
    again = trainer(dataclasses.replace(t.cfg, resume=True))
    assert again.step == 2 and again.last_checkpoint == stop.value.path


def test_a_signal_during_the_last_step_ends_the_run_as_usual(tmp_path):
    """Nothing is left to resume: the run saves its last step and returns."""
    t = trainer(small_config(tmp_path, steps=3, eval_every=0))
    signalled_during(t, 3, signal.SIGINT)
    history = t.fit()
    assert t.step == 3 and history["step"] == [1, 2, 3]
    assert t.last_checkpoint == tmp_path / "run" / "checkpoints" / "step_0000003"


def test_a_checkpoint_whose_weights_hold_nan_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    from smol import checkpoint

    trainer(small_config(tmp_path, steps=2, eval_every=0)).fit()
    path = tmp_path / "run" / "checkpoints" / "step_0000002"
    weights = load_file(path / "model.safetensors")
    weights["model.norm.weight"][0] = float("nan")
    save_file(weights, path / "model.safetensors")
    # re-signed: the file is intact, its values are not
    manifest = checkpoint.read_manifest(path)
    sha256 = checkpoint.file_sha256(path / "model.safetensors")
    manifest["sha256"]["model.safetensors"] = sha256
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="not finite.*model.norm.weight"):
        trainer(small_config(tmp_path, steps=2, eval_every=0, resume=True))
