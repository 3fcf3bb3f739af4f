"""Small helpers the checks share: a small model's config, calling the student's code
(in a probe) and comparing what it returned with smol's reference (in a judge), with
clear messages.

A probe may assert too, for a clearer message when the student's code fails; but only
the judge passes a check, so a judge checks every value its check promises against a
reference it computes itself. What only the student's process can see (a function
called, a parameter's requires_grad, a forward call) the probe reports as data."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from smol.config import SmolConfig


def small_config(vocab_size: int, **changes) -> SmolConfig:
    """A config whose model a check builds and runs in milliseconds: width 32, two
    layers, four query heads sharing two key/value heads, 64 positions. `changes`
    override any field; each task gives a vocabulary size of its own."""
    size = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2}
    heads = {"num_attention_heads": 4, "num_key_value_heads": 2}
    fields = {"vocab_size": vocab_size, "max_position_embeddings": 64, **size, **heads}
    return SmolConfig(**(fields | changes))


def pair(out, message: str):
    """`out`, if it is a tuple or list of two things; else AssertionError(message)."""
    assert isinstance(out, (tuple, list)) and len(out) == 2, message
    return out


def is_tensor(out, what="the result") -> torch.Tensor:
    assert isinstance(out, torch.Tensor), (
        f"{what} should be a torch.Tensor, got {type(out).__name__}"
    )
    return out


def same_shape(
    out, shape, what="the result", dtype: torch.dtype | None = None
) -> torch.Tensor:
    is_tensor(out, what)
    assert tuple(out.shape) == tuple(shape), (
        f"{what} has shape {tuple(out.shape)}, expected {tuple(shape)}"
    )
    assert dtype is None or out.dtype == dtype, (
        f"{what} has dtype {out.dtype}, expected {dtype}"
    )
    return out


def same_pair(out, message: str, names, shape, dtype: torch.dtype | None = None):
    """`out` as two tensors (AssertionError(message) if it is not a pair), named
    `names` in messages, each of `shape` (and `dtype`)."""
    first, second = pair(out, message)
    same_shape(first, shape, names[0], dtype)
    same_shape(second, shape, names[1], dtype)
    return first, second


def bfloat16_out(out, what="the result") -> torch.Tensor:
    """Judge side: `out`, a tensor in bfloat16 (the dtype that went in)."""
    is_tensor(out, what)
    assert out.dtype == torch.bfloat16, f"bfloat16 in, {out.dtype} out"
    return out


def in_float32_and_bfloat16(call, *tensors) -> list:
    """Probe side: [call(*tensors), call(*tensors in bfloat16)], for
    float32_and_bfloat16 to judge."""
    return [call(*tensors), call(*(t.bfloat16() for t in tensors))]


def float32_and_bfloat16(out, shape, what32: str, what16="the result"):
    """Judge side: `out` as the results of a float32 and a bfloat16 call, both of
    `shape`, the second in bfloat16."""
    out32, out16 = pair(out, "two results")
    same_shape(out32, shape, what32)
    bfloat16_out(same_shape(out16, shape, what16))
    return out32, out16


def close(actual, expected, what="the result", atol=1e-5, rtol=1e-5) -> None:
    same_shape(actual, expected.shape, what)
    a, e = actual.detach().float(), expected.detach().float()
    if not torch.isfinite(a).all() and torch.isfinite(e).all():
        raise AssertionError(f"{what} holds inf or NaN where the reference is finite")
    ok = torch.isclose(a, e, atol=atol, rtol=rtol) | (a == e)
    if not ok.all():
        diff = (a - e).abs()
        diff = diff[torch.isfinite(diff)]
        worst = f"{diff.max().item():.3g}" if diff.numel() else "inf"
        raise AssertionError(
            f"{what} differs from the reference: {int((~ok).sum())} of {ok.numel()} "
            f"values off, largest difference {worst}"
        )


def rounded_once(out, want, what="the result", rounding=None) -> None:
    """Judge side: `out` has the dtype of `want`, a reference that computes in float32
    and casts to `rounding` (want's dtype by default) once, and its values but for 1
    in 100, each at most about a step of `rounding` off: float32 steps in another
    order now and then round a value near a midpoint the other way, while code that
    rounds to `rounding` on the way changes a sixth of them or more."""
    rounding = rounding or want.dtype
    step = torch.finfo(rounding).eps
    same_shape(out, want.shape, what, want.dtype)
    close(out, want, what, atol=step, rtol=2 * step)
    off = int((out.detach() != want).sum())
    assert off <= want.numel() // 100, (
        f"{what} is rounded differently from the reference in {off} of "
        f"{want.numel()} values: the reference computes in float32 and casts to "
        f"{rounding} once"
    )


def same_std(t, expected: float, name: str, tol=0.1) -> None:
    """Judge side: the standard deviation of `t` within `tol` (relative) of
    `expected`."""
    got = t.detach().float().std().item()
    assert abs(got / expected - 1) < tol, (
        f"{name} has std {got:.4f}, expected {expected:.4f}"
    )


def untouched(after, before, what="its input") -> None:
    """Judge side: `after` (an input as the probe saw it after the call) equals
    `before` (as the judge chose it): no in-place writes into the caller's data."""
    assert isinstance(after, torch.Tensor) and torch.equal(after, before), (
        f"the code wrote into {what} in place"
    )


def grads(fn, *inputs, upstream):
    """fn(*inputs) on cloned leaves, and the gradients of sum(fn(*inputs) * upstream)
    with respect to each (None where none reached it)."""
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    out = fn(*leaves)
    is_tensor(out)
    assert out.requires_grad, (
        "the result is not connected to the inputs' autograd graph (detached?)"
    )
    (out * upstream).sum().backward()
    return out, [x.grad for x in leaves]


def module_grads(module, call, inputs) -> dict:
    """Probe side: the gradients that sum(call(x) * inputs["up"]) sends to x
    (inputs["x"]) and to each parameter of `module`, by name."""
    _, gx = grads(call, inputs["x"], upstream=inputs["up"])
    return {"x": gx, "params": {n: p.grad for n, p in module.named_parameters()}}


def same_grads(grads, want, names, atol=1e-5) -> None:
    """Judge side: each of `grads` (from the probe) close to the gradient in `want`."""
    assert isinstance(grads, (list, tuple)) and len(grads) == len(want), (
        f"expected {len(want)} gradients, got {grads!r:.60}"
    )
    for name, g, w in zip(names, grads, want):
        assert g is not None, f"no gradient reached {name}"
        close(g, w, f"the gradient of {name}", atol=atol)


def value_and_grads(fn, inputs) -> dict:
    """Probe side: fn(x) and the gradient that inputs["up"] sends back through it to
    x (inputs["x"])."""
    x = inputs["x"]
    return {"out": fn(x), "grads": grads(fn, x, upstream=inputs["up"])[1]}


def same_value_and_grads(out, reference, inputs, what: str) -> None:
    """Judge side: `out` (from value_and_grads) holds reference(x) and its gradient,
    both named `what` in messages."""
    x, up = inputs["x"], inputs["up"]
    close(out["out"], reference(x), what)
    _, want = grads(reference, x, upstream=up)
    same_grads(out["grads"], want, [what], atol=1e-5)


def module_made(module, call: str) -> torch.nn.Module:
    """Probe side: `module`, what the student's `call` made, after checking that it
    is an nn.Module."""
    assert isinstance(module, torch.nn.Module), (
        f"{call} should be an nn.Module, got {type(module).__name__}"
    )
    return module


def holding(module, state, owner="the module") -> torch.nn.Module:
    """Probe side: `module` holding the weights `state`, matched by name (any
    order)."""
    missing = module.load_state_dict(state, strict=False).missing_keys
    assert not missing, f"{owner} has no {', '.join(missing)}"
    return module


def parameter_shapes(module) -> dict:
    """Probe side: the shape of each of `module`'s weights, by name."""
    return {k: list(v.shape) for k, v in module.state_dict().items()}


def same_parameter_shapes(got, reference) -> None:
    """Judge side: `got` (from parameter_shapes) names and shapes the weights as the
    `reference` module does."""
    got = {k: tuple(v) for k, v in got.items()}
    want = {k: tuple(v.shape) for k, v in reference.state_dict().items()}
    assert got == want, f"parameters {got}, expected {want}"


class _ForwardSpy:
    """Records, for each forward call, how many tokens came in and whether a cache came
    along."""

    def __init__(self, model):
        self.calls, self.forward = [], model.forward

    def __call__(self, input_ids, *args, **kwargs):
        cache = kwargs.get("kv_cache", args[3] if len(args) > 3 else None)
        self.calls.append((input_ids.shape[1], cache is not None))
        return self.forward(input_ids, *args, **kwargs)


def forward_calls(fn, model, *args) -> list[tuple[int, bool]]:
    """Probe side: fn(model, *args) run for its model's forward calls, each as
    (tokens in, whether a kv_cache came along)."""
    spy = _ForwardSpy(model)
    model.forward = spy
    fn(model, *args)
    return spy.calls


def after_prefill(calls, prompt: int) -> list[int]:
    """Judge side: the tokens of each forward call in `calls` (from forward_calls) after
    the first, once it is checked that every call had the cache and that the first
    took the whole prompt of `prompt` tokens."""
    assert calls and all(c for _, c in calls), "the model was called without kv_cache="
    lengths = [n for n, _ in calls]
    assert lengths[0] == prompt, (
        f"the first pass took {lengths[0]} tokens, not the prompt's {prompt}"
    )
    return lengths[1:]


def qkv_grads(attention, inputs) -> list:
    """Probe side: the gradients of q, k and v (inputs["qkv"]) through `attention`,
    with inputs["up"] as the upstream gradient."""
    return grads(attention, *inputs["qkv"], upstream=inputs["up"])[1]


def same_qkv_grads(got, reference, inputs) -> None:
    """Judge side: the gradients `got` (from qkv_grads) equal those through the
    `reference` attention."""
    _, want = grads(reference, *inputs["qkv"], upstream=inputs["up"])
    same_grads(got, want, "qkv", atol=1e-4)


def _not_allowed(name: str) -> str:
    return f"your code calls {name}, which this task asks you not to use"


class _ForbidFunctions(TorchFunctionMode):
    def __init__(self, names):
        super().__init__()
        self.names, self.called = names, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.names:
            self.called.append(self.names[func])
            raise AssertionError(_not_allowed(self.names[func]))
        return func(*args, **(kwargs or {}))


SDPA = {F.scaled_dot_product_attention: "F.scaled_dot_product_attention"}


def without(call, functions: dict):
    """call() with the torch `functions` ({function: name}) refused: its result, or
    AssertionError naming what it called (even if the code caught the refusal). Seen
    are the calls that go through torch's function dispatch (F.silu, nn.SiLU,
    torch._C._nn.silu, ...), not torch.ops.aten.* ones."""
    with _ForbidFunctions(functions) as spy:
        out = call()
    assert not spy.called, _not_allowed(spy.called[0])
    return out
