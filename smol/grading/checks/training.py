"""10 Training loop: next-token batches, the learning-rate schedule, weight-decay
groups, and a train step whose loss is not shifted.

The checks are properties (warmup ends at max_lr, cosine midpoint, ...) rather than a
comparison with one implementation, so either off-by-one convention of the warmup
passes."""

import copy
import math

import torch

from smol import SmolLM
from smol.grading.checks._util import close, pair, same_shape, small_config
from smol.grading.core import check, task


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


def _split(fn, tokens, mask=None):
    """(inputs, targets), as the student's next_token_batch returns them."""
    return pair(fn(tokens, mask), "return (input_ids, targets)")


@check(
    "next_token_batch",
    "shapes: (B, T + 1) tokens give (B, T) inputs and targets, both long",
    1,
    "inputs drop the last token, targets drop the first",
)
def _(fn):
    inputs, targets = _split(fn, torch.randint(0, 100, (3, 9)))
    same_shape(inputs, (3, 8), "inputs", torch.long)
    same_shape(targets, (3, 8), "targets", torch.long)


@check(
    "next_token_batch",
    "targets[:, t] is the token after inputs[:, t]",
    2,
    "inputs = tokens[:, :-1], targets = tokens[:, 1:]",
)
def _(fn):
    tokens = torch.randint(0, 100, (2, 7))
    inputs, targets = _split(fn, tokens)
    assert torch.equal(inputs, tokens[:, :-1]), "inputs are not tokens[:, :-1]"
    assert torch.equal(targets, tokens[:, 1:]), "targets are not tokens[:, 1:]"


@check(
    "next_token_batch",
    "targets that are padding become -100 (ignored by the loss)",
    1,
    "shift the mask like the tokens: targets[mask[:, 1:] == 0] = -100, on a copy; "
    "padding may stand on the right or on the left",
)
def _(fn):
    tokens = torch.randint(0, 100, (3, 6))
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]])
    before = tokens.clone()
    _, targets = _split(fn, tokens, mask)
    want = tokens[:, 1:].clone()
    want[mask[:, 1:] == 0] = -100
    assert torch.equal(tokens, before), "next_token_batch modified the tokens in place"
    assert torch.equal(targets, want), (
        f"targets {targets.tolist()}, expected {want.tolist()}"
    )


def _lr(fn, step, **kw):
    args = dict(max_lr=1e-3, warmup_steps=100, total_steps=1000, min_lr=1e-4) | kw
    out = fn(step, **args)
    assert isinstance(out, (float, int)) and not isinstance(out, bool), (
        f"lr_schedule should return a float, got {type(out).__name__}"
    )
    return float(out)


@check(
    "lr_schedule",
    "linear warmup from about 0 to max_lr over warmup_steps",
    1,
    "max_lr * step / warmup_steps (or (step + 1) / warmup_steps) while step < "
    "warmup_steps",
)
def _(fn):
    lrs = [_lr(fn, s) for s in range(101)]
    assert lrs[0] <= 1e-3 / 100 + 1e-12, (
        f"lr at step 0 is {lrs[0]:.3g}; warmup starts near 0"
    )
    assert abs(lrs[100] - 1e-3) < 1e-3 * 0.011, (
        f"lr at the end of warmup is {lrs[100]:.3g}, expected max_lr 1e-3"
    )
    steps = [b - a for a, b in zip(lrs[:99], lrs[1:100])]
    assert max(steps) - min(steps) < 1e-9, "warmup is not linear (unequal increments)"


@check(
    "lr_schedule",
    "cosine decay: halfway through the decay lr is (max_lr + min_lr) / 2",
    1,
    "progress = (step - warmup) / (total - warmup); min_lr + (max_lr - min_lr) * 0.5 * "
    "(1 + cos(pi * progress))",
)
def _(fn):
    mid = _lr(fn, 550)
    assert abs(mid - 5.5e-4) < 1e-5, (
        f"lr at step 550 of 1000 (warmup 100) is {mid:.4g}, expected 5.5e-4"
    )
    quarter = _lr(fn, 325)
    want = 1e-4 + 0.9e-3 * 0.5 * (1 + math.cos(math.pi * 0.25))
    assert abs(quarter - want) < 1e-5, (
        f"lr at step 325 is {quarter:.4g}, expected {want:.4g}"
    )
    # other proportions: min_lr a third of max_lr (not the common tenth), warmup 15%
    other = dict(max_lr=3e-3, warmup_steps=30, total_steps=230, min_lr=1e-3)
    mid = _lr(fn, 130, **other)
    assert abs(mid - 2e-3) < 2e-5, (
        f"lr at step 130 of 230 (warmup 30, max_lr 3e-3, min_lr 1e-3) is {mid:.4g}, "
        "expected 2e-3"
    )
    lrs = [_lr(fn, s) for s in range(100, 1001, 50)]
    assert all(b <= a + 1e-12 for a, b in zip(lrs, lrs[1:])), (
        "lr rises during the decay"
    )


@check(
    "lr_schedule",
    "ends at min_lr and stays there after total_steps",
    1,
    "clamp progress to 1 (or return min_lr when step >= total_steps)",
)
def _(fn):
    for step in (1000, 1500):
        lr = _lr(fn, step)
        assert abs(lr - 1e-4) < 1e-6, (
            f"lr at step {step} is {lr:.4g}, expected min_lr 1e-4"
        )


