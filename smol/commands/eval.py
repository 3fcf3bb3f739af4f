"""Measure a model on MMLU (smol/evaluate.py) or the model card's other benchmarks
(smol/benchmarks.py: hellaswag, arc-easy, arc-challenge, piqa, winogrande, openbookqa,
commonsenseqa), or compare two runs question by question; prints each accuracy with
its 95% interval.

    smol eval mmlu --limit 570          # 10 questions of each subject
    smol eval mmlu                      # all 14,042, the bundled weights
    smol eval mmlu --formulation letters --shots 5 --model path/to/folder
    smol eval mmlu --out results/       # mmlu.csv, mmlu_subjects.csv and
                                        # mmlu_questions.csv in results/
    smol eval hellaswag --limit 200     # a seeded subset, spread over its activities
    smol eval all --limit 200 --out results/   # MMLU and the seven others, all.csv
    smol eval compare base/ tuned/      # two runs, question by question
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import sys
import time
from pathlib import Path

import torch

from smol import benchmarks, evaluate, stats
from smol.commands.common import HELP, Parser, UsageError, parser, run

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def build_parser() -> Parser:
    """The parser of `smol eval`."""
    p = parser("eval", __doc__)
    tasks = p.add_subparsers(dest="task", required=True, parser_class=Parser)
    about = "measure a model on MMLU"
    mmlu = tasks.add_parser("mmlu", help=about, description=about, **HELP)
    scoring_options(
        mmlu,
        "write mmlu.csv (the summary), mmlu_subjects.csv (a row per subject) and "
        "mmlu_questions.csv (a row per question: its choices' log-likelihoods) here",
    )
    mmlu.add_argument("--formulation", choices=evaluate.FORMULATIONS, default="cloze")
    for task in (*benchmarks.TASKS, "all"):
        about = (
            f"measure a model on {task}, as lm-evaluation-harness prompts it"
            if task != "all"
            else "measure a model on MMLU and the seven other benchmarks"
        )
        card = tasks.add_parser(task, help=about, description=about, **HELP)
        scoring_options(
            card,
            "write TASK.csv (the summary) and TASK_questions.csv (a row per question: "
            "its choices' log-likelihoods) here"
            + ("; all.csv holds every task's summary" if task == "all" else ""),
        )
    about = "compare two runs' verdicts on the questions both answered"
    compare = tasks.add_parser("compare", help=about, description=about, **HELP)
    compare.add_argument("before", type=Path, help="an --out folder or its CSV")
    compare.add_argument("after", type=Path, help="an --out folder or its CSV")
    compare.add_argument(
        "--by",
        choices=["normalised", "sum"],
        default="normalised",
        help="the verdict: best sum per character (normalised) or best sum",
    )
    compare.add_argument("--csv", type=Path, help="append the comparison as a row here")
    return p


def scoring_options(p: Parser, out: str) -> None:
    """The options every benchmark takes."""
    p.add_argument(
        "--limit", type=int, help="a stratified subset of N questions (default: all)"
    )
    p.add_argument("--shots", type=int, default=0, help="worked examples (0)")
    p.add_argument(
        "--model", help="a .gguf file or a model folder (default: the bundled GGUF)"
    )
    p.add_argument("--dtype", choices=list(DTYPES), default="float32")
    p.add_argument("--device", help="default: cuda when available, else cpu")
    p.add_argument("--threads", type=int, help="PyTorch's CPU threads")
    p.add_argument(
        "--token-budget", type=int, default=4096, help="tokens per batch (4096)"
    )
    p.add_argument("--seed", type=int, default=0, help="the subset's seed (0)")
    p.add_argument("--out", type=Path, help=out)
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the results an earlier run wrote in --out",
    )


def written(task: str) -> list[str]:
    """The files `--out` receives for task."""
    if task == "mmlu":
        return ["mmlu.csv", "mmlu_subjects.csv", "mmlu_questions.csv"]
    if task == "all":
        return ["all.csv"] + [
            f for t in ("mmlu", *benchmarks.TASKS) for f in written(t)
        ]
    return [f"{task}.csv", f"{task}_questions.csv"]


def check_out(args) -> None:
    """--out before any work: a folder (or a path to make one), whose earlier results
    stay unless --overwrite."""
    if args.out is None:
        return
    if args.out.exists() and not args.out.is_dir():
        raise UsageError(f"--out must be a folder, got the file {args.out}")
    found = [name for name in written(args.task) if (args.out / name).exists()]
    if found and not args.overwrite:
        raise UsageError(
            f"{args.out} already holds {found[0]} from an earlier run: give another "
            "--out, or --overwrite to replace it"
        )


def check_args(args) -> None:
    for name in ("limit", "threads", "token_budget"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if args.shots < 0:
        raise UsageError(f"--shots must be >= 0, got {args.shots}")
    if args.model is not None and not args.model.strip():
        raise UsageError(
            "--model is empty: name a .gguf file or a model folder, or leave it out"
        )
    if args.device is not None:
        from smol.commands.generate import _check_device

        _check_device(args.device)
    hub_id = args.model is not None and re.fullmatch(r"[\w.-]+/[\w.-]+", args.model)
    if args.model is not None and not (Path(args.model).exists() or hub_id):
        raise UsageError(f"--model: no such file or folder, nor a hub id: {args.model}")


def write_csv(path: Path, rows: list[dict], append: bool = False) -> None:
    """rows (dicts with the same keys) as a CSV; with append, after the rows already
    in path (its header is written only when the file is new)."""
    header = not (append and path.exists())
    with open(path, "a" if append else "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        if header:
            writer.writeheader()
        writer.writerows(rows)


PERCENT = {
    "accuracy": "accuracy (%)",
    "ci_low": "95% low (%)",
    "ci_high": "95% high (%)",
    "acc_norm": "normalised (%)",
    "acc_norm_subject_mean": "normalised subject mean (%)",
}


def rounded(summary: dict) -> dict:
    """A summary's fractions as percentages with two decimals, for a CSV."""
    return {
        PERCENT.get(k, k): round(100 * v, 2) if k in PERCENT else v
        for k, v in summary.items()
    }


