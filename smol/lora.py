"""LoRA (Hu et al., 2021) by hand: low-rank adapters beside frozen linear layers.

A frozen weight W (out, in) gets a trainable update of rank r, W + (alpha / r) * B @ A,
with A (r, in) and B (out, r). B starts at zero, so the adapted model starts as the
model itself; merging folds the update back into W. Parameter names follow `peft`'s: a
wrapped layer holds `base_layer`, `lora_A` and `lora_B`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

# The linear layers of a decoder layer, by their Hugging Face names. The output head is
# left out: in SmolLM2 it is the (tied) embedding matrix.
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoRALinear(nn.Module):
    """base_layer(x) + (alpha / r) * B A dropout(x), with base_layer frozen."""

    def __init__(
        self, base_layer: nn.Linear, r: int, alpha: float, dropout: float = 0.0
    ):
        super().__init__()
        if not isinstance(base_layer, nn.Linear):
            raise TypeError(
                f"LoRALinear wraps an nn.Linear, got {type(base_layer).__name__}"
            )
        check_settings(r, alpha, dropout)
        self.base_layer = base_layer.requires_grad_(False)
        self.r, self.alpha = r, alpha
        self.scaling = alpha / r
        w = base_layer.weight
        self.lora_A = nn.Parameter(
            torch.empty(r, w.shape[1], device=w.device, dtype=w.dtype)
        )
        self.lora_B = nn.Parameter(
            torch.empty(w.shape[0], r, device=w.device, dtype=w.dtype)
        )
        self.lora_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """A Kaiming-uniform, as nn.Linear (and peft) initialise a weight; B zero."""
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., in) -> (..., out)
        h = F.linear(self.lora_dropout(x), self.lora_A)  # (..., r)
        return self.base_layer(x) + F.linear(h, self.lora_B) * self.scaling

    def delta_weight(self) -> torch.Tensor:
        """(alpha / r) * B @ A, (out, in): what the adapter adds to the weight."""
        return (self.lora_B @ self.lora_A) * self.scaling

    def merged(self) -> nn.Linear:
        """A plain nn.Linear holding W + (alpha / r) * B @ A (and the base's bias)."""
        base = self.base_layer
        w = base.weight
        out = nn.Linear(
            w.shape[1],
            w.shape[0],
            bias=base.bias is not None,
            device=w.device,
            dtype=w.dtype,
        )
        with torch.no_grad():
            out.weight.copy_(w + self.delta_weight())  # one rounding, as peft merges
            if base.bias is not None:
                out.bias.copy_(base.bias)
        fresh = set(vars(out))
        for name, value in vars(base).items():  # flags such as scaled_init
            if name not in fresh:
                setattr(out, name, value)
        return out

    def extra_repr(self) -> str:
        return f"r={self.r}, alpha={self.alpha}, scaling={self.scaling:g}"


def check_settings(r, alpha, dropout=0.0, targets=TARGETS) -> tuple[str, ...]:
    """The targets as a tuple (a str is one target), once LoRA's settings are checked:
    a ValueError names the first that cannot work."""
    if isinstance(targets, str):
        targets = (targets,)
    if not isinstance(targets, (tuple, list, set)):
        raise ValueError(f"targets must be layer names, got {targets!r}")
    targets = tuple(targets)
    if not targets:
        raise ValueError(f"targets is empty: name some of {', '.join(TARGETS)}")
    unknown = [t for t in targets if t not in TARGETS]
    if unknown:
        raise ValueError(
            f"unknown LoRA targets {unknown}: choose from {', '.join(TARGETS)}"
        )
    if not isinstance(r, int) or isinstance(r, bool) or r < 1:
        raise ValueError(f"the rank r must be an int >= 1, got {r!r}")
    if not (
        isinstance(alpha, (int, float))
        and not isinstance(alpha, bool)
        and 0 < alpha < math.inf  # not NaN
    ):
        raise ValueError(f"alpha must be a positive finite number, got {alpha!r}")
    if not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        raise ValueError(f"dropout must lie in [0, 1), got {dropout!r}")
    return targets


def lora_layers(model: nn.Module) -> dict[str, LoRALinear]:
    """Every LoRALinear of the model by name, e.g. `model.layers.0.self_attn.q_proj`."""
    return {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}


def apply_lora(
    model: nn.Module,
    r: int = 8,
    alpha: float = 16.0,
    targets=("q_proj", "v_proj"),
    dropout: float = 0.0,
) -> nn.Module:
    """Freeze every parameter of `model` and wrap each linear layer named in `targets`
    (see TARGETS) in a LoRALinear of rank r, in place; returns the model. Only A and B
    then train."""
    _check_module(model)
    targets = check_settings(r, alpha, dropout, targets)
    if lora_layers(model):
        raise ValueError(
            "this model already holds LoRA layers: merge_lora(model) first, "
            "or apply LoRA to a fresh model"
        )
    found = _linear_layers(model, targets)
    model.requires_grad_(False)
    for name, linear in found.items():
        parent, _, child = name.rpartition(".")
        setattr(
            model.get_submodule(parent), child, LoRALinear(linear, r, alpha, dropout)
        )
    return model


def _linear_layers(model: nn.Module, targets) -> dict[str, nn.Linear]:
    """The model's nn.Linear layers named in targets, by their full names."""
    found = {
        name: module
        for name, module in model.named_modules()
        if name.rpartition(".")[2] in targets and isinstance(module, nn.Linear)
    }
    if not found:
        raise ValueError(f"no nn.Linear named {targets} in this {type(model).__name__}")
    return found


def merge_lora(model: nn.Module) -> nn.Module:
    """Replace every LoRALinear by a plain nn.Linear holding W + (alpha / r) * B @ A, in
    place; every parameter becomes trainable again, as in a freshly built model. Returns
    the model."""
    _check_module(model)
    layers = lora_layers(model)
    if not layers:
        raise ValueError(
            "this model holds no LoRA layers: nothing to merge (apply_lora first)"
        )
    for name, layer in layers.items():
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, layer.merged())
    return model.requires_grad_(True)


