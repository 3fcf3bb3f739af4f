"""The reference smol proves itself against: transformers' LlamaForCausalLM, built for a
SmolConfig.

For parity tests and benchmarks; transformers is a test dependency, imported only
when called.
"""

from __future__ import annotations

from smol.config import SmolConfig


def llama_config(config: SmolConfig, attn_implementation: str | None = "sdpa"):
    """transformers' LlamaConfig with the same shapes, context, RoPE and norm
    settings."""
    from transformers import LlamaConfig

    if not isinstance(config, SmolConfig):
        raise TypeError(f"expected a SmolConfig, got {type(config).__name__}")
    hf = {
        k: v
        for k, v in config.to_hf_dict().items()
        if k not in ("architectures", "torch_dtype")
    }
    return LlamaConfig(**hf, attn_implementation=attn_implementation)


def llama_twin(config: SmolConfig, attn_implementation: str | None = "sdpa"):
    """A randomly initialised LlamaForCausalLM of the same shape as SmolLM(config),
    whose state dict loads strictly into SmolLM(config), and back."""
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM(llama_config(config, attn_implementation))
