"""The preference pairs that ship with smol (smol/assets/preference_pairs.jsonl): every
training question of an arithmetic task (smol.tasks; none of the held-out split that
chapter 15 and bench/dpo.py score), eight replies sampled from SmolLM2-135M-Instruct at
temperature 1 for each, then chosen = a reply whose last number is the answer, rejected
= one whose is not (smol.tasks.preference_pairs, at most three pairs a question).
Prints how many replies were right and how many questions gave a pair.

    python bench/make_pairs.py --threads 2 --out smol/assets/preference_pairs.jsonl

Sampling runs in float32 on the CPU; another CPU kind may sample other replies, so the
file is the record of one run."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from smol import load_pretrained, tasks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--task", default="multiply", choices=sorted(tasks.TASKS))
    parser.add_argument("--samples", type=int, default=8, help="replies a question")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--per-question", type=int, default=3, help="pairs at most")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="the JSONL file to write")
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args()
    out = Path(args.out)
    if out.exists() and not args.overwrite:
        parser.error(f"{out} exists: pass --overwrite to replace it")
    torch.set_num_threads(args.threads)

    model, tokenizer = load_pretrained(device="cpu")
    problems = tasks.pool(args.task, "train")
    start = time.perf_counter()
    replies = tasks.answer(
        model,
        tokenizer,
        problems,
        samples=args.samples,
        temperature=args.temperature,
        seed=args.seed,
    )
    seconds = time.perf_counter() - start
    pairs = tasks.preference_pairs(problems, replies, args.per_question)
    right = [
        statistics.mean(tasks.check(r, p.answer) for r in rs)
        for p, rs in zip(problems, replies)
    ]
    with open(out, "w") as f:
        f.writelines(json.dumps(pair) + "\n" for pair in pairs)
    asked = len({pair["prompt"][0]["content"] for pair in pairs})
    print(
        f"{len(problems)} questions x {args.samples} replies in {seconds:.0f} s: "
        f"{100 * statistics.mean(right):.1f}% right; {sum(0 < r < 1 for r in right)} "
        f"questions had right and wrong replies; {len(pairs)} pairs from {asked} "
        f"questions -> {out}"
    )


if __name__ == "__main__":
    main()
