"""09 Fast generation: int8 weights with one scale per output channel, the int8 matrix
product, prompt-lookup drafts, speculative decoding that equals greedy decoding, and a
quantizer whose error is twice what it should be."""

import torch

from smol.grading.checks._util import (
    bfloat16_out,
    close,
    is_tensor,
    pair,
    untouched,
)
from smol.grading.registry import probe_check, task
from smol.speculative import lookup_draft as reference_lookup

task(
    "quantize_int8",
    "fast_generation",
    "quantize_per_channel(weight): int8 values and one scale per output channel",
)
task(
    "int8_linear",
    "fast_generation",
    "int8_linear(x, q, scale): the product with int8 weights",
)
task(
    "lookup_draft",
    "fast_generation",
    "lookup_draft(tokens, max_ngram, num_draft): a draft from the text itself",
)
task(
    "speculative_greedy",
    "fast_generation",
    "speculative_greedy(model, input_ids, n): several tokens a pass, greedy's text",
)
task(
    "quantize_bug",
    "fast_generation",
    "Find the bug: an int8 quantizer whose error is twice what it should be",
)

BOTH = ("quantize_int8", "quantize_bug")


def _weight(out=12, inp=40, seed=0):
    """Rows of very different sizes (1e-3 .. 1e2), as one scale per row must handle."""
    g = torch.Generator().manual_seed(seed)
    sizes = torch.logspace(-3, 2, out)[torch.randperm(out, generator=g)]
    return torch.randn(out, inp, generator=g) * sizes[:, None]


def _quantized(fn, w):
    """Probe side: (q, scale) for a copy of w: an in-place write costs only the check
    made for it."""
    return fn(w.clone())


def _q_and_scale(out):
    """Judge side: the tensors q and scale of a quantizer's result."""
    q, scale = pair(out, "return (q, scale)")
    return is_tensor(q, "q"), is_tensor(scale, "scale")


def _judge_dtypes(weights, outs):
    for w, out in zip(weights, outs, strict=True):
        dtype = w.dtype
        q, scale = _q_and_scale(out)
        assert q.dtype == torch.int8 and tuple(q.shape) == (12, 40), (
            f"q is {q.dtype} {tuple(q.shape)} for a {dtype} weight, expected "
            f"torch.int8 (12, 40)"
        )
        assert scale.dtype == torch.float32 and tuple(scale.shape) == (12,), (
            f"scale is {scale.dtype} {tuple(scale.shape)} for a {dtype} weight, "
            f"expected torch.float32 (12,)"
        )


@probe_check(
    BOTH,
    "q is int8 (out, in), scale float32 (out,), for float32 and bfloat16 weights",
    1,
    "compute in float32 (weight.float()); q = ....to(torch.int8); one scale per row",
    inputs=lambda: [_weight(), _weight().bfloat16()],
    judge=_judge_dtypes,
)
def _(fn, weights):
    return [_quantized(fn, w) for w in weights]


def _in_float32(w, out) -> bool:
    """Judge side: whether to judge the values of (q, scale) for w: always for a
    float32 w; for a bfloat16 w only when scale is float32 (a scale of another dtype
    costs the dtype check alone)."""
    return w.dtype == torch.float32 or _q_and_scale(out)[1].dtype == torch.float32


def _judge_scales(w, out):
    _, scale = _q_and_scale(out)
    want = w.float().abs().amax(dim=1) / 127
    close(scale, want, f"the scales of a {w.dtype} weight", atol=0, rtol=1e-5)


def _judge_rounding(w, out):
    q, scale = _q_and_scale(out)
    assert q.abs().max() <= 127, f"q reaches {int(q.abs().max())}, beyond 127"
    s = scale.float()[:, None]
    error = (w.float() - q.float() * s).abs() / s  # in steps of each row's scale
    worst = error.max().item()
    assert worst <= 0.5 + 1e-4, (
        f"a {w.dtype} weight is off by {worst:.3f} of its row's step; rounding "
        "keeps it to 0.5"
    )


def _with_zero_row():
    w = _weight()
    w[3] = 0
    return w


