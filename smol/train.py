"""Training: AdamW, the learning-rate schedule, mixed precision, checkpoints with exact resume, DDP.

    python -m smol.train --preset tiny --steps 300 --out runs/tiny
    torchrun --nproc_per_node=2 -m smol.train --preset tiny --steps 300 --out runs/ddp
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import math
import os
import random
import re
import shutil
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from tqdm import TqdmWarning

with warnings.catch_warnings():  # without ipywidgets, notebooks get text bars: no need to warn
    warnings.simplefilter("ignore", TqdmWarning)
    from tqdm.auto import tqdm

from smol import data
from smol.config import SmolConfig
from smol.model import SmolLM


def lr_schedule(step: int, *, max_lr: float, warmup_steps: int, total_steps: int, min_lr: float = 0.0,
                kind: str = "cosine", decay_fraction: float = 0.2) -> float:
    """The learning rate for optimizer step `step` (0-based): a linear warmup to max_lr over
    warmup_steps, then "cosine": half a cosine down to min_lr at total_steps, or "wsd"
    (warmup-stable-decay, as SmolLM2 was trained): max_lr until the last decay_fraction of the
    steps, then a linear decay to min_lr."""
    if not 0 <= warmup_steps <= total_steps or total_steps <= 0:
        raise ValueError(f"need 0 <= warmup_steps ({warmup_steps}) <= total_steps ({total_steps}), total_steps > 0")
    if not 0 <= min_lr <= max_lr:
        raise ValueError(f"need 0 <= min_lr ({min_lr}) <= max_lr ({max_lr})")
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step >= total_steps:
        return min_lr
    if kind == "cosine":
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)  # 0 -> 1
        return min_lr + 0.5 * (max_lr - min_lr) * (1 + math.cos(math.pi * progress))
    if kind == "wsd":
        if not 0 <= decay_fraction <= 1:
            raise ValueError(f"decay_fraction must lie in [0, 1], got {decay_fraction}")
        decay_start = max(warmup_steps, total_steps - round(decay_fraction * total_steps))
        if step < decay_start:
            return max_lr
        return max_lr + (min_lr - max_lr) * (step - decay_start) / max(1, total_steps - decay_start)
    raise ValueError(f"kind must be 'cosine' or 'wsd', got {kind!r}")


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on matrices (>= 2-D: projections and the embedding), none on norm gains.
    `parameters()` yields a tied embedding/head matrix once, so it is decayed once."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def num_params(config: SmolConfig) -> int:
    """SmolLM(config).count_params(), from the shapes alone: embedding (+ head if untied), per layer
    q/k/v/o, gate/up/down and two norms, and the final norm."""
    C, I, D = config.hidden_size, config.intermediate_size, config.head_dim
    attn = C * D * (2 * config.num_attention_heads + 2 * config.num_key_value_heads)
    per_layer = attn + 3 * C * I + 2 * C
    head = 0 if config.tie_word_embeddings else config.vocab_size * C
    return config.vocab_size * C + head + config.num_hidden_layers * per_layer + C


def flops_per_token(config: SmolConfig, seq_len: int) -> int:
    """Training FLOPs per token, 6N + 12*L*H*Q*T (Chowdhery et al., 2022, appendix B): 6N for the
    matrix multiplies forward and backward (N includes the tied embedding, as the head's matmul
    costs it), plus attention's scores and weighted sum over T positions."""
    return 6 * num_params(config) + 12 * config.num_hidden_layers * config.num_attention_heads * config.head_dim * seq_len


# Dense (no sparsity) 16-bit tensor-core peaks in FLOP/s, from NVIDIA's datasheets, which print the
# 2:4-sparse figures: halve those. Matched in order against torch.cuda.get_device_name().
PEAK_FLOPS = [
    (r"H200", 989e12), (r"H100.*PCIe", 756e12), (r"H100.*NVL", 835e12), (r"H100", 989e12),
    (r"A100", 312e12), (r"L40S", 362e12), (r"\bL4\b", 121e12), (r"\bT4\b", 65e12),  # T4: fp16 only
    (r"V100.*PCI", 112e12), (r"V100", 125e12),
]


