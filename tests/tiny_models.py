"""Small models the tests share."""

import torch

from smol import SmolConfig, SmolLM


def with_real_vocab(max_position_embeddings: int = 256) -> SmolConfig:
    """A model small enough for a CPU, with SmolLM2's vocabulary so that its tokenizer
    fits."""
    return SmolConfig(
        vocab_size=49152,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_position_embeddings,
    )


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
