"""Checkpoints that resume training exactly: weights (safetensors), optimizer, schedule,
data
position and RNG, with integrity checks.

A run keeps its checkpoints in root/step_NNNNNNN/{model.safetensors, state.pt}, with
a file
`latest` naming the newest. Each is written to a temporary folder, then renamed into
place
(atomic), then `latest` is replaced (atomic): a crash mid-save never damages a
checkpoint.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import random
import shutil
from pathlib import Path

import torch


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, incomplete or corrupted."""


def weights_to_save(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict as contiguous CPU tensors, without a tied head: it is the
    embedding
    matrix itself, saved once (as transformers does; SmolLM.load_state_dict re-ties
    it)."""
    tied = getattr(model.config, "tie_word_embeddings", False)
    return {
        k: v.detach().contiguous().cpu()
        for k, v in model.state_dict().items()
        if not (tied and k == "lm_head.weight")
    }


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 of every parameter's bytes: equal digests, identical weights."""
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


def rng_state() -> dict:
    """Every random generator a training step draws from: torch's, Python's and CUDA's."""
    return {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / f"step_{step:07d}"


def save(
    root: str | Path, step: int, model: torch.nn.Module, state: dict, keep: int = 2
) -> Path:
    """Write root/step_NNNNNNN (model.safetensors and state.pt, which records the
    weights'
    sha256), point `latest` at it and delete all but the `keep` newest checkpoints."""
    from safetensors.torch import save_file

    root = Path(root)
    final = step_dir(root, step)
    for stale in root.glob(".step_*.tmp-*"):  # left by a crash mid-save
        shutil.rmtree(stale, ignore_errors=True)
    tmp = root / f".{final.name}.tmp-{os.getpid()}"
    tmp.mkdir(parents=True)
    save_file(
        weights_to_save(model), tmp / "model.safetensors", metadata={"format": "pt"}
    )
    torch.save(
        {**state, "weights_sha256": file_sha256(tmp / "model.safetensors")},
        tmp / "state.pt",
    )
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    latest_tmp = root / f".latest.tmp-{os.getpid()}"
    latest_tmp.write_text(final.name + "\n")
    os.replace(latest_tmp, root / "latest")
    old = sorted(p for p in root.glob("step_*") if p.is_dir() and p != final)
    for p in old[: max(0, len(old) - (keep - 1))]:
        shutil.rmtree(p, ignore_errors=True)
    return final


def latest(root: str | Path) -> Path:
    """The newest checkpoint under root, as `latest` names it."""
    pointer = Path(root) / "latest"
    if not pointer.is_file():
        raise FileNotFoundError(
            f"no checkpoint to resume from: {pointer} does not exist "
            f"(train once without resume, or check the output folder, out_dir)"
        )
    return Path(root) / pointer.read_text().strip()


def load(path: str | Path, device="cpu") -> tuple[dict[str, torch.Tensor], dict]:
    """(weights on device, training state) of a checkpoint folder, after checking that
    both files
    are there, readable and that the weights match the checksum recorded at saving."""
    from safetensors.torch import load_file

    path = Path(path)
    if not (path / "state.pt").is_file() or not (path / "model.safetensors").is_file():
        raise FileNotFoundError(
            f"checkpoint {path} is missing (need model.safetensors and state.pt in it)"
        )
    try:
        state = torch.load(path / "state.pt", map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointError(
            f"checkpoint {path} is corrupted: cannot read state.pt ({e})"
        ) from e
    if file_sha256(path / "model.safetensors") != state.get("weights_sha256"):
        raise CheckpointError(
            f"checkpoint {path} is corrupted: model.safetensors does not match "
            "the checksum recorded in state.pt"
        )
    try:
        weights = load_file(path / "model.safetensors", device=str(device))
    except Exception as e:
        raise CheckpointError(
            f"checkpoint {path} is corrupted: cannot read model.safetensors ({e})"
        ) from e
    return weights, state


# Train-config fields that define the data stream: a resume must keep them.
DATA_FIELDS = ("seq_len", "seed", "tokenizer")
SCHEDULE_FIELDS = (
    "lr",
    "min_lr",
    "warmup_steps",
    "steps",
    "schedule",
    "decay_fraction",
)


def save_trainer(trainer, root: str | Path) -> Path:
    """Checkpoint a smol.train.Trainer: the weights, optimizer, scaler, schedule, data
    position,
    RNG, both configurations and the history (call it on the main rank only)."""
    cfg = trainer.cfg
    state = {
        "step": trainer.step,
        "optimizer": trainer.optimizer.state_dict(),
        "scaler": trainer.scaler.state_dict(),
        "schedule": {k: getattr(cfg, k) for k in SCHEDULE_FIELDS},
        "data": trainer.train_batches.state_dict(),
        "rng": rng_state(),
        "model_config": dataclasses.asdict(trainer.model_config),
        "train_config": dataclasses.asdict(cfg),
        "history": trainer.history,
        "world_size": trainer.world_size,
    }
    return save(root, trainer.step, trainer.model, state, cfg.keep_checkpoints)


def restore_trainer(trainer, path: str | Path) -> None:
    """Put a Trainer back where save_trainer left it; refuses a checkpoint of another
    model or
    data stream."""
    weights, state = load(path, trainer.device)
    saved, now = state["model_config"], dataclasses.asdict(trainer.model_config)
    diff = [
        f"{k}: checkpoint {saved.get(k)!r}, now {now.get(k)!r}"
        for k in now
        if saved.get(k) != now.get(k)
    ]
    diff += [
        f"{k}: checkpoint {state['train_config'].get(k)!r}, now "
        f"{getattr(trainer.cfg, k)!r}"
        for k in DATA_FIELDS
        if state["train_config"].get(k) != getattr(trainer.cfg, k)
    ]
    if diff:
        raise ValueError(
            f"checkpoint {path} was saved with another configuration:\n    "
            + "\n    ".join(diff)
        )
    trainer.model.load_state_dict(weights)
    trainer.optimizer.load_state_dict(state["optimizer"])
    trainer.scaler.load_state_dict(state["scaler"])
    trainer.train_batches.load_state_dict(state["data"])
    trainer.step = state["step"]
    trainer.history = state["history"]
    set_rng_state(state["rng"])
