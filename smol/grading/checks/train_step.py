"""10 Training loop, the optimizer's side: weight-decay groups that AdamW accepts, and a
train step whose loss is not shifted."""

import torch

from smol import SmolLM
from smol.grading.checks._util import close
from smol.grading.checks.training import CONFIG
from smol.grading.registry import probe_check, task


def _first_adamw():
    """AdamW's first use imports torch._dynamo (seconds): once, before the checks,
    outside their time limit."""
    torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])


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


def _biased_model():
    """A model unlike SmolLM: Linear layers with biases and a LayerNorm whose
    parameters are named 1.weight and 1.bias (no "norm" in the names)."""
    layers = torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2)
    return torch.nn.Sequential(*layers)


def _groups(fn, wd=0.1, make=lambda: SmolLM(CONFIG)):
    """Probe side: the student's groups for a fresh model from make(), each parameter
    by its name (None for one that is not the model's)."""
    model = make()
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


def _judge_decay(inputs, outs):
    models = (("SmolLM", SmolLM(CONFIG)), ("nn.Sequential", _biased_model()))
    for (model_name, model), groups in zip(models, outs, strict=True):
        group = {n: g["weight_decay"] for g in groups for n in g["params"]}
        for name, p in model.named_parameters():
            want = 0.037 if p.dim() >= 2 else 0.0  # 0.037: the argument
            assert group.get(name) == want, (
                f"{model_name}'s {name} ({p.dim()}-D) should be in the group with "
                f"weight decay {want}"
            )


@probe_check(
    "param_groups",
    "weight decay on matrices (>= 2-D) only; vectors (norm gains, biases) get 0, "
    "whatever their names",
    2,
    "p.dim() >= 2 -> weight_decay, else 0.0: decaying norm gains pulls them towards "
    "zero; decide by the shape, not by the name (a bias or a LayerNorm in "
    "nn.Sequential has no 'norm' in its name)",
    judge=_judge_decay,
)
def _(fn, _):
    # 0.037, not 0.1: the argument, not a constant
    return [_groups(fn, 0.037), _groups(fn, 0.037, _biased_model)]


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
