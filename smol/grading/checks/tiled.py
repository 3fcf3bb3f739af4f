"""11 Attention by tiles: the online softmax's merge of two blocks' statistics,
attention computed block by block of keys as FlashAttention does (checked against
F.scaled_dot_product_attention on a CPU), and a tiled attention that forgets to rescale
what it has summed so far."""

import math

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from smol.grading.checks._util import close, grad_of, pair, same_shape, without
from smol.grading.core import check, task

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


def _merged(fn, a, b):
    out = pair(fn(*_stats(a), *_stats(b)), "return (m, l)")
    m, l = out
    return same_shape(m, a.shape[:-1], "m"), same_shape(l, a.shape[:-1], "l")


@check(
    "merge_stats",
    "m is the larger maximum, l the sum of exp(x - m) over both blocks",
    2,
    "m = max(m_a, m_b); each sum was taken against its own maximum: l_a * exp(m_a - "
    "m) + l_b * exp(m_b - m)",
)
def _(fn):
    a, b = torch.randn(2, 3, 5, 4) * 3, torch.randn(2, 3, 5, 7) * 3
    m, l = _merged(fn, a, b)
    want_m, want_l = _stats(torch.cat((a, b), -1))
    close(m, want_m, "m")
    close(l, want_l, "l")


@check(
    "merge_stats",
    "large scores (around 1000) stay finite",
    1,
    "never exp a score itself (exp(1000) is inf in float32): only differences to the "
    "maximum, which are <= 0",
)
def _(fn):
    a, b = torch.randn(4, 6) + 1000, torch.randn(4, 3) + 1003
    m, l = _merged(fn, a, b)
    want_m, want_l = _stats(torch.cat((a, b), -1))
    close(m, want_m, "m for scores near 1000")
    # float32 holds 1000 to within 6e-5: a sum kept as a log beside m is that close
    close(l, want_l, "l for scores near 1000", atol=0, rtol=5e-4)


@check(
    "merge_stats",
    "a block with nothing visible (m = -inf, l = 0) changes nothing; two give "
    "(-inf, 0)",
    1,
    "exp(-inf - (-inf)) is NaN: where m is -inf, use 0 (or m_a where m_b is -inf) for "
    "the difference",
)
def _(fn):
    ninf, zero = torch.full((3,), -math.inf), torch.zeros(3)
    m_a, l_a = _stats(torch.randn(3, 4))
    for args, want, what in (
        ((m_a, l_a, ninf, zero), (m_a, l_a), "a block merged with a hidden one"),
        ((ninf, zero, m_a, l_a), (m_a, l_a), "a hidden block merged with a block"),
        ((ninf, zero, ninf, zero), (ninf, zero), "two hidden blocks"),
    ):
        m, l = pair(fn(*args), "return (m, l)")
        close(m, want[0], f"m of {what}")
        close(l, want[1], f"l of {what}")


def _reference(q, k, v, is_causal=False):
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)


def _qkv(Tq=24, Tk=24, B=1, H=2, D=8, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(B, H, Tq, D, generator=g) * scale,
        torch.randn(B, H, Tk, D, generator=g) * scale,
        torch.randn(B, H, Tk, D, generator=g),
    )


BOTH = ("tiled_attention", "tiled_attention_bug")


@check(
    BOTH,
    "shape (B, H, Tq, D); bfloat16 in, bfloat16 out",
    1,
    "accumulate in float32 if you like, then return acc.to(q.dtype)",
)
def _(fn):
    q, k, v = _qkv(Tq=10, Tk=13)
    same_shape(fn(q, k, v, 4), q.shape, "tiled_attention(q, k, v, 4)")
    out = fn(q.bfloat16(), k.bfloat16(), v.bfloat16(), 4)
    same_shape(out, q.shape, "the bfloat16 output")
    assert out.dtype == torch.bfloat16, f"bfloat16 in, {out.dtype} out"


@check(
    BOTH,
    "one block (block_size >= Tk) equals SDPA",
    1,
    "scores = q @ k_block^T / sqrt(D); with one block the online softmax is the plain "
    "softmax",
)
def _(fn):
    q, k, v = _qkv(Tq=9, Tk=11)
    close(fn(q, k, v, 16), _reference(q, k, v), "one block of 16 keys", atol=1e-5)


@check(
    BOTH,
    "many blocks equal SDPA (Tk not a multiple of block_size, Tq != Tk)",
    2,
    "when a block raises the running max from m to m_new, everything summed so far, l "
    "and the output, is multiplied by exp(m - m_new)",
)
def _(fn):
    for Tq, Tk, block in ((7, 23, 5), (24, 24, 8), (5, 9, 1)):
        q, k, v = _qkv(Tq=Tq, Tk=Tk, seed=Tk)
        close(
            fn(q, k, v, block),
            _reference(q, k, v),
            f"the output for Tq={Tq}, Tk={Tk} in blocks of {block}",
            atol=1e-5,
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


@check(
    BOTH,
    "never holds a Tq x Tk matrix (scores, probabilities or mask), nor calls SDPA",
    1,
    "work on one block of keys at a time: scores (B, H, Tq, block_size); build each "
    "block's causal mask from positions, not from a (Tq, Tk) matrix",
)
def _(fn):
    q, k, v = _qkv(Tq=64, Tk=64, B=1, H=1)
    spy = _Largest()
    sdpa = {F.scaled_dot_product_attention: "F.scaled_dot_product_attention"}
    for is_causal in (False, True):
        with spy:
            out = without(lambda: fn(q, k, v, 16, is_causal), sdpa)
        same_shape(out, q.shape, "the output")
    assert spy.largest < 64 * 64, (
        f"a tensor of shape {spy.shape} holds {spy.largest} numbers, as many as all "
        f"64 x 64 scores"
    )


@check(
    "tiled_attention",
    "causal (is_causal=True) equals SDPA, blocks wholly in the future included",
    1,
    "hide key j from query i when j > i (scores.masked_fill with -inf); a query that "
    "sees nothing in a block must not turn into NaN",
)
def _(fn):
    for T, block in ((23, 5), (16, 16), (9, 2)):
        q, k, v = _qkv(Tq=T, Tk=T, seed=T)
        close(
            fn(q, k, v, block, True),
            _reference(q, k, v, True),
            f"the causal output for T={T} in blocks of {block}",
            atol=1e-5,
        )


@check(
    "tiled_attention",
    "large scores (q . k / sqrt(D) up to about 1000) stay finite and right",
    1,
    "subtract the running maximum before exp, as merge_stats does",
)
def _(fn):
    q, k, v = _qkv(Tq=12, Tk=20, scale=20.0)
    close(fn(q, k, v, 6), _reference(q, k, v), "the output for large scores", atol=1e-4)


@check(
    "tiled_attention",
    "gradients for q, k and v equal SDPA's",
    1,
    "differentiable operations only: acc = acc * c + p @ v_block builds new tensors, "
    "acc *= c writes in place and breaks the backward pass",
)
def _(fn):
    q, k, v = _qkv(Tq=14, Tk=14)
    _, grads, up = grad_of(lambda a, b, c: fn(a, b, c, 4, True), q, k, v)
    _, ref_grads, _ = grad_of(
        lambda a, b, c: _reference(a, b, c, True), q, k, v, upstream=up
    )
    for name, g, r in zip("qkv", grads, ref_grads):
        close(g, r, f"the gradient of {name}", atol=1e-4)
