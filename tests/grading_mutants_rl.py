"""Mutants of the grader's checks (rl), kept with tests/test_grading.py's:
MUTANTS (bug: (task, mutant, the one check it loses)) and WIDE_MUTANTS (bug: (task,
mutant, the set of checks it loses))."""

import torch


# --- 14 multiple choice: a probability of e^-120 is 0 in float32, its log -inf
def answer_logprobs_log_of_softmax(logits, ids, n_context):
    p = logits[n_context - 1 : -1].float().softmax(-1)
    return p.gather(-1, ids[n_context:, None]).squeeze(-1).log()


def choice_score_log_of_softmax(logits, ids, n_context, normalise):
    logp = answer_logprobs_log_of_softmax(logits, ids, n_context)
    return logp.mean() if normalise else logp.sum()


# --- 16 GRPO
def advantages_nan_for_a_group_of_one(rewards, group_size):  # the former solution's
    grouped = rewards.view(-1, group_size)
    centred = grouped - grouped.mean(1, keepdim=True)
    return (centred / (grouped.std(1, keepdim=True) + 1e-4)).view(-1)


def grpo_loss_by(
    logps,
    old,
    ref,
    advantages,
    completion_mask,
    loss_type="grpo",
    beta=0.0,
    epsilon_low=0.2,
    epsilon_high=0.2,
    **bugs,
):
    """GRPO's loss with one of `bugs`: unclipped (w A alone), optimistic (the max of
    the two objectives), negative_side_only (clipped where A < 0 only), low_both
    (epsilon_low on both sides), swapped_eps, kl_flipped (d = logp - ref), kl_bonus
    (minus beta KL), kl_detached (the KL without a gradient), kl_everywhere (the
    KL's mean over every slot), padding_counted (the mask ignored), swapped_averaging
    (grpo's and dapo's exchanged), dr_by_tokens (dr_grpo divided by the token count),
    detached (the ratio without a gradient), masked_in_place (the padding of logps
    zeroed in the caller's tensor), ratio_of_exps (exp(logps) / exp(old)),
    kl_of_exps (exp(ref) / exp(logps) in k3), padding_unzeroed (the padding
    multiplied by 0 only, where its exp may be inf: exercise 16's former solution),
    straight_through (the clip's value with the unclipped ratio's gradient),
    padding_by_where (the padding dropped by a torch.where at the end: its value 0,
    its gradient NaN where exp overflowed), kl_per_token and kl_per_completion (the
    KL averaged over every real token, or per completion, whatever loss_type),
    kl_at_beta_0 (the KL term kept as 0 * KL at beta 0, NaN where the KL is inf)."""
    if bugs.get("masked_in_place"):
        logps.masked_fill_(completion_mask == 0, 0.0)
    unzeroed = {
        "kl_everywhere",
        "padding_counted",
        "padding_unzeroed",
        "padding_by_where",
    }
    if not unzeroed & set(bugs):
        pad = completion_mask == 0  # zeroed, the padding's numbers cannot overflow
        logps, old, ref = (x.masked_fill(pad, 0.0) for x in (logps, old, ref))
    A = advantages[:, None]
    low, high = 1 - epsilon_low, 1 + epsilon_high
    if bugs.get("low_both"):
        high = 1 + epsilon_low
    if bugs.get("swapped_eps"):
        low, high = 1 - epsilon_high, 1 + epsilon_low
    w = torch.exp((logps.detach() if bugs.get("detached") else logps) - old)
    if bugs.get("ratio_of_exps"):
        w = logps.exp() / old.exp()
    clipped = w.clamp(low, high)
    if bugs.get("straight_through"):
        clipped = w + (clipped - w).detach()
    if bugs.get("unclipped"):
        objective = w * A
    elif bugs.get("optimistic"):
        objective = torch.max(w * A, clipped * A)
    elif bugs.get("negative_side_only"):
        objective = torch.where(A < 0, torch.min(w * A, clipped * A), w * A)
    else:
        objective = torch.min(w * A, clipped * A)
    d = (logps - ref) if bugs.get("kl_flipped") else (ref - logps)
    if bugs.get("kl_detached"):
        d = d.detach()
    e = ref.exp() / logps.exp() if bugs.get("kl_of_exps") else torch.exp(d)
    kl = (e - d - 1) * (-1 if bugs.get("kl_bonus") else 1)
    mask = completion_mask.to(logps.dtype)
    if bugs.get("padding_counted"):
        mask = torch.ones_like(mask)
    kept = beta or bugs.get("kl_at_beta_0")  # at beta 0 no KL term, as smol's
    extra = beta * kl.mean() if kept and bugs.get("kl_everywhere") else 0.0
    if kept and bugs.get("kl_per_token"):
        extra = beta * (kl * mask).sum() / mask.sum()
    if kept and bugs.get("kl_per_completion"):
        extra = beta * ((kl * mask).sum(-1) / mask.sum(-1)).mean()
    own_kl = {"kl_everywhere", "kl_per_token", "kl_per_completion"} & set(bugs)
    per_token = -objective + (beta * kl if kept and not own_kl else 0.0)
    if bugs.get("padding_by_where"):
        per_token = torch.where(completion_mask.bool(), per_token, 0.0)
    summed = (per_token * mask).sum(-1)
    if bugs.get("swapped_averaging"):
        loss_type = {"grpo": "dapo", "dapo": "grpo"}.get(loss_type, loss_type)
    if bugs.get("dr_by_tokens") and loss_type == "dr_grpo":
        loss_type = "dapo"
    if loss_type == "grpo":
        return (summed / mask.sum(-1)).mean() + extra
    if loss_type == "dapo":
        return summed.sum() / mask.sum() + extra
    return summed.sum() / mask.numel() + extra


