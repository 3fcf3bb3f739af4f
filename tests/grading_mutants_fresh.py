"""Mutants of exercises 15 and 16 that kept full marks until their check
was strengthened, kept with tests/test_grading.py's: MUTANTS (bug: (task, mutant,
the one check it loses)) and WIDE_MUTANTS (none here); and CORRECT, rewrites that
the strengthened checks must still give full marks (task, implementation)."""

import torch.nn.functional as F
from tests.grading_mutants_rl import grpo_loss_with


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


MUTANTS: dict = {
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
    ("dpo_loss", dpo_loss_rebinding_detached),
    ("group_advantages", advantages_two_pass),
    ("group_advantages", advantages_in_float64),
]
