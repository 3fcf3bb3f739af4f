"""Argument lists of `smol train` for the tests: the tiny preset on CPU,
without a progress bar; and a command run in a subprocess, stopped by a signal."""

import os
import signal
import subprocess
import sys
import time

# A one-layer model of the tiny preset, small enough for a test on a CPU.
ONE_LAYER = {
    "num_hidden_layers": 1,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
}


def cli_args(model: dict, options: str, *more: str) -> list[str]:
    """`--set FIELD=VALUE` for each field of `model`, then `options` as typed on a
    command line, then `more` as they are (paths, say), --no-progress and --device
    cpu."""
    args = ["--preset", "tiny"]
    for name, value in model.items():
        args += ["--set", f"{name}={value}"]
    return args + options.split() + [*more, "--no-progress", "--device", "cpu"]


def run_smol(argv: list[str], mark=None, sig=signal.SIGTERM) -> tuple[int, str, str]:
    """`python -m smol ARGV` in a subprocess on one thread -> (exit status, stdout,
    stderr); with `mark`, send `sig` once that path (a checkpoint) exists."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "smol", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    if mark is not None:
        deadline = time.monotonic() + 240  # a busy machine: minutes, not seconds
        while not mark.exists() and proc.poll() is None:
            if time.monotonic() > deadline:  # never signalled before its handler
                proc.kill()
                out, err = proc.communicate()
                raise AssertionError(f"no {mark} after 240 s: {err[-2000:]}")
            time.sleep(0.01)
        proc.send_signal(sig)  # nothing, where the run ended already
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out, err
