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
    """The loss, or a trained weight, became NaN or infinite. `where`: what did, at
    which step; `kept`: what is kept of the run; `causes`: the settings to change
    ({name: value}), the likeliest first; `advice`: what to try, in a command's
    words (None: said from `causes`)."""

    def __init__(self, where: str, kept: str, causes: dict, advice: str | None = None):
        self.where, self.kept, self.causes, self.advice = where, kept, causes, advice
        if advice is None:
            advice = "Try " + " or ".join(
                CAUSES[name].format(value) for name, value in causes.items()
            )
        super().__init__(f"training diverged: {where}; stopping ({kept}). {advice}.")

    def but(self, **changed) -> TrainingDiverged:
        """The same divergence with `changed` fields (kept, advice)."""
        fields = dict(where=self.where, kept=self.kept, causes=self.causes)
        return TrainingDiverged(**(fields | {"advice": self.advice} | changed))


# what to do about each setting that may make a run diverge, given its value
CAUSES = {
    "lr": "a lower learning rate (lr={})",
    "grad_clip": "gradient clipping (grad_clip={})",
    "beta": "no KL term (beta=0, now {})",
}


def diverged(
    trainer, what: str, value: float, step=None, sampled: bool = False, **causes
):
    """The TrainingDiverged to raise: where, and what to try instead (the learning
    rate and gradient clipping, unless `causes` names other settings). `sampled`:
    `what` came of the weights of trainer.step, not of a step being taken, and a
    checkpoint of that step holds them."""
    last = trainer.last_checkpoint
    kept = f"the last good checkpoint is kept: {last}"
    if last is None:
        kept = "no checkpoint was saved before it"
    elif sampled and last == checkpoint.step_dir(trainer.checkpoint_root, trainer.step):
        kept = f"the last checkpoint, {last}, holds the weights that diverged"
    cfg = trainer.cfg
    causes = causes or {"lr": cfg.lr, "grad_clip": cfg.grad_clip}
    when = "after" if sampled else "at"
    where = f"{what} is {value} {when} step {step or trainer.step}"
    return TrainingDiverged(where, kept, causes)


def check_weights(trainer) -> None:
    """TrainingDiverged where a trained weight is NaN or infinite: the step just
    taken made it so (its loss, of the weights before it, was finite), and a
    checkpoint of them would be named the last good one."""
    trained = [p.detach() for p in trainer.model.parameters() if p.requires_grad]
    # NaN and inf reach the smallest or largest value: no mask of a weight's size
    ends = torch.stack([torch.stack(torch.aminmax(p)).float() for p in trained])
    bad = ends[~torch.isfinite(ends)]  # one sync
    if bad.numel():
        raise diverged(trainer, "a trained weight", bad[0].item())


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
