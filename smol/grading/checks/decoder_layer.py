"""06 The assembled model, its decoder layer: named and shaped as smol's, the norms'
gains in the right places, the padded and cached paths, gradients, bfloat16, and a
decoder layer that trains as well as the right one and breaks the released weights."""

import torch

from smol.grading.checks._util import (
    bfloat16_out,
    close,
    grads,
    holding,
    is_tensor,
    module_grads,
    module_made,
    parameter_shapes,
    same_grads,
    same_parameter_shapes,
    untouched,
)
from smol.grading.checks.assembled import CONFIG
from smol.grading.registry import probe_check, task
from smol.kv_cache import KVCache
from smol.model import DecoderLayer as Reference
from smol.rope import RotaryEmbedding

task(
    "decoder_layer_bug",
    "assembled_model",
    "Find the bug: a decoder layer that trains well and breaks the released weights",
)


def _reference(state):
    """Judge side: smol's decoder layer holding `state`."""
    ref = Reference(CONFIG, 0)
    ref.load_state_dict(state)
    return ref


def _layer_state(gains=False):
    """smol's layer's weights (the norms' gains random when `gains`, else one, as at
    initialisation)."""
    ref = Reference(CONFIG, 0)
    if gains:
        with torch.no_grad():
            ref.input_layernorm.weight.uniform_(0.2, 1.0)
            ref.post_attention_layernorm.weight.uniform_(1.0, 3.0)
    return ref.state_dict()


def _student(cls, state, layer_idx=0):
    """Probe side: the student's layer `layer_idx` holding smol's layer's weights
    `state`."""
    student = module_made(cls(CONFIG, layer_idx), "DecoderLayer(config, layer_idx)")
    return holding(student, state, "the layer")


def _layer_inputs(T, gains=False, dtype=torch.float32, tables=None):
    rope = RotaryEmbedding(CONFIG.head_dim, CONFIG.rope_theta, 64)
    cos, sin = rope(tables or T, torch.device("cpu"))
    x = torch.randn(2, T, CONFIG.hidden_size, dtype=dtype)
    return {"state": _layer_state(gains), "x": x, "cos": cos, "sin": sin}


def _judge_layer_sizes(inputs, got):
    same_parameter_shapes(got, Reference(CONFIG, 0))


@probe_check(
    "decoder_layer_bug",
    "parameters named and shaped as smol's (and Hugging Face's) decoder layer",
    1,
    "input_layernorm, self_attn (smol.attention.Attention), post_attention_layernorm, "
    "mlp (smol.mlp.MLP)",
    judge=_judge_layer_sizes,
)
def _(cls, _):
    return parameter_shapes(cls(CONFIG, 0))


def _judge_gains(inputs, out):
    x, cos, sin = inputs["x"], inputs["cos"], inputs["sin"]
    with torch.no_grad():
        want = _reference(inputs["state"])(x, cos, sin)
    untouched(out["x"], x, what="x")
    close(out["out"], want, "the layer's output", atol=1e-5)


@probe_check(
    "decoder_layer_bug",
    "with trained norm gains (not all one), equals smol's layer: each norm before its "
    "own sublayer; x unchanged",
    2,
    "input_layernorm normalises what attention reads, post_attention_layernorm what "
    "the MLP reads; gains of one hide a swap, SmolLM2's trained gains do not. Add into "
    "a new tensor (x = x + ...), not into the caller's x (x += ...)",
    inputs=lambda: _layer_inputs(7, gains=True),
    judge=_judge_gains,
)
def _(cls, inputs):
    x = inputs["x"]
    with torch.no_grad():
        out = _student(cls, inputs["state"])(x, inputs["cos"], inputs["sin"])
    return {"out": out, "x": x}


def _padding_mask(T):
    """Row 0 left-padded by two tokens: causal, padded keys hidden, each query sees
    itself."""
    real = torch.tensor([[0, 0] + [1] * (T - 2), [1] * T]).bool()
    q, k = torch.arange(T)[:, None], torch.arange(T)[None, :]
    return ((k <= q) & real[:, None, None, :]) | (k == q)


def _padded_and_cached(layer, inputs):
    """The layer's output on a padded batch, and on one cached step after a prefill
    of 6 tokens (run on both sides)."""
    x, cos, sin = inputs["x"], inputs["cos"], inputs["sin"]
    with torch.no_grad():  # the layer gets copies: x += ... costs elsewhere
        padded = layer(x.clone(), cos[:6], sin[:6], _padding_mask(6), False)
        cache = KVCache(CONFIG, 2, 7)
        layer(x.clone(), cos[:6], sin[:6], None, True, cache)
        cache.advance(6)
        step = layer(x[:, -1:] * 2, cos[6:], sin[6:], None, False, cache)
    return {"padded": padded, "step": step}