def grpo_loss_with(bug):
    return lambda *args, **options: grpo_loss_by(*args, **options, **{bug: True})


def grpo_batch_loss_ratio_of_exps(logps, old, ref, rewards, mask, group_size, beta):
    from smol.grpo import group_advantages, kl_k3

    A = group_advantages(rewards, group_size)[:, None]
    ratio = logps.exp() / old.exp()  # 0 / 0 at log-probabilities of -110
    per_token = -torch.min(ratio * A, ratio.clamp(0.8, 1.2) * A)
    per_token = per_token + beta * kl_k3(logps, ref)
    mask = mask.float()
    return ((per_token * mask).sum(-1) / mask.sum(-1)).mean()


def grpo_batch_loss_straight_through(logps, old, ref, rewards, mask, group_size, beta):
    """The fix with the clip as a straight-through estimate: the clipped value, the
    unclipped ratio's gradient."""
    from smol.grpo import group_advantages, kl_k3

    A = group_advantages(rewards, group_size)[:, None]
    ratio = torch.exp(logps - old)
    clipped = ratio + (ratio.clamp(0.8, 1.2) - ratio).detach()
    per_token = -torch.min(ratio * A, clipped * A) + beta * kl_k3(logps, ref)
    mask = mask.float()
    return ((per_token * mask).sum(-1) / mask.sum(-1)).mean()


def advantages_refusing_only(refused):
    """group_advantages that refuses the group sizes in `refused` alone."""

    def advantages(rewards, group_size):
        if group_size in refused:
            raise ValueError(f"group_size must be at least 2, got {group_size}")
        grouped = rewards.view(-1, group_size)
        centred = grouped - grouped.mean(1, keepdim=True)
        return (centred / (grouped.std(1, keepdim=True) + 1e-4)).view(-1)

    return advantages


# --- 15 DPO
def logprobs_without_the_max(logits, targets):
    """log_softmax by hand, log(sum(exp(x))) without the maximum taken out: inf above
    a logit of 88, -inf where every logit is below -103."""
    x = logits.float()
    logp = x - x.exp().sum(-1, keepdim=True).log()
    picked = logp.gather(-1, targets.clamp(min=0)[..., None]).squeeze(-1)
    return torch.where(targets != -100, picked, 0.0).sum(-1)


def logprobs_from_first_to_last_reply_token(logits, targets):
    """The reply as every position from its first scored token to its last: a -100
    between two reply tokens is scored as token 0."""
    scored = (targets != -100).int()
    reply = (
        scored.cummax(-1).values.bool()
        & scored.flip(-1).cummax(-1).values.flip(-1).bool()
    )
    logp = logits.float().log_softmax(-1)
    picked = logp.gather(-1, targets.clamp(min=0)[..., None]).squeeze(-1)
    return torch.where(reply, picked, 0.0).sum(-1)