def _judge_zero_row(w, out):
    q, scale = _q_and_scale(out)
    assert torch.isfinite(scale).all(), "a scale is inf or NaN"
    assert not q[3].any(), f"the zero row quantizes to {q[3].tolist()}"


def _judge_each(judge):
    """Judge side: judge(w, out) for each weight and the student's result for it."""

    def each(weights, outs):
        for w, out in zip(weights, outs, strict=True):
            if _in_float32(w, out):
                judge(w, out)

    return each


# the checks that quantize weights and judge each (q, scale): name, points, hint,
# the weights (a float32 one and the same in bfloat16, whose values are computed in
# float32 too), the judge
for name, points, hint, weights, judge in (
    (
        "one scale per output channel: each row's largest |w| maps to 127, computed "
        "in float32 for a bfloat16 weight too",
        1,
        (
            "scale = weight.float().abs().amax(dim=1) / 127: a row of small weights "
            "keeps its own precision instead of rounding to zero under the largest "
            "row's scale; divided in bfloat16, the scale is off by up to 0.4%"
        ),
        lambda: [_weight(), _weight(seed=3).bfloat16()],
        _judge_scales,
    ),
    (
        "rounded to the nearest step: every |w - q * scale| <= scale / 2 (also for "
        "a bfloat16 weight)",
        2,
        (
            "torch.round(w / scale) before .to(torch.int8), with w = weight.float(): "
            "the cast alone truncates towards zero, and the error grows to a whole "
            "step; w / scale in bfloat16 is off by up to 0.25 of a step"
        ),
        lambda: [_weight(seed=1), _weight(seed=4).bfloat16()],
        _judge_rounding,
    ),
    (
        "an all-zero row gives zeros and a finite scale (no division by zero)",
        1,
        "clamp the scale from below (scale.clamp(min=1e-12)) before dividing by it",
        lambda: [_with_zero_row()],
        _judge_zero_row,
    ),
):
    probe_check(BOTH, name, points, hint, inputs=weights, judge=_judge_each(judge))(
        lambda fn, weights: [_quantized(fn, w) for w in weights]
    )


@probe_check(
    BOTH,
    "the weight is left unchanged",
    1,
    "divide into a new tensor (w / scale), not in place (w.div_)",
    inputs=lambda: _weight(seed=2),
    judge=lambda w, after: untouched(after, w, what="the weight"),
)
def _(fn, w):
    fn(w)
    return w


def _int8(out=16, inp=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-127, 128, (out, inp), generator=g, dtype=torch.int8)
    return q, torch.rand(out, generator=g) / 100 + 1e-3


def _product(x, q, scale):
    return x.float() @ (q.float() * scale[:, None]).T


class _ScaledWeights(torch.overrides.TorchFunctionMode):
    """Records the shape of every tensor the code makes that has the weight's
    shape (or its transpose) and other values than q's: the float matrix s_i q_ij
    (casts and transposes of q hold q's values)."""

    def __init__(self, q):
        super().__init__()
        self.q, self.built = q, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.is_floating_point():
            for w in (self.q, self.q.T):
                if out.shape == w.shape and not torch.equal(out, w.to(out.dtype)):
                    self.built.append(list(out.shape))
        return out


def _judge_product(inputs, out):
    x, q, scale = inputs
    built = out["built"]
    assert not built, (
        f"a {tuple(built[0])} float matrix of scaled weights was built: multiply x "
        "by q first, then scale each output"
    )
    out = is_tensor(out["out"])
    close(out, _product(x, q, scale), "int8_linear(x, q, scale)", atol=1e-4)


@probe_check(
    "int8_linear",
    "values: x @ (q * scale)^T, each scale on its output (out != in)",
    2,
    "(x @ q.T) * scale: scale (out,) multiplies the last axis of the result, which "
    "has out entries; never the matrix q * scale[:, None], which a step would read "
    "in float",
    inputs=lambda: [torch.randn(3, 5, 24), *_int8()],
    judge=_judge_product,
)
def _(fn, inputs):
    with _ScaledWeights(inputs[1]) as spy:
        out = fn(*inputs)
    return {"out": out, "built": spy.built}


def _bfloat16_inputs():
    q, scale = _int8(seed=1)
    xs = [torch.randn(shape).bfloat16() for shape in ((24,), (2, 3, 24))]
    return {"xs": xs, "q": q, "scale": scale}


