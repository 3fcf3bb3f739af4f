"""Does DPO teach? SmolLM2-135M-Instruct tuned with LoRA, by default for 60 steps of 8
pairs (chapter 15's setting is --steps 16 --batch-size 4), on the shipped preference
pairs (its own replies to arithmetic questions, chosen = verified right, rejected =
wrong) by DPO, by DPO on length-normalised log-probabilities, and, as the baseline DPO
must beat, by supervised fine-tuning on the chosen replies alone; then every model
answers the same held-out questions greedily (accuracy with its 95% interval, and
question by question against the untuned model: gained, lost, the sign
test's p), and the same stratified MMLU subset (the cost elsewhere).

    python bench/dpo.py --threads 2 --csv bench/results/dpo.csv

With --card, the untuned and tuned models also answer the model card's other benchmarks
(smol.benchmarks, acc_norm on a stratified subset, paired):

    python bench/dpo.py --threads 1 --steps 16 --batch-size 4 --methods dpo --mmlu 0 \
        --card arc-easy,arc-challenge,piqa --card-limit 100 \
        --csv /tmp/dpo_again.csv --card-csv bench/results/dpo_card.csv

(bench/results/dpo_short.csv is the first command with --steps 16 --batch-size 4.)

The held-out questions come from the task's held-out split, which no pair's prompt is
in (smol.tasks)."""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time

import torch
from common import write_csv

from smol import benchmarks, evaluate, load_pretrained, stats, tasks
from smol.dpo import DPOTrainer, read_pairs
from smol.finetune import SFTTrainer
from smol.lora import TARGETS, apply_lora, merge_lora
from smol.train import TrainConfig


