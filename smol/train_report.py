"""What a training run tells: its history of losses, read back from the device at
log steps (record_losses, which stops a diverged run), the progress bar, one-line notes
on stderr (log), its final numbers (summary) and its loss curves (plot_history)."""

from __future__ import annotations

import math
import sys
import time

import torch
import torch.distributed as dist

from smol import checkpoint


class TrainingDiverged(FloatingPointError):
    """The loss became NaN or infinite."""


def diverged(trainer, what: str, value: float, step: int | None = None):
    """The TrainingDiverged to raise: where, and what to try instead."""
    kept = (
        f"the last good checkpoint is kept: {trainer.last_checkpoint}"
        if trainer.last_checkpoint
        else "no checkpoint was saved before it"
    )
    return TrainingDiverged(
        f"training diverged: {what} is {value} at step {step or trainer.step}; "
        f"stopping ({kept}). "
        f"Try a lower learning rate (lr={trainer.cfg.lr}) or gradient clipping "
        f"(grad_clip={trainer.cfg.grad_clip})."
    )


def record_losses(trainer, pending: list[tuple[int, float, torch.Tensor]]) -> None:
    """Read the (step, lr, loss) of `pending` into the trainer's history in one sync;
    raises TrainingDiverged at the first loss that is not finite."""
    if not pending:
        return
    losses = torch.stack([loss for _, _, loss in pending]).tolist()
    for (step, lr, _), loss in zip(pending, losses):
        if not math.isfinite(loss):
            raise diverged(trainer, "loss", loss, step)
        trainer.history["step"].append(step)
        trainer.history["lr"].append(lr)
        trainer.history["loss"].append(loss)


def show_progress(trainer, bar, steps: int, tokens: int, clock: float) -> None:
    """The tokens/s since `clock` into the history; the last loss, tokens/s and MFU on
    the progress bar, moved on by `steps`."""
    tok_s = tokens / (time.perf_counter() - clock)
    trainer.history["tokens_per_s"].append(tok_s)
    postfix = {"loss": f"{trainer.history['loss'][-1]:.3f}", "tok/s": f"{tok_s:,.0f}"}
    if trainer.peak:
        postfix["MFU"] = f"{trainer.mfu(tok_s):.1%}"
    bar.set_postfix(postfix, refresh=False)
    bar.update(steps)


def log(message: str) -> None:
    """One line on stderr: warnings and notes that must not mix with the progress
    output."""
    print(message, file=sys.stderr, flush=True)


def summary(trainer) -> dict:
    """A Trainer's final numbers; under DDP also every rank's weights digest (all equal
    when replicas agree)."""
    digest = checkpoint.weights_digest(trainer.model)
    digests = [digest]
    if trainer.world_size > 1:
        digests = [None] * trainer.world_size
        dist.all_gather_object(digests, digest)
    h = trainer.history
    tok_s = h["tokens_per_s"][-1] if h["tokens_per_s"] else None
    return {
        "step": trainer.step,
        "loss": h["loss"][-1] if h["loss"] else None,
        "val_loss": h["val_loss"][-1] if h["val_loss"] else None,
        "tokens_per_s": tok_s,
        "mfu": trainer.mfu(tok_s) if tok_s else None,
        "device": str(trainer.device),
        "world_size": trainer.world_size,
        "weights_digests": digests,
        "losses": h["loss"],
    }


def plot_history(history: dict, ax=None, title: str | None = None):
    """The training loss per step and the validation loss at each evaluation."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(history["step"], history["loss"], label="train", lw=1)
    if history["val_step"]:
        ax.plot(history["val_step"], history["val_loss"], "o-", label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(title or "loss")
    ax.legend()
    return ax
