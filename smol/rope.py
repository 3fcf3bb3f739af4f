"""Rotary position embedding (Su et al., 2021) in the `rotate_half` (split halves)
convention."""

import torch
from torch import nn


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) on the two halves of the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (B, H, T, D) by cos/sin tables, (T, D) or (B, 1, T, D), in float32."""
    # in fp32, then back to x's dtype
    return (x * cos + rotate_half(x) * sin).to(x.dtype)


class RotaryEmbedding(nn.Module):
    """cos/sin tables in float32, built on first use and grown as longer sequences
    arrive.

    The tables are plain attributes, not buffers: `model.to(torch.bfloat16)` must not
    round them.
    """

    def __init__(self, head_dim: int, theta: float, max_positions: int):
        super().__init__()
        self.head_dim, self.theta, self.max_positions = head_dim, theta, max_positions
        self.cos = self.sin = None  # (cached_len, head_dim) each, once built

    def inv_freq(self, device=None) -> torch.Tensor:  # (head_dim/2,)
        exponents = (
            torch.arange(0, self.head_dim, 2, device=device, dtype=torch.float32)
            / self.head_dim
        )
        return 1.0 / self.theta**exponents

    def _build(self, length: int, device: torch.device) -> None:
        t = torch.arange(length, device=device, dtype=torch.float32)
        freqs = torch.outer(t, self.inv_freq(device))  # (length, D/2)
        # (length, D): the same angle for both halves
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos, self.sin = emb.cos(), emb.sin()

    def forward(
        self,
        length: int,
        device: torch.device,
        position_ids: torch.Tensor | None = None,
    ):
        """cos, sin for positions 0..length-1 ((length, D)), or gathered at position_ids
        (B, 1, T, D)."""
        if length > self.max_positions:
            raise ValueError(
                f"sequence of {length} positions is longer than the context "
                f"(max_position_embeddings={self.max_positions})"
            )
        if self.cos is None or self.cos.shape[0] < length or self.cos.device != device:
            cached = 0 if self.cos is None else self.cos.shape[0]
            self._build(min(self.max_positions, max(length, 2 * cached)), device)
        if position_ids is None:
            return self.cos[:length], self.sin[:length]
        return self.cos[position_ids].unsqueeze(1), self.sin[position_ids].unsqueeze(1)
