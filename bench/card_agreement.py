"""smol.benchmarks beside lm-evaluation-harness, question by question: each task's
seeded subset (--limit per task, spread over its subjects; the whole split where it
is smaller) scored by smol's scorer and by lm-eval 0.4.13's own task files pointed at
the same rows, both in float32 on the bundled weights (lm-eval through transformers'
LlamaForCausalLM, read from the Hugging Face folder smol.save_pretrained writes).

Per task (--csv): the share of questions where both pick the same choice, by acc and
by acc_norm; both accuracies; the largest difference between the two harnesses'
log-likelihood of a choice. Every question where the picks differ (--disagreements):
its choices' log-likelihoods from both, and smol's margin (the gap between its top two
choices), which says whether it is a near tie that float32's summation order decides.

    make lm-eval        # once: lm-eval in .venv-lmeval, which sees .venv's packages
    PYTHONPATH=. .venv-lmeval/bin/python bench/card_agreement.py --limit 300 \\
        --csv bench/results/card_agreement.csv \\
        --disagreements bench/results/card_agreement_disagreements.csv"""

from __future__ import annotations

import argparse
import csv
import json
import tempfile
import time
from pathlib import Path

import torch

from smol import benchmarks, evaluate

# lm-evaluation-harness's own task files, pointed at the same rows as a local JSON
# file; every task's split is named "test" there (tests/test_benchmarks.py uses these)
LM_EVAL_TASK = """\
include: {path}
task: smol_{name}
dataset_path: json
dataset_name: null
dataset_kwargs:
  data_files:
    test: {data}
training_split: null
validation_split: null
test_split: test
"""
LM_EVAL_FILES = {
    "hellaswag": "hellaswag/hellaswag.yaml",
    "arc-easy": "arc/arc_easy.yaml",
    "arc-challenge": "arc/arc_challenge.yaml",
    "piqa": "piqa/piqa.yaml",
    "winogrande": "winogrande/default.yaml",
    "openbookqa": "openbookqa/openbookqa.yaml",
    "commonsenseqa": "commonsense_qa/default.yaml",
}


