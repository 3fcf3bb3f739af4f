"""04 SwiGLU: silu, the gated MLP, and an MLP whose scaled-init flag never takes
effect."""

import math

import torch
import torch.nn.functional as F

from smol import SmolLM
from smol.grading.checks._util import (
    bfloat16_out,
    close,
    grads,
    holding,
    module_grads,
    module_made,
    pair,
    parameter_shapes,
    same_grads,
    same_parameter_shapes,
    same_std,
    same_value_and_grads,
    small_config,
    value_and_grads,
    without,
)
from smol.grading.registry import probe_check, task
from smol.mlp import MLP as Reference

task("silu", "swiglu", "silu(x): the sigmoid linear unit")
task("swiglu", "swiglu", "SwiGLU(config): the gated feed-forward block")
task(
    "swiglu_bug",
    "swiglu",
    "Find the bug: an MLP that SmolLM initialises like any other layer",
)

CONFIG = small_config(  # F = 2.5 C: neither 4 C (GPT-2) nor 8/3 C (Llama)
    64,
    hidden_size=64,
    intermediate_size=160,
    num_hidden_layers=8,
    max_position_embeddings=32,
)
BOTH = ("swiglu", "swiglu_bug")  # the checks that the buggy MLP must pass as well


def _judge_silu_values(x, out):
    out32, out16 = pair(out, "two results")
    close(out32, F.silu(x), "silu(x)")
    bfloat16_out(out16)


@probe_check(
    "silu",
    "values: x * sigmoid(x); bfloat16 in, bfloat16 out",
    1,
    "silu(x) = x * torch.sigmoid(x), in x's dtype",
    inputs=lambda: torch.randn(4, 9) * 3,
    judge=_judge_silu_values,
)
def _(fn, x):
    return [fn(x), fn(x.bfloat16())]


def _judge_silu(inputs, out, where=""):
    same_value_and_grads(out, F.silu, inputs, f"silu{where}")


probe_check(
    "silu",
    "gradients equal F.silu's",
    1,
    "use differentiable torch operations",
    inputs=lambda: {"x": torch.randn(3, 5) * 3, "up": torch.randn(3, 5)},
    judge=_judge_silu,
)(value_and_grads)


probe_check(
    "silu",
    "finite values and gradients for large |x| (+-100)",
    1,
    "x * torch.sigmoid(x) is stable; in x / (1 + exp(-x)), exp(100) overflows to inf "
    "and the gradient becomes inf / inf = NaN even where the value looks right",
    inputs=lambda: {
        "x": torch.tensor([-100.0, -30.0, 0.0, 30.0, 100.0]),
        "up": torch.ones(5),
    },
    judge=lambda inputs, out: _judge_silu(inputs, out, " at large |x|"),
)(value_and_grads)


@probe_check(
    "silu",
    "written by hand: no F.silu (nor nn.SiLU, which calls it)",
    1,
    "the task is the formula itself: x * torch.sigmoid(x)",
    inputs=lambda: torch.randn(3, 7),
    judge=lambda x, out: close(out, F.silu(x), "silu(x)"),
)
def _(fn, x):
    return without(lambda: fn(x), {F.silu: "F.silu", torch._C._nn.silu: "torch's silu"})


def _student(cls, state, config=CONFIG):
    """Probe side: the student's module holding the weights `state`, matched by name
    (any order)."""
    return holding(module_made(cls(config), "SwiGLU(config)"), state)


def _reference(state, config=CONFIG):
    """Judge side: smol's module holding the weights `state`."""
    ref = Reference(config)
    ref.load_state_dict(state)
    return ref


def _judge_sizes(inputs, got):
    same_parameter_shapes(got, Reference(CONFIG))


@probe_check(
    BOTH,
    "gate_proj, up_proj (C -> F) and down_proj (F -> C), without biases",
    1,
    "three nn.Linear(..., bias=False) named as Hugging Face's LlamaMLP, of the "
    "config's sizes (hidden_size, intermediate_size): no ratio of your own",
    judge=_judge_sizes,
)
def _(cls, _):
    return parameter_shapes(cls(CONFIG))


def _judge_mlp_values(inputs, out):
    want = _reference(inputs["state"])(inputs["x"])
    close(out, want, "the MLP's output", atol=1e-5)


@probe_check(
    BOTH,
    "values: down(silu(gate(x)) * up(x)) with smol's weights",
    2,
    "the gate goes through silu, the up projection does not; multiply them, then "
    "project down",
    inputs=lambda: {
        "state": Reference(CONFIG).state_dict(),
        "x": torch.randn(2, 5, CONFIG.hidden_size),
    },
    judge=_judge_mlp_values,
)
def _(cls, inputs):
    return _student(cls, inputs["state"])(inputs["x"])


def _judge_mlp_grads(inputs, out):
    ref = _reference(inputs["state"])
    _, want = grads(ref, inputs["x"], upstream=inputs["up"])
    same_grads(out["x"], want, ["the input"], atol=1e-5)
    params = out["params"]
    for name, r in ref.named_parameters():  # by name: the layers may come in any order
        assert name in params, f"the module has no parameter {name}"
        same_grads([params[name]], [r.grad], [name], atol=1e-5)


@probe_check(
    BOTH,
    "gradients for the input and every weight equal smol's",
    1,
    "use differentiable operations only",
    inputs=lambda: {
        "state": Reference(CONFIG).state_dict(),
        "x": torch.randn(2, 3, CONFIG.hidden_size),
        "up": torch.randn(2, 3, CONFIG.hidden_size),
    },
    judge=_judge_mlp_grads,
)
def _(cls, inputs):
    student = _student(cls, inputs["state"])
    return module_grads(student, student, inputs)


def _judge_scaled_init(inputs, weights):
    std = CONFIG.initializer_range
    want = std / math.sqrt(2 * CONFIG.num_hidden_layers)
    seen = set()
    for name, p in weights.items():
        expected = want if "down_proj" in name else std
        same_std(p, expected, name)
        seen.add(name.rsplit(".", 2)[-2])
    assert seen == {"down_proj", "up_proj"}, (
        "the MLP has no down_proj and up_proj to initialise"
    )


@probe_check(
    BOTH,
    "down_proj is flagged `scaled_init`, so SmolLM initialises it with std / sqrt(2 * "
    "n_layers)",
    2,
    "SmolLM.reset_parameters reads getattr(module, 'scaled_init', False): the flag "
    "must be spelt exactly `scaled_init` and set on down_proj",
    judge=_judge_scaled_init,
)
def _(cls, _):
    model = SmolLM(CONFIG)
    for layer in model.model.layers:
        layer.mlp = cls(CONFIG)
    model.reset_parameters()
    return {
        name: p
        for name, p in model.named_parameters()
        if name.endswith(("down_proj.weight", "up_proj.weight"))
    }
