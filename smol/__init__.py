"""smol: SmolLM2-135M built from scratch in PyTorch."""

from smol.config import SmolConfig
from smol.generate import generate
from smol.model import SmolLM

__all__ = ["SmolConfig", "SmolLM", "generate"]
__version__ = "0.1.0"
