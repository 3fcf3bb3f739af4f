"""11 Attention by tiles: the online softmax's merge of two blocks' statistics,
attention computed block by block of keys as FlashAttention does (checked against
F.scaled_dot_product_attention on a CPU), and a tiled attention that forgets to rescale
what it has summed so far."""

import math

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from smol.grading.checks._util import (
    SDPA,
    close,
    float32_and_bfloat16,
    in_float32_and_bfloat16,
    is_tensor,
    pair,
    qkv_grads,
    rounded_once,
    same_qkv_grads,
    same_shape,
    untouched,
    without,
)
from smol.grading.registry import probe_check, task

task(
    "merge_stats",
    "tiled_attention",
    "merge_stats(m_a, l_a, m_b, l_b): the online softmax's running max and sum",
)
task(
    "tiled_attention",
    "tiled_attention",
    "tiled_attention(q, k, v, block_size, is_causal): attention by blocks of keys",
)
task(
    "tiled_attention_bug",
    "tiled_attention",
    "Find the bug: a tiled attention that is right only while the keys fit one block",
)


def _stats(x):
    """(max, sum of exp(x - max)) over the last axis."""
    m = x.amax(-1)
    return m, (x - m[..., None]).exp().sum(-1)


def _blocks(a, b):
    """Two blocks of scores and the statistics merge_stats takes of them."""
    return {"a": a, "b": b, "args": [*_stats(a), *_stats(b)]}


def _merged(out, a):
    """Judge side: merge_stats' (m, l), each of the blocks' leading shape."""
    m, l = pair(out, "return (m, l)")
    return same_shape(m, a.shape[:-1], "m"), same_shape(l, a.shape[:-1], "l")


def _judge_merged(inputs, out):
    a, b = inputs["a"], inputs["b"]
    m, l = _merged(out, a)
    want_m, want_l = _stats(torch.cat((a, b), -1))
    close(m, want_m, "m")
    close(l, want_l, "l")


@probe_check(
    "merge_stats",
    "m is the larger maximum, l the sum of exp(x - m) over both blocks",
    2,
    "m = max(m_a, m_b); each sum was taken against its own maximum: l_a * exp(m_a - "
    "m) + l_b * exp(m_b - m)",
    inputs=lambda: _blocks(torch.randn(2, 3, 5, 4) * 3, torch.randn(2, 3, 5, 7) * 3),
    judge=_judge_merged,
)
def _(fn, inputs):
    return fn(*inputs["args"])


def _judge_large_stats(inputs, out):
    a, b = inputs["a"], inputs["b"]
    m, l = _merged(out, a)
    want_m, want_l = _stats(torch.cat((a, b), -1))
    close(m, want_m, "m for scores near 1000")
    # float32 holds 1000 to within 6e-5: a sum kept as a log beside m is that close
    close(l, want_l, "l for scores near 1000", atol=0, rtol=5e-4)


@probe_check(
    "merge_stats",
    "large scores (around 1000) stay finite",
    1,
    "never exp a score itself (exp(1000) is inf in float32): only differences to the "
    "maximum, which are <= 0",
    inputs=lambda: _blocks(torch.randn(4, 6) + 1000, torch.randn(4, 3) + 1003),
    judge=_judge_large_stats,
)
def _(fn, inputs):
    return fn(*inputs["args"])


def _hidden_inputs():
    ninf, zero = torch.full((3,), -math.inf), torch.zeros(3)
    m_a, l_a = _stats(torch.randn(3, 4))
    return [[m_a, l_a, ninf, zero], [ninf, zero, m_a, l_a], [ninf, zero, ninf, zero]]


def _judge_hidden(cases, outs):
    whats = (
        "a block merged with a hidden one",
        "a hidden block merged with a block",
        "two hidden blocks",
    )
    for (m_a, l_a, m_b, l_b), what, out in zip(cases, whats, outs, strict=True):
        # the visible block's statistics, or (-inf, 0) when neither is visible
        want = (m_a, l_a) if torch.isfinite(m_a).all() else (m_b, l_b)
        m, l = pair(out, "return (m, l)")
        close(m, want[0], f"m of {what}")
        close(l, want[1], f"l of {what}")


