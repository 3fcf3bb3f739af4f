"""10 Training loop: next-token batches and the learning-rate schedule (the optimizer's
side: `train_step`).

The checks are properties (warmup ends at max_lr, cosine midpoint, ...) rather than a
comparison with one implementation, so either off-by-one convention of the warmup
passes."""

import math

import torch

from smol.grading.checks._util import pair, same_pair, small_config
from smol.grading.registry import probe_check, task


task(
    "next_token_batch",
    "training_loop",
    "next_token_batch(tokens, mask): inputs and shifted targets",
)
task(
    "lr_schedule",
    "training_loop",
    "lr_schedule(step, ...): linear warmup, cosine decay",
)

CONFIG = small_config(61)


def _split(out):
    """(inputs, targets), as the student's next_token_batch returns them."""
    return pair(out, "return (input_ids, targets)")


def _batch(fn, tokens):
    """Probe side: the student's (inputs, targets) for `tokens`, without a mask."""
    return _split(fn(tokens, None))


def _judge_batch_shapes(tokens, out):
    names = ("inputs", "targets")
    same_pair(out, "return (input_ids, targets)", names, (3, 8), torch.long)


def _judge_shifted(tokens, out):
    inputs, targets = _split(out)
    assert torch.equal(inputs, tokens[:, :-1]), "inputs are not tokens[:, :-1]"
    assert torch.equal(targets, tokens[:, 1:]), "targets are not tokens[:, 1:]"


for name, points, hint, shape, judge in (
    (
        "shapes: (B, T + 1) tokens give (B, T) inputs and targets, both long",
        1,
        "inputs drop the last token, targets drop the first",
        (3, 9),
        _judge_batch_shapes,
    ),
    (
        "targets[:, t] is the token after inputs[:, t]",
        2,
        "inputs = tokens[:, :-1], targets = tokens[:, 1:]",
        (2, 7),
        _judge_shifted,
    ),
):
    probe_check(
        "next_token_batch",
        name,
        points,
        hint,
        inputs=lambda shape=shape: torch.randint(0, 100, shape),
        judge=judge,
    )(_batch)


def _judge_padding(inputs, out):
    tokens, mask = inputs["tokens"], inputs["mask"]
    _, targets = _split(out["batch"])
    want = tokens[:, 1:].clone()
    want[mask[:, 1:] == 0] = -100
    assert torch.equal(out["tokens"], tokens), (
        "next_token_batch modified the tokens in place"
    )
    assert torch.equal(targets, want), (
        f"targets {targets.tolist()}, expected {want.tolist()}"
    )


@probe_check(
    "next_token_batch",
    "targets that are padding become -100 (ignored by the loss)",
    1,
    "shift the mask like the tokens: targets[mask[:, 1:] == 0] = -100, on a copy; "
    "padding may stand on the right or on the left",
    inputs=lambda: {
        "tokens": torch.randint(0, 100, (3, 6)),
        "mask": torch.tensor(
            [[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]]
        ),
    },
    judge=_judge_padding,
)
def _(fn, inputs):
    tokens = inputs["tokens"]
    return {"batch": _split(fn(tokens, inputs["mask"])), "tokens": tokens}


SCHEDULE = {"max_lr": 1e-3, "warmup_steps": 100, "total_steps": 1000, "min_lr": 1e-4}
# other proportions: min_lr a third of max_lr (not the common tenth), warmup 15%
OTHER = {"max_lr": 3e-3, "warmup_steps": 30, "total_steps": 230, "min_lr": 1e-3}


def _lrs(fn, steps, schedule=SCHEDULE):
    """Probe side: the student's lr at each of `steps`."""
    return [fn(step, **schedule) for step in steps]


def _lr(out):
    """Judge side: one lr the student's schedule returned, as a float."""
    assert isinstance(out, (float, int)) and not isinstance(out, bool), (
        f"lr_schedule should return a float, got {type(out).__name__}"
    )
    return float(out)


