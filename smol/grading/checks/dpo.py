"""15 DPO: the summed log-probability of a reply's tokens (DPO's loss: `dpo_loss`,
the loss of a whole batch of pairs: `dpo_batch`).

Each check's inputs keep the other checks' bugs out of sight: where the prompt is
checked every row holds one reply token (a mean over the reply is its sum), and where
the sum is checked the only -100 sit where token 0 is certain, so that a bug loses the
points of the check written for it."""

import torch

from smol.grading.checks._util import close, is_tensor, same_shape, untouched
from smol.grading.registry import probe_check, task

task(
    "sequence_logprobs",
    "dpo",
    "sequence_logprobs(logits, targets): each row's summed reply log-probability",
)

IGNORE = -100
V = 13  # the vocabulary of the logits


def _logp_reference(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    from smol.dpo import sequence_logprobs

    return sequence_logprobs(logits, targets)


def _one_token_rows(B: int, T: int, V: int = V) -> torch.Tensor:
    """(B, T) targets, -100 but for one reply token a row: the first row's at position
    0, the last row's at T - 1 (a prompt of T - 1 tokens), the others between."""
    targets = torch.full((B, T), IGNORE)
    for b in range(B):
        t = (T - 1) if b == B - 1 and B > 1 else int(torch.randint(0, T, ()))
        targets[b, 0 if b == 0 else t] = int(torch.randint(1, V, ()))
    return targets


def _sure_of_token_0(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The logits with every position whose target is -100 sure of token 0 (its
    log-probability exactly 0): a sum that takes in those positions as token 0
    (targets.clamp(min=0)) adds nothing there."""
    sure = torch.full((V,), -1e4).index_fill(0, torch.tensor([0]), 0.0)
    out = logits.clone()
    out[targets == IGNORE] = (sure + logits.amax()).to(logits.dtype)
    return out


def _case(B, T, targets, scale=3.0, shift=0.0, dtype=torch.float32) -> dict:
    logits = (torch.randn(B, T, V) * scale + shift).to(dtype)
    return {"logits": logits, "targets": targets}


def _prompt_cases():
    """float32 logits, one reply token a row among prompt and padding; in the last
    case the reply tokens are token 0, a real token (targets > 0 is no mask)."""
    cases = [_case(B, T, _one_token_rows(B, T)) for B, T in ((2, 5), (3, 8), (1, 6))]
    zero = _one_token_rows(2, 4)
    return cases + [_case(2, 4, zero.masked_fill(zero != IGNORE, 0))]


def _whole_reply_cases():
    """float32 logits, every target a reply token (none token 0: the prompt
    check's); and replies of 1 and 3 tokens in one batch, the shorter padded with
    -100 at positions sure of token 0 (so that scoring padding as token 0 adds
    nothing here): the reply tokens taken out and reshaped to (B, -1) sum 2 and 2."""
    cases = [_case(B, T, torch.randint(1, V, (B, T))) for B, T in ((2, 4), (3, 7))]
    unequal = _case(2, 3, torch.randint(1, V, (2, 3)))
    unequal["targets"][0, 1:] = IGNORE
    unequal["logits"] = _sure_of_token_0(unequal["logits"], unequal["targets"])
    return cases + [unequal]


def _bfloat16_cases():
    """bfloat16 logits, all negative and large: log-probabilities of tens, where
    bfloat16 keeps two or three digits. One token a row, or one reply token among
    positions sure of token 0 (no target token 0: the prompt check's); and one
    token a row 160 below the others (a probability of 1e-70: 0 in float32, where
    log_softmax still gives -163)."""
    plain = _case(4, 1, torch.randint(1, V, (4, 1)), 8.0, -50.0, torch.bfloat16)
    masked = _case(3, 6, _one_token_rows(3, 6), 8.0, -50.0, torch.bfloat16)
    masked["logits"] = _sure_of_token_0(masked["logits"], masked["targets"])
    unlikely = _case(3, 1, torch.randint(1, V, (3, 1)), dtype=torch.bfloat16)
    unlikely["logits"].scatter_(-1, unlikely["targets"][..., None], -160.0)
    return [plain, masked, unlikely]


def _mixed_cases():
    """Prompt, reply and padding in every row; float32 and bfloat16 logits."""
    cases = []
    for B, T, dtype in ((2, 6, torch.float32), (3, 5, torch.bfloat16)):
        targets = torch.randint(0, V, (B, T))
        targets[:, :2] = IGNORE  # the prompt
        targets[0, -1] = IGNORE  # padding
        cases.append(_case(B, T, targets, dtype=dtype))
    return cases


def _what(c: dict) -> str:
    B, T = c["targets"].shape
    return f"B={B}, T={T}, {str(c['logits'].dtype).removeprefix('torch.')} logits"


def _run_all(fn, inputs):
    return [fn(c["logits"], c["targets"]) for c in inputs]


def _judge_values(inputs, outputs) -> None:
    assert isinstance(outputs, list) and len(outputs) == len(inputs), "one result each"
    for c, out in zip(inputs, outputs):
        want = _logp_reference(c["logits"], c["targets"])
        close(is_tensor(out), want, _what(c), atol=1e-4)


def _judge_float32(inputs, outputs) -> None:
    assert isinstance(outputs, list) and len(outputs) == len(inputs), "one result each"
    for c, out in zip(inputs, outputs):
        assert is_tensor(out).dtype == torch.float32, (
            f"{_what(c)}: the result is {out.dtype}, expected torch.float32"
        )
    _judge_values(inputs, outputs)


for name, points, hint, make, judge in (
    (
        "the sum over the reply's tokens only: no prompt or padding (-100) in it",
        2,
        "a target of -100 adds nothing: F.cross_entropy(..., ignore_index=-100, "
        "reduction='none') gives 0 there, or mask the gathered log-probabilities "
        "with targets != -100 (targets.clamp(min=0) alone scores token 0 at every "
        "prompt position; targets > 0 drops token 0, a real token)",
        _prompt_cases,
        _judge_values,
    ),
    (
        "a sum over the reply's tokens, not their mean",
        1,
        "DPO compares whole replies: .sum(-1) over the tokens, not .mean(-1) (a "
        "length normalisation is another method); a batch's replies differ in "
        "length, so sum each row's own tokens (a mask), never the picked tokens "
        "reshaped to (B, -1)",
        _whole_reply_cases,
        _judge_values,
    ),
    (
        "bfloat16 logits: log-probabilities in float32",
        1,
        "logits.float() before log_softmax or cross_entropy: in bfloat16 a "
        "log-probability of -20 is off by up to 0.06, and a sum adds the errors; "
        "and log_softmax, not softmax().log(): a token's probability of 1e-70 (a "
        "model's for a rejected reply's token) is 0 in float32, its log -inf",
        _bfloat16_cases,
        _judge_float32,
    ),
):
    probe_check("sequence_logprobs", name, points, hint, inputs=make, judge=judge)(
        _run_all
    )


def _judge_untouched(inputs, outputs) -> None:
    for c, out in zip(inputs, outputs):
        untouched(out["logits"], c["logits"], f"the logits ({_what(c)})")
        untouched(out["targets"], c["targets"], f"the targets ({_what(c)})")


@probe_check(
    "sequence_logprobs",
    "the logits and the targets are left unchanged",
    1,
    "logits.float() of float32 logits is the same tensor: subtracting the maximum "
    "in place (x -= ...) or writing 0 into the targets' -100 changes the caller's; "
    "write x = x - ..., or clone first",
    inputs=_mixed_cases,
    judge=_judge_untouched,
)
def _(fn, inputs):
    out = []
    for c in inputs:
        fn(c["logits"], c["targets"])
        out.append({"logits": c["logits"], "targets": c["targets"]})
    return out


def _grad_cases():
    """float32 logits, one reply token a row, and an upstream gradient per row."""
    return [
        _case(B, T, _one_token_rows(B, T)) | {"up": torch.randn(B)}
        for B, T in ((2, 5), (3, 4))
    ]


def _logits_grad(fn, c):
    """The gradient that sum(fn(logits, targets) * up) sends to the logits, taken
    as a model's output (not a leaf)."""
    leaf = c["logits"].clone().requires_grad_(True)
    out = fn(leaf.clone(), c["targets"])
    assert is_tensor(out).requires_grad, (
        "the result is not connected to the logits' graph (detached, or computed "
        "under torch.no_grad?)"
    )
    (out * c["up"]).sum().backward()
    return leaf.grad


def _judge_grads(inputs, outputs) -> None:
    for c, grad in zip(inputs, outputs):
        assert grad is not None, f"{_what(c)}: no gradient reached the logits"
        want = _logits_grad(_logp_reference, c)
        reply = c["targets"] != IGNORE  # (B, T): the positions that score a token
        same_shape(grad, want.shape, "the logits' gradient")
        close(grad[reply], want[reply], f"the logits' gradient ({_what(c)})")


@probe_check(
    "sequence_logprobs",
    "the gradient reaches the logits, as the log-probabilities' gradient",
    1,
    "compute with torch operations on the logits, inside the graph: no .detach(), "
    "torch.no_grad(), .item() or .tolist() (DPO trains through this sum)",
    inputs=_grad_cases,
    judge=_judge_grads,
)
def _(fn, inputs):
    return [_logits_grad(fn, c) for c in inputs]