def peak_flops(device) -> float | None:
    """The GPU's dense bf16/fp16 peak FLOP/s, or None (a CPU, or a GPU not in the table)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for pattern, peak in PEAK_FLOPS if re.search(pattern, name)), None)


def amp_dtype(device: torch.device, dtype: str = "auto") -> torch.dtype:
    """Autocast precision: bf16 on GPUs that have it natively, else fp16 (a T4, with a GradScaler);
    fp32 on CPU unless asked."""
    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else torch.float16
        return torch.float32
    choices = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    if dtype not in choices:
        raise ValueError(f"dtype must be one of auto, {', '.join(choices)}; got {dtype!r}")
    if choices[dtype] == torch.float16 and device.type != "cuda":
        raise ValueError("fp16 with a GradScaler needs a CUDA device; use bf16 or fp32 on CPU")
    return choices[dtype]


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, incomplete or corrupted."""


class TrainingDiverged(FloatingPointError):
    """The loss became NaN or infinite."""


@dataclass
class TrainConfig:
    preset: str = "tiny"
    model_overrides: dict = field(default_factory=dict)  # SmolConfig fields, e.g. {"num_hidden_layers": 2}
    tokenizer: str = "auto"  # "shakespeare" (vocab 4096), "smollm2" (49152), or auto from the vocab size
    steps: int = 300
    batch_size: int = 16  # sequences per micro-batch per rank
    seq_len: int = 128
    grad_accum: int = 1  # micro-batches per optimizer step
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup_steps: int = 30
    schedule: str = "cosine"  # or "wsd"
    decay_fraction: float = 0.2
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # 0: no clipping
    eval_every: int = 100  # 0: never (the last step always evaluates when > 0)
    eval_batches: int = 8
    sample_every: int = 0
    sample_prompt: str = "Romeo.\n"
    sample_tokens: int = 48
    log_every: int = 10
    ckpt_every: int = 0  # 0: only at the end
    keep_checkpoints: int = 2
    out_dir: str = "runs/tiny"
    seed: int = 0
    device: str = "auto"
    dtype: str = "auto"  # auto, bf16, fp16, fp32
    compile: bool = False
    resume: bool = False
    progress: bool = True

    def model_config(self) -> SmolConfig:
        return SmolConfig.preset(self.preset, **self.model_overrides)


# Train-config fields that define the data stream: a resume must keep them.
DATA_FIELDS = ("seq_len", "seed", "tokenizer")


def setup_distributed(device: str) -> tuple[int, int, int]:
    """(rank, world_size, local_rank); under torchrun, joins the process group (NCCL on GPUs, gloo on CPU)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return 0, 1, 0
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = device != "cpu" and torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if use_cuda else "gloo")
    return rank, world_size, local_rank


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 of every parameter's bytes: equal digests, identical weights."""
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


