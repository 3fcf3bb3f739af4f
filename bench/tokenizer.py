"""The hand-written BPE (smol.bpe) against `tokenizers` (Rust), on this machine's CPU:
pre-tokenizing and encoding speed in MB/s with SmolLM2's tokenizer, and the time to
train 4,096 tokens on the Shakespeare training plays. Runs alternate, so that a busy
machine slows both alike; medians are reported. Ids and merges are checked equal.

    python bench/tokenizer.py [--runs 5] [--train-runs 3]
        [--csv bench/results/tokenizer.csv]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from common import write_csv
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from smol.bpe import BPE, pre_tokenize, train
from smol.data import EOT, split_plays
from smol.gguf import GGUFFile, bundled_gguf_path, tokenizer_from_gguf


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def tokenizers_train(texts, vocab_size):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return tok


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5, help="encoding runs of each")
    parser.add_argument(
        "--train-runs", type=int, default=3, help="training runs of each"
    )
    parser.add_argument("--csv", help="also write the medians to this CSV file")
    args = parser.parse_args()

    bpe = BPE.from_pretrained()
    rust = tokenizer_from_gguf(GGUFFile(bundled_gguf_path())).backend
    text = "\n".join(split_plays("val"))  # the two held-out plays
    lines = text.split("\n")
    mb = len(text.encode("utf-8")) / 1e6
    assert bpe.encode(text) == rust.encode(text, add_special_tokens=False).ids

    def cold(fn):
        def run():
            bpe.cache.clear()
            fn()

        return run

    encodes = {  # case: (smol.bpe, tokenizers)
        "pre-tokenize one text (2 plays)": (
            lambda: pre_tokenize(text),
            lambda: rust.pre_tokenizer.pre_tokenize_str(text),
        ),
        "encode one text (2 plays), empty cache": (
            cold(lambda: bpe.encode(text)),
            lambda: rust.encode(text, add_special_tokens=False),
        ),
        "encode one text (2 plays), warm cache": (
            lambda: bpe.encode(text),
            lambda: rust.encode(text, add_special_tokens=False),
        ),
        f"encode {len(lines):,} lines, empty cache (tokenizers: encode_batch)": (
            cold(lambda: [bpe.encode(line) for line in lines]),
            lambda: rust.encode_batch(lines, add_special_tokens=False),
        ),
    }
    rows = []
    print(f"{os.cpu_count()} CPUs, {mb:.3f} MB of text, median of {args.runs} runs")
    for case, (ours, theirs) in encodes.items():
        ours(), theirs()  # warm-up
        times = [[], []]
        for _ in range(args.runs):
            times[0].append(timed(ours))
            times[1].append(timed(theirs))
        t_ours, t_theirs = map(statistics.median, times)
        rows.append([case, "MB/s", f"{mb / t_ours:.2f}", f"{mb / t_theirs:.2f}"])
        rows[-1].append(f"{t_ours / t_theirs:.2f}")
        print(
            f"  {case:60s} smol.bpe {mb / t_ours:6.2f} MB/s, tokenizers "
            f"{mb / t_theirs:6.2f} MB/s: {t_ours / t_theirs:.2f}x the time"
        )

    plays = split_plays("train")
    times, results = [[], []], [None, None]
    for _ in range(args.train_runs):
        for k, fn in enumerate(
            (lambda: train(plays, 4096, [EOT]), lambda: tokenizers_train(plays, 4096))
        ):
            start = time.perf_counter()
            results[k] = fn()
            times[k].append(time.perf_counter() - start)
    ours, theirs = results
    merges = [tuple(m) for m in json.loads(theirs.to_str())["model"]["merges"]]
    assert ours.merges == merges, "the trained merges differ"
    t_ours, t_theirs = map(statistics.median, times)
    case = f"train 4,096 tokens on {len(plays)} plays (same merges)"
    rows.append(
        [case, "s", f"{t_ours:.1f}", f"{t_theirs:.1f}", f"{t_ours / t_theirs:.2f}"]
    )
    print(
        f"  {case:60s} smol.bpe {t_ours:6.1f} s, tokenizers {t_theirs:6.1f} s: "
        f"{t_ours / t_theirs:.2f}x the time (median of {args.train_runs})"
    )
    if args.csv:
        header = ["case", "unit", "smol.bpe", "tokenizers"]
        write_csv(args.csv, [*header, "time ratio (smol.bpe / tokenizers)"], rows)


if __name__ == "__main__":
    main()
