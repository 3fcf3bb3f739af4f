"""06 The assembled model, every task against smol's on generated configs
(`_differential`): widths, heads and key/value heads in every ratio, one to three
layers, tied and untied heads, rope_theta and rms_norm_eps of other Llamas (eps
1e-6 to 1e-3 on activations small enough for it to matter), float32 and bfloat16
weights with trained norm gains, one token or many, padded batches; the counts of
depths up to 30 for the count; values, dtypes and the gradients of the input and every
parameter compared."""

import torch
from torch import nn

from smol.grading.checks import _differential as diff
from smol.grading.checks.norm_rope_differential import NAME, with_weights

CASES = 40
# the fields of SmolConfig a case draws (the others keep their defaults)
FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "rope_theta",
    "rms_norm_eps",
    "tie_word_embeddings",
)


def _config_fields(g, layers=(1, 2, 3)) -> dict:
    heads, n_rep = diff.pick(g, ((2, 1), (2, 2), (3, 1), (3, 3), (4, 2), (6, 3)))
    head_dim = diff.pick(g, (2, 4, 8))
    return {
        "vocab_size": diff.pick(g, (11, 40, 97)),
        "hidden_size": heads * n_rep * head_dim,
        "intermediate_size": diff.pick(g, (8, 20, 36)),
        "num_hidden_layers": diff.pick(g, layers),
        "num_attention_heads": heads * n_rep,
        "num_key_value_heads": heads,
        "rope_theta": diff.pick(g, (1e4, 1e5, 5e5)),
        "rms_norm_eps": diff.pick(g, (1e-6, 1e-5, 1e-3)),
        "tie_word_embeddings": diff.pick(g, (True, False)),
    }


def _config(args):
    from smol import SmolConfig

    return SmolConfig(**{k: args[k] for k in FIELDS}, max_position_embeddings=32)


def _about(fields: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in fields.items())


# --- count_params
def _count_case(g) -> dict:
    fields = _config_fields(g, layers=(1, 2, 5, 30))
    fields["vocab_size"] = diff.pick(g, (11, 97, 1000))
    return diff.exact(_about(fields), fields)


def _call_count(fn, args):
    n = fn(_config(args))
    if not isinstance(n, int) or isinstance(n, bool):
        raise TypeError(f"count_params should return an int, got {type(n).__name__}")
    return [torch.tensor(n)]


def _smol_count():
    from smol import SmolLM

    return lambda config: SmolLM(config).count_params()


# --- the model's weights, drawn
def _weights(g, module: nn.Module, dtype) -> dict:
    """A weight per parameter name of `module`: norm
    gains about 1 (trained ones are not all 1), matrices of std 1 / sqrt(fan-in)."""
    out = {}
    for name, p in module.named_parameters():
        if p.dim() == 1:
            w = 0.5 + torch.rand(*p.shape, generator=g)
        else:
            w = torch.randn(*p.shape, generator=g) / p.shape[-1] ** 0.5
        out[name] = w.to(dtype)
    return out


def _padding_mask(g, B: int, T: int) -> torch.Tensor:
    """(B, 1, T, T) bool: causal, each row's left padding hidden, each query sees
    itself."""
    pad = torch.randint(0, T, (B, 1), generator=g)
    real = torch.arange(T)[None] >= pad  # (B, T)
    q, k = torch.arange(T)[:, None], torch.arange(T)[None]
    return ((k <= q) & real[:, None, None, :]) | (k == q)


DTYPE_TOL = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (5e-2, 5e-2)}


def _logits_case(g) -> dict:
    from smol import SmolConfig, SmolLM

    fields = _config_fields(g)
    dtype = diff.pick(g, (torch.float32, torch.float32, torch.bfloat16))
    B, T = int(torch.randint(1, 4, (), generator=g)), diff.pick(g, (1, 2, 5, 9))
    model = SmolLM(SmolConfig(**fields, max_position_embeddings=32))
    weights = _weights(g, model, dtype)
    ids = torch.randint(0, fields["vocab_size"], (B, T), generator=g)
    return {
        "what": f"{_about(fields)}, {str(dtype).removeprefix('torch.')} weights, "
        f"input_ids {tuple(ids.shape)}",
        "args": {"input_ids": ids} | fields | weights,
        "grad": list(weights),
        "up": [torch.randn(B, T, fields["vocab_size"], generator=g)],
        "tol": DTYPE_TOL[dtype],
        "gtol": DTYPE_TOL[dtype],
        "dtype": True,
    }


