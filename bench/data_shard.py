"""The training loader on a token shard of several GB: how fast it serves windows and
how much memory it holds while it reads across the whole file.

A shard of --size-gb GB of uint16 token ids (drawn uniformly below SmolLM2's 49,152: the
loader reads bytes, whatever they mean) is written once into --work, then read the way
`smol train --data` reads its shards: np.memmap, smol.data.PackedWindows of 1024 + 1
tokens in a seeded random order, batches of 16, for --seconds. A sampler records this
process's resident memory every 0.2 s: RSS (VmRSS), which counts the shard's pages the
kernel keeps mapped, and RssAnon, the memory that is not file pages (what would grow if
the loader copied the data). The file's pages are the page cache's to evict; what must
stay flat is RssAnon. The machine's load average is recorded beside the numbers.

    python bench/data_shard.py [--size-gb 4] [--seconds 60] [--work /tmp/smol-shard]
        [--csv bench/results/data_shard.csv]
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from pathlib import Path

import numpy as np
from common import show_measures, status_kb

VOCAB, SEQ_LEN, BATCH = 49152, 1024, 16


def status_mb(field: str) -> float:
    """A memory figure of this process from /proc/self/status, in MB."""
    return status_kb(field) / 1024


def make_shard(path: Path, size_gb: float) -> int:
    """A file of uniform uint16 ids below VOCAB, size_gb GB, written in 256 MB pieces
    (kept between runs); returns its number of tokens."""
    tokens = int(size_gb * 1e9) // 2
    if path.exists() and path.stat().st_size == 2 * tokens:
        return tokens
    path.parent.mkdir(parents=True, exist_ok=True)
    rng, piece = np.random.default_rng(0), 128 << 20
    with open(path, "wb") as f:
        for start in range(0, tokens, piece):
            n = min(piece, tokens - start)
            f.write(rng.integers(0, VOCAB, n, dtype=np.uint16).tobytes())
    return tokens


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size-gb", type=float, default=4.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--work", default="/tmp/smol-shard")
    parser.add_argument("--csv", help="also write the results to this CSV file")
    args = parser.parse_args()
    from smol.data import Batches, PackedWindows

    path = Path(args.work) / "train.bin"
    tokens = make_shard(path, args.size_gb)
    load, before = os.getloadavg()[0], status_mb("RssAnon")
    ids = np.memmap(path, dtype=np.uint16, mode="r", shape=(tokens,))
    batches = Batches(PackedWindows(ids, SEQ_LEN, seed=0), BATCH)
    samples, done = [], threading.Event()

    def sample() -> None:
        while not done.is_set():
            samples.append((status_mb("VmRSS"), status_mb("RssAnon")))
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start, n = time.perf_counter(), 0
    while time.perf_counter() - start < args.seconds:
        x, y = next(batches)
        n += 1
    seconds = time.perf_counter() - start
    done.set()
    sampler.join()
    assert x.shape == (BATCH, SEQ_LEN) and int(x.max()) < VOCAB
    rss = [s[0] for s in samples]
    anon = [s[1] for s in samples]
    read_gb = n * BATCH * (SEQ_LEN + 1) * 2 / 1e9
    load = f"{load:.1f} to {os.getloadavg()[0]:.1f}"
    rows = [
        ["shard", round(path.stat().st_size / 1e9, 2), "GB"],
        ["windows served", n * BATCH, "windows"],
        ["windows per second", round(n * BATCH / seconds), "windows/s"],
        ["tokens per second", round(n * BATCH * SEQ_LEN / seconds), "tokens/s"],
        ["data read", round(read_gb, 2), "GB"],
        ["RssAnon before opening the shard", round(before), "MB"],
        ["RssAnon, largest while reading", round(max(anon)), "MB"],
        ["RssAnon, last", round(anon[-1]), "MB"],
        ["RSS (with mapped file pages), largest", round(max(rss)), "MB"],
        ["RSS (with mapped file pages), last", round(rss[-1]), "MB"],
    ]
    rows = [[*row, round(seconds, 1), os.cpu_count(), load] for row in rows]
    header = ["measure", "value", "unit", "seconds", "cpus", "load"]
    print(f"load {load}")
    show_measures(header, rows, args.csv)


if __name__ == "__main__":
    main()
