"""01 RMSNorm: the root mean square, the module, and a norm that forgot its float32
upcast."""

import torch

from smol.grading.checks._util import (
    close,
    grad_of,
    is_tensor,
    same_shape,
    unchanged,
)
from smol.grading.core import check, task
from smol.norm import RMSNorm as Reference

task("rms", "rmsnorm", "rms(x, eps): the root mean square over the last dimension")
task("rmsnorm", "rmsnorm", "RMSNorm(dim, eps): the module")
task("rmsnorm_bug", "rmsnorm", "Find the bug: an RMSNorm that breaks in half precision")


def _rms_reference(x, eps):
    return torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


@check(
    "rms",
    "keeps the last dimension: (..., dim) -> (..., 1)",
    1,
    "reduce with mean(dim=-1, keepdim=True) so the result broadcasts against x",
)
def _(rms):
    for shape in [(2, 3, 8), (5,), (1, 7)]:
        same_shape(
            rms(torch.randn(shape), 1e-5), shape[:-1] + (1,), f"rms of a {shape} input"
        )


@check(
    "rms",
    "values and gradients: sqrt(mean(x^2) + eps)",
    2,
    "square, average over the last dimension, add eps, take the square root, with "
    "differentiable torch operations on x itself (no .detach(), no .item())",
)
def _(rms):
    x = torch.randn(3, 5, 7)
    close(rms(x, 1e-5), _rms_reference(x, 1e-5), "rms(x)")
    _, (g,), up = grad_of(lambda t: rms(t, 1e-5), x)
    _, (want,), _ = grad_of(lambda t: _rms_reference(t, 1e-5), x, upstream=up)
    close(g, want, "the gradient of rms(x)", atol=1e-5)


@check(
    "rms",
    "eps is added inside the square root (not after it, not as a floor)",
    1,
    "sqrt(mean(x^2) + eps): add eps to the mean of squares; clamping the mean at eps "
    "agrees only where the mean is below eps, adding eps after the root nowhere",
)
def _(rms):
    x = torch.zeros(2, 4)
    close(rms(x, 0.25), torch.full((2, 1), 0.5), "rms of zeros with eps=0.25")
    x = torch.full(
        (2, 4), 0.5
    )  # mean(x^2) = 0.25 = eps: added gives sqrt(0.5), clamped 0.5
    close(rms(x, 0.25), torch.full((2, 1), 0.5**0.5), "rms of 0.5s with eps=0.25")


def _make(cls, dim, eps=1e-5):
    module = cls(dim, eps)
    assert isinstance(module, torch.nn.Module), (
        f"RMSNorm(dim, eps) should be an nn.Module, got {type(module).__name__}"
    )
    return module


def _randomised(cls, dim, eps=1e-5):
    """The student's module and smol's, with the same random weight."""
    student, ref = _make(cls, dim, eps), Reference(dim, eps)
    with torch.no_grad():
        ref.weight.copy_(torch.randn(dim))
    missing = student.load_state_dict(ref.state_dict(), strict=False).missing_keys
    assert not missing, "the module has no parameter `weight`"
    return student, ref


BOTH = ("rmsnorm", "rmsnorm_bug")


@check(
    BOTH,
    "a learnable weight of ones, shape (dim,)",
    1,
    "self.weight = nn.Parameter(torch.ones(dim))",
)
def _(cls):
    module = _make(cls, 6)
    weight = getattr(module, "weight", None)
    assert isinstance(weight, torch.nn.Parameter), (
        "the module has no nn.Parameter named `weight`"
    )
    close(weight, torch.ones(6), "the initial weight")
    names = [n for n, _ in module.named_parameters()]
    assert names == ["weight"], (
        f"expected exactly one parameter `weight`, found {names}"
    )


@check(
    BOTH,
    "float32 values equal smol's RMSNorm (odd width, 4-D input, eps used); x unchanged",
    2,
    "x * rsqrt(mean(x^2, -1, keepdim) + eps), then multiply by the weight, into a new "
    "tensor: x is the residual stream, which the layer adds back",
)
def _(cls):
    for dim, eps, shape in [(7, 1e-5, (2, 3, 4, 7)), (16, 0.1, (5, 16))]:
        student, ref = _randomised(cls, dim, eps)
        x = torch.randn(shape) * 0.3
        want = ref(x)
        out = unchanged(lambda: student(x), x, what="x")
        close(out, want, f"the output for a {shape} input with eps={eps}")


@check(
    BOTH,
    "gradients for the input and the weight equal smol's",
    1,
    "use differentiable torch operations only (no .item(), no .detach(), no in-place "
    "writes to x)",
)
def _(cls):
    student, ref = _randomised(cls, 9)
    x = torch.randn(4, 9)
    out, (gx,), up = grad_of(student, x)
    ref_out, (ref_gx,), _ = grad_of(ref, x, upstream=up)
    close(gx, ref_gx, "the input's gradient", atol=1e-4)
    assert student.weight.grad is not None, "no gradient reached the weight"
    close(student.weight.grad, ref.weight.grad, "the weight's gradient", atol=1e-4)


@check(
    BOTH,
    "keeps the input dtype (a bfloat16 module and input give bfloat16)",
    1,
    "cast the normalised activations back with .to(x's original dtype) before scaling",
)
def _(cls):
    student, _ = _randomised(cls, 8)
    out = student.to(torch.bfloat16)(torch.randn(3, 8, dtype=torch.bfloat16))
    is_tensor(out)
    assert out.dtype == torch.bfloat16, f"bfloat16 in, {out.dtype} out"


@check(
    BOTH,
    "float16 activations of size ~1000 give the right output",
    2,
    "x.pow(2) of a float16 of 300 is already inf: upcast with x.float() before "
    "squaring",
)
def _(cls):
    student, ref = _randomised(cls, 16)
    student, ref = student.to(torch.float16), ref.to(torch.float16)
    x = (torch.randn(4, 16) * 1000).to(torch.float16)
    out = student(x)
    is_tensor(out)
    close(out.float(), ref(x).float(), "the float16 output", atol=1e-2, rtol=1e-2)
