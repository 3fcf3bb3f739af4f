"""Training throughput of SmolLM vs transformers' LlamaForCausalLM (sdpa), same config
and weights.

Each model trains the same way (AdamW, autocast, torch.compile, random tokens: speed
does not depend on what they say) for a fixed number of steps, in alternating rounds;
the script prints tokens/s, MFU (6N + 12*L*H*Q*T FLOPs per token over the GPU's dense
peak) and peak memory.

    python bench/train_gpu.py                            # SmolLM2-135M, T=2048, bf16
    python bench/train_gpu.py --preset tiny --device cpu  # a quick check that it runs
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
from common import write_csv

from smol import SmolConfig, SmolLM
from smol.flops import flops_per_token, mfu, num_params, peak_flops
from smol.optim import adamw, amp_dtype, param_groups
from smol.reference import llama_twin


def build(config: SmolConfig, device):
    reference = llama_twin(config, "sdpa").to(device)
    model = SmolLM(config).to(device)
    model.load_state_dict(reference.state_dict())
    return {
        "smol": (model, lambda m, x: m(x)[0]),
        "transformers": (reference, lambda m, x: m(input_ids=x).logits),
    }


class Run:
    """One model's training step: autocast forward, float32 cross-entropy, backward,
    fused AdamW."""

    def __init__(self, model, logits_fn, device, dtype, compile_):
        self.model, self.device, self.dtype = model, device, dtype
        self.forward = torch.compile(model) if compile_ else model
        self.logits_fn = logits_fn
        self.optimizer = adamw(param_groups(model, 0.1), lr=1e-4, betas=(0.9, 0.999))
        self.scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)

    def step(self, x, y):
        with torch.autocast(
            self.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32
        ):
            logits = self.logits_fn(self.forward, x)  # (B, T, V)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.optimizer)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return loss


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(run: Run, batches, device) -> tuple[float, float | None]:
    """(seconds per step, peak memory in GiB during these steps or None on a CPU)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    sync(device)
    start = time.perf_counter()
    for x, y in batches:
        loss = run.step(x, y)
    loss.item()  # waits for the last step
    sync(device)
    seconds = (time.perf_counter() - start) / len(batches)
    peak = (
        torch.cuda.max_memory_allocated(device) / 2**30
        if device.type == "cuda"
        else None
    )
    return seconds, peak


def table_row(model: str, gpu: str, r: dict) -> list[str]:
    mem = r["peak_memory_gib"]
    return [
        model,
        gpu,
        f"{r['tokens_per_s']:.0f}",
        f"{r['mfu']:.1%}" if r["mfu"] else "n/a",
        f"{mem:.1f}" if mem is not None else "n/a",
    ]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="smollm2-135m")
    p.add_argument(
        "--seq-len",
        type=int,
        default=None,
        help="default: 2048, or the preset's context if shorter",
    )
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--steps", type=int, default=10, help="timed steps per round")
    p.add_argument(
        "--warmup",
        type=int,
        default=3,
        help="untimed steps first (compilation happens here)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="alternating rounds; the median is reported",
    )
    p.add_argument("--device", default="auto")
    p.add_argument(
        "--dtype",
        default="auto",
        help="auto (bf16 where native, else fp16 on CUDA; fp32 on CPU), bf16, fp16 "
        "or fp32",
    )
    p.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="default: on CUDA only",
    )
    p.add_argument("--json", help="also write the results here")
    p.add_argument(
        "--csv", help="also write a table here (model, GPU, tokens/s, MFU, memory)"
    )
    args = p.parse_args()

    device = torch.device(
        ("cuda" if torch.cuda.is_available() else "cpu")
        if args.device == "auto"
        else args.device
    )
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")
    dtype = amp_dtype(device, args.dtype)
    compile_ = device.type == "cuda" if args.compile is None else args.compile
    config = SmolConfig.preset(args.preset)
    args.seq_len = args.seq_len or min(2048, config.max_position_embeddings)
    if args.seq_len > config.max_position_embeddings:
        p.error(
            f"--seq-len {args.seq_len} exceeds the preset's context "
            f"{config.max_position_embeddings}"
        )
    torch.manual_seed(0)
    runs = {
        name: Run(model, fn, device, dtype, compile_)
        for name, (model, fn) in build(config, device).items()
    }
    B, T = args.batch_size, args.seq_len

    def batches(n):
        ids = torch.randint(0, config.vocab_size, (n, B, T + 1), device=device)
        return [(w[:, :-1], w[:, 1:]) for w in ids]

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    peak = peak_flops(device) if dtype != torch.float32 else None
    fpt = flops_per_token(config, T)
    print(
        f"{args.preset} ({num_params(config):,} parameters), B={B}, T={T}, {dtype}, "
        f"compile={compile_}, {name}, "
        f"{f'peak {peak / 1e12:.0f} TFLOP/s' if peak else 'no known peak (MFU n/a)'}, "
        f"{fpt / 1e9:.3f} GFLOP/token",
        flush=True,
    )
    for run in runs.values():  # warm-up and compilation, untimed
        for x, y in batches(args.warmup):
            run.step(x, y)
        sync(device)
    seconds = {k: [] for k in runs}
    memory = {k: [] for k in runs}
    for r in range(args.rounds):
        # alternate, so drift (clocks, heat, neighbours) hits both
        for k, run in runs.items():
            s, m = timed(run, batches(args.steps), device)
            seconds[k].append(s)
            memory[k].append(m)
            print(f"  round {r + 1} {k:>12}: {B * T / s:>12,.0f} tokens/s", flush=True)
    results = {}
    print(f"\n{'model':>12} {'tokens/s':>12} {'MFU':>7} {'peak memory':>12}")
    for k in runs:
        tok_s = B * T / statistics.median(seconds[k])
        util = mfu(fpt, tok_s, peak)
        mem = max(memory[k]) if memory[k][0] is not None else None
        results[k] = {"tokens_per_s": tok_s, "mfu": util, "peak_memory_gib": mem}
        print(
            f"{k:>12} {tok_s:>12,.0f} {f'{util:.1%}' if util else 'n/a':>7} "
            f"{f'{mem:.1f} GiB' if mem is not None else 'n/a':>12}"
        )
    ratio = results["smol"]["tokens_per_s"] / results["transformers"]["tokens_per_s"]
    print(f"smol / transformers tokens/s: {ratio:.2f}")
    if args.csv:
        header = ["model", "GPU", "tokens/s", "MFU", "peak memory (GiB)"]
        write_csv(args.csv, header, [table_row(k, name, r) for k, r in results.items()])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "device": name,
                    "preset": args.preset,
                    "batch_size": B,
                    "seq_len": T,
                    "dtype": str(dtype),
                    "compile": compile_,
                    "results": results,
                    "ratio": ratio,
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