def _check_module(model) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected a model (nn.Module), got {type(model).__name__}")


def count_trainable(model: nn.Module) -> tuple[int, int]:
    """(trainable, total) parameters; a shared (tied) tensor counts once."""
    params = list(model.parameters())
    trainable = sum(p.numel() for p in params if p.requires_grad)
    return trainable, sum(p.numel() for p in params)


# --- peft's adapter folder ---------------------------------------------------------
# What peft's PeftModel puts before the wrapped model's parameter names.
PEFT_PREFIX = "base_model.model."


def lora_config(model: nn.Module) -> dict:
    """r, alpha, dropout and target names of a model's adapters (which must agree)."""
    layers = lora_layers(model)
    if not layers:
        raise ValueError("this model holds no LoRA layers (apply_lora first)")
    settings = {
        (m.r, m.alpha, getattr(m.lora_dropout, "p", 0.0)) for m in layers.values()
    }
    if len(settings) > 1:
        raise ValueError(
            f"the adapters differ in (r, alpha, dropout): {sorted(settings)}"
        )
    r, alpha, dropout = settings.pop()
    targets = sorted({name.rpartition(".")[2] for name in layers})
    return {
        "r": r,
        "lora_alpha": alpha,
        "lora_dropout": dropout,
        "target_modules": targets,
    }


def save_peft_adapter(
    model: nn.Module, folder: str | Path, base_model_name_or_path: str | None = None
) -> Path:
    """Write the adapters as peft writes them: adapter_config.json and
    adapter_model.safetensors (keys `base_model.model.<layer>.lora_A.weight`), which
    `PeftModel.from_pretrained` loads onto transformers' LlamaForCausalLM; and
    manifest.json with both files' sha256, which load_peft_adapter checks."""
    from smol.checkpoint import write_manifest, write_safetensors

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        **lora_config(model),
        "base_model_name_or_path": base_model_name_or_path,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
    }
    (folder / "adapter_config.json").write_text(
        json.dumps(config, indent=2) + "\n", encoding="utf-8"
    )
    tensors = {}
    for name, layer in lora_layers(model).items():
        for part in ("lora_A", "lora_B"):
            value = getattr(layer, part).detach().float().contiguous().cpu()
            tensors[f"{PEFT_PREFIX}{name}.{part}.weight"] = value
    write_safetensors(tensors, folder / "adapter_model.safetensors")
    write_manifest(folder, ["adapter_config.json", "adapter_model.safetensors"])
    return folder


