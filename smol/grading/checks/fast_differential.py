"""09 Fast generation, the tasks without a model against smol's on generated inputs
(`_differential`). The quantizer: weights of one row or column to twenty, rows of
sizes from 1e-6 to 1e4, all-zero rows, float32, bfloat16 and float16; q (a value
half a step from two rounds either way), its dtype and the scales of the rows that
are not all zero (an all-zero row's scale is anyone's finite choice) compared.
int8_linear: inputs of one to three axes, out != in, float32, bfloat16 and
float16; the output, its dtype and the gradient of x. lookup_draft: token streams
over one to five ids (repeats, overlapping n-grams), of one token to twenty, every
max_ngram and num_draft. speculative_greedy runs a model: its targeted checks
compare its tokens with greedy decoding."""

import torch

from smol.grading.checks import _differential as diff
from smol.grading.checks.fast import BOTH
from smol.quantize import quantize_per_channel
from smol.speculative import lookup_draft

NAME = "generated inputs: values and dtypes equal smol's"
GRADS = "generated inputs: values, dtypes and gradients equal smol's"
CASES = 40
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _weight_case(g) -> dict:
    out, fan_in = diff.pick(g, (1, 3, 8, 20)), diff.pick(g, (1, 2, 16))
    sizes = 10 ** (8 * torch.rand(out, generator=g) - 6)  # 1e-6 .. 1e2 a row
    w = torch.randn(out, fan_in, generator=g) * sizes[:, None] * diff.pick(g, (1, 100))
    w[torch.rand(out, generator=g) < 0.2] = 0  # all-zero rows
    dtype = diff.pick(g, DTYPES)
    w = w.to(dtype)
    zero = int((w == 0).all(1).sum())
    what = (
        f"a {diff.dtype_name(w)} weight {tuple(w.shape)}, rows up to "
        f"{w.float().abs().amax():.3g}, {zero} all-zero rows"
    )
    return diff.exact(what, {"w": w}, tol=(0.0, 1e-6))


def _call_quantize(fn, args):
    """q, where a value is not half a step from two (there either way is right),
    and the scales of the rows not all zero."""
    w = args["w"].float()
    q, scale = fn(args["w"].clone())
    amax = w.abs().amax(1)
    steps = w.double() / (amax.double()[:, None] / 127)
    half = ((steps - steps.floor()) - 0.5).abs() < 1e-3
    if isinstance(q, torch.Tensor) and q.shape == half.shape:
        q = q.masked_fill(half, 0)
    return [q, torch.where(amax > 0, scale, torch.zeros_like(scale))]


def _linear_case(g) -> dict:
    out, fan_in = diff.pick(g, (1, 5, 12)), diff.pick(g, (1, 3, 16))
    lead = [diff.pick(g, (1, 2, 3)) for _ in range(diff.pick(g, (0, 1, 2)))]
    q, scale = quantize_per_channel(torch.randn(out, fan_in, generator=g))
    dtype = diff.pick(g, DTYPES)
    x = torch.randn(*lead, fan_in, generator=g).to(dtype)
    wide = dtype != torch.float32
    return {
        "what": f"x {tuple(x.shape)} {diff.dtype_name(x)}, q ({out}, {fan_in})",
        "args": {"x": x, "q": q, "scale": scale},
        "grad": ["x"],
        "up": [torch.randn(*lead, out, generator=g)],
        "tol": (5e-2, 2e-2) if wide else (1e-5, 1e-5),
        "gtol": (5e-2, 2e-2) if wide else (1e-5, 1e-5),
        "dtype": True,
    }


def _call_linear(fn, args):
    return [fn(args["x"], args["q"].clone(), args["scale"].clone())]


def _smol_linear():
    def int8_linear(x, q, scale):
        return (x @ q.to(x.dtype).T) * scale.to(x.dtype)  # (..., out)

    return int8_linear


def _draft_case(g) -> dict:
    N, V = diff.pick(g, (1, 2, 4, 8, 20)), diff.pick(g, (1, 2, 2, 3, 5))
    tokens = torch.randint(0, V, (N,), generator=g)
    ngram, draft = diff.pick(g, (1, 2, 3, 4)), diff.pick(g, (1, 3, 8))
    what = f"tokens {tokens.tolist()}, max_ngram={ngram}, num_draft={draft}"
    return diff.exact(what, {"tokens": tokens, "ngram": ngram, "draft": draft})


def _call_draft(fn, args):
    return [fn(args["tokens"].clone(), args["ngram"], args["draft"])]


for tasks, name, make, call, reference, hint in (
    (
        BOTH,
        NAME,
        _weight_case,
        _call_quantize,
        lambda: quantize_per_channel,
        "the case named below differs from smol.quantize.quantize_per_channel: "
        "weight.float() whatever its dtype, scale = |w| max of the row / 127 "
        "(float32), q = round(w / scale) as int8; an all-zero row gives zeros",
    ),
    (
        "int8_linear",
        GRADS,
        _linear_case,
        _call_linear,
        _smol_linear,
        "the case named below differs from smol's (x @ q.to(x.dtype).T) * "
        "scale.to(x.dtype): for x of any leading axes and dtype, the output in "
        "x's dtype, the gradient reaching x",
    ),
    (
        "lookup_draft",
        NAME,
        _draft_case,
        _call_draft,
        lambda: lookup_draft,
        "the case named below differs from smol.speculative.lookup_draft: the "
        "longest n <= max_ngram (and < len(tokens)) whose last n tokens occurred "
        "before, at their latest earlier place (one that overlaps the end counts), "
        "then up to num_draft tokens after it; empty when none",
    ),
):
    diff.register(tasks, name, 1, hint, make, call, reference, CASES)
