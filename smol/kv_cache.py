"""The key/value cache: every layer's keys and values, kept across generation steps."""

from __future__ import annotations

import torch

from smol.config import SmolConfig


class KVCache:
    """Keys and values of every layer, preallocated for `max_len` positions.

    The model reads `length` (tokens cached so far), each attention layer calls `update`
    with the new tokens' keys and values and gets back all of them, and the model calls
    `advance` once every layer has written."""

    def __init__(
        self,
        config: SmolConfig,
        batch_size: int,
        max_len: int,
        device=None,
        dtype=torch.float32,
    ):
        if not isinstance(config, SmolConfig):
            raise TypeError(f"config must be a SmolConfig, got {type(config).__name__}")
        for name, n in (("batch_size", batch_size), ("max_len", max_len)):
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise ValueError(f"{name} must be a positive int, got {n!r}")
        if max_len > config.max_position_embeddings:
            raise ValueError(
                f"a cache of {max_len} positions is longer than the context "
                f"(max_position_embeddings={config.max_position_embeddings})"
            )
        if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
        shape = self.shape(config, batch_size, max_len)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.max_len = max_len
        self.length = 0

    @classmethod
    def for_model(cls, model, batch_size: int, max_len: int) -> KVCache:
        """A cache for `model`: its config, and the device and dtype of its weights (its
        token embedding's)."""
        weight = model.model.embed_tokens.weight
        return cls(
            model.config, batch_size, max_len, device=weight.device, dtype=weight.dtype
        )

    @staticmethod
    def shape(config: SmolConfig, batch_size: int, max_len: int) -> tuple[int, ...]:
        """(layers, B, H_kv, max_len, D): one tensor holds every layer's keys (and one
        their values)."""
        L, H_kv, D = (
            config.num_hidden_layers,
            config.num_key_value_heads,
            config.head_dim,
        )
        return (L, batch_size, H_kv, max_len, D)

    def update(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor):
        """Store k, v (B, H_kv, T, D) after the cached tokens; return (B, H_kv, length +
        T, D) each."""
        end = self.length + k.shape[2]
        if end > self.max_len:
            raise ValueError(
                f"KV cache is full: {self.length} cached + {k.shape[2]} new > "
                f"{self.max_len}"
            )
        self.k[layer_idx, :, :, self.length : end] = k
        self.v[layer_idx, :, :, self.length : end] = v
        return self.k[layer_idx, :, :, :end], self.v[layer_idx, :, :, :end]

    def advance(self, n: int) -> None:
        self.length += n
