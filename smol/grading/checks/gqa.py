"""03 Grouped-query attention: repeat_kv, causal GQA attention, and a repeat_kv that
tiles."""

import torch
import torch.nn.functional as F

from smol.attention import repeat_kv as reference_repeat_kv
from smol.grading.checks._util import (
    SDPA,
    close,
    float32_and_bfloat16,
    grads,
    in_float32_and_bfloat16,
    pair,
    qkv_grads,
    same_grads,
    same_qkv_grads,
    same_shape,
    without,
)
from smol.grading.registry import probe_check, task

task(
    "repeat_kv",
    "gqa_repeat_kv",
    "repeat_kv(x, n_rep): share each key/value head with n_rep query heads",
)
task(
    "gqa_attention",
    "gqa_repeat_kv",
    "gqa_attention(q, k, v): causal attention with fewer key/value heads",
)
task(
    "repeat_kv_bug",
    "gqa_repeat_kv",
    "Find the bug: a repeat_kv that runs and trains but pairs heads wrongly",
)

BOTH = ("repeat_kv", "repeat_kv_bug")


def _judge_repeat_shape(inputs, out):
    what = "repeat_kv of (1, 3, 7, 5) with n_rep=3"
    float32_and_bfloat16(out, (1, 9, 7, 5), what, "repeat_kv of bfloat16 keys")


def _judge_values(n_rep, what):
    return lambda x, out: close(out, reference_repeat_kv(x, n_rep), what)


def _judge_repeat_grads(x, out):
    same_grads(out, [torch.full_like(x, 2.0)], ["sum(repeat_kv(x, 2))"])


# The checks of repeat_kv, in the order a report lists them: (name, points, hint,
# the input's shape, the probe that runs the student's repeat_kv on it, the judge).
REPEAT_KV = (
    (
        "shape (B, H_kv * n_rep, T, D) on odd sizes, in the input's dtype",
        1,
        "the head dimension (dim 1) grows n_rep times; B, T and D stay; build the "
        "result from x itself (a new torch.empty is float32 for bfloat16 keys)",
        (1, 3, 7, 5),
        lambda fn, x: in_float32_and_bfloat16(lambda t: fn(t, 3), x),
        _judge_repeat_shape,
    ),
    (
        "query head h reads key/value head h // n_rep (k0 k0 k1 k1, not k0 k1 k0 k1)",
        2,
        "repeat each head in place (repeat_interleave on dim 1, or einops "
        "'b h t d -> b (h r) t d'), not tile the whole stack "
        "(x.repeat(1, n_rep, 1, 1))",
        (2, 3, 5, 4),
        lambda fn, x: fn(x, 2),
        _judge_values(2, "repeat_kv(x, 2)"),
    ),
    (
        "n_rep = 1 returns the input's values",
        1,
        "with one query head per key/value head there is nothing to repeat",
        (2, 4, 3, 6),
        lambda fn, x: fn(x, 1),
        _judge_values(1, "repeat_kv(x, 1)"),
    ),
    (
        "one key/value head (multi-query attention) serves every query head",
        1,
        "H_kv = 1 repeated n_rep times gives n_rep identical heads",
        (2, 1, 4, 6),
        lambda fn, x: fn(x, 4),
        _judge_values(4, "repeat_kv of one head, n_rep=4"),
    ),
    (
        "gradients: each key/value head collects the gradients of its n_rep copies",
        1,
        "use differentiable operations (expand + reshape, repeat_interleave, "
        "einops.repeat)",
        (2, 3, 4, 5),
        lambda fn, x: grads(lambda t: fn(t, 2), x, upstream=torch.ones(2, 6, 4, 5))[1],
        _judge_repeat_grads,
    ),
)
for name, points, hint, shape, probe, judge in REPEAT_KV:
    inputs = lambda shape=shape: torch.randn(shape)  # noqa: E731
    probe_check(BOTH, name, points, hint, inputs=inputs, judge=judge)(probe)


