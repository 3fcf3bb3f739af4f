"""02 RoPE: frequencies, cos/sin tables, rotate_half, apply_rope, and a rope in the
wrong convention."""

import torch

from smol.grading.checks._util import close, is_tensor, pair, same_shape
from smol.grading.core import check, task
from smol.rope import (
    RotaryEmbedding,
    apply_rope as reference_apply_rope,
    rotate_half as reference_rotate_half,
)

task(
    "rope_frequencies",
    "rope",
    "rope_frequencies(head_dim, theta): one frequency per pair of features",
)
task(
    "rope_tables",
    "rope",
    "rope_tables(length, head_dim, theta): the cos and sin tables",
)
task("rotate_half", "rope", "rotate_half(x): (x1, x2) -> (-x2, x1)")
task("rope", "rope", "apply_rope(x, cos, sin): rotate queries or keys")
task("rope_bug", "rope", "Find the bug: a rope that runs, rotates, and is still wrong")


@check(
    "rope_frequencies",
    "shape (head_dim / 2,) in float32",
    1,
    "one frequency per pair: torch.arange(0, head_dim, 2) has head_dim / 2 entries; "
    "keep float32",
)
def _(fn):
    out = same_shape(fn(64, 10000.0), (32,), "rope_frequencies(64, 1e4)")
    assert out.dtype == torch.float32, f"dtype {out.dtype}, expected torch.float32"


@check(
    "rope_frequencies",
    "values: theta ** (-2i / head_dim)",
    2,
    "1 / theta ** (arange(0, head_dim, 2) / head_dim): the first pair turns fastest "
    "(frequency 1)",
)
def _(fn):
    for head_dim, theta in [(64, 100000.0), (6, 10.0)]:
        close(
            fn(head_dim, theta),
            RotaryEmbedding(head_dim, theta, 8).inv_freq(),
            f"rope_frequencies({head_dim}, {theta:g})",
            rtol=1e-5,
            atol=1e-7,
        )


def _ref_tables(length, head_dim, theta):
    rope = RotaryEmbedding(head_dim, theta, max(length, 2))
    return rope(length, torch.device("cpu"))


def _tables(fn, length, head_dim, theta):
    """(cos, sin), as the student's rope_tables returns them."""
    return pair(fn(length, head_dim, theta), "rope_tables should return (cos, sin)")


@check(
    "rope_tables",
    "returns (cos, sin), each (length, head_dim) float32",
    1,
    "angles = outer(positions, frequencies) is (length, head_dim/2); concatenate it "
    "with itself",
)
def _(fn):
    cos, sin = _tables(fn, 7, 8, 10000.0)
    same_shape(cos, (7, 8), "cos", torch.float32)
    same_shape(sin, (7, 8), "sin", torch.float32)


@check(
    "rope_tables",
    "values equal smol's RotaryEmbedding (the same angle for features i and i + D/2, "
    "theta used)",
    2,
    "angles = outer(positions, rope_frequencies(head_dim, theta)), then cat((angles, "
    "angles), dim=-1), not repeat_interleave: feature i pairs with feature i + "
    "head_dim/2",
)
def _(fn):
    # theta matters only past position 0, so every theta is tried on several positions
    for length, head_dim, theta in [(7, 8, 500.0), (5, 6, 100000.0), (1, 4, 500.0)]:
        cos, sin = _tables(fn, length, head_dim, theta)
        ref_cos, ref_sin = _ref_tables(length, head_dim, theta)
        close(cos, ref_cos, f"cos for length {length}", atol=1e-5)
        close(sin, ref_sin, f"sin for length {length}", atol=1e-5)


@check(
    "rotate_half",
    "values: (x1, x2) -> (-x2, x1) on the halves of the last dimension",
    2,
    "split the last dimension in two halves (x.chunk(2, dim=-1)); the output's first "
    "half is minus x's second half",
)
def _(fn):
    x = torch.randn(2, 3, 5, 8)
    close(fn(x), reference_rotate_half(x), "rotate_half(x)")


