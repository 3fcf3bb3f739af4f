"""12 LoRA: the initialisation of A and B (and why B is zero) and the LoRALinear
forward (merging and fine-tuning targets: `finetune`).

The checks compare with the formula W x + (alpha / r) B A x on the student's own A and
B, so any layout that holds A as (r, in) and B as (out, r), as peft does, passes."""

import math

import torch
from torch import nn

from smol.grading.checks._util import close, pair, same_shape
from smol.grading.registry import probe_check, task

task("lora_init", "lora", "init_lora_(A, B): A Kaiming-uniform, B zero, and why")
task(
    "lora_linear",
    "lora",
    "LoRALinear(base, r, alpha): a frozen layer plus (alpha / r) B A x",
)

IN, OUT, R = 24, 16, 4


def _base_state(bias=False, seed=0):
    """The weights of a base layer (IN -> OUT)."""
    torch.manual_seed(seed)
    return nn.Linear(IN, OUT, bias=bias).state_dict()


def _base(state, dtype=torch.float32):
    """The base layer holding `state` (both sides)."""
    base = nn.Linear(IN, OUT, bias="bias" in state)
    base.load_state_dict(state)
    return base.to(dtype)


def _layer(cls, base, r=R, alpha=8.0):
    """Probe side: the student's LoRALinear around `base`."""
    layer = cls(base, r, alpha)
    assert isinstance(layer, nn.Module), (
        f"LoRALinear should be an nn.Module, got {type(layer)}"
    )
    for name in ("base_layer", "lora_A", "lora_B"):
        assert hasattr(layer, name), f"the layer has no attribute {name!r}"
    return layer


