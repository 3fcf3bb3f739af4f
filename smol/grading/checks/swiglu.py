"""04 SwiGLU: silu, the gated MLP, and an MLP whose scaled-init flag never takes
effect."""

import math

import torch
import torch.nn.functional as F

from smol import SmolLM
from smol.grading.checks._util import (
    close,
    grad_of,
    is_tensor,
    small_config,
    without,
)
from smol.grading.core import check, task
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


@check(
    "silu",
    "values: x * sigmoid(x); bfloat16 in, bfloat16 out",
    1,
    "silu(x) = x * torch.sigmoid(x), in x's dtype",
)
def _(fn):
    x = torch.randn(4, 9) * 3
    close(fn(x), F.silu(x), "silu(x)")
    out = is_tensor(fn(x.bfloat16()))
    assert out.dtype == torch.bfloat16, f"bfloat16 in, {out.dtype} out"


@check("silu", "gradients equal F.silu's", 1, "use differentiable torch operations")
def _(fn):
    x = torch.randn(3, 5) * 3
    _, (g,), up = grad_of(fn, x)
    _, (ref,), _ = grad_of(F.silu, x, upstream=up)
    close(g, ref, "the gradient", atol=1e-5)


@check(
    "silu",
    "finite values and gradients for large |x| (+-100)",
    1,
    "x * torch.sigmoid(x) is stable; in x / (1 + exp(-x)), exp(100) overflows to inf "
    "and the gradient becomes inf / inf = NaN even where the value looks right",
)
def _(fn):
    x = torch.tensor([-100.0, -30.0, 0.0, 30.0, 100.0])
    close(fn(x), F.silu(x), "silu at large |x|")
    _, (g,), up = grad_of(fn, x, upstream=torch.ones(5))
    _, (ref,), _ = grad_of(F.silu, x, upstream=up)
    close(g, ref, "the gradient at large |x|", atol=1e-5)


@check(
    "silu",
    "written by hand: no F.silu (nor nn.SiLU, which calls it)",
    1,
    "the task is the formula itself: x * torch.sigmoid(x)",
)
def _(fn):
    x = torch.randn(3, 7)
    out = without(lambda: fn(x), {F.silu: "F.silu", torch._C._nn.silu: "torch's silu"})
    close(out, F.silu(x), "silu(x)")


def _pair(cls, config=CONFIG):
    """The student's module and smol's with the same weights, matched by name (any
    order)."""
    student = cls(config)
    assert isinstance(student, torch.nn.Module), (
        f"SwiGLU(config) should be an nn.Module, got {type(student).__name__}"
    )
    ref = Reference(config)
    missing = student.load_state_dict(ref.state_dict(), strict=False).missing_keys
    assert not missing, f"the module has no {', '.join(missing)}"
    return student, ref


@check(
    BOTH,
    "gate_proj, up_proj (C -> F) and down_proj (F -> C), without biases",
    1,
    "three nn.Linear(..., bias=False) named as Hugging Face's LlamaMLP, of the "
    "config's sizes (hidden_size, intermediate_size): no ratio of your own",
)
def _(cls):
    student = cls(CONFIG)
    got = {k: tuple(v.shape) for k, v in student.state_dict().items()}
    want = {k: tuple(v.shape) for k, v in Reference(CONFIG).state_dict().items()}
    assert got == want, f"parameters {got}, expected {want}"


@check(
    BOTH,
    "values: down(silu(gate(x)) * up(x)) with smol's weights",
    2,
    "the gate goes through silu, the up projection does not; multiply them, then "
    "project down",
)
def _(cls):
    student, ref = _pair(cls)
    x = torch.randn(2, 5, CONFIG.hidden_size)
    close(student(x), ref(x), "the MLP's output", atol=1e-5)


@check(
    BOTH,
    "gradients for the input and every weight equal smol's",
    1,
    "use differentiable operations only",
)
def _(cls):
    student, ref = _pair(cls)
    x = torch.randn(2, 3, CONFIG.hidden_size)
    _, (g,), up = grad_of(student, x)
    _, (ref_g,), _ = grad_of(ref, x, upstream=up)
    close(g, ref_g, "the input's gradient", atol=1e-5)
    student_params = dict(student.named_parameters())
    for (
        name,
        r,
    ) in ref.named_parameters():  # by name: the layers may be defined in any order
        p = student_params.get(name)
        assert p is not None, f"the module has no parameter {name}"
        assert p.grad is not None, f"no gradient reached {name}"
        close(p.grad, r.grad, f"the gradient of {name}", atol=1e-5)


@check(
    BOTH,
    "down_proj is flagged `scaled_init`, so SmolLM initialises it with std / sqrt(2 * "
    "n_layers)",
    2,
    "SmolLM.reset_parameters reads getattr(module, 'scaled_init', False): the flag "
    "must be spelt exactly `scaled_init` and set on down_proj",
)
def _(cls):
    model = SmolLM(CONFIG)
    for layer in model.model.layers:
        layer.mlp = cls(CONFIG)
    model.reset_parameters()
    std = CONFIG.initializer_range
    want = std / math.sqrt(2 * CONFIG.num_hidden_layers)
    seen = set()
    for name, p in model.named_parameters():
        if name.endswith(("down_proj.weight", "up_proj.weight")):
            expected = want if "down_proj" in name else std
            got = p.std().item()
            assert abs(got / expected - 1) < 0.1, (
                f"{name} has std {got:.4f}, expected {expected:.4f}"
            )
            seen.add(name.rsplit(".", 2)[-2])
    assert seen == {"down_proj", "up_proj"}, (
        "the MLP has no down_proj and up_proj to initialise"
    )
