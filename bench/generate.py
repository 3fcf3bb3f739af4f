"""Tokens/s of greedy decoding with the real SmolLM2-135M-Instruct, every path side by
side with transformers' generate on the same weights. Runs alternate (one run of every
path, then the next round), so that a busy machine slows all alike; medians are
reported.

Paths at batch 1: smol float32 (KV cache; and without the cache), bfloat16, int8 weights
(with float32 and bfloat16 activations), the compiled step with a static cache
(--compile), prompt-lookup speculative decoding (on the story prompt and on a
summarising prompt, which repeats its input); transformers' generate in float32 and
bfloat16. Then batches of 1, 4 and 16 left-padded prompts. Each path's tokens are
compared with smol's float32 greedy tokens.

    python bench/generate.py [--new-tokens 200] [--runs 3] [--threads N] [--device cpu]
        [--compile] [--preset tiny] [--csv bench/results/generate.csv]
"""

from __future__ import annotations

import argparse
import copy
import csv
import statistics
import sys
import time

import torch

from smol.generate import generate
from smol.kv_cache import KVCache
from smol.quantize import quantize_int8_
from smol.speculative import SpeculativeStats, speculative_greedy

PROMPT = "Once upon a time, in a small village by the sea, there lived"
SUMMARY = (
    "Summarise the report in two sentences.\n\nReport: The city council met on "
    "Monday to discuss the new park on the east side of the river. The new park will "
    "have a playground, a pond, a small cafe and a path for bicycles. The council said "
    "that the new park will open in the spring, that the playground and the pond will "
    "be ready first, and that the "
    "cafe will open in the summer. The cost of the new park is two million pounds.\n\n"
    "Summary: The city council met on Monday to discuss the new park"
)
BATCH_PROMPTS = [
    PROMPT,
    "The capital of France is",
    "def fibonacci(n):\n",
    "Water boils at",
    "The three primary colors are red,",
    "In the morning the farmer",
    "Photosynthesis is the process by which",
    "My favourite book is",
]


