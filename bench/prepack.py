"""Float32 products with weights reordered once (smol.prepack) against F.linear, which
reorders them on every call: each of SmolLM2-135M's weight shapes at 1, 9 and 25 rows
(a decode step; speculative checks of 8 and 24 drafts), and the whole model's forward
over as many new tokens after a 100-token cache. Also how far the prepacked model's
logits lie from the model's, and whether greedy decoding picks the same tokens.

    python bench/prepack.py [--threads 2] [--repeats 30]
        [--csv bench/results/prepack.csv]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from common import alternate, write_csv
from generate import PROMPT, SUMMARY

from smol.generate import generate
from smol.kv_cache import KVCache
from smol.prepack import PackedLinear, prepack
from smol.pretrained import load_pretrained

ROWS = (1, 9, 25)


def products(model, repeats: int) -> list[list]:
    """Median microseconds of each distinct weight shape, plain and prepacked."""
    layer = model.model.layers[0]
    weights = {
        "q_proj": layer.self_attn.q_proj.weight,
        "k_proj": layer.self_attn.k_proj.weight,
        "o_proj": layer.self_attn.o_proj.weight,
        "gate_proj": layer.mlp.gate_proj.weight,
        "down_proj": layer.mlp.down_proj.weight,
        "lm_head": model.lm_head.weight,
    }
    rows = []
    for name, w in weights.items():
        packed = PackedLinear(w)
        for m in ROWS:
            x = torch.randn(m, w.shape[1])
            runs = {"F.linear": lambda: F.linear(x, w), "prepacked": lambda: packed(x)}
            medians, _ = alternate(runs, repeats)
            shape = f"{name} {w.shape[0]}x{w.shape[1]}, {m} rows"
            for path, seconds in medians.items():
                rows.append(["product median ms", shape, path, f"{seconds * 1e3:.3f}"])
                print(f"  {shape:34s} {path:10s} {seconds * 1e6:8.0f} us")
    return rows


def forwards(model, packed, repeats: int) -> list[list]:
    """Median milliseconds of a forward over m new tokens after 100 cached ones."""
    rows = []
    for m in ROWS:
        caches = {k: KVCache.for_model(model, 1, 100 + m) for k in ("plain", "packed")}
        prefix = torch.randint(0, model.config.vocab_size, (1, 100))
        x = torch.randint(0, model.config.vocab_size, (1, m))

        def step(net, cache):
            cache.length = 100
            return net(x, kv_cache=cache)[0]

        with torch.inference_mode():
            model(prefix, kv_cache=caches["plain"])
            packed(prefix, kv_cache=caches["packed"])
            runs = {
                "model": lambda: step(model, caches["plain"]),
                "prepacked": lambda: step(packed, caches["packed"]),
            }
            medians, _ = alternate(runs, repeats)
        for path, seconds in medians.items():
            label = f"forward, {m} new tokens after 100"
            rows.append(["forward median ms", label, path, f"{seconds * 1e3:.1f}"])
            print(f"  {label:34s} {path:10s} {seconds * 1e3:8.1f} ms")
    return rows


def agreement(model, packed, tokenizer) -> list[list]:
    """Largest logit difference (absolute, and relative to the largest |logit|) over
    both prompts, and whether 200 greedy tokens agree."""
    rows = []
    for name, text in (("story", PROMPT), ("summary", SUMMARY)):
        ids = torch.tensor([tokenizer.encode(text)])
        with torch.inference_mode():
            a, b = model(ids)[0], packed(ids)[0]
        diff = (a - b).abs().max().item()
        ppm = diff / a.abs().max().item() * 1e6
        same = torch.equal(
            generate(model, ids, 200, temperature=0),
            generate(packed, ids, 200, temperature=0),
        )
        rows += [
            ["logits max abs difference", name, "prepacked", f"{diff:.2e}"],
            [
                "logits max difference, millionths of max |logit|",
                name,
                "prepacked",
                f"{ppm:.1f}",
            ],
            ["same 200 greedy tokens", name, "prepacked", "yes" if same else "no"],
        ]
        print(f"  {name}: max |diff| {diff:.2e} ({ppm:.1f} millionths), same: {same}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--csv", default="bench/results/prepack.csv")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model, tokenizer = load_pretrained()
    model.eval()
    packed = prepack(model)
    print(f"products, median of {args.repeats}, {args.threads} threads:")
    rows = products(model, args.repeats)
    print(f"forward passes, median of {args.repeats}:")
    rows += forwards(model, packed, args.repeats)
    print("agreement with the model:")
    rows += agreement(model, packed, tokenizer)
    write_csv(args.csv, ["measure", "what", "path", "value"], rows)


if __name__ == "__main__":
    main()
