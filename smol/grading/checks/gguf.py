"""13 GGUF by hand: metadata values as bytes, Q8_0 blocks equal to llama.cpp's, the q/k
row order of llama.cpp's rotary layout, and a tensor table entry whose dimensions are
listed in the wrong order.

Every check is a probe: the student's function runs on inputs the grader chose and hands
back plain data (bytes as lists of ints, tensors), which the grader compares with
smol.export's and smol.gguf's own code."""

import torch

from smol.export import pack_tensor_info, pack_value, quantize_q8_0
from smol.gguf import ARRAY, FLOAT32, INT32, STRING, UINT32, permute_qk
from smol.grading.checks._util import close, is_tensor, untouched
from smol.grading.registry import probe_check, task

task("gguf_value", "gguf", "pack_value(kind, value): a metadata value as GGUF bytes")
task("q8_0", "gguf", "quantize_q8_0(w): blocks of 32, byte for byte as llama.cpp")
task("permute_qk", "gguf", "permute_qk(w, n_heads): q/k rows in llama.cpp's order")
task("tensor_info_bug", "gguf", "Find the bug: a tensor table entry")


def _bytes(out, what: str) -> list[int]:
    """The student's bytes as a list of ints (plain data), checked to be bytes."""
    if not isinstance(out, (bytes, bytearray)):
        raise AssertionError(f"{what} should return bytes, got {type(out).__name__}")
    return list(out)


def _same_bytes(got, want: bytes, what: str) -> None:
    want = list(want)
    if got == want:
        return
    first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    if first is None:
        raise AssertionError(f"{what}: {len(got)} bytes, expected {len(want)}")
    window = slice(max(0, first - 4), first + 8)
    raise AssertionError(
        f"{what}: byte {first} is {got[first]:#04x}, expected {want[first]:#04x} "
        f"(bytes {window.start}..: got {bytes(got[window]).hex(' ')}, expected "
        f"{bytes(want[window]).hex(' ')})"
    )


# --- task 1: values -------------------------------------------------------------------
VALUES = {
    "scalars": [(UINT32, 30), (UINT32, 49152), (FLOAT32, 1e-5), (FLOAT32, 100000.0)],
    "strings": [(STRING, "llama"), (STRING, "Ġ t"), (STRING, "")],
    "arrays": [
        ((ARRAY, STRING), ["<|im_start|>", "é", "h e"]),
        ((ARRAY, INT32), [3, 1, 1, -5]),
        ((ARRAY, STRING), []),
    ],
}


def _value_inputs(group):
    return lambda: {"values": VALUES[group]}


def _value_judge(inputs, outputs):
    for (kind, value), got in zip(inputs["values"], outputs):
        _same_bytes(got, pack_value(kind, value), f"pack_value({kind!r}, {value!r})")


def _value_probe(fn, inputs):
    return [_bytes(fn(kind, value), "pack_value") for kind, value in inputs["values"]]


for _group, _points, _hint in [
    ("scalars", 1, "struct.pack(VALUE_FORMATS[kind], value): '<I' for uint32, '<f'"),
    (
        "strings",
        1,
        "a string is its length in bytes as uint64, then its UTF-8 bytes (not its "
        "length in characters: 'Ġ' is two bytes)",
    ),
    (
        "arrays",
        2,
        "an array is its items' type (uint32), its length (uint64), then each item "
        "packed without a type of its own",
    ),
]:
    probe_check(
        "gguf_value",
        _group,
        _points,
        _hint,
        inputs=_value_inputs(_group),
        judge=_value_judge,
    )(_value_probe)


