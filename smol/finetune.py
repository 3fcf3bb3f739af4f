"""Fine-tune SmolLM2 on conversations, fully or with LoRA, with the loss on the replies.

    python -m smol.finetune --data conversations.jsonl --lora-r 8 --out runs/ft
    python -m smol.finetune --data conversations.jsonl --lora-r 8 --out runs/ft --resume

The second line, after a stop (SIGTERM, Ctrl-C), continues the run: the same adapter,
bit for bit, as a run that was never stopped.

Each line of the JSONL file is one conversation, `{"messages": [{"role": "user",
"content": "..."}, {"role": "assistant", "content": "..."}]}`. The result is a merged
model folder (config.json, model.safetensors and the tokenizer) that
`smol.load_pretrained` and transformers' `from_pretrained` read, and with LoRA also the
adapter as peft saves it; each with a manifest.json of sha256 sums that smol checks at
load. The run's checkpoints are in OUT/training.

The command stands as `python -m smol.train` does: a usage error exits with status 2,
a failure while running with 1, each in one line; SIGTERM or Ctrl-C saves a checkpoint
and exits with 143 or 130, and --resume continues the run. A folder holding a model or
a run is not written over without --resume or --overwrite, nor is the model being
fine-tuned."""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
from pathlib import Path

import torch
import torch.distributed as dist

from smol.checkpoint import CheckpointError, check_writable, file_sha256, read_json
from smol.lora import (
    TARGETS,
    apply_lora,
    check_settings,
    count_trainable,
    merge_lora,
    save_peft_adapter,
)
from smol.model import IGNORE_INDEX
from smol.sft import ConversationBatches, check_messages, collate, encode_conversation
from smol.train import TrainConfig, Trainer, TrainingDiverged
from smol.train_cli import Parser, UsageError, fit_until_stopped, run_command
from smol.train_report import log

PROG = "python -m smol.finetune"
# what a fine-tune writes into --out: it is not written over unasked
OUTPUTS = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "manifest.json",
    "adapter",
    "training",
)
# the settings a resume must keep besides TrainConfig's (which smol.resume checks)
SETTINGS_FILE = "finetune.json"


def read_conversations(path: str | Path) -> list[list[dict]]:
    """The conversations of a JSONL file, one `{"messages": [...]}` object a line (blank
    lines are skipped). A malformed line raises a ValueError naming the file, the line
    number and what is wrong with it."""
    return list(_numbered_conversations(path).values())