def _randomise(layer, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in (layer.lora_A, layer.lora_B):
            p.copy_(torch.randn(p.shape, generator=g))


def _judge_layout(inputs, out):
    same_shape(out["A"], (R, IN), "lora_A")
    same_shape(out["B"], (OUT, R), "lora_B")
    assert sorted(out["trainable"]) == ["lora_A", "lora_B"], (
        "the trainable parameters should be lora_A and lora_B, nothing else"
    )


@probe_check(
    "lora_linear",
    "A is (r, in), B is (out, r); only A and B are trainable",
    1,
    "nn.Parameter(torch.empty(r, in_features)) and (out_features, r); "
    "base.requires_grad_(False) freezes W (and its bias)",
    inputs=lambda: _base_state(bias=True),
    judge=_judge_layout,
)
def _(cls, state):
    layer = _layer(cls, _base(state))
    adapters = {id(layer.lora_A): "lora_A", id(layer.lora_B): "lora_B"}
    trainable = [
        adapters.get(id(p), "another") for p in layer.parameters() if p.requires_grad
    ]
    return {"A": layer.lora_A, "B": layer.lora_B, "trainable": trainable}


# alpha / r = 8 / 3 is not an integer: alpha // r would be 2
SCALINGS = ((R, 8.0), (2, 2.0), (8, 32.0), (3, 8.0))


def _judge_forward(inputs, outs):
    base, x = _base(inputs["base"]), inputs["x"]
    for (r, alpha), out in zip(SCALINGS, outs, strict=True):
        A, B = out["A"], out["B"]
        with torch.no_grad():
            want = base(x) + (x @ A.T @ B.T) * (alpha / r)
        close(out["out"], want, f"the output with r={r}, alpha={alpha}", atol=1e-5)


@probe_check(
    "lora_linear",
    "forward is base(x) + (alpha / r) * B A x, scaled by alpha / r",
    2,
    "self.base_layer(x) + (x @ self.lora_A.T @ self.lora_B.T) * (alpha / r)",
    inputs=lambda: {"base": _base_state(bias=True), "x": torch.randn(3, 5, IN)},
    judge=_judge_forward,
)
def _(cls, inputs):
    outs = []
    for r, alpha in SCALINGS:
        layer = _layer(cls, _base(inputs["base"]), r, alpha)
        _randomise(layer)
        outs.append({"A": layer.lora_A, "B": layer.lora_B, "out": layer(inputs["x"])})
    return outs


def _judge_lora_grads(inputs, out):
    for name in ("A", "B"):
        grad = out[f"grad {name}"]
        assert grad is not None and grad.abs().sum() > 0, (
            f"no gradient reached lora_{name}"
        )
    assert out["grad W"] is None, "the base weight got a gradient: it should be frozen"
    assert out["grad x"] is not None, "no gradient reached x"
    A = out["A"].detach().clone().requires_grad_(True)
    B = out["B"].detach().clone().requires_grad_(True)
    x = inputs["x"].clone().requires_grad_(True)
    want = _base(inputs["base"])(x) + x @ A.T @ B.T
    want.square().sum().backward()
    close(out["grad x"], x.grad, "the gradient of x", atol=1e-4)
    close(out["grad A"], A.grad, "the gradient of lora_A", atol=1e-4)
    close(out["grad B"], B.grad, "the gradient of lora_B", atol=1e-4)


@probe_check(
    "lora_linear",
    "gradients for x, A and B equal the formula's; none for the frozen weight",
    1,
    "do not detach x or the adapter path (an earlier layer's adapter learns through "
    "x's gradient), and keep the base layer frozen",
    inputs=lambda: {"base": _base_state(), "x": torch.randn(4, IN)},
    judge=_judge_lora_grads,
)
def _(cls, inputs):
    # scaling 1: only the paths matter here
    layer = _layer(cls, _base(inputs["base"]), r=R, alpha=float(R))
    _randomise(layer)
    x = inputs["x"].clone().requires_grad_(True)
    layer(x).square().sum().backward()
    return {
        "A": layer.lora_A,
        "B": layer.lora_B,
        "grad A": layer.lora_A.grad,
        "grad B": layer.lora_B.grad,
        "grad W": layer.base_layer.weight.grad,
        "grad x": x.grad,
    }


def _judge_lora_bfloat16(inputs, out):
    for name in ("lora_A", "lora_B"):
        dtype = out[name].dtype
        assert dtype == torch.bfloat16, f"{name} is {dtype} on a bfloat16 base layer"
    dtype = out["out"].dtype
    assert dtype == torch.bfloat16, f"bfloat16 in, {dtype} out"


@probe_check(
    "lora_linear",
    "a bfloat16 base layer gives bfloat16 adapters and a bfloat16 output",
    1,
    "create A and B with the base weight's dtype and device (torch.empty(..., "
    "dtype=w.dtype, device=w.device))",
    inputs=lambda: {
        "base": _base_state(bias=True),
        "x": torch.randn(3, IN, dtype=torch.bfloat16),
    },
    judge=_judge_lora_bfloat16,
)
def _(cls, inputs):
    layer = _layer(cls, _base(inputs["base"], torch.bfloat16))
    return {"lora_A": layer.lora_A, "lora_B": layer.lora_B, "out": layer(inputs["x"])}


def _init(fn, r=R, fan_in=256, out=OUT):
    """Probe side: A (r, fan_in) and B (out, r) after the student's init_lora_."""
    A, B = (
        nn.Parameter(torch.full((r, fan_in), 7.0)),
        nn.Parameter(torch.full((out, r), 7.0)),
    )
    result = fn(A, B)
    assert result is None or isinstance(result, tuple), "init_lora_ works in place"
    return [A.detach(), B.detach()]


def _judge_kaiming(inputs, out):
    A, _ = out
    bound = 1 / math.sqrt(200)
    assert A.abs().max() <= bound * 1.0001, (
        f"|A| reaches {A.abs().max():.4f} > {bound:.4f}"
    )
    assert A.abs().max() > 0.9 * bound, (
        f"|A| stays below {A.abs().max():.4f}: too narrow"
    )
    assert 0.9 < A.std() / (bound / math.sqrt(3)) < 1.1, (
        "A's spread is not that of U(-b, b)"
    )


@probe_check(
    "lora_init",
    "A is Kaiming-uniform as nn.Linear's weights: U(-1/sqrt(in), 1/sqrt(in))",
    1,
    "nn.init.kaiming_uniform_(A, a=math.sqrt(5)) (the bound is 1/sqrt(fan_in))",
    judge=_judge_kaiming,
)
def _(fn, _):
    return _init(fn, r=8, fan_in=200)  # sqrt(fan_in) is not r: the bound shows which


def _judge_two_draws(inputs, out):
    (first, _), (second, _) = out
    assert not torch.equal(first, second), "two adapters got the very same A"


@probe_check(
    "lora_init",
    "two adapters get different A (no seed reset inside)",
    1,
    "draw from the generator as it stands: torch.manual_seed inside init_lora_ gives "
    "every adapter of the model the same A",
    judge=_judge_two_draws,
)
def _(fn, _):
    return [_init(fn, r=8, fan_in=200), _init(fn, r=8, fan_in=200)]


def _fresh_adapter(inputs, out):
    """Judge side: the base layer, and the adapted layer with the student's freshly
    initialised A and B (leaves)."""
    base = _base(inputs["base"]).requires_grad_(False)
    A, B = (t.detach().clone().requires_grad_(True) for t in pair(out, "(A, B)"))
    return base, B, lambda x: base(x) + x @ A.T @ B.T * 2.0


def _judge_b_zero(inputs, out):
    base, _, layer = _fresh_adapter(inputs, out)
    x = inputs["x"]
    with torch.no_grad():
        assert torch.equal(layer(x), base(x)), (
            "at initialisation the output differs from base(x)"
        )


def _judge_first_step(inputs, out):
    _, B, layer = _fresh_adapter(inputs, out)
    layer(inputs["x"]).square().sum().backward()
    assert B.grad is not None and B.grad.abs().sum() > 0, (
        "B gets no gradient: the adapter is stuck"
    )


def _fresh(fn, _):
    """Probe side: A (R, IN) and B (OUT, R) as the student's init_lora_ leaves them."""
    A, B = nn.Parameter(torch.empty(R, IN)), nn.Parameter(torch.empty(OUT, R))
    fn(A, B)
    return [A, B]


for _name, _points, _hint, _judge in (
    (
        "B is zero: a fresh adapter computes exactly its base layer",
        2,
        "nn.init.zeros_(B): B A x = 0, so fine-tuning starts from the pretrained model",
        _judge_b_zero,
    ),
    (
        "the first step trains: B gets a gradient",
        1,
        "B's gradient is (upstream)^T (A x): zero when A is zero too; then nothing "
        "trains",
        _judge_first_step,
    ),
):
    probe_check(
        "lora_init",
        _name,
        _points,
        _hint,
        inputs=lambda: {"base": _base_state(), "x": torch.randn(5, IN)},
        judge=_judge,
    )(_fresh)
