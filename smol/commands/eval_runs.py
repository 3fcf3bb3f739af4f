"""What `smol eval` runs: the model loaded as the options ask (with a warning where
this CPU's bfloat16 is slow), MMLU or the card's benchmarks measured and printed, and
their results written as CSVs into --out."""

from __future__ import annotations

import csv
import sys
import time
from pathlib import Path

import torch

from smol import benchmarks, evaluate, stats
from smol.commands.eval_partial import (
    KeptScores,
    card_partial,
    keep_partial,
    mmlu_results,
    partial_name,
)
from smol.commands.eval_shots import card_render, check_shots, mmlu_render

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


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
    """The best of five CPU times of a (rows, 576) x (576, 1536) product in dtype (after
    one untimed product, which sets up the kernel): an MLP's up projection over a short
    batch, the shape that dominates an evaluation."""
    a = torch.randn(rows, 576).to(dtype)
    b = torch.randn(576, 1536).to(dtype)
    a @ b
    times = []
    for _ in range(5):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return min(times)


def native_bfloat16() -> bool:
    """Whether this CPU multiplies bfloat16 matrices with instructions of its own
    (AVX-512 BF16 or AMX) rather than converting every element to float32 first."""
    return any(
        getattr(torch.cpu, name, lambda: False)()
        for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    )


def cpu_kind() -> str:
    """The vector instructions PyTorch's CPU kernels use here (AVX2, AVX512, ...), and
    "+ bf16" where the CPU also multiplies bfloat16 matrices natively."""
    kind = torch.backends.cpu.get_cpu_capability()
    return kind + " + bf16" if native_bfloat16() else kind


def bfloat16_warning(float32_seconds: float, bfloat16_seconds: float) -> str | None:
    """A warning when bfloat16 products run at least 1.5 times as long as float32's:
    a CPU without bfloat16 matrix instructions converts every element first. A CPU
    with them is never warned about: there a slow product is another program's load
    on the cores, not the instructions (one such reading said 6.4 where bfloat16 runs
    twice as fast as float32)."""
    ratio = bfloat16_seconds / float32_seconds
    if ratio < 1.5 or native_bfloat16():
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
    context = model.config.max_position_embeddings
    render = mmlu_render(args.formulation)
    check_shots("MMLU", args.shots, questions, pool, tokenizer, context, render)
    start, cpu_start = time.perf_counter(), time.process_time()
    number = {id(q): i for i, q in enumerate(pool)}

    def write_rows(path, results):
        write_csv(path, [question_row(number[id(r.question)], r) for r in results])

    kept = KeptScores()
    try:
        results = mmlu_results(
            model,
            tokenizer,
            questions,
            args.formulation,
            args.shots,
            args.token_budget,
            pool,
            kept,
        )
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (common.Terminated)
        keep_partial(e, args.out, "MMLU", len(questions), e.partial, write_rows)
        raise
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
        write_rows(args.out / "mmlu_questions.csv", results)
        # what an interrupted run kept, replaced (with --overwrite) by the whole
        (args.out / partial_name("mmlu")).unlink(missing_ok=True)
    return results


def run_card(args) -> None:
    """One benchmark of the card, or (all) MMLU's cloze and every other one; with
    --out, all.csv holds each task's summary."""
    loaded = load_model(args)
    model, tokenizer, _ = loaded
    tasks = benchmarks.TASKS if args.task == "all" else (args.task,)
    selected = {}
    for task in tasks:  # every task's prompts fit, before the first is scored
        pool = benchmarks.load(task)
        items = (
            pool if args.limit is None else evaluate.subset(pool, args.limit, args.seed)
        )
        context = model.config.max_position_embeddings
        check_shots(task, args.shots, items, pool, tokenizer, context, card_render)
        selected[task] = items  # the items benchmarks.run selects, in its order
    summaries = []
    try:
        if args.task == "all":
            args.formulation = "cloze"
            start = time.perf_counter()
            results = run_mmlu(args, loaded)
            summaries.append(
                benchmarks.summarize("mmlu", results, time.perf_counter() - start)
            )
        for task in tasks:
            summaries.append(run_task(args, task, loaded, selected[task]))
    except KeyboardInterrupt as e:
        if args.task == "all":
            done = [s["task"] for s in summaries]
            where = f" (in {args.out})" if args.out is not None and done else ""
            e.add_note(
                f"complete: {', '.join(done) or 'no task'}{where}; all.csv not written"
            )
        raise
    if args.task == "all" and args.out is not None:
        device = loaded[2]
        extra = {
            "model": args.model or "bundled Q4_1 GGUF",
            "shots": args.shots,
            "dtype": args.dtype,
            "device": device.type,
            "threads": torch.get_num_threads() if device.type == "cpu" else "",
            "cpu": cpu_kind() if device.type == "cpu" else "",
        }
        benchmarks.write_summary(args.out / "all.csv", summaries, extra)


def run_task(args, task: str, loaded, items: list) -> dict:
    """One benchmark of the card scored, printed and (with --out) written; its
    summary. Interrupted, it keeps or discards the questions scored so far
    (eval_partial) and says which."""
    model, tokenizer, _ = loaded
    kept = KeptScores()
    try:
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
            scorer=kept,
        )
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (common.Terminated)
        results = card_partial(items, kept.done)
        keep_partial(e, args.out, task, len(items), results, write_questions(task))
        raise
    if args.out is not None:
        (args.out / partial_name(task)).unlink(missing_ok=True)
    print(
        f"{task}, {args.shots}-shot, {s['questions']} questions: accuracy "
        f"{100 * s['acc']:.1f}% ({100 * s['acc low']:.1f} to "
        f"{100 * s['acc high']:.1f}), normalised {100 * s['acc_norm']:.1f}% "
        f"({100 * s['acc_norm low']:.1f} to {100 * s['acc_norm high']:.1f}), "
        f"in {s['seconds']:.0f} s",
        flush=True,
    )
    return s


def write_questions(task: str):
    return lambda path, results: benchmarks.write_questions(path, task, results)
