"""The options of `smol finetune`, `smol dpo` and `smol grpo` (LoRA's, the schedule's,
resuming) and their checks: LoRA's settings, --out against the model, and the run's
TrainConfig made from them (smol/commands/tuning.py runs it)."""

from __future__ import annotations

import argparse
from pathlib import Path

from smol.commands.common import Parser, UsageError, parser, run
from smol.commands.runs import staging
from smol.commands.tuning import check_run_folder
from smol.commands.train import FAILURES, add_resume_option
from smol.lora import TARGETS, check_settings
from smol.train import TrainConfig

# the options that are TrainConfig's settings under the same names
AS_GIVEN = (
    "steps",
    "batch_size",
    "grad_accum",
    "weight_decay",
    "eval_every",
    "log_every",
    "ckpt_every",
    "seed",
    "device",
    "dtype",
    "progress",
    "resume",
    "overwrite",
    "allow_changed_settings",
)


def tuning_parser(verb: str, doc: str, data: str, val_data: str, out: str) -> Parser:
    """The parser of a tuning command with its first options: --data and --val-data
    (their help `data` and `val_data`), then the model's (add_model_options)."""
    p = parser(verb, doc)
    p.add_argument("--data", required=True, help=data)
    p.add_argument("--val-data", help=val_data)
    add_model_options(p, out)
    return p


def add_model_options(p: argparse.ArgumentParser, out: str) -> None:
    """--model, --out and LoRA's options."""
    p.add_argument(
        "--model",
        help="a .gguf file, a Hugging Face folder or hub id, or a smol train run's "
        "out-dir (default: the bundled SmolLM2-135M-Instruct)",
    )
    p.add_argument("--out", default=out, help="the merged model folder to write")
    p.add_argument(
        "--lora-r", type=int, default=8, help="LoRA rank; 0: full fine-tuning"
    )
    p.add_argument("--lora-alpha", type=float, help="LoRA alpha (default: 2 * r)")
    p.add_argument("--lora-dropout", type=float, help="(default: 0)")
    p.add_argument(
        "--lora-targets",
        help=f"comma-separated layer names, from {','.join(TARGETS)} (default: all)",
    )


def add_run_options(
    p: argparse.ArgumentParser,
    examples: str,
    lrs: tuple[float, float],
    max_len: str | None = None,
) -> None:
    """The schedule's options, the device's, resuming and overwriting; `lrs` are the
    default peak learning rates with LoRA and without; `max_len` the help of
    --max-len (default: tokens per `examples`, truncated)."""
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument(
        "--max-len",
        type=int,
        default=512,
        help=max_len or f"tokens per {examples} (truncated)",
    )
    p.add_argument(
        "--lr",
        type=float,
        help=f"peak learning rate (default: {lrs[0]:g} LoRA, {lrs[1]:g} full)",
    )
    p.add_argument("--warmup-steps", type=int, default=10)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument(
        "--ckpt-every", type=int, default=0, help="steps between checkpoints (0: end)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto", help="auto, bf16, fp16 or fp32")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True)
    add_resume_option(p, "OUT")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="start over in an OUT that holds a fine-tune, replacing it once the "
        "new run is done (until then, and if it fails or is stopped, the earlier "
        "run stays as it was)",
    )
    p.add_argument(
        "--allow-changed-settings",
        action="store_true",
        help="resume with settings that differ from the run's",
    )


# options that may not be empty strings, and what to give instead
EMPTY = (
    ("data", "name a JSONL file"),
    ("val_data", "name a JSONL file, or leave it out"),
    ("model", "name a .gguf file, a folder or a hub id, or leave it out"),
    ("reference", "name a .gguf file, a folder or a hub id, or leave it out"),
)


# --beta's range (DPO's, and GRPO's beside 0): below it the product with a margin or
# a KL term of float32 is lost (1e-320 underflows to 0, and DPO then trains nothing);
# above it the loss and its gradient overflow (1e308) or only the reference counts
BETA_RANGE = (1e-4, 1e3)


def check_beta(beta: float, zero: str | None = None) -> None:
    """A UsageError naming --beta outside BETA_RANGE; `zero` says what 0 means
    where it is allowed (None: it is not)."""
    low, high = BETA_RANGE
    if zero is not None and beta == 0:
        return
    if not low <= beta <= high:  # nan too
        also = f"0 ({zero}) or " if zero is not None else ""
        raise UsageError(
            f"--beta must be {also}between {low:g} and {high:g}, got {beta!r}"
        )