def _numbered_conversations(path: str | Path) -> dict[int, list[dict]]:
    """{line number: conversation} of a JSONL file (see read_conversations)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path} (expected JSONL conversations)")
    conversations = {}
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8-sig" if n == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(
                    f"{path}, line {n}: not UTF-8 text (byte {e.start + 1} is "
                    f"{raw[e.start : e.start + 1]!r})"
                ) from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(
                    f"{path}, line {n}: not valid JSON ({e.msg})"
                ) from None
            if not isinstance(record, dict) or "messages" not in record:
                raise ValueError(
                    f'{path}, line {n}: expected an object {{"messages": [...]}}, '
                    f"got {line.strip()[:60]!r}"
                )
            try:
                conversations[n] = check_messages(record["messages"])
            except ValueError as e:
                raise ValueError(f"{path}, line {n}: {e}") from None
    if not conversations:
        raise ValueError(f"{path} holds no conversations")
    return conversations


class SFTTrainer(Trainer):
    """smol.train's Trainer on padded batches of conversations, the loss on the
    assistant's tokens; `model` is trained as given (with LoRA adapters only they
    train). Conversations are cut to seq_len + 1 tokens; those left without a reply
    are left out. By "training" and "validation", `dropped` holds the indices of those
    left out, `cut` counts the others that were cut."""

    def __init__(
        self, config: TrainConfig, model, tokenizer, train: list, val: list = ()
    ):
        self._conversations = (tokenizer, train, val)
        super().__init__(config, model=model)
        self.tokenizer = tokenizer

    def _load_data(self, train_tokens=None, val_tokens=None) -> None:
        tokenizer, train, val = self._conversations
        if tokenizer.pad_token_id is None:
            raise ValueError(
                "the tokenizer has no padding token (nor an eos to pad with)"
            )

        self.dropped, self.cut = {}, {}  # see the class's docstring

        def encode(conversations, what):
            n = self.cfg.seq_len + 1  # seq_len inputs, and the token after the last
            full = [encode_conversation(tokenizer, c) for c in conversations]
            self.dropped[what] = [
                i
                for i, (_, labels) in enumerate(full)
                if all(x == IGNORE_INDEX for x in labels[1:n])
            ]
            gone = set(self.dropped[what])
            kept = [example for i, example in enumerate(full) if i not in gone]
            if conversations and not kept:
                raise ValueError(
                    f"no {what} conversation has a reply within seq_len "
                    f"{self.cfg.seq_len} tokens: raise seq_len"
                )
            self.cut[what] = sum(len(ids) > n for ids, _ in kept)
            return [(ids[:n], labels[:n]) for ids, labels in kept]

        self.train_examples = encode(train, "training")
        self.val_examples = encode(val, "validation")
        self.train_batches = ConversationBatches(
            self.train_examples,
            self.cfg.batch_size,
            tokenizer.pad_token_id,
            seed=self.cfg.seed,
            rank=self.rank,
            world_size=self.world_size,
        )

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean loss per assistant token over the validation conversations (at most
        eval_batches batches of them); NaN when there are none."""
        if not self.val_examples:
            return float("nan")
        self.model.eval()
        B = self.cfg.batch_size
        n = min(self.cfg.eval_batches * B, len(self.val_examples))
        # loss sum, tokens
        sums = torch.zeros(2, device=self.device, dtype=torch.float64)
        for i, start in enumerate(range(0, n, B)):
            if i % self.world_size != self.rank:
                continue
            batch = collate(
                self.val_examples[start : min(n, start + B)],
                self.tokenizer.pad_token_id,
            )
            x, y, mask = (t.to(self.device) for t in batch)
            with self.autocast():
                _, loss = self.eval_model(x, y, mask)
            count = (y != -100).sum()
            sums += torch.stack([loss.double() * count, count.double()])
        if self.world_size > 1:
            dist.all_reduce(sums)
        self.model.train()
        return (sums[0] / sums[1]).item()

    def fit(self, until: int | None = None) -> dict:
        if self.cfg.eval_every > 0 and not self.val_examples:  # nothing to evaluate on
            self.cfg = dataclasses.replace(self.cfg, eval_every=0)
        return super().fit(until)


def _parse_args(argv) -> tuple[argparse.Namespace, TrainConfig]:
    p = Parser(prog=PROG, description=__doc__.split("\n")[0])
    p.add_argument(
        "--data", required=True, help='JSONL file, one {"messages": [...]} a line'
    )
    p.add_argument("--val-data", help="JSONL conversations for the validation loss")
    p.add_argument(
        "--model",
        help="a .gguf file, a Hugging Face folder or hub id "
        "(default: the bundled SmolLM2-135M-Instruct)",
    )
    p.add_argument(
        "--out", default="runs/finetuned", help="the merged model folder to write"
    )
    p.add_argument(
        "--lora-r", type=int, default=8, help="LoRA rank; 0: full fine-tuning"
    )
    p.add_argument("--lora-alpha", type=float, help="LoRA alpha (default: 2 * r)")
    p.add_argument("--lora-dropout", type=float, help="(default: 0)")
    p.add_argument(
        "--lora-targets",
        help=f"comma-separated layer names, from {','.join(TARGETS)} (default: all)",
    )
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument(
        "--max-len", type=int, default=512, help="tokens per conversation (truncated)"
    )
    p.add_argument(
        "--lr", type=float, help="peak learning rate (default: 1e-3 LoRA, 5e-5 full)"
    )
    p.add_argument("--warmup-steps", type=int, default=10)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument(
        "--ckpt-every", type=int, default=0, help="steps between checkpoints (0: end)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto", help="auto, bf16, fp16 or fp32")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument(
        "--resume",
        nargs="?",
        const="latest",
        default=False,
        metavar="PATH",
        help="continue the run in OUT from its newest intact checkpoint, or from the "
        "checkpoint folder PATH",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="start over in an OUT that holds a fine-tune, replacing it",
    )
    p.add_argument(
        "--allow-changed-settings",
        action="store_true",
        help="resume with settings that differ from the run's",
    )
    args = p.parse_args(argv)
    _check_args(args)
    try:
        return args, _train_config(args)
    except ValueError as e:
        raise UsageError(str(e)) from None


