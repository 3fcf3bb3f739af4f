"""Tune SmolLM2 by reinforcement learning on questions with checkable answers (GRPO):
each step samples --group-size replies to each of --batch-size questions of the
task's training split, rewards the right ones (and, with --format-weight, those that
are a number only), and pushes up the replies that beat their group's mean; with LoRA
(the KL term's reference: the model with its adapter off) or fully (--lora-r 0: a
frozen copy of the starting model).

    smol grpo --task add --lora-r 8 --group-size 8 --out runs/grpo
    smol grpo --task add --lora-r 8 --group-size 8 --out runs/grpo --resume

The second line, after a stop (SIGTERM, Ctrl-C), continues the run: the same replies
sampled and the same adapter, bit for bit, as a run that was never stopped. Every
--eval-every steps the greedy accuracy on held-out questions of the task is measured.
The result is a merged model folder as `smol finetune` writes it (and with LoRA the
adapter as peft saves it), each with a manifest.json of sha256 sums; the run's
checkpoints are in OUT/training. A folder holding a model or a run is not written
over without --resume or --overwrite, nor is the model being tuned."""

from __future__ import annotations

import argparse
import copy
import math
import os

import torch

from smol.commands.common import Parser, UsageError, parser, run
from smol.commands.train import FAILURES
from smol.commands.tuning import (
    check_run_folder,
    load_tuned,
    prepare,
    trained_parameters,
    tune,
)
from smol.commands.tuning_options import (
    add_model_options,
    add_run_options,
    check_beta,
    check_model_args,
    train_config,
)
from smol.config import MIN_TEMPERATURE
from smol.grpo import LOSS_TYPES
from smol.grpo_train import OPTIONS, GRPOTrainer, from_options
from smol.tasks import TASKS, pool
from smol.train import TrainConfig

# the settings a resume must keep besides TrainConfig's (which smol.resume checks)
SETTINGS_FILE = "grpo.json"
LRS = (5e-5, 1e-6)  # the default peak learning rates, with LoRA and without
# the options that set the trainer, in --help's order: flag, type, default, help
TRAINER_OPTIONS = (
    ("--group-size", int, 8, "replies sampled a question (>= 2)"),
    ("--beta", float, 0.04, "the weight of the KL term to the reference (0: none)"),
    ("--epsilon", float, 0.2, "the ratio's clip below (1 - eps)"),
    (
        "--epsilon-high",
        float,
        None,
        "the ratio's clip above (1 + eps; default: --epsilon)",
    ),
    (
        "--loss-type",
        None,
        "dapo",
        f"how token losses are averaged: {', '.join(LOSS_TYPES)}",
    ),
    ("--temperature", float, 1.0, "for sampling"),
    ("--max-new-tokens", int, 24, "the longest reply sampled"),
    ("--num-iterations", int, 1, "steps each batch of replies trains (>= 1)"),
    (
        "--format-weight",
        float,
        0.0,
        "a reward for a reply that is a number only (a right one earns 1)",
    ),
)


def build_parser() -> Parser:
    """The parser of `smol grpo`."""
    p = parser("grpo", __doc__)
    p.add_argument(
        "--task", required=True, help=f"the questions, one of {', '.join(TASKS)}"
    )
    add_model_options(p, "runs/grpo")
    for flag, kind, default, text in TRAINER_OPTIONS:
        p.add_argument(flag, type=kind, default=default, help=text)
    add_run_options(
        p, "question", LRS, "tokens a prompt and its reply may take together"
    )
    return p


def _parse_args(argv) -> tuple[argparse.Namespace, TrainConfig]:
    args = build_parser().parse_args(argv)
    if args.task not in TASKS:
        raise UsageError(
            f"--task: unknown task {args.task!r}, expected one of {', '.join(TASKS)}"
        )
    if args.group_size < 2:
        raise UsageError(
            f"--group-size must be at least 2, got {args.group_size}: a reply is "
            "rewarded against the others of its group"
        )
    for flag, value, least in (
        ("--beta", args.beta, None),
        ("--epsilon", args.epsilon, 0),
        ("--epsilon-high", args.epsilon_high, 0),
        ("--temperature", args.temperature, 0),
        ("--format-weight", args.format_weight, None),
    ):
        _check_number(flag, value, least)
    if args.temperature < MIN_TEMPERATURE:
        raise UsageError(
            f"--temperature must be at least {MIN_TEMPERATURE:g}, got "
            f"{args.temperature}"
        )
    check_beta(args.beta, zero="no KL term")
    if args.loss_type not in LOSS_TYPES:
        raise UsageError(
            f"--loss-type: unknown {args.loss_type!r}, expected one of "
            f"{', '.join(LOSS_TYPES)}"
        )
    if args.max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.num_iterations < 1:
        raise UsageError(f"--num-iterations must be >= 1, got {args.num_iterations}")
    check_model_args(args, "the model being tuned")
    questions = len(pool(args.task, "train"))
    if args.batch_size > questions:
        raise UsageError(
            f"--batch-size {args.batch_size} is more than the {questions} training "
            f"questions of {args.task}: give at most {questions}"
        )
    return args, train_config(args, LRS)


