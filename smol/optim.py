"""The optimisation recipe: AdamW with decay on matrices only, the learning-rate
schedule (warmup, then cosine or warmup-stable-decay) and the mixed-precision dtype."""

from __future__ import annotations

import math

import torch


def lr_schedule(
    step: int,
    *,
    max_lr: float,
    warmup_steps: int,
    total_steps: int,
    min_lr: float = 0.0,
    kind: str = "cosine",
    decay_fraction: float = 0.2,
) -> float:
    """The learning rate for optimizer step `step` (0-based): a linear warmup to max_lr
    over warmup_steps, then "cosine": half a cosine down to min_lr at total_steps, or
    "wsd" (warmup-stable-decay, as SmolLM2 was trained): max_lr until the last
    decay_fraction of the steps, then a linear decay to min_lr."""
    if not 0 <= warmup_steps <= total_steps or total_steps <= 0:
        raise ValueError(
            f"need 0 <= warmup_steps ({warmup_steps}) <= total_steps ({total_steps}), "
            "total_steps > 0"
        )
    if not 0 <= min_lr <= max_lr:
        raise ValueError(f"need 0 <= min_lr ({min_lr}) <= max_lr ({max_lr})")
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step >= total_steps:
        return min_lr
    if kind == "cosine":
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)  # 0 -> 1
        return min_lr + 0.5 * (max_lr - min_lr) * (1 + math.cos(math.pi * progress))
    if kind == "wsd":
        if not 0 <= decay_fraction <= 1:
            raise ValueError(f"decay_fraction must lie in [0, 1], got {decay_fraction}")
        decay_start = max(
            warmup_steps, total_steps - round(decay_fraction * total_steps)
        )
        if step < decay_start:
            return max_lr
        return max_lr + (min_lr - max_lr) * (step - decay_start) / max(
            1, total_steps - decay_start
        )
    raise ValueError(f"kind must be 'cosine' or 'wsd', got {kind!r}")


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on matrices (>= 2-D: projections and the embedding), none on norm
    gains.
    `parameters()` yields a tied embedding/head matrix once, so it is decayed once."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def adamw(
    groups: list[dict], lr: float, betas: tuple[float, float]
) -> torch.optim.AdamW:
    """AdamW with one fused kernel for the whole update where the device has it, else
    the default."""
    try:
        return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=True)
    except (RuntimeError, TypeError):
        return torch.optim.AdamW(groups, lr=lr, betas=betas)


def amp_dtype(device: torch.device, dtype: str = "auto") -> torch.dtype:
    """Autocast precision: bf16 on GPUs that have it natively, else fp16 (a T4, with a
    GradScaler); fp32 on CPU unless asked."""
    if dtype == "auto":
        if device.type == "cuda":
            return (
                torch.bfloat16
                if torch.cuda.is_bf16_supported(including_emulation=False)
                else torch.float16
            )
        return torch.float32
    choices = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    if dtype not in choices:
        raise ValueError(
            f"dtype must be one of auto, {', '.join(choices)}; got {dtype!r}"
        )
    if choices[dtype] == torch.float16 and device.type != "cuda":
        raise ValueError(
            "fp16 with a GradScaler needs a CUDA device; use bf16 or fp32 on CPU"
        )
    return choices[dtype]
