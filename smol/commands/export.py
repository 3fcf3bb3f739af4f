"""Write a model as a GGUF file (smol/export.py), which llama.cpp and transformers
read: a model folder (config.json, model.safetensors, tokenizer.json), a .gguf file, or
smollm2, the released SmolLM2-135M-Instruct.

    smol export runs/ft smollm2-ft.gguf --type q8_0
    smol export smollm2 smollm2.f16.gguf
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from smol.checkpoint import check_writable, missing_folder
from smol.commands.common import Parser, UsageError, check_text, parser, run
from smol.export import TYPES, export_gguf

RELEASED = "smollm2"  # the name of the bundled released weights
NOT_LLAMA = "GGUF export writes a plain Llama model"  # smol.export's error's start


def build_parser() -> Parser:
    """The parser of `smol export`."""
    p = parser("export", __doc__)
    p.add_argument(
        "model",
        help="a model folder (config.json, model.safetensors, tokenizer.json), a "
        f"smol train run's out-dir, a .gguf file, or {RELEASED!r} for the released "
        "SmolLM2-135M-Instruct",
    )
    p.add_argument("out", type=Path, help="the GGUF file to write")
    p.add_argument("--type", choices=sorted(TYPES), default="f16")
    p.add_argument("--name", help="general.name (default: the model's name)")
    p.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    return p


def _parse(argv) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    out = args.out
    if not args.model.strip():
        raise UsageError(
            f"the model is empty: name a model folder, a .gguf file or {RELEASED!r}"
        )
    args.source = None if args.model == RELEASED else args.model
    if args.source is None and Path(RELEASED).exists():
        raise UsageError(
            f"{RELEASED!r} names the released model, and a file or folder here too: "
            f"write ./{RELEASED} for yours, or run elsewhere for the released one"
        )
    if args.source is not None:
        source = Path(args.source)
        hub_id = re.fullmatch(r"[\w.-]+/[\w.-]+", args.source)
        if not source.exists() and not hub_id:
            raise UsageError(
                f"no such model: {args.source} (a model folder, a .gguf file, a hub "
                f"id, or {RELEASED!r})"
            )
        if source.resolve() == out.resolve():
            raise UsageError(f"OUT {out} is the model being exported")
    if args.name is not None and not args.name.strip():
        raise UsageError("--name is empty: give the model a name, or leave it out")
    check_text(args.name, "--name")
    if out.suffix != ".gguf":
        raise UsageError(f"OUT must end in .gguf, got {out}")
    if out.is_dir():
        raise UsageError(f"OUT {out} is a folder, not a file that can be replaced")
    if out.exists() and not args.overwrite:
        raise UsageError(f"{out} exists; pass --overwrite to replace it")
    if not out.parent.is_dir():
        raise UsageError(f"OUT {out}: {missing_folder(out.parent)}")
    try:  # found now, not after the model is read and converted
        check_writable(out.parent, "the folder of OUT")
    except OSError as e:
        raise UsageError(str(e)) from None
    return args


def _export(args) -> None:
    from smol.pretrained import read_model

    config, state_dict, tokenizer = read_model(args.source)
    name = args.name or (RELEASED if args.source is None else Path(args.source).stem)
    earlier = args.out.exists()
    try:  # written to a temporary file in the same folder, then renamed
        export_gguf(config, state_dict, tokenizer, args.out, args.type, name)
    except ValueError as e:  # weights that are not a Llama model's: the file's fault
        if args.source is None or not str(e).startswith(NOT_LLAMA):
            raise
        what = "a valid GGUF" if args.source.endswith(".gguf") else "a model"
        raise ValueError(f"{args.source} is not {what}: {e}") from None
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (common.Terminated)
        e.add_note(
            f"{args.out} was not written"
            + (" (the earlier file is as it was)" if earlier else "")
        )
        raise
    size = args.out.stat().st_size / 2**20
    print(f"wrote {args.out} ({size:.1f} MiB, {args.type})")


def main(argv: list[str] | None = None) -> int:
    return run("smol export", lambda: _parse(argv), _export, (OSError, ValueError))
