"""smol: SmolLM2-135M built from scratch in PyTorch."""

from smol.config import SmolConfig
from smol.model import SmolLM

# `generate` stays in smol.generate: exported here, the function would hide that module.
__all__ = ["SmolConfig", "SmolLM", "load_pretrained"]
__version__ = "0.1.0"


def __getattr__(name: str):
    # load_pretrained on first use (PEP 562): the weight loader pulls in the GGUF reader, the
    # tokenizer and jinja2, which `import smol.norm` should not pay for.
    if name == "load_pretrained":
        from smol.pretrained import load_pretrained

        return load_pretrained
    raise AttributeError(f"module 'smol' has no attribute {name!r}")
