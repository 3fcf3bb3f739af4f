"""Did fine-tuning cost knowledge? Chapter 12's task (one line of strict JSON from a
sentence about a person), learned in its GPU setting with LoRA and with all weights;
then the untuned and both tuned models scored on the same stratified MMLU subset:
accuracy, and question by question, how many answers changed and which way.

    python bench/mmlu_forgetting.py --threads 2 --csv bench/results/mmlu_forgetting.csv

The conversations come from chapter 12's own cell (run as on a GPU: 2,000 for training,
200 held out, names, cities and a sentence pattern training never shows), so the task is
the chapter's, not a copy of it."""

from __future__ import annotations

import argparse
import copy
import json
import random
import tempfile
import time
from pathlib import Path

import nbformat
import torch
from common import write_csv

from smol import evaluate, load_pretrained, stats
from smol.finetune import SFTTrainer
from smol.lora import TARGETS, apply_lora, merge_lora
from smol.sft import collate, encode_conversation
from smol.train import TrainConfig

CHAPTER = Path(__file__).parent.parent / "chapters" / "12_fine_tuning_with_lora.ipynb"


def chapter_conversations() -> tuple[list, list]:
    """(train, test): chapter 12's generating cell, run as it runs on a GPU."""
    nb = nbformat.read(CHAPTER, as_version=4)
    (cell,) = [c for c in nb.cells if "def conversation(" in c.source]
    scope = {"json": json, "random": random, "device": "cuda", "print": lambda *a: 0}
    exec(cell.source, scope)  # noqa: S102 (the chapter's own code, from this repository)
    return scope["train"], scope["test"]


def fine_tune(model, tokenizer, train, lr, steps, batch_size):
    """The settings of chapter 12's fine_tune: a cosine schedule from lr to lr / 10."""
    with tempfile.TemporaryDirectory(prefix="smol-forgetting-") as out:
        cfg = TrainConfig(
            steps=steps,
            batch_size=batch_size,
            seq_len=128,
            lr=lr,
            min_lr=lr / 10,
            warmup_steps=2,
            weight_decay=0.0,
            eval_every=0,
            log_every=10,
            out_dir=out,
            progress=False,
        )
        SFTTrainer(cfg, model, tokenizer, train).fit()
    return model.eval()


@torch.no_grad()
def exact_match(model, tokenizer, conversations) -> float:
    """Chapter 12's measure: the share of held-out replies that greedy decoding writes
    exactly (every reply token the most likely one, fed the expected reply)."""
    examples = [encode_conversation(tokenizer, c) for c in conversations]
    right = []
    for start in range(0, len(examples), 16):
        x, y, mask = collate(examples[start : start + 16], tokenizer.pad_token_id)
        logits, _ = model(x, attention_mask=mask)
        kept = y != -100
        right += ((logits.argmax(-1) == y) | ~kept).all(dim=1).tolist()
    return sum(right) / len(right)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--limit", type=int, default=1140, help="MMLU questions")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    parser.add_argument("--csv", help="write the results here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    train, test = chapter_conversations()
    base, tokenizer = load_pretrained()
    models = {"untuned": base}
    seconds = {"untuned": 0.0}
    for name, lr in [("LoRA rank 8", 2e-3), ("all weights", 1e-4)]:
        torch.manual_seed(0)
        model = copy.deepcopy(base)
        if name.startswith("LoRA"):
            model = apply_lora(model, r=8, alpha=16, targets=TARGETS)
        start = time.perf_counter()
        model = fine_tune(model, tokenizer, train, lr, args.steps, args.batch_size)
        seconds[name] = time.perf_counter() - start
        models[name] = merge_lora(model) if name.startswith("LoRA") else model

    questions = evaluate.subset(evaluate.load_mmlu(), args.limit)
    dtype = getattr(torch, args.dtype)
    outcomes, rows = {}, []
    for name, model in models.items():
        match = exact_match(model, tokenizer, test)
        start = time.perf_counter()
        results = evaluate.evaluate(model.to(dtype), tokenizer, questions)
        scored = time.perf_counter() - start
        outcomes[name] = [r.correct_norm for r in results]
        s = stats.summarize(results)
        c = stats.paired(
            dict(enumerate(outcomes["untuned"])), dict(enumerate(outcomes[name]))
        )
        rows.append(
            [
                name,
                args.steps if seconds[name] else 0,
                round(100 * match, 1),
                s["questions"],
                round(100 * s["acc_norm"], 2),
                round(100 * stats.subject_mean(results), 2),
                round(100 * s["accuracy"], 2),
                c["lost"],
                c["gained"],
                round(c["p"], 3),
                round(seconds[name]),
                round(scored),
            ]
        )
        print(rows[-1])
    header = [
        "model",
        "steps",
        "JSON exact match (%)",
        "questions",
        "normalised (%)",
        "normalised subject mean (%)",
        "accuracy (%)",
        "right to wrong",
        "wrong to right",
        "sign test p",
        "fine-tuning s",
        "scoring s",
    ]
    if args.csv:
        write_csv(args.csv, header, rows)


if __name__ == "__main__":
    main()
