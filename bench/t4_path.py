"""The path a Colab T4 learner runs, on whatever CUDA GPU is here: the decisions smol
makes for a T4 (float16 autocast, keys and values repeated before SDPA), the kernels
SDPA takes when only a T4's are allowed (memory-efficient, math), and the trainer in
float16 with a GradScaler, overflow-skipped steps counted, beside the same run in
bfloat16.

    python bench/t4_path.py --csv bench/results/t4_path_cuda.csv

What this cannot show is a T4's speed: its float16 tensor cores (65 TFLOP/s dense) and
320 GB/s of memory, against the GPU this runs on.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from unittest import mock

import torch
import torch.nn.functional as F
from common import write_csv
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode

import smol.attention
from smol.attention import sdpa_uses_gqa
from smol.optim import amp_dtype
from smol.train import TrainConfig, Trainer, TrainingDiverged

T4 = (7, 5)  # Turing's compute capability
T4_KERNELS = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
ALL_KERNELS = [
    SDPBackend.FLASH_ATTENTION,
    SDPBackend.EFFICIENT_ATTENTION,
    SDPBackend.CUDNN_ATTENTION,
    SDPBackend.MATH,
]


class OpLog(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.__name__)
        return func(*args, **(kwargs or {}))


def kernel(q, k, v, **kw) -> str:
    """The attention kernel SDPA dispatches to with a T4's kernels allowed."""
    with sdpa_kernel(T4_KERNELS), OpLog() as log:
        F.scaled_dot_product_attention(q, k, v, **kw)
    fused = [op for op in log.ops if "attention" in op]
    return fused[0] if fused else "math (the explicit path in PyTorch ops)"


def t4_decisions() -> dict[str, str]:
    """What smol's own choices are when the GPU reports a T4's capability."""
    q = torch.randn(1, 9, 16, 64, device="cuda", dtype=torch.float16)
    with (
        mock.patch("torch.cuda.get_device_capability", return_value=T4),
        mock.patch("torch.cuda.is_bf16_supported", return_value=False),
    ):
        return {
            "training precision (amp_dtype)": str(amp_dtype(torch.device("cuda"))),
            "enable_gqa in SDPA (sdpa_uses_gqa)": str(sdpa_uses_gqa(q)),
        }


def kernels_allowed_on_a_t4() -> dict[str, str]:
    q = torch.randn(4, 9, 2048, 64, device="cuda", dtype=torch.float16)
    kv = torch.randn(4, 3, 2048, 64, device="cuda", dtype=torch.float16)
    return {
        "9 heads, causal, float16": kernel(q, q, q, is_causal=True),
        "3 kv heads repeated to 9 (smol on a T4)": kernel(
            q,
            smol.attention.repeat_kv(kv, 3),
            smol.attention.repeat_kv(kv, 3),
            is_causal=True,
        ),
        "3 kv heads with enable_gqa": kernel(
            q, kv, kv, is_causal=True, enable_gqa=True
        ),
    }


def learnable_tokens(n: int, vocab: int) -> torch.Tensor:
    """A stream the model can learn: one random 997-token phrase, repeated."""
    phrase = torch.randint(0, vocab, (997,), generator=torch.Generator().manual_seed(0))
    return phrase.repeat(n // 997 + 1)[:n]


def train(dtype: str, steps: int, as_on_a_t4: bool) -> dict[str, str]:
    cfg = TrainConfig(
        preset="smollm2-135m",
        seq_len=1024,
        batch_size=4,
        steps=steps,
        warmup_steps=steps // 6,
        lr=5e-4,
        eval_every=0,
        log_every=10,
        dtype=dtype,
        device="cuda",
        out_dir=tempfile.mkdtemp(prefix="smol-t4-"),
        keep_checkpoints=1,
        progress=False,
        sample_tokens=0,
    )
    tokens = learnable_tokens(300_000, 49152)
    trainer = Trainer(cfg, train_tokens=tokens, val_tokens=tokens[:20_000])
    scaler, skipped = trainer.scaler, []
    update = scaler.update

    def counting_update(
        *args, **kw
    ):  # a step whose gradients overflowed lowers the scale
        before = scaler.get_scale() if scaler.is_enabled() else None
        update(*args, **kw)
        if before is not None and scaler.get_scale() < before:
            skipped.append(trainer.step)

    scaler.update = counting_update
    t4 = (
        mock.patch.object(smol.attention, "sdpa_uses_gqa", return_value=False)
        if as_on_a_t4
        else contextlib.nullcontext()
    )
    # a T4's path has no fallback: the memory-efficient kernel runs, or SDPA raises
    kernels = [SDPBackend.EFFICIENT_ATTENTION] if as_on_a_t4 else ALL_KERNELS
    with t4, sdpa_kernel(kernels):
        start = time.perf_counter()
        try:
            trainer.fit()
        except TrainingDiverged as e:  # a result too: say it, and where
            return {"precision": str(trainer.amp_dtype), "diverged": str(e)}
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        ids = tokens[: 2 * 256].view(2, 256).cuda()
        with OpLog() as log, trainer.autocast():  # one forward, to see the kernel
            trainer.model(ids)
    loss = trainer.history["loss"]
    attention = sorted({op for op in log.ops if "attention" in op})
    return {
        "precision": str(trainer.amp_dtype),
        "GradScaler": "on" if scaler.is_enabled() else "off",
        "attention kernel": ", ".join(attention) or "math",
        "steps": str(steps),
        "overflow-skipped steps": str(len(skipped))
        + (f" (steps {', '.join(map(str, skipped))})" if skipped else ""),
        "final loss scale": f"{scaler.get_scale():.0f}" if scaler.is_enabled() else "-",
        "loss at step 1": f"{loss[0]:.2f}",
        f"loss at step {steps}": f"{loss[-1]:.2f}",
        "tokens/s (this GPU, eager, with the per-step scale read)": (
            f"{trainer.tokens_per_step * steps / seconds:,.0f}"
        ),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--csv", help="write the table here (part, setting, value)")
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/t4_path.py needs a CUDA GPU")
    gpu = torch.cuda.get_device_name()
    torch.manual_seed(0)
    rows = [["this GPU", "name", gpu], ["this GPU", "PyTorch", torch.__version__]]
    rows += [["smol's choice on a T4", k, v] for k, v in t4_decisions().items()]
    rows += [
        ["SDPA, a T4's kernels", k, v] for k, v in kernels_allowed_on_a_t4().items()
    ]
    for name, dtype, t4 in [
        ("float16, as on a T4", "fp16", True),
        ("bf16", "bf16", False),
    ]:
        rows += [
            [f"trainer, {name}", k, v] for k, v in train(dtype, args.steps, t4).items()
        ]
    width = max(len(r[1]) for r in rows)
    for part, key, value in rows:
        print(f"{part:>28} | {key:<{width}} | {value}", flush=True)
    if args.csv:
        write_csv(args.csv, ["part", "setting", "value"], rows)


if __name__ == "__main__":
    main()
