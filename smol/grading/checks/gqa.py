"""03 Grouped-query attention: repeat_kv, causal GQA attention, and a repeat_kv that
tiles."""

import torch
import torch.nn.functional as F

from smol.attention import repeat_kv as reference_repeat_kv
from smol.grading.checks._util import close, grad_of, same_shape, without
from smol.grading.core import check, task

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


@check(
    BOTH,
    "shape (B, H_kv * n_rep, T, D) on odd sizes, in the input's dtype",
    1,
    "the head dimension (dim 1) grows n_rep times; B, T and D stay; build the result "
    "from x itself (a new torch.empty is float32 for bfloat16 keys)",
)
def _(fn):
    x = torch.randn(1, 3, 7, 5)
    same_shape(fn(x, 3), (1, 9, 7, 5), "repeat_kv of (1, 3, 7, 5) with n_rep=3")
    out = same_shape(fn(x.bfloat16(), 3), (1, 9, 7, 5), "repeat_kv of bfloat16 keys")
    assert out.dtype == torch.bfloat16, f"bfloat16 in, {out.dtype} out"


@check(
    BOTH,
    "query head h reads key/value head h // n_rep (k0 k0 k1 k1, not k0 k1 k0 k1)",
    2,
    "repeat each head in place (repeat_interleave on dim 1, or einops "
    "'b h t d -> b (h r) t d'), not tile the whole stack (x.repeat(1, n_rep, 1, 1))",
)
def _(fn):
    x = torch.randn(2, 3, 5, 4)
    close(fn(x, 2), reference_repeat_kv(x, 2), "repeat_kv(x, 2)")


@check(
    BOTH,
    "n_rep = 1 returns the input's values",
    1,
    "with one query head per key/value head there is nothing to repeat",
)
def _(fn):
    x = torch.randn(2, 4, 3, 6)
    close(fn(x, 1), x, "repeat_kv(x, 1)")


@check(
    BOTH,
    "one key/value head (multi-query attention) serves every query head",
    1,
    "H_kv = 1 repeated n_rep times gives n_rep identical heads",
)
def _(fn):
    x = torch.randn(2, 1, 4, 6)
    close(fn(x, 4), x.expand(2, 4, 4, 6), "repeat_kv of one head, n_rep=4")


@check(
    BOTH,
    "gradients: each key/value head collects the gradients of its n_rep copies",
    1,
    "use differentiable operations (expand + reshape, repeat_interleave, "
    "einops.repeat)",
)
def _(fn):
    x = torch.randn(2, 3, 4, 5)
    out, (gx,), _ = grad_of(lambda t: fn(t, 2), x, upstream=torch.ones(2, 6, 4, 5))
    close(gx, torch.full_like(x, 2.0), "the gradient of sum(repeat_kv(x, 2))")


def _reference(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def _qkv(B=2, H=6, H_kv=2, T=5, D=4):
    return (
        torch.randn(B, H, T, D),
        torch.randn(B, H_kv, T, D),
        torch.randn(B, H_kv, T, D),
    )


@check(
    "gqa_attention",
    "shape: (B, H, T, D), one output per query head; bfloat16 in, bfloat16 out",
    1,
    "repeat k and v to H heads first, then (q @ k^T / sqrt(D)).softmax(-1) @ v; a "
    "softmax in float32 is cast back to q's dtype",
)
def _(fn):
    q, k, v = _qkv(T=7)
    same_shape(fn(q, k, v), q.shape, "gqa_attention(q, k, v)")
    out = same_shape(fn(q.bfloat16(), k.bfloat16(), v.bfloat16()), q.shape)
    assert out.dtype == torch.bfloat16, f"bfloat16 in, {out.dtype} out"


@check(
    "gqa_attention",
    "values equal SDPA (causal, grouped query heads, head size 6)",
    2,
    "scale the scores by 1/sqrt(head_dim) (math.sqrt, not an integer root), mask the "
    "future with -inf before the softmax",
)
def _(fn):
    q, k, v = _qkv(D=6)  # sqrt(6) is no integer, unlike sqrt(4)
    close(fn(q, k, v), _reference(q, k, v), "gqa_attention(q, k, v)", atol=1e-5)


@check(
    "gqa_attention",
    "causal: changing future tokens leaves earlier outputs unchanged",
    1,
    "mask scores[..., i, j] for j > i (torch.ones(T, T).tril() marks what may be seen)",
)
def _(fn):
    q, k, v = _qkv(T=6)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 4:], v2[:, :, 4:] = torch.randn(2, 2, 2, 4), torch.randn(2, 2, 2, 4)
    close(fn(q, k2, v2)[:, :, :4], fn(q, k, v)[:, :, :4], "outputs before position 4")


@check(
    "gqa_attention",
    "plain multi-head attention (n_rep = 1) too",
    1,
    "n_rep = H // H_kv may be 1",
)
def _(fn):
    q, k, v = _qkv(H=3, H_kv=3)
    close(fn(q, k, v), _reference(q, k, v), "gqa_attention with H_kv = H", atol=1e-5)


@check(
    "gqa_attention",
    "gradients for q, k and v equal SDPA's",
    1,
    "use differentiable operations; masked_fill returns a new tensor, keep it",
)
def _(fn):
    q, k, v = _qkv()
    _, grads, up = grad_of(fn, q, k, v)
    _, ref_grads, _ = grad_of(_reference, q, k, v, upstream=up)
    for name, g, r in zip("qkv", grads, ref_grads):
        close(g, r, f"the gradient of {name}", atol=1e-4)


@check(
    "gqa_attention",
    "written by hand: no F.scaled_dot_product_attention",
    1,
    "the task is the attention itself: scores = q @ k^T / sqrt(D), mask, softmax, @ v",
)
def _(fn):
    q, k, v = _qkv()
    out = without(
        lambda: fn(q, k, v),
        {F.scaled_dot_product_attention: "F.scaled_dot_product_attention"},
    )
    close(out, _reference(q, k, v), "gqa_attention(q, k, v)", atol=1e-5)
