"""14 Multiple choice: the log-probabilities of an answer's tokens, their sum or mean,
and a scorer that reads each answer token at its own position instead of the one
before it."""

import torch

from smol.grading.checks._util import close, is_tensor
from smol.grading.registry import probe_check, task

task(
    "answer_logprobs",
    "multiple_choice",
    "answer_logprobs(logits, ids, n_context): each answer token's log-probability",
)
task(
    "choice_score",
    "multiple_choice",
    "choice_score(logits, ids, n_context, normalise): summed or mean log-likelihood",
)
task(
    "answer_logprobs_bug",
    "multiple_choice",
    "Find the bug: a scorer whose values look right but whose answers are wrong",
)

BOTH = ("answer_logprobs", "answer_logprobs_bug")
T, V = 9, 13  # a sequence of T tokens (context + answer) over a vocabulary of V
CONTEXTS = (1, 4, 8)  # the context's length: the answer holds T - n tokens


def reference(logits: torch.Tensor, ids: torch.Tensor, n: int) -> torch.Tensor:
    """(T - n,): position t - 1 predicts token t."""
    logp = logits[n - 1 : -1].float().log_softmax(-1)  # (T - n, V)
    return logp.gather(-1, ids[n:, None]).squeeze(-1)


def cases(normalised: bool, constant_rows: bool = False, gap: float = 0) -> list[dict]:
    """A sequence for each context length: logits (T, V) and ids (T,). normalised:
    rows that are already log-probabilities; constant_rows: every position's logits
    alike, so which position scores a token does not matter; gap: the last token's
    logit that far above the others', a token the ids never hold (120: each answer
    token's log-probability near -120, its probability 0 in float32)."""
    out = []
    for n in CONTEXTS:
        logits = torch.randn(T, V) * 2
        if constant_rows:
            logits = logits[:1].expand(T, V).clone() + 3.0
        if normalised:
            logits = logits.log_softmax(-1)
        if gap:
            logits[:, -1] = logits.max() + gap
        ids = torch.randint(0, V - 1 if gap else V, (T,))
        out.append({"logits": logits, "ids": ids, "n": n})
    return out


def in_bfloat16(sequences: list[dict]) -> list[dict]:
    """The sequences with bfloat16 logits, as a bfloat16 model gives them."""
    return [c | {"logits": c["logits"].bfloat16()} for c in sequences]


def and_bfloat16(sequences: list[dict]) -> list[dict]:
    return sequences + in_bfloat16(sequences)


def what(c: dict) -> str:
    return f"context of {c['n']}, {str(c['logits'].dtype).removeprefix('torch.')}"


def run_all(fn, inputs):
    return [fn(c["logits"], c["ids"], c["n"]) for c in inputs]


def answer_part(out, n: int):
    """The last T - n values: a result that also scores the context's tokens is
    judged on its answer's values by these checks and fails the shape check alone."""
    out = is_tensor(out).flatten()
    return out[-(T - n) :] if out.numel() >= T - n else out


def judge_shapes(inputs, outputs) -> None:
    for c, out in zip(inputs, outputs):
        is_tensor(out)
        assert tuple(out.shape) == (T - c["n"],), (
            f"{T} tokens with a context of {c['n']}: expected one value per answer "
            f"token, shape ({T - c['n']},), got {tuple(out.shape)}"
        )


def judge_values(inputs, outputs) -> None:
    for c, out in zip(inputs, outputs):
        want = reference(c["logits"], c["ids"], c["n"])
        close(answer_part(out, c["n"]), want, what(c), atol=1e-4)


for name, points, hint, make, judge in (
    (
        "one value per answer token, none for the context",
        1,
        "slice the answer's positions only: T - n_context values",
        lambda: cases(normalised=True),
        judge_shapes,
    ),
    (
        "each answer token is scored by the position before it",
        2,
        "logits[t] predicts ids[t + 1]: the first answer token ids[n] is scored by "
        "logits[n - 1], the context's last position",
        lambda: cases(normalised=True),
        judge_values,
    ),
    (
        "log-probabilities (log_softmax over the vocabulary, in float32 for bfloat16 "
        "logits), not raw logits, nor softmax().log() (-inf 120 below the best)",
        1,
        "take log_softmax(-1) of the logits in float32 (logits.float() first: in "
        "bfloat16 each log-probability is off by hundredths) before picking the "
        "tokens; not softmax(-1).log(): a token whose logit is 120 below the best "
        "has probability e^-120, 0 in float32, and its log is -inf, not -120",
        lambda: (
            and_bfloat16(cases(normalised=False, constant_rows=True))
            + cases(normalised=False, constant_rows=True, gap=120)
        ),
        judge_values,
    ),
):
    probe_check(BOTH, name, points, hint, inputs=make, judge=judge)(run_all)


def judge_scores(normalise: bool):
    def judge(inputs, outputs) -> None:
        for c, out in zip(inputs, outputs):
            lp = reference(c["logits"], c["ids"], c["n"])
            want = lp.mean() if normalise else lp.sum()
            close(is_tensor(out).reshape(()), want, what(c), atol=1e-4)

    return judge


for normalise, name, hint, make in (
    (
        False,
        "normalise=False: the sum over the answer's tokens",
        "answer_logprobs(...).sum()",
        lambda: cases(normalised=False),
    ),
    (
        True,
        "normalise=True: the mean over the answer's tokens only",
        "divide by the number of answer tokens (T - n_context), not by T",
        lambda: cases(normalised=False),
    ),
    (
        False,
        "bfloat16 logits: the sum of float32 log-probabilities",
        "upcast before log_softmax (logits.float()), as answer_logprobs does: "
        "bfloat16 log-probabilities are off by hundredths each, and a sum adds them",
        lambda: in_bfloat16(cases(normalised=False)),
    ),
    (
        False,
        "a logit 120 above the answer's: log_softmax, not softmax().log() (-inf)",
        "answer_logprobs(...) with log_softmax(-1), or F.cross_entropy: "
        "softmax(-1).log() gives probability e^-120, 0 in float32, a log of -inf; "
        "log_softmax subtracts the logsumexp instead, -120",
        lambda: cases(normalised=False, gap=120),
    ),
):

    @probe_check(
        "choice_score",
        name,
        1,
        hint,
        inputs=make,
        judge=judge_scores(normalise),
    )
    def _(fn, inputs, normalise=normalise):
        return [fn(c["logits"], c["ids"], c["n"], normalise) for c in inputs]
