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
from pathlib import Path

import torch

from smol.commands.common import Parser, UsageError, parser, run
from smol.commands.train import FAILURES, fit_until_stopped
from smol.commands.tuning import (
    add_model_options,
    add_run_options,
    check_context,
    check_model_args,
    check_out,
    check_resumed_settings,
    clear_outputs,
    report_left_out,
    run_settings,
    save_model,
    train_config,
    write_settings,
)
from smol.finetune import SFTTrainer, numbered_conversations
from smol.lora import apply_lora, count_trainable
from smol.train import TrainConfig

# the settings a resume must keep besides TrainConfig's (which smol.resume checks)
SETTINGS_FILE = "finetune.json"
LRS = (1e-3, 5e-5)  # the default peak learning rates, with LoRA and without


def build_parser() -> Parser:
    """The parser of `smol finetune`."""
    p = parser("finetune", __doc__)
    p.add_argument(
        "--data", required=True, help='JSONL file, one {"messages": [...]} a line'
    )
    p.add_argument("--val-data", help="JSONL conversations for the validation loss")
    add_model_options(p, "runs/finetuned")
    add_run_options(p, "conversation", LRS)
    return p


def _parse_args(argv) -> tuple[argparse.Namespace, TrainConfig]:
    args = build_parser().parse_args(argv)
    check_model_args(args)
    try:
        return args, train_config(args, LRS)
    except ValueError as e:
        raise UsageError(str(e)) from None


def main(argv: list[str] | None = None) -> int:
    return run("smol finetune", lambda: _parse_args(argv), _finetune, FAILURES)


def _finetune(settings: tuple[argparse.Namespace, TrainConfig]) -> int:
    args, cfg = settings
    train = numbered_conversations(args.data)
    val = numbered_conversations(args.val_data) if args.val_data else {}
    out = Path(args.out)
    check_out(args, out)
    run = run_settings(args)
    settings_file = out / "training" / SETTINGS_FILE
    if args.resume:
        check_resumed_settings(args, run, settings_file, "fine-tune")

    def start() -> SFTTrainer:
        from smol.pretrained import load_pretrained

        device = None if args.device == "auto" else args.device
        model, tokenizer = load_pretrained(args.model, device=device)
        check_context(model, args.max_len)
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
                clear_outputs(out)
            if not args.resume:
                write_settings(settings_file, run)
            _report_data(trainer, args, train, val)
        return trainer

    def finish(trainer: SFTTrainer, history: dict) -> None:
        if trainer.is_main:
            save_model(trainer, args, out)
            val_loss = history["val_loss"]
            val_text = f", val loss {val_loss[-1]:.4f}" if val_loss else ""
            print(
                f"done: step {trainer.step}, loss {history['loss'][-1]:.4f}"
                f"{val_text}; the merged model is in {out}",
                flush=True,
            )

    return fit_until_stopped(start, finish)


def _report_data(trainer: SFTTrainer, args, train: dict, val: dict) -> None:
    """The conversations trained on, and a warning naming (by line) those left out
    or cut for length."""
    report_left_out(trainer, args, train, val, "conversations", "no reply")
    how = f"LoRA r={args.lora_r}" if args.lora_r else "full fine-tuning"
    trainable, total = count_trainable(trainer.model)
    print(
        f"{len(trainer.train_examples)} training conversations, "
        f"{len(trainer.val_examples)} validation; training {trainable:,} of "
        f"{total:,} parameters ({how}), {trainer.device}, from step {trainer.step}",
        flush=True,
    )
