"""DDP through torchrun: two CPU processes (gloo) train like one process with the same
global batch."""

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from tests.cli_args import ONE_LAYER, cli_args

# two processes on this machine, each running the module named next
TORCHRUN = [
    sys.executable,
    "-m",
    "torch.distributed.run",
    "--standalone",
    "--nproc_per_node=2",
    "-m",
]

ARGS = cli_args(
    ONE_LAYER,
    "--steps 3 --warmup-steps 1 --seq-len 32 --grad-accum 2 --eval-every 3 "
    "--eval-batches 2 --sample-tokens 0 --log-every 1",
)


def run(cmd, out_dir):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        cmd + ARGS + ["--out-dir", str(out_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads((out_dir / "summary.json").read_text()), done.stdout


def final_weights(out_dir):
    latest = (out_dir / "checkpoints" / "latest").read_text().strip()
    return load_file(out_dir / "checkpoints" / latest / "model.safetensors")


@pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
    reason="needs torch.distributed with gloo",
)
def test_two_ranks_match_one_process_with_the_same_global_batch(tmp_path):
    torchrun = [*TORCHRUN, "smol", "train"]
    ddp, ddp_out = run(torchrun + ["--batch-size", "2"], tmp_path / "ddp")
    single, single_out = run(
        [sys.executable, "-m", "smol", "train", "--batch-size", "4"],
        tmp_path / "single",
    )
    assert ddp["world_size"] == 2 and single["world_size"] == 1
    # the global batch: 2 ranks x 2 rows (or 4 rows) x 32 tokens x 2 accumulations
    assert "256 tokens/step" in ddp_out and "256 tokens/step" in single_out
    assert len(set(ddp["weights_digests"])) == 1, "the two ranks hold different weights"
    assert ddp["losses"] == pytest.approx(single["losses"], rel=1e-5)
    assert ddp["val_loss"] == pytest.approx(single["val_loss"], rel=1e-5)
    a, b = final_weights(tmp_path / "ddp"), final_weights(tmp_path / "single")
    assert a.keys() == b.keys()
    # Gradients agree to float rounding (sums in another order). AdamW's step
    # lr * m / sqrt(v) is about +-lr for any gradient, so where a gradient is near zero
    # rounding can move a weight by up to lr per step; everywhere else the weights
    # agree closely.
    for k in a:
        diff = (a[k] - b[k]).abs()
        assert diff.max() < 1e-3, k
        assert (diff > 1e-5).float().mean() < 1e-3, k


@pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
    reason="needs torch.distributed with gloo",
)
def test_a_signal_to_one_rank_stops_both_at_the_next_sync(tmp_path):
    """SIGTERM reaches rank 1 during step 2: the ranks agree at their next common sync
    (the log of step 4, or the checkpoint of step 3 when that comes first), save, and
    both stop there, rank 1 not before rank 0 has written the checkpoint; rank 0 names
    a signal to another rank. A rank that stopped alone would leave the other waiting
    in a collective: each rank's alarm ends it. Resuming past a damaged checkpoint,
    both ranks take the newest intact one and only rank 0 warns."""
    cmd = [*TORCHRUN, "tests.ddp_signal", str(tmp_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    rank0, rank1 = (
        json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)
    )
    for run, step in (("log", 4), ("save", 3)):
        where = str(tmp_path / run / "checkpoints" / f"step_{step:07d}")
        assert rank1[run] == {
            "stopped": step,
            "signal": "SIGTERM",
            "path": where,
            "complete": True,
        }
        assert rank0[run] == {
            "stopped": step,
            "signal": "a signal to another rank",
            "path": where,
            "complete": True,
        }
        assert (tmp_path / run / "checkpoints" / f"step_{step:07d}").is_dir()
    assert rank0["resume"] == {"step": 3, "warned": True}
    assert rank1["resume"] == {"step": 3, "warned": False}