class Trainer:
    """Trains a SmolLM on packed windows of a token stream (the Shakespeare plays by default)."""

    def __init__(self, config: TrainConfig, train_tokens: torch.Tensor | None = None,
                 val_tokens: torch.Tensor | None = None):
        if config.tokenizer == "auto":
            vocab = config.model_config().vocab_size
            config = dataclasses.replace(config, tokenizer="shakespeare" if vocab <= 4096 else "smollm2")
        self.cfg = cfg = config
        self.rank, self.world_size, local_rank = setup_distributed(cfg.device)
        if cfg.device == "auto":
            self.device = torch.device(f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
        else:
            self.device = torch.device(cfg.device)
        if self.device.type == "cuda":
            torch.set_float32_matmul_precision("high")  # TF32 for any fp32 matmul left
            torch.backends.cudnn.allow_tf32 = True
        self.model_config = mc = cfg.model_config()
        if cfg.seq_len > mc.max_position_embeddings:
            raise ValueError(f"seq_len {cfg.seq_len} is longer than the model's context "
                             f"(max_position_embeddings={mc.max_position_embeddings})")
        self.lr(0)  # a schedule that cannot run fails here, not mid-training
        if cfg.grad_accum < 1:
            raise ValueError(f"grad_accum must be >= 1, got {cfg.grad_accum}")
        self.tokenizer = None
        if train_tokens is None or val_tokens is None:
            self.tokenizer = data.load_tokenizer(cfg.tokenizer)
            if self.tokenizer.vocab_size > mc.vocab_size:
                raise ValueError(f"the {cfg.tokenizer!r} tokenizer has {self.tokenizer.vocab_size} tokens; "
                                 f"the model's vocab_size is {mc.vocab_size}")
            train_tokens = data.corpus_tokens("train", self.tokenizer) if train_tokens is None else train_tokens
            val_tokens = data.corpus_tokens("val", self.tokenizer) if val_tokens is None else val_tokens
        self.train_batches = data.Batches(data.PackedWindows(train_tokens, cfg.seq_len, seed=cfg.seed),
                                          cfg.batch_size, self.rank, self.world_size)
        self.val_windows = data.PackedWindows(val_tokens, cfg.seq_len, shuffle=False)

        torch.manual_seed(cfg.seed)  # every rank builds the same initial weights
        self.model = SmolLM(mc).to(self.device)
        self.amp_dtype = amp_dtype(self.device, cfg.dtype)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.amp_dtype == torch.float16)
        groups = param_groups(self.model, cfg.weight_decay)
        try:  # one fused kernel for the whole update, where the device has it
            self.optimizer = torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=True)
        except (RuntimeError, TypeError):
            self.optimizer = torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))

        self.ddp = None
        if self.world_size > 1:
            from torch.nn.parallel import DistributedDataParallel

            self.ddp = DistributedDataParallel(self.model, device_ids=[local_rank] if self.device.type == "cuda"
                                               else None)
        # Training runs through DDP (and compile) when used; eval through the compiled model;
        # generation through the plain model, whose KV-cache steps would only recompile.
        self.eval_model = torch.compile(self.model) if cfg.compile else self.model
        if self.ddp is None:
            self.train_model = self.eval_model
        else:
            self.train_model = torch.compile(self.ddp) if cfg.compile else self.ddp

        self.step = 0
        self.history = {"step": [], "loss": [], "lr": [], "val_step": [], "val_loss": [], "tokens_per_s": []}
        self.last_checkpoint: Path | None = None
        self.tokens_per_step = cfg.batch_size * cfg.seq_len * cfg.grad_accum * self.world_size
        self.flops_per_token = flops_per_token(mc, cfg.seq_len)
        self.peak = peak_flops(self.device) if self.amp_dtype != torch.float32 else None
        if cfg.resume:
            self.load_checkpoint()

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def lr(self, step: int) -> float:
        c = self.cfg
        return lr_schedule(step, max_lr=c.lr, warmup_steps=c.warmup_steps, total_steps=c.steps,
                           min_lr=c.min_lr, kind=c.schedule, decay_fraction=c.decay_fraction)

    def autocast(self):
        return torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp_dtype != torch.float32)

    def train_step(self) -> torch.Tensor:
        """One optimizer step over grad_accum micro-batches; returns the mean loss (a 0-d tensor)."""
        lr = self.lr(self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.model.train()
        total = torch.zeros((), device=self.device)
        for micro in range(self.cfg.grad_accum):
            x, y = (t.to(self.device, non_blocking=True) for t in next(self.train_batches))  # (B, T) each
            last = micro == self.cfg.grad_accum - 1
            # DDP averages gradients across ranks during backward; skip it until the last micro-batch.
            sync = self.ddp.no_sync() if self.ddp is not None and not last else contextlib.nullcontext()
            with sync:
                with self.autocast():
                    _, loss = self.train_model(x, y)
                loss = loss / self.cfg.grad_accum  # the sum over micro-batches is the mean over the batch
                self.scaler.scale(loss).backward()
            total += loss.detach()
        self.scaler.unscale_(self.optimizer)  # clip the true gradients, not the fp16-scaled ones
        if self.cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        if self.world_size > 1:  # report the mean over all ranks, as one process would see it
            dist.all_reduce(total)
            total /= self.world_size
        return total

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean loss over the first eval_batches global batches of the validation windows, in order
        (the same windows for any number of ranks, which share the micro-batches)."""
        self.model.eval()
        B = self.cfg.batch_size
        n = min(self.cfg.eval_batches * B * self.world_size, len(self.val_windows))
        sums = torch.zeros(2, device=self.device, dtype=torch.float64)  # loss * tokens, tokens
        for i, start in enumerate(range(0, n, B)):
            if i % self.world_size != self.rank:
                continue
            x, y = (t.to(self.device) for t in data.next_token_targets(self.val_windows.windows(start, min(B, n - start))))
            with self.autocast():
                _, loss = self.eval_model(x, y)
            sums += torch.stack([loss.double() * y.numel(), torch.tensor(y.numel(), device=self.device, dtype=torch.float64)])
        if self.world_size > 1:
            dist.all_reduce(sums)
        self.model.train()
        return (sums[0] / sums[1]).item()

    @torch.no_grad()
    def sample(self, prompt: str | None = None, max_new_tokens: int | None = None, *, temperature: float = 0.8,
               top_k: int | None = 50, seed: int = 0) -> str:
        """A generation from the current weights, with its own random generator (training's RNG is untouched)."""
        from smol.generate import generate

        if self.tokenizer is None:
            raise RuntimeError("sampling needs a tokenizer: this trainer was given token tensors")
        prompt = self.cfg.sample_prompt if prompt is None else prompt
        ids = torch.tensor([self.tokenizer.encode(prompt)], device=self.device)  # (1, T)
        generator = torch.Generator(self.device).manual_seed(seed)
        out = generate(self.model, ids, max_new_tokens or self.cfg.sample_tokens, temperature=temperature,
                       top_k=top_k, generator=generator)  # in float32: a few tokens, no need for speed
        return self.tokenizer.decode(out[0])

    def fit(self, until: int | None = None) -> dict:
        """Train to cfg.steps from wherever a resume left off, with logs, evals, samples and
        checkpoints; `until` stops (with a checkpoint) after that step, as a preempted job would."""
        cfg = self.cfg
        end = cfg.steps if until is None else min(until, cfg.steps)
        if self.is_main and cfg.sample_every:
            tqdm.write(f"step {self.step} sample: {self.sample()!r}")
        bar = tqdm(total=cfg.steps, initial=self.step, desc="train", disable=not (self.is_main and cfg.progress),
                   dynamic_ncols=True)
        pending: list[tuple[int, float, torch.Tensor]] = []  # (step, lr, loss) not yet read back
        clock, tokens = time.perf_counter(), 0
        while self.step < end:
            lr = self.lr(self.step)
            pending.append((self.step + 1, lr, self.train_step()))
            tokens += self.tokens_per_step
            last = self.step == cfg.steps
            log = self.step % cfg.log_every == 0 or self.step == end
            evaluate = cfg.eval_every > 0 and (self.step % cfg.eval_every == 0 or last)
            save = (cfg.ckpt_every > 0 and self.step % cfg.ckpt_every == 0) or self.step == end
            sample = self.is_main and cfg.sample_every > 0 and self.step % cfg.sample_every == 0
            if not (log or evaluate or save or sample):
                continue  # losses stay on the device: no sync between logs
            self._record(pending)  # raises TrainingDiverged on a NaN loss, before anything is saved
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            tok_s = tokens / (time.perf_counter() - clock)
            self.history["tokens_per_s"].append(tok_s)
            postfix = {"loss": f"{self.history['loss'][-1]:.3f}", "tok/s": f"{tok_s:,.0f}"}
            if self.peak:
                postfix["MFU"] = f"{self.mfu(tok_s):.1%}"
            bar.set_postfix(postfix, refresh=False)
            bar.update(len(pending))
            pending = []
            if evaluate:
                val = self.evaluate()
                if not math.isfinite(val):
                    raise TrainingDiverged(self._diverged_message("the validation loss", val))
                self.history["val_step"].append(self.step)
                self.history["val_loss"].append(val)
                if self.is_main and cfg.progress:
                    bar.write(f"step {self.step}: val loss {val:.4f}")
            if sample:
                bar.write(f"step {self.step} sample: {self.sample()!r}")
            if save:
                self.save_checkpoint()
            clock, tokens = time.perf_counter(), 0  # evals, samples and saves are not training time
        bar.close()
        return self.history

    def mfu(self, tokens_per_s: float) -> float | None:
        """Model FLOPs utilisation: achieved training FLOP/s over the GPUs' dense peak."""
        return None if not self.peak else self.flops_per_token * tokens_per_s / (self.peak * self.world_size)

    def _record(self, pending) -> None:
        if not pending:
            return
        losses = torch.stack([loss for _, _, loss in pending]).tolist()
        for (step, lr, _), loss in zip(pending, losses):
            if not math.isfinite(loss):
                raise TrainingDiverged(self._diverged_message("loss", loss, step))
            self.history["step"].append(step)
            self.history["lr"].append(lr)
            self.history["loss"].append(loss)

    def _diverged_message(self, what: str, value: float, step: int | None = None) -> str:
        kept = f"the last good checkpoint is kept: {self.last_checkpoint}" if self.last_checkpoint \
            else "no checkpoint was saved before it"
        return (f"training diverged: {what} is {value} at step {step or self.step}; stopping ({kept}). "
                f"Try a lower learning rate (lr={self.cfg.lr}) or gradient clipping (grad_clip={self.cfg.grad_clip}).")

    # Checkpoints: out_dir/checkpoints/step_NNNNNNN/{model.safetensors, state.pt}, and a file
    # `latest` naming the newest. Each is written to a temporary directory, then renamed into place
    # (atomic), then `latest` is replaced (atomic): a crash mid-save never damages a checkpoint.

    @property
    def checkpoint_root(self) -> Path:
        return Path(self.cfg.out_dir) / "checkpoints"

    def save_checkpoint(self) -> Path | None:
        """Write the model (safetensors), optimizer, scaler, schedule, RNG and data position (rank 0)."""
        from safetensors.torch import save_file

        root = self.checkpoint_root
        final = root / f"step_{self.step:07d}"
        if self.is_main:
            for stale in root.glob(".step_*.tmp-*"):  # left by a crash mid-save
                shutil.rmtree(stale, ignore_errors=True)
            tmp = root / f".{final.name}.tmp-{os.getpid()}"
            tmp.mkdir(parents=True)
            tied = self.model_config.tie_word_embeddings
            weights = {k: v.detach().cpu().contiguous() for k, v in self.model.state_dict().items()
                       if not (tied and k == "lm_head.weight")}  # a tied head is the embedding: saved once
            save_file(weights, tmp / "model.safetensors", metadata={"format": "pt"})
            state = {
                "step": self.step,
                "optimizer": self.optimizer.state_dict(),
                "scaler": self.scaler.state_dict(),
                "schedule": {k: getattr(self.cfg, k) for k in ("lr", "min_lr", "warmup_steps", "steps",
                                                                "schedule", "decay_fraction")},
                "data": self.train_batches.state_dict(),
                "rng": {"torch": torch.get_rng_state(), "python": random.getstate(),
                        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},
                "model_config": dataclasses.asdict(self.model_config),
                "train_config": dataclasses.asdict(self.cfg),
                "history": self.history,
                "weights_sha256": _file_sha256(tmp / "model.safetensors"),
                "world_size": self.world_size,
            }
            torch.save(state, tmp / "state.pt")
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
            latest_tmp = root / f".latest.tmp-{os.getpid()}"
            latest_tmp.write_text(final.name + "\n")
            os.replace(latest_tmp, root / "latest")
            old = sorted(p for p in root.glob("step_*") if p.is_dir() and p != final)
            for p in old[:max(0, len(old) - (self.cfg.keep_checkpoints - 1))]:
                shutil.rmtree(p, ignore_errors=True)
        if self.world_size > 1:
            dist.barrier()
        self.last_checkpoint = final
        return final

    def load_checkpoint(self, path: str | Path | None = None) -> Path:
        """Restore everything save_checkpoint wrote; `path` defaults to the latest in out_dir."""
        from safetensors.torch import load_file

        if path is None:
            latest = self.checkpoint_root / "latest"
            if not latest.is_file():
                raise FileNotFoundError(f"no checkpoint to resume from: {latest} does not exist "
                                        f"(train once without resume, or check out_dir={self.cfg.out_dir!r})")
            path = self.checkpoint_root / latest.read_text().strip()
        path = Path(path)
        if not (path / "state.pt").is_file() or not (path / "model.safetensors").is_file():
            raise FileNotFoundError(f"checkpoint {path} is missing (need model.safetensors and state.pt in it)")
        try:
            state = torch.load(path / "state.pt", map_location="cpu", weights_only=True)
        except Exception as e:
            raise CheckpointError(f"checkpoint {path} is corrupted: cannot read state.pt ({e})") from e
        if _file_sha256(path / "model.safetensors") != state.get("weights_sha256"):
            raise CheckpointError(f"checkpoint {path} is corrupted: model.safetensors does not match "
                                  "the checksum recorded in state.pt")
        saved, now = state["model_config"], dataclasses.asdict(self.model_config)
        diff = [f"{k}: checkpoint {saved.get(k)!r}, now {now.get(k)!r}" for k in now if saved.get(k) != now.get(k)]
        diff += [f"{k}: checkpoint {state['train_config'].get(k)!r}, now {getattr(self.cfg, k)!r}"
                 for k in DATA_FIELDS if state["train_config"].get(k) != getattr(self.cfg, k)]
        if diff:
            raise ValueError(f"checkpoint {path} was saved with another configuration:\n    " + "\n    ".join(diff))
        try:
            weights = load_file(path / "model.safetensors", device=str(self.device))
        except Exception as e:
            raise CheckpointError(f"checkpoint {path} is corrupted: cannot read model.safetensors ({e})") from e
        self.model.load_state_dict(weights)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scaler.load_state_dict(state["scaler"])
        self.train_batches.load_state_dict(state["data"])
        self.step = state["step"]
        self.history = state["history"]
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        if state["rng"]["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["rng"]["cuda"])
        self.last_checkpoint = path
        return path

    def summary(self) -> dict:
        """Final numbers; under DDP also every rank's weights digest (all equal when replicas agree)."""
        digest = weights_digest(self.model)
        digests = [digest]
        if self.world_size > 1:
            digests = [None] * self.world_size
            dist.all_gather_object(digests, digest)
        h = self.history
        tok_s = h["tokens_per_s"][-1] if h["tokens_per_s"] else None
        return {"step": self.step, "loss": h["loss"][-1] if h["loss"] else None,
                "val_loss": h["val_loss"][-1] if h["val_loss"] else None, "tokens_per_s": tok_s,
                "mfu": self.mfu(tok_s) if tok_s else None, "device": str(self.device),
                "world_size": self.world_size, "weights_digests": digests, "losses": h["loss"]}


def plot_history(history: dict, ax=None, title: str | None = None):
    """The training loss per step and the validation loss at each evaluation."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(history["step"], history["loss"], label="train", lw=1)
    if history["val_step"]:
        ax.plot(history["val_step"], history["val_loss"], "o-", label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(title or "loss")
    ax.legend()
    return ax


def _parse_args(argv) -> TrainConfig:
    p = argparse.ArgumentParser(prog="python -m smol.train", description="Train a SmolLM (torchrun for DDP).")
    defaults = TrainConfig()
    for f in dataclasses.fields(TrainConfig):
        if f.name == "model_overrides":
            continue
        flag, value = "--" + f.name.replace("_", "-"), getattr(defaults, f.name)
        if isinstance(value, bool):
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=value)
        else:
            p.add_argument(flag, type=type(value), default=value)
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a model config field, e.g. --set num_hidden_layers=2")
    args = vars(p.parse_args(argv))
    overrides = {}
    for item in args.pop("set"):
        key, _, value = item.partition("=")
        kinds = {f.name: f.type for f in dataclasses.fields(SmolConfig)}
        if key not in kinds or not value:
            p.error(f"--set expects FIELD=VALUE with FIELD one of {sorted(kinds)}, got {item!r}")
        overrides[key] = {"int": int, "float": float, "bool": lambda v: v.lower() in ("1", "true", "yes"),
                          "str": str}[kinds[key]](value)
    return TrainConfig(**args, model_overrides=overrides)


def main(argv=None) -> int:
    cfg = _parse_args(argv)
    trainer = None
    try:
        trainer = Trainer(cfg)
        if trainer.is_main:
            print(f"{trainer.model.count_params():,} parameters, {trainer.device}, {trainer.amp_dtype}, "
                  f"world size {trainer.world_size}, {trainer.tokens_per_step:,} tokens/step, "
                  f"from step {trainer.step}", flush=True)
        history = trainer.fit()
        summary = trainer.summary()
        if trainer.is_main:
            out = Path(cfg.out_dir)
            (out / "summary.json").write_text(json.dumps(summary, indent=1))
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt

            plot_history(history, title=f"{cfg.preset}: {cfg.steps} steps").figure.savefig(out / "loss.png", dpi=120)
            plt.close("all")
            mfu = f", MFU {summary['mfu']:.1%}" if summary["mfu"] else ""
            val = f", val loss {summary['val_loss']:.4f}" if summary["val_loss"] is not None else ""
            print(f"done: step {summary['step']}, loss {summary['loss']:.4f}{val}, "
                  f"{summary['tokens_per_s']:,.0f} tokens/s{mfu}; {out / 'summary.json'}", flush=True)
            if cfg.sample_tokens:
                print("sample:", repr(trainer.sample()), flush=True)
        return 0
    except (ValueError, FileNotFoundError, CheckpointError, TrainingDiverged) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