def _groups(fn, model, wd=0.1):
    groups = fn(model, wd)
    assert isinstance(groups, (list, tuple)) and len(groups) == 2, (
        "return a list of two dicts (decay, no decay)"
    )
    for g in groups:
        assert isinstance(g, dict) and "params" in g, (
            "each group is a dict with 'params' and 'weight_decay'"
        )
    return [dict(g, params=list(g["params"])) for g in groups]


@check(
    "param_groups",
    "two groups with every parameter exactly once (the tied matrix once)",
    1,
    "iterate model.named_parameters() (it lists a shared tensor once) and split it in "
    "two lists",
)
def _(fn):
    model = SmolLM(CONFIG)
    groups = _groups(fn, model)
    ids = [id(p) for g in groups for p in g["params"]]
    want = {id(p) for p in model.parameters()}
    assert len(ids) == len(set(ids)), "a parameter appears twice"
    assert set(ids) == want, (
        f"{len(want - set(ids))} parameters are missing, {len(set(ids) - want)} are "
        "foreign"
    )


@check(
    "param_groups",
    "weight decay on matrices (>= 2-D) only; norm weights get 0",
    2,
    "p.dim() >= 2 -> weight_decay, else 0.0: decaying norm gains pulls them towards "
    "zero",
)
def _(fn):
    model = SmolLM(CONFIG)
    groups = _groups(fn, model, 0.037)  # not 0.1: the argument, not a constant
    decay = {
        id(p)
        for g in groups
        if g.get("weight_decay", 0.0) == 0.037
        for p in g["params"]
    }
    none = {
        id(p) for g in groups if g.get("weight_decay", None) == 0.0 for p in g["params"]
    }
    for name, p in model.named_parameters():
        want, where = (
            (decay, "with weight decay 0.037 (the argument)")
            if p.dim() >= 2
            else (none, "with weight decay 0.0")
        )
        assert id(p) in want, f"{name} ({p.dim()}-D) should be in the group {where}"


@check(
    "param_groups",
    "AdamW accepts the groups and takes a step",
    1,
    "torch.optim.AdamW(param_groups(model, 0.1), lr=...) must work: lists of "
    "Parameters, not names",
)
def _(fn):
    model = SmolLM(CONFIG)
    opt = torch.optim.AdamW(fn(model, 0.1), lr=1e-3)
    ids = torch.randint(0, CONFIG.vocab_size, (2, 8))
    model(ids, targets=ids)[1].backward()
    opt.step()


def _batch():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, CONFIG.vocab_size, (4, 17), generator=g)


@check(
    "train_step_bug",
    "returns the loss as a Python float",
    1,
    "return loss.item() (a float frees the graph; a tensor keeps it alive)",
)
def _(fn):
    model = SmolLM(CONFIG)
    out = fn(model, torch.optim.AdamW(model.parameters(), lr=1e-3), _batch())
    assert isinstance(out, float), f"returned {type(out).__name__}, expected float"


@check(
    "train_step_bug",
    "the loss is next-token prediction (targets shifted by one), of the model before "
    "the step",
    2,
    "the model's targets are already shifted: model(tokens[:, :-1], targets=tokens[:, "
    "1:]); targets=tokens teaches it to copy its input. Return the loss that the "
    "gradient came from",
)
def _(fn):
    model = SmolLM(CONFIG)
    reference = copy.deepcopy(model)
    tokens = _batch()
    # a real step (lr > 0): a loss measured after it differs
    out = fn(model, torch.optim.SGD(model.parameters(), lr=0.5), tokens)
    with torch.no_grad():
        want = reference(tokens[:, :-1], targets=tokens[:, 1:])[1].item()
    assert isinstance(out, (float, torch.Tensor)), f"returned {type(out).__name__}"
    got = float(out)
    assert abs(got - want) < 1e-4, (
        f"the step's loss is {got:.4f}; the next-token loss of this batch is {want:.4f}"
    )


@check(
    "train_step_bug",
    "takes one optimizer step: the parameters change",
    1,
    "loss.backward(), then optimizer.step()",
)
def _(fn):
    model = SmolLM(CONFIG)
    before = [p.detach().clone() for p in model.parameters()]
    fn(model, torch.optim.SGD(model.parameters(), lr=0.1), _batch())
    assert any(
        not torch.equal(b, p.detach()) for b, p in zip(before, model.parameters())
    ), "no parameter changed"


@check(
    "train_step_bug",
    "gradients do not pile up from one step to the next",
    1,
    "optimizer.zero_grad() before loss.backward() (or after optimizer.step())",
)
def _(fn):
    model = SmolLM(CONFIG)
    # lr 0: the same gradient every step
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    tokens = _batch()
    fn(model, opt, tokens)
    first = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
    fn(model, opt, tokens)
    fn(model, opt, tokens)
    for g1, p in zip(first, model.parameters()):
        if p.grad is None or g1 is None or not p.grad.abs().sum():
            continue
        close(
            p.grad,
            g1,
            "the gradient after three steps (vs after one)",
            atol=1e-6,
            rtol=1e-4,
        )
