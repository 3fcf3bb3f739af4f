"""06 The assembled model: the parameter count by formula, the forward pass through the
stack, and a decoder layer that trains as well as the right one and breaks the released
weights."""

import torch

from smol import SmolConfig, SmolLM
from smol.grading.checks._util import (
    bfloat16_out,
    close,
    grads,
    is_tensor,
    same_grads,
    same_shape,
    small_config,
    untouched,
)
from smol.grading.registry import probe_check, task
from smol.kv_cache import KVCache
from smol.model import DecoderLayer as Reference
from smol.rope import RotaryEmbedding

task(
    "count_params",
    "assembled_model",
    "count_params(config): the parameters of SmolLM, by formula",
)
task(
    "forward_logits",
    "assembled_model",
    "forward_logits(model, input_ids): embedding, layers, final norm, head",
)
task(
    "decoder_layer_bug",
    "assembled_model",
    "Find the bug: a decoder layer that trains well and breaks the released weights",
)


def _count(out):
    assert isinstance(out, int) and not isinstance(out, bool), (
        f"count_params should return an int, got {type(out).__name__}"
    )
    return out


def _smol_count(config):
    return SmolLM(config).count_params()


def _judge_135m(inputs, out):
    got = _count(out)
    assert got == 134_515_008, f"count_params(SmolLM2-135M) = {got:,}"


@probe_check(
    "count_params",
    "SmolLM2-135M: 134,515,008",
    1,
    "embedding V C (the tied head is the same matrix), per layer 4 projections, 3 MLP "
    "matrices and 2 norms, and the final norm",
    judge=_judge_135m,
)
def _(fn, _):
    return fn(SmolConfig())


# Each config changes a ratio that SmolLM2-135M fixes: key/value heads a third of the
# query heads (here a half, a sixth, all), F = 8/3 C, 30 layers.
SIZES = [
    dict(hidden_size=48, intermediate_size=80, num_hidden_layers=3),
    dict(hidden_size=60, intermediate_size=150, num_attention_heads=6),
    dict(hidden_size=32, intermediate_size=96, num_hidden_layers=1),
]
KV_HEADS = [2, 1, 4]
RATIOS = [
    small_config(vocab, **sizes, num_key_value_heads=kv)
    for vocab, sizes, kv in zip((100, 70, 64), SIZES, KV_HEADS)
]


def _judge_ratios(inputs, outs):
    for config, sizes, kv, out in zip(RATIOS, SIZES, KV_HEADS, outs, strict=True):
        got, want = _count(out), _smol_count(config)
        assert got == want, (
            f"count_params gave {got:,} for {sizes} with {kv} key/value heads; SmolLM "
            f"has {want:,}"
        )


@probe_check(
    "count_params",
    "equals SmolLM's count on configs with other ratios (heads, widths, depth)",
    2,
    "k_proj and v_proj map C to num_key_value_heads * head_dim, not to C / 3: read "
    "every size from the config",
    judge=_judge_ratios,
)
def _(fn, _):
    return [fn(config) for config in RATIOS]


# SmolLM2's ratio of heads (3 to 1): this check is about the head only
UNTIED = small_config(
    100,
    **SIZES[0],
    num_attention_heads=6,
    num_key_value_heads=2,
    tie_word_embeddings=False,
)


def _judge_untied(inputs, out):
    got, want = _count(out), _smol_count(UNTIED)
    assert got == want, (
        f"count_params gave {got:,} for an untied model; it has {want:,}"
    )


@probe_check(
    "count_params",
    "an untied head (tie_word_embeddings=False) counts its own matrix",
    1,
    "the head is a second V x C matrix only when config.tie_word_embeddings is false",
    judge=_judge_untied,
)
def _(fn, _):
    return fn(UNTIED)


CONFIG = small_config(53, intermediate_size=80)


def _model(state=None):
    """A small SmolLM with random weights, norm gains included (or `state`)."""
    model = SmolLM(CONFIG)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    if state is not None:
        model.load_state_dict(state)
    return model


def _model_and_ids(*shape):
    return {
        "state": _model().state_dict(),
        "ids": torch.randint(0, CONFIG.vocab_size, shape),
    }


def _logits(out, ids):
    return same_shape(out, (*ids.shape, CONFIG.vocab_size), "the logits")


@probe_check(
    "forward_logits",
    "logits of shape (B, T, vocab_size)",
    1,
    "embed (B, T) -> (B, T, C), run the layers, then the final norm and lm_head -> "
    "(B, T, V)",
    inputs=lambda: _model_and_ids(2, 7),
    judge=lambda inputs, out: _logits(out, inputs["ids"]),
)
def _(fn, inputs):
    return fn(_model(inputs["state"]), inputs["ids"])