def question_row(number: int, r: evaluate.Result) -> dict:
    """One question's outcome: its number in file order (of the 14,042), subject,
    right letter, each choice's summed log-likelihood, and whether the sum and the sum
    per character picked the right one."""
    letters = evaluate.LETTERS
    return {
        "question": number,
        "subject": r.question.subject,
        "answer": letters[r.question.answer],
        **{f"logprob {L}": round(lp, 4) for L, lp in zip(letters, r.logprobs)},
        "correct": int(r.correct),
        "correct normalised": int(r.correct_norm),
    }


def matmul_seconds(dtype: torch.dtype, rows: int = 64) -> float:
    """The best of three CPU times of a (rows, 576) x (576, 1536) product in dtype: an
    MLP's up projection over a short batch, the shape that dominates an evaluation."""
    a = torch.randn(rows, 576).to(dtype)
    b = torch.randn(576, 1536).to(dtype)
    times = []
    for _ in range(3):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return min(times)


def cpu_kind() -> str:
    """The vector instructions PyTorch's CPU kernels use here (AVX2, AVX512, ...), and
    "+ bf16" where the CPU also multiplies bfloat16 matrices natively."""
    kind = torch.backends.cpu.get_cpu_capability()
    native = (
        getattr(torch.cpu, name, lambda: False)()
        for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    )
    return kind + " + bf16" if any(native) else kind


