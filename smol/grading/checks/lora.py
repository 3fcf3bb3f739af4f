"""12 LoRA: the initialisation of A and B (and why B is zero), the LoRALinear forward,
merging an adapter into its base layer, and supervised fine-tuning targets without the
prompt.

The checks compare with the formula W x + (alpha / r) B A x on the student's own A and
B, so any layout that holds A as (r, in) and B as (out, r), as peft does, passes."""

import math

import torch
from torch import nn

from smol.grading.checks._util import close, pair, same_shape
from smol.grading.core import check, task

task("lora_init", "lora", "init_lora_(A, B): A Kaiming-uniform, B zero, and why")
task(
    "lora_linear",
    "lora",
    "LoRALinear(base, r, alpha): a frozen layer plus (alpha / r) B A x",
)
task("lora_merge", "lora", "merge(layer): one nn.Linear holding W + (alpha / r) B A")
task(
    "sft_targets_bug", "lora", "Find the bug: fine-tuning targets that teach the prompt"
)

IN, OUT, R = 24, 16, 4


def _base(bias=False, seed=0):
    torch.manual_seed(seed)
    return nn.Linear(IN, OUT, bias=bias)


def _layer(cls, base=None, r=R, alpha=8.0):
    layer = cls(_base() if base is None else base, r, alpha)
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


@check(
    "lora_linear",
    "A is (r, in), B is (out, r); only A and B are trainable",
    1,
    "nn.Parameter(torch.empty(r, in_features)) and (out_features, r); "
    "base.requires_grad_(False) freezes W (and its bias)",
)
def _(cls):
    layer = _layer(cls, _base(bias=True))
    same_shape(layer.lora_A, (R, IN), "lora_A")
    same_shape(layer.lora_B, (OUT, R), "lora_B")
    trainable = {id(p) for p in layer.parameters() if p.requires_grad}
    assert trainable == {id(layer.lora_A), id(layer.lora_B)}, (
        "the trainable parameters should be lora_A and lora_B, nothing else"
    )


@check(
    "lora_linear",
    "forward is base(x) + (alpha / r) * B A x, scaled by alpha / r",
    2,
    "self.base_layer(x) + (x @ self.lora_A.T @ self.lora_B.T) * (alpha / r)",
)
def _(cls):
    # alpha / r = 8 / 3 is not an integer: alpha // r would be 2
    for r, alpha in ((R, 8.0), (2, 2.0), (8, 32.0), (3, 8.0)):
        layer = _layer(cls, _base(bias=True), r, alpha)
        _randomise(layer)
        x = torch.randn(3, 5, IN)
        A, B, base = layer.lora_A.detach(), layer.lora_B.detach(), layer.base_layer
        want = base(x) + (x @ A.T @ B.T) * (alpha / r)
        close(layer(x), want, f"the output with r={r}, alpha={alpha}", atol=1e-5)


@check(
    "lora_linear",
    "gradients for x, A and B equal the formula's; none for the frozen weight",
    1,
    "do not detach x or the adapter path (an earlier layer's adapter learns through "
    "x's gradient), and keep the base layer frozen",
)
def _(cls):
    layer = _layer(cls, r=R, alpha=float(R))  # scaling 1: only the paths matter here
    _randomise(layer)
    x = torch.randn(4, IN, requires_grad=True)
    layer(x).square().sum().backward()
    for name in ("lora_A", "lora_B"):
        grad = getattr(layer, name).grad
        assert grad is not None and grad.abs().sum() > 0, f"no gradient reached {name}"
    assert layer.base_layer.weight.grad is None, (
        "the base weight got a gradient: it should be frozen"
    )
    assert x.grad is not None, "no gradient reached x"
    A = layer.lora_A.detach().clone().requires_grad_(True)
    B = layer.lora_B.detach().clone().requires_grad_(True)
    x2 = x.detach().clone().requires_grad_(True)
    want = layer.base_layer(x2) + x2 @ A.T @ B.T
    want.square().sum().backward()
    close(x.grad, x2.grad, "the gradient of x", atol=1e-4)
    close(layer.lora_A.grad, A.grad, "the gradient of lora_A", atol=1e-4)
    close(layer.lora_B.grad, B.grad, "the gradient of lora_B", atol=1e-4)


@check(
    "lora_linear",
    "a bfloat16 base layer gives bfloat16 adapters and a bfloat16 output",
    1,
    "create A and B with the base weight's dtype and device (torch.empty(..., "
    "dtype=w.dtype, device=w.device))",
)
def _(cls):
    layer = _layer(cls, _base(bias=True).to(torch.bfloat16))
    for name in ("lora_A", "lora_B"):
        dtype = getattr(layer, name).dtype
        assert dtype == torch.bfloat16, f"{name} is {dtype} on a bfloat16 base layer"
    out = layer(torch.randn(3, IN, dtype=torch.bfloat16))
    assert out.dtype == torch.bfloat16, f"bfloat16 in, {out.dtype} out"


def _init(fn, r=R, fan_in=256, out=OUT):
    A, B = (
        nn.Parameter(torch.full((r, fan_in), 7.0)),
        nn.Parameter(torch.full((out, r), 7.0)),
    )
    result = fn(A, B)
    assert result is None or isinstance(result, tuple), "init_lora_ works in place"
    return A.detach(), B.detach()


@check(
    "lora_init",
    "A is Kaiming-uniform as nn.Linear's weights: U(-1/sqrt(in), 1/sqrt(in))",
    1,
    "nn.init.kaiming_uniform_(A, a=math.sqrt(5)) (the bound is 1/sqrt(fan_in))",
)
def _(fn):
    A, _ = _init(fn, r=8, fan_in=200)  # sqrt(fan_in) is not r: the bound shows which
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


