"""A static KV cache: every shape fixed in advance, so `torch.compile` traces one decode
step once.

`KVCache` slices its tensors to the tokens cached so far, so each step's shapes grow by
one and a compiled model would be traced again and again. `StaticCache` always hands
attention the whole preallocated cache and hides the slots not written yet with a mask;
which slot a token goes to and which position RoPE gives it arrive as tensors, not
Python ints. Every decode step then has the same shapes and the same code path: one
graph, compiled once (and on CUDA, replayed as a CUDA graph with
mode="reduce-overhead")."""

from __future__ import annotations

import torch
from torch import nn

from smol.kv_cache import KVCache


class StaticCache(nn.Module):
    """Runs `model` against a cache of `max_len` slots for `batch_size` sequences.

    `forward(input_ids, positions, slots, valid)`: input_ids (B, T) go to cache slots
    `slots` (T,) with RoPE positions `positions` (B, T); `valid` (B, T) is 0 for
    padding, which no later token attends to. Returns logits (B, T, V). The model's own
    layers do the work: this module only supplies the mask, the RoPE angles and a cache
    whose `update` writes in place.
    """

    def __init__(
        self,
        model,
        batch_size: int,
        max_len: int,
        compile: bool | str = False,
        mode: str | None = None,
    ):
        super().__init__()
        config = model.config
        if not 1 <= max_len <= config.max_position_embeddings:
            raise ValueError(
                f"max_len must lie in [1, {config.max_position_embeddings}] (the "
                f"context), got {max_len}"
            )
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        weight = model.model.embed_tokens.weight
        shape = KVCache.shape(config, batch_size, max_len)
        self.model = model
        self.batch_size, self.max_len = batch_size, max_len
        self.register_buffer(
            "k", torch.zeros(shape, device=weight.device, dtype=weight.dtype)
        )
        self.register_buffer(
            "v", torch.zeros(shape, device=weight.device, dtype=weight.dtype)
        )
        self.register_buffer(
            "valid",
            torch.zeros(batch_size, max_len, dtype=torch.bool, device=weight.device),
        )
        self.register_buffer("slot_ids", torch.arange(max_len, device=weight.device))
        cos, sin = model.model.rotary_emb(
            max_len, weight.device
        )  # (max_len, D) each, float32
        self.register_buffer("cos", cos.clone())
        self.register_buffer("sin", sin.clone())
        self.slots = None  # the slots of the tokens in flight, set by forward
        backend = (
            compile if isinstance(compile, str) else "inductor"
        )  # or "eager", "aot_eager"
        self.step = (
            torch.compile(self.forward, mode=mode, fullgraph=True, backend=backend)
            if compile
            else self.forward
        )

    def reset(self) -> None:
        """Forget every cached token (the slots' contents are masked, not erased)."""
        self.valid.zero_()

    def update(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor):
        """Write k, v (B, H_kv, T, D) to this step's slots; return the whole cache (B,
        H_kv, max_len, D) of this layer, as KVCache.update returns the cached part."""
        self.k[layer_idx].index_copy_(2, self.slots, k)
        self.v[layer_idx].index_copy_(2, self.slots, v)
        return self.k[layer_idx], self.v[layer_idx]

    def forward(self, input_ids, positions, slots, valid):
        self.valid.index_copy_(1, slots, valid.bool())
        self.slots = slots
        # A token sees the valid slots up to its own (causal), and always itself, so
        # that a padding token's row is never all masked (softmax would give NaN).
        slot_ids, here = self.slot_ids[None, :], slots[:, None]  # (1, L), (T, 1)
        seen = (slot_ids <= here) & self.valid[:, None, :]  # (B, T, L)
        mask = (seen | (slot_ids == here))[:, None]  # (B, 1, T, L)
        cos = self.cos[positions][:, None]  # (B, 1, T, D)
        sin = self.sin[positions][:, None]
        model = self.model
        x = model.model.embed_tokens(input_ids)  # (B, T, C)
        for layer in model.model.layers:
            x = layer(x, cos, sin, mask, False, self)
        return model.lm_head(model.model.norm(x))  # (B, T, V)


def static_cache_for(
    model,
    batch_size: int,
    length: int,
    compile: bool | str = True,
    mode: str | None = None,
) -> StaticCache:
    """The model's StaticCache for this batch size and at least `length` slots, made on
    first use and kept (with its compiled step) in the model's __dict__, outside its
    modules and state dict. Sizes are rounded up to a multiple of 256, so that nearby
    lengths share one compiled step."""
    max_len = min(model.config.max_position_embeddings, -(-length // 256) * 256)
    if length > max_len:
        raise ValueError(
            f"{length} positions are longer than the context "
            f"(max_position_embeddings={model.config.max_position_embeddings})"
        )
    weight = model.model.embed_tokens.weight
    key = (batch_size, max_len, compile, mode, weight.device, weight.dtype)
    caches = model.__dict__.setdefault("_static_caches", {})
    if key not in caches:
        caches[key] = StaticCache(
            model, batch_size, max_len, compile=compile, mode=mode
        )
    return caches[key]
