"""Train a SmolLM (torchrun for DDP); the run's summary.json, loss.png and model (a
model folder that `smol generate --source OUT_DIR`, `smol chat`, `smol export` and
transformers load) go into its out-dir.

    smol train --preset tiny --steps 300 --out-dir runs/tiny
    smol train --preset tiny --steps 300 --out-dir runs/tiny --resume
    torchrun --nproc_per_node=2 -m smol train --preset tiny --out-dir runs/ddp
    smol train --data my_texts/ --tokenizer bpe:4096 --preset tiny --out-dir runs/mine
    smol train --init smollm2 --data plays.txt --lr 1e-4 --out-dir runs/continued

--data is tokenized once into token shards (OUT_DIR/data unless --shards), which a
resume, or another run given the same --shards, reuses while their manifest matches;
1 document in round(1 / --val-fraction) is held out whole for validation.

A usage error (a bad flag or setting) is found before any work. A failure while running
is an unwritable or occupied out-dir, a damaged checkpoint, divergence. SIGTERM or
Ctrl-C stops training after saving a checkpoint, with the status of a process stopped by
that signal, so that a scheduler knows the run is not finished and can start it again
with --resume. --overwrite replaces the run in out-dir only once the new one is done:
one that fails or is stopped leaves the earlier run as it was."""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from smol.checkpoint import CheckpointError
from smol.commands import runs
from smol.commands.common import Parser, Terminated, UsageError, parser, run
from smol.config import SmolConfig
from smol.interrupt import TrainingInterrupted
from smol.shards import MANIFEST, describe
from smol.train import TrainConfig, Trainer
from smol.train_config import NAMED_TOKENIZERS
from smol.train_report import TrainingDiverged, plot_history

# Failures while running: one line on stderr, exit status 1.
FAILURES = (ValueError, OSError, CheckpointError, TrainingDiverged)
# what a run writes into its out-dir: --overwrite replaces them once the new run is done
OUTPUTS = ("checkpoints", "summary.json", "loss.png", "model")


def _parse_bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes"):
        return True
    if text.lower() in ("0", "false", "no"):
        return False
    raise ValueError("expected true or false")


def _model_override(item: str) -> tuple[str, object]:
    """--set FIELD=VALUE -> (FIELD, VALUE parsed as the SmolConfig field's type)."""
    key, _, text = item.partition("=")
    kinds = {f.name: f.type for f in dataclasses.fields(SmolConfig)}
    if key not in kinds:
        raise UsageError(
            f"--set {item}: unknown model setting {key!r} (one of "
            f"{', '.join(sorted(kinds))})"
        )
    parse = {"int": int, "float": float, "bool": _parse_bool, "str": str}[kinds[key]]
    try:
        return key, parse(text)
    except ValueError:
        raise UsageError(
            f"--set {item}: expected "
            f"{'true or false' if parse is _parse_bool else 'an ' + kinds[key]}"
        )


# the options of training on your own text (smol.sources, smol.shards)
DATA_HELP = {
    "tokenizer": "auto (from the model's vocab_size), shakespeare or smollm2; with "
    "--data also bpe:N (a byte-level BPE of N tokens learnt from its training "
    "documents, saved with the run) or a tokenizer folder or tokenizer.json",
    "data": "train on your own text: a text file; a folder of .txt, .md, .text, "
    ".jsonl and .parquet files, read recursively in sorted order; a .jsonl file (each "
    "line's text field); a .parquet file (its text column), or hf:NAME, a Hugging "
    "Face dataset streamed (online). Default: the bundled plays",
    "data_config": "hf:NAME's configuration, e.g. sample-10BT",
    "data_files": "hf:NAME's data_files, e.g. --data hf:parquet --data-files x.parquet",
    "max_tokens": "tokenize at most this many tokens of --data (0: all of it; a "
    "large hub dataset, e.g. hf:HuggingFaceFW/fineweb-edu --data-config sample-10BT, "
    "wants one)",
    "val_fraction": "the fraction of --data's documents (a text file's pieces of "
    "about 4 KB) held out whole for validation",
    "shards": "the folder of --data's token shards (train.bin, val.bin, "
    "manifest.json, the tokenizer): default OUT_DIR/data; name one to share a "
    "tokenization between runs. Shards of another source or tokenizer are refused, "
    "never written over",
    "init": "start from these weights, with their config and their own tokenizer: "
    "smollm2 (the released model smol finetune starts from), a model folder or a "
    ".gguf file; --preset is then unused",
}