def _judge_warmup(inputs, outs):
    lrs = [_lr(out) for out in outs]
    assert len(lrs) == 101, "one lr per step"
    assert lrs[0] <= 1e-3 / 100 + 1e-12, (
        f"lr at step 0 is {lrs[0]:.3g}; warmup starts near 0"
    )
    assert abs(lrs[100] - 1e-3) < 1e-3 * 0.011, (
        f"lr at the end of warmup is {lrs[100]:.3g}, expected max_lr 1e-3"
    )
    steps = [b - a for a, b in zip(lrs[:99], lrs[1:100])]
    assert max(steps) - min(steps) < 1e-9, "warmup is not linear (unequal increments)"


@probe_check(
    "lr_schedule",
    "linear warmup from about 0 to max_lr over warmup_steps",
    1,
    "max_lr * step / warmup_steps (or (step + 1) / warmup_steps) while step < "
    "warmup_steps",
    judge=_judge_warmup,
)
def _(fn, _):
    return _lrs(fn, range(101))


def _judge_cosine(inputs, out):
    (mid, quarter), (other,), decay = out
    mid = _lr(mid)
    assert abs(mid - 5.5e-4) < 1e-5, (
        f"lr at step 550 of 1000 (warmup 100) is {mid:.4g}, expected 5.5e-4"
    )
    quarter = _lr(quarter)
    want = 1e-4 + 0.9e-3 * 0.5 * (1 + math.cos(math.pi * 0.25))
    assert abs(quarter - want) < 1e-5, (
        f"lr at step 325 is {quarter:.4g}, expected {want:.4g}"
    )
    mid = _lr(other)
    assert abs(mid - 2e-3) < 2e-5, (
        f"lr at step 130 of 230 (warmup 30, max_lr 3e-3, min_lr 1e-3) is {mid:.4g}, "
        "expected 2e-3"
    )
    lrs = [_lr(lr) for lr in decay]
    assert all(b <= a + 1e-12 for a, b in zip(lrs, lrs[1:])), (
        "lr rises during the decay"
    )


@probe_check(
    "lr_schedule",
    "cosine decay: halfway through the decay lr is (max_lr + min_lr) / 2",
    1,
    "progress = (step - warmup) / (total - warmup); min_lr + (max_lr - min_lr) * 0.5 * "
    "(1 + cos(pi * progress))",
    judge=_judge_cosine,
)
def _(fn, _):
    return [
        _lrs(fn, (550, 325)),
        _lrs(fn, (130,), OTHER),
        _lrs(fn, range(100, 1001, 50)),
    ]


# warmup to the very end: no step of decay, and min_lr at total_steps all the same
WARMUP_ONLY = {"max_lr": 1e-3, "warmup_steps": 10, "total_steps": 10, "min_lr": 1e-4}


def _judge_end(inputs, outs):
    ends = (
        (1000, "", outs[0]),
        (1500, "", outs[1]),
        (10, " of 10 (warmup 10)", outs[2]),
    )
    for step, of, out in ends:
        lr = _lr(out)
        assert abs(lr - 1e-4) < 1e-6, (
            f"lr at step {step}{of} is {lr:.4g}, expected min_lr 1e-4"
        )


@probe_check(
    "lr_schedule",
    "ends at min_lr and stays there after total_steps, with warmup to the end too",
    1,
    "return min_lr when step >= total_steps (clamping progress to 1 leaves max_lr "
    "where warmup_steps == total_steps)",
    judge=_judge_end,
)
def _(fn, _):
    return [*_lrs(fn, (1000, 1500)), *_lrs(fn, (10,), WARMUP_ONLY)]


NO_WARMUP = {"max_lr": 1e-3, "warmup_steps": 0, "total_steps": 100, "min_lr": 1e-4}


def _judge_no_warmup(inputs, outs):
    for step, out, want in zip((0, 50, 100), outs, (1e-3, 5.5e-4, 1e-4), strict=True):
        lr = _lr(out)
        assert abs(lr - want) < want * 1e-3, (
            f"lr at step {step} of 100 without warmup is {lr:.4g}, expected {want:.4g}"
        )


@probe_check(
    "lr_schedule",
    "no warmup (warmup_steps = 0): max_lr at step 0, then the cosine decay",
    1,
    "warm up only while step < warmup_steps, so that step / warmup_steps is never "
    "taken with warmup_steps = 0 (fine-tuning often runs without warmup)",
    judge=_judge_no_warmup,
)
def _(fn, _):
    return _lrs(fn, (0, 50, 100), NO_WARMUP)
