"""10 Training loop, the tasks with a deterministic result against smol's on
generated inputs (`_differential`). next_token_batch: windows of two tokens to
ten, with no mask or one of bool, int or float holding padding on the left, the
right, between tokens, or only padding; the inputs, the targets (-100 where the
next token is padding) and their dtype compared.
lr_schedule: schedules of any proportions (no warmup, warmup to the end, one
step, min_lr 0 or max_lr), every step from the end of the warmup to past the end
(during the warmup either convention, step / warmup_steps or (step + 1) /
warmup_steps, is right, and the targeted checks judge it). param_groups and the
train step act on a model and an optimizer: their targeted checks compare what
they do with smol's on a model."""

import torch

from smol.data import next_token_targets
from smol.grading.checks import _differential as diff
from smol.grading.checks.generation_differential import padding_row
from smol.model import IGNORE_INDEX
from smol.optim import lr_schedule

NAME = "generated inputs: values and dtypes equal smol's"
CASES = 40


def _batch_case(g) -> dict:
    B, T = diff.pick(g, (1, 2, 4)), diff.pick(g, (2, 3, 6, 10))
    tokens = torch.randint(0, 100, (B, T), generator=g)
    mask = None
    if torch.rand((), generator=g) < 0.8:
        mask = torch.stack([padding_row(g, T) for _ in range(B)])
        mask = mask.to(diff.pick(g, (torch.long, torch.bool, torch.int32, torch.float)))
    shown = (
        "no mask"
        if mask is None
        else f"mask {mask.int().tolist()} ({diff.dtype_name(mask)})"
    )
    return diff.exact(
        f"tokens {tokens.tolist()}, {shown}", {"tokens": tokens, "mask": mask}
    )


def _call_batch(fn, args):
    return list(fn(args["tokens"].clone(), args["mask"]))


def _smol_batch():
    def next_token_batch(tokens, mask=None):
        inputs, targets = next_token_targets(tokens)
        if mask is None:
            return inputs, targets
        return inputs, targets.masked_fill(mask[:, 1:] == 0, IGNORE_INDEX)

    return next_token_batch


def _schedule_case(g) -> dict:
    total = diff.pick(g, (1, 2, 10, 37, 1000))
    warmup = diff.pick(g, (0, 0, 1, total // 3, total))
    max_lr = diff.pick(g, (1e-3, 3e-4, 6e-2))
    min_lr = max_lr * diff.pick(g, (0.0, 0.1, 1 / 3, 1.0))
    steps = sorted(
        {
            warmup,
            total,
            total + 5,
            *torch.randint(warmup, total + 1, (12,), generator=g).tolist(),
        }
    )
    schedule = {
        "max_lr": max_lr,
        "warmup_steps": warmup,
        "total_steps": total,
        "min_lr": min_lr,
    }
    return diff.exact(
        f"steps {steps} of {schedule}",
        {"schedule": schedule, "steps": steps},
        (1e-12, 1e-9),
    )


def _call_schedule(fn, args):
    lrs = [fn(step, **args["schedule"]) for step in args["steps"]]
    for lr in lrs:
        if not isinstance(lr, (float, int)) or isinstance(lr, bool):
            raise TypeError(f"lr_schedule returned {type(lr).__name__}, not a float")
    return [torch.tensor(lrs, dtype=torch.float64)]


for task, make, call, reference, hint in (
    (
        "next_token_batch",
        _batch_case,
        _call_batch,
        _smol_batch,
        "the case named below differs from smol's batch: inputs tokens[:, :-1], "
        "targets tokens[:, 1:] (long) with -100 where mask[:, 1:] is 0, whatever "
        "the mask's dtype (bool, int, float) and wherever its zeros stand",
    ),
    (
        "lr_schedule",
        _schedule_case,
        _call_schedule,
        lambda: lr_schedule,
        "the case named below differs from smol.optim.lr_schedule after the "
        "warmup: min_lr + (max_lr - min_lr) * 0.5 * (1 + cos(pi * progress)), "
        "progress = (step - warmup_steps) / (total_steps - warmup_steps), and "
        "min_lr from total_steps on",
    ),
):
    diff.register(task, NAME, 1, hint, make, call, reference, CASES)
