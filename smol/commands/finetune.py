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

from smol.commands import tuning
from smol.commands.common import Parser
from smol.commands.tuning_options import check_model_args, command_parser, tuning_main
from smol.finetune import SFTTrainer, numbered_conversations

# the settings a resume must keep besides TrainConfig's (which smol.resume checks)
SETTINGS_FILE = "finetune.json"


def build_parser() -> Parser:
    """The parser of `smol finetune` (its defaults: tuning_options.DEFAULTS)."""
    return command_parser("finetune", __doc__)


def main(argv: list[str] | None = None) -> int:
    return tuning_main("finetune", argv, build_parser, check_model_args, _finetune)


def _finetune(args, cfg) -> int:
    train, val = tuning.read_examples(args, numbered_conversations)

    def build() -> SFTTrainer:
        model, tokenizer = tuning.load_tuned(args)
        tuning.prepare(args, model)
        return SFTTrainer(
            cfg, model, tokenizer, list(train.values()), list(val.values())
        )

    def result(history: dict) -> str:
        val_loss = history["val_loss"]
        val_text = f", val loss {val_loss[-1]:.4f}" if val_loss else ""
        return f"loss {history['loss'][-1]:.4f}{val_text}"

    return tuning.tune(
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
    tuning.report_left_out(trainer, args, train, val, "conversations", "no reply")
    print(
        f"{len(trainer.train_examples)} training conversations, "
        f"{len(trainer.val_examples)} validation; "
        f"{tuning.trained_parameters(trainer, args)}, {trainer.device}, from step "
        f"{trainer.step}",
        flush=True,
    )
