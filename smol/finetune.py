"""Fine-tuning on conversations: read a JSONL file of them, and smol.train's Trainer on
padded batches of them with the loss on the replies (SFTTrainer), the model trained
fully or with LoRA adapters (smol.lora). The command is `smol finetune`
(smol/commands/finetune.py).

Each line of the JSONL file is one conversation, `{"messages": [{"role": "user",
"content": "..."}, {"role": "assistant", "content": "..."}]}`."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from smol.model import IGNORE_INDEX
from smol.sft import ConversationBatches, check_messages, collate, encode_conversation
from smol.train import TrainConfig, Trainer


def read_conversations(path: str | Path) -> list[list[dict]]:
    """The conversations of a JSONL file, one `{"messages": [...]}` object a line (blank
    lines are skipped). A malformed line raises a ValueError naming the file, the line
    number and what is wrong with it."""
    return list(numbered_conversations(path).values())


def numbered_conversations(path: str | Path) -> dict[int, list[dict]]:
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


if __name__ == "__main__":  # `python -m smol.finetune` runs no command
    print("smol.finetune is a library module: run `smol finetune`", file=sys.stderr)
    raise SystemExit(2)
