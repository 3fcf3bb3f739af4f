"""Continued pretraining of SmolLM2-135M on the training plays (what `smol train --init
smollm2` runs): the held-out plays' loss and perplexity before and after, and MMLU and
one of the card's benchmarks before and after, question by question (the same
questions), each accuracy with its 95% Wilson interval and the paired sign test of the
answers that changed; the held-out loss with the 95% interval of its mean over
windows, and of its change, paired window by window (the windows are taken as the
sample: neighbouring windows of one play are not quite independent, so the interval is
if anything a little narrow). A few minutes of training on a GPU; --quick proves on a
CPU that it runs (two steps, a few questions: its numbers measure nothing).

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
import torch.nn.functional as F
from common import write_csv

from smol import benchmarks, data, evaluate, load_pretrained, stats
from smol.train import TrainConfig, Trainer


@torch.no_grad()
def held_out_losses(model, tokens: torch.Tensor, seq_len: int, limit: int) -> list:
    """The mean next-token loss (nats) of each window of seq_len + 1 tokens, in order,
    over the first `limit` tokens of the held-out plays: their mean is the loss over
    all of them (every window has seq_len targets)."""
    model.eval()
    windows = data.PackedWindows(tokens[: limit + 1], seq_len, shuffle=False)
    out = []
    for start in range(0, len(windows), 8):
        x, y = data.next_token_targets(
            windows.windows(start, min(8, len(windows) - start))
        )
        logits, _ = model(x.to(model_device(model)))
        loss = F.cross_entropy(
            logits.float().transpose(1, 2), y.to(logits.device), reduction="none"
        )
        out += loss.mean(dim=1).tolist()
    return out


def mean_interval(values: list[float], z: float = 1.96) -> tuple[float, float, float]:
    """(mean, low, high): the normal 95% interval of the mean of `values`, from their
    standard error (windows of text as the sample)."""
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = z * sd / math.sqrt(n)
    return mean, mean - half, mean + half


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
    before_losses = held_out_losses(base, held_out, args.seq_len, args.eval_tokens)
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
    after_losses = held_out_losses(model, held_out, args.seq_len, args.eval_tokens)
    after = scored(model, tokenizer, mmlu, items)

    b, bl, bh = mean_interval(before_losses)
    a, al, ah = mean_interval(after_losses)
    d, dl, dh = mean_interval([y - x for x, y in zip(before_losses, after_losses)])
    blank = [""] * 3  # no paired answers
    rows = [
        ["held-out plays loss (nats)"]
        + [round(v, 4) for v in (b, bl, bh, a, al, ah)]
        + blank
        + [f"{len(before_losses)} windows of {args.seq_len} tokens"],
        ["held-out plays perplexity"]
        + [round(math.exp(v), 2) for v in (b, bl, bh, a, al, ah)]
        + blank
        + [""],
        ["held-out plays loss, after - before (paired by window)"]
        + ["", "", "", round(d, 4), round(dl, 4), round(dh, 4)]
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
