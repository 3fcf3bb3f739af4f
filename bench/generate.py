"""Tokens/s of greedy decoding with the real SmolLM2-135M-Instruct, every path side by
side with transformers' generate on the same weights. Runs alternate (one run of every
path, then the next round), so that a busy machine slows all alike; medians are
reported.

Paths at batch 1: smol float32 (KV cache; and without the cache), bfloat16, int8 weights
(with float32 and bfloat16 activations), the GGUF file's own Q4_1 codes through
PyTorch's int4 kernel (CPU, bfloat16), the compiled step with a static cache
(--compile: float32, bfloat16, int8 and on a CPU the int4 codes; it also adds
transformers' generate with its static cache and compiled forward, its fastest
configuration), speculative decoding with prompt-lookup drafts and
with drafts of the bfloat16 copy, or of the int4 codes (CPU), verified in float32 (on
the story prompt and on a summarising prompt, which repeats its input; int4 drafts also
checked by the float32 weights reordered once, smol.prepack); transformers'
generate in float32 and bfloat16; llama.cpp (llama-cpp-python, where installed: `make
llama-cpp`) on the same GGUF file with the same prompt tokens and thread count, greedy.
Then batches of 1, 4 and 16 left-padded prompts. Each path's tokens are compared with
smol's float32 greedy tokens.

    python bench/generate.py [--new-tokens 200] [--runs 3] [--threads N] [--device cpu]
        [--compile] [--preset tiny] [--csv bench/results/generate.csv]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time

import torch
from common import write_csv
from llama_child import LlamaCppCrashed, llama_cpp

from smol.generate import generate, left_pad
from smol.kv_cache import KVCache
from smol.prepack import available as prepack_available
from smol.prepack import prepack
from smol.quantize import quantize_int8_
from smol.speculative import NEAR_TIE, SpeculativeStats, speculative_greedy

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


def parse_args():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--new-tokens", type=int, default=200)
    add("--runs", type=int, default=3)
    add("--threads", type=int, default=None, help="torch threads (default: torch's)")
    add("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    add(
        "--preset",
        default="smollm2-135m",
        help="smollm2-135m: the real weights; tiny: random weights, a quick check",
    )
    add(
        "--compile",
        action="store_true",
        help="add the compiled paths (torch.compile; CUDA graphs on a GPU)",
    )
    add("--no-cache-path", action="store_true", help="add smol without its KV cache")
    add(
        "--no-llama-cpp",
        action="store_true",
        help="leave out llama.cpp (it runs where llama-cpp-python is installed)",
    )
    add("--batches", default="1,4,16", help="batch sizes of the batched part")
    add(
        "--batch-tokens",
        type=int,
        default=None,
        help="new tokens per row in the batched part (default: --new-tokens)",
    )
    add(
        "--only",
        default=None,
        help="semicolon-separated parts of path names to keep (transformers float32 "
        "and smol float32 are always kept)",
    )
    add("--csv", help="write the medians here (the Benchmarks page reads it)")
    return parser.parse_args()


def build_paths(args, model, ref, ids, summary, spec_stats) -> dict:
    """name -> (dtype label, prompt label, a function generating k tokens)."""
    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    int8 = quantize_int8_(copy.deepcopy(model))
    int8_bf16 = quantize_int8_(copy.deepcopy(model).to(torch.bfloat16))
    ref_bf16 = copy.deepcopy(ref).to(torch.bfloat16)
    cuda = args.device.startswith("cuda")
    for m in (ref, ref_bf16):
        m.generation_config.eos_token_id = None  # always exactly n tokens

    def hf(m, x):
        mask, kw = torch.ones_like(x), {"do_sample": False, "pad_token_id": 0}
        return lambda k: m.generate(x, attention_mask=mask, max_new_tokens=k, **kw)

    def hf_compiled(m, x):
        """generate with a static cache and its forward compiled: transformers' fastest
        configuration (on a CPU it compiles only when the config says so)."""
        from transformers import CompileConfig

        config = CompileConfig(mode="reduce-overhead" if cuda else "default")
        config._compile_all_devices = True
        mask = torch.ones_like(x)
        kw = {"do_sample": False, "pad_token_id": 0, "cache_implementation": "static"}
        return lambda k: m.generate(
            x, attention_mask=mask, max_new_tokens=k, compile_config=config, **kw
        )

    def smol(m, x, **kw):
        return lambda k: generate(m, x, k, temperature=0, **kw)

    def spec(m, x, name, draft_model=None, num_draft=8, margin=NEAR_TIE):
        def run(k):
            stats = spec_stats.setdefault(name, SpeculativeStats())
            cache = KVCache.for_model(m, 1, x.shape[1] + k + num_draft)
            return speculative_greedy(
                m,
                x,
                k,
                cache,
                num_draft=num_draft,
                draft_model=draft_model,
                draft_stop_margin=margin,
                stats=stats,
            )

        return run

    table = [
        ("transformers generate", "float32", "story", hf(ref, ids)),
        ("transformers generate, bf16", "bfloat16", "story", hf(ref_bf16, ids)),
        ("smol, KV cache", "float32", "story", smol(model, ids)),
        ("smol, bf16", "bfloat16", "story", smol(bf16, ids)),
        ("smol, int8 weights", "int8 / float32", "story", smol(int8, ids)),
        ("smol, int8 weights, bf16", "int8 / bfloat16", "story", smol(int8_bf16, ids)),
        ("smol, speculative", "float32", "story", None),
        ("smol, speculative, bf16", "bfloat16", "story", None),
        ("smol, speculative, bf16 draft", "float32", "story", "draft"),
        ("transformers generate (summary)", "float32", "summary", hf(ref, summary)),
        ("smol, KV cache (summary)", "float32", "summary", smol(model, summary)),
        ("smol, speculative (summary)", "float32", "summary", None),
        ("smol, speculative, bf16 (summary)", "bfloat16", "summary", None),
        (
            "smol, speculative, bf16 draft (summary)",
            "float32",
            "summary",
            "draft",
        ),
    ]
    if args.preset == "smollm2-135m" and args.device == "cpu":
        from smol.int4 import load_int4  # the file's Q4_1 codes; CPU only

        # the inference-only copy: q/k/v and gate/up fused, the same logits
        int4 = load_int4(dtype=torch.bfloat16, fused=True)[0]
        run = smol(int4, ids)
        name = "smol, int4 (Q4_1 codes, fused), bf16"
        table.insert(6, (name, "int4 / bfloat16", "story", run))
        # float32's tokens, drafted by the file's own 4-bit codes
        # and checked by float32 weights that oneDNN reordered once (smol.prepack)
        packed = prepack(model) if prepack_available() else None
        if packed is not None:
            name = "smol, KV cache, prepacked"
            table.insert(3, (name, "float32", "story", smol(packed, ids)))
        for name, x, prompt in [
            ("smol, speculative, int4 draft", ids, "story"),
            ("smol, speculative, int4 draft (summary)", summary, "summary"),
        ]:
            for verifier, suffix in [(model, ""), (packed, ", prepacked")]:
                if verifier is None:
                    continue
                label = name + suffix
                run = spec(verifier, x, label, draft_model=int4, num_draft=16)
                table.append((label, "float32", prompt, run))
                # drafts that stop at exact ties only (of bfloat16 logits above 16)
                label += ", ties 1/16, 24"
                run = spec(verifier, x, label, int4, num_draft=24, margin=1 / 16)
                table.append((label, "float32", prompt, run))
    if args.preset == "smollm2-135m" and not args.no_llama_cpp:
        from smol.gguf import bundled_gguf_path

        try:
            run = llama_cpp(bundled_gguf_path(), ids, torch.get_num_threads())
            if run is None:
                print("llama-cpp-python is not installed: no llama.cpp path")
            else:
                table.append(("llama.cpp", "Q4_1 / Q8_1", "story", run))
        except LlamaCppCrashed as crash:
            print(f"{crash}: no llama.cpp path", flush=True)
    if args.no_cache_path:
        table.append(
            ("smol, no cache", "float32", "story", smol(model, ids, use_cache=False))
        )
    if args.compile:
        mode = "reduce-overhead" if cuda else None
        for name, m, dtype in [
            ("transformers generate, static cache, compiled", ref, "float32"),
            (
                "transformers generate, static cache, compiled, bf16",
                ref_bf16,
                "bfloat16",
            ),
        ]:
            table.append((name, dtype, "story", hf_compiled(m, ids)))
        compiled = [
            ("smol, compiled", model, "float32"),
            ("smol, compiled, bf16", bf16, "bfloat16"),
            ("smol, compiled, int8 weights, bf16", int8_bf16, "int8 / bfloat16"),
        ]
        if args.preset == "smollm2-135m" and args.device == "cpu":
            from smol.int4 import load_int4

            # the static cache runs the course's layers: the unfused int4 model
            int4_layers = load_int4(dtype=torch.bfloat16)[0]
            name = "smol, compiled, int4 (Q4_1 codes), bf16"
            compiled.append((name, int4_layers, "int4 / bfloat16"))
        for name, m, dtype in compiled:
            run = smol(m, ids, compile=True, compile_mode=mode)
            table.append((name, dtype, "story", run))
    paths = {}
    for name, dtype, prompt, run in table:
        x = ids if prompt == "story" else summary
        if run is None:  # prompt lookup: the weights by dtype, the prompt by label
            run = spec(bf16 if dtype == "bfloat16" else model, x, name)
        elif run == "draft":  # float32's tokens, drafted by the bfloat16 copy
            run = spec(model, x, name, draft_model=bf16, num_draft=16)
        paths[name] = (dtype, prompt, run)
    if args.only:
        keep = args.only.split(";") + ["transformers generate", "smol, KV cache"]
        paths = {k: v for k, v in paths.items() if any(part in k for part in keep)}
    return paths


def measure(paths: dict, n: int, runs: int, sync, after_warm_up):
    """Tokens/s of every path (each round runs each path once) and its last output.
    Every path runs under torch.inference_mode, each peer's fastest way to skip
    autograd (no_grad still tracks views and in-place writes)."""
    with torch.inference_mode():
        return _measure(paths, n, runs, sync, after_warm_up)


def _measure(paths: dict, n: int, runs: int, sync, after_warm_up):
    for name, (_, _, run) in paths.items():  # warm-up (and compilation)
        sync()
        start = time.perf_counter()
        # transformers' static cache is as long as the prompt and the new tokens, and
        # its compiled forward is traced again for each length: warm up at n
        run(n if "static cache" in name else 8)
        sync()
        print(f"  warm-up {name}: {time.perf_counter() - start:.1f} s", flush=True)
    after_warm_up()
    rates, outputs = {name: [] for name in paths}, {}
    for r in range(runs):
        for name, (_, _, run) in paths.items():
            sync()
            start = time.perf_counter()
            outputs[name] = run(n)
            sync()
            rates[name].append(n / (time.perf_counter() - start))
        print(
            f"  round {r + 1}: "
            + ", ".join(f"{k} {v[-1]:.1f}" for k, v in rates.items()),
            flush=True,
        )
    return {k: statistics.median(v) for k, v in rates.items()}, outputs


def report(paths, rates, outputs, spec_stats) -> list[list]:
    """Print every path's median tokens/s, its ratio to transformers' float32 generate
    on the same prompt, to transformers' fastest path on that prompt (its best) and to
    llama.cpp's on the story (where it ran), and whether its tokens equal smol's
    float32 tokens; return them as the CSV's rows (a path on the summary prompt says
    so in its name, so the rows leave the prompt out: the table fits the book's
    column)."""
    base = {
        "story": rates["transformers generate"],
        "summary": rates.get("transformers generate (summary)"),
    }
    best = {
        prompt: max(
            rates[name]
            for name, (_, p, _) in paths.items()
            if p == prompt and name.startswith("transformers")
        )
        for prompt in ("story", "summary")
        if base[prompt] is not None
    }
    reference = {
        "story": outputs["smol, KV cache"],
        "summary": outputs.get("smol, KV cache (summary)"),
    }
    print(
        f"\n{'path':52s} {'dtype':16s} {'tokens/s':>9s} {'vs transformers':>16s}  same"
    )
    rows = []
    for name, (dtype, prompt, _) in paths.items():
        ratio = rates[name] / base[prompt]
        same = torch.equal(outputs[name].cpu(), reference[prompt].cpu())
        stats = spec_stats.get(name)
        note = f"{stats.acceptance_rate:.0%} kept" if stats else ""  # of drafts
        vs = ""
        if "llama.cpp" in rates and prompt == "story":
            vs = f"{rates[name] / rates['llama.cpp']:.2f}"
        print(
            f"{name:52s} {dtype:16s} {rates[name]:9.1f} {ratio:15.2f}x  {same}  "
            + (f"{vs}x llama.cpp  " if vs else "")
            + note
        )
        row = [name, dtype, f"{rates[name]:.1f}", f"{ratio:.2f}"]
        at_best = f"{rates[name] / best[prompt]:.2f}"
        rows.append([*row, at_best, "yes" if same else "no", vs, note])
    return rows


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = args.device.startswith("cuda")
    model, tokenizer, ref = load(args)
    vocab = model.config.vocab_size

    def encode(text):
        if tokenizer is None:  # random weights: token ids from the text's bytes
            return [b % vocab for b in text.encode()][:48]
        return tokenizer.encode(text)

    ids = torch.tensor([encode(PROMPT)], device=args.device)
    summary = torch.tensor([encode(SUMMARY)], device=args.device)
    spec_stats = {}
    paths = build_paths(args, model, ref, ids, summary, spec_stats)
    print(
        f"device {args.device}, {args.preset}, "
        f"torch threads {torch.get_num_threads()}, {args.new_tokens} new tokens, "
        f"greedy, median of {args.runs} alternating runs",
        flush=True,
    )
    sync = torch.cuda.synchronize if cuda else lambda: None
    # the speculative paths' acceptance counts the measured runs only
    rates, outputs = measure(paths, args.new_tokens, args.runs, sync, spec_stats.clear)
    rows = report(paths, rates, outputs, spec_stats)
    if args.batches:
        batch = batched(args, model, ref, encode, args.batch_tokens or args.new_tokens)
        first = dict(batch[min(batch)][0])
        for size, (rates_b, same) in batch.items():
            for name, rate in rates_b.items():
                vs = rate / rates_b["transformers generate"]
                ratio = rate / first[name]
                print(
                    f"{name}, batch {size:<3d} float32: {rate:9.1f} tok/s, "
                    f"{vs:.2f}x transformers at this batch, {ratio:.2f}x batch "
                    f"{min(batch)}" + ("" if name != "smol" else f", same: {same}")
                )
                row = [
                    f"{name}, batch {size}",
                    "float32",
                    f"{rate:.1f}",
                    f"{vs:.2f}",
                    "",
                ]
                agree = "" if name != "smol" else "yes" if same else "no"
                rows.append([*row, agree, "", f"{ratio:.2f}x batch {min(batch)}"])
    if args.csv:
        header = ["path", "dtypes", "tokens/s", "vs transformers float32"]
        header += ["vs transformers at its best", "same tokens as float32"]
        header += ["vs llama.cpp"]
        header += ["note"]
        write_csv(args.csv, header, rows)


def batched(args, model, ref, encode, n) -> dict[int, tuple[dict, bool]]:
    """Tokens/s (all rows together) of float32 greedy decoding of left-padded batches
    by smol and by transformers' generate, alternating, and whether their tokens are
    the same: {batch size: ({"smol": rate, "transformers generate": rate}, same)}."""
    results = {}
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else lambda: None
    for size in [int(b) for b in args.batches.split(",")]:
        seqs = [encode(BATCH_PROMPTS[i % len(BATCH_PROMPTS)]) for i in range(size)]
        ids, mask = left_pad(seqs, device=args.device)
        kw = {"do_sample": False, "pad_token_id": 0, "attention_mask": mask}
        runs = {  # (defaults bind this batch's tensors)
            "smol": lambda k, x=ids, m=mask: generate(
                model, x, k, temperature=0, attention_mask=m
            ),
            "transformers generate": lambda k, x=ids, kw=kw: ref.generate(
                x, max_new_tokens=k, **kw
            ),
        }
        with torch.inference_mode():  # as measure()
            rates, same = _batch(runs, args.runs, n, size, sync)
        results[size] = (rates, same)
    return results


def _batch(runs, rounds, n, size, sync):
    """(tokens/s of each path, whether their tokens are the same) at one batch size."""
    for run in runs.values():
        run(4)  # warm-up
    times, outputs = {name: [] for name in runs}, {}
    for _ in range(rounds):
        for name, run in runs.items():
            sync()
            start = time.perf_counter()
            outputs[name] = run(n)
            sync()
            times[name].append(time.perf_counter() - start)
    rates = {name: size * n / statistics.median(t) for name, t in times.items()}
    same = torch.equal(outputs["smol"].cpu(), outputs["transformers generate"].cpu())
    return rates, same


if __name__ == "__main__":
    sys.exit(main())
