"""Tokens/s of greedy decoding with the real SmolLM2-135M-Instruct on this machine's CPU
(or GPU):
smol with its KV cache, smol rerunning the whole sequence each step, and
transformers' generate
(with its cache) on the same weights. Runs alternate, so that a busy machine slows
all alike.

    python bench/generate.py [--new-tokens 200] [--runs 3] [--threads N] [--device
    cpu] [--skip-no-cache]
        [--csv bench/results/generate.csv]
"""

from __future__ import annotations

import argparse
import csv
import statistics
import time

import torch

from smol.generate import generate
from smol.gguf import bundled_gguf_path
from smol.pretrained import load_pretrained

PROMPT = "Once upon a time, in a small village by the sea, there lived"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--new-tokens", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads (default: torch's choice; use 1 on a busy machine)",
    )
    parser.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu"
    )
    parser.add_argument(
        "--skip-no-cache",
        action="store_true",
        help="leave out the slow no-cache loop, to spend the runs on cached smol vs transformers",
    )
    parser.add_argument(
        "--csv",
        help="also write the medians to this CSV file (the book's Benchmarks page reads it)",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM

    model, tokenizer = load_pretrained(device=args.device)
    path = bundled_gguf_path()
    ref = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )
    ref = ref.to(args.device).eval()
    # always generate exactly new_tokens tokens
    ref.generation_config.eos_token_id = None
    ids = torch.tensor([tokenizer.encode(PROMPT)], device=args.device)
    n = args.new_tokens

    def sync():
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    runners = {  # each generates k tokens greedily after the same prompt
        "smol, KV cache": lambda k: generate(model, ids, k, temperature=0),
        "smol, no cache": lambda k: generate(
            model, ids, k, temperature=0, use_cache=False
        ),
        "transformers generate": lambda k: ref.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=k,
            do_sample=False,
            pad_token_id=tokenizer.eos_token_id,
        ),
    }
    if args.skip_no_cache:
        del runners["smol, no cache"]
    for run in runners.values():  # warm-up
        run(8)
    rates, outputs = {name: [] for name in runners}, {}
    for _ in range(args.runs):
        for name, run in runners.items():
            sync()
            start = time.perf_counter()
            outputs[name] = run(n)
            sync()
            rates[name].append(n / (time.perf_counter() - start))
    print(
        f"device {args.device}, torch threads {torch.get_num_threads()}, prompt "
        f"{ids.shape[1]} tokens, "
        f"{n} new tokens, greedy, median of {args.runs} alternating runs"
    )
    medians = {name: statistics.median(r) for name, r in rates.items()}
    for name, r in rates.items():
        print(
            f"  {name:24s} {medians[name]:8.1f} tokens/s   (runs: "
            f"{', '.join(f'{x:.1f}' for x in r)})"
        )
    cached = medians["smol, KV cache"]
    print(
        "  smol cached / transformers: "
        f"{cached / medians['transformers generate']:.2f}x (goal >= 1)"
    )
    if "smol, no cache" in medians:
        print(
            f"  smol cached / no cache:     {cached / medians['smol, no cache']:.2f}x "
            "(goal >= 4)"
        )
    same = all(
        torch.equal(o.cpu(), outputs["smol, KV cache"].cpu()) for o in outputs.values()
    )
    print(f"  all produced the same {n} tokens: {same}")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            csv.writer(f).writerows(
                [["implementation", "tokens/s", "relative to smol with the KV cache"]]
                + [
                    [name, f"{r:.1f}", f"{r / cached:.2f}"]
                    for name, r in medians.items()
                ]
            )


if __name__ == "__main__":
    main()
