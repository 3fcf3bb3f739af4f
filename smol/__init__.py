"""smol: SmolLM2-135M built from scratch in PyTorch."""

from smol.config import SmolConfig
from smol.model import SmolLM
from smol.pretrained import load_pretrained

# `generate` stays in smol.generate: exported here, the function would hide that module.
__all__ = ["SmolConfig", "SmolLM", "load_pretrained"]
__version__ = "0.1.0"
