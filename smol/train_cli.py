"""The training command line.

python -m smol.train --preset tiny --steps 300 --out-dir runs/tiny
torchrun --nproc_per_node=2 -m smol.train --preset tiny --steps 300 --out-dir
runs/ddp
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch.distributed as dist

from smol.checkpoint import CheckpointError
from smol.config import SmolConfig
from smol.train import TrainConfig, Trainer, TrainingDiverged, plot_history


def _parse_args(argv) -> TrainConfig:
    p = argparse.ArgumentParser(
        prog="python -m smol.train", description="Train a SmolLM (torchrun for DDP)."
    )
    defaults = TrainConfig()
    for f in dataclasses.fields(TrainConfig):
        if f.name == "model_overrides":
            continue
        flag, value = "--" + f.name.replace("_", "-"), getattr(defaults, f.name)
        if isinstance(value, bool):
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=value)
        else:
            p.add_argument(flag, type=type(value), default=value)
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a model config field, e.g. --set num_hidden_layers=2",
    )
    args = vars(p.parse_args(argv))
    overrides = {}
    for item in args.pop("set"):
        key, _, value = item.partition("=")
        kinds = {f.name: f.type for f in dataclasses.fields(SmolConfig)}
        if key not in kinds or not value:
            p.error(
                f"--set expects FIELD=VALUE with FIELD one of {sorted(kinds)}, got "
                f"{item!r}"
            )
        overrides[key] = {
            "int": int,
            "float": float,
            "bool": lambda v: v.lower() in ("1", "true", "yes"),
            "str": str,
        }[kinds[key]](value)
    return TrainConfig(**args, model_overrides=overrides)


def main(argv=None) -> int:
    cfg = _parse_args(argv)
    trainer = None
    try:
        trainer = Trainer(cfg)
        if trainer.is_main:
            print(
                f"{trainer.model.count_params():,} parameters, {trainer.device}, "
                f"{trainer.amp_dtype}, "
                f"world size {trainer.world_size}, {trainer.tokens_per_step:,} "
                "tokens/step, "
                f"from step {trainer.step}",
                flush=True,
            )
        history = trainer.fit()
        summary = trainer.summary()
        if trainer.is_main:
            out = Path(cfg.out_dir)
            (out / "summary.json").write_text(json.dumps(summary, indent=1))
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt

            plot_history(
                history, title=f"{cfg.preset}: {cfg.steps} steps"
            ).figure.savefig(out / "loss.png", dpi=120)
            plt.close("all")
            mfu = f", MFU {summary['mfu']:.1%}" if summary["mfu"] else ""
            val = (
                f", val loss {summary['val_loss']:.4f}"
                if summary["val_loss"] is not None
                else ""
            )
            print(
                f"done: step {summary['step']}, loss {summary['loss']:.4f}{val}, "
                f"{summary['tokens_per_s']:,.0f} tokens/s{mfu}; {out / 'summary.json'}",
                flush=True,
            )
            if cfg.sample_tokens:
                print("sample:", repr(trainer.sample()), flush=True)
        return 0
    except (ValueError, FileNotFoundError, CheckpointError, TrainingDiverged) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