def _judge_padded_and_cached(inputs, out):
    want = _padded_and_cached(_reference(inputs["state"]), inputs)
    close(out["padded"], want["padded"], "the padded batch's output")
    close(is_tensor(out["step"]), want["step"], "the output of a cached step")


@probe_check(
    "decoder_layer_bug",
    "a padding mask and a KV cache reach the attention (padded batch, cached decoding)",
    1,
    "pass mask, is_causal and kv_cache on to self.self_attn(h, cos, sin, mask, "
    "is_causal, kv_cache)",
    inputs=lambda: _layer_inputs(6, tables=7),
    judge=_judge_padded_and_cached,
)
def _(cls, inputs):
    return _padded_and_cached(_student(cls, inputs["state"]), inputs)


def _stacked_and_cached(layers, inputs):
    """The output of one cached step through `layers` (layer 0, then layer 1, sharing
    one KV cache) after a prefill of 6 tokens (run on both sides)."""
    x, cos, sin = inputs["x"], inputs["cos"], inputs["sin"]
    cache = KVCache(CONFIG, 2, 7)  # a slot for each of CONFIG's two layers
    with torch.no_grad():
        h = x.clone()  # (2, 6, C)
        for layer in layers:
            h = layer(h, cos[:6], sin[:6], None, True, cache)
        cache.advance(6)
        h = x[:, -1:] * 2  # (2, 1, C)
        for layer in layers:
            h = layer(h, cos[6:], sin[6:], None, False, cache)
    return h


def _judge_stacked(inputs, out):
    layers = []
    for i, state in enumerate(inputs["states"]):
        layers.append(Reference(CONFIG, i))
        layers[-1].load_state_dict(state)
    want = _stacked_and_cached(layers, inputs)
    close(is_tensor(out), want, "the cached step through layers 0 and 1")


@probe_check(
    "decoder_layer_bug",
    "layer_idx reaches the attention: two layers stacked on one KV cache decode as "
    "smol's",
    1,
    "build self.self_attn = Attention(config, layer_idx): each layer keeps its keys "
    "and values in its own slot of the cache, layer 1 must not overwrite layer 0's",
    inputs=lambda: (
        _layer_inputs(6, tables=7)
        | {"states": [Reference(CONFIG, i).state_dict() for i in (0, 1)]}
    ),
    judge=_judge_stacked,
)
def _(cls, inputs):
    layers = [_student(cls, s, i) for i, s in enumerate(inputs["states"])]
    return _stacked_and_cached(layers, inputs)


def _judge_layer_grads(inputs, out):
    ref = _reference(inputs["state"])
    cos, sin = inputs["cos"], inputs["sin"]
    _, want = grads(lambda t: ref(t, cos, sin), inputs["x"], upstream=inputs["up"])
    same_grads(out["x"], want, ["x"], atol=1e-5)
    params = out["params"]
    for name, r in ref.named_parameters():
        assert params.get(name) is not None, f"no gradient reached {name}"
        if not name.endswith("layernorm.weight"):
            same_grads([params[name]], [r.grad], [name], atol=1e-5)
    # which norm feeds which sublayer is the business of the check with trained gains:
    # here both gains are one, and the two norms' gradients may come in either order
    norms = ("input_layernorm.weight", "post_attention_layernorm.weight")
    got = sorted((params[n] for n in norms), key=lambda g: g.sum().item())
    ref_params = dict(ref.named_parameters())
    want = sorted((ref_params[n].grad for n in norms), key=lambda g: g.sum().item())
    for a, b in zip(got, want):
        close(a, b, "the gradients of the two norms' gains", atol=1e-5)


@probe_check(
    "decoder_layer_bug",
    "gradients for x and every parameter equal smol's (norm gains at one)",
    1,
    "use differentiable operations; the residual x + ... carries the gradient to x",
    inputs=lambda: _layer_inputs(5) | {"up": torch.randn(2, 5, CONFIG.hidden_size)},
    judge=_judge_layer_grads,
)
def _(cls, inputs):
    student = _student(cls, inputs["state"])
    cos, sin = inputs["cos"], inputs["sin"]
    return module_grads(student, lambda t: student(t, cos, sin), inputs)


def _judge_bfloat16(inputs, out):
    bfloat16_out(out)


@probe_check(
    "decoder_layer_bug",
    "a bfloat16 layer and input give bfloat16",
    1,
    "build the layer from smol's modules and keep the stream in x's dtype",
    inputs=lambda: _layer_inputs(4, dtype=torch.bfloat16),
    judge=_judge_bfloat16,
)
def _(cls, inputs):
    student = _student(cls, inputs["state"]).to(torch.bfloat16)
    with torch.no_grad():
        return student(inputs["x"], inputs["cos"], inputs["sin"])