def bfloat16_warning(float32_seconds: float, bfloat16_seconds: float) -> str | None:
    """A warning when bfloat16 products run at least 1.5 times as long as float32's:
    a CPU without bfloat16 matrix instructions converts every element first."""
    ratio = bfloat16_seconds / float32_seconds
    if ratio < 1.5:
        return None
    return (
        f"warning: a bfloat16 matrix product takes {ratio:.1f} times as long as a "
        f"float32 one on this CPU ({cpu_kind()}: no bfloat16 matrix instructions such "
        "as AVX-512 BF16 or AMX); --dtype float32 is faster here"
    )


def load_model(args):
    """(model, tokenizer, device) as the options ask, with the bfloat16 warning."""
    from smol.pretrained import load_pretrained

    model, tokenizer = load_pretrained(
        args.model, device=args.device, dtype=DTYPES[args.dtype]
    )
    device = next(model.parameters()).device
    if args.dtype == "bfloat16" and device.type == "cpu":
        warning = bfloat16_warning(
            matmul_seconds(torch.float32), matmul_seconds(torch.bfloat16)
        )
        if warning is not None:
            print(warning, file=sys.stderr, flush=True)
    return model, tokenizer, device


def run_mmlu(args, loaded=None) -> list[evaluate.Result]:
    questions = pool = evaluate.load_mmlu()
    if args.limit is not None:
        questions = evaluate.subset(pool, args.limit, args.seed)
    model, tokenizer, device = loaded or load_model(args)
    start, cpu_start = time.perf_counter(), time.process_time()
    results = evaluate.evaluate(
        model,
        tokenizer,
        questions,
        args.formulation,
        args.shots,
        args.token_budget,
        progress=True,
        pool=pool,
    )
    seconds = time.perf_counter() - start
    cpu_seconds = time.process_time() - cpu_start
    s = stats.summarize(results)
    s["acc_norm_subject_mean"] = stats.subject_mean(results)
    print(
        f"MMLU {args.formulation}, {args.shots}-shot, {s['questions']} questions: "
        f"accuracy {100 * s['accuracy']:.1f}% (95% interval "
        f"{100 * s['ci_low']:.1f} to {100 * s['ci_high']:.1f}), normalised "
        f"{100 * s['acc_norm']:.1f}% (mean over subjects "
        f"{100 * s['acc_norm_subject_mean']:.1f}%), in {seconds:.0f} s"
    )
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        summary = {
            "model": args.model or "bundled Q4_1 GGUF",
            "formulation": args.formulation,
            "shots": args.shots,
            "dtype": args.dtype,
            **rounded(s),
            "seconds": round(seconds),
            "cpu_seconds": round(cpu_seconds),
            "device": device.type,
            "threads": torch.get_num_threads() if device.type == "cpu" else "",
            "cpu": cpu_kind() if device.type == "cpu" else "",
        }
        write_csv(args.out / "mmlu.csv", [summary])
        subjects = stats.by_subject(results)
        write_csv(
            args.out / "mmlu_subjects.csv",
            [{"subject": k, **rounded(v)} for k, v in subjects.items()],
        )
        number = {id(q): i for i, q in enumerate(pool)}
        write_csv(
            args.out / "mmlu_questions.csv",
            [question_row(number[id(r.question)], r) for r in results],
        )
    return results


def run_card(args) -> None:
    """One benchmark of the card, or (all) MMLU's cloze and every other one; with
    --out, all.csv holds each task's summary."""
    loaded = load_model(args)
    model, tokenizer, _ = loaded
    tasks = benchmarks.TASKS if args.task == "all" else (args.task,)
    summaries = []
    if args.task == "all":
        args.formulation = "cloze"
        start = time.perf_counter()
        results = run_mmlu(args, loaded)
        summaries.append(
            benchmarks.summarize("mmlu", results, time.perf_counter() - start)
        )
    for task in tasks:
        s, _ = benchmarks.run(
            task,
            model,
            tokenizer,
            args.limit,
            args.shots,
            args.token_budget,
            args.out,
            args.seed,
            progress=True,
        )
        summaries.append(s)
        print(
            f"{task}, {args.shots}-shot, {s['questions']} questions: accuracy "
            f"{100 * s['acc']:.1f}% ({100 * s['acc low']:.1f} to "
            f"{100 * s['acc high']:.1f}), normalised {100 * s['acc_norm']:.1f}% "
            f"({100 * s['acc_norm low']:.1f} to {100 * s['acc_norm high']:.1f}), "
            f"in {s['seconds']:.0f} s",
            flush=True,
        )
    if args.task == "all" and args.out is not None:
        extra = {"model": args.model or "bundled Q4_1 GGUF", "shots": args.shots}
        benchmarks.write_summary(args.out / "all.csv", summaries, extra)