# --- task 2: Q8_0 ---------------------------------------------------------------------
def _q8_inputs(kind):
    def inputs():
        g = torch.Generator().manual_seed(13)
        if kind.startswith("random"):
            w = torch.randn(6, 128, generator=g) * torch.logspace(-3, 2, 6)[:, None]
            if kind == "random, bfloat16 too":  # a bfloat16 model's own weights,
                # rows where x / d rounds as x * (1 / d) does (the next check's bug)
                return {"w": w, "w_bf16": w[2:].bfloat16()}
        elif kind == "halves":  # scale 1: x * (1 / d) lands on k + 0.5
            w = torch.arange(64, dtype=torch.float32).view(2, 32) - 15.5
            w[:, 31] = 127
            # just below a half: 0.49999997 + 0.5 rounds to 1.0 in float32
            w[0, 1], w[1, 1] = 0.49999997, -2.4999998
        elif kind == "reciprocal":  # 0.1254576 * (1 / d) is 2.4999998, / d is 2.5
            w = torch.zeros(1, 32)
            w[0, :2] = torch.tensor([6.373247146606445, 0.12545761466026306])
        else:  # zeros: a block of zeros has scale 0 and values 0 (no NaN)
            w = torch.zeros(2, 64)
            w[1, 32:] = torch.randn(32, generator=g)
        return {"w": w}

    return inputs


def _q8_probe(fn, inputs):
    return [fn(inputs[k].clone()) for k in ("w", "w_bf16") if k in inputs]


def _q8_judge(part):
    def judge(inputs, outs):
        for k, out in zip(("w", "w_bf16"), outs):
            judge_one(inputs[k], out)

    def judge_one(w, out):
        want = quantize_q8_0(w)
        out = is_tensor(out)
        assert out.dtype == torch.uint8 and out.shape == want.shape, (
            f"expected uint8 {tuple(want.shape)} (34 bytes per 32 values), got "
            f"{out.dtype} {tuple(out.shape)}"
        )
        blocks, ref = out.view(-1, 34), want.view(-1, 34)
        if part == "scales":
            scales = blocks[:, :2].contiguous().view(torch.float16).float()
            close(scales, ref[:, :2].contiguous().view(torch.float16).float(), "d")
            return
        bad = (blocks != ref).any(1).nonzero().flatten().tolist()
        assert not bad, (
            f"{str(w.dtype).removeprefix('torch.')} w: "
            f"{len(bad)} of {len(ref)} blocks differ, e.g. block {bad[0]}: got q "
            f"{blocks[bad[0], 2:].view(torch.int8)[:8].tolist()}..., expected "
            f"{ref[bad[0], 2:].view(torch.int8)[:8].tolist()}..."
        )

    return judge


for _name, _kind, _part, _points, _hint in [
    (
        "shape and scales",
        "random",
        "scales",
        1,
        "per block of 32: d = max|x| / 127, stored as float16 in the block's first "
        "2 bytes, then 32 int8 values",
    ),
    (
        "every byte of random rows",
        "random, bfloat16 too",
        "bytes",
        2,
        "q = round(x * (1 / d)) with d in float32 (round d to float16 only to store "
        "it), for a bfloat16 w too: w.float() first",
    ),
    (
        "halves round away from zero, and just below a half down",
        "halves",
        "bytes",
        1,
        "ggml rounds 2.5 to 3 and -2.5 to -3 (roundf); torch.round rounds halves to "
        "even, and floor(|x| + 0.5) rounds 0.49999997 up to 1 (the sum rounds to "
        "1.0 in float32): add floor(2 * (|x| - floor(|x|))) to floor(|x|) instead",
    ),
    (
        "multiply by 1 / d",
        "reciprocal",
        "bytes",
        1,
        "ggml multiplies by id = 1 / d; x / d can round differently",
    ),
    (
        "a block of zeros",
        "zeros",
        "bytes",
        1,
        "when d is 0, use 1 / d = 0 (all values 0), not a division by zero",
    ),
]:
    probe_check(
        "q8_0", _name, _points, _hint, inputs=_q8_inputs(_kind), judge=_q8_judge(_part)
    )(_q8_probe)


