"""06 The assembled model: the parameter count by formula and the forward pass through
the stack (the decoder layer's checks: `decoder_layer`)."""

import torch

from smol import SmolConfig, SmolLM
from smol.grading.checks._util import (
    close,
    same_grads,
    same_shape,
    small_config,
)
from smol.grading.registry import probe_check, task

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


def _model(state=None, config=CONFIG):
    """A small SmolLM of `config` with random weights, norm gains included (or
    `state`)."""
    model = SmolLM(config)
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


# the model above ties its head to the embedding: here the head is a matrix of its own
UNTIED_HEAD = CONFIG.replace(tie_word_embeddings=False)


def _judge_untied_logits(inputs, out):
    model, ids = _model(inputs["state"], UNTIED_HEAD), inputs["ids"]
    with torch.no_grad():
        close(_logits(out, ids), model(ids)[0], "the untied model's logits")


@probe_check(
    "forward_logits",
    "an untied head (tie_word_embeddings=False): the logits come from lm_head",
    1,
    "the head is model.lm_head, which holds its own matrix when the weights are not "
    "tied: apply it, do not read the embedding's weight",
    inputs=lambda: {
        "state": _model(config=UNTIED_HEAD).state_dict(),
        "ids": torch.randint(0, CONFIG.vocab_size, (2, 5)),
    },
    judge=_judge_untied_logits,
)
def _(fn, inputs):
    with torch.no_grad():
        return fn(_model(inputs["state"], UNTIED_HEAD), inputs["ids"])
