"""smol: SmolLM2-135M built from scratch in PyTorch."""

import warnings

with warnings.catch_warnings():
    # In a Jupyter kernel without ipywidgets, importing tqdm.auto warns "IProgress not
    # found" (once: the module is cached) and falls back to text progress bars, which
    # is all a notebook of this course needs. Importing it here, quietly, keeps that
    # notice out of every notebook that imports smol before transformers or
    # huggingface_hub, which import tqdm.auto themselves.
    warnings.filterwarnings("ignore", message="IProgress not found")
    import tqdm.auto  # noqa: F401

from smol.config import SmolConfig
from smol.model import SmolLM

# `generate` stays in smol.generate: exported here, the function would hide that module.
__all__ = ["SmolConfig", "SmolLM", "load_pretrained"]
__version__ = "0.1.0"


def __getattr__(name: str):
    # load_pretrained on first use (PEP 562): the weight loader pulls in the GGUF
    # reader, the tokenizer and jinja2, which `import smol.norm` should not pay for.
    if name == "load_pretrained":
        from smol.pretrained import load_pretrained

        return load_pretrained
    raise AttributeError(f"module 'smol' has no attribute {name!r}")