def load_peft_adapter(model: nn.Module, folder: str | Path) -> nn.Module:
    """Apply LoRA to `model` as a peft adapter folder describes it; load its A and B.
    The model is changed only once the folder is checked: its manifest.json (when smol
    wrote it), the settings, and the names, shapes and values of the weights."""
    from smol.checkpoint import read_json, read_safetensors, verify_saved

    _check_module(model)
    folder = Path(folder)
    path = folder / "adapter_config.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"no adapter_config.json in {folder}: expected a peft adapter folder"
        )
    verify_saved(folder, "adapter")
    config = read_json(path)
    r, alpha, targets, dropout = _adapter_settings(config, path)
    tensors = read_safetensors(folder / "adapter_model.safetensors")
    if lora_layers(model):
        raise ValueError("this model already holds LoRA layers: load onto a fresh one")
    shapes = {}  # what each weight of the adapter must be
    for name, linear in _linear_layers(model, targets).items():
        shapes[f"{PEFT_PREFIX}{name}.lora_A.weight"] = (r, linear.in_features)
        shapes[f"{PEFT_PREFIX}{name}.lora_B.weight"] = (linear.out_features, r)
    _check_adapter_weights(tensors, shapes, folder)
    apply_lora(model, r, alpha, targets, dropout)
    with torch.no_grad():
        for name, layer in lora_layers(model).items():
            for part in ("lora_A", "lora_B"):
                getattr(layer, part).copy_(
                    tensors[f"{PEFT_PREFIX}{name}.{part}.weight"]
                )
    return model


def _adapter_settings(config, path: Path) -> tuple:
    """(r, alpha, targets, dropout) of a peft adapter_config.json, checked."""
    if not isinstance(config, dict) or config.get("peft_type") != "LORA":
        found = config.get("peft_type") if isinstance(config, dict) else config
        raise ValueError(f"{path}: expected peft_type 'LORA', got {found!r:.60}")
    for key in ("use_rslora", "use_dora", "fan_in_fan_out"):
        if config.get(key) not in (None, False):
            raise ValueError(
                f"{path}: {key}={config[key]!r}: smol loads plain LoRA only"
            )
    missing = [k for k in ("r", "lora_alpha", "target_modules") if k not in config]
    if missing:
        raise ValueError(f"{path}: no {', '.join(missing)}")
    r, alpha = config["r"], config["lora_alpha"]
    dropout = config.get("lora_dropout", 0.0)
    try:
        targets = check_settings(r, alpha, dropout, config["target_modules"])
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    return r, alpha, targets, dropout


def _check_adapter_weights(tensors: dict, shapes: dict, folder: Path) -> None:
    """A ValueError naming what does not fit: missing, unexpected or mis-shaped
    weights, or values that are not finite."""
    missing = sorted(set(shapes) - set(tensors))
    unexpected = sorted(set(tensors) - set(shapes))
    if missing or unexpected:
        raise ValueError(
            f"{folder}: adapter weights do not fit this model: "
            f"{len(missing)} missing (e.g. {missing[:2]}), "
            f"{len(unexpected)} unexpected (e.g. {unexpected[:2]})"
        )
    for key, shape in shapes.items():
        value = tensors[key]
        if tuple(value.shape) != shape:
            raise ValueError(
                f"{folder}: {key} is {tuple(value.shape)}, this model needs {shape}"
            )
        if not torch.isfinite(value).all():
            raise ValueError(f"{folder}: {key} holds values that are not finite")
