"""Grouped-query attention (Ainslie et al., 2023) on F.scaled_dot_product_attention."""

import math

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from torch import nn

from smol.config import SmolConfig
from smol.rope import apply_rope


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(B, H_kv, T, D) -> (B, H_kv * n_rep, T, D): query head h reads key/value head h
    // n_rep.

    Each key/value head is repeated in place (k0 k0 k0 k1 k1 k1 ...), as
    `repeat_interleave` does. Tiling (k0 k1 k2 k0 k1 k2 ...) runs and trains, but pairs
    pretrained heads wrongly."""
    if n_rep == 1:
        return x
    return repeat(x, "b h t d -> b (h r) t d", r=n_rep)


def eager_attention(q, k, v, mask=None, is_causal=False):
    """Attention with an explicit softmax. q (B, H, Tq, D), k/v (B, H, Tk, D), mask bool
    (B, 1, Tq, Tk)."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, Tq, Tk)
    if is_causal:
        tq, tk = scores.shape[-2:]
        causal = torch.ones(tq, tk, dtype=torch.bool, device=q.device).tril(
            diagonal=tk - tq
        )
        scores = scores.masked_fill(~causal, float("-inf"))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.float().softmax(dim=-1).to(q.dtype)  # softmax in fp32
    return weights @ v  # (B, H, Tq, D)


def sdpa_uses_gqa(q: torch.Tensor) -> bool:
    """SDPA's enable_gqa skips the copy on CPU and in the fused CUDA kernels (half
    precision on Ampere or newer); elsewhere (fp32 on CUDA, a T4) it falls back to the
    slow math kernel."""
    if q.device.type == "cpu":
        return True
    return (
        q.device.type == "cuda"
        and q.dtype in (torch.float16, torch.bfloat16)
        and torch.cuda.get_device_capability(q.device) >= (8, 0)
    )


def grouped_decode_attention(q, k, v, mask, n_rep: int) -> torch.Tensor:
    """Attention of one new token: q (B, H, 1, D), k/v (B, H_kv, Tk, D), mask bool
    (B, 1, 1, Tk) or None -> (B, H, 1, D).

    The n_rep query heads that share a key/value head become n_rep queries of that
    head, (B, H_kv, n_rep, D), so the kernel reads each key/value head once, not once
    per query head (in bfloat16 on a CPU without bfloat16 arithmetic, converting it
    each time: chapter 9 times both ways)."""
    q = rearrange(q, "b (h r) 1 d -> b h r d", r=n_rep)
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return rearrange(y, "b h r d -> b (h r) 1 d")


class Attention(nn.Module):
    def __init__(self, config: SmolConfig, layer_idx: int = 0):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_heads, self.n_kv_heads = (
            config.num_attention_heads,
            config.num_key_value_heads,
        )
        self.head_dim, self.n_rep = config.head_dim, config.n_rep
        self.implementation = config.attn_implementation
        self.q_proj = nn.Linear(
            config.hidden_size, self.n_heads * self.head_dim, bias=False
        )
        self.k_proj = nn.Linear(
            config.hidden_size, self.n_kv_heads * self.head_dim, bias=False
        )
        self.v_proj = nn.Linear(
            config.hidden_size, self.n_kv_heads * self.head_dim, bias=False
        )
        self.o_proj = nn.Linear(
            self.n_heads * self.head_dim, config.hidden_size, bias=False
        )
        # writes into the residual stream: init scaled by depth
        self.o_proj.scaled_init = True

    def forward(self, x, cos, sin, mask=None, is_causal=True, kv_cache=None):
        """x (B, T, C); mask bool (B, 1, T, Tk) or None; with a cache, Tk counts cached
        tokens too."""
        # (B, H, T, D)
        q = rearrange(self.q_proj(x), "b t (h d) -> b h t d", d=self.head_dim)
        # (B, H_kv, T, D)
        k = rearrange(self.k_proj(x), "b t (h d) -> b h t d", d=self.head_dim)
        # (B, H_kv, T, D)
        v = rearrange(self.v_proj(x), "b t (h d) -> b h t d", d=self.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if kv_cache is not None:
            # (B, H_kv, Tk, D): cached + new
            k, v = kv_cache.update(self.layer_idx, k, v)
        if self.implementation == "eager":
            y = eager_attention(
                q, repeat_kv(k, self.n_rep), repeat_kv(v, self.n_rep), mask, is_causal
            )
        elif q.shape[2] == 1 and not is_causal:
            y = grouped_decode_attention(q, k, v, mask, self.n_rep)
        elif sdpa_uses_gqa(q):
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=is_causal, enable_gqa=True
            )
        else:
            k, v = repeat_kv(k, self.n_rep), repeat_kv(v, self.n_rep)
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=is_causal
            )
        return self.o_proj(rearrange(y, "b h t d -> b t (h d)"))  # (B, T, C)
