"""Mutants of exercises 5, 9, 13, 15 and 16 that kept full marks until their check
was strengthened, kept with tests/test_grading.py's: MUTANTS (bug: (task, mutant,
the one check it loses)) and WIDE_MUTANTS (none here); and CORRECT, rewrites that
the strengthened checks must still give full marks (task, implementation)."""

import math

import torch
import torch.nn.functional as F
from torch import nn

from smol.norm import RMSNorm
from tests.grading_mutants_rl import grpo_loss_with


# --- 05 tying and init
def init_by_new_parameters(model) -> None:
    """Right statistics, the tied head skipped, but each Linear gets a new Parameter:
    an optimizer made before init trains the old ones."""
    std = model.config.initializer_range
    scaled = std / math.sqrt(2 * model.config.num_hidden_layers)
    for module in model.modules():
        if isinstance(module, nn.Linear):
            if module.weight is model.model.embed_tokens.weight:
                continue
            s = scaled if getattr(module, "scaled_init", False) else std
            module.weight = nn.Parameter(torch.randn_like(module.weight) * s)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=std)
        elif isinstance(module, RMSNorm):
            nn.init.ones_(module.weight)


# --- 09 int8 weights
def int8_linear_dequantized(x, q, scale):
    """The float matrix s_i q_ij built, then multiplied: right values, every weight
    read in float (the exercise asks to scale the product instead)."""
    return x @ (q.to(x.dtype) * scale.to(x.dtype)[:, None]).T


# --- 13 GGUF
def q8_0_in_the_weights_dtype(w):
    """ggml's arithmetic, but in w's own dtype: a bfloat16 model's d and x / d are
    rounded to bfloat16's 8 bits."""
    rows, _ = w.shape
    blocks = w.reshape(-1, 32)
    d = blocks.abs().amax(dim=1, keepdim=True) / 127
    x = blocks * torch.where(d == 0, 0.0, 1 / d)
    whole = x.abs().floor()
    q = x.sign() * (whole + torch.floor(2 * (x.abs() - whole)))
    scale = d.to(torch.float16).view(torch.uint8)
    return torch.cat([scale, q.to(torch.int8).view(torch.uint8)], 1).view(rows, -1)


# --- 15 DPO
def dpo_loss_detaching_in_place(pc, pr, rc, rr, beta):
    """ref.detach_() cuts the caller's tensors out of their graph."""
    rc.detach_()
    rr.detach_()
    chosen, rejected = pc - rc, pr - rr
    loss = -F.logsigmoid(beta * (chosen - rejected)).mean()
    return loss, beta * chosen.detach(), beta * rejected.detach()


# --- 16 GRPO
def advantages_by_mean_of_squares(rewards, group_size):
    """The variance as E[x^2] - E[x]^2 (unbiased): it cancels for rewards far from 0."""
    if group_size < 2:
        raise ValueError(f"group_size must be at least 2, got {group_size}")
    g = rewards.view(-1, group_size)
    mean = g.mean(1, keepdim=True)
    var = ((g**2).mean(1, keepdim=True) - mean**2) * group_size / (group_size - 1)
    return ((g - mean) / (var.clamp(min=0).sqrt() + 1e-4)).view(-1)


LEARNS = "the model still runs and learns after init"
MUTANTS: dict = {
    "init by new Parameters": ("init_weights", init_by_new_parameters, LEARNS),
    "the fixed init by new Parameters": ("init_bug", init_by_new_parameters, LEARNS),
    "the float matrix of scaled int8 weights built": (
        "int8_linear",
        int8_linear_dequantized,
        "values: x @ (q * scale)^T",
    ),
    "Q8_0 of a bfloat16 weight in bfloat16": (
        "q8_0",
        q8_0_in_the_weights_dtype,
        "every byte of random rows",
    ),
    "the reference detached in the caller's tensors": (
        "dpo_loss",
        dpo_loss_detaching_in_place,
        "the four log-probability tensors are left unchanged",
    ),
    "advantages by the mean of squares": (
        "group_advantages",
        advantages_by_mean_of_squares,
        "each group's own mean and std",
    ),
    "the KL term kept at beta 0": (
        "grpo_loss",
        grpo_loss_with("kl_at_beta_0"),
        "log-probabilities near -110",
    ),
}
WIDE_MUTANTS: dict = {}


# --- correct rewrites the strengthened checks keep at full marks
def init_by_name(model) -> None:
    """By parameter name: a tied head is one Parameter, listed once."""
    std = model.config.initializer_range
    scaled = std / math.sqrt(2 * model.config.num_hidden_layers)
    for name, p in model.named_parameters():
        if "norm" in name:
            nn.init.ones_(p)
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            nn.init.normal_(p, std=scaled)
        else:
            nn.init.normal_(p, std=std)


def int8_linear_by_f_linear(x, q, scale):
    return F.linear(x, q.to(x.dtype)) * scale.to(x.dtype)


def int8_linear_in_float32(x, q, scale):
    return (x.float() @ q.float().T * scale).to(x.dtype)


def int8_linear_on_rows(x, q, scale):
    y = x.reshape(-1, x.shape[-1]) @ q.T.to(x.dtype)  # (N, out)
    return y.mul(scale.to(x.dtype)).reshape(*x.shape[:-1], -1)


def dpo_loss_rebinding_detached(pc, pr, rc, rr, beta):
    rc, rr = rc.detach(), rr.detach()
    margin = (pc - pr) - (rc - rr)
    rewards = beta * (pc - rc).detach(), beta * (pr - rr).detach()
    return F.softplus(-beta * margin).mean(), *rewards


def advantages_two_pass(rewards, group_size):
    if group_size < 2:
        raise ValueError(f"group_size {group_size} < 2")
    g = rewards.reshape(-1, group_size)
    centred = g - g.mean(1, keepdim=True)
    std = (centred.square().sum(1, keepdim=True) / (group_size - 1)).sqrt()
    return (centred / (std + 1e-4)).flatten()


def advantages_in_float64(rewards, group_size):
    if group_size < 2:
        raise ValueError(f"group_size must be at least 2, got {group_size}")
    g = rewards.double().view(-1, group_size)
    a = (g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + 1e-4)
    return a.view(-1).to(rewards.dtype)


CORRECT = [
    ("init_weights", init_by_name),
    ("init_bug", init_by_name),
    ("int8_linear", int8_linear_by_f_linear),
    ("int8_linear", int8_linear_in_float32),
    ("int8_linear", int8_linear_on_rows),
    ("dpo_loss", dpo_loss_rebinding_detached),
    ("group_advantages", advantages_two_pass),
    ("group_advantages", advantages_in_float64),
]
