"""Run by tests/test_ddp.py under torchrun (two CPU processes, gloo): SIGTERM reaches
rank 1 only, during step 2, and both ranks must stop at the same step, the next one
where they all sync (a log, an evaluation or a checkpoint). Each rank writes where it
stopped to OUT/rank<r>.json:

    torchrun --nproc_per_node=2 -m tests.ddp_signal OUT
"""

import json
import os
import signal
import sys
from pathlib import Path

import torch

from smol.interrupt import TrainingInterrupted
from smol.train import TrainConfig, Trainer
from tests.cli_args import ONE_LAYER

# log_every, ckpt_every: the first sync after step 2 is a log (step 4) in one run,
# a checkpoint (step 3) in the other.
RUNS = {"log": (4, 0), "save": (4, 3)}


def stop(out: Path, log_every: int, ckpt_every: int) -> dict:
    cfg = TrainConfig(
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
    )
    stream = torch.arange(4000) % 61
    t = Trainer(cfg, train_tokens=stream, val_tokens=stream[:400])
    take = t.train_step

    def train_step():
        if t.rank == 1 and t.step + 1 == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return take()

    t.train_step = train_step
    try:
        t.fit()
    except TrainingInterrupted as e:
        return {"stopped": e.step, "signal": e.signal_name, "path": str(e.path)}
    return {"stopped": None, "step": t.step}


def main(out: Path) -> None:
    # A rank that waits for the other in a collective would wait for half an hour
    # (gloo's timeout): SIGALRM ends it, and torchrun the other.
    signal.alarm(90)
    found = {name: stop(out / name, *every) for name, every in RUNS.items()}
    rank = int(os.environ["RANK"])
    (out / f"rank{rank}.json").write_text(json.dumps(found))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
