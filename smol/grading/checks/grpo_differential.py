"""16 GRPO, every task against smol's on generated inputs (`_differential`): group
sizes from -3 to 8 (below 2 refused), equal and unequal rewards; completions of
unequal lengths with padding that holds 0, a model's numbers or inf and NaN; every
loss_type with beta 0 and > 0, both epsilons, ratios of 1 (on-policy), inside and
far beyond the clipping range, log-probabilities near -110, float32 and bfloat16;
values and the gradient of logps compared, at the padding too."""

import torch

from smol.grading.checks import _differential as diff
from smol.grading.checks.grpo_loss import OPTIONS, TENSORS

NAME = "generated inputs: values and gradients equal smol's"
CASES = 48
RATIOS = {"on-policy": None, "inside the clip": 0.14, "beyond the clip": 0.9}


def _rewards_case(g) -> dict:
    G = diff.pick(g, (-3, 0, 1, 2, 2, 3, 4, 5, 8))
    P = int(torch.randint(1, 5, (), generator=g))
    kind = diff.pick(g, ("0 or 1", "quarters", "scores", "equal"))
    n = P * max(G, 1) if G > 0 else 4
    if kind == "0 or 1":
        rewards = torch.randint(0, 2, (n,), generator=g).float()
    elif kind == "quarters":
        rewards = torch.randint(0, 5, (n,), generator=g) / 4
    elif kind == "scores":
        rewards = torch.randn(n, generator=g) * 3 + torch.randn((), generator=g) * 5
    else:
        # quarters: a group's mean is exact, its advantages exactly 0 everywhere
        rewards = torch.randint(0, 5, (P, 1), generator=g) / 4
        rewards = rewards.expand(P, max(G, 1)).flatten()[:n]
    dtype = diff.pick(g, (torch.float32, torch.float32, torch.bfloat16))
    if kind == "scores" and dtype == torch.bfloat16:
        dtype = torch.float32  # spread within a group can fall below its rounding
    rewards = rewards.to(dtype)
    wide = dtype == torch.bfloat16
    return {
        "what": f"group_size={G}, {diff.dtype_name(rewards)} rewards "
        f"{[round(r, 3) for r in rewards.tolist()]}",
        "args": {"rewards": rewards, "group_size": G},
        "grad": [],
        "up": [None],
        "tol": (2e-2, 2e-2) if wide else (1e-4, 1e-4),
    }


def _call_advantages(fn, args):
    return [fn(args["rewards"], args["group_size"])]


def _log_probs(g, B, T, lengths, ratios, shift, kl_spread, padding):
    """logps, old_logps and ref_logps (B, T) and the mask of each row's length."""
    mask = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).long()
    logps = -torch.rand(B, T, generator=g) * 4 - 0.1 + shift
    if ratios is None:
        old = logps.clone()
    else:
        old = logps - (torch.rand(B, T, generator=g) * 2 - 1) * ratios
    ref = logps + torch.randn(B, T, generator=g) * kl_spread
    real = mask.bool()
    if padding == "zero":
        fill = [torch.zeros(B, T)] * 3
    elif padding == "a model's numbers":
        far = -100 - torch.rand(3, B, T, generator=g) * 20
        near = -torch.rand(3, B, T, generator=g) * 3
        odd = torch.rand(3, B, T, generator=g) < 0.5
        fill = list(torch.where(odd, far, near))
    else:  # inf, -inf and NaN
        pick = torch.randint(0, 3, (3, B, T), generator=g)
        fill = list(torch.tensor([float("inf"), -float("inf"), float("nan")])[pick])
    logps, old, ref = (torch.where(real, x, f) for x, f in zip((logps, old, ref), fill))
    return logps, old, ref, mask


def _loss_case(g) -> dict:
    B, T = (
        int(torch.randint(1, 6, (), generator=g)),
        int(torch.randint(1, 8, (), generator=g)),
    )
    lengths = torch.randint(1, T + 1, (B,), generator=g).tolist()
    ratio = diff.pick(g, tuple(RATIOS))
    shift = diff.pick(g, (0.0, 0.0, 0.0, -110.0))
    padding = diff.pick(g, ("zero", "a model's numbers", "inf and NaN"))
    dtype = diff.pick(g, (torch.float32, torch.float32, torch.bfloat16))
    if dtype == torch.bfloat16:  # a ratio near a clip bound could round across it
        ratio, shift = diff.pick(g, tuple(RATIOS)[:2]), 0.0
    options = {
        "loss_type": diff.pick(g, ("grpo", "dapo", "dr_grpo")),
        "beta": diff.pick(g, (0.0, 0.04, 0.5)),
    }
    low, high = diff.pick(g, ((0.2, 0.2), (0.1, 0.28), (0.3, 0.1)))
    options |= {"epsilon_low": low, "epsilon_high": high}
    kl = diff.pick(g, (0.0, 0.7))
    logps, old, ref, mask = _log_probs(
        g, B, T, lengths, RATIOS[ratio], shift, kl, padding
    )
    advantages = torch.randn(B, generator=g)
    advantages[torch.rand(B, generator=g) < 0.2] = 0.0
    tensors = dict(zip(TENSORS, (logps, old, ref, advantages, mask)))
    tensors = {
        k: v.to(dtype) if v.is_floating_point() else v for k, v in tensors.items()
    }
    wide = dtype == torch.bfloat16
    return {
        "what": f"{options['loss_type']}, beta={options['beta']}, eps=({low}, {high}), "
        f"B={B}, T={T}, lengths {lengths}, ratios {ratio}, reference spread {kl}, "
        f"log-probabilities shifted by {shift}, padding {padding}, "
        f"{diff.dtype_name(tensors['logps'])}",
        "args": tensors | options,
        "grad": ["logps"],
        "up": [torch.randn((), generator=g)],
        "tol": (3e-2, 3e-2) if wide else (1e-5, 1e-5),
        "gtol": (1e-2, 5e-2) if wide else (1e-6, 1e-4),
        "regions": {"padding": mask == 0},
    }