def build_parser() -> Parser:
    """The parser of `smol train`: a flag for each TrainConfig field, and --set."""
    p = parser("train", __doc__)
    defaults = TrainConfig()
    for f in dataclasses.fields(TrainConfig):
        if f.name == "model_overrides":
            continue
        if f.name == "resume":
            add_resume_option(p, "out-dir")
            continue
        flag, value = "--" + f.name.replace("_", "-"), getattr(defaults, f.name)
        if isinstance(value, bool):
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=value)
        else:
            p.add_argument(
                flag, type=type(value), default=value, help=DATA_HELP.get(f.name)
            )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a model config field, e.g. --set num_hidden_layers=2",
    )
    return p


def _parse_args(argv) -> TrainConfig:
    args = vars(build_parser().parse_args(argv))
    overrides = dict(_model_override(item) for item in args.pop("set"))
    try:
        cfg = TrainConfig(**args, model_overrides=overrides)
    except ValueError as e:
        raise UsageError(str(e)) from None
    check_named_tokenizer(cfg)
    return cfg


def check_named_tokenizer(cfg: TrainConfig) -> None:
    """A usage error where the tokenizer named (or auto's choice) has more tokens than
    the model's vocabulary, as a bpe:N has: its size is known before any work. (A
    run given its token streams in Python takes any; the command never gives them.)"""
    if cfg.init:
        return  # the model's own tokenizer
    vocab, name = cfg.model_config().vocab_size, cfg.with_tokenizer().tokenizer
    size = NAMED_TOKENIZERS.get(name, 0)
    if size > vocab:
        named = name if name == cfg.tokenizer else f"{cfg.tokenizer} ({name})"
        raise UsageError(
            f"tokenizer {named} has {size} tokens; the {cfg.preset} model's "
            f"vocab_size is {vocab}: give --set vocab_size={size} or another "
            "--tokenizer"
        )


def add_resume_option(p: argparse.ArgumentParser, out: str) -> None:
    """--resume [PATH]: False without it, "latest" alone, else the PATH given."""
    p.add_argument(
        "--resume",
        nargs="?",
        const="latest",
        default=False,
        metavar="PATH",
        help=f"continue the run in {out} from its newest intact checkpoint "
        "(--resume or --resume latest), or from the checkpoint folder PATH",
    )


def main(argv: list[str] | None = None) -> int:
    return run("smol train", lambda: _parse_args(argv), _train, FAILURES)


def _train(cfg: TrainConfig) -> int:
    """Train, then write summary.json and loss.png into out_dir (with --overwrite:
    beside it, then in place of the earlier run's, smol/commands/runs.py)."""
    out = Path(cfg.out_dir)
    check_earlier_results(cfg)
    runs.check_out(out, "out_dir")
    if cfg.shards and not (Path(cfg.shards) / MANIFEST).is_file():
        runs.check_out(Path(cfg.shards), "shards")  # to be written, not reused
    if cfg.resume:
        runs.check_resumed_kind(out, "train", "out_dir")
    stage = runs.staging(out) if cfg.overwrite else None
    if stage is not None:
        cfg = dataclasses.replace(cfg, out_dir=str(stage))

    def start() -> Trainer:
        trainer = Trainer(cfg)
        if trainer.is_main:
            print(
                f"{trainer.model.count_params():,} parameters, {trainer.device}, "
                f"{trainer.amp_dtype}, world size {trainer.world_size}, "
                f"{trainer.tokens_per_step:,} tokens/step, from step {trainer.step}",
                flush=True,
            )
            if trainer.data_info is not None:
                print(describe(trainer.data_info), flush=True)
        return trainer

    def finish(trainer: Trainer, history: dict) -> None:
        summary = trainer.summary()  # every rank: it gathers their weights' digests
        if trainer.is_main:
            _write_results(trainer, history, summary, out)

    made = [out, *([Path(cfg.shards)] if cfg.shards else [])]
    with runs.replacing(stage, out):
        return runs.removed_unless_done(
            made, lambda: fit_until_stopped(start, finish, discard=stage is not None)
        )


