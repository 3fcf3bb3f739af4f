"""The model card's other benchmarks on the bundled weights: every task of
smol.benchmarks (and CommonsenseQA as the card prompts it), 0-shot, on the whole
validation split or a seeded subset (--limit per task), accuracy and normalised
accuracy with 95% intervals, seconds (wall and CPU), and for a subset each task's
whole split's time estimated from this run's wall seconds per row token (the tokens
of every context and choice the scorer reads).

    python bench/card.py --dtype bfloat16 --limit 2000 --uniform --threads 2 \\
        --csv bench/results/card.csv
    python bench/card.py --limit 100 --tasks hellaswag piqa   # a quick look"""

from __future__ import annotations

import argparse
import random
import time

import torch

from smol import benchmarks, evaluate, load_pretrained
from smol.commands.eval_runs import cpu_kind


def row_tokens(tokenizer, items) -> int:
    """The tokens the scorer reads for these items: every context and choice."""
    return sum(
        len(c) + sum(map(len, ks))
        for it in items
        for c, ks in benchmarks.requests(tokenizer, it)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--limit", type=int, default=0, help="questions per task (0: the whole split)"
    )
    parser.add_argument(
        "--uniform",
        action="store_true",
        help="a limit takes a uniform seeded sample (an unbiased estimate of the whole "
        "split's accuracy), not smol eval's subset spread evenly over the subjects",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    every = [*benchmarks.TASKS, *benchmarks.VARIANTS]
    parser.add_argument("--tasks", nargs="+", default=every, choices=every)
    parser.add_argument("--csv", help="write the table here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer = load_pretrained(device="cpu", dtype=getattr(torch, args.dtype))
    rows = []
    for task in args.tasks:
        pool = benchmarks.load(task)
        if not args.limit or args.limit >= len(pool):
            sub = pool
        elif args.uniform:
            sub = random.Random(0).sample(pool, args.limit)
        else:
            sub = evaluate.subset(pool, args.limit)
        start, cpu_start = time.perf_counter(), time.process_time()
        results = benchmarks.score(model, tokenizer, sub, pool=pool, desc=task)
        s = benchmarks.summarize(task, results, time.perf_counter() - start)
        s["cpu seconds"] = time.process_time() - cpu_start
        s["row tokens"], s["split"] = row_tokens(tokenizer, sub), len(pool)
        s["full"] = s["seconds"] / s["row tokens"] * row_tokens(tokenizer, pool)
        print(
            f"{task}: {s['questions']} questions, acc {100 * s['acc']:.1f}% "
            f"({100 * s['acc low']:.1f} to {100 * s['acc high']:.1f}), acc_norm "
            f"{100 * s['acc_norm']:.1f}% ({100 * s['acc_norm low']:.1f} to "
            f"{100 * s['acc_norm high']:.1f}), {s['seconds']:.1f} s "
            f"({s['cpu seconds']:.1f} s of CPU); all "
            f"{len(pool)}: about {s['full'] / 60:.0f} min",
            flush=True,
        )
        rows.append(s)
    total = sum(s["full"] for s in rows)
    print(f"all {len(rows)} tasks' full sets: about {total / 60:.0f} min")
    if args.csv:
        extra = {
            "model": "bundled Q4_1 GGUF",
            "dtype": args.dtype,
            "shots": 0,
            "device": "cpu",
            "threads": args.threads,
            "cpu": cpu_kind(),
        }
        table = [
            extra
            | benchmarks.table_row(s)
            | {"cpu seconds": round(s["cpu seconds"], 1), "row tokens": s["row tokens"]}
            | {"split": s["split"], "whole split (s)": round(s["full"])}
            for s in rows
        ]
        benchmarks.write_csv(args.csv, table)
        print("wrote", args.csv)


if __name__ == "__main__":
    main()
