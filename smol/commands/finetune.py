"""Fine-tune SmolLM2 on conversations, fully or with LoRA, with the loss on the replies.

    smol finetune --data conversations.jsonl --lora-r 8 --out runs/ft
    smol finetune --data conversations.jsonl --lora-r 8 --out runs/ft --resume

The second line, after a stop (SIGTERM, Ctrl-C), continues the run: the same adapter,
bit for bit, as a run that was never stopped.

Each line of the JSONL file is one conversation, `{"messages": [{"role": "user",
"content": "..."}, {"role": "assistant", "content": "..."}]}`. The result is a merged
model folder (config.json, model.safetensors and the tokenizer) that
`smol.load_pretrained` and transformers' `from_pretrained` read, and with LoRA also the
adapter as peft saves it; each with a manifest.json of sha256 sums that smol checks at
load. The run's checkpoints are in OUT/training. As with `smol train`, SIGTERM or Ctrl-C
saves a checkpoint and --resume continues the run. A folder holding a model or a run is
not written over without --resume or --overwrite, nor is the model being fine-tuned."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch

from smol.checkpoint import check_writable, file_sha256, read_json
from smol.commands.common import Parser, UsageError, parser, run
from smol.commands.train import FAILURES, add_resume_option, fit_until_stopped
from smol.finetune import SFTTrainer, numbered_conversations
from smol.lora import (
    TARGETS,
    apply_lora,
    check_settings,
    count_trainable,
    merge_lora,
    save_peft_adapter,
)
from smol.train import TrainConfig
from smol.train_report import log

# what a fine-tune writes into --out: it is not written over unasked
OUTPUTS = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "manifest.json",
    "adapter",
    "training",
)
# the settings a resume must keep besides TrainConfig's (which smol.resume checks)
SETTINGS_FILE = "finetune.json"


def build_parser() -> Parser:
    """The parser of `smol finetune`."""
    p = parser("finetune", __doc__)
    p.add_argument(
        "--data", required=True, help='JSONL file, one {"messages": [...]} a line'
    )
    p.add_argument("--val-data", help="JSONL conversations for the validation loss")
    p.add_argument(
        "--model",
        help="a .gguf file, a Hugging Face folder or hub id "
        "(default: the bundled SmolLM2-135M-Instruct)",
    )
    p.add_argument(
        "--out", default="runs/finetuned", help="the merged model folder to write"
    )
    p.add_argument(
        "--lora-r", type=int, default=8, help="LoRA rank; 0: full fine-tuning"
    )
    p.add_argument("--lora-alpha", type=float, help="LoRA alpha (default: 2 * r)")
    p.add_argument("--lora-dropout", type=float, help="(default: 0)")
    p.add_argument(
        "--lora-targets",
        help=f"comma-separated layer names, from {','.join(TARGETS)} (default: all)",
    )
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument(
        "--max-len", type=int, default=512, help="tokens per conversation (truncated)"
    )
    p.add_argument(
        "--lr", type=float, help="peak learning rate (default: 1e-3 LoRA, 5e-5 full)"
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
        help="start over in an OUT that holds a fine-tune, replacing it",
    )
    p.add_argument(
        "--allow-changed-settings",
        action="store_true",
        help="resume with settings that differ from the run's",
    )
    return p


def _parse_args(argv) -> tuple[argparse.Namespace, TrainConfig]:
    args = build_parser().parse_args(argv)
    _check_args(args)
    try:
        return args, _train_config(args)
    except ValueError as e:
        raise UsageError(str(e)) from None


def _check_args(args) -> None:
    """Refuse what cannot work, before any work (UsageError: exit status 2)."""
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
        names = (args.lora_targets or ",".join(TARGETS)).split(",")
        try:
            targets = check_settings(
                args.lora_r,
                args.lora_alpha,
                args.lora_dropout,
                [t.strip() for t in names],
            )
        except ValueError as e:
            raise UsageError(str(e)) from None
        args.lora_targets = list(targets)
    if not args.out:
        raise UsageError("--out is empty: name the folder to write the model to")
    if args.model and Path(args.model).resolve() == Path(args.out).resolve():
        raise UsageError(
            f"--out {args.out} is the model being fine-tuned: write elsewhere"
        )


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


def _train_config(args) -> TrainConfig:
    """The fine-tuning run's settings: the learning rate by default 1e-3 with LoRA,
    5e-5 for full fine-tuning, decaying to a tenth of it. No preset: the Trainer checks
    --max-len against the loaded model's context."""
    lr = args.lr if args.lr is not None else (1e-3 if args.lora_r else 5e-5)
    return TrainConfig(
        preset=None,
        seq_len=args.max_len,
        lr=lr,
        min_lr=lr / 10,
        warmup_steps=min(args.warmup_steps, args.steps),
        out_dir=str(Path(args.out) / "training"),
        **{name: getattr(args, name) for name in AS_GIVEN},
    )


def main(argv: list[str] | None = None) -> int:
    return run("smol finetune", lambda: _parse_args(argv), _finetune, FAILURES)


