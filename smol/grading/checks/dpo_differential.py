"""15 DPO, every task against smol's on generated inputs (`_differential`): replies
with gaps (-100 between reply tokens, as a conversation's later turns leave), prompt
and padding, float32 and bfloat16 logits from small to beyond exp's range (above 88,
every logit of a row below -103), beta from 0.01 to 3, margins up to thousands of
nats; values and the gradients of the logits or log-probabilities compared."""

import torch

from smol.grading.checks import _differential as diff
from smol.grading.checks.dpo import IGNORE
from smol.grading.checks.dpo_loss import SIDES, _three

NAME = "generated inputs: values and gradients equal smol's"
CASES = 48
RANGES = ("moderate", "above 88", "below -103")


def _reply_targets(g, rows: int, T: int, V: int, prompts=None):
    """(rows, T) targets: a prompt (-100), a reply of random tokens (token 0 among
    them) with, where it is 3 or more tokens long, a -100 between two of its tokens
    now and then, and padding (-100). prompts: each row's prompt length (a pair's
    two rows share theirs)."""
    targets = torch.randint(0, V, (rows, T), generator=g)
    for r in range(rows):
        p = int(torch.randint(0, T, (), generator=g)) if prompts is None else prompts[r]
        end = int(torch.randint(p + 1, T + 1, (), generator=g))
        targets[r, :p] = IGNORE
        targets[r, end:] = IGNORE
        if end - p >= 3 and torch.rand((), generator=g) < 0.6:
            gap = int(torch.randint(p + 1, end - 1, (), generator=g))
            targets[r, gap] = IGNORE  # between two reply tokens
    return targets


def _logits(g, shape, span: str, dtype) -> torch.Tensor:
    x = torch.randn(*shape, generator=g) * 3
    if span == "above 88":  # exp overflows: a logit of 90 to 150 in every row
        x = x * 10
        top = torch.randint(0, shape[-1], shape[:-1], generator=g)
        x.scatter_(
            -1, top[..., None], 90 + 60 * torch.rand(*shape[:-1], 1, generator=g)
        )
    elif span == "below -103":  # exp underflows to 0 for every logit of a row
        x = x - 130
    return x.to(dtype)


def _logits_case(g) -> dict:
    B, T = (
        int(torch.randint(1, 5, (), generator=g)),
        int(torch.randint(1, 9, (), generator=g)),
    )
    V = diff.pick(g, (2, 5, 13, 40))
    dtype, span = diff.pick(g, (torch.float32, torch.bfloat16)), diff.pick(g, RANGES)
    targets = _reply_targets(g, B, T, V)
    logits = _logits(g, (B, T, V), span, dtype)
    wide = dtype == torch.bfloat16
    return {
        "what": f"B={B}, T={T}, V={V}, {diff.dtype_name(logits)} logits {span}, "
        f"targets {targets.tolist()}",
        "args": {"logits": logits, "targets": targets},
        "grad": ["logits"],
        "up": [torch.randn(B, generator=g)],
        "tol": (1e-4, 1e-5),
        "gtol": (1e-2, 1e-2) if wide else (1e-5, 1e-4),
        "regions": {"a target of -100": targets == IGNORE},
    }


def _call_logprobs(fn, args):
    return [fn(args["logits"], args["targets"])]


def _pairs_case(g) -> dict:
    B = int(torch.randint(1, 7, (), generator=g))
    beta = diff.pick(g, (0.01, 0.1, 0.5, 1.0, 3.0))
    spread = diff.pick(g, (1.0, 30.0, 2000.0))
    logps = {s: torch.randn(B, generator=g) * spread - 60 for s in SIDES}
    return {
        "what": f"B={B} pairs, beta={beta}, log-probabilities of spread {spread}",
        "args": logps | {"beta": beta},
        "grad": list(SIDES),
        "up": [torch.randn((), generator=g), None, None],
        "tol": (1e-5, 1e-5),
        "gtol": (1e-6, 1e-4),
    }


def _call_loss(fn, args):
    return _three(fn(*(args[s] for s in SIDES), args["beta"]))


def _batch_case(g) -> dict:
    B, T = (
        int(torch.randint(1, 4, (), generator=g)),
        int(torch.randint(2, 8, (), generator=g)),
    )
    V = diff.pick(g, (3, 11, 32))
    beta = diff.pick(g, (0.01, 0.1, 0.5, 2.0))
    dtype, span = diff.pick(g, (torch.float32, torch.bfloat16)), diff.pick(g, RANGES)
    prompts = torch.randint(0, T - 1, (B,), generator=g).tolist()
    targets = _reply_targets(g, 2 * B, T, V, prompts + prompts)
    policy, ref = (_logits(g, (2 * B, T, V), span, dtype) for _ in range(2))
    wide = dtype == torch.bfloat16
    return {
        "what": f"B={B} pairs, T={T}, V={V}, beta={beta}, {diff.dtype_name(policy)} "
        f"logits {span}, targets {targets.tolist()}",
        "args": {"policy_logits": policy, "ref_logits": ref, "targets": targets}
        | {"beta": beta},
        "grad": ["policy_logits", "ref_logits"],
        "up": [torch.randn((), generator=g), None, None],
        "tol": (1e-4, 1e-4),
        "gtol": (1e-3, 1e-2) if wide else (1e-6, 1e-4),
        "regions": {"a target of -100": targets == IGNORE},
    }


def _call_batch(fn, args):
    keys = ("policy_logits", "ref_logits", "targets", "beta")
    return _three(fn(*(args[k] for k in keys)))


def _smol_logprobs():
    from smol.dpo import sequence_logprobs

    return sequence_logprobs


def _smol_loss():
    from smol.dpo import dpo_loss

    return dpo_loss


def _smol_batch():
    from smol.dpo import dpo_loss, sequence_logprobs

    def batch_loss(policy_logits, ref_logits, targets, beta):
        policy = sequence_logprobs(policy_logits, targets)  # (2B,)
        with torch.no_grad():
            ref = sequence_logprobs(ref_logits, targets)
        B = len(policy) // 2
        return dpo_loss(policy[:B], policy[B:], ref[:B], ref[B:], beta)

    return batch_loss


for task, make, call, reference, hint in (
    (
        "sequence_logprobs",
        _logits_case,
        _call_logprobs,
        _smol_logprobs,
        "the case named below differs from smol.dpo.sequence_logprobs: score every "
        "position whose target is not -100, wherever it sits (a conversation's reply "
        "can have -100 between its tokens), with log_softmax of the float32 logits "
        "(it subtracts the maximum: exp of a logit above 88 is inf in float32, of "
        "every logit below -103 is 0), and keep the -100 positions' gradient 0",
    ),
    (
        "dpo_loss",
        _pairs_case,
        _call_loss,
        _smol_loss,
        "the case named below differs from smol.dpo.dpo_loss in the loss, the "
        "rewards or the gradient the loss sends to each of the four tensors",
    ),
    (
        "dpo_batch_bug",
        _batch_case,
        _call_batch,
        _smol_batch,
        "the case named below differs from smol's functions in a value or in the "
        "gradient of a row's logits: every policy row, chosen and rejected, is "
        "scored inside the graph; only the reference's are constants",
    ),
):
    diff.register(task, NAME, 2, hint, make, call, reference, CASES)
