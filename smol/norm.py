"""RMSNorm (Zhang & Sennrich, 2019): LayerNorm without the mean, computed in float32."""

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., dim)
        dtype = x.dtype
        # squares of bf16 activations overflow and round badly: normalise in fp32
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)  # cast back, then scale
