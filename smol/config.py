"""The model's hyperparameters: one dataclass, with presets, named as Hugging Face's
LlamaConfig; and generation's settings, one dataclass named as its GenerationConfig."""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SmolConfig:
    vocab_size: int = 49152
    hidden_size: int = 576  # the width of the residual stream
    intermediate_size: int = 1536  # the SwiGLU hidden size
    num_hidden_layers: int = 30
    num_attention_heads: int = 9
    num_key_value_heads: int = 3  # fewer than the query heads: grouped-query attention
    max_position_embeddings: int = 8192
    rope_theta: float = 100000.0
    rms_norm_eps: float = 1e-5
    initializer_range: float = (
        0.041666666666666664  # 1/sqrt(576), as SmolLM2-135M was released
    )
    tie_word_embeddings: bool = True
    attn_implementation: str = (
        "sdpa"  # "sdpa" (fused kernels) or "eager" (explicit softmax)
    )

    def __post_init__(self):
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "max_position_embeddings",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by "
                f"num_attention_heads ({self.num_attention_heads})"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be divisible "
                "by "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(
                f"head_dim ({self.head_dim}) must be even: RoPE rotates pairs of "
                "features"
            )
        for name in ("rope_theta", "rms_norm_eps", "initializer_range"):
            value = getattr(self, name)
            if not (
                isinstance(value, numbers.Real)
                and not isinstance(value, bool)
                and math.isfinite(value)
                and value > 0
            ):
                raise ValueError(
                    f"{name} must be a positive finite number, got {value!r}"
                )
        if not isinstance(self.tie_word_embeddings, bool):
            raise ValueError(
                "tie_word_embeddings must be True or False, got "
                f"{self.tie_word_embeddings!r}"
            )
        if self.attn_implementation not in ("sdpa", "eager"):
            raise ValueError(
                "attn_implementation must be 'sdpa' or 'eager', got "
                f"{self.attn_implementation!r}"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def n_rep(self) -> int:
        """How many query heads share one key/value head."""
        return self.num_attention_heads // self.num_key_value_heads

    @classmethod
    def preset(cls, name: str, **overrides) -> SmolConfig:
        if name not in PRESETS:
            raise KeyError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
        return dataclasses.replace(PRESETS[name], **overrides)

    def replace(self, **changes) -> SmolConfig:
        return dataclasses.replace(self, **changes)

    def to_hf_dict(self) -> dict[str, Any]:
        """The fields of a Hugging Face `config.json` for `LlamaForCausalLM`."""
        d = dataclasses.asdict(self)
        d.pop("attn_implementation")
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            **d,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
            "torch_dtype": "float32",
        }

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> SmolConfig:
        """Read a Hugging Face Llama `config.json` (as a dict), refusing what smol does
        not model."""
        if d.get("model_type", "llama") != "llama":
            raise ValueError(
                "expected a Llama config (model_type 'llama'), got "
                f"{d.get('model_type')!r}"
            )
        if (
            d.get("hidden_act", "silu") != "silu"
            or d.get("attention_bias")
            or d.get("mlp_bias")
        ):
            raise ValueError(
                "smol models SiLU-gated MLPs without biases; this config differs"
            )
        rope = d.get("rope_scaling") or d.get("rope_parameters") or {}
        if rope.get("rope_type", rope.get("type", "default")) != "default":
            raise ValueError(f"smol implements plain RoPE; this config asks for {rope}")
        theta = d.get("rope_theta", rope.get("rope_theta", 10000.0))
        head_dim = d.get("head_dim")
        if (
            head_dim is not None
            and head_dim * d["num_attention_heads"] != d["hidden_size"]
        ):
            raise ValueError(
                f"head_dim {head_dim} * heads {d['num_attention_heads']} != "
                f"hidden_size {d['hidden_size']}"
            )
        names = {f.name for f in dataclasses.fields(cls)} - {
            "rope_theta",
            "attn_implementation",
        }
        values = {k: d[k] for k in names if k in d}
        values.setdefault("num_key_value_heads", d["num_attention_heads"])
        return cls(rope_theta=float(theta), **values)