def load(args):
    """(smol model, tokenizer or None, transformers model): float32, same weights."""
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    if args.preset == "smollm2-135m":
        from smol.gguf import bundled_gguf_path
        from smol.pretrained import load_pretrained

        model, tokenizer = load_pretrained(device=args.device)
        path = bundled_gguf_path()
        ref = AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32
        )
        return model, tokenizer, ref.to(args.device).eval()
    from smol import SmolConfig, SmolLM

    config = SmolConfig.preset(args.preset)
    torch.manual_seed(0)
    model = SmolLM(config).to(args.device).eval()
    hf = {
        k: v
        for k, v in config.to_hf_dict().items()
        if k not in ("architectures", "torch_dtype")
    }
    ref = LlamaForCausalLM(LlamaConfig(**hf)).to(args.device).eval()
    ref.load_state_dict(model.state_dict(), strict=False)
    ref.tie_weights()
    return model, None, ref


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
        help="torch threads (default: torch's choice)",
    )
    parser.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu"
    )
    parser.add_argument(
        "--preset",
        default="smollm2-135m",
        help="smollm2-135m: the real weights; tiny: random weights, a quick check",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="add the compiled paths (torch.compile; CUDA graphs on a GPU)",
    )
    parser.add_argument(
        "--no-cache-path",
        action="store_true",
        help="add smol without its KV cache (slow)",
    )
    parser.add_argument(
        "--batches", default="1,4,16", help="batch sizes of the batched part"
    )
    parser.add_argument(
        "--batch-tokens",
        type=int,
        default=None,
        help="new tokens per row in the batched part (default: --new-tokens)",
    )
    parser.add_argument(
        "--only",
        default=None,
        help="semicolon-separated parts of path names to keep (transformers float32 and "
        "smol float32 are always kept)",
    )
    parser.add_argument(
        "--csv", help="write the medians here (the Benchmarks page reads it)"
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = args.device.startswith("cuda")
    model, tokenizer, ref = load(args)
    vocab = model.config.vocab_size

    def encode(text):
        if tokenizer is None:  # random weights: token ids from the text's bytes
            return [b % vocab for b in text.encode()][:48]
        return tokenizer.encode(text)

    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    int8 = quantize_int8_(copy.deepcopy(model))
    int8_bf16 = quantize_int8_(copy.deepcopy(model).to(torch.bfloat16))
    ref_bf16 = copy.deepcopy(ref).to(torch.bfloat16)
    for m in (ref, ref_bf16):
        m.generation_config.eos_token_id = None  # always exactly n tokens
    ids = torch.tensor([encode(PROMPT)], device=args.device)
    summary = torch.tensor([encode(SUMMARY)], device=args.device)
    n = args.new_tokens
    spec_stats = {}

    def hf(m, x):
        return lambda k: m.generate(
            x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=k,
            do_sample=False,
            pad_token_id=0,
        )

    def spec(m, x, name):
        def run(k):
            stats = spec_stats.setdefault(name, SpeculativeStats())
            cache = KVCache(
                m.config,
                1,
                x.shape[1] + k + 8,
                device=args.device,
                dtype=m.model.embed_tokens.weight.dtype,
            )
            return speculative_greedy(m, x, k, cache, num_draft=8, stats=stats)

        return run

    # name -> (dtype label, prompt label, a function generating k tokens)
    paths = {
        "transformers generate": ("float32", "story", hf(ref, ids)),
        "transformers generate, bf16": ("bfloat16", "story", hf(ref_bf16, ids)),
        "smol, KV cache": (
            "float32",
            "story",
            lambda k: generate(model, ids, k, temperature=0),
        ),
        "smol, bf16": (
            "bfloat16",
            "story",
            lambda k: generate(bf16, ids, k, temperature=0),
        ),
        "smol, int8 weights": (
            "int8 / float32",
            "story",
            lambda k: generate(int8, ids, k, temperature=0),
        ),
        "smol, int8 weights, bf16": (
            "int8 / bfloat16",
            "story",
            lambda k: generate(int8_bf16, ids, k, temperature=0),
        ),
        "smol, speculative": (
            "float32",
            "story",
            spec(model, ids, "smol, speculative"),
        ),
        "smol, speculative, bf16": (
            "bfloat16",
            "story",
            spec(bf16, ids, "smol, speculative, bf16"),
        ),
        "transformers generate (summary)": ("float32", "summary", hf(ref, summary)),
        "smol, KV cache (summary)": (
            "float32",
            "summary",
            lambda k: generate(model, summary, k, temperature=0),
        ),
        "smol, speculative (summary)": (
            "float32",
            "summary",
            spec(model, summary, "smol, speculative (summary)"),
        ),
        "smol, speculative, bf16 (summary)": (
            "bfloat16",
            "summary",
            spec(bf16, summary, "smol, speculative, bf16 (summary)"),
        ),
    }
    if args.no_cache_path:
        paths["smol, no cache"] = (
            "float32",
            "story",
            lambda k: generate(model, ids, k, temperature=0, use_cache=False),
        )
    if args.compile:
        mode = "reduce-overhead" if cuda else None
        for name, m, dtype in [
            ("smol, compiled", model, "float32"),
            ("smol, compiled, bf16", bf16, "bfloat16"),
            ("smol, compiled, int8 weights, bf16", int8_bf16, "int8 / bfloat16"),
        ]:
            paths[name] = (
                dtype,
                "story",
                lambda k, m=m: generate(
                    m, ids, k, temperature=0, compile=True, compile_mode=mode
                ),
            )

    if args.only:
        keep = args.only.split(";") + ["transformers generate", "smol, KV cache"]
        paths = {k: v for k, v in paths.items() if any(part in k for part in keep)}

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def timed(run, k):
        sync()
        start = time.perf_counter()
        out = run(k)
        sync()
        return out, time.perf_counter() - start

    print(
        f"device {args.device}, {args.preset}, "
        f"torch threads {torch.get_num_threads()}, "
        f"{n} new tokens, greedy, median of {args.runs} alternating runs",
        flush=True,
    )
    for name, (_, _, run) in paths.items():  # warm-up (and compilation)
        _, seconds = timed(run, 8)
        print(f"  warm-up {name}: {seconds:.1f} s", flush=True)
    spec_stats.clear()
    rates, outputs = {name: [] for name in paths}, {}
    for r in range(args.runs):
        for name, (_, _, run) in paths.items():
            outputs[name], seconds = timed(run, n)
            rates[name].append(n / seconds)
        print(
            f"  round {r + 1}: "
            + ", ".join(f"{k} {v[-1]:.1f}" for k, v in rates.items()),
            flush=True,
        )
    base = statistics.median(rates["transformers generate"])
    base_summary = statistics.median(rates.get("transformers generate (summary)", [0]))
    reference = {
        "story": outputs["smol, KV cache"],
        "summary": outputs["smol, KV cache (summary)"],
    }
    rows = []
    print(
        f"\n{'path':40s} {'dtype':16s} {'tokens/s':>9s} "
        f"{'vs transformers':>16s}  same tokens"
    )
    for name, (dtype, prompt, _) in paths.items():
        rate = statistics.median(rates[name])
        ratio = rate / (base if prompt == "story" else base_summary)
        same = reference[prompt] is not None and torch.equal(
            outputs[name].cpu(), reference[prompt].cpu()
        )
        stats = spec_stats.get(name)
        note = f"acceptance {stats.acceptance_rate:.0%}" if stats else ""
        print(
            f"{name:40s} {dtype:16s} {rate:9.1f} {ratio:15.2f}x  {same}  {note}",
            flush=True,
        )
        rows.append(
            [
                name,
                dtype,
                1,
                prompt,
                f"{rate:.1f}",
                f"{ratio:.2f}",
                "yes" if same else "no",
                note,
            ]
        )

    batch_rates = (
        batched(args, model, encode, args.batch_tokens or n) if args.batches else {}
    )
    for size, rate in batch_rates.items():
        ratio = rate / batch_rates[1]
        print(
            f"smol, batch {size:<3d} float32: {rate:9.1f} tokens/s, "
            f"{ratio:.2f}x batch 1",
            flush=True,
        )
        rows.append(
            [
                f"smol, batch {size}",
                "float32",
                size,
                "mixed, left-padded",
                f"{rate:.1f}",
                f"{rate / base:.2f}",
                "",
                f"{ratio:.2f}x batch 1",
            ]
        )
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            csv.writer(f).writerows(
                [
                    [
                        "path",
                        "weights / activations",
                        "batch",
                        "prompt",
                        "tokens/s",
                        "vs transformers float32",
                        "same tokens as float32",
                        "note",
                    ]
                ]
                + rows
            )
        print("wrote", args.csv)


def batched(args, model, encode, n) -> dict[int, float]:
    """Tokens/s (all rows together) of float32 greedy decoding, left-padded batches."""
    rates = {}
    sizes = [int(b) for b in args.batches.split(",")]
    for size in sizes:
        seqs = [encode(BATCH_PROMPTS[i % len(BATCH_PROMPTS)]) for i in range(size)]
        width = max(len(s) for s in seqs)
        ids = torch.zeros(size, width, dtype=torch.long, device=args.device)
        mask = torch.zeros(size, width, dtype=torch.long, device=args.device)
        for i, s in enumerate(seqs):
            ids[i, width - len(s) :] = torch.tensor(s)
            mask[i, width - len(s) :] = 1
        generate(model, ids, 4, temperature=0, attention_mask=mask)  # warm-up
        times = []
        for _ in range(args.runs):
            start = time.perf_counter()
            generate(model, ids, n, temperature=0, attention_mask=mask)
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        rates[size] = size * n / statistics.median(times)
    return rates


if __name__ == "__main__":
    sys.exit(main())
