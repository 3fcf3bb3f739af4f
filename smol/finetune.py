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
from smol.sft import (
    ConversationBatches,
    _show,
    check_messages,
    collate,
    encode_conversation,
)
from smol.train import TrainConfig, Trainer


def read_conversations(path: str | Path) -> list[list[dict]]:
    """The conversations of a JSONL file, one `{"messages": [...]}` object a line (blank
    lines are skipped). A malformed line raises a ValueError naming the file, the line
    number and what is wrong with it."""
    return list(numbered_conversations(path).values())


def numbered_conversations(path: str | Path) -> dict[int, list[dict]]:
    """{line number: conversation} of a JSONL file (see read_conversations)."""
    return numbered_records(path, "conversations", _messages)


def _messages(record) -> list[dict]:
    if not isinstance(record, dict) or "messages" not in record:
        raise ValueError(
            f'expected an object {{"messages": [...]}}, got {_show(record)}'
        )
    return check_messages(record["messages"])


def numbered_records(path: str | Path, what: str, check) -> dict:
    """{line number: check(the line's JSON value)} of a JSONL file of `what`, blank
    lines skipped. A line that is not UTF-8 or JSON, or that check refuses with a
    ValueError, raises a ValueError naming the file, the line number and what is wrong
    with it; so does a file that holds nothing."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path} (expected JSONL {what})")
    records = {}
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
                records[n] = check(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(
                    f"{path}, line {n}: not valid JSON ({e.msg})"
                ) from None
            except ValueError as e:
                raise ValueError(f"{path}, line {n}: {e}") from None
    if not records:
        raise ValueError(f"{path} holds no {what}")
    return records


class SFTTrainer(Trainer):
    """smol.train's Trainer on padded batches of conversations, the loss on the
    assistant's tokens; `model` is trained as given (with LoRA adapters only they
    train). Conversations are cut to seq_len + 1 tokens; those left without a reply
    are left out. By "training" and "validation", `dropped` holds the indices of those
    left out, `cut` counts the others that were cut.

    smol.dpo's DPOTrainer is this trainer on preference pairs: it changes what an
    example is (encode_example, Batches, too_long) and the loss."""

    Batches = ConversationBatches  # endless batches of the encoded examples
    too_long = "no {what} conversation has a reply within seq_len {seq_len} tokens"

    def __init__(
        self, config: TrainConfig, model, tokenizer, train: list, val: list = ()
    ):
        self.tokenizer, self._examples = tokenizer, (train, val)
        super().__init__(config, model=model)

    def encode_example(self, conversation, n: int):
        """(the example as trained on, cut to n tokens; its (ids, labels) sequences
        uncut): a conversation is one sequence."""
        ids, labels = encode_conversation(self.tokenizer, conversation)
        return (ids[:n], labels[:n]), [(ids, labels)]

    def _load_data(self, train_tokens=None, val_tokens=None) -> None:
        if self.tokenizer.pad_token_id is None:
            raise ValueError(
                "the tokenizer has no padding token (nor an eos to pad with)"
            )
        self.dropped, self.cut = {}, {}  # see the class's docstring
        n = self.cfg.seq_len + 1  # seq_len inputs, and the token after the last

        def encode(examples, what):
            full = [self.encode_example(example, n) for example in examples]
            self.dropped[what] = [  # a sequence with no label left to predict
                i
                for i, (_, sequences) in enumerate(full)
                if any(all(t == IGNORE_INDEX for t in lab[1:n]) for _, lab in sequences)
            ]
            gone = set(self.dropped[what])
            kept = [example for i, example in enumerate(full) if i not in gone]
            if examples and not kept:
                message = self.too_long.format(what=what, seq_len=self.cfg.seq_len)
                raise ValueError(f"{message}: raise seq_len")
            self.cut[what] = sum(any(len(ids) > n for ids, _ in s) for _, s in kept)
            return [example for example, _ in kept]

        self.train_examples = encode(self._examples[0], "training")
        self.val_examples = encode(self._examples[1], "validation")
        self.train_batches = self.Batches(
            self.train_examples,
            self.cfg.batch_size,
            self.tokenizer.pad_token_id,
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
        loss, tokens = self.validation_sums(2, self._loss_and_tokens)
        return (loss / tokens).item()

    def _loss_and_tokens(self, chunk: list) -> torch.Tensor:
        batch = collate(chunk, self.tokenizer.pad_token_id)
        x, y, mask = (t.to(self.device) for t in batch)
        with self.autocast():
            _, loss = self.eval_model(x, y, mask)
        count = (y != IGNORE_INDEX).sum()
        return torch.stack([loss.double() * count, count.double()])

    @torch.no_grad()
    def validation_sums(self, size: int, sums) -> torch.Tensor:
        """(size,) float64: sums(a batch of validation examples), added up over at most
        eval_batches batches of them, shared out among the ranks, the model in eval
        mode."""
        self.model.eval()
        B = self.cfg.batch_size
        n = min(self.cfg.eval_batches * B, len(self.val_examples))
        total = torch.zeros(size, device=self.device, dtype=torch.float64)
        for i, start in enumerate(range(0, n, B)):
            if i % self.world_size == self.rank:
                total += sums(self.val_examples[start : min(n, start + B)])
        if self.world_size > 1:
            dist.all_reduce(total)
        self.model.train()
        return total

    def fit(self, until: int | None = None) -> dict:
        if self.cfg.eval_every > 0 and not self.val_examples:  # nothing to evaluate on
            self.cfg = dataclasses.replace(self.cfg, eval_every=0)
        return super().fit(until)


if __name__ == "__main__":  # `python -m smol.finetune` runs no command
    print("smol.finetune is a library module: run `smol finetune`", file=sys.stderr)
    raise SystemExit(2)