PRESETS: dict[str, SmolConfig] = {
    "smollm2-135m": SmolConfig(),
    # Small enough to train on a laptop CPU in a minute; the vocabulary fits a BPE
    # trained on the bundled corpus.
    "tiny": SmolConfig(
        vocab_size=4096,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rope_theta=10000.0,
        initializer_range=0.02,
    ),
}


# the smallest temperature but 0: below it logits / temperature overflow float32 for
# logits in the hundreds, and sampling is greedy in all but name
MIN_TEMPERATURE = 1e-6


@dataclass(frozen=True)
class GenerationConfig:
    """How smol.generate.generate continues a text, each field checked once, here.
    eos_token_id is checked against the model's vocabulary when generate runs."""

    max_new_tokens: int
    temperature: float = 1.0  # 0 is greedy
    top_k: int | None = None
    top_p: float | None = None
    eos_token_id: int | tuple[int, ...] | None = None  # a row ends at any of them
    use_cache: bool = True  # False: each step reruns the whole sequence
    compile: bool | str = False  # a compiled StaticCache; a str names the backend
    compile_mode: str | None = None  # torch.compile's mode, e.g. "reduce-overhead"
    speculative: int = 0  # greedy speculative decoding: up to this many drafts a step

    def __post_init__(self):
        n, t, k, p = self.max_new_tokens, self.temperature, self.top_k, self.top_p
        if not _is_int(n):
            raise TypeError(f"max_new_tokens must be an int, got {n!r}")
        _require(n >= 0, "max_new_tokens must be >= 0", n)
        number = isinstance(t, numbers.Real) and not isinstance(t, bool)
        _require(
            number and 0 <= t < math.inf, "temperature must be a finite number >= 0", t
        )
        _require(
            not 0 < t < MIN_TEMPERATURE,
            f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE:g}",
            t,
        )
        _require(
            k is None or _is_int(k) and k >= 1,
            "top_k must be a positive int or None",
            k,
        )
        number = isinstance(p, numbers.Real) and not isinstance(p, bool)
        _require(
            p is None or number and 0 <= p <= 1,
            "top_p must lie in [0, 1] or be None",
            p,
        )
        if isinstance(self.eos_token_id, list):
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
        _require(
            isinstance(self.use_cache, bool),
            "use_cache must be True or False",
            self.use_cache,
        )
        c, mode, s = self.compile, self.compile_mode, self.speculative
        _require(
            isinstance(c, bool) or isinstance(c, str) and c,
            "compile must be True, False or a backend's name",
            c,
        )
        _require(
            mode is None or isinstance(mode, str),
            "compile_mode must be a str or None",
            mode,
        )
        _require(
            _is_int(s) and s >= 0,
            "speculative must be a number of draft tokens >= 0",
            s,
        )
        if c and s:
            raise ValueError(
                "compile=True and speculative decoding do not combine: the verifying "
                "step's length changes, so a compiled step would be traced again"
            )
        if (c or s) and not self.use_cache:
            raise ValueError(
                "compile and speculative decoding keep their own cache: pass neither "
                "kv_cache nor use_cache=False with them"
            )
        if s and t != 0:
            raise ValueError(
                f"speculative decoding is greedy: use temperature=0, got {t}"
            )

    @classmethod
    def build(
        cls, config: GenerationConfig | None = None, **settings
    ) -> GenerationConfig:
        """`config` with `settings` (fields of GenerationConfig) put in its place, or,
        without one, a GenerationConfig of `settings`."""
        fields = {f.name for f in dataclasses.fields(cls)}
        for name in settings:
            if name not in fields:
                raise TypeError(
                    f"{name!r} is not a setting of generation; the settings are "
                    f"{', '.join(sorted(fields))}"
                )
        if config is None:
            if "max_new_tokens" not in settings:
                raise TypeError(
                    "max_new_tokens is missing: how many tokens may follow?"
                )
            return cls(**settings)
        if not isinstance(config, cls):
            raise TypeError(
                f"config must be a GenerationConfig, got {type(config).__name__}"
            )
        return dataclasses.replace(config, **settings)

    def replace(self, **changes) -> GenerationConfig:
        return GenerationConfig.build(self, **changes)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _require(ok: bool, what: str, value) -> None:
    """A ValueError naming the field (`what` starts with its name) and its value."""
    if not ok:
        raise ValueError(f"{what}, got {value!r}")
