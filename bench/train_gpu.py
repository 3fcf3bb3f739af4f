"""Training throughput of SmolLM vs transformers' LlamaForCausalLM (sdpa), same config
and weights.

smol trains through its Trainer, as a learner runs it (fused AdamW, autocast, the
loss inside the compiled model, the batches moved to the GPU each step); the reference
takes the same steps (fused AdamW, autocast, its forward and the float32 loss compiled
together). Random tokens: speed does not depend on what they say. Both run a fixed
number of steps in alternating rounds at one batch size, by default the largest the
GPU's memory holds (measured with one eager step); the script prints tokens/s, MFU
(6N + 12*L*H*D*T FLOPs per token over the GPU's dense peak), peak memory, and on a GPU
where the time of one smol step goes, kernel by kernel (--profile-csv).

    python bench/train_gpu.py                            # SmolLM2-135M, T=2048, bf16
    python bench/train_gpu.py --preset tiny --device cpu  # a quick check that it runs
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import tempfile
import time

import torch
import torch.nn.functional as F
from common import write_csv

from smol import SmolConfig, SmolLM
from smol.flops import flops_per_token, mfu, num_params, peak_flops
from smol.optim import adamw, amp_dtype, param_groups
from smol.reference import llama_twin
from smol.train import TrainConfig, Trainer

DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
BATCHES = (1, 2, 4, 8, 12, 16, 24, 32)


class Run:
    """The reference's training step: its forward and the float32 cross-entropy under
    autocast (compiled together), backward, fused AdamW."""

    def __init__(self, model, device, dtype, compile_):
        self.model, self.device, self.dtype = model, device, dtype

        def loss_of(x, y):  # (B, T) ids, (B, T) next tokens -> the mean loss
            logits = model(input_ids=x).logits  # (B, T, V)
            return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())

        self.loss = torch.compile(loss_of) if compile_ else loss_of
        self.optimizer = adamw(param_groups(model, 0.1), lr=1e-4, betas=(0.9, 0.999))
        self.scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)

    def step(self, x, y):
        with torch.autocast(
            self.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32
        ):
            loss = self.loss(x, y)
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.optimizer)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return loss


class TrainerRun:
    """smol's step as a learner takes it: Trainer.train_step on its own batches (the
    windows of a token stream, moved to the device each step)."""

    def __init__(self, model, config, args, device, steps: int):
        B, T = args.batch_size, args.seq_len
        stream = torch.randint(0, config.vocab_size, (B * (T + 1) * (steps + 2),))
        cfg = TrainConfig(
            preset=args.preset,
            seq_len=T,
            batch_size=B,
            steps=steps,
            warmup_steps=1,
            eval_every=0,
            device=str(device),
            dtype=args.dtype,
            compile=args.compile,
            out_dir=tempfile.mkdtemp(prefix="smol-train-gpu-"),
            progress=False,
            sample_tokens=0,
        )
        self.trainer = Trainer(
            cfg, train_tokens=stream, val_tokens=stream[:4096], model=model
        )
        self.model = model

    def step(self, x=None, y=None):  # the trainer draws its own batch
        return self.trainer.train_step()


def choose_batch(config, seq_len, device, dtype, models: int) -> tuple[int, str]:
    """The largest batch in BATCHES whose activations, measured with one eager smol step
    at batch 1 and 2 (the difference is one sequence's), fit in 80% of the GPU's memory
    beside `models` models with their gradients and AdamW state; and how it was
    chosen."""
    model = SmolLM(config).to(device)
    per_model = 16 * sum(p.numel() for p in model.parameters())  # fp32 w, grad, m, v
    peaks = []
    for B in (1, 2):
        ids = torch.randint(0, config.vocab_size, (B, seq_len), device=device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            loss = model(ids, ids)[1]
        loss.backward()
        peaks.append(torch.cuda.max_memory_allocated(device) - base)
        model.zero_grad(set_to_none=True)
    del model, loss
    torch.cuda.empty_cache()
    per_sequence = max(peaks[1] - peaks[0], 1)
    fixed = peaks[0] - per_sequence  # what does not grow with the batch
    budget = 0.8 * torch.cuda.get_device_properties(device).total_memory
    budget -= models * per_model + fixed
    fits = [B for B in BATCHES if B * per_sequence <= budget] or [1]
    how = (
        f"batch {fits[-1]}: one sequence of {seq_len} tokens takes "
        f"{per_sequence / 2**30:.2f} GiB in an eager step; 80% of "
        f"{torch.cuda.get_device_properties(device).total_memory / 2**30:.0f} GiB, "
        f"less {models} models' weights, gradients and AdamW state, holds "
        f"{int(budget // per_sequence)}"
    )
    return fits[-1], how


KERNELS = [  # (what, a pattern of the CUDA kernel names that do it)
    (
        "matrix products (cuBLAS/CUTLASS GEMMs)",
        r"gemm|cutlass|xmma|nvjet|sm\d\d_|cublas",
    ),
    ("attention (SDPA's fused kernels)", r"flash|fmha|attention|cudnn"),
    ("optimizer (fused AdamW, clipping)", r"adam|multi_tensor|foreach|norm_kernel"),
    ("fused elementwise and reductions (Triton)", r"triton"),
    ("other (copies, PyTorch's own elementwise)", r""),
]


def profile(run, device, steps: int = 3) -> list[list[str]]:
    """Where the GPU time of a training step goes: kernel time by kind, in ms a step
    and as a share of the step's wall time, and the time no kernel ran."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    sync(device)
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            run.step()
        sync(device)
        wall = (time.perf_counter() - start) / steps
    spent = {what: 0.0 for what, _ in KERNELS}
    for event in prof.events():
        if event.device_type != DeviceType.CUDA:
            continue
        name = event.name.lower()
        what = next(w for w, pattern in KERNELS if re.search(pattern, name))
        spent[what] += event.device_time_total / 1e6 / steps  # us -> s a step
    busy = sum(spent.values())
    rows = [[what, f"{s * 1e3:.2f}", f"{s / wall:.1%}"] for what, s in spent.items()]
    rows.append(
        [
            "no kernel running (launch gaps, host work)",
            f"{max(wall - busy, 0) * 1e3:.2f}",
            f"{max(wall - busy, 0) / wall:.1%}",
        ]
    )
    rows.append(["the whole step (wall clock)", f"{wall * 1e3:.2f}", "100.0%"])
    return rows


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


def table_row(model: str, gpu: str, batch: int, r: dict) -> list[str]:
    mem = r["peak_memory_gib"]
    return [
        model,
        gpu,
        str(batch),
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
    p.add_argument(
        "--batch-size",
        default="auto",
        help="sequences per step; auto: the largest the GPU's memory holds (CPU: 8)",
    )
    p.add_argument(
        "--only", choices=["smol", "transformers"], help="time one model only"
    )
    p.add_argument(
        "--profile-csv", help="on a GPU: where a smol step's time goes, written here"
    )
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
    names = [args.only] if args.only else ["smol", "transformers"]
    how = "given"
    if args.batch_size == "auto" and device.type == "cuda":
        args.batch_size, how = choose_batch(
            config, args.seq_len, device, dtype, len(names)
        )
    args.batch_size = 8 if args.batch_size == "auto" else int(args.batch_size)
    args.compile, args.dtype = compile_, DTYPES[dtype]
    torch.manual_seed(0)
    reference = llama_twin(config, "sdpa").to(device)
    model = SmolLM(config).to(device)
    model.load_state_dict(reference.state_dict())
    steps = args.warmup + args.rounds * args.steps + 3  # and a profile
    runs = {}
    if "smol" in names:
        runs["smol"] = TrainerRun(model, config, args, device, steps)
    if "transformers" in names:
        runs["transformers"] = Run(reference, device, dtype, compile_)
    else:
        del reference
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
        f"{fpt / 1e9:.3f} GFLOP/token; {how}",
        flush=True,
    )
    for k, run in list(runs.items()):  # warm-up and compilation, untimed
        try:
            for x, y in batches(args.warmup):
                run.step(x, y)
            sync(device)
        except torch.cuda.OutOfMemoryError:  # the other model's numbers still count
            print(f"{k}: out of memory at batch {B}; left out", flush=True)
            del runs[k]
            torch.cuda.empty_cache()
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
    ratio = None
    if len(results) == 2 and results.get("transformers"):
        ratio = (
            results["smol"]["tokens_per_s"] / results["transformers"]["tokens_per_s"]
        )
        print(f"smol / transformers tokens/s: {ratio:.2f}")
    if args.csv:
        header = ["model", "GPU", "batch", "tokens/s", "MFU", "peak memory (GiB)"]
        write_csv(
            args.csv, header, [table_row(k, name, B, r) for k, r in results.items()]
        )
    if args.profile_csv and device.type == "cuda" and "smol" in runs:
        rows = profile(runs["smol"], device)
        for row in rows:
            print(f"  {row[0]:>48}: {row[1]:>8} ms  {row[2]:>6}")
        write_csv(args.profile_csv, ["where the time goes", "ms a step", "share"], rows)
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
                    "batch_size_chosen": how,
                    "results": results,
                    "ratio": ratio,
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