def _reference(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def _qkv(B=2, H=6, H_kv=2, T=5, D=4):
    return [
        torch.randn(B, H, T, D),
        torch.randn(B, H_kv, T, D),
        torch.randn(B, H_kv, T, D),
    ]


def _judge_attention_shape(qkv, out):
    float32_and_bfloat16(out, qkv[0].shape, "gqa_attention(q, k, v)")


@probe_check(
    "gqa_attention",
    "shape: (B, H, T, D), one output per query head; bfloat16 in, bfloat16 out",
    1,
    "repeat k and v to H heads first, then (q @ k^T / sqrt(D)).softmax(-1) @ v; a "
    "softmax in float32 is cast back to q's dtype",
    inputs=lambda: _qkv(T=7),
    judge=_judge_attention_shape,
)
def _(fn, qkv):
    return in_float32_and_bfloat16(fn, *qkv)


def _judge_values(qkv, out, what="gqa_attention(q, k, v)"):
    close(out, _reference(*qkv), what, atol=1e-5)


@probe_check(
    "gqa_attention",
    "values equal SDPA (causal, grouped query heads, head size 6)",
    2,
    "scale the scores by 1/sqrt(head_dim) (math.sqrt, not an integer root), mask the "
    "future with -inf before the softmax",
    inputs=lambda: _qkv(D=6),  # sqrt(6) is no integer, unlike sqrt(4)
    judge=_judge_values,
)
def _(fn, qkv):
    return fn(*qkv)


def _causal_inputs():
    q, k, v = _qkv(T=6)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 4:], v2[:, :, 4:] = torch.randn(2, 2, 2, 4), torch.randn(2, 2, 2, 4)
    return {"qkv": [q, k, v], "changed": [q, k2, v2]}


def _judge_causal(inputs, out):
    changed, same = pair(out, "two results")
    same_shape(changed, same.shape)
    close(changed[:, :, :4], same[:, :, :4], "outputs before position 4")


@probe_check(
    "gqa_attention",
    "causal: changing future tokens leaves earlier outputs unchanged",
    1,
    "mask scores[..., i, j] for j > i (torch.ones(T, T).tril() marks what may be seen)",
    inputs=_causal_inputs,
    judge=_judge_causal,
)
def _(fn, inputs):
    return [fn(*inputs["changed"]), fn(*inputs["qkv"])]


@probe_check(
    "gqa_attention",
    "plain multi-head attention (n_rep = 1) too",
    1,
    "n_rep = H // H_kv may be 1",
    inputs=lambda: _qkv(H=3, H_kv=3),
    judge=lambda qkv, out: _judge_values(qkv, out, "gqa_attention with H_kv = H"),
)
def _(fn, qkv):
    return fn(*qkv)


def _extreme_qkv():
    """Scores q . k / sqrt(D) of up to about 1500, where exp overflows in float32; and
    q and k pointing opposite ways: every score about -2e4, below a mask of -1e4,
    where exp underflows to 0."""
    q, k, v = _qkv(T=6)
    large = [20 * q, 20 * k, v]
    q, k, v = _qkv(T=6)
    return [large, [-100 * (1 + 0.1 * q), 100 * (1 + 0.1 * k), v]]


def _judge_extreme(runs, outs):
    whats = ("large scores", "scores that are all far below zero")
    for qkv, what, out in zip(runs, whats, outs, strict=True):
        _judge_values(qkv, out, f"the output for {what}")


@probe_check(
    "gqa_attention",
    "large scores (up to about 1500) and scores all far below zero (about -2e4) stay "
    "finite and right",
    1,
    "softmax(-1) subtracts each row's maximum before exp (exp(89) is inf in float32, "
    "exp(-2e4) is 0 and 0 / 0 NaN); mask with -inf, not with a large negative number "
    "such as -1e4, which beats the scores below it",
    inputs=_extreme_qkv,
    judge=_judge_extreme,
)
def _(fn, runs):
    return [fn(*qkv) for qkv in runs]


def _judge_attention_grads(inputs, out):
    same_qkv_grads(out, _reference, inputs)


@probe_check(
    "gqa_attention",
    "gradients for q, k and v equal SDPA's",
    1,
    "use differentiable operations; masked_fill returns a new tensor, keep it",
    inputs=lambda: {"qkv": _qkv(), "up": torch.randn(2, 6, 5, 4)},
    judge=_judge_attention_grads,
)
def _(fn, inputs):
    return qkv_grads(fn, inputs)


@probe_check(
    "gqa_attention",
    "written by hand: no F.scaled_dot_product_attention",
    1,
    "the task is the attention itself: scores = q @ k^T / sqrt(D), mask, softmax, @ v",
    inputs=_qkv,
    judge=_judge_values,
)
def _(fn, qkv):
    return without(lambda: fn(*qkv), SDPA)
