"""The bundled GGUF's own Q4_1 codes through PyTorch's CPU int4 kernel (Int4Linear,
load_int4), against the float32 model the file dequantizes to.

Accuracy: how many of the file's float16 scales d and zeros m + 8 d bfloat16 cannot
hold, and what that does to the weights; the logits' largest difference on a few
prompts; greedy tokens on bench/generate.py's two prompts. Speed: the median time of
the two MLP shapes' products (batch 1 and 16) as float32, bfloat16, int8 (QuantLinear)
and int4 (Int4Linear), and whole-model greedy decoding with smol's KV cache.

    python bench/int4.py [--threads 2] [--repeats 300] [--new-tokens 50]
        [--runs 3] [--csv bench/results/int4.csv]
"""

from __future__ import annotations

import copy
import statistics
import time

import torch
import torch.nn.functional as F
from common import alternate, parse_and_set_threads, threads_parser, write_csv
from generate import PROMPT, SUMMARY

from smol.generate import generate
from smol.gguf import GGUFFile, bundled_gguf_path, dequantize, unpermute_qk
from smol.int4 import Int4Linear, load_int4
from smol.pretrained import load_pretrained
from smol.quantize import QuantLinear

LOGIT_PROMPTS = [PROMPT, SUMMARY, "The capital of France is", "def fibonacci(n):\n"]
MODULES = {  # GGUF kind -> smol's module in a layer
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def scale_error(model) -> list[list]:
    """Scales and zeros bfloat16 changes, and each Int4Linear's weight (what the
    kernel multiplies by) against the file's float32 dequantization."""
    file = GGUFFile(bundled_gguf_path())
    heads = {"attn_q": model.config.num_attention_heads}
    heads["attn_k"] = model.config.num_key_value_heads
    modules = dict(model.named_modules())
    changed_d = changed_zero = groups = 0
    worst_rel = worst_group = worst_step = num = den = 0.0
    for name, (qtype, shape, raw) in file.tensors.items():
        if qtype.name != "Q4_1":
            continue
        _, i, kind, _ = name.split(".")  # blk.{i}.{kind}.weight
        layer = modules[f"model.layers.{i}.{MODULES[kind]}"]
        blocks = torch.from_numpy(raw).reshape(-1, 20)
        dm = blocks[:, :4].contiguous().view(torch.float16).float()  # (groups, 2)
        d, zero = dm[:, 0], dm[:, 1] + 8 * dm[:, 0]
        changed_d += (d.bfloat16().float() != d).sum().item()
        changed_zero += (zero.bfloat16().float() != zero).sum().item()
        groups += d.numel()
        w = dequantize(raw, qtype).reshape(shape)
        if kind in heads:
            w = unpermute_qk(w, heads[kind])
        err = (layer.dequantize() - w).abs()
        nonzero = w != 0
        worst_rel = max(worst_rel, (err[nonzero] / w[nonzero].abs()).max().item())
        group_err, group_max = err.reshape(-1, 32), w.abs().reshape(-1, 32)
        ratio = group_err.amax(1) / group_max.amax(1)
        worst_group = max(worst_group, ratio.max().item())
        step = d.reshape(shape[0], -1)  # (out, groups): d in the file's row order
        if kind in heads:
            step = unpermute_qk(step, heads[kind])
        step = step.repeat_interleave(32, dim=1)
        worst_step = max(worst_step, (err / step).max().item())
        num, den = num + err.square().sum().item(), den + w.square().sum().item()
    rows = [
        ["scales d not exact in bfloat16", changed_d, groups],
        ["zeros m + 8d not exact in bfloat16", changed_zero, groups],
        ["largest relative error of a nonzero weight", f"{worst_rel:.3g}", ""],
        ["largest error / its group's largest |weight|", f"{worst_group:.3g}", ""],
        ["largest error in steps d", f"{worst_step:.3g}", ""],
        ["relative Frobenius error, all weights", f"{(num / den) ** 0.5:.3g}", ""],
    ]
    for row in rows:
        print(f"  {row[0]:45s} {row[1]} {'of ' + str(row[2]) if row[2] else ''}")
    return [["scale error", *row] for row in rows]


@torch.no_grad()
def logits_and_tokens(models: dict, tokenizer, new_tokens: int) -> list[list]:
    """Each model's largest logit difference from float32 on LOGIT_PROMPTS, and its
    greedy tokens on PROMPT and SUMMARY against float32's."""
    reference, rows = models["float32"], []
    prompts = {"story": PROMPT, "summary": SUMMARY}
    ids = {k: torch.tensor([tokenizer.encode(text)]) for k, text in prompts.items()}
    ref = {k: generate(reference, x, new_tokens, temperature=0) for k, x in ids.items()}
    for name, model in models.items():
        if name == "float32":
            continue
        diff = 0.0
        for text in LOGIT_PROMPTS:
            x = torch.tensor([tokenizer.encode(text)])
            a, b = model(x)[0].float(), reference(x)[0]
            diff = max(diff, (a - b).abs().max().item())
        print(f"  {name:28s} logits max |diff| {diff:.3f}")
        rows.append(["logits max abs diff vs float32", name, f"{diff:.3f}", ""])
        for label, x in ids.items():
            ours = generate(model, x, new_tokens, temperature=0)
            parted = (ours[0, x.shape[1] :] != ref[label][0, x.shape[1] :]).nonzero()
            where = "equal" if parted.numel() == 0 else f"part at {parted[0, 0]}"
            print(f"  {name:28s} {label:8s} {new_tokens} greedy tokens: {where}")
            rows.append([f"greedy tokens vs float32 ({label})", name, where, ""])
    return rows


def matmuls(repeats: int) -> list[list]:
    """Median microseconds of y = x @ W.T for the MLP's two shapes, batch 1 and 16."""
    rows = []
    file = GGUFFile(bundled_gguf_path())
    for tensor in ["blk.0.ffn_up.weight", "blk.0.ffn_down.weight"]:
        qtype, shape, raw = file.tensors[tensor]
        w = dequantize(raw, qtype).reshape(shape)  # (out, in)
        int4 = Int4Linear.from_q4_1(raw, shape)
        int8 = QuantLinear.from_linear(_linear(w))
        int8_bf16 = QuantLinear.from_linear(_linear(w).bfloat16())
        for batch in (1, 16):
            x = torch.randn(batch, shape[1])
            runs = _products(x, w, int8, int8_bf16, int4)
            medians, _ = alternate(runs, repeats)
            label = f"{shape[1]} -> {shape[0]}, batch {batch}"
            for name, seconds in medians.items():
                print(f"  {label:22s} {name:28s} {seconds * 1e6:8.1f} us")
                rows.append(["matmul median us", f"{label}: {name}", seconds * 1e6])
    return [[a, b, f"{c:.1f}", "us"] for a, b, c in rows]


def _products(x, w, int8, int8_bf16, int4) -> dict:
    xb, w_bf16 = x.bfloat16(), w.bfloat16()
    return {
        "float32 dense": lambda: F.linear(x, w),
        "bfloat16 dense": lambda: F.linear(xb, w_bf16),
        "int8 QuantLinear, float32": lambda: int8(x),
        "int8 QuantLinear, bfloat16": lambda: int8_bf16(xb),
        "int4 Int4Linear, bfloat16": lambda: int4(xb),
    }


def _linear(w: torch.Tensor) -> torch.nn.Linear:
    linear = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
    linear.weight.data = w.clone()
    return linear


@torch.no_grad()
def decode(models: dict, tokenizer, new_tokens: int, runs: int) -> list[list]:
    """Greedy tokens/s of each model on PROMPT (KV cache), median of alternating
    runs."""
    ids = torch.tensor([tokenizer.encode(PROMPT)])
    rates = {name: [] for name in models}
    for model in models.values():  # warm-up
        generate(model, ids, 8, temperature=0)
    for _ in range(runs):
        for name, model in models.items():
            start = time.perf_counter()
            generate(model, ids, new_tokens, temperature=0)
            rates[name].append(new_tokens / (time.perf_counter() - start))
    rows = []
    for name, rate in rates.items():
        median = statistics.median(rate)
        print(f"  {name:28s} {median:7.1f} tokens/s")
        rows.append(["decode tokens/s, batch 1", name, f"{median:.1f}", "tokens/s"])
    return rows


def main() -> None:
    parser = threads_parser(__doc__)
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--new-tokens", type=int, default=50)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--csv", help="write the results here")
    args = parse_and_set_threads(parser)
    model, tokenizer = load_pretrained(device="cpu")
    models = {
        "float32": model,
        "bfloat16": copy.deepcopy(model).to(torch.bfloat16),
        "int4, float32 elsewhere": load_int4()[0],
        "int4, bfloat16": load_int4(dtype=torch.bfloat16)[0],
    }
    threads = torch.get_num_threads()
    print(f"torch {torch.__version__}, {threads} threads")
    rows = [["setup", f"torch {torch.__version__}, CPU", threads, "threads"]]
    print("scale error (int4 weights vs the file's float32 dequantization):")
    rows += scale_error(models["int4, bfloat16"])
    print("accuracy vs the float32 model:")
    rows += logits_and_tokens(models, tokenizer, args.new_tokens)
    print(f"matrix products, median of {args.repeats}:")
    rows += matmuls(args.repeats)
    print(f"decode, {args.new_tokens} new tokens, median of {args.runs} runs:")
    rows += decode(models, tokenizer, args.new_tokens, args.runs)
    if args.csv:
        write_csv(args.csv, ["measure", "case", "value", "of / unit"], rows)


if __name__ == "__main__":
    main()
