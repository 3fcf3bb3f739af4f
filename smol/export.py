"""Write a smol model as a GGUF file, the format llama.cpp (and the apps built on it)
and transformers read.

A GGUF file is a header, key/value metadata, a table of tensors (name, shape, type,
offset) and the tensors' bytes, each at an aligned offset. gguf_metadata says what a
Llama model needs, gguf_tensors puts the weights in llama.cpp's names, row order and
types (F32, F16 or Q8_0), write_gguf writes the file, and export_gguf does it all;
`smol export MODEL OUT.gguf --type f16` does it from the shell. smol.gguf reads the
same format back, with the same constants."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np
import torch
from gguf.constants import GGMLQuantizationType as Q

from smol.config import SmolConfig
from smol.gguf import (
    ALIGNMENT,
    ARRAY,
    BOOL,
    FLOAT32,
    GGUF_MAGIC,
    GGUF_NAMES,
    GGUF_VERSION,
    INT32,
    STRING,
    UINT32,
    VALUE_FORMATS,
    permute_qk,
)
from smol.tokenizer import GGUF_CONTROL, Tokenizer

TYPES = {"f32": Q.F32, "f16": Q.F16, "q8_0": Q.Q8_0}
# general.file_type: llama.cpp's name for what most tensors are (its llama_ftype)
FILE_TYPES = {Q.F32: 0, Q.F16: 1, Q.Q8_0: 7}
# tokenizer.ggml.token_type: an ordinary token, a control (special) token, an added
# token that is not special, a padding entry no text produces
NORMAL, USER_DEFINED, UNUSED = 1, 4, 5
Q8_0_BLOCK = 32  # values per Q8_0 block: a float16 scale, then 32 int8 values


# --- values -------------------------------------------------------------------------
def pack_string(text: str) -> bytes:
    """A GGUF string: its length in bytes (uint64), then its UTF-8 bytes."""
    data = text.encode("utf-8")
    return struct.pack("<Q", len(data)) + data


def pack_value(kind: int | tuple[int, int], value) -> bytes:
    """One metadata value of type `kind` (a scalar type, STRING, or (ARRAY, item
    type)), without the type tag."""
    if kind == STRING:
        return pack_string(value)
    if isinstance(kind, tuple):  # an array: item type, length, items
        _, item = kind
        head = struct.pack("<IQ", item, len(value))
        if item == STRING:
            return head + b"".join(pack_string(v) for v in value)
        return head + np.asarray(value, VALUE_FORMATS[item]).tobytes()
    return struct.pack(VALUE_FORMATS[kind], value)


def pack_metadata(key: str, kind: int | tuple[int, int], value) -> bytes:
    """A key/value pair: the key, the value's type (uint32; an array also names its
    items' type inside its value), the value."""
    tag = kind[0] if isinstance(kind, tuple) else kind
    return pack_string(key) + struct.pack("<I", tag) + pack_value(kind, value)


def pack_tensor_info(
    name: str, shape: tuple[int, ...], qtype: int, offset: int
) -> bytes:
    """A tensor table entry: the name, the number of dimensions (uint32), the dimensions
    innermost first (uint64 each: a PyTorch (out, in) weight is written in, out), the
    type (uint32) and the offset of its bytes in the data (uint64)."""
    dims = tuple(shape)[::-1]
    return (
        pack_string(name)
        + struct.pack("<I", len(dims))
        + struct.pack(f"<{len(dims)}QIQ", *dims, qtype, offset)
    )


# --- metadata -----------------------------------------------------------------------
def gguf_metadata(
    config: SmolConfig, tokenizer: Tokenizer, qtype: Q, name: str = "smol"
) -> dict[str, tuple]:
    """key -> (type, value): what llama.cpp needs to build a Llama model and its
    tokenizer."""
    meta = {
        "general.architecture": (STRING, "llama"),
        "general.name": (STRING, name),
        "general.file_type": (UINT32, FILE_TYPES[qtype]),
        "general.quantization_version": (UINT32, 2),
        "general.alignment": (UINT32, ALIGNMENT),
        "llama.vocab_size": (UINT32, config.vocab_size),
        "llama.context_length": (UINT32, config.max_position_embeddings),
        "llama.embedding_length": (UINT32, config.hidden_size),
        "llama.block_count": (UINT32, config.num_hidden_layers),
        "llama.feed_forward_length": (UINT32, config.intermediate_size),
        "llama.attention.head_count": (UINT32, config.num_attention_heads),
        "llama.attention.head_count_kv": (UINT32, config.num_key_value_heads),
        "llama.rope.dimension_count": (UINT32, config.head_dim),
        "llama.rope.freq_base": (FLOAT32, config.rope_theta),
        "llama.attention.layer_norm_rms_epsilon": (FLOAT32, config.rms_norm_eps),
    }
    return meta | tokenizer_metadata(tokenizer, config.vocab_size)


