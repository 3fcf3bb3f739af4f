"""Write a model as a GGUF file (smol/export.py), which llama.cpp and transformers
read: a model folder (config.json, model.safetensors, tokenizer.json), a .gguf file, or
smollm2, the released SmolLM2-135M-Instruct.

    smol export runs/ft smollm2-ft.gguf --type q8_0
    smol export smollm2 smollm2.f16.gguf
"""

from __future__ import annotations

import argparse
from pathlib import Path

from smol.commands.common import Parser, UsageError, parser, run
from smol.export import TYPES, export_gguf

RELEASED = "smollm2"  # the name of the bundled released weights


def build_parser() -> Parser:
    """The parser of `smol export`."""
    p = parser("export", __doc__)
    p.add_argument(
        "model",
        help="a model folder (config.json, model.safetensors, tokenizer.json), a "
        f".gguf file, or {RELEASED!r} for the released SmolLM2-135M-Instruct",
    )
    p.add_argument("out", type=Path, help="the GGUF file to write")
    p.add_argument("--type", choices=sorted(TYPES), default="f16")
    p.add_argument("--name", help="general.name (default: the model's name)")
    p.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    return p


def _parse(argv) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    out = args.out
    if out.suffix != ".gguf":
        raise UsageError(f"OUT must end in .gguf, got {out}")
    if out.exists() and not args.overwrite:
        raise UsageError(f"{out} exists; pass --overwrite to replace it")
    if not out.parent.is_dir():
        raise UsageError(f"no such folder: {out.parent}")
    args.source = None if args.model == RELEASED else args.model
    if args.source is not None and Path(args.source).resolve() == out.resolve():
        raise UsageError("OUT is the model being exported")
    return args


def _export(args) -> None:
    from smol.pretrained import read_model

    config, state_dict, tokenizer = read_model(args.source)
    name = args.name or (RELEASED if args.source is None else Path(args.source).stem)
    export_gguf(config, state_dict, tokenizer, args.out, args.type, name)
    size = args.out.stat().st_size / 2**20
    print(f"wrote {args.out} ({size:.1f} MiB, {args.type})")


def main(argv: list[str] | None = None) -> int:
    return run("smol export", lambda: _parse(argv), _export, (OSError, ValueError))