@probe_check(
    "merge_stats",
    "a block with nothing visible (m = -inf, l = 0) changes nothing; two give "
    "(-inf, 0)",
    1,
    "exp(-inf - (-inf)) is NaN: where m is -inf, use 0 (or m_a where m_b is -inf) for "
    "the difference",
    inputs=_hidden_inputs,
    judge=_judge_hidden,
)
def _(fn, cases):
    return [fn(*args) for args in cases]


STATS = ("m_a", "l_a", "m_b", "l_b")


def _judge_kept(inputs, out):
    assert isinstance(out, list) and len(out) == 4, "four inputs"
    for name, after, before in zip(STATS, out, inputs["args"]):
        untouched(after, before, what=name)


@probe_check(
    "merge_stats",
    "m_a, l_a, m_b and l_b are left unchanged",
    1,
    "return new tensors (l_a * torch.exp(...) + ...): l_a *= ... or l_a.mul_(...) "
    "writes into the caller's running sum",
    inputs=lambda: _blocks(torch.randn(3, 5, 4) * 3, torch.randn(3, 5, 6) * 3),
    judge=_judge_kept,
)
def _(fn, inputs):
    fn(*inputs["args"])
    return inputs["args"]


def _reference(q, k, v, is_causal=False):
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)


def _qkv(Tq=24, Tk=24, B=1, H=2, D=8, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randn(B, H, Tq, D, generator=g) * scale,
        torch.randn(B, H, Tk, D, generator=g) * scale,
        torch.randn(B, H, Tk, D, generator=g),
    ]


BOTH = ("tiled_attention", "tiled_attention_bug")


def _judge_shape(qkv, out):
    what = "tiled_attention(q, k, v, 4)"
    float32_and_bfloat16(out, qkv[0].shape, what, "the bfloat16 output")


@probe_check(
    BOTH,
    "shape (B, H, Tq, D); bfloat16 in, bfloat16 out",
    1,
    "accumulate in float32, then return acc.to(q.dtype)",
    inputs=lambda: _qkv(Tq=10, Tk=13),
    judge=_judge_shape,
)
def _(fn, qkv):
    return in_float32_and_bfloat16(lambda q, k, v: fn(q, k, v, 4), *qkv)


@probe_check(
    BOTH,
    "one block (block_size >= Tk) equals SDPA",
    1,
    "scores = q @ k_block^T / sqrt(D); with one block the online softmax is the plain "
    "softmax",
    inputs=lambda: _qkv(Tq=9, Tk=11),
    judge=lambda qkv, out: close(
        out, _reference(*qkv), "one block of 16 keys", atol=1e-5
    ),
)
def _(fn, qkv):
    return fn(*qkv, 16)


def _blocked_check(task_names, name, points, hint, runs, is_causal, what):
    """A check that tiled attention equals SDPA for each (Tq, Tk, block_size) of
    `runs`, on inputs seeded by Tk; `what` names a run in a message."""

    def judge(inputs, outs):
        for (Tq, Tk, block), qkv, out in zip(runs, inputs, outs, strict=True):
            close(
                out,
                _reference(*qkv, is_causal),
                what.format(Tq=Tq, Tk=Tk, block=block),
                atol=1e-5,
            )

    probe_check(
        task_names,
        name,
        points,
        hint,
        inputs=lambda: [_qkv(Tq=Tq, Tk=Tk, seed=Tk) for Tq, Tk, _ in runs],
        judge=judge,
    )(
        lambda fn, inputs: [
            fn(*qkv, block, is_causal) for (_, _, block), qkv in zip(runs, inputs)
        ]
    )


_blocked_check(
    BOTH,
    "many blocks equal SDPA (Tk not a multiple of block_size, Tq != Tk)",
    2,
    "when a block raises the running max from m to m_new, everything summed so far, l "
    "and the output, is multiplied by exp(m - m_new)",
    ((7, 23, 5), (24, 24, 8), (5, 9, 1)),
    False,
    "the output for Tq={Tq}, Tk={Tk} in blocks of {block}",
)


class _Largest(TorchFunctionMode):
    """The largest number of elements any tensor made by a torch function inside
    holds."""

    def __init__(self):
        super().__init__()
        self.largest, self.shape = 0, ()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.numel() > self.largest:
                self.largest, self.shape = t.numel(), tuple(t.shape)
        return out


