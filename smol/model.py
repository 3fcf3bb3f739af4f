"""SmolLM: the decoder layer and the model, with weight tying, scaled init and the
loss."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from smol.attention import Attention
from smol.config import SmolConfig
from smol.kv_cache import KVCache
from smol.mlp import MLP
from smol.norm import RMSNorm
from smol.rope import RotaryEmbedding

IGNORE_INDEX = -100  # targets with this value do not count in the loss


class DecoderLayer(nn.Module):
    """Pre-norm residual block: x + attention(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: SmolConfig, layer_idx: int = 0):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(
        self, x, cos, sin, mask=None, is_causal=True, kv_cache=None
    ):  # (B, T, C) -> (B, T, C)
        x = x + self.self_attn(
            self.input_layernorm(x), cos, sin, mask, is_causal, kv_cache
        )
        return x + self.mlp(self.post_attention_layernorm(x))


class SmolModel(nn.Module):
    """The decoder stack; named `model` inside SmolLM, as in Hugging Face's
    LlamaForCausalLM."""

    def __init__(self, config: SmolConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(config, i) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(
            config.head_dim, config.rope_theta, config.max_position_embeddings
        )


class SmolLM(nn.Module):
    def __init__(self, config: SmolConfig):
        super().__init__()
        self.config = config
        self.model = SmolModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.gradient_checkpointing = False
        self.tie_weights()
        self.reset_parameters()

    def tie_weights(self) -> None:
        """Share one matrix between the token embedding and the output head (Press &
        Wolf, 2017)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def reset_parameters(self) -> None:
        """N(0, std) everywhere; projections into the residual stream get std / sqrt(2 *
        n_layers) (GPT-2), since each layer adds two of them; norms start at one. A tied
        head is the embedding matrix itself, so it is initialised once, as the
        embedding."""
        std = self.config.initializer_range
        for module in self.modules():
            if isinstance(module, nn.Linear):
                if module.weight is self.model.embed_tokens.weight:
                    continue  # the tied head: already initialised as the embedding
                scale = (
                    math.sqrt(2 * self.config.num_hidden_layers)
                    if getattr(module, "scaled_init", False)
                    else 1.0
                )
                nn.init.normal_(module.weight, mean=0.0, std=std / scale)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=std)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)

    def count_params(self, non_embedding: bool = False) -> int:
        """Parameters, each shared tensor counted once; non_embedding leaves out the
        token embedding."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.model.embed_tokens.weight.numel() if non_embedding else n

    def forward(
        self,
        input_ids,
        targets=None,
        attention_mask=None,
        position_ids=None,
        kv_cache=None,
        logits_to_keep: int = 0,
    ):
        """input_ids (B, T) -> logits (B, T, V), and the mean cross-entropy against
        targets (B, T) (already shifted: targets[:, t] is the token after input_ids[:,
        t]; -100 is ignored) or None. When no target counts (all -100) the loss is 0,
        with zero gradients, not NaN.

        attention_mask (B, Tk) holds 1 for real tokens and 0 for padding, as
        transformers takes it (bool, or integers or floats that are all 0 or 1); Tk =
        T, plus the cached length when a kv_cache (a KVCache made for this model and
        batch) is given. A row of zeros is all padding: its logits are finite but
        meaningless, and targets of -100 leave it out of the loss. position_ids (B, T),
        if given, are each token's position (default: offset + 0..T-1). Values (ids,
        targets, positions, mask) are checked on CPU tensors only: elsewhere reading
        them back would stall the device. logits_to_keep > 0 computes the logits of
        only the last logits_to_keep positions (B, logits_to_keep, V): a prompt whose
        next token is all that counts skips the output head on the rest."""
        B, T = self._check_input_ids(input_ids)
        if (
            not isinstance(logits_to_keep, int)
            or isinstance(logits_to_keep, bool)
            or logits_to_keep < 0
        ):
            raise ValueError(
                f"logits_to_keep must be an int >= 0, got {logits_to_keep!r}"
            )
        if logits_to_keep and targets is not None:
            raise ValueError("the loss needs every position's logits: logits_to_keep=0")
        offset = self._check_kv_cache(kv_cache, B, input_ids.device)
        length = offset + T  # the positions the RoPE tables must cover
        if position_ids is not None:
            length = max(length, self._check_position_ids(position_ids, B, T))
        mask, is_causal = self._attention_mask(
            attention_mask, B, T, offset, input_ids.device
        )
        cos, sin = self.model.rotary_emb(length, input_ids.device, position_ids)
        if position_ids is None:
            cos, sin = cos[offset:], sin[offset:]
        x = self.model.embed_tokens(input_ids)  # (B, T, C)
        for layer in self.model.layers:
            if self.gradient_checkpointing and self.training:
                x = checkpoint(layer, x, cos, sin, mask, is_causal, use_reentrant=False)
            else:
                x = layer(x, cos, sin, mask, is_causal, kv_cache)
        if kv_cache is not None:
            kv_cache.advance(T)
        if logits_to_keep:
            x = x[:, -logits_to_keep:]  # (B, logits_to_keep, C)
        logits = self.lm_head(self.model.norm(x))  # (B, T, V)
        if targets is None:
            return logits, None
        self._check_targets(targets, input_ids.shape)
        total = F.cross_entropy(
            logits.flatten(0, 1).float(),
            targets.flatten(),
            ignore_index=IGNORE_INDEX,
            reduction="sum",
        )
        # the mean over counted targets; max(count, 1): no sync to ask whether any
        return logits, total / (targets != IGNORE_INDEX).sum().clamp(min=1)

    def _check_input_ids(self, input_ids) -> tuple[int, int]:
        _check_tensor("input_ids", input_ids, integer=True)
        if input_ids.dim() != 2:
            raise ValueError(
                "input_ids must have shape (batch, seq_len), got "
                f"{tuple(input_ids.shape)}"
            )
        if input_ids.shape[1] == 0:
            raise ValueError("input_ids is empty: need at least one token per sequence")
        # On a GPU an out-of-range id still stops the embedding lookup (a device-side
        # assert, less clear).
        _check_range("token ids", input_ids, 0, self.config.vocab_size)
        return input_ids.shape

    def _check_kv_cache(self, kv_cache, B: int, device) -> int:
        """The number of tokens kv_cache holds (0 without one), once its layers, batch,
        heads, dtype and device are those this model and batch write."""
        if kv_cache is None:
            return 0
        if not isinstance(kv_cache, KVCache):
            raise TypeError(
                f"kv_cache must be a KVCache, got {type(kv_cache).__name__}"
            )
        want = KVCache.shape(self.config, B, kv_cache.max_len)
        autocast = torch.is_autocast_enabled(device.type)
        dtype = (
            torch.get_autocast_dtype(device.type)
            if autocast
            else self.model.embed_tokens.weight.dtype
        )
        got = (tuple(kv_cache.k.shape), kv_cache.k.dtype, kv_cache.k.device)
        if got != (want, dtype, device):
            raise ValueError(
                "kv_cache does not fit this model and batch: it holds (layers, batch, "
                f"kv heads, positions, head dim) {got[0]} of {got[1]} on {got[2]}, "
                f"the model writes {want} of {dtype} on {device} "
                "(KVCache.for_model makes one that fits)"
            )
        return kv_cache.length

    def _check_position_ids(self, position_ids, B: int, T: int) -> int:
        """How many positions the RoPE tables must cover for position_ids (B, T): one
        past the largest on a CPU, where they are checked; the whole context on other
        devices, where reading them back would be a host sync."""
        _check_tensor("position_ids", position_ids, integer=True)
        if position_ids.shape != (B, T):
            raise ValueError(
                f"position_ids must have shape (batch, seq_len) = {(B, T)}, "
                f"got {tuple(position_ids.shape)}"
            )
        context = self.config.max_position_embeddings
        # a negative position would read the tables from their end
        hi = _check_range("position_ids", position_ids, 0, context)
        return context if hi is None else hi + 1

    def _check_targets(self, targets, shape) -> None:
        _check_tensor("targets", targets, integer=True)
        if targets.shape != shape:
            raise ValueError(
                f"targets must have the shape of input_ids {tuple(shape)}, "
                f"got {tuple(targets.shape)}"
            )
        if targets.is_cpu:  # an ignored target (-100) stands in as 0, in range
            counted = targets.masked_fill(targets == IGNORE_INDEX, 0)
            _check_range(
                "targets (other than -100)", counted, 0, self.config.vocab_size
            )

    def _attention_mask(self, attention_mask, B, T, offset, device):
        """(mask, is_causal) for SDPA: no mask and is_causal when plain causal attention
        will do, else a bool mask (B, 1, T, offset + T) that is causal and hides padded
        keys."""
        Tk = offset + T
        if attention_mask is None:
            if offset == 0:
                return None, True
            if T == 1:
                return None, False  # one new token sees every cached one
        elif not isinstance(attention_mask, torch.Tensor):
            _check_tensor("attention_mask", attention_mask)
        elif attention_mask.shape != (B, Tk):
            raise ValueError(
                "attention_mask must have shape (batch, "
                f"{'cached + ' if offset else ''}seq_len) "
                f"= {(B, Tk)}, got {tuple(attention_mask.shape)}"
            )
        elif attention_mask.is_complex():
            raise TypeError(
                "attention_mask must be a bool, integer or float tensor of 0 and 1, "
                f"got {attention_mask.dtype}"
            )
        elif (
            attention_mask.dtype != torch.bool
            and attention_mask.device.type == "cpu"
            and not torch.compiler.is_compiling()
        ):  # on a GPU reading values back is a sync
            odd = attention_mask[(attention_mask != 0) & (attention_mask != 1)]
            if odd.numel():
                raise ValueError(
                    "attention_mask must hold 0 (padding) and 1 (token), got "
                    f"{odd[0].item()}"
                )
        q_pos = torch.arange(offset, Tk, device=device)[:, None]  # (T, 1)
        k_pos = torch.arange(Tk, device=device)[None, :]  # (1, Tk)
        mask = (k_pos <= q_pos)[None, None]  # (1, 1, T, Tk): causal
        if attention_mask is not None:
            # Hide padded keys, but let every query see itself, so that a padding
            # query's row is never all -inf (which makes softmax return NaN). Real
            # tokens are unaffected.
            mask = mask & attention_mask.bool()[:, None, None, :] | (k_pos == q_pos)
        return mask, False

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """PyTorch's load, with an error that names every missing, unexpected and
        mis-shaped key. A tied model accepts a state dict without `lm_head.weight` (as
        tied checkpoints are saved)."""
        state_dict = dict(state_dict)
        if (
            self.config.tie_word_embeddings
            and "lm_head.weight" not in state_dict
            and "model.embed_tokens.weight" in state_dict
        ):
            state_dict["lm_head.weight"] = state_dict["model.embed_tokens.weight"]
        if strict:
            check_state_dict(self, state_dict)
        result = super().load_state_dict(state_dict, strict=strict, assign=assign)
        self.tie_weights()  # assign=True puts new tensors in place; share them again
        return result


def _check_tensor(name: str, value, integer: bool = False) -> None:
    """A TypeError unless value is a torch.Tensor (of integers, with integer)."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    kind = value.dtype
    if integer and (kind.is_floating_point or kind.is_complex or kind == torch.bool):
        raise TypeError(f"{name} must hold integers (torch.long), got {kind}")


def _check_range(name: str, values: torch.Tensor, lo: int, hi: int) -> int | None:
    """The largest of values (None when there are none or they are not checked), after
    checking that they lie in [lo, hi). Reading them back is free on a CPU, but on a
    GPU it is a host sync, which would stall the queue of kernels: only CPU tensors are
    checked, and compiled graphs skip this data-dependent check."""
    if not values.is_cpu or not values.numel() or torch.compiler.is_compiling():
        return None
    low, high = values.min().item(), values.max().item()
    if low < lo or high >= hi:
        raise ValueError(
            f"{name} must lie in [{lo}, {hi}), got values from {low} to {high}"
        )
    return high


def check_state_dict(model: nn.Module, state_dict) -> None:
    """Raise a ValueError listing how `state_dict` differs from the model's keys and
    shapes, or naming its tensors that hold NaN or inf."""
    own = model.state_dict()
    missing = sorted(set(own) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(own))
    shapes = [
        f"{k}: checkpoint {tuple(state_dict[k].shape)}, model {tuple(own[k].shape)}"
        for k in own
        if k in state_dict and tuple(state_dict[k].shape) != tuple(own[k].shape)
    ]
    nonfinite = [
        k
        for k, v in state_dict.items()
        if torch.is_tensor(v)
        and v.is_floating_point()
        and v.numel()
        # NaN and inf reach the smallest or largest value: one pass, no mask of v's size
        and not torch.isfinite(torch.stack(torch.aminmax(v))).all()
    ]  # once per load: a host sync is fine here
    if nonfinite:
        raise ValueError(
            f"state dict values are not finite (NaN or inf) in {len(nonfinite)} "
            "tensors: "
            f"{', '.join(nonfinite[:8])}{' ...' if len(nonfinite) > 8 else ''}"
        )
    if not (missing or unexpected or shapes):
        return

    def show(items):
        return (
            "\n    "
            + "\n    ".join(items[:8])
            + (f"\n    ... and {len(items) - 8} more" if len(items) > 8 else "")
        )

    parts = [f"{len(missing)} missing keys:{show(missing)}"] if missing else []
    parts += (
        [f"{len(unexpected)} unexpected keys:{show(unexpected)}"] if unexpected else []
    )
    parts += [f"{len(shapes)} shape mismatches:{show(shapes)}"] if shapes else []
    raise ValueError(
        "state dict does not fit this model's config (was it saved from another "
        "config?)\n" + "\n".join(parts)
    )
