"""`smol eval compare`: two runs' verdicts (the per-question CSV that `smol eval mmlu
--out` writes) read and compared on the questions both answered, with the sign test's p;
with --csv, the comparison appended as a row."""

from __future__ import annotations

import csv
from pathlib import Path

from smol import stats
from smol.checkpoint import check_writable, missing_folder
from smol.commands.common import UsageError
from smol.commands.eval_runs import write_csv

VERDICTS = ("correct", "correct normalised")  # by the sum, per character


def verdicts(path: Path, by: str) -> dict[int, bool]:
    """question number -> right or not, from a run's mmlu_questions.csv."""
    if path.is_dir():
        path = path / "mmlu_questions.csv"
    if not path.is_file():
        raise UsageError(f"no such file: {path} (written by mmlu --out)")
    column = VERDICTS[by == "normalised"]
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
        # both verdicts, the one compared and the other: a run edited in either
        # is not the run it claims to be
        for v in [verdict] + [row[k] for k in VERDICTS if row.get(k) is not None]:
            if not number.isdigit() or v not in ("0", "1"):
                raise ValueError(
                    f"{path}, line {line}: expected a question number and a verdict "
                    f"of 0 or 1, got {number!r} and {v!r}"
                )
        if int(number) in found:
            raise ValueError(
                f"{path}, line {line}: question {number} again (a run answers each "
                "question once)"
            )
        found[int(number)] = verdict == "1"
    return found


COMPARISON = (
    "before,after,by,questions,before (%),after (%),right to wrong,wrong to right,"
    "sign test p"
)  # the header of compare's --csv


def check_comparisons(path: Path | None) -> None:
    """--csv: new, or a CSV of earlier comparisons, which a row is added to; in a
    folder that can be written to (found now, not after the work)."""
    if path is None:
        return
    if path.is_dir():
        raise UsageError(f"--csv must be a file, got the folder {path}")
    if not path.parent.is_dir():
        raise UsageError(f"--csv {path}: {missing_folder(path.parent)}")
    try:
        check_writable(path.parent, "the folder of --csv")
    except OSError as e:
        raise UsageError(str(e)) from None
    if not path.exists():
        return
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