def config(out: str, steps: int, batch_size: int, lr: float) -> TrainConfig:
    return TrainConfig(
        steps=steps,
        batch_size=batch_size,
        seq_len=96,
        lr=lr,
        min_lr=lr / 10,
        warmup_steps=max(1, steps // 10),
        weight_decay=0.0,
        eval_every=0,
        log_every=10,
        out_dir=out,
        progress=False,
    )


def tune(base, tokenizer, pairs, method: str, args) -> tuple:
    """(the tuned model, merged; seconds; its history) for method "dpo", "dpo_norm"
    or "sft"."""
    torch.manual_seed(0)
    model = apply_lora(copy.deepcopy(base), r=8, alpha=16, targets=TARGETS)
    model.train()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="smol-dpo-") as out:
        if method == "sft":
            chats = [
                p["prompt"] + [{"role": "assistant", "content": p["chosen"]}]
                for p in pairs
            ]
            cfg = config(out, args.steps, args.batch_size, args.sft_lr)
            trainer = SFTTrainer(cfg, model, tokenizer, chats)
        else:
            cfg = config(out, args.steps, args.batch_size, args.lr)
            trainer = DPOTrainer(
                cfg,
                model,
                tokenizer,
                pairs,
                beta=args.beta,
                length_normalized=method == "dpo_norm",
            )
        history = trainer.fit()
    return merge_lora(model).eval(), time.perf_counter() - start, history


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--task", default="multiply")
    parser.add_argument(
        "--held-out", type=int, default=0, help="task questions (0: all of the split)"
    )
    parser.add_argument(
        "--mmlu", type=int, default=570, help="MMLU questions (0: none)"
    )
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--beta", type=float, default=0.1)
    parser.add_argument("--lr", type=float, default=5e-4, help="DPO's peak lr")
    parser.add_argument("--sft-lr", type=float, default=5e-4)
    parser.add_argument("--methods", default="dpo,dpo_norm,sft")
    parser.add_argument("--csv", help="write the results here")
    parser.add_argument(
        "--card",
        default="",
        help="the model card's other benchmarks to score too, e.g. arc-easy,piqa",
    )
    parser.add_argument("--card-limit", type=int, default=200, help="questions a task")
    parser.add_argument("--card-csv", help="write the card benchmarks' results here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    base, tokenizer = load_pretrained(device="cpu")
    pairs = read_pairs(tasks.PAIRS_FILE)
    held_out = tasks.problems(
        args.task,
        "held_out",
        args.held_out or len(tasks.pool(args.task, "held_out")),
    )
    questions = evaluate.subset(evaluate.load_mmlu(), args.mmlu) if args.mmlu else []
    models, seconds, margins = {"untuned": base}, {"untuned": 0.0}, {}
    for method in args.methods.split(","):
        models[method], seconds[method], history = tune(
            base, tokenizer, pairs, method, args
        )
        if "margin" in history:
            margins[method] = statistics.mean(history["margin"][-10:])
        print(f"{method}: {seconds[method]:.0f} s")

    verdicts, mmlu, rows = {}, {}, []
    for name, model in models.items():
        replies = [r for (r,) in tasks.answer(model, tokenizer, held_out)]
        verdicts[name] = {
            p.question: tasks.check(r, p.answer) for p, r in zip(held_out, replies)
        }
        formed = statistics.mean(tasks.well_formed(r) for r in replies)
        length = statistics.mean(len(tokenizer.encode(r)) for r in replies)
        results = evaluate.evaluate(model, tokenizer, questions) if questions else []
        mmlu[name] = {i: r.correct for i, r in enumerate(results)}
        s = stats.summarize(results)
        right = sum(verdicts[name].values())
        low, high = stats.wilson_interval(right, len(held_out))
        task_vs = stats.paired(verdicts["untuned"], verdicts[name])
        mmlu_vs = {"gained": 0, "lost": 0, "p": float("nan")}  # with --mmlu 0
        if questions:
            mmlu_vs = stats.paired(mmlu["untuned"], mmlu[name])
        rows.append(
            [
                name,
                args.steps if seconds[name] else 0,
                len(pairs) if seconds[name] else 0,
                len(held_out),
                round(100 * right / len(held_out), 1),
                round(100 * low, 1),
                round(100 * high, 1),
                task_vs["gained"],
                task_vs["lost"],
                round(task_vs["p"], 4),
                round(100 * formed, 1),
                round(length, 1),
                s["questions"],
                round(100 * s["accuracy"], 1),
                round(100 * s["ci_low"], 1),
                round(100 * s["ci_high"], 1),
                mmlu_vs["gained"],
                mmlu_vs["lost"],
                round(mmlu_vs["p"], 4),
                round(margins.get(name, 0.0), 2),
                round(seconds[name]),
            ]
        )
        print(rows[-1])
    header = [
        "model",
        "steps",
        "pairs",
        "held-out questions",
        "accuracy (%)",
        "95% low",
        "95% high",
        "gained",
        "lost",
        "sign test p",
        "number only (%)",
        "reply tokens",
        "MMLU questions",
        "MMLU accuracy (%)",
        "MMLU 95% low",
        "MMLU 95% high",
        "MMLU gained",
        "MMLU lost",
        "MMLU sign test p",
        "final margin",
        "training seconds",
    ]
    if args.csv:
        write_csv(args.csv, header, rows)
    if args.card:
        card(models, tokenizer, args)


def card(models: dict, tokenizer, args) -> None:
    """Each model on the card's other benchmarks (acc_norm, paired question by
    question against the untuned model)."""
    rows, verdicts = [], {}
    for task in args.card.split(","):
        for name, model in models.items():
            summary, results = benchmarks.run(task, model, tokenizer, args.card_limit)
            verdicts[task, name] = {i: r.correct_norm for i, r in enumerate(results)}
            vs = stats.paired(verdicts[task, "untuned"], verdicts[task, name])
            row = benchmarks.table_row(summary)
            rows.append(
                [name, task, row["questions"], row["acc_norm (%)"]]
                + [row["acc_norm low (%)"], row["acc_norm high (%)"]]
                + [vs["gained"], vs["lost"], round(vs["p"], 4)]
            )
            print(rows[-1])
    header = ["model", "task", "questions", "acc_norm (%)", "95% low", "95% high"]
    header += ["gained", "lost", "sign test p"]
    if args.card_csv:
        write_csv(args.card_csv, header, rows)


if __name__ == "__main__":
    main()
