"""What only a GPU shows: the trainer, its checkpoints and its random generators on
CUDA. Skipped without one; `tests/gpu_mutants.py` runs these on a GPU against the
mutants of tests/mutants_need_a_gpu.csv, which pass every CPU test."""

import dataclasses
import time

import pytest
import torch

from smol import checkpoint
from tests.test_train import small_config, trainer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def tensors(tree):
    """Every tensor in a nest of dicts, lists and tuples."""
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, dict):
        for value in tree.values():
            yield from tensors(value)
    elif isinstance(tree, (list, tuple)):
        for value in tree:
            yield from tensors(value)


def test_the_trainer_finds_the_gpu_and_trains_there(tmp_path):
    t = trainer(small_config(tmp_path, device="auto", steps=4, eval_every=2))
    assert t.device == torch.device("cuda", 0)
    assert all(p.device == t.device for p in t.model.parameters())
    t.fit()
    assert len(t.history["loss"]) == 4 and t.history["loss"][-1] < t.history["loss"][0]


def test_float16_training_scales_its_loss_on_the_trainers_device(tmp_path):
    """A T4's path: float16 autocast needs an enabled GradScaler, or gradients under
    float16's smallest normal number (6e-5) flush to zero."""
    t = trainer(small_config(tmp_path, device="cuda", dtype="fp16", eval_every=0))
    assert t.amp_dtype == torch.float16 and t.scaler.is_enabled()
    t.fit()
    assert t.scaler.get_scale() > 1  # the loss was scaled: the factor is still in use
    assert all(torch.isfinite(p).all() for p in t.model.parameters())
    assert t.history["loss"][-1] < t.history["loss"][0]


def test_tokens_per_second_counts_finished_work(tmp_path):
    """The clock is read after the device has done the steps it counts: the tokens/s
    the trainer reports are no more than the whole run's, timed with a final sync."""
    cfg = small_config(
        tmp_path,
        device="cuda",
        model_overrides={
            **small_config(tmp_path).model_overrides,
            "hidden_size": 512,
            "intermediate_size": 2048,
            "num_hidden_layers": 4,
            "num_attention_heads": 8,
            "num_key_value_heads": 4,
        },
        batch_size=16,
        seq_len=64,
        steps=30,
        log_every=30,
        eval_every=0,
        ckpt_every=0,
    )
    t = trainer(cfg)
    torch.cuda.synchronize()
    start = time.perf_counter()
    t.fit()
    torch.cuda.synchronize()
    whole = t.tokens_per_step * cfg.steps / (time.perf_counter() - start)
    assert t.history["tokens_per_s"][-1] <= 1.05 * whole


def test_a_gpu_checkpoint_loads_its_state_on_the_cpu_and_weights_where_asked(tmp_path):
    t = trainer(small_config(tmp_path, device="cuda", steps=2, eval_every=0))
    t.fit()
    weights, state = checkpoint.load(t.last_checkpoint)
    found = list(tensors(state))
    assert found and all(x.device.type == "cpu" for x in found)
    assert all(w.device.type == "cpu" for w in weights.values())
    on_gpu, _ = checkpoint.load(t.last_checkpoint, device="cuda")
    assert all(w.device.type == "cuda" for w in on_gpu.values())
    for name, w in weights.items():
        assert torch.equal(on_gpu[name].cpu(), w), name
    read = checkpoint.read_safetensors(
        t.last_checkpoint / "model.safetensors", device="cuda"
    )
    assert read.keys() == weights.keys()
    assert all(w.device.type == "cuda" for w in read.values())


def test_the_cuda_generator_is_saved_and_restored():
    torch.cuda.manual_seed(1)
    state = checkpoint.rng_state()
    assert len(state["cuda"]) == torch.cuda.device_count()
    first = torch.randn(8, device="cuda")
    torch.cuda.manual_seed(2)  # somewhere else entirely
    checkpoint.set_rng_state(state)
    assert torch.equal(torch.randn(8, device="cuda"), first)


def test_a_gpu_resume_draws_what_the_uninterrupted_run_draws(tmp_path):
    """The trainer's own checkpoints carry the CUDA generator: after a resume the
    next CUDA draw is the one the run that never stopped makes."""
    cfg = small_config(tmp_path / "split", device="cuda", eval_every=0)
    first = trainer(cfg)
    first.fit(until=3)
    expected = torch.randn(4, device="cuda")  # the draw right after the checkpoint
    torch.cuda.manual_seed(123)
    second = trainer(dataclasses.replace(cfg, resume=True))
    assert second.step == 3
    assert torch.equal(torch.randn(4, device="cuda"), expected)
