"""12 LoRA, in use: merging an adapter into its base layer, and supervised fine-tuning
targets without the prompt."""

import torch
import torch.nn.functional as F
from torch import nn

from smol.grading.checks._util import close, pair, same_shape
from smol.grading.checks.lora import IN, R, _base, _base_state, _randomise
from smol.grading.registry import probe_check, task

task("lora_merge", "lora", "merge(layer): one nn.Linear holding W + (alpha / r) B A")
task(
    "sft_targets_bug", "lora", "Find the bug: fine-tuning targets that teach the prompt"
)


MERGES = ((R, 8.0, False), (2, 6.0, True), (3, 8.0, False))  # 8 / 3: alpha // r shows


def _adapted(state, r=R, alpha=8.0, dtype=torch.float32):
    """smol's LoRALinear around the base layer `state`, its adapters random (both
    sides)."""
    from smol.lora import LoRALinear

    layer = LoRALinear(_base(state, dtype), r, alpha)
    _randomise(layer)
    return layer


def _merged(fn, layer):
    """Probe side: the student's merge of `layer`, as weights."""
    out = fn(layer)
    assert isinstance(out, nn.Linear), (
        f"merge should return an nn.Linear, got {type(out).__name__}"
    )
    shares = out.weight is layer.base_layer.weight
    return {"weight": out.weight, "bias": out.bias, "shares": shares}


def _merged_output(out, x):
    """Judge side: what the merged nn.Linear computes for x."""
    with torch.no_grad():
        return F.linear(x, out["weight"], out["bias"])


def _merge_inputs():
    return {
        "bases": [_base_state(bias) for _, _, bias in MERGES],
        "x": torch.randn(3, IN),
    }


def _judge_merge(inputs, outs):
    x = inputs["x"]
    for (r, alpha, _), state, out in zip(MERGES, inputs["bases"], outs, strict=True):
        with torch.no_grad():
            want = _adapted(state, r, alpha)(x)
        close(
            _merged_output(out, x),
            want,
            f"the merged layer's output (r={r}, alpha={alpha})",
            atol=1e-5,
        )


@probe_check(
    "lora_merge",
    "the merged nn.Linear computes what the adapted layer computes",
    2,
    "weight = W + (alpha / r) * B @ A, (out, in)",
    inputs=_merge_inputs,
    judge=_judge_merge,
)
def _(fn, inputs):
    return [
        _merged(fn, _adapted(state, r, alpha))
        for (r, alpha, _), state in zip(MERGES, inputs["bases"])
    ]


def _bfloat16_merge_inputs():
    state = _base_state()
    _adapted(state, dtype=torch.bfloat16)  # x is drawn after the adapter's init
    return {"base": state, "x": torch.randn(3, IN, dtype=torch.bfloat16)}


def _judge_merge_bfloat16(inputs, out):
    dtype = out["weight"].dtype
    assert dtype == torch.bfloat16, (
        f"the merged weight is {dtype}, the layer's is torch.bfloat16"
    )
    x = inputs["x"]
    with torch.no_grad():
        want = _adapted(inputs["base"], dtype=torch.bfloat16)(x)
    close(
        _merged_output(out, x),
        want,
        "the merged layer's bfloat16 output",
        atol=0.1,
        rtol=0.05,
    )


@probe_check(
    "lora_merge",
    "a bfloat16 layer merges into a bfloat16 nn.Linear",
    1,
    "create the merged nn.Linear with the base weight's dtype and device",
    inputs=_bfloat16_merge_inputs,
    judge=_judge_merge_bfloat16,
)
def _(fn, inputs):
    return _merged(fn, _adapted(inputs["base"], dtype=torch.bfloat16))


def _judge_left(state, out):
    assert torch.equal(out["base"], state["weight"]), (
        "merging changed the base layer's weight"
    )
    assert not out["merged"]["shares"], "the merged layer shares the base weight"


@probe_check(
    "lora_merge",
    "the adapted layer is left as it was",
    1,
    "build a new nn.Linear (or clone W) instead of adding B @ A into W in place",
    inputs=_base_state,
    judge=_judge_left,
)
def _(fn, state):
    layer = _adapted(state)
    merged = _merged(fn, layer)
    return {"merged": merged, "base": layer.base_layer.weight}


IDS = torch.tensor([[1, 10, 11, 12, 1, 20, 21, 2], [1, 30, 1, 40, 41, 42, 43, 2]])
PROMPTS = [
    5,
    3,
]  # tokens 0..4 and 0..2 are the prompt (up to "<|im_start|>assistant\n")


def _targets(out):
    """Judge side: (input_ids, targets), after checking that ids were left alone."""
    assert torch.equal(out["ids"], IDS), "the function modified ids in place"
    return pair(out["out"], "return (input_ids, targets)")


def _judge_shifted(inputs, out):
    inputs, targets = _targets(out)
    same_shape(inputs, (2, 7), "input_ids")
    same_shape(targets, (2, 7), "targets")
    assert torch.equal(inputs, IDS[:, :-1]), "input_ids are not ids[:, :-1]"
    keep = targets != -100
    assert torch.equal(targets[keep], IDS[:, 1:][keep]), (
        "kept targets are not ids[:, 1:]"
    )


def _sft(fn, inputs):
    """Probe side: the student's (input_ids, targets), and ids after the call."""
    ids = inputs["ids"]
    return {"out": fn(ids, inputs["prompts"]), "ids": ids}


def _judge_prompt_ignored(inputs, out):
    _, targets = _targets(out)
    want = IDS[:, 1:].clone()
    for b, n in enumerate(PROMPTS):
        want[b, : n - 1] = -100
    assert torch.equal(targets, want), (
        f"targets {targets.tolist()}, expected {want.tolist()}"
    )


for name, points, hint, judge in (
    (
        "inputs and targets are shifted by one, of shape (B, T)",
        1,
        "input_ids = ids[:, :-1]; targets start as ids[:, 1:]",
        _judge_shifted,
    ),
    (
        "the prompt's tokens are -100: no loss on what the user wrote",
        2,
        "targets[b, t] predicts token t + 1: -100 where t + 1 < prompt_lens[b]",
        _judge_prompt_ignored,
    ),
):
    probe_check(
        "sft_targets_bug",
        name,
        points,
        hint,
        inputs=lambda: {"ids": IDS, "prompts": PROMPTS},
        judge=judge,
    )(_sft)
