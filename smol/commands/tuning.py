"""What `smol finetune`, `smol dpo` and `smol grpo` share once their options are
checked (smol/commands/tuning_options.py): the checks on the output folder and on a
resume's settings, loading the model and putting LoRA on it, the report of the examples
left out for length, the run itself from start to the merged model (and the adapter)
written."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch

from smol.checkpoint import file_sha256, read_json
from smol.commands import runs
from smol.commands.common import UsageError
from smol.commands.train import fit_until_stopped
from smol.lora import apply_lora, count_trainable, merge_lora, save_peft_adapter
from smol.train_report import TrainingDiverged, log

# what a tuning run writes into --out: it is not written over unasked
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


def load(args, model: str | None):
    """(model, tokenizer) of `model` (a .gguf file, a folder or hub id; None: the
    bundled one) on --device."""
    from smol.pretrained import load_pretrained

    return load_pretrained(model, device=None if args.device == "auto" else args.device)


def load_tuned(args):
    """(model, tokenizer) of --model, whose context must hold --max-len."""
    model, tokenizer = load(args, args.model)
    check_context(model, args.max_len)
    return model, tokenizer


def prepare(args, model) -> None:
    """LoRA on the model as the options say (after seeding: its A matrices are
    drawn here), and the model in training mode."""
    torch.manual_seed(args.seed)
    if args.lora_r:
        apply_lora(
            model,
            args.lora_r,
            args.lora_alpha,
            args.lora_targets,
            args.lora_dropout,
        )
    model.train()


def check_context(model, max_len: int) -> None:
    context = model.config.max_position_embeddings
    if max_len > context:
        raise ValueError(
            f"--max-len {max_len} is longer than the model's context of "
            f"{context} tokens"
        )


def check_out(args, out: Path) -> None:
    """--out must be writable and hold no fine-tune, unless one is resumed or
    overwritten: else a usage error, found before any work."""
    found = [name for name in OUTPUTS if (out / name).exists()]
    if found and not (args.resume or args.overwrite):
        shown = ", ".join(found[:3]) + (", ..." if len(found) > 3 else "")
        raise UsageError(
            f"--out {out} already holds a fine-tune ({shown}): choose "
            "another folder, continue its run with --resume, or replace it with "
            "--overwrite"
        )
    runs.check_out(out, "--out")


def check_run_folder(args, verb: str) -> None:
    """Before any work: --out writable, holding no run unless it is resumed (then
    one of `smol VERB`'s) or overwritten; else a usage error."""
    out = Path(args.out)
    check_out(args, out)
    if args.resume:
        runs.check_resumed_kind(out, verb, "--out")


def resolved(model: str | None) -> str | None:
    """A model path, however it is spelt, as one absolute path; a hub id as given."""
    if model is not None and Path(model).exists():
        return str(Path(model).resolve())
    return model


def run_settings(args) -> dict:
    """What a resume must keep besides TrainConfig's settings: the model, the data
    (its files' sha256, for a command that reads --data) and LoRA's settings."""
    files = {}
    if hasattr(args, "data"):
        files["data"] = file_sha256(Path(args.data))
        files["val_data"] = file_sha256(Path(args.val_data)) if args.val_data else None
    return {
        "model": resolved(args.model),
        **files,
        "lora_r": args.lora_r,
        "lora_alpha": args.lora_alpha,
        "lora_dropout": args.lora_dropout,
        "lora_targets": args.lora_targets,
    }


def write_settings(path: Path, run: dict) -> None:
    path.write_text(json.dumps(run, indent=1), encoding="utf-8")


# Settings added after runs were saved without them, and the value those runs used.
ADDED_LATER = {"num_iterations": 1}


def check_resumed_settings(args, run: dict, path: Path, what: str) -> None:
    """A resume keeps the run's settings (those in the JSON file `path`; a setting
    added later counts as its ADDED_LATER value in an older run's file), unless
    --allow-changed-settings, which warns."""
    if not path.is_file():
        return  # no run to compare with: Trainer says there is nothing to resume
    saved = read_json(path)
    if not isinstance(saved, dict):
        raise ValueError(f"{path}: expected a JSON object of settings")
    saved = {**{k: v for k, v in ADDED_LATER.items() if k not in saved}, **saved}
    changed = [
        f"{k}: the run's {saved.get(k)!r}, now {v!r}"
        for k, v in run.items()
        if saved.get(k) != v
    ]
    if not changed:
        return
    if not args.allow_changed_settings:
        raise ValueError(
            f"resuming would not continue the same {what}: "
            f"{'; '.join(changed)}; resume with the run's settings, or pass "
            "--allow-changed-settings to continue anyway"
        )
    log(f"warning: resuming with changed settings: {'; '.join(changed)}")


def read_examples(args, read: Callable[[str], dict]) -> tuple[dict, dict]:
    """The numbered examples of --data and of --val-data (none without it), each
    file read by `read`."""
    return read(args.data), read(args.val_data) if args.val_data else {}


def report_left_out(trainer, args, train: dict, val: dict, examples: str, why: str):
    """A warning naming (by file and line) the `examples` the trainer left out for
    length (`why` says what they lack), and a note counting those cut."""
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
                f"warning: {len(dropped)} of {len(lines)} {what} {examples} have "
                f"{why} within --max-len {args.max_len} tokens and are left out: "
                f"{path}, lines {shown}"
            )
        if trainer.cut.get(what):
            log(
                f"note: {trainer.cut[what]} {what} {examples} are longer than "
                f"--max-len {args.max_len} tokens and are cut to it"
            )


