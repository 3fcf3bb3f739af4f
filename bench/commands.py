"""What the README's generation commands cost from start to finish: each command runs
in a fresh process, and the table gives its whole wall-clock time (Python's start,
loading, compiling, generating) beside the tokens/s it reports on stderr.

`--compile` runs twice with an empty compiler cache of its own (TORCHINDUCTOR_CACHE_DIR
in a temporary folder): cold (the first run on a machine: it compiles) and warm (the
second: PyTorch's caches hold the compiled code).

    python bench/commands.py [--new-tokens 32,200] [--threads 2] \
        [--csv bench/results/commands.csv]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

from common import write_csv

PROMPT = "Once upon a time"
COMMANDS = [  # (name, options), in this order: the first compiled run finds no cache
    ("float32", []),
    ("bfloat16", ["--dtype", "bfloat16"]),
    ("int8", ["--quantize", "int8"]),
    ("int8, compiled (cold)", ["--quantize", "int8", "--compile"]),
    ("int8, compiled (warm)", ["--quantize", "int8", "--compile"]),
]
REPORT = re.compile(
    r"in ([\d.]+) s: ([\d.]+) tokens/s(?:, ([\d.]+) at the median step)?, the first "
    r"after ([\d.]+) s; loaded in ([\d.]+) s"
)


def run(options: list[str], n: int, threads: int, env: dict) -> dict:
    command = [sys.executable, "-m", "smol", "generate", PROMPT, "--max-new-tokens"]
    command += [str(n), "--threads", str(threads), *options]
    start = time.perf_counter()
    out = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    wall = time.perf_counter() - start
    found = REPORT.search(out.stderr)
    if found is None:
        raise RuntimeError(f"no speed report in: {out.stderr[-500:]}")
    _, rate, step, first, loaded = found.groups()
    return {
        "wall": wall,
        "rate": float(rate),
        "step": float(step or rate),
        "first": float(first),
        "loaded": float(loaded),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--new-tokens", default="32,200")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--csv", help="write the table here")
    args = parser.parse_args()
    rows = []
    for n in [int(k) for k in args.new_tokens.split(",")]:
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
            for name, options in COMMANDS:
                r = run(options, n, args.threads, env)
                print(
                    f"{n:4d} tokens  {name:24s} {r['wall']:6.1f} s in all  "
                    f"{r['rate']:6.1f} tokens/s  ({r['step']:.1f} at the median step, "
                    f"first after {r['first']:.2f} s, loaded in {r['loaded']:.1f} s)",
                    flush=True,
                )
                rows.append(
                    [name, n, f"{r['wall']:.1f}", f"{r['rate']:.1f}"]
                    + [f"{r['step']:.1f}", f"{r['first']:.2f}", f"{r['loaded']:.1f}"]
                )
    if args.csv:
        header = ["command", "new tokens", "seconds in all", "tokens/s"]
        header += ["tokens/s at the median step", "first token after (s)"]
        write_csv(args.csv, header + ["load seconds"], rows)


if __name__ == "__main__":
    main()
