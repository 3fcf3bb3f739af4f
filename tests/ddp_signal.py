"""Run by tests/test_ddp.py under torchrun (two CPU processes, gloo): SIGTERM reaches
rank 1 only, during step 2, and both ranks must stop at the same step, the next one
where they all sync (a log, an evaluation or a checkpoint), rank 1 only once rank 0
(slowed down) has written the checkpoint. Then both resume from a folder whose newest
checkpoint is damaged: only rank 0 says so. Each rank writes what it saw to
OUT/rank<r>.json:

    torchrun --nproc_per_node=2 -m tests.ddp_signal OUT
"""

import contextlib
import io
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from smol import resume
from smol.interrupt import TrainingInterrupted
from smol.train import TrainConfig, Trainer
from tests.cli_args import ONE_LAYER

# log_every, ckpt_every: the first sync after step 2 is a log (step 4) in one run,
# a checkpoint (step 3) in the other.
RUNS = {"log": (4, 0), "save": (4, 3)}


def config(out: Path, log_every: int, ckpt_every: int, **changes) -> TrainConfig:
    return TrainConfig(
        preset="tiny",
        model_overrides={**ONE_LAYER, "vocab_size": 64, "max_position_embeddings": 64},
        steps=8,
        batch_size=2,
        seq_len=16,
        warmup_steps=1,
        eval_every=0,
        log_every=log_every,
        ckpt_every=ckpt_every,
        sample_tokens=0,
        out_dir=str(out),
        progress=False,
        device="cpu",
        **changes,
    )


STREAM = torch.arange(4000) % 61


def stop(out: Path, log_every: int, ckpt_every: int) -> dict:
    cfg = config(out, log_every, ckpt_every)
    t = Trainer(cfg, train_tokens=STREAM, val_tokens=STREAM[:400])
    take = t.train_step

    def train_step():
        if t.rank == 1 and t.step + 1 == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return take()

    t.train_step = train_step
    try:
        t.fit()
    except TrainingInterrupted as e:
        # written in full before any rank learns where it is (rank 0 saves slowly)
        complete = (e.path / "manifest.json").is_file()
        return {
            "stopped": e.step,
            "signal": e.signal_name,
            "path": str(e.path),
            "complete": complete,
        }
    return {"stopped": None, "step": t.step}


def resume_past_damage(out: Path) -> dict:
    """Both ranks resume from out/checkpoints, whose newest checkpoint (a copy of step
    3 as step 5, without its state.pt) is damaged; rank 0 damages it, both wait."""
    root = out / "checkpoints"
    if dist.get_rank() == 0:
        shutil.copytree(root / "step_0000003", root / "step_0000005")
        (root / "step_0000005" / "state.pt").unlink()
    dist.barrier()
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        t = Trainer(
            config(out, 4, 3, resume=True), train_tokens=STREAM, val_tokens=STREAM[:400]
        )
    return {"step": t.step, "warned": "warning:" in err.getvalue()}


def slow_on_rank_0(save):
    def slowly(trainer, root):
        if trainer.rank == 0:
            time.sleep(1)  # rank 1 must wait for the checkpoint, not race past it
        return save(trainer, root)

    return slowly


def main(out: Path) -> None:
    # A rank that waits for the other in a collective would wait for half an hour
    # (gloo's timeout): SIGALRM ends it, and torchrun the other.
    signal.alarm(90)
    resume.save_trainer = slow_on_rank_0(resume.save_trainer)
    found = {name: stop(out / name, *every) for name, every in RUNS.items()}
    found["resume"] = resume_past_damage(out / "save")
    rank = int(os.environ["RANK"])
    (out / f"rank{rank}.json").write_text(json.dumps(found))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