def _judge_logits(inputs, out):
    model, ids = _model(inputs["state"]), inputs["ids"]
    with torch.no_grad():
        close(_logits(out, ids), model(ids)[0], "the logits", atol=1e-5)


@probe_check(
    "forward_logits",
    "equals smol's logits: every layer in order, the final norm, the head",
    2,
    "x = embed_tokens(ids); x = layer(x, cos, sin) for each layer; lm_head(norm(x))",
    inputs=lambda: _model_and_ids(2, 9),
    judge=_judge_logits,
)
def _(fn, inputs):
    with torch.no_grad():
        return fn(_model(inputs["state"]), inputs["ids"])


def _lengths_inputs():
    return {
        "state": _model().state_dict(),
        "ids": [torch.randint(0, CONFIG.vocab_size, (3, T)) for T in (1, 5)],
    }


def _judge_lengths(inputs, outs):
    model = _model(inputs["state"])
    for ids, out in zip(inputs["ids"], outs, strict=True):
        with torch.no_grad():
            want = model(ids)[0]
        close(_logits(out, ids), want, f"the logits for T={ids.shape[1]}")


@probe_check(
    "forward_logits",
    "the rotary tables of the sequence's own length (T = 1 and T = 5)",
    1,
    "cos, sin = model.model.rotary_emb(T, input_ids.device): (T, head_dim) each",
    inputs=_lengths_inputs,
    judge=_judge_lengths,
)
def _(fn, inputs):
    model = _model(inputs["state"])
    with torch.no_grad():
        return [fn(model, ids) for ids in inputs["ids"]]


def _judge_logit_grads(inputs, got):
    ref, ids = _model(inputs["state"]), inputs["ids"]
    (ref(ids)[0] * inputs["up"]).sum().backward()
    for name, r in ref.named_parameters():
        assert name in got, f"no gradient reached {name}"
        same_grads([got[name]], [r.grad], [name], atol=1e-5)


@probe_check(
    "forward_logits",
    "gradients for every parameter equal smol's",
    1,
    "use the model's own modules with differentiable operations (no torch.no_grad, no "
    ".detach())",
    inputs=lambda: _model_and_ids(2, 6) | {"up": torch.randn(2, 6, CONFIG.vocab_size)},
    judge=_judge_logit_grads,
)
def _(fn, inputs):
    model = _model(inputs["state"])
    logits = _logits(fn(model, inputs["ids"]), inputs["ids"])
    assert logits.requires_grad, "the logits are not connected to the parameters"
    (logits * inputs["up"]).sum().backward()
    return {name: p.grad for name, p in model.named_parameters()}


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


def _student(cls, state):
    """Probe side: the student's layer holding smol's layer's weights `state`."""
    student = cls(CONFIG, 0)
    assert isinstance(student, torch.nn.Module), (
        f"DecoderLayer(config, layer_idx) should be an nn.Module, got "
        f"{type(student).__name__}"
    )
    result = student.load_state_dict(state, strict=False)
    assert not result.missing_keys, f"the layer has no {', '.join(result.missing_keys)}"
    return student


def _layer_inputs(T, gains=False, dtype=torch.float32, tables=None):
    rope = RotaryEmbedding(CONFIG.head_dim, CONFIG.rope_theta, 64)
    cos, sin = rope(tables or T, torch.device("cpu"))
    x = torch.randn(2, T, CONFIG.hidden_size, dtype=dtype)
    return {"state": _layer_state(gains), "x": x, "cos": cos, "sin": sin}


def _judge_layer_sizes(inputs, got):
    got = {k: tuple(v) for k, v in got.items()}
    want = {k: tuple(v.shape) for k, v in Reference(CONFIG, 0).state_dict().items()}
    assert got == want, f"parameters {got}, expected {want}"


@probe_check(
    "decoder_layer_bug",
    "parameters named and shaped as smol's (and Hugging Face's) decoder layer",
    1,
    "input_layernorm, self_attn (smol.attention.Attention), post_attention_layernorm, "
    "mlp (smol.mlp.MLP)",
    judge=_judge_layer_sizes,
)
def _(cls, _):
    return {k: list(v.shape) for k, v in cls(CONFIG, 0).state_dict().items()}


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
    _, gx = grads(lambda t: student(t, cos, sin), inputs["x"], upstream=inputs["up"])
    return {"x": gx, "params": {n: p.grad for n, p in student.named_parameters()}}


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
