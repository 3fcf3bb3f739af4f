"""Training: the loop around the optimisation recipe (smol.optim), with evaluation,
samples, checkpoints that resume exactly (smol.checkpoint), throughput and MFU
(smol.flops), and DDP.

    python -m smol.train --preset tiny --steps 300 --out runs/tiny
    torchrun --nproc_per_node=2 -m smol.train --preset tiny --steps 300 --out runs/ddp
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import signal
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

# smol/__init__.py has imported it without its IProgress notice
from tqdm.auto import tqdm

from smol import checkpoint, data, flops
from smol.config import PRESETS, SmolConfig
from smol.distributed import setup_distributed, training_device
from smol.model import SmolLM
from smol.optim import adamw, amp_dtype, lr_schedule, param_groups


class TrainingDiverged(FloatingPointError):
    """The loss became NaN or infinite."""


class TrainingInterrupted(Exception):
    """SIGTERM or SIGINT (Ctrl-C) stopped training at a step boundary, after saving a
    checkpoint."""

    def __init__(self, signal_name: str, step: int, path: Path):
        self.signal_name, self.step, self.path = signal_name, step, path
        super().__init__(
            f"stopped by {signal_name} after step {step}: saved {path}; "
            f"continue with --resume (resume=True)"
        )


POSITIVE_INTS = (
    "steps",
    "batch_size",
    "seq_len",
    "grad_accum",
    "eval_batches",
    "log_every",
    "keep_checkpoints",
)
NON_NEGATIVE_INTS = (
    "warmup_steps",
    "eval_every",
    "sample_every",
    "sample_tokens",
    "ckpt_every",
    "seed",
)
FLAGS = ("compile", "overwrite", "allow_changed_settings", "progress")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
    )


@dataclass
class TrainConfig:
    """Every setting of a run, checked when made (validate). A resume must keep those
    that decide what is trained; it may change log_every, eval_every, eval_batches,
    sample_*, ckpt_every, keep_checkpoints, out_dir, device, compile and progress
    (smol.checkpoint.MAY_CHANGE); another device or compile gives the same run up to
    floating-point rounding, not bit for bit."""

    preset: str = "tiny"
    model_overrides: dict = field(
        default_factory=dict
    )  # SmolConfig fields, e.g. {"num_hidden_layers": 2}
    # "shakespeare" (vocab 4096), "smollm2" (49152), or "auto" from the vocab size
    tokenizer: str = "auto"
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
    resume: bool | str = (
        False  # True or "latest": the newest intact checkpoint in out_dir; or a path
    )
    overwrite: bool = (
        False  # start over in an out_dir that holds a run, deleting its checkpoints
    )
    allow_changed_settings: bool = (
        False  # resume with settings that differ from the checkpoint's
    )
    progress: bool = True

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Raise a ValueError, one line, for the first setting that cannot work; the
        command line and the Python API both check here, before any work."""
        for name in POSITIVE_INTS:
            if not _is_int(value := getattr(self, name)) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        for name in NON_NEGATIVE_INTS:
            if not _is_int(value := getattr(self, name)) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        for name in FLAGS:
            if not isinstance(value := getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {value!r}")
        if not (_is_number(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a positive number, got {self.lr!r}")
        if not (_is_number(self.min_lr) and 0 <= self.min_lr <= self.lr):
            raise ValueError(
                f"min_lr ({self.min_lr!r}) must lie in [0, lr ({self.lr})]"
            )
        if self.warmup_steps > self.steps:
            raise ValueError(
                f"warmup_steps ({self.warmup_steps}) must lie in [0, steps "
                f"({self.steps})]"
            )
        if self.schedule not in ("cosine", "wsd"):
            raise ValueError(
                f"schedule must be 'cosine' or 'wsd', got {self.schedule!r}"
            )
        if not (_is_number(self.decay_fraction) and 0 <= self.decay_fraction <= 1):
            raise ValueError(
                f"decay_fraction must lie in [0, 1], got {self.decay_fraction!r}"
            )
        for name in ("weight_decay", "grad_clip"):
            if not (_is_number(value := getattr(self, name)) and value >= 0):
                raise ValueError(f"{name} must be >= 0, got {value!r}")
        for name in ("beta1", "beta2"):
            if not (_is_number(value := getattr(self, name)) and 0 <= value < 1):
                raise ValueError(f"{name} must lie in [0, 1), got {value!r}")
        if self.tokenizer not in ("auto", "shakespeare", "smollm2"):
            raise ValueError(
                "tokenizer must be one of 'auto', 'shakespeare', 'smollm2'; got "
                f"{self.tokenizer!r}"
            )
        if self.dtype not in ("auto", "bf16", "fp16", "fp32"):
            raise ValueError(
                f"dtype must be one of auto, bf16, fp16, fp32; got {self.dtype!r}"
            )
        try:
            if self.device != "auto":
                torch.device(self.device)
        except (RuntimeError, TypeError):
            raise ValueError(
                f"device must be 'auto' or a torch device such as 'cpu' or 'cuda:0', "
                f"got {self.device!r}"
            ) from None
        if not isinstance(self.out_dir, (str, os.PathLike)) or not str(self.out_dir):
            raise ValueError(f"out_dir must be a folder's path, got {self.out_dir!r}")
        if not (
            isinstance(self.resume, bool)
            or isinstance(self.resume, (str, os.PathLike))
            and str(self.resume)
        ):
            raise ValueError(
                "resume must be True, False, 'latest' or a checkpoint's path, got "
                f"{self.resume!r}"
            )
        if self.resume and self.overwrite:
            raise ValueError(
                "resume and overwrite exclude each other: continue the run, or start "
                "over"
            )
        if not isinstance(self.sample_prompt, str):
            raise ValueError(f"sample_prompt must be a str, got {self.sample_prompt!r}")
        mc = self.model_config()
        if self.seq_len > mc.max_position_embeddings:
            raise ValueError(
                f"seq_len {self.seq_len} is longer than the model's context "
                f"(max_position_embeddings={mc.max_position_embeddings})"
            )

    def model_config(self) -> SmolConfig:
        if self.preset not in PRESETS:
            raise ValueError(
                f"unknown preset {self.preset!r}; choose one of {sorted(PRESETS)}"
            )
        if not isinstance(self.model_overrides, dict):
            raise ValueError(
                "model_overrides must be a dict of SmolConfig fields, got "
                f"{self.model_overrides!r}"
            )
        fields = {f.name for f in dataclasses.fields(SmolConfig)}
        for key in self.model_overrides:
            if key not in fields:
                raise ValueError(
                    f"unknown model setting {key!r} in model_overrides; SmolConfig has "
                    f"{', '.join(sorted(fields))}"
                )
        return SmolConfig.preset(self.preset, **self.model_overrides)


class Trainer:
    """Trains a SmolLM on packed windows of a token stream (the Shakespeare plays by
    default)."""

    def __init__(
        self,
        config: TrainConfig,
        train_tokens: torch.Tensor | None = None,
        val_tokens: torch.Tensor | None = None,
        *,
        model: SmolLM | None = None,
    ):
        """`model`: train this model (pretrained, say, or with LoRA adapters) in place of a
        fresh SmolLM of config.preset; its parameters that do not require grad stay frozen.
        """
        if config.tokenizer == "auto":
            vocab = config.model_config().vocab_size
            config = dataclasses.replace(
                config, tokenizer="shakespeare" if vocab <= 4096 else "smollm2"
            )
        config.validate()  # again: fields may have been set after it was made
        self.cfg = cfg = config
        self.rank, self.world_size, local_rank = setup_distributed(cfg.device)
        self.device = training_device(cfg.device, local_rank)
        self.model_config = mc = cfg.model_config() if model is None else model.config
        self._on_main_rank(
            self._prepare_out_dir
        )  # before any work, not when the first save fails
        self._load_data(train_tokens, val_tokens)

        torch.manual_seed(cfg.seed)  # every rank builds the same initial weights
        self.model = (SmolLM(mc) if model is None else model).to(self.device)
        self.amp_dtype = amp_dtype(self.device, cfg.dtype)
        self.scaler = torch.amp.GradScaler(
            self.device.type, enabled=self.amp_dtype == torch.float16
        )
        self.optimizer = adamw(
            param_groups(self.model, cfg.weight_decay), cfg.lr, (cfg.beta1, cfg.beta2)
        )
        self._wrap_model(local_rank)

        self.step = 0
        self.run_id = uuid.uuid4().hex[:12]  # a resume takes the checkpoint's
        self.history = {
            "step": [],
            "loss": [],
            "lr": [],
            "val_step": [],
            "val_loss": [],
            "tokens_per_s": [],
        }
        self.last_checkpoint: Path | None = None
        self.tokens_per_step = (
            cfg.batch_size * cfg.seq_len * cfg.grad_accum * self.world_size
        )
        self.flops_per_token = flops.flops_per_token(mc, cfg.seq_len)
        self.peak = (
            flops.peak_flops(self.device) if self.amp_dtype != torch.float32 else None
        )
        if cfg.resume:
            self.load_checkpoint(None if cfg.resume in (True, "latest") else cfg.resume)

    def _on_main_rank(self, check) -> None:
        """Run `check` on the main rank; under DDP every rank raises its error, if
        any."""
        error = None
        if self.is_main:
            try:
                check()
            except (OSError, ValueError) as e:
                error = e
        if self.world_size > 1:
            box = [error]
            dist.broadcast_object_list(box, src=0)
            error = box[0]
        if error is not None:
            raise error

    def _prepare_out_dir(self) -> None:
        """Check that out_dir and its checkpoint folder can be written, and that they
        hold no other run: continuing one takes resume, starting over in its place takes
        overwrite."""
        cfg, root = self.cfg, self.checkpoint_root
        checkpoint.check_writable(cfg.out_dir, "out_dir")
        checkpoint.check_writable(root, "the checkpoint folder")
        found = checkpoint.checkpoints(root)
        if cfg.resume or not (found or (root / "latest").exists()):
            return
        if not cfg.overwrite:
            newest = f" (newest: {found[-1].name})" if found else ""
            raise FileExistsError(
                f"out_dir {cfg.out_dir} already holds a run{newest}: continue it with "
                f"--resume (resume=True), or delete its checkpoints and start over "
                f"with --overwrite (overwrite=True)"
            )
        gone = checkpoint.clear(root)
        log(
            f"overwrite: deleted the {len(gone)} checkpoint(s) of the previous run in "
            f"{root}"
        )

    def _load_data(self, train_tokens, val_tokens) -> None:
        """This rank's training batches and the validation windows; the corpus
        (tokenized with cfg.tokenizer) stands in for a stream not given."""
        cfg, vocab_size = self.cfg, self.model_config.vocab_size
        self.tokenizer = None
        if train_tokens is None or val_tokens is None:
            self.tokenizer = data.load_tokenizer(cfg.tokenizer)
            if self.tokenizer.vocab_size > vocab_size:
                raise ValueError(
                    f"the {cfg.tokenizer!r} tokenizer has {self.tokenizer.vocab_size} "
                    "tokens; "
                    f"the model's vocab_size is {vocab_size}"
                )
            train_tokens = (
                data.corpus_tokens("train", self.tokenizer)
                if train_tokens is None
                else train_tokens
            )
            val_tokens = (
                data.corpus_tokens("val", self.tokenizer)
                if val_tokens is None
                else val_tokens
            )
        self.train_batches = data.Batches(
            data.PackedWindows(train_tokens, cfg.seq_len, seed=cfg.seed),
            cfg.batch_size,
            self.rank,
            self.world_size,
        )
        self.val_windows = data.PackedWindows(val_tokens, cfg.seq_len, shuffle=False)

    def _wrap_model(self, local_rank: int) -> None:
        """Training runs through DDP (and compile) when used; eval through the compiled
        model; generation through the plain model, whose KV-cache steps would only
        recompile."""
        self.ddp = None
        if self.world_size > 1:
            from torch.nn.parallel import DistributedDataParallel

            self.ddp = DistributedDataParallel(
                self.model,
                device_ids=[local_rank] if self.device.type == "cuda" else None,
            )
        self.eval_model = torch.compile(self.model) if self.cfg.compile else self.model
        if self.ddp is None:
            self.train_model = self.eval_model
        else:
            self.train_model = torch.compile(self.ddp) if self.cfg.compile else self.ddp

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def lr(self, step: int) -> float:
        c = self.cfg
        return lr_schedule(
            step,
            max_lr=c.lr,
            warmup_steps=c.warmup_steps,
            total_steps=c.steps,
            min_lr=c.min_lr,
            kind=c.schedule,
            decay_fraction=c.decay_fraction,
        )

    def autocast(self):
        return torch.autocast(
            self.device.type,
            dtype=self.amp_dtype,
            enabled=self.amp_dtype != torch.float32,
        )

    def fit(self, until: int | None = None) -> dict:
        """Train to cfg.steps from wherever a resume left off, with logs, evals, samples
        and checkpoints; `until` stops (with a checkpoint) after that step, as a
        preempted job would.

        SIGTERM (a preempted job) or SIGINT (Ctrl-C) saves a checkpoint after the step
        under way and raises TrainingInterrupted, which says where it went (a second
        signal stops at once; the last checkpoint stays intact). Under DDP the ranks
        agree on it at the next log step."""
        with self._stop_on_signals() as caught:
            return self._fit(until, caught)

    def _fit(self, until: int | None, caught: list[str]) -> dict:
        cfg = self.cfg
        end = cfg.steps if until is None else min(until, cfg.steps)
        if self.is_main and cfg.sample_every:
            tqdm.write(f"step {self.step} sample: {self.sample()!r}")
        bar = tqdm(
            total=cfg.steps,
            initial=self.step,
            desc="train",
            disable=not (self.is_main and cfg.progress),
            dynamic_ncols=True,
        )
        pending: list[
            tuple[int, float, torch.Tensor]
        ] = []  # (step, lr, loss) not yet read back
        clock, tokens = time.perf_counter(), 0
        while self.step < end:
            lr = self.lr(self.step)
            pending.append((self.step + 1, lr, self.train_step()))
            tokens += self.tokens_per_step
            last = self.step == cfg.steps
            log = self.step % cfg.log_every == 0 or self.step == end
            evaluate = cfg.eval_every > 0 and (self.step % cfg.eval_every == 0 or last)
            save = (
                cfg.ckpt_every > 0 and self.step % cfg.ckpt_every == 0
            ) or self.step == end
            sample = (
                self.is_main
                and cfg.sample_every > 0
                and self.step % cfg.sample_every == 0
            )
            stop = bool(caught) and self.world_size == 1
            if not (log or evaluate or save or sample or stop):
                continue  # losses stay on the device: no sync between logs
            self._record(
                pending
            )  # raises TrainingDiverged on a NaN loss, before anything is saved
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            if self.world_size > 1 and (
                log or evaluate or save
            ):  # the same steps on every rank
                stop = self._any_rank_caught(caught)
            tok_s = tokens / (time.perf_counter() - clock)
            self.history["tokens_per_s"].append(tok_s)
            postfix = {
                "loss": f"{self.history['loss'][-1]:.3f}",
                "tok/s": f"{tok_s:,.0f}",
            }
            if self.peak:
                postfix["MFU"] = f"{self.mfu(tok_s):.1%}"
            bar.set_postfix(postfix, refresh=False)
            bar.update(len(pending))
            pending = []
            if evaluate:
                val = self.evaluate()
                if not math.isfinite(val):
                    raise TrainingDiverged(
                        self._diverged_message("the validation loss", val)
                    )
                self.history["val_step"].append(self.step)
                self.history["val_loss"].append(val)
                if self.is_main and cfg.progress:
                    bar.write(f"step {self.step}: val loss {val:.4f}")
            if sample:
                bar.write(f"step {self.step} sample: {self.sample()!r}")
            if save or stop:
                self.save_checkpoint()
            if stop and self.step < end:
                bar.close()
                raise TrainingInterrupted(
                    caught[0] if caught else "a signal to another rank",
                    self.step,
                    self.last_checkpoint,
                )
            clock, tokens = (
                time.perf_counter(),
                0,
            )  # evals, samples and saves are not training time
        bar.close()
        return self.history

    @contextlib.contextmanager
    def _stop_on_signals(self):
        """While training, SIGTERM and SIGINT only note that they came (in `caught`);
        the loop stops at the next step boundary. A second one raises KeyboardInterrupt
        at once."""
        caught: list[str] = []
        if (
            threading.current_thread() is not threading.main_thread()
        ):  # signals go to the main thread
            yield caught
            return

        def note(signum, frame):
            if caught:
                raise KeyboardInterrupt(
                    f"a second {signal.Signals(signum).name}: stopped at once"
                )
            caught.append(signal.Signals(signum).name)
            if self.is_main:
                log(
                    f"{caught[0]} received: saving a checkpoint after step "
                    f"{self.step + 1}, then stopping "
                    f"(send it again to stop at once)"
                )

        previous = {s: signal.signal(s, note) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield caught
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _any_rank_caught(self, caught: list[str]) -> bool:
        flag = torch.tensor(float(bool(caught)), device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return flag.item() > 0

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

    def _diverged_message(
        self, what: str, value: float, step: int | None = None
    ) -> str:
        kept = (
            f"the last good checkpoint is kept: {self.last_checkpoint}"
            if self.last_checkpoint
            else "no checkpoint was saved before it"
        )
        return (
            f"training diverged: {what} is {value} at step {step or self.step}; "
            f"stopping ({kept}). "
            f"Try a lower learning rate (lr={self.cfg.lr}) or gradient clipping "
            f"(grad_clip={self.cfg.grad_clip})."
        )

    def train_step(self) -> torch.Tensor:
        """One optimizer step over grad_accum micro-batches; returns the mean loss (a
        0-d tensor)."""
        lr = self.lr(self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.model.train()
        total = torch.zeros((), device=self.device)
        for micro in range(self.cfg.grad_accum):
            x, y, *mask = (
                t.to(self.device, non_blocking=True) for t in next(self.train_batches)
            )  # (B, T) each; a mask (B, T) with padded batches
            last = micro == self.cfg.grad_accum - 1
            # DDP averages gradients across ranks during backward; skip it until the
            # last micro-batch.
            sync = (
                self.ddp.no_sync()
                if self.ddp is not None and not last
                else contextlib.nullcontext()
            )
            with sync:
                with self.autocast():
                    _, loss = self.train_model(x, y, *mask)
                loss = (
                    loss / self.cfg.grad_accum
                )  # the sum over micro-batches is the mean over the batch
                self.scaler.scale(loss).backward()
            total += loss.detach()
        self.scaler.unscale_(
            self.optimizer
        )  # clip the true gradients, not the fp16-scaled ones
        if self.cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        if (
            self.world_size > 1
        ):  # report the mean over all ranks, as one process would see it
            dist.all_reduce(total)
            total /= self.world_size
        return total

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean loss over the first eval_batches global batches of the validation
        windows, in order (the same windows for any number of ranks, which share the
        micro-batches)."""
        self.model.eval()
        B = self.cfg.batch_size
        n = min(self.cfg.eval_batches * B * self.world_size, len(self.val_windows))
        sums = torch.zeros(
            2, device=self.device, dtype=torch.float64
        )  # loss * tokens, tokens
        for i, start in enumerate(range(0, n, B)):
            if i % self.world_size != self.rank:
                continue
            x, y = (
                t.to(self.device)
                for t in data.next_token_targets(
                    self.val_windows.windows(start, min(B, n - start))
                )
            )
            with self.autocast():
                _, loss = self.eval_model(x, y)
            sums += torch.stack(
                [
                    loss.double() * y.numel(),
                    torch.tensor(y.numel(), device=self.device, dtype=torch.float64),
                ]
            )
        if self.world_size > 1:
            dist.all_reduce(sums)
        self.model.train()
        return (sums[0] / sums[1]).item()

    @torch.no_grad()
    def sample(
        self,
        prompt: str | None = None,
        max_new_tokens: int | None = None,
        *,
        temperature: float = 0.8,
        top_k: int | None = 50,
        seed: int = 0,
    ) -> str:
        """A generation from the current weights, with its own random generator
        (training's RNG is untouched)."""
        from smol.generate import generate

        if self.tokenizer is None:
            raise RuntimeError(
                "sampling needs a tokenizer: this trainer was given token tensors"
            )
        prompt = self.cfg.sample_prompt if prompt is None else prompt
        ids = torch.tensor(
            [self.tokenizer.encode(prompt)], device=self.device
        )  # (1, T)
        generator = torch.Generator(self.device).manual_seed(seed)
        out = generate(
            self.model,
            ids,
            max_new_tokens or self.cfg.sample_tokens,
            temperature=temperature,
            top_k=top_k,
            generator=generator,
        )  # in float32: a few tokens, no need for speed
        return self.tokenizer.decode(out[0])

    def mfu(self, tokens_per_s: float) -> float | None:
        """Model FLOPs utilisation: achieved training FLOP/s over the GPUs' dense
        peak."""
        return flops.mfu(self.flops_per_token, tokens_per_s, self.peak, self.world_size)

    @property
    def checkpoint_root(self) -> Path:
        return Path(self.cfg.out_dir) / "checkpoints"

    def save_checkpoint(self) -> Path | None:
        """Write the model (safetensors), optimizer, scaler, schedule, RNG and data
        position (rank 0)."""
        if self.is_main:
            checkpoint.save_trainer(self, self.checkpoint_root)
        if self.world_size > 1:
            dist.barrier()
        self.last_checkpoint = checkpoint.step_dir(self.checkpoint_root, self.step)
        return self.last_checkpoint

    def load_checkpoint(self, path: str | Path | None = None) -> Path:
        """Restore everything save_checkpoint wrote. `path`: a checkpoint folder, taken
        as it is (a damaged one is an error); or a folder of checkpoints (None:
        out_dir's), whose newest intact one is taken, saying which damaged ones it
        skipped."""
        path = self.checkpoint_root if path is None else Path(path)
        if (
            not (path / checkpoint.MANIFEST).exists()
            and (path / "checkpoints").is_dir()
        ):
            path = path / "checkpoints"  # a run's out_dir
        if not (path.name.startswith("step_") or (path / checkpoint.MANIFEST).exists()):
            path, damaged = checkpoint.newest_intact(path)
            if damaged and self.is_main:
                log(
                    f"warning: {'; '.join(map(str, damaged))}; resuming from "
                    f"{path.name}, "
                    f"the newest intact checkpoint"
                )
        changed = checkpoint.restore_trainer(
            self, path, self.cfg.allow_changed_settings
        )
        if changed and self.is_main:
            log(
                "warning: resuming with changed settings, so the run no longer "
                "matches an uninterrupted "
                f"one: {'; '.join(changed)}"
            )
        self.last_checkpoint = Path(path)
        return self.last_checkpoint

    def summary(self) -> dict:
        """Final numbers; under DDP also every rank's weights digest (all equal when
        replicas agree)."""
        digest = checkpoint.weights_digest(self.model)
        digests = [digest]
        if self.world_size > 1:
            digests = [None] * self.world_size
            dist.all_gather_object(digests, digest)
        h = self.history
        tok_s = h["tokens_per_s"][-1] if h["tokens_per_s"] else None
        return {
            "step": self.step,
            "loss": h["loss"][-1] if h["loss"] else None,
            "val_loss": h["val_loss"][-1] if h["val_loss"] else None,
            "tokens_per_s": tok_s,
            "mfu": self.mfu(tok_s) if tok_s else None,
            "device": str(self.device),
            "world_size": self.world_size,
            "weights_digests": digests,
            "losses": h["loss"],
        }


def log(message: str) -> None:
    """One line on stderr: warnings and notes that must not mix with the progress
    output."""
    print(message, file=sys.stderr, flush=True)


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


if __name__ == "__main__":  # the command line lives in smol.train_cli
    from smol.train_cli import main

    sys.exit(main())
