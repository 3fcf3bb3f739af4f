"""Draw the book's benchmark figure from the measured numbers in bench/results/*.csv.

The CSV files hold what the benchmark scripts printed (the book's Benchmarks page shows
them as tables); this script turns them into book/images/generated/benchmarks.svg, a
vector picture drawn at the width the book shows it, so its labels stay legible. Every
build of the book runs it (book/_ext/figures.py), so the figure is never older than the
CSVs; the same CSVs give the same file, byte for byte.

    python bench/plot_results.py
"""

from __future__ import annotations

import csv
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# the SVG's element ids from a fixed salt, not a random one: same CSVs, same file
matplotlib.rcParams["svg.hashsalt"] = "smol"

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
OUT = ROOT / "book" / "images" / "generated" / "benchmarks.svg"
CARD_OUT = OUT.with_name("card.svg")
# inches: drawn this wide, with labels of 9 points or more, a figure shown across a
# phone's 358-pixel text column keeps its labels 8 px high (the book's browser test)
PHONE_WIDTH = 5.2
TABLE_OUT = OUT.with_name("card_table.csv")
AGREEMENT_OUT = OUT.with_name("card_agreement_table.csv")
# SmolLM2's model card (lighteval): SmolLM2-135M-Instruct's scores and the base
# model's, in %, where the card gives them. Its ARC is one number for both splits, so
# it is drawn against neither; its CommonsenseQA scores the answers' texts, as
# commonsenseqa-cloze does, not lm-eval's letters.
CARD = {
    "mmlu": (29.3, None),
    "hellaswag": (40.9, 42.1),
    "arc": (37.3, 43.9),
    "piqa": (66.3, 68.4),
    "winogrande": (None, 51.3),
    "openbookqa": (None, 34.6),
    "commonsenseqa-cloze": (None, 33.9),
}
# a guess's accuracy: 1 over the number of choices (most ARC questions have four)
CHANCE = {
    "hellaswag": 25,
    "arc-easy": 25,
    "arc-challenge": 25,
    "piqa": 50,
    "winogrande": 50,
    "openbookqa": 25,
    "commonsenseqa": 20,
    "commonsenseqa-cloze": 20,
}


def rows(name: str) -> list[dict[str, str]]:
    path = RESULTS / name
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def draw_card(out: Path = CARD_OUT) -> None:
    """bench/results/card.csv: each task's normalised accuracy with its 95% interval,
    the accuracy of a guess, and the model card's numbers."""
    card = rows("card.csv")
    if not card:
        return
    tasks = [r["task"] for r in card]
    norm = [float(r["acc_norm (%)"]) for r in card]
    low = [n - float(r["acc_norm low (%)"]) for n, r in zip(norm, card)]
    high = [float(r["acc_norm high (%)"]) - n for n, r in zip(norm, card)]
    fig, ax = plt.subplots(figsize=(PHONE_WIDTH, 4.2))
    x = range(len(tasks))
    ax.errorbar(
        x,
        norm,
        yerr=[low, high],
        fmt="o",
        color="#2563eb",
        capsize=4,
        label="smol, bundled weights (95%)",
    )
    ax.scatter(
        x,
        [CHANCE[t] for t in tasks],
        marker="_",
        s=400,
        color="#6b7280",
        label="a guess",
    )
    labelled = set()
    for i, t in enumerate(tasks):
        for value, label, fill in zip(
            CARD.get(t, (None, None)),
            ("card: 135M-Instruct", "card: 135M base"),
            ("#dc2626", "none"),
        ):
            if value is None:
                continue
            ax.scatter(
                i + 0.15,
                value,
                marker="D",
                facecolor=fill,
                zorder=3,
                edgecolor="#dc2626",
                label=None if label in labelled else label,
            )
            labelled.add(label)
    ax.set_xticks(list(x), tasks, fontsize=9, rotation=20)
    ax.set_ylabel("normalised accuracy (%)")
    ax.set_ylim(0, 100)
    ax.set_title("The model card's benchmarks\non the bundled weights")
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles, labels, fontsize=9, loc="upper right")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, metadata={"Date": None})
    plt.close(fig)
    print("wrote", out)


# The card's benchmarks in the table's order.
TABLE_TASKS = (
    "mmlu",
    "hellaswag",
    "arc-easy",
    "arc-challenge",
    "piqa",
    "winogrande",
    "openbookqa",
    "commonsenseqa",
    "commonsenseqa-cloze",
)


def write_table(out: Path, table: list[dict]) -> None:
    """A table the book shows (csv-table) under book/images/generated/."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(table)
    print("wrote", out)


def why(task: str, instruct, base, low: float, high: float, mmlu_mean: float) -> str:
    """Why smol's number and the card's can differ, where it is known; else whether
    the card's number (the Instruct model's, or the base model's where the card gives
    no other) lies within smol's 95% interval."""
    if task.startswith("arc-"):
        return "the card's ARC is both sets' mean, on their test splits"
    if task == "commonsenseqa":
        return "lm-eval's letters; the card scores the answers' texts (next row)"
    card, whose = (
        (instruct, "") if instruct is not None else (base, ", the base model's")
    )
    if low <= card <= high:
        return f"within the interval{whose}"
    if task == "mmlu":
        return f"the card averages the 57 subjects: so averaged, {mmlu_mean:.1f}"
    return f"outside the interval{whose}"