def dpo_batch_rejected_under_no_grad(policy_logits, ref_logits, targets, beta):
    """The rejected rows scored with the reference's, under no_grad: the right loss,
    no gradient for the rejected replies."""
    from smol.dpo import dpo_loss, sequence_logprobs

    B = len(targets) // 2
    chosen = sequence_logprobs(policy_logits[:B], targets[:B])
    with torch.no_grad():
        rejected = sequence_logprobs(policy_logits[B:], targets[B:])
        ref = sequence_logprobs(ref_logits, targets)
    return dpo_loss(chosen, rejected, ref[:B], ref[B:], beta)


UNLIKELY = "log-probabilities near -110"
GENERATED = "generated inputs"  # the differential checks, one a task of 15 and 16
MUTANTS: dict = {
    "answer log-probabilities as softmax().log() (-inf for a gap of 120)": (
        "answer_logprobs",
        answer_logprobs_log_of_softmax,
        "log-probabilities (log_softmax",
    ),
    "a fixed scorer taking softmax().log()": (
        "answer_logprobs_bug",
        answer_logprobs_log_of_softmax,
        "log-probabilities (log_softmax",
    ),
    "a choice's score summed from softmax().log()": (
        "choice_score",
        choice_score_log_of_softmax,
        "a logit 120 above",
    ),
    "advantages of a group of one: NaN, not refused": (
        "group_advantages",
        advantages_nan_for_a_group_of_one,
        "group_size < 2 is refused",
    ),
    "GRPO's ratio as exp(logps) / exp(old_logps) (0 / 0 at -110)": (
        "grpo_loss",
        grpo_loss_with("ratio_of_exps"),
        UNLIKELY,
    ),
    "k3 from exp(ref_logps) / exp(logps) (0 / 0 at -110)": (
        "grpo_loss",
        grpo_loss_with("kl_of_exps"),
        UNLIKELY,
    ),
    "the padding multiplied by 0 only (inf * 0 where exp overflows there)": (
        "grpo_loss",
        grpo_loss_with("padding_unzeroed"),
        "padding (completion_mask 0)",
    ),
    "a batch loss whose ratio is exp(logps) / exp(old_logps)": (
        "grpo_batch_bug",
        grpo_batch_loss_ratio_of_exps,
        UNLIKELY,
    ),
}
# Full marks before the differential checks: each loses that check alone.
MUTANTS |= {
    "log_softmax by hand without the maximum (inf above 88, -inf below -103)": (
        "sequence_logprobs",
        logprobs_without_the_max,
        GENERATED,
    ),
    "a -100 between two reply tokens scored as token 0": (
        "sequence_logprobs",
        logprobs_from_first_to_last_reply_token,
        GENERATED,
    ),
    "a DPO batch whose rejected rows get no gradient (no_grad)": (
        "dpo_batch_bug",
        dpo_batch_rejected_under_no_grad,
        GENERATED,
    ),
    "GRPO's clip as a straight-through estimate (unclipped gradient)": (
        "grpo_loss",
        grpo_loss_with("straight_through"),
        GENERATED,
    ),
    "the padding dropped by torch.where at the end (NaN gradient there)": (
        "grpo_loss",
        grpo_loss_with("padding_by_where"),
        GENERATED,
    ),
    "the KL averaged over every real token, whatever loss_type": (
        "grpo_loss",
        grpo_loss_with("kl_per_token"),
        GENERATED,
    ),
    "the KL averaged per completion, whatever loss_type": (
        "grpo_loss",
        grpo_loss_with("kl_per_completion"),
        GENERATED,
    ),
    "a fixed batch loss whose clip is a straight-through estimate": (
        "grpo_batch_bug",
        grpo_batch_loss_straight_through,
        GENERATED,
    ),
    "group_size 0 not refused (only 1 is)": (
        "group_advantages",
        advantages_refusing_only({1}),
        GENERATED,
    ),
    "a negative group_size not refused (0 and 1 are)": (
        "group_advantages",
        advantages_refusing_only({0, 1}),
        GENERATED,
    ),
}
WIDE_MUTANTS: dict = {}