@check(
    "rotate_half",
    "any leading shape; twice gives -x",
    1,
    "split only the last dimension; rotating by 90 degrees twice is a half turn",
)
def _(fn):
    x = torch.randn(4, 6)
    close(fn(fn(x)), -x, "rotate_half(rotate_half(x))")


BOTH = ("rope", "rope_bug")


def _inputs(B=2, H=3, T=5, D=8, theta=100.0):
    cos, sin = _ref_tables(T, D, theta)
    return torch.randn(B, H, T, D), cos, sin


@check(
    BOTH,
    "shape and dtype: a bfloat16 x with float32 tables gives bfloat16",
    1,
    "compute in float32 (the tables' dtype), then cast back with .to(x.dtype)",
)
def _(fn):
    x, cos, sin = _inputs()
    out = same_shape(fn(x.to(torch.bfloat16), cos, sin), x.shape)
    assert out.dtype == torch.bfloat16, f"bfloat16 in, {out.dtype} out"


@check(
    BOTH,
    "position 0 is not rotated",
    1,
    "angle 0: cos = 1 and sin = 0, so x * cos + rotate_half(x) * sin is x",
)
def _(fn):
    x, cos, sin = _inputs()
    close(fn(x, cos, sin)[:, :, 0], x[:, :, 0], "the rotated vector at position 0")


@check(
    BOTH,
    "a rotation: every vector keeps its length",
    1,
    "each pair of features is rotated, never scaled: use cos and sin of the same angle",
)
def _(fn):
    x, cos, sin = _inputs(T=9)
    close(
        fn(x, cos, sin).norm(dim=-1), x.norm(dim=-1), "the norms after rope", atol=1e-4
    )


@check(
    BOTH,
    "relative: q . k depends only on the distance between their positions",
    1,
    "rotate q and k with the tables of their own positions; the dot product then sees "
    "only m - n",
)
def _(fn):
    D = 8
    cos, sin = _ref_tables(12, D, 100.0)
    q, k = torch.randn(1, 1, 1, D), torch.randn(1, 1, 1, D)

    def score(m, n):
        qm = fn(q, cos[m : m + 1], sin[m : m + 1])
        kn = fn(k, cos[n : n + 1], sin[n : n + 1])
        return (qm * kn).sum()

    for (m, n), shift in [((2, 0), 5), ((7, 3), 4)]:
        close(
            score(m + shift, n + shift).reshape(1),
            score(m, n).reshape(1),
            f"q.k at positions ({m + shift}, {n + shift}) vs ({m}, {n})",
            atol=1e-4,
        )


@check(
    BOTH,
    "gathered tables (B, 1, T, D) from position_ids work like sliced ones",
    1,
    "rely on broadcasting: the same code serves cos (T, D) and cos (B, 1, T, D)",
)
def _(fn):
    x, _, _ = _inputs(T=4)
    cos, sin = _ref_tables(16, 8, 100.0)
    pos = torch.arange(3, 7).expand(2, 4)
    gathered = fn(x, cos[pos].unsqueeze(1), sin[pos].unsqueeze(1))
    close(gathered, fn(x, cos[3:7], sin[3:7]), "rope with gathered tables")


@check(
    BOTH,
    "rotates feature i with feature i + D/2 (the split-halves convention of smol and "
    "HF)",
    2,
    "pairs are (x[i], x[i + D/2]), not neighbours (x[2i], x[2i+1]): x * cos + "
    "rotate_half(x) * sin",
)
def _(fn):
    x, cos, sin = _inputs(T=7)
    close(
        fn(x, cos, sin),
        reference_apply_rope(x, cos, sin),
        "apply_rope(x, cos, sin)",
        atol=1e-5,
    )


@check(
    BOTH,
    "gradients flow: the gradient of |rope(x)|^2 is 2x",
    1,
    "use differentiable torch operations (no .detach(), no in-place writes into x)",
)
def _(fn):
    x, cos, sin = _inputs()
    leaf = x.clone().requires_grad_(True)
    y = fn(leaf, cos, sin)
    is_tensor(y)
    y.pow(2).sum().backward()
    assert leaf.grad is not None, "no gradient reached x"
    close(leaf.grad, 2 * x, "the gradient", atol=1e-4)
