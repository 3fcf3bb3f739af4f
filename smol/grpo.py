"""Learning from rewards with Group Relative Policy Optimization (Shao et al., 2024,
DeepSeekMath): sample G completions of each prompt, score each with a checker, and
push up the tokens of the completions that beat their group's mean reward.

No value model: a completion's advantage is its reward measured against its own
group,

    A_i = (r_i - mean(r_group)) / (std(r_group) + 1e-4)

(without the division in Dr. GRPO, Liu et al., 2025), and every token of completion
i shares A_i. The loss of a token is PPO's clipped objective with the probability
ratio w = pi(token) / pi_old(token) of the policy now to the policy that sampled it,

    loss_t = -min(w * A, clip(w, 1 - eps_low, 1 + eps_high) * A) + beta * w * KL_t

with KL_t = exp(ref - logp) - (ref - logp) - 1 the per-token estimate of the KL
divergence to a frozen reference (Schulman's k3), weighed by w as TRL weighs it by
default (use_bias_correction_kl; False drops the w). The variants differ in how the
token losses are averaged (LOSS_TYPES). The semantics are those of TRL's
GRPOTrainer (trl 1.16), which tests/test_grpo.py proves equal."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

EPS = 1e-4  # added to the group's std, as TRL does

# how the token losses (B, T) become one number, as TRL's `loss_type` names them
LOSS_TYPES = {
    "grpo": "each completion's mean over its tokens, then the mean over completions",
    "bnpo": "the mean over every completion token of the batch",
    "dr_grpo": "the sum over tokens / (completions * max_completion_length)",
    "dapo": "the sum over tokens / num_items (the generation batch's token count)",
    "cispo": "dapo's average of -clip(w, max=eps_high).detach() * A * logp",
    "sapo": "grpo's average of a soft gate sigmoid(tau (w - 1)) * 4 / tau times A",
    "luspo": "each completion's sum over its tokens, then the mean over completions",
}


def group_advantages(
    rewards: torch.Tensor, group_size: int, scale: bool = True
) -> torch.Tensor:
    """rewards (N,) of N = prompts x group_size completions, each prompt's group in
    consecutive rows -> advantages (N,): the reward minus its group's mean, divided
    by the group's std (unbiased, as torch.std) + 1e-4 when scale (TRL's
    scale_rewards="group"; scale=False is Dr. GRPO's, TRL's "none"). A group whose
    rewards are all equal teaches nothing: its advantages are exactly 0."""
    if not isinstance(rewards, torch.Tensor) or rewards.dim() != 1:
        shape = tuple(rewards.shape) if isinstance(rewards, torch.Tensor) else rewards
        raise ValueError(f"rewards must be a tensor of shape (N,), got {shape}")
    if isinstance(group_size, bool) or not isinstance(group_size, int):
        raise TypeError(f"group_size must be an int, got {group_size!r}")
    if group_size < 2:
        raise ValueError(
            f"group_size must be at least 2, got {group_size}: a group of one "
            "completion has nothing to be compared with"
        )
    if rewards.numel() == 0 or rewards.numel() % group_size:
        raise ValueError(
            f"{rewards.numel()} rewards do not split into groups of {group_size}"
        )
    bad = (~torch.isfinite(rewards)).nonzero()
    if bad.numel():
        row = bad[0].item()
        raise ValueError(f"reward {row} is {rewards[row].item()}: not a finite number")
    grouped = rewards.float().view(-1, group_size)  # (prompts, G)
    advantages = grouped - grouped.mean(1, keepdim=True)
    if scale:
        advantages = advantages / (grouped.std(1, keepdim=True) + EPS)
    # an all-equal group: exactly 0, not the mean's rounding error over 1e-4
    same = (grouped == grouped[:, :1]).all(1, keepdim=True)  # (prompts, 1)
    return advantages.masked_fill(same, 0.0).view(-1)


def completion_logprobs(
    model,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    temperature: float = 1.0,
) -> torch.Tensor:
    """log p (float32) of each completion token under the model given its prompt and
    the completion's tokens before it: (B, T) completion_ids -> (B, T), 0 where
    completion_mask is 0 (padding after the end). Prompts are padded on the left and
    completions on the right, as TRL pads them; the logits are divided by the
    sampling temperature, as TRL scores them."""
    if prompt_ids.shape != prompt_mask.shape:
        raise ValueError(
            f"prompt_ids {tuple(prompt_ids.shape)} and prompt_mask "
            f"{tuple(prompt_mask.shape)} differ in shape"
        )
    if completion_ids.shape != completion_mask.shape:
        raise ValueError(
            f"completion_ids {tuple(completion_ids.shape)} and completion_mask "
            f"{tuple(completion_mask.shape)} differ in shape"
        )
    if prompt_ids.shape[0] != completion_ids.shape[0]:
        raise ValueError(
            f"{prompt_ids.shape[0]} prompts but {completion_ids.shape[0]} completions"
        )
    if not temperature > 0:
        raise ValueError(f"temperature must be positive, got {temperature!r}")
    ids = torch.cat([prompt_ids, completion_ids], 1)  # (B, P + T)
    mask = torch.cat([prompt_mask, completion_mask], 1)
    T = completion_ids.shape[1]
    # the logits at the last prompt token and every completion token but the last
    logits, _ = model(ids, attention_mask=mask, logits_to_keep=T + 1)
    logps = F.log_softmax(logits[:, :-1].float() / temperature, -1)  # (B, T, V)
    logps = logps.gather(-1, completion_ids[..., None]).squeeze(-1)  # (B, T)
    return logps.masked_fill(completion_mask == 0, 0.0)


@dataclasses.dataclass
class GRPOLoss:
    """The loss of a batch of completions and the numbers people log, each a mean over
    the completion tokens (over completions where the ratio is one per sequence): the
    KL term to the reference (weighed by w where the loss weighs it) and the share of
    tokens whose ratio is clipped below (w < 1 - eps_low with A < 0), above (w > 1 +
    eps_high with A > 0) or either; cispo's clip_high is the share with w > eps_high
    and A > 0, and sapo, which clips nothing, logs zeros."""

    loss: torch.Tensor  # ()
    kl: torch.Tensor  # ()
    clip_low: torch.Tensor  # ()
    clip_high: torch.Tensor  # ()

    @property
    def clip_region(self) -> torch.Tensor:  # (): clipped either way
        return self.clip_low + self.clip_high  # A < 0 and A > 0 never meet


def kl_k3(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """(B, T) per-token estimate of KL(pi || pi_ref) from tokens sampled from pi:
    exp(d) - d - 1 with d = ref - logp, never negative, 0 where they agree."""
    d = ref_logps - logps
    return torch.exp(d) - d - 1


def grpo_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor | None,
    ref_logps: torch.Tensor | None,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    loss_type: str = "dapo",
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    beta: float = 0.0,
    importance_sampling_level: str = "token",
    max_completion_length: int | None = None,
    num_items: int | torch.Tensor | None = None,
    sapo_temperatures: tuple[float, float] = (1.0, 1.05),
    use_bias_correction_kl: bool = True,
) -> GRPOLoss:
    """GRPO's loss from per-token log-probabilities (B, T) of the completions under
    the policy (logps, with gradient), the policy that sampled them (old_logps; None:
    this very policy, w = 1) and the reference (ref_logps, needed when beta > 0), one
    advantage per completion (B,) and completion_mask (B, T), 1 on real tokens
    (the padding, 0, counts nothing, whatever the three hold there).

    loss_type picks the averaging (LOSS_TYPES); dr_grpo needs max_completion_length,
    and dapo and cispo divide by num_items, the completion tokens of the whole
    generation batch this micro-batch is part of (default: this batch's).
    importance_sampling_level="sequence" (GSPO, Zheng et al., 2025) uses one ratio per
    completion, the exp of its mean token log-ratio. sapo_temperatures are SAPO's
    (tau for A > 0, tau otherwise). use_bias_correction_kl weighs each token's KL
    by its ratio w, which makes the KL's gradient the unbiased one of the reverse
    KL (DeepSeek-V3.2; TRL's default): w = 1 in value on-policy, but not in
    gradient. The loss is one micro-batch's, not divided by gradient accumulation
    steps."""
    if loss_type not in LOSS_TYPES:
        raise ValueError(
            f"loss_type must be one of {list(LOSS_TYPES)}, got {loss_type!r}"
        )
    if importance_sampling_level not in ("token", "sequence"):
        raise ValueError(
            "importance_sampling_level must be 'token' or 'sequence', "
            f"got {importance_sampling_level!r}"
        )
    shapes = {"logps": logps, "completion_mask": completion_mask}
    shapes |= {"old_logps": old_logps, "ref_logps": ref_logps}
    shapes = {k: tuple(v.shape) for k, v in shapes.items() if v is not None}
    if len(set(shapes.values())) != 1 or len(shapes["logps"]) != 2:
        raise ValueError(f"expected tensors of one shape (B, T), got {shapes}")
    B = logps.shape[0]
    if tuple(advantages.shape) != (B,):
        raise ValueError(
            f"advantages must have shape (B,) = ({B},), one a completion, "
            f"got {tuple(advantages.shape)}"
        )
    if beta < 0 or (beta > 0 and ref_logps is None):
        raise ValueError(f"beta={beta!r} must be >= 0, and > 0 needs ref_logps")
    if loss_type == "dr_grpo" and not max_completion_length:
        raise ValueError("dr_grpo divides by max_completion_length: give it")
    # the padding may hold anything (TRL keeps a model's numbers there): zeroed, it
    # counts nothing, where exp of it could overflow and inf * 0 is NaN
    pad = completion_mask == 0
    logps = logps.masked_fill(pad, 0.0)
    old_logps, ref_logps = (
        None if x is None else x.masked_fill(pad, 0.0) for x in (old_logps, ref_logps)
    )
    mask = completion_mask.to(logps.dtype)  # (B, T)
    tokens = mask.sum(-1)  # (B,)
    A = advantages[:, None]  # (B, 1): every token shares its completion's advantage
    old = logps.detach() if old_logps is None else old_logps
    log_ratio = logps - old  # (B, T)
    if importance_sampling_level == "sequence":
        log_ratio = ((log_ratio * mask).sum(-1) / tokens.clamp(min=1))[:, None]
    ratio = torch.exp(log_ratio)  # (B, T), or (B, 1) per sequence

    if loss_type == "cispo":  # the ratio clipped and detached: a REINFORCE weight
        per_token = -torch.clamp(ratio, max=epsilon_high).detach() * A * logps
    elif loss_type == "sapo":  # a smooth gate in place of the clip
        tau = torch.where(A > 0, *sapo_temperatures)  # (B, 1)
        per_token = -torch.sigmoid(tau * (ratio - 1)) * 4 / tau * A
    else:  # the pessimistic (smaller) of the unclipped and clipped objectives
        clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
        per_token = -torch.min(ratio * A, clipped * A)  # (B, T) or (B, 1)
    kl = kl_k3(logps, ref_logps) if ref_logps is not None else torch.zeros_like(logps)
    if use_bias_correction_kl:
        kl = kl * ratio  # (B, T)
    if beta:
        per_token = per_token + beta * kl  # (B, T)

    summed = (per_token * mask).sum(-1)  # (B,): padding counts nothing
    if loss_type in ("grpo", "sapo"):
        loss = (summed / tokens.clamp(min=1)).mean()
    elif loss_type == "bnpo":
        loss = summed.sum() / tokens.sum().clamp(min=1)
    elif loss_type == "dr_grpo":
        loss = summed.sum() / (B * max_completion_length)
    elif loss_type in ("dapo", "cispo"):
        n = tokens.sum() if num_items is None else torch.as_tensor(num_items)
        loss = summed.sum() / n.to(logps.dtype).clamp(min=1)
    else:  # luspo
        loss = summed.mean()

    def mean(x):  # over tokens, or over completions when one value a completion
        if x.shape[1] == 1:
            return x.float().mean()
        return (x * mask).sum() / mask.sum().clamp(min=1)

    with torch.no_grad():
        if loss_type == "cispo":
            low, high = torch.zeros_like(ratio, dtype=torch.bool), ratio > epsilon_high
        else:
            low, high = ratio < 1 - epsilon_low, ratio > 1 + epsilon_high
        low, high = low & (A < 0), high & (A > 0)
        if loss_type == "sapo":
            low, high = torch.zeros_like(low), torch.zeros_like(high)
        return GRPOLoss(loss, mean(kl.detach()), mean(low.float()), mean(high.float()))
