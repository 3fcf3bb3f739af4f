"""A run's checkpoints as the Trainer writes and reads them (the files themselves are
smol.checkpoint's): what a checkpoint of a run holds, which settings a resume may
change, putting a trainer back where it stopped, finding the checkpoint to continue
from, and an output folder that never trains over another run unasked."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from smol import checkpoint
from smol.train_report import log

# Train-config fields a resume may change: what is logged, evaluated, sampled and saved,
# and where and how fast it runs (another device or torch.compile gives the same
# training up to floating-point rounding, not bit for bit). Every other field, the
# model's config and the number of processes change what is trained: a resume refuses
# them unless allow_changed_settings. The model is compared whole, not by preset and
# model_overrides.
MAY_CHANGE = (
    "log_every",
    "eval_every",
    "eval_batches",
    "sample_every",
    "sample_prompt",
    "sample_tokens",
    "ckpt_every",
    "keep_checkpoints",
    "out_dir",
    "device",
    "compile",
    "progress",
    "resume",
    "overwrite",
    "allow_changed_settings",
    "preset",
    "model_overrides",
)
SCHEDULE_FIELDS = (
    "lr",
    "min_lr",
    "warmup_steps",
    "steps",
    "schedule",
    "decay_fraction",
)


def prepare_out_dir(cfg, root: Path) -> None:
    """Check that cfg.out_dir and its checkpoint folder `root` can be written, and that
    they hold no other run: continuing one takes resume, starting over in its place
    takes overwrite (which deletes its checkpoints)."""
    checkpoint.check_writable(cfg.out_dir, "out_dir")
    checkpoint.check_writable(root, "the checkpoint folder")
    found = checkpoint.checkpoints(root)
    if cfg.resume or not (found or (root / "latest").exists()):
        return
    if not cfg.overwrite:
        newest = f" (newest: {found[-1].name})" if found else ""
        raise FileExistsError(
            f"out_dir {cfg.out_dir} already holds a run{newest}: continue it with "
            "--resume (resume=True), or delete its checkpoints and start over "
            "with --overwrite (overwrite=True)"
        )
    gone = checkpoint.clear(root)
    log(
        f"overwrite: deleted the {len(gone)} checkpoint(s) of the previous run "
        f"in {root}"
    )


def find_checkpoint(path: str | Path, warn: bool = True) -> Path:
    """The checkpoint to resume from. `path`: a checkpoint folder, taken as it is (a
    damaged one is an error when it is loaded); or a run's out_dir or a folder of
    checkpoints, whose newest intact one is taken, saying (when `warn`) which damaged
    ones it skipped."""
    path = Path(path)
    if not (path / checkpoint.MANIFEST).exists() and (path / "checkpoints").is_dir():
        path = path / "checkpoints"  # a run's out_dir
    if path.name.startswith("step_") or (path / checkpoint.MANIFEST).exists():
        return path
    path, damaged = checkpoint.newest_intact(path)
    if damaged and warn:
        log(
            f"warning: {'; '.join(map(str, damaged))}; resuming from {path.name}, "
            "the newest intact checkpoint"
        )
    return path


def save_trainer(trainer, root: str | Path) -> Path:
    """Checkpoint a smol.train.Trainer: the weights, optimizer, scaler, schedule, data
    position, RNG, both configurations and the history (call it on the main rank only).
    """
    cfg = trainer.cfg
    state = {
        "step": trainer.step,
        "optimizer": trainer.optimizer.state_dict(),
        "scaler": trainer.scaler.state_dict(),
        "schedule": {k: getattr(cfg, k) for k in SCHEDULE_FIELDS},
        "data": trainer.train_batches.state_dict(),
        "rng": checkpoint.rng_state(),
        "model_config": dataclasses.asdict(trainer.model_config),
        "train_config": {
            k: str(v) if isinstance(v, os.PathLike) else v
            for k, v in dataclasses.asdict(cfg).items()
        },
        "history": trainer.history,
        "world_size": trainer.world_size,
        "trainer": trainer_kind(trainer),
    }
    return checkpoint.save(
        root, trainer.step, trainer.model, state, cfg.keep_checkpoints, trainer.run_id
    )


def trainer_kind(trainer) -> str:
    """The smol trainer class that `trainer` is or extends (Trainer, SFTTrainer,
    DPOTrainer, GRPOTrainer): a checkpoint resumes only in the same kind."""
    return next(
        c.__name__ for c in type(trainer).__mro__ if c.__module__.startswith("smol.")
    )


def changed_settings(state: dict, trainer) -> list[str]:
    """'name: checkpoint X, now Y' for every setting that differs from the checkpoint's
    and would make the resumed run differ from an uninterrupted one."""

    def differ(saved: dict, now: dict) -> list[str]:
        return [
            f"{k}: checkpoint {saved[k]!r}, now {now.get(k)!r}"
            for k in saved
            if k not in MAY_CHANGE and saved[k] != now.get(k)
        ]

    ranks = {"world_size": state["world_size"]}, {"world_size": trainer.world_size}
    return (
        differ(state["model_config"], dataclasses.asdict(trainer.model_config))
        + differ(state["train_config"], dataclasses.asdict(trainer.cfg))
        + differ(*ranks)
    )


def restore_trainer(
    trainer, path: str | Path, allow_changed: bool = False
) -> list[str]:
    """Put a Trainer back where save_trainer left it. Refuses settings that would not
    continue the same run (changed_settings), unless allow_changed: then it warns (on
    the main rank) and returns them."""
    weights, state = checkpoint.load(path, trainer.device)
    saved, kind = state.get("trainer"), trainer_kind(trainer)  # None: saved before
    if saved is not None and saved != kind:
        raise ValueError(
            f"checkpoint {path} is a {saved}'s run, not a {kind}'s: continue it with "
            "what made it (smol train, finetune, dpo and grpo each keep their own)"
        )
    changed = changed_settings(state, trainer)
    if changed and not allow_changed:
        raise ValueError(
            f"checkpoint {path} was saved with other settings, so resuming would not "
            f"continue the same run: {'; '.join(changed)}; resume with the "
            "checkpoint's settings, or pass --allow-changed-settings "
            "(allow_changed_settings=True) to continue anyway"
        )
    trainer.model.load_state_dict(weights)
    trainer.optimizer.load_state_dict(state["optimizer"])
    trainer.scaler.load_state_dict(state["scaler"])
    trainer.train_batches.load_state_dict(state["data"])
    trainer.step = state["step"]
    trainer.history = state["history"]
    trainer.run_id = state["run_id"]
    checkpoint.set_rng_state(state["rng"])
    if changed and trainer.is_main:
        log(
            "warning: resuming with changed settings, so the run no longer matches "
            f"an uninterrupted one: {'; '.join(changed)}"
        )
    return changed
