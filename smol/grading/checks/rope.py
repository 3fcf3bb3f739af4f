"""02 RoPE: frequencies, cos/sin tables, rotate_half, apply_rope, and a rope in the
wrong convention."""

import torch

from smol.grading.checks._util import (
    bfloat16_out,
    close,
    is_tensor,
    pair,
    rounded_once,
    same_pair,
    same_shape,
    untouched,
)
from smol.grading.registry import probe_check, task
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


def _judge_frequency_shape(inputs, out):
    same_shape(out, (32,), "rope_frequencies(64, 1e4)")
    assert out.dtype == torch.float32, f"dtype {out.dtype}, expected torch.float32"


@probe_check(
    "rope_frequencies",
    "shape (head_dim / 2,) in float32",
    1,
    "one frequency per pair: torch.arange(0, head_dim, 2) has head_dim / 2 entries; "
    "keep float32",
    judge=_judge_frequency_shape,
)
def _(fn, _):
    return fn(64, 10000.0)


FREQUENCIES = [(64, 100000.0), (6, 10.0)]


def _judge_frequencies(inputs, outs):
    for (head_dim, theta), out in zip(FREQUENCIES, outs, strict=True):
        close(
            out,
            RotaryEmbedding(head_dim, theta, 8).inv_freq(),
            f"rope_frequencies({head_dim}, {theta:g})",
            rtol=1e-5,
            atol=1e-7,
        )


@probe_check(
    "rope_frequencies",
    "values: theta ** (-2i / head_dim)",
    2,
    "1 / theta ** (arange(0, head_dim, 2) / head_dim): the first pair turns fastest "
    "(frequency 1)",
    judge=_judge_frequencies,
)
def _(fn, _):
    return [fn(head_dim, theta) for head_dim, theta in FREQUENCIES]


def _ref_tables(length, head_dim, theta):
    rope = RotaryEmbedding(head_dim, theta, max(length, 2))
    return rope(length, torch.device("cpu"))


def _tables(out):
    """(cos, sin), as the student's rope_tables returns them."""
    return pair(out, "rope_tables should return (cos, sin)")


def _judge_table_shapes(inputs, out):
    message = "rope_tables should return (cos, sin)"
    same_pair(out, message, ("cos", "sin"), (7, 8), torch.float32)


@probe_check(
    "rope_tables",
    "returns (cos, sin), each (length, head_dim) float32",
    1,
    "angles = outer(positions, frequencies) is (length, head_dim/2); concatenate it "
    "with itself",
    judge=_judge_table_shapes,
)
def _(fn, _):
    return _tables(fn(7, 8, 10000.0))


# theta matters only past position 0, so every theta is tried on several positions
TABLES = [(7, 8, 500.0), (5, 6, 100000.0), (1, 4, 500.0)]


def _judge_tables(inputs, outs):
    for (length, head_dim, theta), out in zip(TABLES, outs, strict=True):
        cos, sin = _tables(out)
        ref_cos, ref_sin = _ref_tables(length, head_dim, theta)
        close(cos, ref_cos, f"cos for length {length}", atol=1e-5)
        close(sin, ref_sin, f"sin for length {length}", atol=1e-5)


@probe_check(
    "rope_tables",
    "values equal smol's RotaryEmbedding (the same angle for features i and i + D/2, "
    "theta used)",
    2,
    "angles = outer(positions, rope_frequencies(head_dim, theta)), then cat((angles, "
    "angles), dim=-1), not repeat_interleave: feature i pairs with feature i + "
    "head_dim/2",
    judge=_judge_tables,
)
def _(fn, _):
    return [_tables(fn(*case)) for case in TABLES]


@probe_check(
    "rotate_half",
    "values: (x1, x2) -> (-x2, x1) on the halves of the last dimension",
    2,
    "split the last dimension in two halves (x.chunk(2, dim=-1)); the output's first "
    "half is minus x's second half",
    inputs=lambda: torch.randn(2, 3, 5, 8),
    judge=lambda x, out: close(out, reference_rotate_half(x), "rotate_half(x)"),
)
def _(fn, x):
    return fn(x)


@probe_check(
    "rotate_half",
    "any leading shape; twice gives -x",
    1,
    "split only the last dimension; rotating by 90 degrees twice is a half turn",
    inputs=lambda: torch.randn(4, 6),
    judge=lambda x, out: close(out, -x, "rotate_half(rotate_half(x))"),
)
def _(fn, x):
    return fn(fn(x))


@probe_check(
    "rotate_half",
    "x is left unchanged",
    1,
    "build the result as a new tensor (torch.cat((-x2, x1), dim=-1)): writing into "
    "x's halves changes the caller's queries and keys, and autograd's backward through "
    "apply_rope needs them",
    inputs=lambda: torch.randn(2, 3, 5, 8),
    judge=lambda x, after: untouched(after, x, what="x"),
)
def _(fn, x):
    fn(x)
    return x


BOTH = ("rope", "rope_bug")


def _inputs(B=2, H=3, T=5, D=8, theta=100.0):
    cos, sin = _ref_tables(T, D, theta)
    return {"x": torch.randn(B, H, T, D), "cos": cos, "sin": sin}


def _rope(fn, inputs):
    """Probe side: the student's rope of the inputs' x with their tables."""
    return fn(inputs["x"], inputs["cos"], inputs["sin"])


def _rounding_inputs():
    # head_dim 2: one pair, the same in either convention (checked below), so that
    # these see only the rounding; 2048 values each
    halves = [_inputs(B=4, H=4, T=64, D=2) for _ in range(2)]
    for case, dtype in zip(halves, (torch.bfloat16, torch.float16)):
        case["x"] = case["x"].to(dtype)
    return [_inputs() | {"x": torch.randn(2, 3, 5, 8).bfloat16()}, *halves]