def _finetune(settings: tuple[argparse.Namespace, TrainConfig]) -> int:
    args, cfg = settings
    train = numbered_conversations(args.data)
    val = numbered_conversations(args.val_data) if args.val_data else {}
    out = Path(args.out)
    _check_out(args, out)
    run = _run_settings(args)
    if args.resume:
        _check_resumed_settings(args, run, out)

    def start() -> SFTTrainer:
        from smol.pretrained import load_pretrained

        device = None if args.device == "auto" else args.device
        model, tokenizer = load_pretrained(args.model, device=device)
        context = model.config.max_position_embeddings
        if args.max_len > context:
            raise ValueError(
                f"--max-len {args.max_len} is longer than the model's context of "
                f"{context} tokens"
            )
        torch.manual_seed(args.seed)  # LoRA's A matrices are drawn here
        if args.lora_r:
            apply_lora(
                model,
                args.lora_r,
                args.lora_alpha,
                args.lora_targets,
                args.lora_dropout,
            )
        model.train()
        trainer = SFTTrainer(
            cfg, model, tokenizer, list(train.values()), list(val.values())
        )
        if trainer.is_main:
            if args.overwrite:
                _clear_outputs(out)
            if not args.resume:
                (out / "training" / SETTINGS_FILE).write_text(
                    json.dumps(run, indent=1), encoding="utf-8"
                )
            _report_data(trainer, args, train, val)
        return trainer

    def finish(trainer: SFTTrainer, history: dict) -> None:
        if trainer.is_main:
            _save(trainer, history, args, out)

    return fit_until_stopped(start, finish)


def _check_out(args, out: Path) -> None:
    """--out must be writable and hold no fine-tune, unless one is resumed or
    overwritten."""
    found = [name for name in OUTPUTS if (out / name).exists()]
    if found and not (args.resume or args.overwrite):
        shown = ", ".join(found[:3]) + (", ..." if len(found) > 3 else "")
        raise FileExistsError(
            f"--out {out} already holds a fine-tune ({shown}): choose "
            "another folder, continue its run with --resume, or replace it with "
            "--overwrite"
        )
    check_writable(out, "--out")


def _clear_outputs(out: Path) -> None:
    """Delete the merged model and adapter of the fine-tune that --overwrite replaces
    (its checkpoints are gone already: smol.resume.prepare_out_dir)."""
    gone = [n for n in OUTPUTS if n != "training" and (out / n).exists()]
    for name in gone:
        if (out / name).is_dir():
            shutil.rmtree(out / name)
        else:
            (out / name).unlink()
    if gone:
        log(f"overwrite: deleted the previous fine-tune's {', '.join(gone)} in {out}")


def _run_settings(args) -> dict:
    """What a resume must keep besides TrainConfig's settings: the model, the data
    (its files' sha256) and LoRA's settings."""
    model = args.model
    if model is not None and Path(model).exists():  # a path, however it is spelt
        model = str(Path(model).resolve())
    return {
        "model": model,
        "data": file_sha256(Path(args.data)),
        "val_data": file_sha256(Path(args.val_data)) if args.val_data else None,
        "lora_r": args.lora_r,
        "lora_alpha": args.lora_alpha,
        "lora_dropout": args.lora_dropout,
        "lora_targets": args.lora_targets,
    }


def _check_resumed_settings(args, run: dict, out: Path) -> None:
    path = out / "training" / SETTINGS_FILE
    if not path.is_file():
        return  # no run to compare with: Trainer says there is nothing to resume
    saved = read_json(path)
    if not isinstance(saved, dict):
        raise ValueError(f"{path}: expected a JSON object of settings")
    changed = [
        f"{k}: the run's {saved.get(k)!r}, now {v!r}"
        for k, v in run.items()
        if saved.get(k) != v
    ]
    if not changed:
        return
    if not args.allow_changed_settings:
        raise ValueError(
            "resuming would not continue the same fine-tune: "
            f"{'; '.join(changed)}; resume with the run's settings, or pass "
            "--allow-changed-settings to continue anyway"
        )
    log(f"warning: resuming with changed settings: {'; '.join(changed)}")


def _report_data(trainer: SFTTrainer, args, train: dict, val: dict) -> None:
    """The conversations trained on, and a warning naming (by line) those left out
    or cut for length."""
    for what, path, lines in (
        ("training", args.data, list(train)),
        ("validation", args.val_data, list(val)),
    ):
        dropped = [lines[i] for i in trainer.dropped.get(what, [])]
        if dropped:
            shown = ", ".join(map(str, dropped[:10])) + (
                " ..." if len(dropped) > 10 else ""
            )
            log(
                f"warning: {len(dropped)} of {len(lines)} {what} conversations have no "
                f"reply within --max-len {args.max_len} tokens and are left out: "
                f"{path}, lines {shown}"
            )
        if trainer.cut.get(what):
            log(
                f"note: {trainer.cut[what]} {what} conversations are longer than "
                f"--max-len {args.max_len} tokens and are cut to it"
            )
    how = f"LoRA r={args.lora_r}" if args.lora_r else "full fine-tuning"
    trainable, total = count_trainable(trainer.model)
    print(
        f"{len(trainer.train_examples)} training conversations, "
        f"{len(trainer.val_examples)} validation; training {trainable:,} of "
        f"{total:,} parameters ({how}), {trainer.device}, from step {trainer.step}",
        flush=True,
    )


def _save(trainer: SFTTrainer, history: dict, args, out: Path) -> None:
    """The adapter (with LoRA) and the merged model, into out."""
    from smol.pretrained import save_pretrained

    model = trainer.model
    if args.lora_r:
        save_peft_adapter(model, out / "adapter", args.model)
        merge_lora(model)
    save_pretrained(model.float().eval(), trainer.tokenizer, out)
    val_loss = history["val_loss"]
    val_text = f", val loss {val_loss[-1]:.4f}" if val_loss else ""
    print(
        f"done: step {trainer.step}, loss {history['loss'][-1]:.4f}{val_text}; "
        f"the merged model is in {out}",
        flush=True,
    )
