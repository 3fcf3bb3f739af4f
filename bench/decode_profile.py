"""Where a decoding step's time goes once the weights are 4 bits: smol's int4 paths (the
GGUF file's own Q4_1 codes through PyTorch's CPU int4 kernel; eager, fused, compiled
with a static cache) beside llama.cpp on the same file and threads.

For each smol path: the wall time a token (greedy, no profiler); then, under
torch.profiler, the time a token of the int4 products, of the head's product (the tied
bfloat16 embedding, 49152 x 576) and of attention; the rest (wall time minus those) is
the small operators, the dispatcher and Python. Each path's floor is the bytes it
reads a token over the machine's read bandwidth. Then each int4 product alone at batch
1, by its weight's shape (out x in): its median time and the bytes a second it reads.
llama.cpp (`make llama-cpp`) is left out where llama-cpp-python is not installed.

    python bench/decode_profile.py [--threads 2] [--new-tokens 200]
        [--csv bench/results/decode_profile.csv]
"""

from __future__ import annotations

import functools
import statistics
import time

import torch
from common import alternate, parse_and_set_threads, threads_parser, write_csv
from generate import PROMPT
from llama_child import LlamaCppCrashed, llama_cpp
from torch.profiler import ProfilerActivity, profile

from smol.generate import generate
from smol.gguf import GGUFFile, bundled_gguf_path
from smol.int4 import Int4Linear, load_int4
from smol.pretrained import load_pretrained

PARTS = {  # part -> profiler events (a parent's total includes its children's)
    "int4 products": ["aten::_weight_int4pack_mm_for_cpu"],
    "head product": ["aten::mm"],
    "attention": [
        "aten::scaled_dot_product_attention",
        "aten::_scaled_dot_product_flash_attention_for_cpu",
    ],
}


def read_bandwidth(mib: int = 256, repeats: int = 10) -> float:
    """Bytes a second that summing a tensor far larger than the caches reads."""
    x = torch.ones(mib * 2**20 // 4)
    x.sum()
    start = time.perf_counter()
    for _ in range(repeats):
        x.sum()
    return x.numel() * 4 * repeats / (time.perf_counter() - start)


def int4_bytes(model) -> int:
    """Bytes a token reads: the int4 codes with their scales and zeros, the norms and
    the tied bfloat16 head (the embedding reads one row)."""
    codes = sum(
        m.weight.nbytes + m.scales_and_zeros.nbytes
        for m in model.modules()
        if isinstance(m, Int4Linear)
    )
    head = model.lm_head.weight.nbytes
    norms = sum(p.nbytes for n, p in model.named_parameters() if "norm" in n)
    return codes + head + norms


def ms_per_token(run, n: int, runs: int) -> float:
    run(8)  # warm-up (and compilation)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        run(n)
        times.append((time.perf_counter() - start) / n * 1e3)
    return statistics.median(times)


def profiled_parts(run, n: int) -> dict[str, float]:
    """ms a token of each part of PARTS, under the profiler."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run(n)
    totals = {e.key: e.cpu_time_total / 1e3 for e in prof.key_averages()}
    return {
        part: max(totals.get(name, 0.0) for name in names) / n
        for part, names in PARTS.items()
    }


def main() -> None:
    parser = threads_parser(__doc__)
    parser.add_argument("--new-tokens", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--csv", help="write the rows here")
    args = parse_and_set_threads(parser)
    n = args.new_tokens
    _, tokenizer = load_pretrained()
    ids = torch.tensor([tokenizer.encode(PROMPT)])
    bandwidth = read_bandwidth()
    rows = [["read bandwidth", "this machine", f"{bandwidth / 1e9:.1f}", "GB/s"]]
    print(f"read bandwidth {bandwidth / 1e9:.1f} GB/s, {args.threads} threads")

    model = load_int4(dtype=torch.bfloat16)[0]
    fused = load_int4(dtype=torch.bfloat16, fused=True)[0]
    paths = {
        "smol, int4, eager": lambda k: generate(model, ids, k, temperature=0),
        "smol, int4 fused, eager": lambda k: generate(fused, ids, k, temperature=0),
        "smol, int4, compiled": lambda k: generate(
            model, ids, k, temperature=0, compile=True
        ),
    }
    per_token = int4_bytes(model)
    with torch.inference_mode():
        for name, run in paths.items():
            wall = ms_per_token(run, n, args.runs)
            parts = profiled_parts(run, min(n, 50))
            parts["the rest"] = wall - sum(parts.values())
            floor = per_token / bandwidth * 1e3
            print(
                f"{name:24s} {wall:5.1f} ms a token (floor {floor:4.1f}): "
                + ", ".join(f"{k} {v:4.1f}" for k, v in parts.items())
            )
            rows.append(["ms a token", name, f"{wall:.1f}", "ms"])
            for part, ms in parts.items():
                rows.append([f"ms a token: {part}", name, f"{ms:.1f}", "ms"])
            rows.append(["MB read a token", name, f"{per_token / 1e6:.0f}", "MB"])
            rows.append(["floor: MB / bandwidth", name, f"{floor:.1f}", "ms"])
        try:
            run = llama_cpp(bundled_gguf_path(), ids, args.threads)
        except LlamaCppCrashed as crash:
            run, why = None, f"{crash}: no llama.cpp row"
        else:
            why = "llama-cpp-python is not installed: no llama.cpp row"
        if run is None:
            print(why)
        else:
            wall = ms_per_token(run, n, args.runs)
            file = GGUFFile(bundled_gguf_path())
            # every tensor once a token (the Q8_0 embedding as the tied head)
            q4_1 = sum(raw.nbytes for *_, raw in file.tensors.values())
            floor = q4_1 / bandwidth * 1e3
            print(f"{'llama.cpp':24s} {wall:5.1f} ms a token (floor {floor:4.1f})")
            rows.append(["ms a token", "llama.cpp", f"{wall:.1f}", "ms"])
            rows.append(["MB read a token", "llama.cpp", f"{q4_1 / 1e6:.0f}", "MB"])
            rows.append(["floor: MB / bandwidth", "llama.cpp", f"{floor:.1f}", "ms"])

        layer = model.model.layers[0]
        shapes = {
            "q_proj, 576 x 576": layer.self_attn.q_proj,
            "k_proj, 192 x 576": layer.self_attn.k_proj,
            "gate_proj, 1536 x 576": layer.mlp.gate_proj,
            "down_proj, 576 x 1536": layer.mlp.down_proj,
            "fused q/k/v, 960 x 576": fused.model.layers[0].self_attn.qkv_proj,
            "fused gate/up, 3072 x 576": fused.model.layers[0].mlp.gate_up_proj,
        }
        # each product alone at batch 1, the shapes in turn (median of 300 each)
        runs = {
            name: functools.partial(
                module, torch.randn(1, module.in_features, dtype=torch.bfloat16)
            )
            for name, module in shapes.items()
        }
        medians, _ = alternate(runs, 300)
        for name, module in shapes.items():
            seconds = medians[name]
            read = module.weight.nbytes + module.scales_and_zeros.nbytes
            print(
                f"int4 product alone, {name:26s} {seconds * 1e6:6.1f} us, "
                f"{read / seconds / 1e9:5.1f} GB/s"
            )
            rows.append(["int4 product alone", name, f"{seconds * 1e6:.1f}", "us"])
            rows.append(
                [
                    "int4 product alone: read",
                    name,
                    f"{read / seconds / 1e9:.1f}",
                    "GB/s",
                ]
            )
    if args.csv:
        write_csv(args.csv, ["measure", "path", "value", "unit"], rows)


if __name__ == "__main__":
    main()
