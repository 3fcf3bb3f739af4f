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
# SmolLM2's model card (lighteval): SmolLM2-135M-Instruct's scores and the base
# model's, in %, where the card gives them for a task scored here. Its ARC is one number
# for both splits, so it is not drawn against either.
CARD = {
    "hellaswag": (40.9, 42.1),
    "piqa": (66.3, 68.4),
    "winogrande": (None, 51.3),
    "openbookqa": (None, 34.6),
    "commonsenseqa": (None, 33.9),
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
    fig, ax = plt.subplots(figsize=(8, 3.8))
    x = range(len(tasks))
    ax.errorbar(
        x,
        norm,
        yerr=[low, high],
        fmt="o",
        color="#2563eb",
        capsize=4,
        label=f"smol, bundled weights ({card[0]['questions']} a task, 95%)",
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
    ax.set_title("The model card's benchmarks, scored as lm-evaluation-harness does")
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles, labels, fontsize=8, loc="upper right")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, metadata={"Date": None})
    plt.close(fig)
    print("wrote", out)


def main(out: Path = OUT) -> None:
    forward, generate = rows("forward.csv"), rows("generate.csv")
    panels = [p for p in (forward, generate) if p]
    if not panels:
        raise SystemExit(f"no results in {RESULTS}")
    heights = [3.8 if p is forward else 0.32 * len(p) + 1.2 for p in panels]
    fig, axes = plt.subplots(
        len(panels),
        1,
        figsize=(8, sum(heights)),
        squeeze=False,
        gridspec_kw={"height_ratios": heights},
    )
    axes = list(axes[:, 0])
    if forward:
        ax = axes.pop(0)
        labels = [f"{r['preset']}\n{r['pass']}" for r in forward]
        ratios = [float(r["smol / transformers"]) for r in forward]
        bars = ax.bar(
            range(len(ratios)),
            ratios,
            color=["#2563eb" if x <= 1 else "#dc2626" for x in ratios],
        )
        ax.bar_label(bars, labels=[f"{x:.2f}" for x in ratios], padding=2)
        ax.axhline(1.0, color="#374151", linestyle="--", linewidth=1)
        ax.set_xticks(range(len(ratios)), labels, fontsize=9)
        ax.set_ylabel("time of smol / time of transformers")
        ax.set_title("Forward and backward on a CPU (lower is faster)")
        ax.set_ylim(0, max(1.2, max(ratios) * 1.15))
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
        bars = ax.barh(range(len(ratios)), ratios, color=colors)
        ax.bar_label(bars, labels=[f"{x:.2f}x" for x in ratios], padding=3, fontsize=9)
        ax.axvline(1.0, color="#374151", linestyle="--", linewidth=1)
        ax.set_yticks(range(len(ratios)), names, fontsize=9)
        ax.invert_yaxis()
        ax.set_xlabel("tokens/s relative to transformers.generate, float32")
        ax.set_title("Greedy decoding of SmolLM2-135M on a CPU (higher is faster)")
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
