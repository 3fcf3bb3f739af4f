"""Counting the work: parameters, training FLOPs per token, GPU peaks and model FLOPs
utilisation."""

from __future__ import annotations

import re

import torch

from smol.config import SmolConfig


def num_params(config: SmolConfig) -> int:
    """SmolLM(config).count_params(), from the shapes alone: embedding (+ head if
    untied), per layer q/k/v/o, gate/up/down and two norms, and the final norm."""
    C, I, D = config.hidden_size, config.intermediate_size, config.head_dim
    attn = C * D * (2 * config.num_attention_heads + 2 * config.num_key_value_heads)
    per_layer = attn + 3 * C * I + 2 * C
    head = 0 if config.tie_word_embeddings else config.vocab_size * C
    return config.vocab_size * C + head + config.num_hidden_layers * per_layer + C


def flops_per_token(config: SmolConfig, seq_len: int) -> int:
    """Training FLOPs per token, 6N + 12*L*H*D*T (Chowdhery et al., 2022, appendix B,
    who write Q for the head size D): 6N for the matrix multiplies forward and backward
    (N includes the tied embedding, as the head's matmul costs it), plus attention's
    scores and weighted sum over T positions, for L layers of H heads."""
    return (
        6 * num_params(config)
        + 12
        * config.num_hidden_layers
        * config.num_attention_heads
        * config.head_dim
        * seq_len
    )


# Dense (no sparsity) 16-bit tensor-core peaks in FLOP/s, from NVIDIA's datasheets,
# which print the
# 2:4-sparse figures: halve those. Matched in order against
# torch.cuda.get_device_name().
PEAK_FLOPS = [
    (r"H200", 989e12),
    (r"H100.*PCIe", 756e12),
    (r"H100.*NVL", 835e12),
    (r"H100", 989e12),
    # T4: fp16 only
    (r"A100", 312e12),
    (r"L40S", 362e12),
    (r"\bL4\b", 121e12),
    (r"\bT4\b", 65e12),
    (r"V100.*PCI", 112e12),
    (r"V100", 125e12),
]


def peak_flops(device) -> float | None:
    """The GPU's dense bf16/fp16 peak FLOP/s, or None (a CPU, or a GPU not in the
    table)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next(
        (peak for pattern, peak in PEAK_FLOPS if re.search(pattern, name)), None
    )


def mfu(
    flops_per_token: float, tokens_per_s: float, peak: float | None, n_devices: int = 1
) -> float | None:
    """Model FLOPs utilisation: achieved training FLOP/s over the devices' dense peak
    (None without a known peak)."""
    if not peak:
        return None
    return flops_per_token * tokens_per_s / (peak * n_devices)
