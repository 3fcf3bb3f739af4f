"""The GPU check's dry run: without CUDA, bench/gpu_check.sh says so, runs the benchmark
scripts on the CPU with the tiny preset, copies their results to the folder it is given,
and exits 0."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="on a GPU the check runs for minutes"
)
def test_gpu_check_dry_run_on_cpu(tmp_path):
    env = {**os.environ, "PY": sys.executable, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        ["bash", "bench/gpu_check.sh", str(tmp_path / "out")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    assert "no CUDA device here" in out and "every part passed" in out
    for name in ("train_gpu_cpu.csv", "generate_cpu.csv", "generate.log", "train.log"):
        assert (tmp_path / "out" / name).is_file(), name
    table = (tmp_path / "out" / "generate_cpu.csv").read_text()
    assert "transformers generate" in table and "smol, speculative" in table
