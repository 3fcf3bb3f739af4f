"""Measure a model on MMLU (smol/evaluate.py) or the model card's other benchmarks
(smol/benchmarks.py: hellaswag, arc-easy, arc-challenge, piqa, winogrande, openbookqa,
commonsenseqa; commonsenseqa-cloze prompts the last as the model card does), or
compare two runs question by question; prints each accuracy with its 95% interval.

    smol eval mmlu --limit 570          # 10 questions of each subject
    smol eval mmlu                      # all 14,042, the bundled weights
    smol eval mmlu --formulation letters --shots 5 --model path/to/folder
    smol eval mmlu --out results/       # mmlu.csv, mmlu_subjects.csv and
                                        # mmlu_questions.csv in results/
    smol eval hellaswag --limit 200     # a seeded subset, spread over its activities
    smol eval all --limit 200 --out results/   # MMLU and the seven others, all.csv
    smol eval compare base/ tuned/      # two runs, question by question

Ctrl-C or SIGTERM stops a run: with --out, the questions scored so far go to
TASK_questions.partial.csv there (no summary: the shortest prompts come first, so they
are not a sample), without it they are discarded; the line that says it stopped says
which. Tasks of `all` that finished keep their files.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import torch

from smol import benchmarks, checkpoint, evaluate
from smol.commands.common import HELP, Parser, UsageError, parser, run
from smol.commands.eval_compare import check_comparisons, compare
from smol.commands.eval_partial import partial_name
from smol.commands.eval_runs import DTYPES, run_card, run_mmlu


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
    for task in (*benchmarks.TASKS, *benchmarks.VARIANTS, "all"):
        about = {
            "all": "measure a model on MMLU and the seven other benchmarks",
            "commonsenseqa-cloze": "measure a model on commonsenseqa with each "
            "answer's text scored, as the model card's lighteval task prompts it",
        }.get(task, f"measure a model on {task}, as lm-evaluation-harness prompts it")
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
    p.add_argument("--out", help=out)
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the results an earlier run wrote in --out",
    )


def written(task: str) -> list[str]:
    """The files `--out` receives for task (an interrupted run's partial questions
    file among them)."""
    if task == "mmlu":
        return ["mmlu.csv", "mmlu_subjects.csv", "mmlu_questions.csv"] + [
            partial_name(task)
        ]
    if task == "all":
        return ["all.csv"] + [
            f for t in ("mmlu", *benchmarks.TASKS) for f in written(t)
        ]
    return [f"{task}.csv", f"{task}_questions.csv", partial_name(task)]


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
    from smol.commands.generate import MAX_THREADS, check_seed

    for name in ("limit", "threads", "token_budget"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if args.threads is not None and args.threads > MAX_THREADS:
        raise UsageError(f"--threads must be in [1, {MAX_THREADS}], got {args.threads}")
    check_seed(args.seed)
    if args.out is not None:
        if not args.out.strip():
            raise UsageError(
                "--out is empty: name a folder for the results, or leave it out"
            )
        args.out = Path(args.out)
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
        try:
            checkpoint.check_writable(args.out, "--out")
        except OSError as e:
            raise UsageError(str(e)) from None
    if args.task == "mmlu":
        run_mmlu(args)
    else:
        run_card(args)


def main(argv: list[str] | None = None) -> int:
    return run("smol eval", lambda: _parse(argv), _work)