class _Called(nn.Module):
    """fn(model, *args) as a module's forward: functional_call then hands the
    model the case's weights."""

    def __init__(self, fn, model):
        super().__init__()
        self.fn, self.model = fn, model

    def forward(self, *args):
        return self.fn(self.model, *args)


def _call_logits(fn, args):
    from smol import SmolLM

    model = SmolLM(_config(args))
    names = [n for n, _ in model.named_parameters()]
    weights = {f"model.{n}": args[n] for n in names}
    return [with_weights(_Called(fn, model), weights, args["input_ids"])]


def _smol_logits():
    return lambda model, input_ids: model(input_ids)[0]


# --- the decoder layer
def _layer_case(g) -> dict:
    from smol import SmolConfig
    from smol.model import DecoderLayer

    fields = _config_fields(g)
    dtype = diff.pick(g, (torch.float32, torch.float32, torch.bfloat16))
    B, T = int(torch.randint(1, 4, (), generator=g)), diff.pick(g, (1, 2, 5, 9))
    layer = DecoderLayer(SmolConfig(**fields), 0)
    weights = _weights(g, layer, dtype)
    scale = diff.pick(g, (1.0, 0.01))  # at 0.01, mean(x^2) is 1e-4: eps matters
    x = (torch.randn(B, T, fields["hidden_size"], generator=g) * scale).to(dtype)
    masked = diff.pick(g, (False, True))
    mask = _padding_mask(g, B, T)
    layer_idx = diff.pick(g, (0, 1))
    atol, rtol = DTYPE_TOL[dtype]
    return {
        "what": f"{_about(fields)}, layer_idx={layer_idx}, x {tuple(x.shape)} "
        f"{diff.dtype_name(x)} of scale {scale:g}, "
        + (f"padding mask {mask[:, 0, -1].int().tolist()}" if masked else "causal"),
        "args": {"x": x, "mask": mask, "masked": masked, "layer_idx": layer_idx}
        | fields
        | weights,
        "grad": ["x", *weights],
        "up": [torch.randn(*x.shape, generator=g)],
        "tol": (atol * scale, rtol),
        "gtol": (atol, rtol),
        "dtype": True,
    }


def _call_layer(cls, args):
    from smol.rope import RotaryEmbedding

    config, x = _config(args), args["x"]
    layer = cls(config, args["layer_idx"])
    rope = RotaryEmbedding(config.head_dim, config.rope_theta, 32)
    cos, sin = rope(x.shape[1], torch.device("cpu"))
    mask = args["mask"] if args["masked"] else None
    weights = {k: v for k, v in args.items() if "." in k}  # smol's layer's names
    return [with_weights(layer, weights, x, cos, sin, mask, mask is None)]


def _smol_layer():
    from smol.model import DecoderLayer

    return DecoderLayer


for task, make, call, reference, hint in (
    (
        "count_params",
        _count_case,
        _call_count,
        _smol_count,
        "the config named below gives another count than SmolLM's: every size from "
        "the config (key/value heads of head_dim each, the MLP's width, the depth), "
        "two norms a layer and the final one, the head once more only when untied",
    ),
    (
        "forward_logits",
        _logits_case,
        _call_logits,
        _smol_logits,
        "the case named below differs from SmolLM's logits in a value, the dtype or "
        "the gradient of a parameter: the model's own modules in order, tables from "
        "model.model.rotary_emb(T, device), nothing taken from a config of your own "
        "(theta, eps, sizes), in the model's dtype",
    ),
    (
        "decoder_layer_bug",
        _layer_case,
        _call_layer,
        _smol_layer,
        "the case named below differs from smol.model.DecoderLayer in a value, the "
        "dtype or the gradient of x or a parameter: RMSNorm(config.hidden_size, "
        "config.rms_norm_eps) (eps counts where activations are small), each norm "
        "before its own sublayer, the mask and is_causal passed on",
    ),
):
    diff.register(task, NAME, 1, hint, make, call, reference, CASES)
