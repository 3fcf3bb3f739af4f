"""15 DPO, on a batch: the loss of B pairs from the logits of their 2B rows, chosen
rows first, then rejected (as smol.dpo.collate_pairs and TRL stack them), and a
version that pairs the rows by twos, right only for a batch of one pair."""

import torch

from smol.grading.checks._util import close, is_tensor
from smol.grading.checks.dpo import IGNORE, V
from smol.grading.checks.dpo_loss import NAMES, _three
from smol.grading.registry import probe_check, task

task(
    "dpo_batch_bug",
    "dpo",
    "Find the bug: a batch loss that trains on one pair and not on four",
)


def _reference(c: dict):
    """(loss, chosen_rewards, rejected_rewards) of smol's functions."""
    from smol.dpo import dpo_loss, sequence_logprobs

    policy = sequence_logprobs(c["policy_logits"], c["targets"])  # (2B,)
    ref = sequence_logprobs(c["ref_logits"], c["targets"])
    B = len(policy) // 2
    out = dpo_loss(policy[:B], policy[B:], ref[:B], ref[B:], c["beta"])
    return out.loss, out.chosen_rewards, out.rejected_rewards


def _batch(B: int, T: int, beta: float, dtype=torch.float32) -> dict:
    """B pairs in 2B rows of T targets: each pair's prompt (-100) is shared by its
    chosen row b and its rejected row B + b, each reply is followed by padding
    (-100)."""
    targets = torch.randint(0, V, (2 * B, T))
    for b in range(B):
        prompt = int(torch.randint(1, T - 2, ()))
        targets[[b, B + b], :prompt] = IGNORE
        for row in (b, B + b):
            end = int(torch.randint(prompt + 1, T + 1, ()))
            targets[row, end:] = IGNORE
    logits = [(torch.randn(2 * B, T, V) * 2).to(dtype) for _ in range(2)]
    return {
        "policy_logits": logits[0],
        "ref_logits": logits[1],
        "targets": targets,
        "beta": beta,
    }


def _what(c: dict) -> str:
    dtype = str(c["policy_logits"].dtype).removeprefix("torch.")
    return f"{len(c['targets']) // 2} pairs, beta={c['beta']}, {dtype} logits"


def _run(fn, c: dict, grad: bool = False) -> dict:
    """Probe side: the student's three results; with grad=True also the gradient
    the loss sends to each of the logits (outputs of a model, both run with
    autograd on, as a reference forward without torch.no_grad is)."""
    leaves = [
        c[k].clone().requires_grad_(grad) for k in ("policy_logits", "ref_logits")
    ]
    inputs = [t.clone() for t in leaves] if grad else leaves
    out = dict(zip(NAMES, _three(fn(*inputs, c["targets"], c["beta"]))))
    if grad:
        is_tensor(out["loss"], "the loss").sum().backward()
        out["grads"] = [t.grad for t in leaves]
    return out


def _judge_values(inputs, outputs) -> None:
    for c, out in zip(inputs, outputs):
        for name, want in zip(NAMES, _reference(c)):
            got = is_tensor(out[name], name)
            got = got.reshape(()) if name == "loss" and got.numel() == 1 else got
            close(got, want, f"{name} ({_what(c)})", atol=1e-4)


def _judge_grads(inputs, outputs) -> None:
    for c, out in zip(inputs, outputs):
        policy, ref = out["grads"]
        assert policy is not None and policy.abs().sum() > 0, (
            f"{_what(c)}: no gradient reached the policy's logits"
        )
        assert ref is None or not ref.any(), (
            f"{_what(c)}: the loss sends a gradient to the reference's logits: "
            "the reference must stay fixed"
        )


for name, points, hint, make, grad, judge in (
    (
        "one pair: the loss and rewards of its two rows",
        1,
        "sequence_logprobs of the policy's and the reference's logits, then dpo_loss "
        "of the chosen and the rejected rows",
        lambda: [_batch(1, 7, 0.1), _batch(1, 6, 0.5, torch.bfloat16)],
        False,
        _judge_values,
    ),
    (
        "several pairs: row b is chosen, row B + b its rejected reply",
        2,
        "the rows are all the chosen replies, then all the rejected ones: "
        "logp[:B] and logp[B:], not logp[0::2] and logp[1::2]",
        lambda: [_batch(2, 7, 0.1), _batch(4, 5, 1.0)],
        False,
        _judge_values,
    ),
    (
        "the gradient reaches the policy's logits, none the reference's",
        1,
        "the reference's log-probabilities are constants: detach them (or run the "
        "reference under torch.no_grad())",
        lambda: [_batch(1, 6, 0.1), _batch(3, 6, 2.0)],
        True,
        _judge_grads,
    ),
):

    @probe_check("dpo_batch_bug", name, points, hint, inputs=make, judge=judge)
    def _(fn, inputs, grad=grad):
        return [_run(fn, c, grad) for c in inputs]
