"""smol: SmolLM2-135M built from scratch in PyTorch."""

from smol.config import SmolConfig
from smol.generate import generate
from smol.model import SmolLM
from smol.pretrained import load_pretrained

__all__ = ["SmolConfig", "SmolLM", "generate", "load_pretrained"]
__version__ = "0.1.0"
