"""The SwiGLU feed-forward block (Shazeer, 2020)."""

import torch
import torch.nn.functional as F
from torch import nn

from smol.config import SmolConfig


class MLP(nn.Module):
    def __init__(self, config: SmolConfig):
        super().__init__()
        self.gate_proj = nn.Linear(
            config.hidden_size, config.intermediate_size, bias=False
        )
        self.up_proj = nn.Linear(
            config.hidden_size, config.intermediate_size, bias=False
        )
        self.down_proj = nn.Linear(
            config.intermediate_size, config.hidden_size, bias=False
        )
        # writes into the residual stream: init scaled by depth
        self.down_proj.scaled_init = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, C) -> (B, T, C)
        # gate (B, T, F) * up (B, T, F)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