def lm_eval_scores(folder, samples: dict, work: Path, batch_size: int = 8) -> dict:
    """lm-eval on samples ({task: [Item]}): {task: (per item the log-likelihood of
    each choice, in the items' order; lm-eval's results dict for the task)}. folder:
    a Hugging Face model folder; work: an empty folder for the task files."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    tasks_dir = Path(lm_eval.__file__).parent / "tasks"
    (work / "tasks").mkdir()
    names = {}
    for task, items in samples.items():
        name = names[task] = task.replace("-", "_")
        rows = benchmarks.read_rows(task)
        data = work / f"{name}.jsonl"
        data.write_text(
            "".join(json.dumps(rows[it.index]) + "\n" for it in items),
            encoding="utf-8",
        )
        (work / "tasks" / f"{name}.yaml").write_text(
            LM_EVAL_TASK.format(
                path=tasks_dir / LM_EVAL_FILES[task], name=name, data=data
            )
        )
    harness = HFLM(
        pretrained=str(folder), device="cpu", dtype="float32", batch_size=batch_size
    )
    out = lm_eval.simple_evaluate(
        model=harness,
        tasks=[f"smol_{name}" for name in names.values()],
        task_manager=TaskManager(include_path=str(work / "tasks")),
        log_samples=True,
    )
    found = {}
    for task, name in names.items():
        by_doc = {
            s["doc_id"]: [ll for ll, _ in s["filtered_resps"]]
            for s in out["samples"][f"smol_{name}"]
        }
        if sorted(by_doc) != list(range(len(samples[task]))):
            raise RuntimeError(f"lm-eval scored {len(by_doc)} of {task}'s questions")
        found[task] = (
            [by_doc[i] for i in range(len(by_doc))],
            out["results"][f"smol_{name}"],
        )
    return found


def pick(values, lengths=None) -> int:
    """The chosen choice: the largest log-likelihood, or per character."""
    if lengths is not None:
        values = [v / n for v, n in zip(values, lengths)]
    return evaluate.argmax(values)


def margin(values) -> float:
    """The gap between the best and the second-best of values."""
    top = sorted(values, reverse=True)
    return top[0] - top[1]


DISAGREEMENT_COLUMNS = (
    "task",
    "index",
    "by",
    "smol picks",
    "lm-eval picks",
    "smol margin",
    "smol log-likelihoods",
    "lm-eval log-likelihoods",
)


def compare(task: str, ours: list[evaluate.Result], theirs, results: dict):
    """(the task's row, its disagreements' rows)."""
    n = len(ours)
    same = {"acc": 0, "acc_norm": 0}
    largest, rows = 0.0, []
    for r, lls in zip(ours, theirs):
        if len(lls) != len(r.logprobs):
            raise RuntimeError(f"{task} {r.question.index}: choices differ in number")
        largest = max(largest, *(abs(a - b) for a, b in zip(r.logprobs, lls)))
        for key, lengths in (("acc", None), ("acc_norm", r.lengths)):
            a, b = pick(r.logprobs, lengths), pick(lls, lengths)
            same[key] += a == b
            if a != b:
                normed = [v / n for v, n in zip(r.logprobs, lengths or [1] * len(lls))]
                rows.append(
                    {
                        "task": task,
                        "index": r.question.index,
                        "by": key,
                        "smol picks": a,
                        "lm-eval picks": b,
                        "smol margin": f"{margin(normed):.3g}",
                        "smol log-likelihoods": " ".join(
                            f"{v:.4f}" for v in r.logprobs
                        ),
                        "lm-eval log-likelihoods": " ".join(f"{v:.4f}" for v in lls),
                    }
                )
    s = benchmarks.summarize(task, ours, 0.0)
    row = {
        "task": task,
        "questions": n,
        "same acc pick (%)": round(100 * same["acc"] / n, 2),
        "same acc_norm pick (%)": round(100 * same["acc_norm"] / n, 2),
        "smol acc (%)": round(100 * s["acc"], 2),
        "lm-eval acc (%)": round(100 * results["acc,none"], 2),
        "smol acc_norm (%)": round(100 * s["acc_norm"], 2),
        # Winogrande's lm-eval task reports acc only: its choices share their text
        "lm-eval acc_norm (%)": round(
            100 * results.get("acc_norm,none", results["acc,none"]), 2
        ),
        "largest log-likelihood difference": f"{largest:.2g}",
    }
    return row, rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--limit", type=int, default=300, help="questions per task")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tasks", nargs="+", default=list(benchmarks.TASKS))
    parser.add_argument("--csv", help="one row per task")
    parser.add_argument("--disagreements", help="one row per question picked apart")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from smol import load_pretrained
    from smol.pretrained import save_pretrained

    model, tokenizer = load_pretrained(device="cpu", dtype=torch.float32)
    samples = {
        task: evaluate.subset(benchmarks.load(task), args.limit, seed=args.seed)
        for task in args.tasks
    }
    ours, seconds = {}, {}
    for task, items in samples.items():
        start = time.perf_counter()
        ours[task] = benchmarks.score(model, tokenizer, items, desc=task)
        seconds[task] = time.perf_counter() - start
        print(f"smol {task}: {len(items)} questions, {seconds[task]:.0f} s", flush=True)
    with tempfile.TemporaryDirectory() as work:
        folder = save_pretrained(model, tokenizer, Path(work) / "model")
        start = time.perf_counter()
        theirs = lm_eval_scores(folder, samples, Path(work))
        print(f"lm-eval: {time.perf_counter() - start:.0f} s", flush=True)
    table, disagreements = [], []
    for task in samples:
        row, rows = compare(task, ours[task], *theirs[task])
        table.append(row | {"smol seconds": round(seconds[task], 1)})
        disagreements += rows
        print(
            f"{task}: {row['questions']} questions, same pick "
            f"{row['same acc pick (%)']}% (acc), {row['same acc_norm pick (%)']}% "
            f"(acc_norm); acc smol "
            f"{row['smol acc (%)']} lm-eval {row['lm-eval acc (%)']}; largest "
            f"log-likelihood difference {row['largest log-likelihood difference']}",
            flush=True,
        )
    if args.csv:
        benchmarks.write_csv(args.csv, table)
        print("wrote", args.csv)
    if args.disagreements:
        Path(args.disagreements).parent.mkdir(parents=True, exist_ok=True)
        with open(args.disagreements, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=DISAGREEMENT_COLUMNS)
            writer.writeheader()  # and nothing more where every pick is the same
            writer.writerows(disagreements)
        print("wrote", args.disagreements, f"({len(disagreements)} rows)")


if __name__ == "__main__":
    main()
