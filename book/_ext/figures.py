"""The book's figures of measured numbers, and the model card's table, made from
bench/results' CSVs each time the book is built (bench/plot_results.py), so that none
can show an older run than the tables beside it. They land in book/images/generated/,
which git ignores."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _draw(app):
    spec = importlib.util.spec_from_file_location(
        "plot_results", ROOT / "bench" / "plot_results.py"
    )
    plot_results = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plot_results)
    plot_results.main()
    plot_results.draw_card()
    plot_results.card_table()
    plot_results.agreement_table()


def setup(app):
    app.connect("builder-inited", _draw)
    return {"parallel_read_safe": True}
