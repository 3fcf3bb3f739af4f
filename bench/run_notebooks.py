"""Execute every chapter notebook top to bottom (on the GPU when there is one) and fail
on any error. The executed copies go to --out, never over the repository's notebooks.

    python bench/run_notebooks.py --out /tmp/executed [--jobs 4] [--timeout 240]
"""

from __future__ import annotations

import argparse
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
    nbformat.write(nb, out / path.name)
    return path.name, time.perf_counter() - start, error


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
    args = parser.parse_args()
    notebooks = sorted((ROOT / "chapters").glob("*.ipynb"))
    if args.list:
        print("\n".join(p.name for p in notebooks))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    failed = 0
    with ThreadPoolExecutor(args.jobs) as pool:
        jobs = [pool.submit(run, p, args.out, args.timeout) for p in notebooks]
        for job in jobs:
            name, seconds, error = job.result()
            failed += error is not None
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
