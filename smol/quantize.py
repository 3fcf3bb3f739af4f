"""Weight-only int8 quantization: each Linear's weight as int8 with one scale per output
channel.

At batch size 1 a decode step reads every weight once and does two FLOPs with it, so its
time is set by how many bytes the weights take. Storing them as int8 reads a quarter of
float32's bytes (half of bfloat16's); the activations stay in floating point, and the
product is rescaled."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def quantize_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight (out, in) float -> (q int8 (out, in), scale float32 (out,)) with weight ~
    q * scale.

    Symmetric: each row's largest |value| maps to 127, zero stays exactly zero.
    """
    if weight.dim() != 2 or not weight.is_floating_point():
        raise ValueError(
            f"expected a 2-d floating-point weight (out, in), got "
            f"{weight.dim()}-d {weight.dtype}"
        )
    w = weight.float()
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127  # (out,)
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def _int8_kernel(x: torch.Tensor, q: torch.Tensor) -> bool:
    """Whether to multiply with PyTorch's fused int8 weight-only kernel: on CUDA, and on
    a CPU for bfloat16 and float16 activations.

    Its CPU float32 loop is slow: converting the int8 weight to float32 for each call
    is faster (a 576 x 1536 weight, one thread, an AVX2 CPU: 0.5 ms against 1.6 ms for
    one token, 1.7 ms against 64 ms for a 40-token prompt)."""
    on_device = x.device.type == "cuda" or (
        x.device.type == "cpu" and x.dtype != torch.float32
    )
    return (
        hasattr(torch.ops.aten, "_weight_int8pack_mm")
        and on_device
        and x.dtype in (torch.float32, torch.bfloat16, torch.float16)
        and q.shape[1] % 32 == 0
    )


class QuantLinear(nn.Module):
    """A bias-free Linear whose weight is int8 (out, in) with float scales (out,).

    y = (x @ q.T) * scale: the scale factors out of each output's dot product, so the
    int8 matrix is used as it is, and no float copy of the weight is ever kept.
    """

    def __init__(
        self, q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32
    ):
        super().__init__()
        if q.dtype != torch.int8 or q.dim() != 2:
            raise ValueError(
                f"expected an int8 weight (out, in), got {q.dim()}-d {q.dtype}"
            )
        if scale.shape != q.shape[:1]:
            raise ValueError(
                f"expected one scale per output channel {tuple(q.shape[:1])}, "
                f"got {tuple(scale.shape)}"
            )
        self.in_features, self.out_features = q.shape[1], q.shape[0]
        self.register_buffer("weight", q)
        self.register_buffer("scale", scale.to(dtype))

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> QuantLinear:
        if linear.bias is not None:
            raise ValueError(
                "QuantLinear holds bias-free layers (as every Linear in SmolLM2)"
            )
        q, scale = quantize_per_channel(linear.weight.detach())
        return cls(q, scale, dtype=linear.weight.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., in) -> (..., out)
        scale = self.scale.to(x.dtype)
        if _int8_kernel(x, self.weight):
            y = torch.ops.aten._weight_int8pack_mm(
                x.reshape(-1, self.in_features), self.weight, scale
            )
            return y.reshape(*x.shape[:-1], self.out_features)
        return F.linear(x, self.weight.to(x.dtype)) * scale

    def dequantize(self) -> torch.Tensor:
        """The weight this layer multiplies by, as float32 (out, in)."""
        return self.weight.float() * self.scale.float()[:, None]

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


@torch.no_grad()
def quantize_int8_(model: nn.Module, include_head: bool = True) -> nn.Module:
    """Replace every nn.Linear of `model` by a QuantLinear, in place; return the model.

    The embedding stays as it is (a lookup reads one row per token). A head tied to the
    embedding gets its own int8 copy (include_head=False keeps it in floating point and
    tied).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected an nn.Module, got {type(model).__name__}")
    head = getattr(model, "lm_head", None)
    targets = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and (include_head or module is not head)
    ]
    if not targets:
        raise ValueError(
            "the model has no nn.Linear layers to quantize (already quantized?)"
        )
    if any(hasattr(module, "lora_A") for module in model.modules()):
        raise ValueError("the model holds LoRA adapters: merge_lora(model) first")
    for name, linear in targets:  # all checked before any layer changes
        if not torch.isfinite(linear.weight).all():
            raise ValueError(f"{name}.weight holds NaN or inf: int8 cannot hold it")
    for name, linear in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, QuantLinear.from_linear(linear))
    return model
