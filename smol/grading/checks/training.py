"""10 Training loop: next-token batches, the learning-rate schedule, weight-decay
groups, and a train step whose loss is not shifted.

The checks are properties (warmup ends at max_lr, cosine midpoint, ...) rather than a
comparison with one implementation, so either off-by-one convention of the warmup
passes."""

import math

import torch

from smol import SmolLM
from smol.grading.checks._util import close, pair, same_pair, small_config
from smol.grading.registry import probe_check, task


def _first_adamw():
    """AdamW's first use imports torch._dynamo (seconds): once, before the checks
    fork."""
    torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])


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
task(
    "param_groups",
    "training_loop",
    "param_groups(model, weight_decay): decay matrices only",
    warm_up=_first_adamw,
)
task(
    "train_step_bug",
    "training_loop",
    "Find the bug: a train step whose loss goes down and learns nothing useful",
    warm_up=_first_adamw,
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


def _judge_end(inputs, outs):
    for step, out in zip((1000, 1500), outs, strict=True):
        lr = _lr(out)
        assert abs(lr - 1e-4) < 1e-6, (
            f"lr at step {step} is {lr:.4g}, expected min_lr 1e-4"
        )


@probe_check(
    "lr_schedule",
    "ends at min_lr and stays there after total_steps",
    1,
    "clamp progress to 1 (or return min_lr when step >= total_steps)",
    judge=_judge_end,
)
def _(fn, _):
    return _lrs(fn, (1000, 1500))


def _groups(fn, wd=0.1):
    """Probe side: the student's groups for a fresh model, each parameter by its name
    (None for one that is not the model's)."""
    model = SmolLM(CONFIG)
    groups = fn(model, wd)
    assert isinstance(groups, (list, tuple)) and len(groups) == 2, (
        "return a list of two dicts (decay, no decay)"
    )
    for g in groups:
        assert isinstance(g, dict) and "params" in g, (
            "each group is a dict with 'params' and 'weight_decay'"
        )
    names = {id(p): name for name, p in model.named_parameters()}
    return [
        {
            "params": [names.get(id(p)) for p in g["params"]],
            "weight_decay": g.get("weight_decay"),
        }
        for g in groups
    ]


def _judge_each_once(inputs, groups):
    names = [n for g in groups for n in g["params"]]
    want = {name for name, _ in SmolLM(CONFIG).named_parameters()}
    assert len(names) == len(set(names)), "a parameter appears twice"
    assert set(names) == want, (
        f"{len(want - set(names))} parameters are missing, "
        f"{len(set(names) - want)} are foreign"
    )


@probe_check(
    "param_groups",
    "two groups with every parameter exactly once (the tied matrix once)",
    1,
    "iterate model.named_parameters() (it lists a shared tensor once) and split it in "
    "two lists",
    judge=_judge_each_once,
)
def _(fn, _):
    return _groups(fn)


def _judge_decay(inputs, groups):
    def with_decay(value):
        return {n for g in groups if g["weight_decay"] == value for n in g["params"]}

    decay, none = with_decay(0.037), with_decay(0.0)
    for name, p in SmolLM(CONFIG).named_parameters():
        want, where = (
            (decay, "with weight decay 0.037 (the argument)")
            if p.dim() >= 2
            else (none, "with weight decay 0.0")
        )
        assert name in want, f"{name} ({p.dim()}-D) should be in the group {where}"


@probe_check(
    "param_groups",
    "weight decay on matrices (>= 2-D) only; norm weights get 0",
    2,
    "p.dim() >= 2 -> weight_decay, else 0.0: decaying norm gains pulls them towards "
    "zero",
    judge=_judge_decay,
)
def _(fn, _):
    return _groups(fn, 0.037)  # not 0.1: the argument, not a constant


def _model(state):
    model = SmolLM(CONFIG)
    model.load_state_dict(state)
    return model


def _model_and_batch():
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, CONFIG.vocab_size, (4, 17), generator=g)
    return {"state": SmolLM(CONFIG).state_dict(), "tokens": tokens}


