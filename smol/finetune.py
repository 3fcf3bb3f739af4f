"""Fine-tune SmolLM2 on conversations, fully or with LoRA, with the loss on the replies.

python -m smol.finetune --data conversations.jsonl --lora-r 8 --steps 200 --out runs/ft

Each line of the JSONL file is one conversation, `{"messages": [{"role": "user",
"content": "..."}, {"role": "assistant", "content": "..."}]}`. The result is a merged
model folder (config.json, model.safetensors and the tokenizer) that
`smol.load_pretrained` and transformers' `from_pretrained` read, and with LoRA also the
adapter as peft saves it."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from smol.checkpoint import CheckpointError
from smol.lora import (
    TARGETS,
    apply_lora,
    count_trainable,
    merge_lora,
    save_peft_adapter,
)
from smol.sft import ConversationBatches, check_messages, collate, encode_conversation
from smol.train import TrainConfig, Trainer, TrainingDiverged
from smol.train_cli import run_command


def read_conversations(path: str | Path) -> list[list[dict]]:
    """The conversations of a JSONL file, one `{"messages": [...]}` object a line (blank
    lines are skipped). A malformed line raises a ValueError naming the file, the line
    number and what is wrong with it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path} (expected JSONL conversations)")
    conversations = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
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
                conversations.append(check_messages(record["messages"]))
            except ValueError as e:
                raise ValueError(f"{path}, line {n}: {e}") from None
    if not conversations:
        raise ValueError(f"{path} holds no conversations")
    return conversations


class SFTTrainer(Trainer):
    """smol.train's Trainer on padded batches of conversations, the loss on the
    assistant's tokens; `model` is trained as given (with LoRA adapters only they
    train)."""

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

        def encode(conversations, what):
            out = [
                encode_conversation(tokenizer, c, self.cfg.seq_len + 1)
                for c in conversations
            ]
            kept = [
                (ids, labels)
                for ids, labels in out
                if any(x != -100 for x in labels[1:])
            ]
            if conversations and not kept:
                raise ValueError(
                    f"no {what} conversation has a reply within seq_len "
                    f"{self.cfg.seq_len} tokens: raise seq_len"
                )
            return kept

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


def _parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m smol.finetune", description=__doc__.split("\n")[0]
    )
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
    p.add_argument("--lora-dropout", type=float, default=0.0)
    p.add_argument(
        "--lora-targets",
        default=",".join(TARGETS),
        help=f"comma-separated layer names, from {','.join(TARGETS)}",
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
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto", help="auto, bf16, fp16 or fp32")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True)
    args = p.parse_args(argv)
    if args.lora_r < 0:
        p.error(f"--lora-r must be >= 0 (0: full fine-tuning), got {args.lora_r}")
    return args


def main(argv=None) -> int:
    args = _parse_args(argv)
    return run_command(lambda: _finetune(args), FAILURES)


# Failures while running: one line on stderr, exit status 1.
FAILURES = (ValueError, FileNotFoundError, CheckpointError, TrainingDiverged)


def _finetune(args) -> int:
    from smol.pretrained import load_pretrained, save_pretrained

    train = read_conversations(args.data)
    val = read_conversations(args.val_data) if args.val_data else []
    lora, out = args.lora_r > 0, Path(args.out)
    cfg = _train_config(args, lora)
    device = None if args.device == "auto" else args.device
    model, tokenizer = load_pretrained(args.model, device=device)
    if lora:
        targets = [t.strip() for t in args.lora_targets.split(",") if t.strip()]
        alpha = args.lora_alpha if args.lora_alpha is not None else 2.0 * args.lora_r
        apply_lora(model, args.lora_r, alpha, targets, args.lora_dropout)
    model.train()
    trainable, total = count_trainable(model)
    trainer = SFTTrainer(cfg, model, tokenizer, train, val)
    if trainer.is_main:
        how = f"LoRA r={args.lora_r}" if lora else "full fine-tuning"
        print(
            f"{len(trainer.train_examples)} training conversations, "
            f"{len(val)} validation; training {trainable:,} of {total:,} parameters "
            f"({how}), {trainer.device}",
            flush=True,
        )
    history = trainer.fit()
    if not trainer.is_main:
        return 0
    if lora:
        save_peft_adapter(model, out / "adapter", args.model)
        merge_lora(model)
    save_pretrained(model.float().eval(), tokenizer, out)
    val_loss = history["val_loss"]
    val_text = f", val loss {val_loss[-1]:.4f}" if val_loss else ""
    print(
        f"done: step {trainer.step}, loss {history['loss'][-1]:.4f}{val_text}; "
        f"the merged model is in {out}",
        flush=True,
    )
    return 0


def _train_config(args, lora: bool) -> TrainConfig:
    """The fine-tuning run's settings: the learning rate by default 1e-3 with LoRA,
    5e-5 for full fine-tuning, decaying to a tenth of it."""
    lr = args.lr if args.lr is not None else (1e-3 if lora else 5e-5)
    return TrainConfig(
        steps=args.steps,
        batch_size=args.batch_size,
        seq_len=args.max_len,
        grad_accum=args.grad_accum,
        lr=lr,
        min_lr=lr / 10,
        warmup_steps=min(args.warmup_steps, args.steps),
        weight_decay=args.weight_decay,
        eval_every=args.eval_every,
        out_dir=str(Path(args.out) / "training"),
        seed=args.seed,
        device=args.device,
        dtype=args.dtype,
        progress=args.progress,
    )


if __name__ == "__main__":
    sys.exit(main())
