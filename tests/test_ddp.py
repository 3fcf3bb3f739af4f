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
    return json.loads((out_dir / "summary.json").read_text())


def final_weights(out_dir):
    latest = (out_dir / "checkpoints" / "latest").read_text().strip()
    return load_file(out_dir / "checkpoints" / latest / "model.safetensors")


@pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
    reason="needs torch.distributed with gloo",
)
def test_two_ranks_match_one_process_with_the_same_global_batch(tmp_path):
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "smol.train",
    ]
    ddp = run(torchrun + ["--batch-size", "2"], tmp_path / "ddp")
    single = run(
        [sys.executable, "-m", "smol.train", "--batch-size", "4"], tmp_path / "single"
    )
    assert ddp["world_size"] == 2 and single["world_size"] == 1
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
