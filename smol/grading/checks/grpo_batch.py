"""16 GRPO, on a batch: the loss of P prompts' groups of G completions from their
rewards and per-token log-probabilities ("grpo" averaging, eps 0.2, the KL of the
GRPO paper), and a version whose clipped objective is the optimistic one: right on
the policy's own samples (every ratio 1), wrong once the sampling policy is an
older one."""

import torch

from smol.grading.checks._util import close, is_tensor
from smol.grading.registry import probe_check, task

task(
    "grpo_batch_bug",
    "grpo",
    "Find the bug: a GRPO loss that is right on the policy's own samples only",
)

SIDES = ("logps", "old_logps", "ref_logps")


def _reference(c: dict, logps: torch.Tensor | None = None) -> torch.Tensor:
    """smol's loss of the batch (logps: a leaf to take gradients of)."""
    from smol.grpo import group_advantages, grpo_loss

    advantages = group_advantages(c["rewards"], c["group_size"])
    return grpo_loss(
        c["logps"] if logps is None else logps,
        c["old_logps"],
        c["ref_logps"],
        advantages,
        c["completion_mask"],
        loss_type="grpo",
        beta=c["beta"],
        use_bias_correction_kl=False,
    ).loss


def _batch(
    P: int, G: int, T: int, beta: float, on_policy: bool, shift: float = 0.0
) -> dict:
    """P groups of G completions of up to T tokens (lengths from 1 to T, padded with
    0 as smol.grpo.completion_logprobs pads), 0/1 rewards with the last group's all
    equal, a reference away from the policy, and old log-probabilities equal to the
    policy's (on_policy: every ratio 1) or from ratios of 0.41 to 2.46; shift: added
    to all three (-110: unlikely tokens, whose exp is 0 in float32)."""
    B = P * G
    lengths = torch.randint(1, T + 1, (B,))
    lengths[0] = T
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    logps = -torch.rand(B, T) * 4 - 0.1 + shift
    log_ratio = torch.stack(
        [torch.linspace(-0.9, 0.9, T)[torch.randperm(T)] for _ in range(B)]
    )
    old = logps.clone() if on_policy else logps - log_ratio
    ref = logps + torch.randn(B, T) * 0.5
    rewards = torch.randint(0, 2, (P, G)).float()
    rewards[:, :2] = torch.tensor([1.0, 0.0])  # every group but the last varies
    rewards[-1] = 1.0
    zero = mask == 0
    return {
        "logps": logps.masked_fill(zero, 0.0),
        "old_logps": old.masked_fill(zero, 0.0),
        "ref_logps": ref.masked_fill(zero, 0.0),
        "rewards": rewards.flatten(),
        "completion_mask": mask,
        "group_size": G,
        "beta": beta,
    }


def _what(c: dict) -> str:
    G = c["group_size"]
    P = len(c["rewards"]) // G
    same = torch.equal(c["logps"], c["old_logps"])
    policy = "on-policy" if same else "an older sampling policy"
    return f"{P} groups of {G}, beta={c['beta']}, {policy}"


def _run(fn, c: dict, grad: bool = False) -> dict:
    """Probe side: the student's loss; with grad=True also the gradient it sends to
    logps (a model's output, not a leaf), the old log-probabilities equal to it."""
    logps = c["logps"]
    if grad:
        leaf = logps.clone().requires_grad_(True)
        logps = leaf.clone()
    out = fn(
        logps,
        c["old_logps"],
        c["ref_logps"],
        c["rewards"],
        c["completion_mask"],
        c["group_size"],
        c["beta"],
    )
    loss = is_tensor(getattr(out, "loss", out), "the loss")
    result = {"loss": loss}
    if grad:
        assert loss.requires_grad, "the loss is not connected to logps' graph"
        loss.sum().backward()
        result["grad"] = leaf.grad
    return result


def _judge_values(inputs, outputs) -> None:
    for c, out in zip(inputs, outputs):
        loss = is_tensor(out["loss"], "the loss")
        assert loss.numel() == 1, f"the loss has shape {tuple(loss.shape)}: one number"
        close(loss.reshape(()), _reference(c), f"the loss ({_what(c)})")


def _judge_grads(inputs, outputs) -> None:
    for c, out in zip(inputs, outputs):
        assert out["grad"] is not None, f"{_what(c)}: no gradient reached logps"
        leaf = c["logps"].clone().requires_grad_(True)
        _reference(c, leaf).backward()
        close(out["grad"], leaf.grad, f"the gradient of logps ({_what(c)})")


for name, points, hint, make, grad, judge in (
    (
        "on-policy (every ratio 1): the loss of the groups' advantages",
        1,
        "group_advantages of the rewards, each completion's mean token loss "
        "-w * A + beta * k3, then the mean over completions",
        lambda: [_batch(3, 4, 6, 0.04, True), _batch(4, 2, 5, 0.0, True)],
        False,
        _judge_values,
    ),
    (
        "an older sampling policy: ratios beyond 0.8 and 1.2 clipped",
        2,
        "the objective to maximise is the smaller of w * A and clip(w) * A; the loss "
        "is minus it: -torch.min(ratio * A, clipped * A), which is "
        "torch.max(-ratio * A, -clipped * A), not torch.min of the negatives",
        lambda: [_batch(3, 4, 6, 0.0, False), _batch(2, 3, 7, 0.1, False)],
        False,
        _judge_values,
    ),
    (
        "log-probabilities near -110 (unlikely tokens): exp of their differences",
        1,
        "exp(-110) is 0 in float32, and 0 / 0 is NaN: torch.exp(logps - old_logps), "
        "not torch.exp(logps) / torch.exp(old_logps), and the KL from ref - logps",
        lambda: [
            _batch(2, 4, 5, 0.1, True, -110.0),
            _batch(3, 2, 6, 0.0, True, -110.0),
        ],
        False,
        _judge_values,
    ),
    (
        "the gradient reaches logps, as the loss's",
        1,
        "compute the ratio as torch.exp(logps - old_logps) inside the graph: no "
        ".detach() of logps and no torch.no_grad()",
        lambda: [_batch(2, 4, 5, 0.1, True), _batch(3, 2, 4, 0.0, True)],
        True,
        _judge_grads,
    ),
):

    @probe_check("grpo_batch_bug", name, points, hint, inputs=make, judge=judge)
    def _(fn, inputs, grad=grad):
        return [_run(fn, c, grad) for c in inputs]