def _call_loss(fn, args):
    out = fn(*(args[k] for k in TENSORS), **{k: args[k] for k in OPTIONS})
    return [getattr(out, "loss", out)]


BATCH = ("logps", "old_logps", "ref_logps", "rewards", "completion_mask")


def _batch_case(g) -> dict:
    P, G = (
        int(torch.randint(1, 4, (), generator=g)),
        int(torch.randint(2, 5, (), generator=g)),
    )
    B, T = P * G, int(torch.randint(1, 7, (), generator=g))
    lengths = torch.randint(1, T + 1, (B,), generator=g).tolist()
    ratio = diff.pick(g, tuple(RATIOS))
    shift = diff.pick(g, (0.0, 0.0, -110.0))
    beta = diff.pick(g, (0.0, 0.04, 0.5))
    logps, old, ref, mask = _log_probs(
        g, B, T, lengths, RATIOS[ratio], shift, 0.5, "zero"
    )
    rewards = torch.randint(0, 2, (P, G), generator=g).float()
    rewards[0, :2] = torch.tensor([1.0, 0.0])  # the first group varies
    args = dict(zip(BATCH, (logps, old, ref, rewards.flatten(), mask)))
    return {
        "what": f"{P} groups of {G}, beta={beta}, T={T}, lengths {lengths}, ratios "
        f"{ratio}, log-probabilities shifted by {shift}, rewards {rewards.tolist()}",
        "args": args | {"group_size": G, "beta": beta},
        "grad": ["logps"],
        "up": [torch.randn((), generator=g)],
        "tol": (1e-5, 1e-5),
        "gtol": (1e-6, 1e-4),
        "regions": {"padding": mask == 0},
    }


def _call_batch(fn, args):
    out = fn(*(args[k] for k in BATCH), args["group_size"], args["beta"])
    return [getattr(out, "loss", out)]


def _smol_advantages():
    from smol.grpo import group_advantages

    return group_advantages


def _smol_loss():
    from smol.grpo import grpo_loss

    def loss(logps, old, ref, advantages, mask, **options):
        T = logps.shape[1]
        x = [t.float() for t in (logps, old, ref, advantages)]
        out = grpo_loss(
            *x[:4],
            mask,
            **options,
            max_completion_length=T,
            use_bias_correction_kl=False,
        )
        return out.loss.to(logps.dtype)

    return loss


def _smol_batch():
    from smol.grpo import group_advantages, grpo_loss

    def loss(logps, old, ref, rewards, mask, group_size, beta):
        A = group_advantages(rewards, group_size)
        return grpo_loss(
            logps,
            old,
            ref,
            A,
            mask,
            loss_type="grpo",
            beta=beta,
            use_bias_correction_kl=False,
        ).loss

    return loss


for task, make, call, reference, hint in (
    (
        "group_advantages",
        _rewards_case,
        _call_advantages,
        _smol_advantages,
        "the case named below differs from smol.grpo.group_advantages: each group's "
        "(rewards - mean) / (std + 1e-4), and a ValueError for every group_size "
        "below 2 (0 and negative ones too, not only 1)",
    ),
    (
        "grpo_loss",
        _loss_case,
        _call_loss,
        _smol_loss,
        "the case named below differs from smol.grpo.grpo_loss (the GRPO paper's "
        "KL, use_bias_correction_kl=False) in the loss or in the gradient of logps: "
        "the KL is averaged as the clipped term is, per loss_type; a clipped "
        "token's gradient is 0 (torch.clamp, not a straight-through estimate); the "
        "padding is zeroed before exp, so that its gradient is 0, not NaN",
    ),
    (
        "grpo_batch_bug",
        _batch_case,
        _call_batch,
        _smol_batch,
        "the case named below differs from smol's loss in its value or in the "
        "gradient of logps: where the ratio is clipped and the clipped objective "
        "is the smaller, that token sends no gradient",
    ),
):
    diff.register(task, NAME, 2, hint, make, call, reference, CASES)
