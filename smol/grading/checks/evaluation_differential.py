"""14 Multiple choice, every task against the grader's reference on generated
inputs (`_differential`): contexts of one token to all but one, answers of one
token and more, float32, bfloat16 and float16 logits from small to beyond exp's
range (above 88, a logit 120 above the answer's, every logit below -103), rows
alike (ties) and normalise both ways; values, the dtype and the gradient of the
logits compared."""

import torch

from smol.grading.checks import _differential as diff
from smol.grading.checks.evaluation import BOTH, reference

NAME = "generated inputs: values, dtypes and gradients equal smol's"
CASES = 40
RANGES = ("moderate", "above 88", "120 above the answer", "below -103", "rows alike")
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _logits(g, T: int, V: int, span: str) -> torch.Tensor:
    """(T, V) float32 logits of the range `span`."""
    x = torch.randn(T, V, generator=g) * 3
    if span == "above 88":  # exp overflows in float32 (and in float16 from 11)
        x = x * 10 + 90
    elif span == "120 above the answer":  # its probability underflows to 0
        x[:, -1] = x.max() + 120
    elif span == "below -103":  # every exp underflows
        x = x - 130
    elif span == "rows alike":  # every position the same: ties across rows
        x = x[:1].expand(T, V).clone()
    return x


def _case(g) -> dict:
    T, V = int(torch.randint(2, 12, (), generator=g)), diff.pick(g, (2, 5, 13, 40))
    n = int(
        torch.randint(1, T, (), generator=g)
    )  # 1 .. T - 1: one answer token or more
    span, dtype = diff.pick(g, RANGES), diff.pick(g, DTYPES)
    if dtype == torch.float16 and span != "moderate":  # float16 ends at 65504
        span = diff.pick(g, ("rows alike", "moderate"))
    hi = V - 1 if span == "120 above the answer" else V  # the answer avoids it
    ids = torch.randint(0, hi, (T,), generator=g)
    logits = _logits(g, T, V, span).to(dtype)
    wide = dtype != torch.float32
    return {
        "what": f"T={T}, V={V}, n_context={n}, {diff.dtype_name(logits)} logits "
        f"{span}, ids {ids.tolist()}",
        "args": {"logits": logits, "ids": ids, "n": n},
        "grad": ["logits"],
        "up": [torch.randn(T - n, generator=g)],
        "tol": (1e-4, 1e-5),
        "gtol": (1e-2, 1e-2) if wide else (1e-5, 1e-4),
        "dtype": True,
    }


def _call_logprobs(fn, args):
    return [fn(args["logits"], args["ids"], args["n"])]


def _call_score(fn, args):
    return [fn(args["logits"], args["ids"], args["n"], args["normalise"])]


def _reference_score():
    def choice_score(logits, ids, n, normalise):
        logp = reference(logits, ids, n)
        return logp.mean() if normalise else logp.sum()

    return choice_score


def _score_case(g) -> dict:
    case, normalise = _case(g), bool(torch.randint(2, (), generator=g))
    return case | {
        "what": f"{case['what']}, normalise={normalise}",
        "args": case["args"] | {"normalise": normalise},
        "up": [torch.randn((), generator=g)],
    }


HINT = (
    "the case named below differs from smol's scoring: position t - 1 scores token "
    "t, with log_softmax of the float32 logits (logits.float() for bfloat16 and "
    "float16 alike), whatever the context's length"
)
diff.register(BOTH, NAME, 1, HINT, _case, _call_logprobs, lambda: reference, CASES)
diff.register(
    "choice_score",
    NAME,
    1,
    HINT + "; normalise=True divides by the answer's tokens only",
    _score_case,
    _call_score,
    _reference_score,
    CASES,
)