def check_earlier_results(cfg: TrainConfig) -> None:
    """A usage error where out_dir holds an earlier run's summary.json (which this
    run would replace) and neither --resume nor --overwrite says to go on."""
    summary = Path(cfg.out_dir) / "summary.json"
    if summary.exists() and not (cfg.resume or cfg.overwrite):
        raise UsageError(
            f"out_dir {cfg.out_dir} holds an earlier run's results ({summary.name}): "
            "continue that run with --resume, replace it with --overwrite, or give "
            "another --out-dir"
        )


def fit_until_stopped(
    start: Callable[[], Trainer],
    finish: Callable[[Trainer, dict], None],
    discard: bool = False,
) -> int:
    """Make a trainer (`start`), fit it, then `finish(trainer, history)` on every rank;
    0 when done. A signal that stopped training gives the status of a process stopped
    by it (128 + its number), after one line saying where the checkpoint is (with
    `discard`, a run that replaces another: none is kept)."""
    trainer = None
    try:
        trainer = start()
        finish(trainer, trainer.fit())
        return 0
    except TrainingInterrupted as e:
        if trainer.is_main:
            text = f"stopped by {e.signal_name} after step {e.step}"
            print(text if discard else e, file=sys.stderr, flush=True)
        if e.signal_name not in signal.Signals.__members__:
            return 1
        return 128 + signal.Signals[e.signal_name].value
    except TrainingDiverged as e:
        if not discard:
            raise
        raise e.but(kept="the new run is discarded") from None
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (Terminated) outside a step
        saved = trainer.last_checkpoint if trainer is not None and not discard else None
        where = f"the last checkpoint is {saved}" if saved else "nothing was saved"
        stopped = "stopped by SIGTERM" if isinstance(e, Terminated) else "interrupted"
        print(f"{stopped}; {where}", file=sys.stderr, flush=True)
        return 128 + (signal.SIGTERM if isinstance(e, Terminated) else signal.SIGINT)


def _write_results(trainer: Trainer, history: dict, summary: dict, final: Path):
    """summary.json, loss.png and the trained model's folder in out_dir, the final
    numbers and a sample printed; a run written beside `final` (--overwrite) then
    takes the earlier run's place."""
    from smol.pretrained import save_pretrained

    cfg, out = trainer.cfg, Path(trainer.cfg.out_dir)
    (out / "summary.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    save_pretrained(trainer.model, trainer.tokenizer, out / "model")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    title = f"{cfg.preset}: {cfg.steps} steps"
    plot_history(history, title=title).figure.savefig(out / "loss.png", dpi=120)
    plt.close("all")
    mfu = f", MFU {summary['mfu']:.1%}" if summary["mfu"] else ""
    val_loss = summary["val_loss"]
    val = f", val loss {val_loss:.4f}" if val_loss is not None else ""
    if out != final:
        runs.replace_run(out, final, OUTPUTS)
    print(
        f"done: step {summary['step']}, loss {summary['loss']:.4f}{val}, "
        f"{summary['tokens_per_s']:,.0f} tokens/s{mfu}; {final / 'summary.json'}",
        flush=True,
    )
    print(f"model: {final / 'model'} (smol generate --source {final})", flush=True)
    if cfg.sample_tokens:
        print("sample:", repr(trainer.sample()), flush=True)
