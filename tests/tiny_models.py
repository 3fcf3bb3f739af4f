"""Small models the tests share."""

import torch

from smol import SmolConfig, SmolLM

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
