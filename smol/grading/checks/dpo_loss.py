"""15 DPO: DPO's loss with its implicit rewards, from four (B,) tensors of reply
log-probabilities (their sums: `dpo`).

Where beta is checked the pairs come in mirrored couples (a flipped margin gives the
same mean), so that a bug loses the points of the check written for it."""

import torch

from smol.grading.checks._util import close, is_tensor, untouched
from smol.grading.registry import probe_check, task

task(
    "dpo_loss",
    "dpo",
    "dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta): "
    "the loss and the implicit rewards",
)

NAMES = ("loss", "chosen_rewards", "rejected_rewards")
SIDES = ("policy_chosen", "policy_rejected", "ref_chosen", "ref_rejected")


def _loss_reference(c: dict):
    from smol.dpo import dpo_loss

    out = dpo_loss(*(c[s] for s in SIDES), c["beta"])
    return out.loss, out.chosen_rewards, out.rejected_rewards


def _pairs(B, beta, spread=2.0, mirrored=False) -> dict:
    """Four (B,) reply log-probabilities. mirrored: the second half of the pairs is
    the first with chosen and rejected swapped, so that each margin has its
    opposite in the batch."""
    half = B // 2 if mirrored else B
    logps = [torch.randn(half) * spread - 40 for _ in SIDES]
    if mirrored:
        pc, pr, rc, rr = logps
        logps = [torch.cat(t) for t in ((pc, pr), (pr, pc), (rc, rr), (rr, rc))]
    return dict(zip(SIDES, logps)) | {"beta": beta}


def _three(out) -> list:
    """Probe side: (loss, chosen_rewards, rejected_rewards) from a tuple or from an
    object with those attributes (smol's DPOLoss)."""
    if all(hasattr(out, n) for n in NAMES):
        return [getattr(out, n) for n in NAMES]
    assert isinstance(out, (tuple, list)) and len(out) == 3, (
        f"return (loss, chosen_rewards, rejected_rewards), got {type(out).__name__}"
    )
    return list(out)


def _call(fn, c: dict, grad: bool = False, backward: bool = False) -> dict:
    """Probe side: the student's three results and the four inputs after the call;
    grad: the inputs carry a graph (as a model's outputs do), backward: and the
    gradient the loss sends to each."""
    grad = grad or backward
    leaves = {s: c[s].clone().requires_grad_(grad) for s in SIDES}
    given = {s: t.clone() if grad else t for s, t in leaves.items()}
    loss, chosen, rejected = _three(fn(*(given[s] for s in SIDES), c["beta"]))
    out = {"loss": loss, "chosen_rewards": chosen, "rejected_rewards": rejected}
    out["graphs"] = [
        isinstance(t, torch.Tensor) and t.requires_grad for t in out.values()
    ]
    out["after"] = given
    out["graph_after"] = [given[s].requires_grad for s in SIDES]  # detach_() clears it
    if backward:
        is_tensor(loss, "the loss").sum().backward()
        out["grads"] = {s: leaves[s].grad for s in SIDES}
    return out


def _what_pairs(c: dict) -> str:
    return f"{len(c['policy_chosen'])} pairs, beta={c['beta']}"


def _judge_loss(inputs, outputs) -> None:
    for c, out in zip(inputs, outputs):
        loss = is_tensor(out["loss"], "the loss")
        assert loss.numel() == 1, f"the loss has shape {tuple(loss.shape)}: one number"
        want = _loss_reference(c)[0]
        close(loss.reshape(()), want, f"the loss ({_what_pairs(c)})", atol=1e-4)


def _judge_rewards(inputs, outputs) -> None:
    for c, out in zip(inputs, outputs):
        want = _loss_reference(c)
        for name, w in zip(NAMES[1:], want[1:]):
            close(is_tensor(out[name], name), w, f"{name} ({_what_pairs(c)})")


def _judge_detached(inputs, outputs) -> None:
    for c, out in zip(inputs, outputs):
        _, chosen, rejected = out["graphs"]
        assert not (chosen or rejected), (
            f"{_what_pairs(c)}: the rewards carry a graph (requires_grad): they are "
            "numbers to watch, not to train"
        )


