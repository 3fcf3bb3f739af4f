"""smol: SmolLM2-135M built from scratch in PyTorch."""

from smol.config import SmolConfig
from smol.model import SmolLM

__all__ = ["SmolConfig", "SmolLM"]
__version__ = "0.1.0"
