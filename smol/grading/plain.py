"""Plain data across the line between student code and the grader: tensors, numbers,
strings, None, and lists, tuples and dicts of them, as bytes that decode without running
any code.

A probe (student code, in a process of its own) hands its result to the judge (the
grader) as these bytes: tensors as safetensors, everything else as JSON. Decoding reads
no pickle and calls nothing the bytes name, so the worst bytes can do is fail to decode.

    data = encode({"out": torch.ones(2), "steps": [1, 2.5, None]})
    decode(data)  # {'out': tensor([1., 1.]), 'steps': [1, 2.5, None]}
"""

from __future__ import annotations

import json
import struct
from typing import Any

import torch

MAGIC = b"smolplain1"
MAX_BYTES = 64 << 20  # what one probe may hand back: far above any check's data


class NotPlain(ValueError):
    """The value holds something that is not plain data, or the bytes are not plain
    data."""


def encode(value: Any, limit: int = MAX_BYTES) -> bytes:
    """`value` as bytes; NotPlain naming the first thing that is not plain data."""
    from safetensors.torch import save

    tensors: dict[str, torch.Tensor] = {}
    size = [0]

    def node(v: Any, where: str) -> Any:
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        if isinstance(v, torch.Tensor):
            if v.layout != torch.strided or v.is_quantized or v.device.type == "meta":
                raise NotPlain(f"{where} is a {v.layout} tensor, not a dense one")
            size[0] += v.numel() * v.element_size()
            if size[0] > limit:
                raise NotPlain(f"the data passes {limit >> 20} MiB at {where}")
            name = str(len(tensors))
            tensors[name] = v.detach().to("cpu").contiguous().clone()
            return {"tensor": name}
        if isinstance(v, (list, tuple)):
            items = [node(x, f"{where}[{i}]") for i, x in enumerate(v)]
            return {"list" if isinstance(v, list) else "tuple": items}
        if isinstance(v, dict):
            return {
                "dict": [
                    [node(k, f"a key of {where}"), node(x, f"{where}[{k!r}]")]
                    for k, x in v.items()
                ]
            }
        raise NotPlain(
            f"{where} is a {type(v).__name__}; the grader reads tensors, numbers, "
            "strings, None, and lists, tuples and dicts of them"
        )

    try:
        tree = json.dumps(node(value, "the result")).encode()
    except RecursionError:
        raise NotPlain("the result is nested too deeply") from None
    blob = save(tensors)
    return MAGIC + struct.pack("<Q", len(tree)) + tree + blob


def decode(data: bytes, limit: int = MAX_BYTES) -> Any:
    """The value `data` encodes; NotPlain when the bytes are anything else."""
    from safetensors.torch import load

    head = len(MAGIC) + 8
    if len(data) > limit + (1 << 20) or not data.startswith(MAGIC):
        raise NotPlain("not plain data from the grader's encoder")
    (n,) = struct.unpack("<Q", data[len(MAGIC) : head])
    try:
        tree = json.loads(data[head : head + n])
        tensors = load(data[head + n :])
    except Exception as exc:  # noqa: BLE001 - malformed bytes of any kind
        raise NotPlain(f"malformed plain data ({type(exc).__name__})") from None

    def value(t: Any) -> Any:
        if t is None or isinstance(t, (bool, int, float, str)):
            return t
        if not (isinstance(t, dict) and len(t) == 1):
            raise NotPlain("malformed plain data (a node of unknown form)")
        (kind, body), *_ = t.items()
        if kind == "tensor" and body in tensors:
            return tensors[body]
        if kind in ("list", "tuple") and isinstance(body, list):
            items = [value(x) for x in body]
            return items if kind == "list" else tuple(items)
        if kind == "dict" and isinstance(body, list):
            out = {}
            for pair in body:
                if not (isinstance(pair, list) and len(pair) == 2):
                    raise NotPlain("malformed plain data (a dict entry)")
                key = value(pair[0])
                try:
                    out[key] = value(pair[1])
                except TypeError:  # an unhashable key
                    raise NotPlain("malformed plain data (a dict key)") from None
            return out
        raise NotPlain(f"malformed plain data (a node of kind {kind!r})")

    try:
        return value(tree)
    except RecursionError:
        raise NotPlain("malformed plain data (nested too deeply)") from None