def _judge_gradients(inputs, outputs) -> None:
    for c, out in zip(inputs, outputs):
        grads = out["grads"]
        for side in SIDES[:2]:
            g = grads[side]
            assert g is not None and torch.isfinite(g).all() and g.abs().sum() > 0, (
                f"{_what_pairs(c)}: no gradient reached {side}"
            )
        for side in SIDES[2:]:
            g = grads[side]
            assert g is None or not g.any(), (
                f"{_what_pairs(c)}: the loss sends a gradient to {side}: the "
                "reference must stay fixed"
            )


def _judge_inputs_kept(inputs, outputs) -> None:
    """The values, and the graph each input carried (a model's outputs do)."""
    for c, out in zip(inputs, outputs):
        for side, graph in zip(SIDES, out["graph_after"]):
            untouched(out["after"][side], c[side], f"{side} ({_what_pairs(c)})")
            assert graph, (
                f"{side} ({_what_pairs(c)}) left the caller's graph: detach_() "
                "detaches the caller's tensor in place; detach() makes a new one"
            )


for name, points, hint, make, grad, judge in (  # grad: 1 leaves, 2 and backward
    (
        "the loss: the mean over pairs of -log sigmoid(beta * margin)",
        2,
        "the margin is (policy_chosen - ref_chosen) - (policy_rejected - "
        "ref_rejected): the loss falls as the policy prefers the chosen reply more "
        "than the reference does; then -F.logsigmoid(beta * margin).mean()",
        lambda: [_pairs(B, 1.0) for B in (1, 4, 7)],
        0,
        _judge_loss,
    ),
    (
        "beta scales the whole margin (beta = 0.1, 0.5, 3)",
        1,
        "beta * ((policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)): "
        "beta multiplies both log-ratios, not the chosen one alone",
        lambda: [_pairs(B, b, mirrored=True) for B, b in ((2, 0.1), (6, 0.5), (4, 3))],
        0,
        _judge_loss,
    ),
    (
        "large margins (hundreds of nats): a finite loss",
        1,
        "F.logsigmoid(x), not torch.log(torch.sigmoid(x)): sigmoid(-150) is 0 in "
        "float32, and its log is -inf",
        lambda: [_pairs(B, 1.0, 300.0, mirrored=True) for B in (2, 6)],
        0,
        _judge_loss,
    ),
    (
        "the rewards: beta times each reply's log-ratio to the reference",
        1,
        "chosen_rewards = beta * (policy_chosen - ref_chosen), and the same for the "
        "rejected replies: (B,) each",
        lambda: [_pairs(3, 0.1), _pairs(5, 2.5)],
        0,
        _judge_rewards,
    ),
    (
        "the rewards are detached: numbers to watch, no graph",
        1,
        "return beta * log_ratio.detach() (or compute them under torch.no_grad())",
        lambda: [_pairs(2, 0.1), _pairs(4, 1.0)],
        1,
        _judge_detached,
    ),
    (
        "the gradient reaches the policy's log-probabilities, none the reference's",
        1,
        "the reference is a constant: ref_chosen.detach(), ref_rejected.detach() "
        "(TRL computes them under torch.no_grad())",
        lambda: [_pairs(3, 0.1), _pairs(1, 2.0)],
        2,
        _judge_gradients,
    ),
    (
        "the four log-probability tensors are left unchanged",
        1,
        "policy_chosen - ref_chosen makes a new tensor; policy_chosen -= ref_chosen "
        "writes into the caller's, and ref_chosen.detach_() cuts the caller's graph",
        lambda: [_pairs(3, 0.1), _pairs(2, 1.0)],
        1,
        _judge_inputs_kept,
    ),
):

    @probe_check("dpo_loss", name, points, hint, inputs=make, judge=judge)
    def _(fn, inputs, grad=grad):
        return [_call(fn, c, grad > 0, grad > 1) for c in inputs]