def _judge_changed(inputs, after):
    before = inputs["state"]
    assert sorted(after) == sorted(before), "the model's parameters changed names"
    assert any(not torch.equal(before[k], after[k]) for k in before), (
        "no parameter changed"
    )


@probe_check(
    "param_groups",
    "AdamW accepts the groups and takes a step",
    1,
    "torch.optim.AdamW(param_groups(model, 0.1), lr=...) must work: lists of "
    "Parameters, not names",
    inputs=_model_and_batch,
    judge=_judge_changed,
)
def _(fn, inputs):
    model, ids = _model(inputs["state"]), inputs["tokens"]
    opt = torch.optim.AdamW(fn(model, 0.1), lr=1e-3)
    model(ids, targets=ids)[1].backward()
    opt.step()
    return model.state_dict()


def _stepped(fn, inputs, optimizer, lr):
    """Probe side: the student's train step on the inputs' model and tokens, with a
    fresh `optimizer` at `lr`: (what it returned, the model after it)."""
    model = _model(inputs["state"])
    return fn(model, optimizer(model.parameters(), lr=lr), inputs["tokens"]), model


def _judge_float(inputs, out):
    assert isinstance(out, float), f"returned {type(out).__name__}, expected float"


@probe_check(
    "train_step_bug",
    "returns the loss as a Python float",
    1,
    "return loss.item() (a float frees the graph; a tensor keeps it alive)",
    inputs=_model_and_batch,
    judge=_judge_float,
)
def _(fn, inputs):
    return _stepped(fn, inputs, torch.optim.AdamW, 1e-3)[0]


def _judge_loss(inputs, out):
    tokens = inputs["tokens"]
    with torch.no_grad():
        want = _model(inputs["state"])(tokens[:, :-1], targets=tokens[:, 1:])[1]
    assert isinstance(out, (float, torch.Tensor)), f"returned {type(out).__name__}"
    got = float(out)
    assert abs(got - want.item()) < 1e-4, (
        f"the step's loss is {got:.4f}; the next-token loss of this batch is "
        f"{want.item():.4f}"
    )


@probe_check(
    "train_step_bug",
    "the loss is next-token prediction (targets shifted by one), of the model before "
    "the step",
    2,
    "the model's targets are already shifted: model(tokens[:, :-1], targets=tokens[:, "
    "1:]); targets=tokens teaches it to copy its input. Return the loss that the "
    "gradient came from",
    inputs=_model_and_batch,
    judge=_judge_loss,
)
def _(fn, inputs):
    # a real step (lr > 0): a loss measured after it differs
    return _stepped(fn, inputs, torch.optim.SGD, 0.5)[0]


@probe_check(
    "train_step_bug",
    "takes one optimizer step: the parameters change",
    1,
    "loss.backward(), then optimizer.step()",
    inputs=_model_and_batch,
    judge=_judge_changed,
)
def _(fn, inputs):
    return _stepped(fn, inputs, torch.optim.SGD, 0.1)[1].state_dict()


def _judge_no_pile_up(inputs, out):
    first, last = out
    for g1, g3 in zip(first, last, strict=True):
        if g3 is None or g1 is None or not g3.abs().sum():
            continue
        close(
            g3,
            g1,
            "the gradient after three steps (vs after one)",
            atol=1e-6,
            rtol=1e-4,
        )


@probe_check(
    "train_step_bug",
    "gradients do not pile up from one step to the next",
    1,
    "optimizer.zero_grad() before loss.backward() (or after optimizer.step())",
    inputs=_model_and_batch,
    judge=_judge_no_pile_up,
)
def _(fn, inputs):
    model, tokens = _model(inputs["state"]), inputs["tokens"]
    # lr 0: the same gradient every step
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    fn(model, opt, tokens)
    first = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
    fn(model, opt, tokens)
    fn(model, opt, tokens)
    return [first, [p.grad for p in model.parameters()]]