def _check_args(args) -> None:
    """Refuse what cannot work, before any work (UsageError: exit status 2)."""
    if args.lora_r < 0:
        raise UsageError(
            f"--lora-r must be >= 0 (0: full fine-tuning), got {args.lora_r}"
        )
    given = [
        "--" + name.replace("_", "-")
        for name in ("lora_alpha", "lora_dropout", "lora_targets")
        if getattr(args, name) is not None
    ]
    if args.lora_r == 0 and given:
        raise UsageError(
            f"{', '.join(given)} set LoRA, but --lora-r 0 trains every weight "
            "without it: leave them out, or give a rank"
        )
    if args.lora_r:
        if args.lora_alpha is None:
            args.lora_alpha = 2.0 * args.lora_r
        args.lora_dropout = args.lora_dropout or 0.0
        names = (args.lora_targets or ",".join(TARGETS)).split(",")
        try:
            targets = check_settings(
                args.lora_r,
                args.lora_alpha,
                args.lora_dropout,
                [t.strip() for t in names],
            )
        except ValueError as e:
            raise UsageError(str(e)) from None
        args.lora_targets = list(targets)
    if not args.out:
        raise UsageError("--out is empty: name the folder to write the model to")
    if args.model and Path(args.model).resolve() == Path(args.out).resolve():
        raise UsageError(
            f"--out {args.out} is the model being fine-tuned: write elsewhere"
        )


def _train_config(args) -> TrainConfig:
    """The fine-tuning run's settings: the learning rate by default 1e-3 with LoRA,
    5e-5 for full fine-tuning, decaying to a tenth of it. No preset: the Trainer checks
    --max-len against the loaded model's context."""
    lr = args.lr if args.lr is not None else (1e-3 if args.lora_r else 5e-5)
    return TrainConfig(
        preset=None,
        steps=args.steps,
        batch_size=args.batch_size,
        seq_len=args.max_len,
        grad_accum=args.grad_accum,
        lr=lr,
        min_lr=lr / 10,
        warmup_steps=min(args.warmup_steps, args.steps),
        weight_decay=args.weight_decay,
        eval_every=args.eval_every,
        log_every=args.log_every,
        ckpt_every=args.ckpt_every,
        out_dir=str(Path(args.out) / "training"),
        seed=args.seed,
        device=args.device,
        dtype=args.dtype,
        progress=args.progress,
        resume=args.resume,
        overwrite=args.overwrite,
        allow_changed_settings=args.allow_changed_settings,
    )


def main(argv=None) -> int:
    return run_command(PROG, lambda: _parse_args(argv), _finetune, FAILURES)


# Failures while running: one line on stderr, exit status 1.
FAILURES = (ValueError, OSError, CheckpointError, TrainingDiverged)


def _finetune(settings: tuple[argparse.Namespace, TrainConfig]) -> int:
    args, cfg = settings
    train = _numbered_conversations(args.data)
    val = _numbered_conversations(args.val_data) if args.val_data else {}
    out = Path(args.out)
    _check_out(args, out)
    run = _run_settings(args)
    if args.resume:
        _check_resumed_settings(args, run, out)

    def start() -> SFTTrainer:
        from smol.pretrained import load_pretrained

        device = None if args.device == "auto" else args.device
        model, tokenizer = load_pretrained(args.model, device=device)
        context = model.config.max_position_embeddings
        if args.max_len > context:
            raise ValueError(
                f"--max-len {args.max_len} is longer than the model's context of "
                f"{context} tokens"
            )
        torch.manual_seed(args.seed)  # LoRA's A matrices are drawn here
        if args.lora_r:
            apply_lora(
                model,
                args.lora_r,
                args.lora_alpha,
                args.lora_targets,
                args.lora_dropout,
            )
        model.train()
        trainer = SFTTrainer(
            cfg, model, tokenizer, list(train.values()), list(val.values())
        )
        if trainer.is_main:
            if args.overwrite:
                _clear_outputs(out)
            if not args.resume:
                (out / "training" / SETTINGS_FILE).write_text(
                    json.dumps(run, indent=1), encoding="utf-8"
                )
            _report_data(trainer, args, train, val)
        return trainer

    def finish(trainer: SFTTrainer, history: dict) -> None:
        if trainer.is_main:
            _save(trainer, history, args, out)

    return fit_until_stopped(start, finish)


