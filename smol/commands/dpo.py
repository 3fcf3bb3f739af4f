"""Tune SmolLM2 to prefer the chosen reply of each pair over the rejected one (DPO),
with LoRA (the reference: the model with its adapter off) or fully (the reference: a
frozen copy of the starting model, or --reference).

    smol dpo --data pairs.jsonl --lora-r 8 --beta 0.1 --out runs/dpo
    smol dpo --data pairs.jsonl --lora-r 8 --beta 0.1 --out runs/dpo --resume

The second line, after a stop (SIGTERM, Ctrl-C), continues the run: the same adapter,
bit for bit, as a run that was never stopped.

Each line of the JSONL file is one pair in TRL's conversational format, `{"prompt":
[{"role": "user", "content": "..."}], "chosen": [{"role": "assistant", "content":
"..."}], "rejected": [{"role": "assistant", "content": "..."}]}`. Plain strings are
taken too, `{"prompt": "...", "chosen": "...", "rejected": "..."}`, as that pair's
messages: in the chat template, with its default system prompt, as SmolLM2 is asked
and answers. (TRL's DPOTrainer trains plain strings as they are, without the
template: the same file trains other tokens there.) The result is a merged model
folder as `smol finetune` writes it (and with LoRA the adapter as peft saves it), each
with a manifest.json of sha256 sums; the run's checkpoints are in OUT/training. A
folder holding a model or a run is not written over without --resume or --overwrite,
nor is the model being tuned."""

from __future__ import annotations

import copy
from pathlib import Path

from smol.commands import tuning
from smol.commands.common import Parser, UsageError
from smol.commands.tuning_options import (
    check_beta,
    check_model_args,
    command_parser,
    tuning_main,
)
from smol.dpo import DPOTrainer, numbered_pairs

# the settings a resume must keep besides TrainConfig's (which smol.resume checks)
SETTINGS_FILE = "dpo.json"


def build_parser() -> Parser:
    """The parser of `smol dpo` (its defaults: tuning_options.DEFAULTS)."""
    return command_parser("dpo", __doc__, _dpo_options)


def _dpo_options(p: Parser) -> None:
    """The reference, beta and length normalisation, after the model's options."""
    p.add_argument(
        "--reference",
        help="the reference model (a .gguf file, a folder or hub id) of the same "
        "config (default: with LoRA the model with its adapter off, else a frozen "
        "copy of the model)",
    )
    p.add_argument(
        "--beta",
        type=float,
        default=0.1,
        help="how far the policy may move from the reference (larger: less)",
    )
    p.add_argument(
        "--length-normalized",
        action="store_true",
        help="compare mean instead of summed log-probabilities per reply token "
        "(TRL's sigmoid_norm)",
    )


def _check_args(args) -> None:
    check_beta(args.beta)
    check_model_args(args, "the model being tuned")
    if args.reference and Path(args.reference).resolve() == Path(args.out).resolve():
        raise UsageError(f"--out {args.out} is the reference model: write elsewhere")


def main(argv: list[str] | None = None) -> int:
    return tuning_main("dpo", argv, build_parser, _check_args, _dpo)


def _dpo(args, cfg) -> int:
    train, val = tuning.read_examples(args, numbered_pairs)

    def build() -> DPOTrainer:
        model, tokenizer = tuning.load_tuned(args)
        reference = None
        if args.reference:
            reference, _ = tuning.load(args, args.reference)
            if reference.config != model.config:
                raise ValueError(
                    f"--reference {args.reference} has another config than the "
                    "model: DPO compares the two on the same tokens"
                )
        elif not args.lora_r:
            reference = copy.deepcopy(model)  # frozen: the starting model
        tuning.prepare(args, model)
        return _trainer(args, cfg, model, tokenizer, train, val, reference)

    def result(history: dict) -> str:
        val = history["val_loss"]
        val_text = (
            f", val loss {val[-1]:.4f}, val accuracy {history['val_accuracy'][-1]:.2f}"
            if val
            else ""
        )
        return (
            f"loss {history['loss'][-1]:.4f}, margin {history['margin'][-1]:.4f}, "
            f"accuracy {history['accuracy'][-1]:.2f}{val_text}"
        )

    return tuning.tune(
        args,
        SETTINGS_FILE,
        "DPO run",
        {
            "reference": tuning.resolved(args.reference),
            "beta": args.beta,
            "length_normalized": args.length_normalized,
        },
        build,
        lambda trainer: _report_data(trainer, args, train, val),
        result,
    )


def _trainer(args, cfg, model, tokenizer, train, val, reference) -> DPOTrainer:
    """The DPOTrainer, its error for pairs that are all too long in the command's
    words (--max-len, the file)."""
    try:
        return DPOTrainer(
            cfg,
            model,
            tokenizer,
            list(train.values()),
            list(val.values()),
            beta=args.beta,
            reference=reference,
            length_normalized=args.length_normalized,
        )
    except ValueError as e:
        for what, path in (("training", args.data), ("validation", args.val_data)):
            if str(e).startswith(f"no {what} pair has both replies within"):
                raise ValueError(
                    f"no pair of {path} has both replies within --max-len "
                    f"{args.max_len} tokens (the prompt and a reply's first "
                    "token must fit): raise --max-len"
                ) from None
        raise


def _report_data(trainer: DPOTrainer, args, train: dict, val: dict) -> None:
    """The pairs trained on, and a warning naming (by line) those left out or cut
    for length."""
    tuning.report_left_out(trainer, args, train, val, "pairs", "a reply with no token")
    reference = args.reference or (
        "the model with its adapter off" if args.lora_r else "the starting model"
    )
    print(
        f"{len(trainer.train_examples)} training pairs, {len(trainer.val_examples)} "
        f"validation; {tuning.trained_parameters(trainer, args)}, beta "
        f"{args.beta:g}, reference {reference}, {trainer.device}, from step "
        f"{trainer.step}",
        flush=True,
    )
