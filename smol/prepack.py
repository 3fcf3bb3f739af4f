"""Float32 weights laid out once for the CPU's matrix kernel, instead of on every call.

A CPU matrix product reads the weight in the blocked order its vector loop wants.
`F.linear` in float32 (MKL's sgemm on x86) copies each weight into that order on every
call, which pays off when many rows of activations share the copy, as in training. A
decode step has one row, a speculative check a handful, and then the copy costs more
than the product (bench/prepack.py times both ways). oneDNN can reorder a weight once,
ahead of time, into a layout its kernel reads as it is (torch.compile's CPU backend
does so when it freezes a model): `prepack(model)` is an inference-only copy of a model
with every float32 Linear reordered so. Its logits are float32's, summed in another
order: equal to a few millionths of the largest logit, not bit for bit."""

from __future__ import annotations

import copy

import torch
from torch import nn

# the number of rows oneDNN lays a weight out for; any number of rows runs
ROWS_HINT = 16


def available() -> bool:
    """Whether this torch build has oneDNN's CPU kernels (x86-64 and arm64 builds)."""
    return torch.backends.mkldnn.is_available() and hasattr(
        torch.ops.mkldnn, "_reorder_linear_weight"
    )


def _require_onednn() -> None:
    if not available():
        raise RuntimeError(
            "this torch build lacks oneDNN (torch.backends.mkldnn): no prepacked "
            "weights; use the model as it is"
        )


class PackedLinear(nn.Module):
    """A bias-free float32 Linear for the CPU, its weight (out, in) reordered by oneDNN
    once. Inference only: the reordered weight is not a parameter (it has no gradient
    and no state-dict entry), and `weight()` gives the plain matrix back."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        _require_onednn()
        if weight.dim() != 2 or weight.dtype != torch.float32:
            raise ValueError(
                f"PackedLinear takes a 2-d float32 weight (out, in), got "
                f"{weight.dim()}-d {weight.dtype}"
            )
        if weight.device.type != "cpu":
            raise ValueError(
                f"PackedLinear runs on the CPU, got a weight on {weight.device}"
            )
        self.out_features, self.in_features = weight.shape
        self.packed = torch.ops.mkldnn._reorder_linear_weight(
            weight.detach().contiguous(), ROWS_HINT
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., in) -> (..., out)
        if x.device.type != "cpu" or x.dtype != torch.float32:
            raise ValueError(
                f"PackedLinear takes float32 inputs on the CPU, got {x.dtype} on "
                f"{x.device}"
            )
        if x.shape[-1] != self.in_features:
            raise ValueError(
                f"expected inputs of {self.in_features} features, got shape "
                f"{tuple(x.shape)}"
            )
        y = torch.ops.mkldnn._linear_pointwise(
            x.reshape(-1, self.in_features), self.packed, None, "none", [], ""
        )
        return y.reshape(*x.shape[:-1], self.out_features)

    def weight(self) -> torch.Tensor:
        """The weight (out, in) as a plain float32 tensor."""
        return self.packed.to_dense()

    def __deepcopy__(self, memo):  # an opaque oneDNN tensor has no storage to copy
        return PackedLinear(self.weight())

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            "prepacked"
        )


@torch.no_grad()
def prepack(model: nn.Module) -> nn.Module:
    """An inference-only copy of `model` (on the CPU, in float32) whose Linears, the
    tied head included, are PackedLinears; the model itself is left as it is. In eval
    mode; it decodes (generate, speculative_greedy) like the model, but neither trains
    nor saves a state dict."""
    _require_onednn()
    linears = [n for n, m in model.named_modules() if type(m) is nn.Linear]
    if not linears:
        raise ValueError(f"{type(model).__name__} has no nn.Linear to prepack")
    for name in linears:
        module = model.get_submodule(name)
        if module.bias is not None:
            raise ValueError(f"{name} has a bias: prepack takes bias-free Linears")
        weight = module.weight
        if weight.dtype != torch.float32 or weight.device.type != "cpu":
            raise ValueError(
                f"{name} is {weight.dtype} on {weight.device}: prepack takes a float32 "
                "model on the CPU"
            )
    packed = copy.deepcopy(model)
    for name in linears:
        parent, _, child = name.rpartition(".")
        weight = packed.get_submodule(name).weight
        setattr(packed.get_submodule(parent), child, PackedLinear(weight))
    return packed.eval()
