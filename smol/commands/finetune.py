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

from smol.commands.common import Parser, run
from smol.commands.train import FAILURES
from smol.commands.tuning import (
    load_tuned,
    prepare,
    report_left_out,
    trained_parameters,
    tune,
)
from smol.commands.tuning_options import (
    add_run_options,
    check_model_args,
    train_config,
    tuning_parser,
)
from smol.finetune import SFTTrainer, numbered_conversations
from smol.train import TrainConfig

# the settings a resume must keep besides TrainConfig's (which smol.resume checks)
SETTINGS_FILE = "finetune.json"
LRS = (1e-3, 5e-5)  # the default peak learning rates, with LoRA and without


def build_parser() -> Parser:
    """The parser of `smol finetune`."""
    p = tuning_parser(
        "finetune",
        __doc__,
        'JSONL file, one {"messages": [...]} a line',
        "JSONL conversations for the validation loss",
        "runs/finetuned",
    )
    add_run_options(p, "conversation", LRS)
    return p


def _parse_args(argv) -> tuple[argparse.Namespace, TrainConfig]:
    args = build_parser().parse_args(argv)
    check_model_args(args)
    return args, train_config(args, LRS)


def main(argv: list[str] | None = None) -> int:
    return run("smol finetune", lambda: _parse_args(argv), _finetune, FAILURES)


def _finetune(settings: tuple[argparse.Namespace, TrainConfig]) -> int:
    args, cfg = settings
    train = numbered_conversations(args.data)
    val = numbered_conversations(args.val_data) if args.val_data else {}

    def build() -> SFTTrainer:
        model, tokenizer = load_tuned(args)
        prepare(args, model)
        return SFTTrainer(
            cfg, model, tokenizer, list(train.values()), list(val.values())
        )

    def result(history: dict) -> str:
        val_loss = history["val_loss"]
        val_text = f", val loss {val_loss[-1]:.4f}" if val_loss else ""
        return f"loss {history['loss'][-1]:.4f}{val_text}"

    return tune(
        args,
        SETTINGS_FILE,
        "fine-tune",
        {},
        build,
        lambda trainer: _report_data(trainer, args, train, val),
        result,
    )


def _report_data(trainer: SFTTrainer, args, train: dict, val: dict) -> None:
    """The conversations trained on, and a warning naming (by line) those left out
    or cut for length."""
    report_left_out(trainer, args, train, val, "conversations", "no reply")
    print(
        f"{len(trainer.train_examples)} training conversations, "
        f"{len(trainer.val_examples)} validation; {trained_parameters(trainer, args)}, "
        f"{trainer.device}, from step {trainer.step}",
        flush=True,
    )
