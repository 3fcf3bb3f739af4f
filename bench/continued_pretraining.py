"""Continued pretraining of SmolLM2-135M on the training plays (what `smol train --init
smollm2` runs): the held-out plays' loss and perplexity before and after, and MMLU and
one of the card's benchmarks before and after, question by question (the same
questions), each accuracy with its 95% Wilson interval and the paired sign test of the
answers that changed. A few minutes of training on a GPU; --quick proves on a CPU that
it runs (two steps, a few questions: its numbers measure nothing).

    python bench/continued_pretraining.py [--steps 200] [--limit 570]
        [--task arc-easy] [--csv bench/results/continued_pretraining.csv]
    python bench/continued_pretraining.py --quick

bench/results/continued_pretraining.csv, which chapter 10 cites, is a CPU run of
    python bench/continued_pretraining.py --steps 60 --batch-size 4 --seq-len 256 \
        --limit 570 --eval-tokens 16384 --csv bench/results/continued_pretraining.csv
on 2 cores that other work kept busy (its seconds are that machine's).
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time

import torch
from common import write_csv

from smol import benchmarks, data, evaluate, load_pretrained, stats
from smol.train import TrainConfig, Trainer


@torch.no_grad()
def held_out_loss(model, tokens: torch.Tensor, seq_len: int, limit: int) -> float:
    """Mean next-token loss (nats) over the first `limit` tokens of the held-out plays,
    in windows of seq_len + 1 in order."""
    model.eval()
    windows = data.PackedWindows(tokens[: limit + 1], seq_len, shuffle=False)
    total, count = 0.0, 0
    for start in range(0, len(windows), 8):
        x, y = data.next_token_targets(
            windows.windows(start, min(8, len(windows) - start))
        )
        _, loss = model(x.to(model_device(model)), y.to(model_device(model)))
        total, count = total + loss.item() * y.numel(), count + y.numel()
    return total / count


def model_device(model) -> torch.device:
    return next(model.parameters()).device


def scored(model, tokenizer, mmlu, items) -> dict[str, list[bool]]:
    """{benchmark: right or not (normalised accuracy) per question, in order}."""
    model.eval()
    return {
        "MMLU": [r.correct_norm for r in evaluate.evaluate(model, tokenizer, mmlu)],
        "task": [r.correct_norm for r in benchmarks.score(model, tokenizer, items)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--limit", type=int, default=570, help="questions of each")
    parser.add_argument("--task", default="arc-easy", choices=benchmarks.TASKS)
    parser.add_argument("--eval-tokens", type=int, default=65536)
    parser.add_argument("--quick", action="store_true", help="prove that it runs")
    parser.add_argument("--csv", help="write the results here")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.batch_size, args.seq_len = 2, 1, 64
        args.limit, args.eval_tokens = 8, 1024

    device = "cuda" if torch.cuda.is_available() else "cpu"
    base, tokenizer = load_pretrained(device=device)
    held_out = data.corpus_tokens("val", tokenizer)
    mmlu = evaluate.subset(evaluate.load_mmlu(), args.limit)
    items = benchmarks.load(args.task)[: args.limit]
    before_loss = held_out_loss(base, held_out, args.seq_len, args.eval_tokens)
    before = scored(base, tokenizer, mmlu, items)
    del base

    with tempfile.TemporaryDirectory(prefix="smol-continued-") as out:
        cfg = TrainConfig(
            init="smollm2",
            steps=args.steps,
            batch_size=args.batch_size,
            seq_len=args.seq_len,
            lr=args.lr,
            min_lr=args.lr / 10,
            warmup_steps=min(20, args.steps // 10),
            eval_every=0,
            sample_tokens=0,
            out_dir=out,
            progress=False,
            device=device,
        )
        trainer = Trainer(cfg)
        start = time.perf_counter()
        trainer.fit()
        seconds = time.perf_counter() - start
    model = trainer.model.float()
    after_loss = held_out_loss(model, held_out, args.seq_len, args.eval_tokens)
    after = scored(model, tokenizer, mmlu, items)

    blank = [""] * 5  # no interval, no paired answers
    rows = [
        ["held-out plays loss (nats)", round(before_loss, 4), "", ""]
        + [round(after_loss, 4)]
        + blank
        + [""],
        ["held-out plays perplexity", round(math.exp(before_loss), 2), "", ""]
        + [round(math.exp(after_loss), 2)]
        + blank
        + [""],
    ]
    for name, label in (("MMLU", "MMLU (cloze, acc_norm)"), ("task", args.task)):
        b, a = before[name], after[name]
        c = stats.paired(dict(enumerate(b)), dict(enumerate(a)))
        bl, bh = stats.wilson_interval(sum(b), len(b))
        al, ah = stats.wilson_interval(sum(a), len(a))
        rows.append(
            [
                f"{label}, {len(b)} questions",
                round(100 * c["before"], 2),
                round(100 * bl, 2),
                round(100 * bh, 2),
                round(100 * c["after"], 2),
                round(100 * al, 2),
                round(100 * ah, 2),
                c["lost"],
                c["gained"],
                round(c["p"], 3),
                "",
            ]
        )
    note = f"{args.steps} steps of {trainer.tokens_per_step} tokens in {seconds:.0f} s"
    note += f" on {device}" + (" (--quick: measures nothing)" if args.quick else "")
    rows = [row[:-1] + [(row[-1] + "; " if row[-1] else "") + note] for row in rows]
    header = [
        "measure",
        "before",
        "before low",
        "before high",
        "after",
        "after low",
        "after high",
        "right to wrong",
        "wrong to right",
        "sign test p",
        "notes",
    ]
    for row in rows:
        print(dict(zip(header, row)))
    if args.csv:
        write_csv(args.csv, header, rows)


if __name__ == "__main__":
    main()
