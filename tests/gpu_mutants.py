"""The mutants of tests/mutants_need_a_gpu.csv, run on a GPU against the tests that
should kill them (tests/test_cuda.py, the GPU test of generation, the two-process DDP
test). mutmut finds them on a CPU, where every test passes them; this applies each one
as a one-line change to a copy of smol and runs its tests there.

    python -m tests.gpu_mutants --csv bench/results/gpu_mutants_cuda.csv [--jobs 6]
    python -m tests.gpu_mutants --check   # every change still applies to smol's source

A mutant whose tests need two GPUs (NCCL, a second rank's device) is listed, not run, on
a machine with one.
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
TRAINER = "tests/test_cuda.py::test_the_trainer_finds_the_gpu_and_trains_there"
FP16 = (
    "tests/test_cuda.py::test_float16_training_scales_its_loss_on_the_trainers_device"
)
CLOCK = "tests/test_cuda.py::test_tokens_per_second_counts_finished_work"
LOAD = (
    "tests/test_cuda.py::"
    "test_a_gpu_checkpoint_loads_its_state_on_the_cpu_and_weights_where_asked"
)
RNG = (
    "tests/test_cuda.py::test_the_cuda_generator_is_saved_and_restored",
    "tests/test_cuda.py::test_a_gpu_resume_draws_what_the_uninterrupted_run_draws",
)
MASK = "tests/test_fast_generation.py::test_generate_on_a_gpu_makes_every_tensor_there"
DDP = "tests/test_ddp.py"
TWO_GPUS = ()  # tests that need two GPUs: not run on one


class Mutant(NamedTuple):
    name: str  # as mutmut names it
    file: str
    function: str  # the change is made in this function's body
    original: str
    mutated: str
    tests: tuple[str, ...]
    gpus: int = 1  # GPUs its tests need


def m(name, file, function, original, mutated, tests, gpus=1) -> Mutant:
    tests = (tests,) if isinstance(tests, str) else tuple(tests)
    return Mutant(name, file, function, original, mutated, tests, gpus)


T, C, G = "smol/train.py", "smol/checkpoint.py", "smol/generate.py"
INIT = "smol.train.xǁTrainerǁ__init____mutmut_"
BACK = "smol.train.xǁTrainerǁ_read_back__mutmut_"
DEVICE_LINE = "self.model, self.device, local_rank, self.world_size, cfg.compile"
SCALER_LINE = "self.device.type, enabled=self.amp_dtype == torch.float16"
STATE = 'torch.load(path / "state.pt", map_location="cpu", weights_only=True)'
WEIGHTS = 'load_file(path / "model.safetensors", device=str(device))'
MUTANTS = [
    m(
        INIT + "9",
        T,
        "__init__",
        "setup_distributed(cfg.device)",
        "setup_distributed(None)",
        DDP,
    ),
    m(
        INIT + "12",
        T,
        "__init__",
        "training_device(cfg.device, local_rank)",
        "training_device(cfg.device, None)",
        TRAINER,
    ),
    m(
        INIT + "14",
        T,
        "__init__",
        "training_device(cfg.device, local_rank)",
        "training_device(cfg.device, )",
        TWO_GPUS,
        gpus=2,
    ),
    m(
        INIT + "34",
        T,
        "__init__",
        "else model).to(self.device)",
        "else model).to(None)",
        TRAINER,
    ),
    m(
        INIT + "45",
        T,
        "__init__",
        SCALER_LINE,
        "None, enabled=self.amp_dtype == torch.float16",
        FP16,
    ),
    m(INIT + "46", T, "__init__", SCALER_LINE, "self.device.type, enabled=None", FP16),
    m(
        INIT + "63",
        T,
        "__init__",
        DEVICE_LINE,
        "self.model, None, local_rank, self.world_size, cfg.compile",
        TWO_GPUS,
        gpus=2,
    ),
    m(
        INIT + "64",
        T,
        "__init__",
        DEVICE_LINE,
        "self.model, self.device, None, self.world_size, cfg.compile",
        TWO_GPUS,
        gpus=2,
    ),
    m(
        BACK + "6",
        T,
        "_read_back",
        'if self.device.type == "cuda":',
        'if self.device.type == "XXcudaXX":',
        CLOCK,
    ),
    m(
        BACK + "7",
        T,
        "_read_back",
        'if self.device.type == "cuda":',
        'if self.device.type == "CUDA":',
        CLOCK,
    ),
    m(
        BACK + "20",
        T,
        "_read_back",
        "return any_rank_caught(caught, self.device)",
        "return any_rank_caught(caught, None)",
        TWO_GPUS,
        gpus=2,
    ),
    m(
        "smol.train.xǁTrainerǁmfu__mutmut_8",
        T,
        "mfu",
        "self.peak, self.world_size)",
        "self.peak, )",
        TWO_GPUS,
        gpus=2,
    ),
    m(
        "smol.generate.x__prompt_mask__mutmut_22",
        G,
        "_prompt_mask",
        "attention_mask.to(device=input_ids.device, dtype=torch.long)",
        "attention_mask.to(device=None, dtype=torch.long)",
        MASK,
    ),
    m(
        "smol.generate.x__prompt_mask__mutmut_24",
        G,
        "_prompt_mask",
        "attention_mask.to(device=input_ids.device, dtype=torch.long)",
        "attention_mask.to(dtype=torch.long)",
        MASK,
    ),
    m(
        "smol.checkpoint.x_load__mutmut_9",
        C,
        "load",
        STATE,
        'torch.load(path / "state.pt", map_location=None, weights_only=True)',
        LOAD,
    ),
    m(
        "smol.checkpoint.x_load__mutmut_12",
        C,
        "load",
        STATE,
        'torch.load(path / "state.pt", weights_only=True)',
        LOAD,
    ),
    m(
        "smol.checkpoint.x_load__mutmut_22",
        C,
        "load",
        WEIGHTS,
        'load_file(path / "model.safetensors", device=None)',
        LOAD,
    ),
    m(
        "smol.checkpoint.x_load__mutmut_24",
        C,
        "load",
        WEIGHTS,
        'load_file(path / "model.safetensors", )',
        LOAD,
    ),
    m(
        "smol.checkpoint.x_read_safetensors__mutmut_4",
        C,
        "read_safetensors",
        "load_file(path, device=str(device))",
        "load_file(path, device=None)",
        LOAD,
    ),
    m(
        "smol.checkpoint.x_read_safetensors__mutmut_6",
        C,
        "read_safetensors",
        "load_file(path, device=str(device))",
        "load_file(path, )",
        LOAD,
    ),
    m(
        "smol.checkpoint.x_rng_state__mutmut_7",
        C,
        "rng_state",
        "if torch.cuda.is_available() else []",
        "if (torch.cuda.is_available()) and False else []",
        RNG,
    ),
    m(
        "smol.checkpoint.x_set_rng_state__mutmut_10",
        C,
        "set_rng_state",
        'torch.cuda.set_rng_state_all(state["cuda"])',
        "torch.cuda.set_rng_state_all(None)",
        RNG,
    ),
    m(
        "smol.checkpoint.x_set_rng_state__mutmut_11",
        C,
        "set_rng_state",
        'torch.cuda.set_rng_state_all(state["cuda"])',
        'torch.cuda.set_rng_state_all(state["XXcudaXX"])',
        RNG,
    ),
    m(
        "smol.checkpoint.x_set_rng_state__mutmut_12",
        C,
        "set_rng_state",
        'torch.cuda.set_rng_state_all(state["cuda"])',
        'torch.cuda.set_rng_state_all(state["CUDA"])',
        RNG,
    ),
]


def mutate(source: str, mutant: Mutant) -> str:
    """source with mutant.original replaced by mutant.mutated inside the body of
    mutant.function (the one place it stands there); a ValueError says what is
    missing."""
    start = source.find(f"def {mutant.function}(")
    if start < 0:
        raise ValueError(
            f"{mutant.name}: no function {mutant.function} in {mutant.file}"
        )
    # the body ends where the next function or class at this indentation or less starts
    indent = source.rfind("\n", 0, start) + 1
    prefix = source[indent:start]
    ends = [
        source.find(f"\n{prefix}{word}", start + 1) for word in ("def ", "class ", "@")
    ]
    if prefix:  # a method: also the end of its class
        ends.append(source.find("\nclass ", start + 1))
        ends.append(source.find("\ndef ", start + 1))
    end = min([e for e in ends if e > 0], default=len(source))
    body = source[start:end]
    if body.count(mutant.original) != 1:
        raise ValueError(
            f"{mutant.name}: {mutant.original!r} stands {body.count(mutant.original)} "
            f"times in {mutant.function} of {mutant.file}, not once"
        )
    return source[:start] + body.replace(mutant.original, mutant.mutated) + source[end:]


def run_tests(tests, tree: Path = ROOT, timeout: int = 120) -> tuple[str, float, str]:
    """('passed' | 'failed' | 'timeout' | 'no tests', seconds, last lines) of pytest on
    `tests`, run in `tree` (a folder holding smol/ and tests/): `python -m pytest` puts
    its working folder first on sys.path, so that smol is the one imported."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(ROOT)])}
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:randomly"]
    cmd += ["-p", "no:cacheprovider", "-o", "addopts=", *tests]
    start = time.perf_counter()
    try:
        done = subprocess.run(
            cmd,
            cwd=tree,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return "timeout", time.perf_counter() - start, ""
    tail = " | ".join((done.stdout + done.stderr).strip().splitlines()[-3:])
    status = "passed" if done.returncode == 0 else "failed"
    if done.returncode == 5:  # no test ran (all skipped is 0)
        status = "no tests"
    return status, time.perf_counter() - start, tail


def mutated_tree(mutant: Mutant, folder: Path) -> Path:
    """folder/ with copies of smol/ (mutant applied), tests/ and pyproject.toml."""
    skip = shutil.ignore_patterns("__pycache__")
    for name in ("smol", "tests"):
        shutil.copytree(ROOT / name, folder / name, ignore=skip)
    shutil.copy(ROOT / "pyproject.toml", folder)
    path = folder / mutant.file
    path.write_text(mutate(path.read_text(encoding="utf-8"), mutant), encoding="utf-8")
    return folder


def run_mutant(mutant: Mutant, timeout: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="smol-mutant-") as tmp:
        tree = mutated_tree(mutant, Path(tmp))
        status, seconds, tail = run_tests(mutant.tests, tree, timeout)
    outcome = {"failed": "killed", "timeout": "killed (timed out)"}.get(
        status, "survived"
    )
    if status == "no tests":
        outcome = "not run (its tests were not collected)"
    return {"outcome": outcome, "seconds": f"{seconds:.1f}", "tests said": tail}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--csv", type=Path, help="write the outcomes here")
    parser.add_argument("--jobs", type=int, default=6, help="mutants tested at once")
    parser.add_argument("--timeout", type=int, default=120, help="seconds per mutant")
    parser.add_argument(
        "--check", action="store_true", help="only check that every change applies"
    )
    args = parser.parse_args()
    for mutant in MUTANTS:  # every change applies, before anything runs
        mutate((ROOT / mutant.file).read_text(encoding="utf-8"), mutant)
    if args.check:
        print(f"all {len(MUTANTS)} changes apply")
        return 0
    import torch

    gpus = torch.cuda.device_count()
    gpu = torch.cuda.get_device_name(0) if gpus else "no GPU"
    runnable = [mutant for mutant in MUTANTS if mutant.gpus <= gpus]
    groups = sorted({mutant.tests for mutant in runnable})
    with ThreadPoolExecutor(args.jobs) as pool:  # each group of tests unmutated first
        baseline = dict(
            zip(groups, pool.map(lambda t: run_tests(t, ROOT, args.timeout), groups))
        )
    for tests, (status, seconds, tail) in baseline.items():
        print(f"{gpu}: unmutated, {' '.join(tests)} {status} in {seconds:.0f} s")
        if status != "passed":
            print(f"  {tail}")
    healthy = [m for m in runnable if baseline[m.tests][0] == "passed"]
    with ThreadPoolExecutor(args.jobs) as pool:
        done = dict(
            zip(
                [mutant.name for mutant in healthy],
                pool.map(lambda mutant: run_mutant(mutant, args.timeout), healthy),
            )
        )
    for mutant in runnable:
        if mutant.name not in done:
            done[mutant.name] = {
                "outcome": "not run: its tests fail on the unmutated code",
                "seconds": "",
                "tests said": baseline[mutant.tests][2],
            }
    rows = []
    for mutant in MUTANTS:
        result = done.get(mutant.name) or {
            "outcome": f"not run: needs {mutant.gpus} GPUs, this machine has {gpus}",
            "seconds": "",
            "tests said": "",
        }
        rows.append(
            {
                "mutant": mutant.name,
                "GPU": gpu,
                **result,
                "tests": " ".join(mutant.tests),
            }
        )
        print(f"  {mutant.name:48s} {result['outcome']}", flush=True)
    if args.csv:
        with args.csv.open("w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    killed = sum(row["outcome"].startswith("killed") for row in rows)
    print(
        f"{killed} of {len(healthy)} run mutants killed; {len(MUTANTS) - len(runnable)}"
        " need more GPUs"
    )
    return 0 if len(healthy) == len(runnable) else 1


if __name__ == "__main__":
    sys.exit(main())