def check_model_args(args, tuned: str = "the model being fine-tuned") -> None:
    """Refuse LoRA settings that cannot work and an --out that is the model (a
    UsageError: exit status 2); fill in LoRA's defaults."""
    for name, wanted in EMPTY:
        value = getattr(args, name, None)
        if value is not None and not value.strip():
            raise UsageError(f"--{name.replace('_', '-')} is empty: {wanted}")
    if args.lora_r < 0:
        raise UsageError(
            f"--lora-r must be >= 0 (0: full fine-tuning), got {args.lora_r}"
        )
    given = [
        "--" + name.replace("_", "-")
        for name in ("lora_alpha", "lora_dropout", "lora_targets")
        if getattr(args, name) is not None
    ]
    if args.lora_r == 0 and given:
        raise UsageError(
            f"{', '.join(given)} set LoRA, but --lora-r 0 trains every weight "
            "without it: leave them out, or give a rank"
        )
    if args.lora_r:
        if args.lora_alpha is None:
            args.lora_alpha = 2.0 * args.lora_r
        args.lora_dropout = args.lora_dropout or 0.0
        names = TARGETS
        if args.lora_targets is not None:
            names = [name.strip() for name in args.lora_targets.split(",")]
            if not all(names):
                raise UsageError(
                    f"--lora-targets {args.lora_targets!r} holds an empty name: give "
                    f"comma-separated names from {','.join(TARGETS)}"
                )
        try:
            targets = check_settings(
                args.lora_r,
                args.lora_alpha,
                args.lora_dropout,
                list(names),
            )
        except ValueError as e:
            raise UsageError(str(e)) from None
        args.lora_targets = list(targets)
    if not args.out:
        raise UsageError("--out is empty: name the folder to write the model to")
    if args.model and Path(args.model).resolve() == Path(args.out).resolve():
        raise UsageError(f"--out {args.out} is {tuned}: write elsewhere")


def train_config(args, lrs: tuple[float, float]) -> TrainConfig:
    """The run's settings: the learning rate by default lrs[0] with LoRA, lrs[1]
    for full fine-tuning, decaying to a tenth of it; a setting TrainConfig refuses
    is a UsageError. No preset: the Trainer checks --max-len against the loaded
    model's context."""
    lr = args.lr if args.lr is not None else lrs[0 if args.lora_r else 1]
    # --overwrite: the new run is written beside OUT until it is done
    run_folder = staging(Path(args.out)) if args.overwrite else Path(args.out)
    try:
        return TrainConfig(
            preset=None,
            seq_len=args.max_len,
            lr=lr,
            min_lr=lr / 10,
            warmup_steps=min(args.warmup_steps, args.steps),
            out_dir=str(run_folder / "training"),
            **{name: getattr(args, name) for name in AS_GIVEN},
        )
    except ValueError as e:
        raise UsageError(str(e)) from None


# each command's defaults: what a line of its --data holds, what one example is called,
# its --out, and its peak learning rates (with LoRA, without)
DEFAULTS = {
    "finetune": ('{"messages": [...]}', "conversation", "runs/finetuned", (1e-3, 5e-5)),
    "dpo": ('{"prompt", "chosen", "rejected"} pair', "pair", "runs/dpo", (5e-5, 1e-6)),
}


def command_parser(verb: str, doc: str, more=None) -> Parser:
    """The parser of `smol VERB` (finetune, dpo) from its DEFAULTS: tuning_parser's
    options, those `more(p)` adds, then add_run_options'."""
    line, example, out, lrs = DEFAULTS[verb]
    p = tuning_parser(
        verb,
        doc,
        f"JSONL file, one {line} a line",
        f"JSONL {example}s for the validation loss",
        out,
    )
    if more is not None:
        more(p)
    add_run_options(p, example, lrs)
    return p


def tuning_main(verb: str, argv, build_parser, check, work) -> int:
    """The exit status of `smol VERB` (common.run, with smol train's failures): its
    arguments parsed by `build_parser()` and checked by `check(args)` (a UsageError:
    status 2), its TrainConfig made by train_config with the verb's learning rates,
    then `work(args, cfg)`."""

    def parse():
        args = build_parser().parse_args(argv)
        check(args)
        return args, train_config(args, DEFAULTS[verb][3])

    def checked_work(settings):
        check_run_folder(settings[0], verb)
        return work(*settings)

    return run(f"smol {verb}", parse, checked_work, FAILURES)