def card_table(out: Path = TABLE_OUT) -> None:
    """bench/results/card.csv and mmlu.csv beside the model card, for the Benchmarks
    page: per benchmark the card's numbers (Instruct, base), smol's normalised
    accuracy on the bundled weights with its 95% Wilson interval and the questions
    it counts (of the split's), and why the two can differ (why())."""
    from smol import stats

    found, mmlu_mean = {}, float("nan")  # task -> (acc_norm, low, high, n, split) in %
    whole = [r for r in rows("mmlu.csv") if r["questions"] == "14042"]
    for r in whole[:1]:  # its first whole-set run (bfloat16)
        n = int(r["questions"])
        low, high = stats.wilson_interval(
            round(float(r["normalised (%)"]) * n / 100), n
        )
        found["mmlu"] = (float(r["normalised (%)"]), 100 * low, 100 * high, n, n)
        mmlu_mean = float(r["normalised subject mean (%)"])
    for r in rows("card.csv"):
        found[r["task"]] = (
            *(float(r[f"acc_norm{k} (%)"]) for k in ("", " low", " high")),
            int(r["questions"]),
            int(r.get("split") or r["questions"]),
        )
    if not found:
        return
    table = []
    for task in (t for t in TABLE_TASKS if t in found):
        acc, low, high, n, split = found[task]
        instruct, base = CARD.get(
            "arc" if task.startswith("arc-") else task, (None,) * 2
        )
        table.append(
            {
                "benchmark": task,
                "card: Instruct": "" if instruct is None else f"{instruct:.1f}",
                "card: base": "" if base is None else f"{base:.1f}",
                "smol (%)": f"{acc:.1f}",
                "95% interval": f"{low:.1f} to {high:.1f}",
                "questions": f"{n:,}" if n == split else f"{n:,} of {split:,}",
                "beside the card": why(task, instruct, base, low, high, mmlu_mean),
            }
        )
    write_table(out, table)


def agreement_table(out: Path = AGREEMENT_OUT) -> None:
    """bench/results/card_agreement.csv in the columns a page's width holds: per task
    the questions, the share both harnesses pick alike (by acc, by acc_norm), each
    accuracy as smol's / lm-eval's, and the largest log-likelihood difference."""
    found = rows("card_agreement.csv")
    if not found:
        return
    table = [
        {
            "task": r["task"],
            "questions": r["questions"],
            "same pick (%): acc, acc_norm": (
                f"{r['same acc pick (%)']}, {r['same acc_norm pick (%)']}"
            ),
            "acc (%): smol / lm-eval": f"{r['smol acc (%)']} / {r['lm-eval acc (%)']}",
            "acc_norm (%): smol / lm-eval": (
                f"{r['smol acc_norm (%)']} / {r['lm-eval acc_norm (%)']}"
            ),
            "largest difference": r["largest log-likelihood difference"],
        }
        for r in found
    ]
    write_table(out, table)


def ratio_bars(ax, labels, ratios, colors, fmt, xlabel, title) -> None:
    """One horizontal bar a label, its ratio written beside it, a dashed line at 1
    (transformers' own), labels and titles set right so they fit a phone's width."""
    bars = ax.barh(range(len(ratios)), ratios, color=colors)
    ax.bar_label(bars, labels=[fmt.format(x) for x in ratios], padding=3, fontsize=9)
    ax.axvline(1.0, color="#374151", linestyle="--", linewidth=1)
    ax.set_yticks(range(len(ratios)), labels, fontsize=9)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel, loc="right")
    ax.set_title(title, loc="right")


def main(out: Path = OUT) -> None:
    forward, generate = rows("forward.csv"), rows("generate.csv")
    panels = [p for p in (forward, generate) if p]
    if not panels:
        raise SystemExit(f"no results in {RESULTS}")
    heights = [0.32 * len(p) + 1.4 for p in panels]
    fig, axes = plt.subplots(
        len(panels),
        1,
        figsize=(PHONE_WIDTH, sum(heights)),
        squeeze=False,
        gridspec_kw={"height_ratios": heights},
    )
    axes = list(axes[:, 0])
    if forward:
        ax = axes.pop(0)
        labels = [
            f"{r['preset'].replace('smollm2-', '')}, {r['pass'].replace('+', ' + ')}"
            for r in forward
        ]
        ratios = [float(r["smol / transformers"]) for r in forward]
        ratio_bars(
            ax,
            labels,
            ratios,
            ["#2563eb" if x <= 1 else "#dc2626" for x in ratios],
            "{:.2f}",
            "smol's time / transformers'",
            "Forward and backward on a CPU\n(lower is faster)",
        )
        ax.set_xlim(0, max(1.2, max(ratios) * 1.25))
    if generate:
        ax = axes.pop(0)
        names = [r["path"] for r in generate]
        ratios = [float(r["vs transformers float32"]) for r in generate]
        colors = [
            "#9ca3af"
            if n.startswith("transformers")
            else "#16a34a"
            if "batch" in n
            else "#2563eb"
            for n in names
        ]
        ratio_bars(
            ax,
            names,
            ratios,
            colors,
            "{:.2f}x",
            "tokens/s over transformers', float32",
            "Greedy decoding on a CPU\n(higher is faster)",
        )
        ax.set_xlim(0, max(ratios) * 1.2)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    # no timestamp: the same CSVs, the same file
    fig.savefig(out, metadata={"Date": None})
    plt.close(fig)
    print("wrote", out)


if __name__ == "__main__":
    main()
    draw_card()
    card_table()
    agreement_table()
