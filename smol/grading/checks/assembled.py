"""06 The assembled model: the parameter count by formula, the forward pass through the
stack, and a decoder layer that trains as well as the right one and breaks the released
weights."""

import torch

from smol import SmolConfig, SmolLM
from smol.grading.checks._util import (
    close,
    grad_of,
    is_tensor,
    same_shape,
    small_config,
    unchanged,
)
from smol.grading.core import check, task
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


def _count(fn, config):
    out = fn(config)
    assert isinstance(out, int) and not isinstance(out, bool), (
        f"count_params should return an int, got {type(out).__name__}"
    )
    return out


def _smol_count(config):
    return SmolLM(config).count_params()


@check(
    "count_params",
    "SmolLM2-135M: 134,515,008",
    1,
    "embedding V C (the tied head is the same matrix), per layer 4 projections, 3 MLP "
    "matrices and 2 norms, and the final norm",
)
def _(fn):
    got = _count(fn, SmolConfig())
    assert got == 134_515_008, f"count_params(SmolLM2-135M) = {got:,}"


# Each config changes a ratio that SmolLM2-135M fixes: key/value heads a third of the
# query heads (here a half, a sixth, all), F = 8/3 C, 30 layers.
SIZES = [
    dict(hidden_size=48, intermediate_size=80, num_hidden_layers=3),
    dict(hidden_size=60, intermediate_size=150, num_attention_heads=6),
    dict(hidden_size=32, intermediate_size=96, num_hidden_layers=1),
]
KV_HEADS = [2, 1, 4]


@check(
    "count_params",
    "equals SmolLM's count on configs with other ratios (heads, widths, depth)",
    2,
    "k_proj and v_proj map C to num_key_value_heads * head_dim, not to C / 3: read "
    "every size from the config",
)
def _(fn):
    for vocab, sizes, kv in zip((100, 70, 64), SIZES, KV_HEADS):
        config = small_config(vocab, **sizes, num_key_value_heads=kv)
        got, want = _count(fn, config), _smol_count(config)
        assert got == want, (
            f"count_params gave {got:,} for {sizes} with {kv} key/value heads; SmolLM "
            f"has {want:,}"
        )


@check(
    "count_params",
    "an untied head (tie_word_embeddings=False) counts its own matrix",
    1,
    "the head is a second V x C matrix only when config.tie_word_embeddings is false",
)
def _(fn):
    # SmolLM2's ratio of heads (3 to 1): this check is about the head only
    heads = dict(num_attention_heads=6, num_key_value_heads=2)
    config = small_config(100, **SIZES[0], **heads, tie_word_embeddings=False)
    got, want = _count(fn, config), _smol_count(config)
    assert got == want, (
        f"count_params gave {got:,} for an untied model; it has {want:,}"
    )


CONFIG = small_config(53, intermediate_size=80)


def _model(seed=0):
    """A small SmolLM with random weights, norm gains included."""
    torch.manual_seed(seed)
    model = SmolLM(CONFIG)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    return model


def _logits(fn, model, ids):
    out = fn(model, ids)
    return same_shape(out, (*ids.shape, CONFIG.vocab_size), "the logits")


@check(
    "forward_logits",
    "logits of shape (B, T, vocab_size)",
    1,
    "embed (B, T) -> (B, T, C), run the layers, then the final norm and lm_head -> "
    "(B, T, V)",
)
def _(fn):
    model = _model()
    _logits(fn, model, torch.randint(0, CONFIG.vocab_size, (2, 7)))


@check(
    "forward_logits",
    "equals smol's logits: every layer in order, the final norm, the head",
    2,
    "x = embed_tokens(ids); x = layer(x, cos, sin) for each layer; lm_head(norm(x))",
)
def _(fn):
    model = _model()
    ids = torch.randint(0, CONFIG.vocab_size, (2, 9))
    with torch.no_grad():
        close(_logits(fn, model, ids), model(ids)[0], "the logits", atol=1e-5)


@check(
    "forward_logits",
    "the rotary tables of the sequence's own length (T = 1 and T = 5)",
    1,
    "cos, sin = model.model.rotary_emb(T, input_ids.device): (T, head_dim) each",
)
def _(fn):
    model = _model(1)
    for T in (1, 5):
        ids = torch.randint(0, CONFIG.vocab_size, (3, T))
        with torch.no_grad():
            close(_logits(fn, model, ids), model(ids)[0], f"the logits for T={T}")


@check(
    "forward_logits",
    "gradients for every parameter equal smol's",
    1,
    "use the model's own modules with differentiable operations (no torch.no_grad, no "
    ".detach())",
)
def _(fn):
    model, ref = _model(2), _model(2)
    ids = torch.randint(0, CONFIG.vocab_size, (2, 6))
    logits = _logits(fn, model, ids)
    assert logits.requires_grad, "the logits are not connected to the parameters"
    up = torch.randn_like(logits)
    (logits * up).sum().backward()
    (ref(ids)[0] * up).sum().backward()
    params = dict(model.named_parameters())
    for name, r in ref.named_parameters():
        g = params[name].grad
        assert g is not None, f"no gradient reached {name}"
        close(g, r.grad, f"the gradient of {name}", atol=1e-5)


