"""Training: the loop around the optimisation recipe (smol.optim), with evaluation,
samples, checkpoints that resume exactly (smol.checkpoint, smol.resume), throughput and
MFU (smol.flops), clean stops on SIGTERM and Ctrl-C (smol.interrupt), and DDP. The
settings are smol.train_config's TrainConfig.

    smol train --preset tiny --steps 300 --out-dir runs/tiny
    torchrun --nproc_per_node=2 -m smol train --preset tiny --out-dir runs/ddp
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
import time
import uuid
from pathlib import Path

import torch
import torch.distributed as dist

# smol/__init__.py has imported it without its IProgress notice
from tqdm.auto import tqdm

from smol import checkpoint, data, flops, resume, shards, train_report
from smol.distributed import (
    on_main_rank,
    setup_distributed,
    training_device,
    wrap_for_training,
)
from smol.interrupt import TrainingInterrupted, any_rank_caught, stop_on_signals
from smol.model import SmolLM
from smol.optim import adamw, amp_dtype, param_groups
from smol.run_inputs import init_model
from smol.train_config import TrainConfig

# TrainingDiverged and plot_history are imported from here too
from smol.train_report import TrainingDiverged, log, plot_history  # noqa: F401


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
        """`model`: train this model (pretrained, say, or with LoRA adapters) in place
        of a fresh SmolLM of config.preset; its parameters that do not require grad
        stay frozen. config.init loads the weights (and tokenizer) named there."""
        config.validate()  # again: fields may have been set after it was made
        own_tokenizer = None
        if model is None and config.init:
            model, own_tokenizer = init_model(config)
        self.model_config = mc = (
            config.model_config() if model is None else model.config
        )
        if config.seq_len > mc.max_position_embeddings:
            raise ValueError(
                f"seq_len {config.seq_len} is longer than the model's context "
                f"(max_position_embeddings={mc.max_position_embeddings})"
            )
        self.cfg = cfg = config.with_tokenizer(mc.vocab_size)
        self.rank, self.world_size, local_rank = setup_distributed(cfg.device)
        self.device = training_device(cfg.device, local_rank)
        # before any work, not when the first save fails
        prepare = functools.partial(resume.prepare_out_dir, cfg, self.checkpoint_root)
        on_main_rank(prepare, self.rank, self.world_size)
        # the model's own tokenizer (init), and what the data is (smol.shards)
        self.own_tokenizer, self.data_info = own_tokenizer, None
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
        self.ddp, self.train_model, self.eval_model = wrap_for_training(
            self.model, self.device, local_rank, self.world_size, cfg.compile
        )

        self.step = 0
        self.run_id = uuid.uuid4().hex[:12]  # a resume takes the checkpoint's
        names = ("step", "loss", "lr", "val_step", "val_loss", "tokens_per_s")
        self.history = {name: [] for name in names}
        self.last_checkpoint: Path | None = None
        self.tokens_per_step = (
            cfg.batch_size * cfg.seq_len * cfg.grad_accum * self.world_size
        )
        self.flops_per_token = flops.flops_per_token(mc, cfg.seq_len)
        fp32 = self.amp_dtype == torch.float32
        self.peak = None if fp32 else flops.peak_flops(self.device)
        if cfg.resume:
            self.load_checkpoint(None if cfg.resume in (True, "latest") else cfg.resume)

    def _load_data(self, train_tokens, val_tokens) -> None:
        """This rank's training batches and the validation windows: the streams given,
        else cfg.data's token shards (smol.shards), else the plays, tokenized with the
        model's own tokenizer (init) or cfg.tokenizer."""
        cfg, vocab_size = self.cfg, self.model_config.vocab_size
        tokenizer, stream = self.own_tokenizer, None
        if cfg.data and train_tokens is None and val_tokens is None:
            self.tokenizer, train_tokens, val_tokens, self.data_info = (
                shards.training_streams(
                    cfg, vocab_size, self.rank, self.world_size, tokenizer
                )
            )
            stream = self.data_info["stream"]
        else:
            self.tokenizer, train_tokens, val_tokens = data.corpus_streams(
                tokenizer or cfg.tokenizer, vocab_size, train_tokens, val_tokens
            )
        self.train_batches = data.Batches(
            data.PackedWindows(
                train_tokens, cfg.seq_len, seed=cfg.seed, identity=stream
            ),
            cfg.batch_size,
            self.rank,
            self.world_size,
        )
        self.val_windows = data.PackedWindows(val_tokens, cfg.seq_len, shuffle=False)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def lr(self, step: int) -> float:
        return self.cfg.lr_at(step)

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
        with stop_on_signals(self._note_signal) as caught:
            return self._fit(until, caught)

    def _note_signal(self, name: str) -> None:
        if self.is_main:
            log(
                f"{name} received: saving a checkpoint after step {self.step + 1}, "
                "then stopping (send it again to stop at once)"
            )

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
        # (step, lr, loss) of the steps whose loss is not yet read back
        pending: list[tuple[int, float, torch.Tensor]] = []
        clock, tokens = time.perf_counter(), 0
        while self.step < end:
            lr = self.lr(self.step)
            pending.append((self.step + 1, lr, self.train_step()))
            tokens += self.tokens_per_step
            due = self._due(end, caught)
            if not any(due.values()):
                continue  # losses stay on the device: no sync between logs
            due["stop"] = self._read_back(pending, due, caught)
            train_report.show_progress(self, bar, len(pending), tokens, clock)
            pending = []
            self._at_boundary(due, bar, end, caught)
            # evals, samples and saves are not training time
            clock, tokens = time.perf_counter(), 0
        bar.close()
        return self.history

    def _due(self, end: int, caught: list[str]) -> dict[str, bool]:
        """What the step just taken calls for: reading back and logging the losses,
        an evaluation, a sample, a checkpoint, a stop."""
        cfg, step = self.cfg, self.step

        def every(n: int) -> bool:
            return n > 0 and step % n == 0

        # the last step always evaluates, when evaluating at all
        last_eval = cfg.eval_every > 0 and step == cfg.steps
        return {
            "log": every(cfg.log_every) or step == end,
            "evaluate": every(cfg.eval_every) or last_eval,
            "save": every(cfg.ckpt_every) or step == end,
            "sample": self.is_main and every(cfg.sample_every),
            "stop": bool(caught) and self.world_size == 1,
        }

    def _read_back(self, pending, due: dict[str, bool], caught: list[str]) -> bool:
        """Read the pending losses into the history and wait for the device; returns
        whether to stop, which under DDP the ranks agree on at steps where they all
        sync (the same steps on every rank)."""
        # raises TrainingDiverged on a NaN loss, before anything is saved
        train_report.record_losses(self, pending)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        if self.world_size > 1 and (due["log"] or due["evaluate"] or due["save"]):
            return any_rank_caught(caught, self.device)
        return due["stop"]

    def _at_boundary(self, due: dict[str, bool], bar, end: int, caught) -> None:
        """Evaluate, sample and save as `due` says; on a stop before `end`, raise
        TrainingInterrupted once the checkpoint is saved."""
        if due["evaluate"]:
            val = self.evaluate()
            if not math.isfinite(val):
                raise train_report.diverged(self, "the validation loss", val)
            self.history["val_step"].append(self.step)
            self.history["val_loss"].append(val)
            if self.is_main and self.cfg.progress:
                bar.write(f"step {self.step}: val loss {val:.4f}")
        if due["sample"]:
            bar.write(f"step {self.step} sample: {self.sample()!r}")
        if due["save"] or due["stop"]:
            train_report.check_weights(self)  # no checkpoint of diverged weights
            self.save_checkpoint()
        if due["stop"] and self.step < end:
            bar.close()
            signal_name = caught[0] if caught else "a signal to another rank"
            raise TrainingInterrupted(signal_name, self.step, self.last_checkpoint)

    def train_step(self) -> torch.Tensor:
        """One optimizer step over grad_accum micro-batches; returns the mean loss (a
        0-d tensor)."""
        lr = self.lr(self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.model.train()
        total = torch.zeros((), device=self.device)
        for micro in range(self.cfg.grad_accum):
            batch = next(self.train_batches)
            last = micro == self.cfg.grad_accum - 1
            # DDP averages gradients across ranks during backward; skip it until the
            # last micro-batch.
            sync = (
                self.ddp.no_sync()
                if self.ddp is not None and not last
                else contextlib.nullcontext()
            )
            with sync:
                loss = self.batch_loss(batch)
                # the sum over micro-batches is the mean over the batch
                loss = loss / self.cfg.grad_accum
                self.scaler.scale(loss).backward()
            total += loss.detach()
        # clip the true gradients, not the fp16-scaled ones
        self.scaler.unscale_(self.optimizer)
        if self.cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        # report the mean over all ranks, as one process would see it
        if self.world_size > 1:
            dist.all_reduce(total)
            total /= self.world_size
        return total

    def batch_loss(self, batch) -> torch.Tensor:
        """The loss of one micro-batch, a 0-d tensor that backward starts from: the
        model's next-token loss, which a subclass may replace (DPO's, say)."""
        # (B, T) each; a mask (B, T) with padded batches
        x, y, *mask = (t.to(self.device, non_blocking=True) for t in batch)
        with self.autocast():
            _, loss = self.train_model(x, y, *mask)
        return loss

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean loss over the first eval_batches global batches of the validation
        windows, in order (the same windows for any number of ranks, which share the
        micro-batches)."""
        self.model.eval()
        B = self.cfg.batch_size
        n = min(self.cfg.eval_batches * B * self.world_size, len(self.val_windows))
        # loss * tokens, tokens
        sums = torch.zeros(2, device=self.device, dtype=torch.float64)
        for i, start in enumerate(range(0, n, B)):
            if i % self.world_size != self.rank:
                continue
            windows = self.val_windows.windows(start, min(B, n - start))
            x, y = (t.to(self.device) for t in data.next_token_targets(windows))
            with self.autocast():
                _, loss = self.eval_model(x, y)
            sums[0] += loss.double() * y.numel()
            sums[1] += y.numel()
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
        (training's RNG is untouched); in float32: a few tokens, no need for speed."""
        from smol.generate import generate

        if self.tokenizer is None:
            raise RuntimeError(
                "sampling needs a tokenizer: this trainer was given token tensors"
            )
        prompt = self.cfg.sample_prompt if prompt is None else prompt
        ids = torch.tensor([self.tokenizer.encode(prompt)], device=self.device)
        out = generate(
            self.model,
            ids,  # (1, T)
            max_new_tokens or self.cfg.sample_tokens,
            temperature=temperature,
            top_k=top_k,
            generator=torch.Generator(self.device).manual_seed(seed),
        )
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
            resume.save_trainer(self, self.checkpoint_root)
        if self.world_size > 1:
            dist.barrier()
        self.last_checkpoint = checkpoint.step_dir(self.checkpoint_root, self.step)
        return self.last_checkpoint

    def load_checkpoint(self, path: str | Path | None = None) -> Path:
        """Restore everything save_checkpoint wrote. `path`: a checkpoint folder, taken
        as it is (a damaged one is an error); or a folder of checkpoints (None:
        out_dir's), whose newest intact one is taken, saying which damaged ones it
        skipped."""
        path = self.checkpoint_root if path is None else path
        path = resume.find_checkpoint(path, warn=self.is_main)
        resume.restore_trainer(self, path, self.cfg.allow_changed_settings)
        self.last_checkpoint = Path(path)
        return self.last_checkpoint

    def summary(self) -> dict:
        """Final numbers; under DDP also every rank's weights digest (all equal when
        replicas agree)."""
        summary = train_report.summary(self)
        if self.data_info is not None:
            summary["data"] = self.data_info
        return summary


if __name__ == "__main__":  # `python -m smol.train` runs no command
    print("smol.train is a library module: run `smol train`", file=sys.stderr)
    raise SystemExit(2)
