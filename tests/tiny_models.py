"""Small models the tests share, and the same random LoRA in smol's model and peft's."""

import torch

from smol import SmolConfig, SmolLM
from smol.lora import lora_layers

SHAPE = (
    "vocab_size hidden_size intermediate_size num_hidden_layers num_attention_heads "
    "num_key_value_heads max_position_embeddings"
).split()


def config(*shape: int, **settings) -> SmolConfig:
    """A SmolConfig from one row: vocab, width, MLP width, layers, heads, KV heads,
    context; other fields (rope_theta, tie_word_embeddings, ...) by name."""
    if len(shape) != len(SHAPE):
        raise TypeError(f"expected {len(SHAPE)} numbers ({', '.join(SHAPE)})")
    return SmolConfig(**dict(zip(SHAPE, shape)), **settings)


def with_real_vocab(max_position_embeddings: int = 256) -> SmolConfig:
    """A model small enough for a CPU, with SmolLM2's vocabulary so that its tokenizer
    fits."""
    return config(49152, 32, 64, 2, 4, 2, max_position_embeddings)


@torch.no_grad()
def peaked(config: SmolConfig, seed: int = 0) -> SmolLM:
    """A random model in eval mode whose matrices are scaled up 8x, so that its
    predictions are peaked and varied instead of near-uniform (greedy decoding then
    tests something)."""
    torch.manual_seed(seed)
    model = SmolLM(config).eval()
    for p in model.parameters():
        p.mul_(8 if p.dim() > 1 else 1)
    return model


def same_random_lora(model, theirs: dict, seed: int) -> None:
    """The same random, nonzero A and B (drawn from `seed`) in the LoRA layers of
    smol's `model` and in peft's parameters `theirs` (its named_parameters)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, layer in lora_layers(model).items():
            for part in ("lora_A", "lora_B"):
                value = torch.randn(getattr(layer, part).shape, generator=g) * 0.1
                getattr(layer, part).copy_(value)
                theirs[f"base_model.model.{name}.{part}.default.weight"].copy_(value)
