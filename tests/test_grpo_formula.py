"""The loss that chapter 16 and smol/grpo.py's docstring print,

    loss_t = -min(w A, clip(w, 1 - eps_low, 1 + eps_high) A) + beta * w * KL_t,
    KL_t = exp(ref - logp) - (ref - logp) - 1,  w = exp(logp - old),

written out here token by token in plain torch (and cispo's and sapo's token terms as
LOSS_TYPES states them), then averaged as LOSS_TYPES says, is smol.grpo.grpo_loss's
default, in value and gradient, for every loss_type and beta 0 and > 0. The same
formula without the w on the KL term (what the chapter printed before) is
grpo_loss's use_bias_correction_kl=False, and not its default."""

import pytest
import torch

from smol.grpo import LOSS_TYPES, grpo_loss

EPS_LOW, EPS_HIGH, T_MAX, TAUS = 0.2, 0.28, 7, (1.0, 1.05)


def batch(seed: int):
    """logps (B, T) with gradient, old and ref log-probs near them, advantages of
    both signs and a mask with replies of different lengths (garbage on padding)."""
    g = torch.Generator().manual_seed(seed)
    B, T = 6, 5
    lengths = torch.tensor([5, 3, 1, 4, 5, 2])
    mask = (torch.arange(T) < lengths[:, None]).float()  # (B, T)
    logps = -torch.rand(B, T, generator=g) * 3
    old = logps + 0.4 * torch.randn(B, T, generator=g)  # ratios far from 1: clipped
    ref = logps + 0.5 * torch.randn(B, T, generator=g)
    junk = 50 * torch.randn(B, T, generator=g)  # the padding counts nothing
    logps, old, ref = (torch.where(mask.bool(), x, junk) for x in (logps, old, ref))
    advantages = torch.randn(B, generator=g)
    return logps.requires_grad_(), old, ref, advantages, mask


def printed(logps, old, ref, A, mask, loss_type, beta, kl_weighed_by_w=True):
    """The printed loss, one token at a time."""
    B, T = logps.shape
    token_loss = {}  # (i, t) -> the loss of token t of reply i
    for i in range(B):
        for t in range(T):
            if mask[i, t] == 0:
                continue
            w = torch.exp(logps[i, t] - old[i, t])
            if loss_type == "cispo":
                term = -torch.clamp(w, max=EPS_HIGH).detach() * A[i] * logps[i, t]
            elif loss_type == "sapo":
                tau = TAUS[0] if A[i] > 0 else TAUS[1]
                term = -torch.sigmoid(tau * (w - 1)) * 4 / tau * A[i]
            else:
                clipped = torch.clamp(w, 1 - EPS_LOW, 1 + EPS_HIGH)
                term = -torch.minimum(w * A[i], clipped * A[i])
            d = ref[i, t] - logps[i, t]
            kl = torch.exp(d) - d - 1
            term = term + beta * (w * kl if kl_weighed_by_w else kl)
            token_loss[i, t] = term
    per_reply = [[v for (i, _), v in token_loss.items() if i == r] for r in range(B)]
    every = list(token_loss.values())
    if loss_type in ("grpo", "sapo"):
        return sum(sum(v) / len(v) for v in per_reply) / B
    if loss_type in ("bnpo", "dapo", "cispo"):
        return sum(every) / len(every)
    if loss_type == "dr_grpo":
        return sum(every) / (B * T_MAX)
    return sum(sum(v) for v in per_reply) / B  # luspo


def grads(loss, logps):
    (g,) = torch.autograd.grad(loss, logps)
    return g


@pytest.mark.parametrize("beta", [0.0, 0.04, 0.5])
@pytest.mark.parametrize("loss_type", list(LOSS_TYPES))
def test_the_printed_loss_is_grpo_loss_default(loss_type, beta):
    for seed in range(3):
        logps, old, ref, A, mask = batch(seed)
        theirs = grpo_loss(
            logps,
            old,
            ref,
            A,
            mask,
            loss_type=loss_type,
            epsilon_low=EPS_LOW,
            epsilon_high=EPS_HIGH,
            beta=beta,
            max_completion_length=T_MAX,
            sapo_temperatures=TAUS,
        )
        ours = printed(logps, old, ref, A, mask, loss_type, beta)
        torch.testing.assert_close(theirs.loss, ours, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(
            grads(theirs.loss, logps), grads(ours, logps), rtol=1e-5, atol=1e-6
        )


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_the_kl_without_w_is_the_option_not_the_default(loss_type):
    """The mutant the first test rejects: beta * KL_t, not beta * w * KL_t."""
    logps, old, ref, A, mask = batch(0)
    options = {"loss_type": loss_type, "epsilon_low": EPS_LOW}
    options["epsilon_high"] = EPS_HIGH
    without_w = printed(logps, old, ref, A, mask, loss_type, 0.5, False)
    off = grpo_loss(logps, old, ref, A, mask, beta=0.5, **options)
    off_flag = grpo_loss(
        logps, old, ref, A, mask, beta=0.5, use_bias_correction_kl=False, **options
    )
    torch.testing.assert_close(off_flag.loss, without_w, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(off.loss, without_w, rtol=1e-3)
    # on-policy (old = None) w is 1 in value, so the two agree in value but the
    # gradient of w * KL has the extra KL * grad(log p)
    on = grpo_loss(logps, None, ref, A, mask, beta=0.5, **options)
    on_flag = grpo_loss(
        logps, None, ref, A, mask, beta=0.5, use_bias_correction_kl=False, **options
    )
    torch.testing.assert_close(on.loss, on_flag.loss)
    assert not torch.allclose(grads(on.loss, logps), grads(on_flag.loss, logps))