def _untouched_probe(call):
    """A probe that runs call(fn, inputs) on the inputs' w itself (as the exporter
    passes the model's own parameter) and returns w as it is after the call."""

    def probe(fn, inputs):
        call(fn, inputs)
        return inputs["w"]

    return probe


def _untouched_judge(inputs, after):
    untouched(after, inputs["w"], what="w")


probe_check(
    "q8_0",
    "w is left unchanged",
    1,
    "scale a new tensor (x = blocks * id), not w itself (blocks *= id writes into w "
    "through the reshaped view, and w.float() of a float32 w is w)",
    inputs=_q8_inputs("random"),
    judge=_untouched_judge,
)(_untouched_probe(lambda fn, inputs: fn(inputs["w"])))


# --- task 3: the q/k permutation
def _perm_inputs(heads, head_dim, fan_in):
    return lambda: {
        "w": torch.randn(
            heads * head_dim, fan_in, generator=torch.Generator().manual_seed(2)
        ),
        "heads": heads,
    }


def _perm_probe(fn, inputs):
    return fn(inputs["w"].clone(), inputs["heads"])


def _perm_judge(inputs, out):
    close(is_tensor(out), permute_qk(inputs["w"], inputs["heads"]), atol=0, rtol=0)


for _name, _shape, _points, _hint in [
    (
        "one head: row perm[i] at i",
        (1, 8, 5),
        1,
        "row 2j takes row j, row 2j + 1 takes row j + D/2 (chapter 2's perm)",
    ),
    (
        "each head on its own",
        (3, 8, 6),
        1,
        "permute within each head: reshape to (n_heads, 2, D/2, in) and swap 2 with "
        "D/2",
    ),
    (
        "keys: fewer heads, wide rows",
        (2, 64, 96),
        1,
        "n_heads is the number of key/value heads for k_proj; the rows are "
        "n_heads * head_dim",
    ),
]:
    probe_check(
        "permute_qk",
        _name,
        _points,
        _hint,
        inputs=_perm_inputs(*_shape),
        judge=_perm_judge,
    )(_perm_probe)


probe_check(
    "permute_qk",
    "w is left unchanged",
    1,
    "return a new tensor (reshape, transpose, reshape), never write into w: smol's "
    "exporter passes the model's own q_proj and k_proj weights",
    inputs=_perm_inputs(3, 8, 6),
    judge=_untouched_judge,
)(_untouched_probe(lambda fn, inputs: fn(inputs["w"], inputs["heads"])))


# --- task 4: a tensor table entry
def _info_inputs(*entries):
    return lambda: {"entries": list(entries)}


def _info_probe(fn, inputs):
    return [_bytes(fn(*e), "tensor_info") for e in inputs["entries"]]


def _info_judge(inputs, outputs):
    for entry, got in zip(inputs["entries"], outputs):
        _same_bytes(got, pack_tensor_info(*entry), f"tensor_info{tuple(entry)}")


for _name, _entries, _hint in [
    (
        "a vector, and a name that is not ASCII",
        [("output_norm.weight", [576], 0, 0), ("blk.0.é", [8], 0, 64)],
        "the name as a GGUF string (its length in UTF-8 bytes: 'é' is two), the "
        "number of dimensions (uint32), each dimension (uint64), the type (uint32), "
        "the offset (uint64)",
    ),
    (
        "a square matrix",
        [("blk.0.attn_q.weight", [64, 64], 1, 4096)],
        "offsets and types are little-endian integers",
    ),
    (
        "an (out, in) matrix lists in first",
        [("blk.0.ffn_up.weight", [1536, 576], 8, 1024), ("x", [3, 5, 7], 0, 32)],
        "GGUF lists the innermost dimension first: a PyTorch (out, in) weight is "
        "written as in, out",
    ),
]:
    probe_check(
        "tensor_info_bug",
        _name,
        1,
        _hint,
        inputs=_info_inputs(*_entries),
        judge=_info_judge,
    )(_info_probe)