@check(
    "lora_init",
    "two adapters get different A (no seed reset inside)",
    1,
    "draw from the generator as it stands: torch.manual_seed inside init_lora_ gives "
    "every adapter of the model the same A",
)
def _(fn):
    first, _ = _init(fn, r=8, fan_in=200)
    second, _ = _init(fn, r=8, fan_in=200)
    assert not torch.equal(first, second), "two adapters got the very same A"


def _init_layer(fn, seed=0):
    torch.manual_seed(seed)
    base = nn.Linear(IN, OUT, bias=False).requires_grad_(False)
    A, B = nn.Parameter(torch.empty(R, IN)), nn.Parameter(torch.empty(OUT, R))
    fn(A, B)
    return base, A, B, lambda x: base(x) + x @ A.T @ B.T * 2.0


@check(
    "lora_init",
    "B is zero: a fresh adapter computes exactly its base layer",
    2,
    "nn.init.zeros_(B): B A x = 0, so fine-tuning starts from the pretrained model",
)
def _(fn):
    base, _, _, layer = _init_layer(fn)
    x = torch.randn(5, IN)
    with torch.no_grad():
        assert torch.equal(layer(x), base(x)), (
            "at initialisation the output differs from base(x)"
        )


@check(
    "lora_init",
    "the first step trains: B gets a gradient",
    1,
    "B's gradient is (upstream)^T (A x): zero when A is zero too; then nothing trains",
)
def _(fn):
    _, _, B, layer = _init_layer(fn)
    layer(torch.randn(5, IN)).square().sum().backward()
    assert B.grad is not None and B.grad.abs().sum() > 0, (
        "B gets no gradient: the adapter is stuck"
    )


def _merged(fn, bias=False, r=R, alpha=8.0, dtype=torch.float32):
    from smol.lora import LoRALinear

    layer = LoRALinear(_base(bias=bias).to(dtype), r, alpha)
    _randomise(layer)
    w = layer.base_layer.weight.detach().clone()
    x = torch.randn(3, IN, dtype=dtype)
    with torch.no_grad():
        want = layer(x)
    out = fn(layer)
    assert isinstance(out, nn.Linear), (
        f"merge should return an nn.Linear, got {type(out).__name__}"
    )
    return layer, out, w, x, want


@check(
    "lora_merge",
    "the merged nn.Linear computes what the adapted layer computes",
    2,
    "weight = W + (alpha / r) * B @ A, (out, in)",
)
def _(fn):
    # alpha / r = 8 / 3: no integer, so alpha // r shows
    for r, alpha, bias in ((R, 8.0, False), (2, 6.0, True), (3, 8.0, False)):
        _, out, _, x, want = _merged(fn, bias, r, alpha)
        with torch.no_grad():
            close(
                out(x),
                want,
                f"the merged layer's output (r={r}, alpha={alpha})",
                atol=1e-5,
            )


@check(
    "lora_merge",
    "a bfloat16 layer merges into a bfloat16 nn.Linear",
    1,
    "create the merged nn.Linear with the base weight's dtype and device",
)
def _(fn):
    _, out, _, x, want = _merged(fn, dtype=torch.bfloat16)
    assert out.weight.dtype == torch.bfloat16, (
        f"the merged weight is {out.weight.dtype}, the layer's is torch.bfloat16"
    )
    with torch.no_grad():
        close(out(x), want, "the merged layer's bfloat16 output", atol=0.1, rtol=0.05)


@check(
    "lora_merge",
    "the adapted layer is left as it was",
    1,
    "build a new nn.Linear (or clone W) instead of adding B @ A into W in place",
)
def _(fn):
    layer, out, w, _, _ = _merged(fn)
    assert torch.equal(layer.base_layer.weight, w), (
        "merging changed the base layer's weight"
    )
    assert out.weight is not layer.base_layer.weight, (
        "the merged layer shares the base weight"
    )


def _targets(fn, ids, prompt_lens):
    before = ids.clone()
    out = pair(fn(ids, prompt_lens), "return (input_ids, targets)")
    assert torch.equal(ids, before), "the function modified ids in place"
    return out


IDS = torch.tensor([[1, 10, 11, 12, 1, 20, 21, 2], [1, 30, 1, 40, 41, 42, 43, 2]])
PROMPTS = [
    5,
    3,
]  # tokens 0..4 and 0..2 are the prompt (up to "<|im_start|>assistant\n")


@check(
    "sft_targets_bug",
    "inputs and targets are shifted by one, of shape (B, T)",
    1,
    "input_ids = ids[:, :-1]; targets start as ids[:, 1:]",
)
def _(fn):
    inputs, targets = _targets(fn, IDS, PROMPTS)
    same_shape(inputs, (2, 7), "input_ids")
    same_shape(targets, (2, 7), "targets")
    assert torch.equal(inputs, IDS[:, :-1]), "input_ids are not ids[:, :-1]"
    keep = targets != -100
    assert torch.equal(targets[keep], IDS[:, 1:][keep]), (
        "kept targets are not ids[:, 1:]"
    )


@check(
    "sft_targets_bug",
    "the prompt's tokens are -100: no loss on what the user wrote",
    2,
    "targets[b, t] predicts token t + 1: -100 where t + 1 < prompt_lens[b]",
)
def _(fn):
    _, targets = _targets(fn, IDS, PROMPTS)
    want = IDS[:, 1:].clone()
    for b, n in enumerate(PROMPTS):
        want[b, : n - 1] = -100
    assert torch.equal(targets, want), (
        f"targets {targets.tolist()}, expected {want.tolist()}"
    )
