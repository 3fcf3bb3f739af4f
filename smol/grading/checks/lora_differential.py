"""12 LoRA, every task with a deterministic result against smol's on generated
inputs (`_differential`): inputs of one to three axes, rank 1 to 8 (up to the
layer's width), alpha / r of 1/8 to 16 and not an integer, with a bias or
without, float32 and bfloat16 layers. LoRALinear runs on given A and B (its own
are random), the output and the gradients of x, A and B compared with
smol.lora.LoRALinear's; merge's weight, bias and dtype, and what the merged layer
computes, with smol's merged(); sft_targets on prompts of one token to the whole
row (nothing left to learn). init_lora_ draws A at random: its checks are the
targeted ones."""

import torch
from torch import nn

from smol.grading.checks import _differential as diff

NAME = "generated inputs: values, dtypes and gradients equal smol's"
EXACT = "generated inputs: values and dtypes equal smol's"
CASES = 40
IGNORE = -100


def _layer_args(g) -> dict:
    """A base layer's weights, an adapter's A and B and an input x."""
    fan_in, out = diff.pick(g, (1, 3, 8, 16)), diff.pick(g, (1, 2, 8, 12))
    r = min(diff.pick(g, (1, 1, 2, 3, 8)), max(fan_in, out))
    alpha = diff.pick(g, (1.0, 2.0, 8.0, 16.0))
    dtype, bias = diff.pick(g, (torch.float32, torch.bfloat16)), diff.pick(g, (0, 1))
    lead = [diff.pick(g, (1, 2, 3)) for _ in range(diff.pick(g, (0, 1, 2)))]
    args = {
        "W": torch.randn(out, fan_in, generator=g),
        "b": torch.randn(out, generator=g) if bias else None,
        "A": torch.randn(r, fan_in, generator=g),
        "B": torch.randn(out, r, generator=g),
        "x": torch.randn(*lead, fan_in, generator=g),
    }
    args = {k: None if v is None else v.to(dtype) for k, v in args.items()}
    return args | {"r": r, "alpha": alpha, "lead": lead}


def _what(a: dict) -> str:
    out, fan_in = a["W"].shape
    return (
        f"in={fan_in}, out={out}, r={a['r']}, alpha={a['alpha']:g}, "
        f"{'a bias' if a['b'] is not None else 'no bias'}, x {tuple(a['x'].shape)}, "
        f"{diff.dtype_name(a['W'])}"
    )


def _base(a: dict) -> nn.Linear:
    out, fan_in = a["W"].shape
    base = nn.Linear(fan_in, out, bias=a["b"] is not None, dtype=a["W"].dtype)
    with torch.no_grad():
        base.weight.copy_(a["W"])
        if a["b"] is not None:
            base.bias.copy_(a["b"])
    return base


def _with_adapter(layer: nn.Module, A, B) -> nn.Module:
    """layer with A and B in place of its random lora_A and lora_B (plain tensors,
    so that their gradients reach the case's)."""
    del layer.lora_A, layer.lora_B
    layer.lora_A, layer.lora_B = A, B
    return layer


def _linear_case(g) -> dict:
    a = _layer_args(g)
    wide = a["W"].dtype == torch.bfloat16
    out = a["W"].shape[0]
    return {
        "what": _what(a),
        "args": a,
        "grad": ["x", "A", "B"],
        "up": [torch.randn(*a["lead"], out, generator=g)],
        "tol": (5e-2, 2e-2) if wide else (1e-5, 1e-5),
        "gtol": (1e-1, 5e-2) if wide else (1e-4, 1e-4),
        "dtype": True,
    }


def _call_linear(cls, a):
    layer = _with_adapter(cls(_base(a), a["r"], a["alpha"]), a["A"], a["B"])
    return [layer(a["x"])]


def _smol_linear():
    from smol.lora import LoRALinear

    return LoRALinear


def _merge_case(g) -> dict:
    return _linear_case(g) | {"grad": [], "up": [None, None, None]}


def _adapted(a: dict) -> nn.Module:
    """smol's LoRALinear on the case's base layer, A and B (what merge is given)."""
    from smol.lora import LoRALinear

    layer = LoRALinear(_base(a), a["r"], a["alpha"])
    with torch.no_grad():
        layer.lora_A.copy_(a["A"])
        layer.lora_B.copy_(a["B"])
    return layer


def _call_merge(fn, a):
    merged = fn(_adapted(a))
    bias = merged.bias if merged.bias is not None else torch.zeros(0)
    with torch.no_grad():
        return [merged.weight.detach(), bias.detach(), merged(a["x"])]


def _smol_merge():
    return lambda layer: layer.merged()


def _targets_case(g) -> dict:
    B, T = diff.pick(g, (1, 2, 4)), diff.pick(g, (2, 3, 6, 9))
    ids = torch.randint(0, 50, (B, T), generator=g)
    # 1 (no prompt to hide) to T (all prompt: every target -100)
    prompts = [int(n) for n in torch.randint(1, T + 1, (B,), generator=g)]
    what = f"ids {ids.tolist()}, prompt_lens {prompts}"
    return diff.exact(what, {"ids": ids, "prompts": prompts})


def _call_targets(fn, a):
    return list(fn(a["ids"].clone(), list(a["prompts"])))


def _smol_targets():
    def sft_targets(ids, prompt_lens):
        input_ids, targets = ids[:, :-1], ids[:, 1:].clone()
        for b, n in enumerate(prompt_lens):
            targets[b, : n - 1] = IGNORE  # tokens 1 .. n - 1 belong to the prompt
        return input_ids, targets

    return sft_targets


for task, name, make, call, reference, hint in (
    (
        "lora_linear",
        NAME,
        _linear_case,
        _call_linear,
        _smol_linear,
        "the case named below differs from smol.lora.LoRALinear in the output or a "
        "gradient: base_layer(x) + (alpha / r) * x A^T B^T for x of any leading "
        "axes, rank 1 included, read from self.lora_A and self.lora_B at each call",
    ),
    (
        "lora_merge",
        EXACT,
        _merge_case,
        _call_merge,
        _smol_merge,
        "the case named below differs from smol's LoRALinear.merged(): weight W + "
        "(alpha / r) * B @ A in the layer's dtype, the base's bias (none without "
        "one), whatever r and alpha",
    ),
    (
        "sft_targets_bug",
        EXACT,
        _targets_case,
        _call_targets,
        _smol_targets,
        "the case named below differs from smol's targets: ids[:, :-1] and "
        "ids[:, 1:] with -100 where t + 1 < prompt_lens[b], a prompt of one token "
        "hiding nothing and one of the whole row hiding every target",
    ),
):
    diff.register(task, name, 1, hint, make, call, reference, CASES)