def verdicts(path: Path, by: str) -> dict[int, bool]:
    """question number -> right or not, from a run's mmlu_questions.csv."""
    if path.is_dir():
        path = path / "mmlu_questions.csv"
    if not path.is_file():
        raise UsageError(f"no such file: {path} (written by mmlu --out)")
    column = "correct normalised" if by == "normalised" else "correct"
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text ({e.reason})") from None
    if not rows:
        raise ValueError(f"{path} holds no questions (written by mmlu --out)")
    found: dict[int, bool] = {}
    for line, row in enumerate(rows, start=2):
        number, verdict = row.get("question"), row.get(column)
        if number is None or verdict is None:
            raise ValueError(
                f"{path} has no {'question' if number is None else column!r} "
                "column (written by mmlu --out)"
            )
        if not number.isdigit() or verdict not in ("0", "1"):
            raise ValueError(
                f"{path}, line {line}: expected a question number and a verdict of "
                f"0 or 1, got {number!r} and {verdict!r}"
            )
        found[int(number)] = verdict == "1"
    return found


COMPARISON = (
    "before,after,by,questions,before (%),after (%),right to wrong,wrong to right,"
    "sign test p"
)  # the header of compare's --csv


def check_comparisons(path: Path | None) -> None:
    """--csv: new, or a CSV of earlier comparisons, which a row is added to."""
    if path is None or not path.exists():
        return
    if path.is_dir():
        raise UsageError(f"--csv must be a file, got the folder {path}")
    with open(path, "rb") as f:
        first = f.readline().rstrip(b"\r\n")
    if first != COMPARISON.encode():
        raise UsageError(
            f"--csv {path} holds something other than earlier comparisons: give a "
            "new file, or one that compare wrote"
        )


def compare(args) -> None:
    c = stats.paired(verdicts(args.before, args.by), verdicts(args.after, args.by))
    print(
        f"{c['questions']} questions in both, by the {args.by} score: "
        f"{100 * c['before']:.1f}% -> {100 * c['after']:.1f}%; "
        f"{c['lost']} right to wrong, {c['gained']} wrong to right "
        f"(sign test p = {c['p']:.3f})"
    )
    if args.csv is not None:
        row = {
            "before": args.before.name or str(args.before),
            "after": args.after.name or str(args.after),
            "by": args.by,
            "questions": c["questions"],
            "before (%)": round(100 * c["before"], 2),
            "after (%)": round(100 * c["after"], 2),
            "right to wrong": c["lost"],
            "wrong to right": c["gained"],
            "sign test p": round(c["p"], 3),
        }
        write_csv(args.csv, [row], append=True)


def _parse(argv) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    if args.task != "compare":
        check_args(args)
        check_out(args)
    else:
        check_comparisons(args.csv)
    return args


def _work(args) -> None:
    if args.task == "compare":
        return compare(args)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.out is not None:  # made before the hours of work, not after
        args.out.mkdir(parents=True, exist_ok=True)
        if not os.access(args.out, os.W_OK):
            raise UsageError(f"--out {args.out} is not writable")
    if args.task == "mmlu":
        run_mmlu(args)
    else:
        run_card(args)


def main(argv: list[str] | None = None) -> int:
    return run("smol eval", lambda: _parse(argv), _work)
