"""01 RMSNorm: the root mean square, the module, and a norm that forgot its float32
upcast."""

import torch

from smol.grading.checks._util import (
    bfloat16_out,
    close,
    grads,
    module_grads,
    module_made,
    rounded_once,
    same_grads,
    same_shape,
    same_value_and_grads,
    untouched,
    value_and_grads,
)
from smol.grading.registry import probe_check, task
from smol.norm import RMSNorm as Reference

task("rms", "rmsnorm", "rms(x, eps): the root mean square over the last dimension")
task("rmsnorm", "rmsnorm", "RMSNorm(dim, eps): the module")
task("rmsnorm_bug", "rmsnorm", "Find the bug: an RMSNorm that breaks in half precision")


def _rms_reference(x, eps):
    return torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


SHAPES = [(2, 3, 8), (5,), (1, 7)]


def _judge_shapes(inputs, outs):
    assert isinstance(outs, list) and len(outs) == len(SHAPES), "one result per input"
    for shape, out in zip(SHAPES, outs):
        same_shape(out, shape[:-1] + (1,), f"rms of a {shape} input")


@probe_check(
    "rms",
    "keeps the last dimension: (..., dim) -> (..., 1)",
    1,
    "reduce with mean(dim=-1, keepdim=True) so the result broadcasts against x",
    inputs=lambda: [torch.randn(shape) for shape in SHAPES],
    judge=_judge_shapes,
)
def _(rms, xs):
    return [rms(x, 1e-5) for x in xs]


def _judge_rms_values(inputs, out):
    same_value_and_grads(out, lambda t: _rms_reference(t, 1e-5), inputs, "rms(x)")


@probe_check(
    "rms",
    "values and gradients: sqrt(mean(x^2) + eps)",
    2,
    "square, average over the last dimension, add eps, take the square root, with "
    "differentiable torch operations on x itself (no .detach(), no .item())",
    inputs=lambda: {"x": torch.randn(3, 5, 7), "up": torch.randn(3, 5, 1)},
    judge=_judge_rms_values,
)
def _(rms, inputs):
    return value_and_grads(lambda t: rms(t, 1e-5), inputs)


def _judge_eps(inputs, outs):
    zeros, halves = outs
    close(zeros, torch.full((2, 1), 0.5), "rms of zeros with eps=0.25")
    close(halves, torch.full((2, 1), 0.5**0.5), "rms of 0.5s with eps=0.25")


@probe_check(
    "rms",
    "eps is added inside the square root (not after it, not as a floor)",
    1,
    "sqrt(mean(x^2) + eps): add eps to the mean of squares; clamping the mean at eps "
    "agrees only where the mean is below eps, adding eps after the root nowhere",
    judge=_judge_eps,
)
def _(rms, _):
    # mean(0.5^2) = 0.25 = eps: added gives sqrt(0.5), clamped 0.5
    return [rms(torch.zeros(2, 4), 0.25), rms(torch.full((2, 4), 0.5), 0.25)]


def _make(cls, dim, eps=1e-5):
    return module_made(cls(dim, eps), "RMSNorm(dim, eps)")


def _student(cls, weight, eps=1e-5):
    """Probe side: the student's module, holding `weight`."""
    module = _make(cls, len(weight), eps)
    missing = module.load_state_dict({"weight": weight}, strict=False).missing_keys
    assert not missing, "the module has no parameter `weight`"
    return module


def _reference(weight, eps=1e-5):
    """Judge side: smol's module, holding `weight`."""
    module = Reference(len(weight), eps)
    with torch.no_grad():
        module.weight.copy_(weight)
    return module


BOTH = ("rmsnorm", "rmsnorm_bug")


def _judge_weight(inputs, out):
    assert out["parameter"], "the module has no nn.Parameter named `weight`"
    close(out["weight"], torch.ones(6), "the initial weight")
    names = out["names"]
    assert names == ["weight"], (
        f"expected exactly one parameter `weight`, found {names}"
    )


@probe_check(
    BOTH,
    "a learnable weight of ones, shape (dim,)",
    1,
    "self.weight = nn.Parameter(torch.ones(dim))",
    judge=_judge_weight,
)
def _(cls, _):
    module = _make(cls, 6)
    weight = getattr(module, "weight", None)
    parameter = isinstance(weight, torch.nn.Parameter)
    return {
        "parameter": parameter,
        "weight": weight if parameter else None,
        "names": [n for n, _ in module.named_parameters()],
    }


