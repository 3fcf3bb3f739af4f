"""09 Fast generation, its last task: speculative decoding that equals greedy decoding
(the task is declared, in course order, in smol.grading.checks.fast)."""

import torch

from smol.generate import generate
from smol.grading.checks._util import after_prefill, is_tensor
from smol.grading.checks.generation import (
    CONFIG,
    _greedy,
    _model,
    _passes,
    _scaled_model,
)
from smol.grading.registry import probe_check


def _spec_model(scale, seed):
    """A small model with weights scaled up, so that greedy choices are clear; at
    scale 4 its text soon repeats, at scale 8 it repeats now and then: its weights
    and a prompt."""
    torch.manual_seed(seed)
    model = _scaled_model(scale)
    prompt = torch.randint(0, CONFIG.vocab_size, (1, 6))
    return {"state": model.state_dict(), "prompt": prompt}


LENGTHS = (15, 1, 0)  # max_new_tokens: drafts, the prefill's token only, nothing


def _judge_spec_shape(inputs, outs):
    for n, out in zip(LENGTHS, outs, strict=True):
        is_tensor(out, "the output")
        assert tuple(out.shape) == (1, 6 + n), (
            f"max_new_tokens={n}: shape {tuple(out.shape)}, expected (1, {6 + n})"
        )
        assert torch.equal(out[:, :6], inputs["prompt"]), (
            "the output does not start with the prompt"
        )


@probe_check(
    "speculative_greedy",
    "returns (1, T + max_new_tokens) token ids starting with the prompt (also for "
    "max_new_tokens = 1 and 0)",
    1,
    "append the next token and the accepted draft tokens; stop at max_new_tokens, "
    "which may be 0: append the prefill's token only inside the loop",
    inputs=lambda: _spec_model(4, 5),
    judge=_judge_spec_shape,
)
def _(fn, inputs):
    model = _model(inputs["state"])
    return [fn(model, inputs["prompt"], n) for n in LENGTHS]


# greedy's top logit leads by more than 0.06 at every step: no near ties
RUNS = ((8, 5, 30), (8, 6, 30), (4, 5, 30), (4, 5, 13))


def _judge_spec_greedy(inputs, outs):
    for case, (_, _, n), out in zip(inputs, RUNS, outs, strict=True):
        want = generate(_model(case["state"]), case["prompt"], n, temperature=0.0)
        is_tensor(out, "the output")
        assert out.shape == want.shape and torch.equal(out, want), (
            f"generated {out[0, 6:].tolist()}, greedy decoding gives "
            f"{want[0, 6:].tolist()}"
        )


@probe_check(
    "speculative_greedy",
    "the same tokens as greedy decoding, with drafts kept and drafts rejected",
    2,
    "keep the draft up to its first token unlike the model's choice before it; then "
    "take that choice, and forget the rejected tokens' keys and values (cache.length "
    "-= rejected)",
    inputs=lambda: [_spec_model(scale, seed) for scale, seed, _ in RUNS],
    judge=_judge_spec_greedy,
)
def _(fn, inputs):
    return [_greedy(fn, case, n) for case, (_, _, n) in zip(inputs, RUNS)]


def _judge_passes(inputs, calls):
    steps = after_prefill(calls, 6)
    assert len(steps) <= 30, (
        f"{len(steps)} passes after the prefill for 40 tokens of a text that repeats: "
        "the drafts are not used"
    )


probe_check(
    "speculative_greedy",
    "fewer forward passes than tokens where the text repeats, each with the cache",
    1,
    "after the prefill, one pass over [next token, *draft] checks the whole draft: "
    "model(step, kv_cache=cache)",
    inputs=lambda: _spec_model(4, 1),
    judge=_judge_passes,
)(_passes(40))
