"""Mutants of the grader's checks (generation), kept with tests/test_grading.py's:
MUTANTS (bug: (task, mutant, the one check it loses)) and WIDE_MUTANTS (bug: (task,
mutant, the set of checks it loses)).

Exercises 08 (KV-cache generation), 09 (fast generation), 10 (training loop) and 13
(GGUF): bugs a student wrote that once kept full marks."""

import math
import struct

import torch

NEG = float("-inf")


def top_p_by(logits, p, strict=False, dtype=torch.float32):
    """Nucleus filtering with the probabilities in `dtype` (None: the logits' own),
    and `before > p` for `before >= p` when strict."""
    if p >= 1.0:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = (sorted_logits if dtype is None else sorted_logits.to(dtype)).softmax(-1)
    before = probs.cumsum(dim=-1) - probs
    remove = before > p if strict else before >= p
    remove[..., 0] = False
    return logits.masked_fill(remove.scatter(-1, order, remove), NEG)


def top_p_strictly_above(logits, p):  # a mass of exactly p keeps one token more
    return top_p_by(logits, p, strict=True)


def top_p_in_the_logits_dtype(logits, p):  # bfloat16 sums for bfloat16 logits
    return top_p_by(logits, p, dtype=None)


def mask_eye_without_offset(attention_mask, T, offset=0):
    """The diagonal as torch.eye(T, offset + T): with cached tokens query offset + i
    sees key i, a left-padding key."""
    q = torch.arange(offset, offset + T)[:, None]
    k = torch.arange(offset + T)[None, :]
    mask = (k <= q)[None, None]
    if attention_mask is None:
        return mask
    itself = torch.eye(T, offset + T, dtype=torch.bool)
    return mask & attention_mask.bool()[:, None, None, :] | itself


def quantize_scale_in_bfloat16(weight):  # max / 127 rounded to bfloat16 first
    scale = (weight.abs().amax(dim=1).clamp(min=1e-12) / 127).float()
    return torch.round(weight.float() / scale[:, None]).to(torch.int8), scale


def quantize_dividing_in_bfloat16(weight):  # w / scale rounded to the weight's dtype
    scale = weight.float().abs().amax(dim=1).clamp(min=1e-12) / 127
    x = weight / scale.to(weight.dtype)[:, None]
    return torch.round(x.float()).clamp(-127, 127).to(torch.int8), scale


def groups_by_name(model, weight_decay):  # "norm" in the name, not the shape
    named = dict(model.named_parameters())
    return [
        {
            "params": [p for n, p in named.items() if "norm" not in n],
            "weight_decay": weight_decay,
        },
        {"params": [p for n, p in named.items() if "norm" in n], "weight_decay": 0.0},
    ]


def q8_0_floor_plus_half(w):  # floor(|x| + 0.5): 0.49999997 + 0.5 rounds to 1.0
    rows = w.shape[0]
    blocks = w.float().reshape(-1, 32)
    d = blocks.abs().amax(dim=1, keepdim=True) / 127
    x = torch.nan_to_num(blocks * (1 / d))
    q = (x.sign() * torch.floor(x.abs() + 0.5)).to(torch.int8)
    return torch.cat([d.half().view(torch.uint8), q.view(torch.uint8)], 1).view(
        rows, -1
    )


def tensor_info_name_in_characters(name, shape, qtype, offset):  # len(name)
    data, n = name.encode(), len(shape)
    return struct.pack(
        f"<Q{len(data)}sI{n}QIQ", len(name), data, n, *reversed(shape), qtype, offset
    )


def lr_decay_over_at_least_one_step(
    step, *, max_lr, warmup_steps, total_steps, min_lr=0.0
):
    """Progress clamped to 1 over max(1, total - warmup) steps: where warmup runs to
    total_steps, step total_steps is progress 0, max_lr."""
    if step < warmup_steps:
        return max_lr * step / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_lr + (max_lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


MUTANTS: dict = {
    "lr: max_lr at total_steps when warmup runs to the end": (
        "lr_schedule",
        lr_decay_over_at_least_one_step,
        "ends at min_lr",
    ),
    "top-p: a mass of exactly p not enough (before > p)": (
        "filter_top_p",
        top_p_strictly_above,
        "a mass of exactly p",
    ),
    "top-p summed in bfloat16 for bfloat16 logits": (
        "filter_top_p",
        top_p_in_the_logits_dtype,
        "bfloat16 logits",
    ),
    "attention mask: the diagonal as torch.eye(T, offset + T)": (
        "attention_mask_bug",
        mask_eye_without_offset,
        "real tokens see every",
    ),
    "int8 scale divided in bfloat16": (
        "quantize_int8",
        quantize_scale_in_bfloat16,
        "one scale per output channel",
    ),
    "int8 values divided in bfloat16": (
        "quantize_int8",
        quantize_dividing_in_bfloat16,
        "rounded to the nearest step",
    ),
    "weight decay chosen by the name 'norm'": (
        "param_groups",
        groups_by_name,
        "weight decay on matrices",
    ),
    "Q8_0 rounded with floor(|x| + 0.5)": (
        "q8_0",
        q8_0_floor_plus_half,
        "halves round",
    ),
    "GGUF tensor name length in characters": (
        "tensor_info_bug",
        tensor_info_name_in_characters,
        "a vector",
    ),
}
WIDE_MUTANTS: dict = {}