def _judge_rounding(inputs, outs):
    first, *halves = inputs
    out, *rest = outs
    bfloat16_out(same_shape(out, first["x"].shape))
    for case, out in zip(halves, rest, strict=True):
        x = case["x"]
        want = reference_apply_rope(x, case["cos"], case["sin"])
        rounded_once(out, want, f"the {x.dtype} output for a head of 2")


@probe_check(
    BOTH,
    "shape, dtype and rounding: a bfloat16 or float16 x with float32 tables gives x's "
    "dtype, computed in float32 and rounded once",
    1,
    "compute in float32 (x * cos promotes to the tables' dtype), then cast back once "
    "with .to(x.dtype): cos.to(x.dtype) rounds the tables and every product and sum",
    inputs=_rounding_inputs,
    judge=_judge_rounding,
)
def _(fn, cases):
    return [_rope(fn, case) for case in cases]


def _judge_position_0(inputs, out):
    x = inputs["x"]
    same_shape(out, x.shape)
    close(out[:, :, 0], x[:, :, 0], "the rotated vector at position 0")


probe_check(
    BOTH,
    "position 0 is not rotated",
    1,
    "angle 0: cos = 1 and sin = 0, so x * cos + rotate_half(x) * sin is x",
    inputs=_inputs,
    judge=_judge_position_0,
)(_rope)


def _judge_norms(inputs, out):
    x = inputs["x"]
    same_shape(out, x.shape)
    close(out.norm(dim=-1), x.norm(dim=-1), "the norms after rope", atol=1e-4)


probe_check(
    BOTH,
    "a rotation: every vector keeps its length",
    1,
    "each pair of features is rotated, never scaled: use cos and sin of the same angle",
    inputs=lambda: _inputs(T=9),
    judge=_judge_norms,
)(_rope)


RELATIVE = [((2, 0), 5), ((7, 3), 4)]  # (m, n), shift: q at m, k at n


def _relative_inputs():
    cos, sin = _ref_tables(12, 8, 100.0)
    return {"q": torch.randn(1, 1, 1, 8), "k": torch.randn(1, 1, 1, 8)} | {
        "cos": cos,
        "sin": sin,
    }


def _judge_relative(inputs, out):
    qs, ks = out["q"], out["k"]
    assert len(qs) == len(ks) == 12, "one rotated q and k per position"

    def score(m, n):
        qm, kn = is_tensor(qs[m], "q"), is_tensor(ks[n], "k")
        return (qm * kn).sum()

    for (m, n), shift in RELATIVE:
        close(
            score(m + shift, n + shift).reshape(1),
            score(m, n).reshape(1),
            f"q.k at positions ({m + shift}, {n + shift}) vs ({m}, {n})",
            atol=1e-4,
        )


@probe_check(
    BOTH,
    "relative: q . k depends only on the distance between their positions",
    1,
    "rotate q and k with the tables of their own positions; the dot product then sees "
    "only m - n",
    inputs=_relative_inputs,
    judge=_judge_relative,
)
def _(fn, inputs):
    cos, sin = inputs["cos"], inputs["sin"]
    return {
        name: [fn(inputs[name], cos[m : m + 1], sin[m : m + 1]) for m in range(12)]
        for name in ("q", "k")
    }


def _gathered_inputs():
    cos, sin = _ref_tables(16, 8, 100.0)
    return {"x": torch.randn(2, 3, 4, 8), "cos": cos, "sin": sin}


def _judge_gathered(inputs, out):
    gathered, sliced = pair(out, "two results")
    close(gathered, sliced, "rope with gathered tables")


@probe_check(
    BOTH,
    "gathered tables (B, 1, T, D) from position_ids work like sliced ones",
    1,
    "rely on broadcasting: the same code serves cos (T, D) and cos (B, 1, T, D)",
    inputs=_gathered_inputs,
    judge=_judge_gathered,
)
def _(fn, inputs):
    x, cos, sin = inputs["x"], inputs["cos"], inputs["sin"]
    pos = torch.arange(3, 7).expand(2, 4)
    gathered = fn(x, cos[pos].unsqueeze(1), sin[pos].unsqueeze(1))
    return [gathered, fn(x, cos[3:7], sin[3:7])]


def _judge_convention(inputs, out):
    want = reference_apply_rope(inputs["x"], inputs["cos"], inputs["sin"])
    close(out, want, "apply_rope(x, cos, sin)", atol=1e-5)


probe_check(
    BOTH,
    "rotates feature i with feature i + D/2 (the split-halves convention of smol and "
    "HF)",
    2,
    "pairs are (x[i], x[i + D/2]), not neighbours (x[2i], x[2i+1]): x * cos + "
    "rotate_half(x) * sin",
    inputs=lambda: _inputs(T=7),
    judge=_judge_convention,
)(_rope)


def _judge_gradient(inputs, grad):
    assert grad is not None, "no gradient reached x"
    close(grad, 2 * inputs["x"], "the gradient", atol=1e-4)


@probe_check(
    BOTH,
    "gradients flow: the gradient of |rope(x)|^2 is 2x",
    1,
    "use differentiable torch operations (no .detach(), no in-place writes into x)",
    inputs=_inputs,
    judge=_judge_gradient,
)
def _(fn, inputs):
    leaf = inputs["x"].clone().requires_grad_(True)
    y = is_tensor(fn(leaf, inputs["cos"], inputs["sin"]))
    y.pow(2).sum().backward()
    return leaf.grad