def check_memory(args, model) -> None:
    """A ValueError naming --group-size and --batch-size where the KV cache of a
    step's replies (each up to --max-len tokens) would not fit in the memory free
    on the model's device: found before sampling, not by the allocation."""
    c, device = model.config, next(model.parameters()).device
    per_token = 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim
    rows = args.group_size * args.batch_size
    need = rows * args.max_len * per_token * next(model.parameters()).element_size()
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
    else:
        free = _available_memory()
    if need > free:
        raise ValueError(
            f"--group-size {args.group_size} x --batch-size {args.batch_size} = "
            f"{rows:,} replies a step need {need / 2**30:,.1f} GiB for their KV "
            f"cache alone, more than the {free / 2**30:,.1f} GiB available on "
            f"{device.type}: lower them"
        )


def _available_memory() -> int:
    """Bytes of memory a process may take without swapping: Linux's MemAvailable
    (free pages and the page cache it can drop), else the free pages."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _check_number(flag: str, value, least: float | None) -> None:
    """A finite number, and above `least` when it is not None; None is left alone."""
    if value is None:
        return
    if not math.isfinite(value) or (least is not None and not value > least):
        more = f" > {least}" if least is not None else ""
        raise UsageError(f"{flag} must be a finite number{more}, got {value}")


def main(argv: list[str] | None = None) -> int:
    return run("smol grpo", lambda: _parse_args(argv), _grpo, FAILURES)


def _grpo(settings: tuple[argparse.Namespace, TrainConfig]) -> int:
    args, cfg = settings
    check_run_folder(args, "grpo")

    def build() -> GRPOTrainer:
        model, tokenizer = load_tuned(args)
        check_memory(args, model)
        reference = None
        if not args.lora_r and args.beta:
            reference = copy.deepcopy(model)  # frozen: the starting model
        prepare(args, model)
        return _trainer(args, cfg, model, tokenizer, reference)

    def result(history: dict) -> str:
        accuracy = history["val_accuracy"]
        held_out = f", held-out accuracy {accuracy[-1]:.3f}" if accuracy else ""
        return (
            f"loss {history['loss'][-1]:.4f}, reward {history['reward'][-1]:.3f}, "
            f"equal groups {history['equal_groups'][-1]:.2f}{held_out}"
        )

    return tune(
        args,
        SETTINGS_FILE,
        "GRPO run",
        {
            name: getattr(args, name)
            for name in ("task", *OPTIONS.split(), "format_weight")
        },
        build,
        lambda trainer: _report(trainer, args),
        result,
    )


def _trainer(args, cfg, model, tokenizer, reference) -> GRPOTrainer:
    """The GRPOTrainer; its error for a --max-len too short in the command's words."""
    try:
        return from_options(cfg, model, tokenizer, args, reference)
    except ValueError as e:
        if str(e).startswith("the longest prompt of"):
            raise ValueError(
                str(e)
                .replace("max_new_tokens", "--max-new-tokens")
                .replace("seq_len", "--max-len")
                + ": raise --max-len"
            ) from None
        raise


def _report(trainer: GRPOTrainer, args) -> None:
    """The questions, replies and settings trained with."""
    reference = "none (beta 0)"
    if args.beta:
        reference = (
            "the model with its adapter off" if args.lora_r else "the starting model"
        )
    print(
        f"{args.task}: {len(trainer.problems)} training questions, "
        f"{args.group_size} replies each, {len(trainer.held_out)} held out; "
        f"{trained_parameters(trainer, args)}, beta {args.beta:g}, reference "
        f"{reference}, {trainer.device}, from step {trainer.step}",
        flush=True,
    )
