"""Does RL teach, or sharpen? SmolLM2-135M-Instruct on arithmetic questions with
checkable answers (smol.tasks), before and after GRPO with LoRA on one task's
training split.

First the untuned model answers the held-out split of every task: greedily (pass@1),
and n = --group-size sampled replies a question at temperature 1, from which pass@k
for k = 1..n (Chen et al., 2021's unbiased estimator, averaged over questions with a
bootstrap interval, smol.stats.mean_pass_at_k): a task worth training on starts above
zero and below the ceiling. Then GRPO (smol.grpo_train.GRPOTrainer; the KL term's
reference is the model with its adapter off) trains on --task, and the tuned model
answers the same questions with the same seeds: greedy pass@1 with its 95% Wilson
interval, question by question against the untuned model (gained, lost, the sign
test's p), the pass@k curve, the held-out mean reward, and from training the mean
reward, the share of groups whose replies all earned the same reward (they teach
nothing) and the seconds spent sampling and updating; with --mmlu, a stratified MMLU
subset, paired, for the cost elsewhere. If RL only sharpens what the model could
already do, pass@1 rises while pass@k at the largest k does not.

    python bench/grpo.py --threads 2 --task add --tasks add,multiply \\
        --csv bench/results/grpo.csv --curve-csv bench/results/grpo_pass_at_k.csv \\
        --history-csv bench/results/grpo_history.csv

Time, measured with tiny settings on 2 CPU cores shared with other work: 2.3 s a
sampled reply and 76 s a training step of 8 replies (45 s sampling, 32 s updating).
At that pace the defaults (60 steps of 4 questions x 8 replies, the 159 + 206
held-out questions answered 9 times by each of the 2 models, 570 MMLU questions)
take about 7 hours; on 2 quiet cores about a third of that. --tasks add halves the
answering."""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time

import torch
from common import write_csv