CASES = [(7, 1e-5, (2, 3, 4, 7)), (16, 0.1, (5, 16))]


def _values_inputs():
    return [
        {"weight": torch.randn(dim), "x": torch.randn(shape) * 0.3}
        for dim, _, shape in CASES
    ]


def _judge_values(inputs, outs):
    for (_, eps, shape), case, out in zip(CASES, inputs, outs, strict=True):
        untouched(out["x"], case["x"], what="x")
        want = _reference(case["weight"], eps)(case["x"])
        close(out["out"], want, f"the output for a {shape} input with eps={eps}")


@probe_check(
    BOTH,
    "float32 values equal smol's RMSNorm (odd width, 4-D input, eps used); x unchanged",
    2,
    "x * rsqrt(mean(x^2, -1, keepdim) + eps), then multiply by the weight, into a new "
    "tensor: x is the residual stream, which the layer adds back",
    inputs=_values_inputs,
    judge=_judge_values,
)
def _(cls, inputs):
    outs = []
    for (_, eps, _), case in zip(CASES, inputs):
        out = _student(cls, case["weight"], eps)(case["x"])
        outs.append({"out": out, "x": case["x"]})
    return outs


def _judge_grads(inputs, out):
    ref = _reference(inputs["weight"])
    _, (gx,) = grads(ref, inputs["x"], upstream=inputs["up"])
    same_grads(out["x"], [gx], ["the input"], atol=1e-4)
    weight = out["params"].get("weight")
    same_grads([weight], [ref.weight.grad], ["the weight"], atol=1e-4)


@probe_check(
    BOTH,
    "gradients for the input and the weight equal smol's",
    1,
    "use differentiable torch operations only (no .item(), no .detach(), no in-place "
    "writes to x)",
    inputs=lambda: {
        "weight": torch.randn(9),
        "x": torch.randn(4, 9),
        "up": torch.randn(4, 9),
    },
    judge=_judge_grads,
)
def _(cls, inputs):
    student = _student(cls, inputs["weight"])
    return module_grads(student, student, inputs)


def _judge_dtype(inputs, out):
    bfloat16_out(out)


@probe_check(
    BOTH,
    "keeps the input dtype (a bfloat16 module and input give bfloat16)",
    1,
    "cast the normalised activations back with .to(x's original dtype) before scaling",
    inputs=lambda: {"weight": torch.randn(8), "x": torch.randn(3, 8).bfloat16()},
    judge=_judge_dtype,
)
def _(cls, inputs):
    return _student(cls, inputs["weight"]).to(torch.bfloat16)(inputs["x"])


# what: (the weight's dtype, the module's, x's dtype, x's scale); 16 x 64 values,
# of which rounded_once lets 10 round the other way
HALF = {
    "the float16 output for activations of size ~1000": (
        torch.float16,
        torch.float16,
        1000,
    ),
    "the output for bfloat16 x and a float32 weight": (
        torch.float32,
        torch.bfloat16,
        1,
    ),
    "the output for bfloat16 x and weight": (torch.bfloat16, torch.bfloat16, 1),
}


def _half_inputs():
    return [
        {
            "weight": torch.randn(64).to(weight),
            "x": (torch.randn(16, 64) * scale).to(x),
        }
        for weight, x, scale in HALF.values()
    ]


def _judge_half(inputs, outs):
    wants = [
        _reference(c["weight"].float()).to(c["weight"].dtype)(c["x"]) for c in inputs
    ]
    for what, want, out in zip(HALF, wants, outs, strict=True):
        same_shape(out, want.shape, what, want.dtype)  # the dtypes first, then values
    for what, case, want, out in zip(HALF, inputs, wants, outs):
        rounded_once(out, want, what, rounding=case["x"].dtype)


@probe_check(
    BOTH,
    "float16 activations of size ~1000 give smol's output; so do bfloat16 ones, with a "
    "float32 weight (a float32 output, as in HF) or a bfloat16 one",
    2,
    "x.pow(2) of a float16 of 300 is already inf: upcast with x.float() before "
    "squaring, normalise in float32, cast back once with .to(x's dtype), and only then "
    "multiply by the weight (in the weight's dtype, as HF's LlamaRMSNorm does)",
    inputs=_half_inputs,
    judge=_judge_half,
)
def _(cls, cases):
    return [
        _student(cls, case["weight"].float()).to(case["weight"].dtype)(case["x"])
        for case in cases
    ]