def trained_parameters(trainer, args) -> str:
    """How many of the model's parameters train, and how (LoRA or fully)."""
    how = f"LoRA r={args.lora_r}" if args.lora_r else "full fine-tuning"
    trainable, total = count_trainable(trainer.model)
    return f"training {trainable:,} of {total:,} parameters ({how})"


def tune(
    args,
    settings_name: str,
    what: str,
    settings: dict,
    build: Callable,
    report: Callable,
    result: Callable[[dict], str],
) -> int:
    """The run of a tuning command (its folder checked by check_run_folder): a
    resume's settings checked (run_settings' and `settings`, kept in
    OUT/training/settings_name; `what` names the run); the trainer made by `build()`,
    then on the main rank the settings written and `report(trainer)`; at the end the
    model saved and a line `done: step N, {result(history)}; the merged model is in
    OUT`. With --overwrite the run is written beside OUT, and replaces the earlier
    one only once it is done (smol/commands/runs.py). The exit status of
    fit_until_stopped."""
    out = Path(args.out)
    stage = runs.staging(out) if args.overwrite else None
    run = {**run_settings(args), **settings}
    settings_file = (stage or out) / "training" / settings_name
    if args.resume:
        check_resumed_settings(args, run, settings_file, what)

    def start():
        trainer = build()
        if trainer.is_main:
            if not args.resume:
                write_settings(settings_file, run)
            report(trainer)
        return trainer

    def finish(trainer, history: dict) -> None:
        if trainer.is_main:
            save_model(trainer, args, stage or out)
            if stage is not None:
                runs.replace_run(stage, out, OUTPUTS)
            print(
                f"done: step {trainer.step}, {result(history)}; the merged model is "
                f"in {out}",
                flush=True,
            )

    with runs.replacing(stage, out):
        try:
            return fit_until_stopped(start, finish, discard=stage is not None)
        except TrainingDiverged as e:
            raise e.but(advice=advice(e)) from None


# the settings a diverged run may name that these commands take, as they say them
FLAGS = {"lr": "a lower --lr (now {:g})", "beta": "--beta 0 (now {:g}): no KL term"}


def advice(e: TrainingDiverged) -> str:
    """What to try after a divergence, in the command's flags (gradient clipping,
    at TrainConfig's default, has none)."""
    names = [name for name in e.causes if name in FLAGS]
    return "Try " + " or ".join(FLAGS[n].format(e.causes[n]) for n in names)


def save_model(trainer, args, out: Path) -> None:
    """The adapter (with LoRA) and the merged model, into out."""
    from smol.pretrained import save_pretrained

    model = trainer.model
    if args.lora_r:
        save_peft_adapter(model, out / "adapter", args.model)
        merge_lora(model)
    save_pretrained(model.float().eval(), trainer.tokenizer, out)