from smol import evaluate, load_pretrained, stats, tasks
from smol.grpo_rewards import score, task_rewards
from smol.grpo_train import LOGGED, TIMED, from_options
from smol.lora import TARGETS, apply_lora, merge_lora
from smol.train import TrainConfig


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--task", default="add", help="the task GRPO trains on")
    p.add_argument(
        "--tasks",
        default=",".join(tasks.TASKS),
        help="the tasks whose held-out splits every model answers",
    )
    p.add_argument(
        "--held-out", type=int, default=0, help="questions a task (0: all of the split)"
    )
    p.add_argument("--group-size", type=int, default=8, help="G: replies a question")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch-size", type=int, default=4, help="questions a step")
    p.add_argument("--beta", type=float, default=0.04, help="the KL term's weight")
    p.add_argument("--lr", type=float, default=2e-4, help="peak learning rate")
    p.add_argument("--lora-r", type=int, default=8)
    p.add_argument("--format-weight", type=float, default=0.0)
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument(
        "--num-iterations", type=int, default=1, help="steps each batch trains"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mmlu", type=int, default=570, help="MMLU questions (0: none)")
    p.add_argument("--csv", help="write one row a model and task here")
    p.add_argument("--curve-csv", help="write pass@k for k = 1..G here")
    p.add_argument("--history-csv", help="write what each training step logged here")
    args = p.parse_args()
    names = args.tasks.split(",")
    for task in {args.task, *names}:
        if task not in tasks.TASKS:
            p.error(f"unknown task {task!r}: expected one of {', '.join(tasks.TASKS)}")
    if args.group_size < 2:
        p.error(f"--group-size must be at least 2, got {args.group_size}")
    args.tasks = names if args.task in names else [args.task, *names]
    return args


def measure(model, tokenizer, problems, args) -> dict:
    """Greedy and sampled replies to `problems`, checked: greedy verdicts {question:
    right}, (G, right) counts, the sampled replies' mean reward, and seconds."""
    options = {"max_new_tokens": args.max_new_tokens, "seed": args.seed}
    start = time.perf_counter()
    greedy = [r for (r,) in tasks.answer(model, tokenizer, problems, **options)]
    greedy_s = time.perf_counter() - start
    sampled = tasks.answer(
        model,
        tokenizer,
        problems,
        samples=args.group_size,
        temperature=1.0,
        **options,
    )  # (P, G) replies
    sampled_s = time.perf_counter() - start - greedy_s
    rows = [p for p in problems for _ in range(args.group_size)]
    flat = [r for replies in sampled for r in replies]
    rewards = score(task_rewards(args.format_weight), rows, flat)  # (P * G,)
    return {
        "greedy": {
            p.question: tasks.check(r, p.answer) for p, r in zip(problems, greedy)
        },
        "counts": [
            (len(rs), sum(tasks.check(r, p.answer) for r in rs))
            for p, rs in zip(problems, sampled)
        ],
        "number_only": statistics.fmean(tasks.well_formed(r) for r in greedy),
        "reward": rewards.mean().item(),
        "reply_s": sampled_s / len(flat),
        "seconds": greedy_s + sampled_s,
    }


def train(base, tokenizer, args) -> tuple:
    """(the tuned model, merged; its training history; seconds)."""
    torch.manual_seed(args.seed)
    model = apply_lora(
        copy.deepcopy(base), r=args.lora_r, alpha=2 * args.lora_r, targets=TARGETS
    )
    model.train()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="smol-grpo-") as out:
        cfg = TrainConfig(
            preset=None,
            steps=args.steps,
            batch_size=args.batch_size,
            seq_len=128,
            lr=args.lr,
            min_lr=args.lr / 10,
            warmup_steps=max(1, args.steps // 10),
            weight_decay=0.0,
            eval_every=0,
            log_every=1,
            out_dir=out,
            seed=args.seed,
            device="cpu",
        )
        history = from_options(cfg, model, tokenizer, args).fit()
    return merge_lora(model).eval(), history, time.perf_counter() - start


def pct(x: float) -> float:
    return round(100 * x, 1)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    base, tokenizer = load_pretrained(device="cpu")
    held_out = {
        task: tasks.problems(
            task, "held_out", args.held_out or len(tasks.pool(task, "held_out"))
        )
        for task in args.tasks
    }
    questions = evaluate.subset(evaluate.load_mmlu(), args.mmlu) if args.mmlu else []
    G, rows, curve, measured, mmlu = args.group_size, [], [], {}, {}

    def report(name: str, model, history: dict, train_s: float) -> None:
        results = evaluate.evaluate(model, tokenizer, questions) if questions else []
        mmlu[name] = {i: r.correct for i, r in enumerate(results)}
        m_vs = {"gained": "", "lost": "", "p": ""}
        if results:
            m_vs = stats.paired(mmlu["untuned"], mmlu[name])
            m_vs["p"] = round(m_vs["p"], 4)
        trained = name != "untuned"
        steps = len(history.get("reward", []))
        for task, problems in held_out.items():
            m = measured[name, task] = measure(model, tokenizer, problems, args)
            right = sum(m["greedy"].values())
            low, high = stats.wilson_interval(right, len(problems))
            vs = stats.paired(measured["untuned", task]["greedy"], m["greedy"])
            at = {
                k: stats.mean_pass_at_k(m["counts"], k, seed=args.seed) for k in (1, G)
            }
            for k in range(1, G + 1):
                s = stats.mean_pass_at_k(m["counts"], k, seed=args.seed)
                curve.append(
                    [name, task, k, s["problems"], pct(s["pass_at_k"])]
                    + [pct(s["ci_low"]), pct(s["ci_high"])]
                )
            rows.append(
                [name, args.task if trained else "", steps, task, len(problems), G]
                + [pct(right / len(problems)), pct(low), pct(high)]
                + [pct(at[1]["pass_at_k"]), pct(at[1]["ci_low"]), pct(at[1]["ci_high"])]
                + [pct(at[G]["pass_at_k"]), pct(at[G]["ci_low"]), pct(at[G]["ci_high"])]
                + [vs["gained"], vs["lost"], round(vs["p"], 4)]
                + [pct(m["number_only"]), round(m["reward"], 3)]
                + [round(statistics.mean(history["reward"]), 3) if steps else ""]
                + [round(statistics.mean(history["reward"][-10:]), 3) if steps else ""]
                + [pct(statistics.mean(history["equal_groups"])) if steps else ""]
                + [round(sum(history.get("sample_s", [])), 1)]
                + [round(sum(history.get("update_s", [])), 1), round(train_s)]
                + [len(results), pct(m_vs["after"]) if results else ""]
                + [m_vs["gained"], m_vs["lost"], m_vs["p"]]
                + [round(m["reply_s"], 3)]
            )
            print(dict(zip(HEADER, rows[-1])), flush=True)
            if not trained:
                where = "inside" if 0 < right < len(problems) else "AT AN END OF"
                print(f"{task}: untuned greedy pass@1 is {where} (0, 100)%", flush=True)

    report("untuned", base, {}, 0.0)
    tuned, history, seconds = train(base, tokenizer, args)
    print(f"trained {args.steps} steps on {args.task}: {seconds:.0f} s", flush=True)
    report("grpo", tuned, history, seconds)
    if args.csv:
        write_csv(args.csv, HEADER, rows)
    if args.curve_csv:
        header = [
            "model",
            "task",
            "k",
            "questions",
            "pass@k (%)",
            "95% low",
            "95% high",
        ]
        write_csv(args.curve_csv, header, curve)
    if args.history_csv:
        names = ["loss", *LOGGED, *TIMED]
        steps = zip(*(history[name] for name in names))
        rows = [
            [i, *(round(v, 4) for v in values)] for i, values in enumerate(steps, 1)
        ]
        write_csv(args.history_csv, ["step", *names], rows)


HEADER = [
    "model",
    "trained on",
    "steps",
    "task",
    "held-out questions",
    "G",
    "greedy pass@1 (%)",
    "95% low",
    "95% high",
    "sampled pass@1 (%)",
    "pass@1 95% low",
    "pass@1 95% high",
    "pass@G (%)",
    "pass@G 95% low",
    "pass@G 95% high",
    "gained",
    "lost",
    "sign test p",
    "number only (%)",
    "held-out reward",
    "training reward",
    "last 10 steps' reward",
    "equal groups (%)",
    "sampling seconds",
    "update seconds",
    "training seconds",
    "MMLU questions",
    "MMLU accuracy (%)",
    "MMLU gained",
    "MMLU lost",
    "MMLU sign test p",
    "seconds a sampled reply",
]


if __name__ == "__main__":
    main()