def _check_out(args, out: Path) -> None:
    """--out must be writable and hold no fine-tune, unless one is resumed or
    overwritten."""
    found = [name for name in OUTPUTS if (out / name).exists()]
    if found and not (args.resume or args.overwrite):
        shown = ", ".join(found[:3]) + (", ..." if len(found) > 3 else "")
        raise FileExistsError(
            f"--out {out} already holds a fine-tune ({shown}): choose "
            "another folder, continue its run with --resume, or replace it with "
            "--overwrite"
        )
    check_writable(out, "--out")


def _clear_outputs(out: Path) -> None:
    """Delete the merged model and adapter of the fine-tune that --overwrite replaces
    (its checkpoints are gone already: smol.resume.prepare_out_dir)."""
    gone = [n for n in OUTPUTS if n != "training" and (out / n).exists()]
    for name in gone:
        if (out / name).is_dir():
            shutil.rmtree(out / name)
        else:
            (out / name).unlink()
    if gone:
        log(f"overwrite: deleted the previous fine-tune's {', '.join(gone)} in {out}")


def _run_settings(args) -> dict:
    """What a resume must keep besides TrainConfig's settings: the model, the data
    (its files' sha256) and LoRA's settings."""
    model = args.model
    if model is not None and Path(model).exists():  # a path, however it is spelt
        model = str(Path(model).resolve())
    return {
        "model": model,
        "data": file_sha256(Path(args.data)),
        "val_data": file_sha256(Path(args.val_data)) if args.val_data else None,
        "lora_r": args.lora_r,
        "lora_alpha": args.lora_alpha,
        "lora_dropout": args.lora_dropout,
        "lora_targets": args.lora_targets,
    }


def _check_resumed_settings(args, run: dict, out: Path) -> None:
    path = out / "training" / SETTINGS_FILE
    if not path.is_file():
        return  # no run to compare with: Trainer says there is nothing to resume
    saved = read_json(path)
    if not isinstance(saved, dict):
        raise ValueError(f"{path}: expected a JSON object of settings")
    changed = [
        f"{k}: the run's {saved.get(k)!r}, now {v!r}"
        for k, v in run.items()
        if saved.get(k) != v
    ]
    if not changed:
        return
    if not args.allow_changed_settings:
        raise ValueError(
            "resuming would not continue the same fine-tune: "
            f"{'; '.join(changed)}; resume with the run's settings, or pass "
            "--allow-changed-settings to continue anyway"
        )
    log(f"warning: resuming with changed settings: {'; '.join(changed)}")


def _report_data(trainer: SFTTrainer, args, train: dict, val: dict) -> None:
    """The conversations trained on, and a warning naming (by line) those left out
    or cut for length."""
    for what, path, lines in (
        ("training", args.data, list(train)),
        ("validation", args.val_data, list(val)),
    ):
        dropped = [lines[i] for i in trainer.dropped.get(what, [])]
        if dropped:
            shown = ", ".join(map(str, dropped[:10])) + (
                " ..." if len(dropped) > 10 else ""
            )
            log(
                f"warning: {len(dropped)} of {len(lines)} {what} conversations have no "
                f"reply within --max-len {args.max_len} tokens and are left out: "
                f"{path}, lines {shown}"
            )
        if trainer.cut.get(what):
            log(
                f"note: {trainer.cut[what]} {what} conversations are longer than "
                f"--max-len {args.max_len} tokens and are cut to it"
            )
    how = f"LoRA r={args.lora_r}" if args.lora_r else "full fine-tuning"
    trainable, total = count_trainable(trainer.model)
    print(
        f"{len(trainer.train_examples)} training conversations, "
        f"{len(trainer.val_examples)} validation; training {trainable:,} of "
        f"{total:,} parameters ({how}), {trainer.device}, from step {trainer.step}",
        flush=True,
    )


def _save(trainer: SFTTrainer, history: dict, args, out: Path) -> None:
    """The adapter (with LoRA) and the merged model, into out."""
    from smol.pretrained import save_pretrained

    model = trainer.model
    if args.lora_r:
        save_peft_adapter(model, out / "adapter", args.model)
        merge_lora(model)
    save_pretrained(model.float().eval(), trainer.tokenizer, out)
    val_loss = history["val_loss"]
    val_text = f", val loss {val_loss[-1]:.4f}" if val_loss else ""
    print(
        f"done: step {trainer.step}, loss {history['loss'][-1]:.4f}{val_text}; "
        f"the merged model is in {out}",
        flush=True,
    )


if __name__ == "__main__":
    import sys

    sys.exit(main())
