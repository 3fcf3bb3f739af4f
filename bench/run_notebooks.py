"""Execute every chapter notebook top to bottom (on the GPU when there is one) and fail
on any error. The executed copies go to --out, never over the repository's notebooks;
the longest (by bench/results/notebook_times.csv) start first.

    python bench/run_notebooks.py --out /tmp/executed [--jobs 4] [--timeout 240]
    python bench/run_notebooks.py --out DIR --only 11 --csv times.csv   # chapter 11

`bench/store_gpu_outputs.py DIR` then copies the outputs of the cells tagged
`gpu-output` from a GPU's executed copies into the chapters.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(path: Path, out: Path, timeout: int) -> tuple[str, float, str | None]:
    import nbformat
    from nbclient import NotebookClient

    start = time.perf_counter()
    nb = nbformat.read(path, as_version=4)
    try:
        NotebookClient(
            nb,
            timeout=timeout,
            kernel_name="python3",
            resources={"metadata": {"path": str(path.parent)}},
        ).execute()
        error = None
    except Exception as e:  # a failing cell, a timeout, a dead kernel: report, go on
        lines = str(e).strip().splitlines() or [""]
        error = f"{type(e).__name__}: {lines[-1]}"
    nb.metadata["smol_executed_on"] = (
        device_name()
    )  # bench/store_gpu_outputs.py reads it
    nbformat.write(nb, out / path.name)
    return path.name, time.perf_counter() - start, error


def expected_seconds() -> dict[str, float]:
    """Each chapter's seconds on a CPU, as `make test` last measured them."""
    path = ROOT / "bench" / "results" / "notebook_times.csv"
    with path.open(newline="", encoding="utf-8") as f:
        return {
            row["chapter"]: float(row["seconds on a CPU"]) for row in csv.DictReader(f)
        }


def device_name() -> str:
    import torch

    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()} (PyTorch {torch.__version__})"
    return f"CPU (PyTorch {torch.__version__})"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out", type=Path, required=True, help="folder for executed copies"
    )
    parser.add_argument("--jobs", type=int, default=4, help="notebooks run at once")
    parser.add_argument("--timeout", type=int, default=240, help="seconds per cell")
    parser.add_argument(
        "--list", action="store_true", help="list the notebooks and stop"
    )
    parser.add_argument(
        "--only", default="", help="chapter numbers to run, comma-separated (11,12)"
    )
    parser.add_argument(
        "--skip", default="", help="chapter numbers to leave out, comma-separated"
    )
    parser.add_argument(
        "--csv", type=Path, help="write each notebook's time and outcome here"
    )
    args = parser.parse_args()
    notebooks = sorted((ROOT / "chapters").glob("*.ipynb"))
    only, skip = (
        {f"{int(n):02d}" for n in text.split(",") if n.strip()}
        for text in (args.only, args.skip)
    )
    for chosen in only | skip:
        if not any(p.name.startswith(chosen + "_") for p in notebooks):
            parser.error(f"no chapter {chosen} in chapters/")
    notebooks = [
        p
        for p in notebooks
        if (not only or p.name[:2] in only) and p.name[:2] not in skip
    ]
    notebooks.sort(key=lambda p: -expected_seconds().get(p.stem, 0))
    if args.list:
        print("\n".join(p.name for p in notebooks))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    failed, rows = 0, []
    device = device_name()
    with ThreadPoolExecutor(args.jobs) as pool:
        jobs = [pool.submit(run, p, args.out, args.timeout) for p in notebooks]
        for job in jobs:
            name, seconds, error = job.result()
            failed += error is not None
            rows.append([name, device, f"{seconds:.0f}", error or "ok", args.jobs])
            if args.csv:  # after each notebook: a run cut short keeps what it did
                with args.csv.open("w", newline="", encoding="utf-8") as f:
                    header = ["notebook", "device", "seconds", "outcome", "run at once"]
                    csv.writer(f).writerows([header, *sorted(rows)])
            print(
                f"  {name:40s} {seconds:6.1f} s  "
                + (f"FAILED: {error}" if error else "ok"),
                flush=True,
            )
    print(
        f"{len(notebooks) - failed} of {len(notebooks)} notebooks ran without an error;"
        " "
        f"executed copies in {args.out}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