def pre_tokenizer_name(pre: dict | None) -> str:
    """llama.cpp's name for a byte-level BPE's pre-tokenizer (tokenizer.json's
    "pre_tokenizer"): "smollm" isolates each digit before GPT-2's split, "gpt-2" is the
    split alone."""
    gpt2 = {"type": "ByteLevel", "use_regex": True}
    if pre is not None and gpt2.items() <= pre.items():
        return "gpt-2"
    steps = (pre or {}).get("pretokenizers", [])
    if (
        len(steps) == 2
        and steps[0] == {"type": "Digits", "individual_digits": True}
        and gpt2.items() <= steps[1].items()
    ):
        return "smollm"
    raise ValueError(
        "cannot write this tokenizer's pre-tokenizer to GGUF: expected GPT-2's "
        "byte-level split, alone or after Digits(individual_digits=True), got "
        f"{json.dumps(pre)}"
    )


def tokenizer_metadata(tokenizer: Tokenizer, vocab_size: int) -> dict[str, tuple]:
    """The tokenizer.* keys of a byte-level BPE: every token by id (padded with unused
    entries up to the model's vocab_size), their types, the merges, the pre-tokenizer,
    the special ids and the chat template."""
    spec = json.loads(tokenizer.backend.to_str())
    if (
        spec["model"]["type"] != "BPE"
        or (spec.get("decoder") or {}).get("type") != "ByteLevel"
    ):
        raise ValueError(
            "GGUF export writes byte-level BPE tokenizers (as GPT-2's and SmolLM2's), "
            f"got a {spec['model']['type']} model with decoder {spec.get('decoder')}"
        )
    vocab = tokenizer.backend.get_vocab(with_added_tokens=True)  # token -> id
    if len(vocab) > vocab_size or max(vocab.values()) >= vocab_size:
        raise ValueError(
            f"the tokenizer has {len(vocab)} tokens (ids up to {max(vocab.values())}), "
            f"more than the model's vocab_size {vocab_size}"
        )
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    types = [UNUSED] * vocab_size
    for token, i in vocab.items():
        tokens[i], types[i] = token, NORMAL
    for added in spec["added_tokens"]:
        types[added["id"]] = GGUF_CONTROL if added["special"] else USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    meta = {
        "tokenizer.ggml.model": (STRING, "gpt2"),
        "tokenizer.ggml.pre": (STRING, pre_tokenizer_name(spec["pre_tokenizer"])),
        "tokenizer.ggml.tokens": ((ARRAY, STRING), tokens),
        "tokenizer.ggml.token_type": ((ARRAY, INT32), types),
        "tokenizer.ggml.merges": ((ARRAY, STRING), merges),
        "tokenizer.ggml.add_bos_token": (BOOL, False),  # smol never adds one
    }
    special = {
        "bos": tokenizer.bos_token_id,
        "eos": tokenizer.eos_token_id,
        "padding": tokenizer.pad_token_id,
        "unknown": tokenizer.token_to_id(tokenizer.unk_token),
    }
    for name, i in special.items():
        if i is not None:
            meta[f"tokenizer.ggml.{name}_token_id"] = (UINT32, i)
    if tokenizer.chat_template:
        meta["tokenizer.chat_template"] = (STRING, tokenizer.chat_template)
    return meta


# --- tensors ------------------------------------------------------------------------
def quantize_q8_0(weight: torch.Tensor) -> torch.Tensor:
    """weight (rows, n) -> Q8_0 blocks as uint8 (rows, n // 32 * 34): per block of 32
    values, the scale d = max|x| / 127 as float16, then round(x / d) as int8.

    Computed as ggml does (float32, x times 1/d, halves rounded away from zero), so
    the bytes equal llama.cpp's and the gguf package's."""
    rows, n = weight.shape
    if n % Q8_0_BLOCK:
        raise ValueError(
            f"Q8_0 needs rows of a multiple of {Q8_0_BLOCK} values, got {n}"
        )
    blocks = weight.float().reshape(-1, Q8_0_BLOCK)  # (N, 32)
    d = blocks.abs().amax(dim=1, keepdim=True) / 127  # (N, 1)
    x = blocks * torch.where(d == 0, 0.0, 1 / d)  # in [-127, 127]
    whole = x.abs().floor()
    q = x.sign() * (whole + torch.floor(2 * (x.abs() - whole)))  # halves away from 0
    scale = d.to(torch.float16).view(torch.uint8)  # (N, 2)
    return torch.cat([scale, q.to(torch.int8).view(torch.uint8)], 1).view(rows, -1)