def _judge_bfloat16(inputs, outs):
    q, scale = inputs["q"], inputs["scale"]
    for x, out in zip(inputs["xs"], outs, strict=True):
        bfloat16_out(out)
        close(
            out.float(),
            _product(x, q, scale),
            f"the output for a {tuple(x.shape)} input",
            atol=0.05,
            rtol=0.05,
        )


@probe_check(
    "int8_linear",
    "bfloat16 activations give bfloat16 outputs, for any leading shape",
    1,
    "convert q and scale to x's dtype (q.to(x.dtype)) before multiplying",
    inputs=_bfloat16_inputs,
    judge=_judge_bfloat16,
)
def _(fn, inputs):
    return [fn(x, inputs["q"], inputs["scale"]) for x in inputs["xs"]]


def _judge_kept(inputs, after):
    _, q, scale = inputs
    for before, now in zip((q, scale), after, strict=True):
        untouched(now, before, what="q or scale")


@probe_check(
    "int8_linear",
    "q and scale are left unchanged",
    1,
    "convert into new tensors (q.to(...), scale * ...), never in place",
    inputs=lambda: [torch.randn(4, 24), *_int8(seed=2)],
    judge=_judge_kept,
)
def _(fn, inputs):
    _, q, scale = inputs
    fn(*inputs)
    return [q, scale]


def _draft_check(name, points, hint, cases):
    """A check of lookup_draft on `cases` ((tokens, max_ngram, num_draft) each)
    against smol's."""

    def judge(inputs, outs):
        for (tokens, max_ngram, num_draft), out in zip(cases, outs, strict=True):
            is_tensor(out, "the draft")
            assert out.dim() == 1 and out.dtype == torch.long, (
                "the draft should be a 1-d tensor of token ids, got "
                f"{out.dim()}-d {out.dtype}"
            )
            want = reference_lookup(torch.tensor(tokens), max_ngram, num_draft)
            assert torch.equal(out, want), (
                f"lookup_draft({tokens}, max_ngram={max_ngram}, num_draft="
                f"{num_draft}) gave {out.tolist()}, expected {want.tolist()}"
            )

    probe_check("lookup_draft", name, points, hint, inputs=lambda: cases, judge=judge)(
        lambda fn, inputs: [fn(torch.tensor(t), n, d) for t, n, d in inputs]
    )


_draft_check(
    "the tokens after the latest earlier occurrence of the last n tokens",
    2,
    "slide over the earlier positions, keep the last match, return tokens[start + n "
    ": start + n + num_draft] (fewer near the end)",
    [
        ([1, 2, 3, 9, 1, 2, 3, 8, 7, 1, 2, 3], 3, 8),  # latest (1, 2, 3): 8 7 1 2 3
        ([4, 5, 6, 7, 8, 9, 4, 5], 3, 3),  # 6 7 8
        ([1, 2, 1, 2, 1, 2], 3, 8),  # overlapping: 1 2 after the latest (1, 2)
    ],
)
_draft_check(
    "the longest n-gram first, from max_ngram down to 1",
    1,
    "for n in range(max_ngram, 0, -1): the first n that occurred before decides",
    [
        ([7, 8, 9, 1, 5, 9, 2, 7, 8, 9], 3, 8),  # (7, 8, 9) -> 1; the latest 9 -> 2
        ([7, 8, 9, 1, 5, 9, 2, 7, 8, 9], 1, 8),
        ([9, 3, 4, 6, 5, 4, 6, 3, 4], 2, 8),  # (3, 4) -> 6 5 4 6 3 4
    ],
)
_draft_check(
    "nothing found gives an empty tensor; the last tokens themselves do not count",
    1,
    "search only the earlier windows (start < len - n); return tokens[:0] when none "
    "matches",
    [([1, 2, 3, 4, 5], 3, 8), ([6], 3, 8)],
)
_draft_check(
    "an occurrence at the very start counts",
    1,
    "the first window starts at position 0",
    [([5, 6, 7, 8, 6, 9, 5, 6], 3, 4)],  # (5, 6) at 0 -> 7 8 6 9
)
