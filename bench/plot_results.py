"""Draw the book's benchmark figure from the measured numbers in bench/results/*.csv.

The CSV files hold what the benchmark scripts printed (the book's Benchmarks page
shows them as
tables); this script turns them into book/images/benchmarks.svg, a vector picture
drawn at the width the
book shows it, so its labels stay legible. Run it after updating a CSV:

    python bench/plot_results.py
"""

from __future__ import annotations

import csv
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
OUT = ROOT / "book" / "images" / "benchmarks.svg"


def rows(name: str) -> list[dict[str, str]]:
    path = RESULTS / name
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def main() -> None:
    forward, generate = rows("forward.csv"), rows("generate.csv")
    panels = [p for p in (forward, generate) if p]
    if not panels:
        raise SystemExit(f"no results in {RESULTS}")
    # One panel under the other, 7 inches wide: about the width of the book's text
    # column.
    fig, axes = plt.subplots(
        len(panels), 1, figsize=(7, 3.6 * len(panels)), squeeze=False
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
        names = [r["implementation"] for r in generate]
        rates = [float(r["tokens/s"]) for r in generate]
        bars = ax.barh(
            range(len(rates)),
            rates,
            color=["#2563eb", "#9ca3af", "#f59e0b"][: len(rates)],
        )
        ax.bar_label(bars, labels=[f"{x:.1f}" for x in rates], padding=3)
        ax.set_yticks(range(len(rates)), names)
        ax.invert_yaxis()
        ax.set_xlabel("tokens/s, greedy, 200 new tokens")
        ax.set_title("Generation with SmolLM2-135M on a CPU")
        ax.set_xlim(0, max(rates) * 1.2)
    fig.tight_layout()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    # no timestamp: the same CSVs, the same file
    fig.savefig(OUT, metadata={"Date": None})
    print("wrote", OUT.relative_to(ROOT))


if __name__ == "__main__":
    main()