def _layers(cls, gains=False, seed=0):
    """The student's layer and smol's with the same weights (the norms' gains random
    when `gains`, else one, as at initialisation)."""
    torch.manual_seed(seed)
    student = cls(CONFIG, 0)
    assert isinstance(student, torch.nn.Module), (
        f"DecoderLayer(config, layer_idx) should be an nn.Module, got "
        f"{type(student).__name__}"
    )
    ref = Reference(CONFIG, 0)
    if gains:
        with torch.no_grad():
            ref.input_layernorm.weight.uniform_(0.2, 1.0)
            ref.post_attention_layernorm.weight.uniform_(1.0, 3.0)
    result = student.load_state_dict(ref.state_dict(), strict=False)
    assert not result.missing_keys, f"the layer has no {', '.join(result.missing_keys)}"
    return student, ref


def _tables(T):
    rope = RotaryEmbedding(CONFIG.head_dim, CONFIG.rope_theta, 64)
    return rope(T, torch.device("cpu"))


@check(
    "decoder_layer_bug",
    "parameters named and shaped as smol's (and Hugging Face's) decoder layer",
    1,
    "input_layernorm, self_attn (smol.attention.Attention), post_attention_layernorm, "
    "mlp (smol.mlp.MLP)",
)
def _(cls):
    student = cls(CONFIG, 0)
    got = {k: tuple(v.shape) for k, v in student.state_dict().items()}
    want = {k: tuple(v.shape) for k, v in Reference(CONFIG, 0).state_dict().items()}
    assert got == want, f"parameters {got}, expected {want}"


@check(
    "decoder_layer_bug",
    "with trained norm gains (not all one), equals smol's layer: each norm before its "
    "own sublayer; x unchanged",
    2,
    "input_layernorm normalises what attention reads, post_attention_layernorm what "
    "the MLP reads; gains of one hide a swap, SmolLM2's trained gains do not. Add into "
    "a new tensor (x = x + ...), not into the caller's x (x += ...)",
)
def _(cls):
    student, ref = _layers(cls, gains=True)
    x = torch.randn(2, 7, CONFIG.hidden_size)
    cos, sin = _tables(7)
    with torch.no_grad():
        want = ref(x, cos, sin)
        out = unchanged(lambda: student(x, cos, sin), x, what="x")
    close(out, want, "the layer's output", atol=1e-5)


def _padding_mask(T):
    """Row 0 left-padded by two tokens: causal, padded keys hidden, each query sees
    itself."""
    real = torch.tensor([[0, 0] + [1] * (T - 2), [1] * T]).bool()
    q, k = torch.arange(T)[:, None], torch.arange(T)[None, :]
    return ((k <= q) & real[:, None, None, :]) | (k == q)


@check(
    "decoder_layer_bug",
    "a padding mask and a KV cache reach the attention (padded batch, cached decoding)",
    1,
    "pass mask, is_causal and kv_cache on to self.self_attn(h, cos, sin, mask, "
    "is_causal, kv_cache)",
)
def _(cls):
    student, ref = _layers(cls)
    x = torch.randn(2, 6, CONFIG.hidden_size)
    cos, sin = _tables(7)
    mask = _padding_mask(6)
    with torch.no_grad():  # the student's layer gets copies: x += ... costs elsewhere
        got = student(x.clone(), cos[:6], sin[:6], mask, False)
        close(got, ref(x, cos[:6], sin[:6], mask, False), "the padded batch's output")
        outputs = []
        for layer in (student, ref):  # a prefill of 6 tokens, then one step
            cache = KVCache(CONFIG, 2, 7)
            layer(x.clone(), cos[:6], sin[:6], None, True, cache)
            cache.advance(6)
            step = layer(x[:, -1:] * 2, cos[6:], sin[6:], None, False, cache)
            outputs.append(is_tensor(step))
        close(*outputs, "the output of a cached step")


@check(
    "decoder_layer_bug",
    "gradients for x and every parameter equal smol's (norm gains at one)",
    1,
    "use differentiable operations; the residual x + ... carries the gradient to x",
)
def _(cls):
    student, ref = _layers(cls)
    x = torch.randn(2, 5, CONFIG.hidden_size)
    cos, sin = _tables(5)
    _, (g,), up = grad_of(lambda t: student(t, cos, sin), x)
    _, (want,), _ = grad_of(lambda t: ref(t, cos, sin), x, upstream=up)
    close(g, want, "the gradient of x", atol=1e-5)
    params = dict(student.named_parameters())
    for name, r in ref.named_parameters():
        p = params.get(name)
        assert p is not None and p.grad is not None, f"no gradient reached {name}"
        if not name.endswith("layernorm.weight"):
            close(p.grad, r.grad, f"the gradient of {name}", atol=1e-5)
    # which norm feeds which sublayer is the business of the check with trained gains:
    # here both gains are one, and the two norms' gradients may come in either order
    norms = ("input_layernorm.weight", "post_attention_layernorm.weight")
    got = sorted((params[n].grad for n in norms), key=lambda g: g.sum().item())
    ref_params = dict(ref.named_parameters())
    want = sorted((ref_params[n].grad for n in norms), key=lambda g: g.sum().item())
    for a, b in zip(got, want):
        close(a, b, "the gradients of the two norms' gains", atol=1e-5)


@check(
    "decoder_layer_bug",
    "a bfloat16 layer and input give bfloat16",
    1,
    "build the layer from smol's modules and keep the stream in x's dtype",
)
def _(cls):
    student, _ = _layers(cls)
    x = torch.randn(2, 4, CONFIG.hidden_size, dtype=torch.bfloat16)
    cos, sin = _tables(4)
    with torch.no_grad():
        out = is_tensor(student.to(torch.bfloat16)(x, cos, sin))
    assert out.dtype == torch.bfloat16, f"bfloat16 in, {out.dtype} out"
