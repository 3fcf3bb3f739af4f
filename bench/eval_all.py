"""`smol eval all` timed from the outside: the command run as a user runs it (a process
of its own: loading the weights, reading and tokenizing every split, scoring MMLU and
the seven other benchmarks), its wall seconds measured around it; each task's row of
its all.csv, then a row `total` with the whole run's wall seconds.

    python bench/eval_all.py --dtype bfloat16 --threads 2 \\
        --csv bench/results/eval_all.csv          # every whole split: about an hour
    python bench/eval_all.py --limit 50           # a quick look
    python bench/eval_all.py --device cuda --token-budget 32768 \\
        --csv bench/results/eval_all_cuda.csv     # on a GPU: make gpu-check's part"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from smol import benchmarks


def timed_run(args) -> list[dict]:
    """One `smol eval all`: its all.csv rows and a row total."""
    with tempfile.TemporaryDirectory() as out:
        argv = [sys.executable, "-m", "smol", "eval", "all", "--out", out]
        argv += ["--dtype", args.dtype, "--threads", str(args.threads)]
        argv += ["--token-budget", str(args.token_budget)]
        if args.device is not None:
            argv += ["--device", args.device]
        if args.limit is not None:
            argv += ["--limit", str(args.limit)]
        print(" ".join(argv[1:]), flush=True)
        start = time.perf_counter()
        subprocess.run(argv, check=True)
        seconds = time.perf_counter() - start
        with open(Path(out) / "all.csv", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    scored = sum(float(r["seconds"]) for r in rows)
    total = {k: rows[0][k] for k in rows[0] if k not in ("task", "seconds")}
    total |= {k: "" for k in rows[0] if "%" in k}  # no accuracy for the whole run
    total |= {
        "task": "total",
        "questions": sum(int(r["questions"]) for r in rows),
        "seconds": round(seconds, 1),
    }
    print(
        f"smol eval all: {total['questions']} questions in {seconds:.0f} s "
        f"({seconds / 60:.1f} min; {scored:.0f} s of it scoring, the rest loading the "
        "weights and tokenizing the splits)",
        flush=True,
    )
    return [*rows, total]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, help="questions per task (default: all)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", help="default: smol eval's (cuda when available)")
    parser.add_argument(
        "--token-budget", type=int, default=4096, help="tokens a batch (4096)"
    )
    parser.add_argument("--csv", type=Path, help="write the table here")
    args = parser.parse_args()
    rows = timed_run(args)
    if args.csv:
        benchmarks.write_csv(args.csv, rows)
        print("wrote", args.csv)


if __name__ == "__main__":
    main()
