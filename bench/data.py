"""Training on your own text, measured on a generated corpus (files of the plays'
paragraphs, each file all of them in a fresh seeded order, about 4.8 MB): tokenization
speed in MB/s of smol's path (smol.shards: reading, SmolLM2's tokenizer by the batch
encoder on every core, writing and hashing the shards) beside `tokenizers` alone on the
same batches of text, then the loader serving training windows from the memory-mapped
shard (windows/s and tokens/s), and the peak resident memory of each phase, each
measured in a process of its own (VmHWM of /proc/self/status; RssAnon, the memory that
is not file pages, at the end). The machine's load average is recorded beside the
numbers.

    python bench/data.py [--size-mb 1024] [--work /tmp/smol-data-bench]
        [--csv bench/results/data.csv]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from common import show_measures, status_kb


def make_corpus(folder: Path, size_mb: int) -> int:
    """Files of the plays' paragraphs, each in a fresh seeded order, up to size_mb in
    all (kept between runs); returns the corpus's size in bytes."""
    from smol.data import load_plays

    folder.mkdir(parents=True, exist_ok=True)
    want = size_mb << 20
    have = sum(p.stat().st_size for p in folder.glob("*.txt"))
    if have >= want:
        return have
    for p in folder.glob("*.txt"):
        p.unlink()
    paragraphs = [p for t in load_plays().values() for p in t.split("\n\n") if p]
    rng, written, n = random.Random(0), 0, 0
    while written < want:
        rng.shuffle(paragraphs)
        text = "\n\n".join(paragraphs).encode()[: want - written]
        text = text.decode("utf-8", errors="ignore").encode()
        (folder / f"part_{n:04d}.txt").write_bytes(text)
        written, n = written + len(text), n + 1
    return written


def phase(name: str, corpus: Path, shards_dir: Path) -> dict:
    """One measurement in this process: seconds and memory, as a dict."""
    from smol import data, shards, sources
    from smol.train_config import TrainConfig

    cfg = TrainConfig(data=str(corpus), tokenizer="smollm2", progress=False)
    tok = data.load_tokenizer("smollm2")
    base = status_kb("VmRSS")
    start = time.perf_counter()
    if name == "smol":
        manifest, _ = shards.prepare(cfg, shards_dir, "smollm2", tok, 49152, True)
        out = {"tokens": sum(s["tokens"] for s in manifest["splits"].values())}
    elif name == "tokenizers":
        tokens, batch, chars = 0, [], 0
        for text, _ in sources.documents(str(corpus)):
            batch.append(text)
            chars += len(text)
            if len(batch) == shards.BATCH_DOCS or chars >= shards.BATCH_CHARS:
                done = tok.backend.encode_batch_fast(batch, add_special_tokens=False)
                tokens += sum(len(e.ids) for e in done)
                batch, chars = [], 0
        done = tok.backend.encode_batch_fast(batch, add_special_tokens=False)
        out = {"tokens": tokens + sum(len(e.ids) for e in done)}
    else:  # the loader: batches of 16 windows of 1024 tokens for 20 s at least
        manifest = shards.read_manifest(shards_dir)
        _, train, _ = shards.open_shards(shards_dir, manifest, 49152, 1024)
        batches = data.Batches(data.PackedWindows(train, 1024, seed=0), 16)
        n = 0
        while time.perf_counter() - start < 20 or n < 50:
            x, y = next(batches)
            n += 1
        out = {"windows": n * 16, "tokens": n * 16 * 1024}
    return {
        **out,
        "seconds": time.perf_counter() - start,
        "rss_before_mb": base / 1024,
        "peak_rss_mb": status_kb("VmHWM") / 1024,
        "anon_rss_mb": status_kb("RssAnon") / 1024,
    }


def run_phase(name: str, args) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, __file__, "--phase", name, "--work", args.work],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--work", default="/tmp/smol-data-bench")
    parser.add_argument("--csv", help="also write the results to this CSV file")
    parser.add_argument("--phase", help=argparse.SUPPRESS)
    args = parser.parse_args()
    work = Path(args.work)
    if args.phase:
        print(json.dumps(phase(args.phase, work / "corpus", work / "shards")))
        return
    size = make_corpus(work / "corpus", args.size_mb)
    load = os.getloadavg()[0]
    results = {name: run_phase(name, args) for name in ("smol", "tokenizers", "load")}
    load = f"{load:.1f} to {os.getloadavg()[0]:.1f}"
    mb = size / 1e6
    rows = []
    for name, what in (("smol", "smol's path"), ("tokenizers", "tokenizers alone")):
        r = results[name]
        rows.append([f"tokenize, {what}", round(mb / r["seconds"], 2), "MB/s"])
        rows.append(
            [f"tokenize, {what}", round(r["tokens"] / r["seconds"]), "tokens/s"]
        )
    r, served = results["load"], "load batches of 16 x 1024 tokens"
    rows.append([served, round(r["windows"] / r["seconds"]), "windows/s"])
    rows.append([served, round(r["tokens"] / r["seconds"]), "tokens/s"])
    for name in ("smol", "tokenizers", "load"):
        for key in ("rss_before_mb", "peak_rss_mb", "anon_rss_mb"):
            rows.append([f"{name}: {key[:-3]}", round(results[name][key]), "MB"])
    rows = [
        [*row, round(mb), results["smol"]["tokens"], os.cpu_count(), load]
        for row in rows
    ]
    header = ["measure", "value", "unit", "corpus_mb", "corpus_tokens", "cpus", "load"]
    print(f"corpus {mb:,.0f} MB, {results['smol']['tokens']:,} tokens; load {load}")
    show_measures(header, rows, args.csv)


if __name__ == "__main__":
    main()