def _judge_small(qkv, out):
    for result in out["outs"]:
        same_shape(result, qkv[0].shape, "the output")
    largest, shape = out["largest"], tuple(out["shape"])
    assert largest < 64 * 64, (
        f"a tensor of shape {shape} holds {largest} numbers, as many as all "
        f"64 x 64 scores"
    )


@probe_check(
    BOTH,
    "never holds a Tq x Tk matrix (scores, probabilities or mask), nor calls SDPA",
    1,
    "work on one block of keys at a time: scores (B, H, Tq, block_size); build each "
    "block's causal mask from positions, not from a (Tq, Tk) matrix",
    inputs=lambda: _qkv(Tq=64, Tk=64, B=1, H=1),
    judge=_judge_small,
)
def _(fn, qkv):
    spy = _Largest()
    outs = []
    for is_causal in (False, True):
        with spy:
            outs.append(without(lambda c=is_causal: fn(*qkv, 16, c), SDPA))
    return {"outs": outs, "largest": spy.largest, "shape": list(spy.shape)}


_blocked_check(
    "tiled_attention",
    "causal (is_causal=True) equals SDPA, blocks wholly in the future included, and "
    "Tq != Tk",
    1,
    "hide key j from query i when j > i (scores.masked_fill with -inf), whatever Tk "
    "is: SDPA aligns the mask to the top left, not to the last key; a query that sees "
    "nothing in a block must not turn into NaN",
    ((23, 23, 5), (16, 16, 16), (9, 9, 2), (5, 9, 2), (9, 5, 3)),
    True,
    "the causal output for Tq={Tq}, Tk={Tk} in blocks of {block}",
)


def _negative_qkv():
    """q and k pointing opposite ways: every score about -280 (spread about 14), so
    that exp(score - 0) underflows to 0 in float32."""
    q, k, v = _qkv(Tq=12, Tk=20, seed=1)
    return [-10 * (1 + 0.1 * q), 10 * (1 + 0.1 * k), v]


def _judge_extreme(runs, outs):
    whats = ("large scores", "scores that are all negative")
    for qkv, what, out in zip(runs, whats, outs, strict=True):
        close(out, _reference(*qkv), f"the output for {what}", atol=1e-4)


@probe_check(
    "tiled_attention",
    "large scores (q . k / sqrt(D) up to about 1000) stay finite and right, and so do "
    "scores that are all negative",
    1,
    "subtract the running maximum before exp, as merge_stats does, and start it at "
    "-inf (a start at 0 underflows every exp of a row whose scores are all below -100)",
    inputs=lambda: [_qkv(Tq=12, Tk=20, scale=20.0), _negative_qkv()],
    judge=_judge_extreme,
)
def _(fn, runs):
    return [fn(*qkv, 6) for qkv in runs]


def _judge_bfloat16(qkv, out):
    want = _reference(*(t.float() for t in qkv)).bfloat16()
    # the dtype is the shape check's: a float32 output is rounded here
    rounded_once(is_tensor(out).bfloat16(), want, "the bfloat16 output")


@probe_check(
    "tiled_attention",
    "bfloat16 q, k and v (256 keys in blocks of 32) give SDPA's float32 output, "
    "rounded once",
    1,
    "upcast each block with .float() and keep m, l and the output's sum in float32 "
    "(torch.zeros gives float32): in bfloat16 a sum of 256 terms keeps 3 digits; cast "
    "with .to(q.dtype) once, at the end",
    inputs=lambda: [t.bfloat16() for t in _qkv(Tq=256, Tk=256)],
    judge=_judge_bfloat16,
)
def _(fn, qkv):
    return fn(*qkv, 32)


def _judge_grads(inputs, out):
    same_qkv_grads(out, lambda q, k, v: _reference(q, k, v, True), inputs)


@probe_check(
    "tiled_attention",
    "gradients for q, k and v equal SDPA's",
    1,
    "differentiable operations only: acc = acc * c + p @ v_block builds new tensors, "
    "acc *= c writes in place and breaks the backward pass",
    inputs=lambda: {"qkv": _qkv(Tq=14, Tk=14), "up": torch.randn(1, 2, 14, 8)},
    judge=_judge_grads,
)
def _(fn, inputs):
    return qkv_grads(lambda q, k, v: fn(q, k, v, 4, True), inputs)