def encode_tensor(name: str, weight: torch.Tensor, qtype: Q) -> torch.Tensor:
    """A tensor's bytes in GGUF type qtype, as uint8 (rows, bytes per row)."""
    weight = weight.detach().cpu().float()
    top = weight.abs().amax()  # NaN when any value is NaN
    if not torch.isfinite(top):
        raise ValueError(f"{name} holds NaN or infinite values: nothing to export")
    weight = weight.reshape(-1, weight.shape[-1])
    if qtype == Q.F32:
        return weight.contiguous().view(torch.uint8)
    if qtype == Q.F16:
        if not torch.isfinite(top.half()):
            raise ValueError(
                f"{name} has values beyond float16's range (max |value| "
                f"{top.item():.4g} > 65504): export it as f32"
            )
        return weight.to(torch.float16).view(torch.uint8)
    return quantize_q8_0(weight)


def gguf_tensors(
    config: SmolConfig, state_dict: dict[str, torch.Tensor], qtype: Q
) -> dict[str, tuple[Q, tuple[int, ...], torch.Tensor]]:
    """GGUF name -> (type, shape (out, in), bytes (rows, bytes per row)).

    Matrices in qtype, norms (vectors) in F32 as llama.cpp keeps them; q/k rows in
    llama.cpp's rotary order; a tied output head is left out (the reader reuses the
    embedding)."""
    names = {}  # smol name -> GGUF name
    for i in range(config.num_hidden_layers):
        names.update({s.format(i=i): g.format(i=i) for g, s in GGUF_NAMES.items()})
    state_dict = dict(state_dict)
    if config.tie_word_embeddings:  # the reader reuses token_embd.weight
        del names["lm_head.weight"]
        state_dict.pop("lm_head.weight", None)
    unknown = sorted(set(state_dict) - set(names))
    missing = sorted(set(names) - set(state_dict))
    if unknown or missing:
        lora = any("lora" in name for name in unknown)
        raise ValueError(
            "GGUF export writes a plain Llama model"
            + (" (merge LoRA adapters first)" if lora else "")
            + f": unexpected weights {unknown[:3]}, missing {missing[:3]}"
        )
    heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}
    tensors = {}
    for name, gguf_name in names.items():
        weight = state_dict[name]
        kind = gguf_name.split(".")[-2]
        if kind in heads:
            weight = permute_qk(weight, heads[kind])
        wanted = qtype if weight.dim() == 2 else Q.F32
        tensors[gguf_name] = (
            wanted,
            tuple(weight.shape),
            encode_tensor(name, weight, wanted),
        )
    return tensors


# --- the file -----------------------------------------------------------------------
def write_gguf(path: str | Path, metadata: dict[str, tuple], tensors: dict) -> Path:
    """Write header, metadata, tensor table and tensor data (each at a multiple of
    ALIGNMENT from the data's start). Written to a temporary file, then renamed."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")

    def pad(f) -> None:
        f.write(b"\0" * (-f.tell() % ALIGNMENT))

    try:
        with open(tmp, "wb") as f:
            f.write(GGUF_MAGIC)
            f.write(struct.pack("<IQQ", GGUF_VERSION, len(tensors), len(metadata)))
            f.writelines(
                pack_metadata(k, *kind_value) for k, kind_value in metadata.items()
            )
            offset = 0
            for name, (qtype, shape, data) in tensors.items():
                f.write(pack_tensor_info(name, shape, qtype, offset))
                offset += data.numel() + (-data.numel() % ALIGNMENT)
            pad(f)
            for qtype, shape, data in tensors.values():
                f.write(data.numpy().tobytes())
                pad(f)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def export_gguf(
    config: SmolConfig,
    state_dict: dict[str, torch.Tensor],
    tokenizer: Tokenizer,
    path: str | Path,
    type: str = "f16",
    name: str = "smol",
) -> Path:
    """Write a model (config, state dict in smol's names, tokenizer) as a GGUF file of
    type "f32", "f16" or "q8_0"."""
    if type not in TYPES:
        raise ValueError(f"type must be one of {sorted(TYPES)}, got {type!r}")
    qtype = TYPES[type]
    metadata = gguf_metadata(config, tokenizer, qtype, name)
    return write_gguf(path, metadata, gguf_tensors(config, state_dict, qtype))
