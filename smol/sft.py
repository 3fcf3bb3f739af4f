"""Supervised fine-tuning data: conversations in the chat template, loss on the replies.

A conversation is a list of messages, `{"role": "user", "content": "..."}`, as chat
models take them. It is rendered with the tokenizer's chat template (ChatML for
SmolLM2), tokenized once, and every token that the assistant wrote, its closing
`<|im_end|>` included, is a target; the system prompt, the user's turns and the
`<|im_start|>assistant` headers are context only (target -100, which the loss ignores).
"""

from __future__ import annotations

import torch

from smol.model import IGNORE_INDEX

ROLES = ("system", "user", "assistant")


def check_messages(messages) -> list[dict]:
    """The messages, checked: a non-empty list of {"role", "content"} dicts with a known
    role and text content, a system message only first, and at least one assistant
    message, not the first. Raises a ValueError saying what is wrong."""
    if not isinstance(messages, list) or not messages:
        raise ValueError(
            f"messages must be a non-empty list of dicts, got {_show(messages)}"
        )
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ValueError(
                f"message {i} must be a dict with 'role' and 'content', got {_show(m)}"
            )
        missing = [k for k in ("role", "content") if k not in m]
        if missing:
            raise ValueError(
                f"message {i} has no {' or '.join(map(repr, missing))}: {_show(m)}"
            )
        if m["role"] not in ROLES:
            raise ValueError(
                f"message {i} has role {m['role']!r}; expected one of {ROLES}"
            )
        if not isinstance(m["content"], str):
            raise ValueError(
                f"message {i} content must be a string, "
                f"got {type(m['content']).__name__}"
            )
        if m["role"] == "system" and i > 0:
            raise ValueError(
                f"message {i} is a system message: only the first may be one"
            )
    if messages[0]["role"] == "assistant":
        # the chat template puts its default system prompt before it: the reply's
        # tokens could not be told from the prompt's
        raise ValueError(
            "message 0 is the assistant's: a conversation opens with a user (or "
            "system) message"
        )
    if not any(m["role"] == "assistant" for m in messages):
        raise ValueError(
            "the conversation has no assistant message: nothing to learn from"
        )
    return messages


def _show(value, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def encode_conversation(tokenizer, messages, max_len: int | None = None):
    """(ids, labels), two lists of ints: the rendered conversation's token ids, and the
    same ids where the assistant wrote them, -100 elsewhere. max_len truncates both."""
    check_messages(messages)
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=False)
    spans = []  # character spans of the assistant's replies, <|im_end|> included
    for k, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        # k > 0: check_messages refuses a conversation that opens with a reply
        prompt = tokenizer.apply_chat_template(messages[:k], add_generation_prompt=True)
        upto = tokenizer.apply_chat_template(
            messages[: k + 1], add_generation_prompt=False
        )
        if not (text.startswith(upto) and upto.startswith(prompt)):
            raise ValueError(
                "the chat template does not render a conversation as the "
                "concatenation of its turns; cannot find the assistant's tokens"
            )
        spans.append(
            (len(prompt), len(upto.rstrip()))
        )  # the reply, not the newline after it
    encoding = tokenizer.backend.encode(text, add_special_tokens=False)
    ids = encoding.ids
    labels = [
        i if any(a <= start and end <= b for a, b in spans) else IGNORE_INDEX
        for i, (start, end) in zip(ids, encoding.offsets)
    ]
    if max_len is not None:
        ids, labels = ids[:max_len], labels[:max_len]
    return ids, labels


def collate(examples, pad_id: int):
    """Right-padded batch of (ids, labels) examples -> input_ids, targets,
    attention_mask, each (B, T) with T the longest example's length - 1. targets are
    shifted (targets[:, t] is the label of token t + 1) and -100 on padding;
    attention_mask is 0 on padding."""
    if not examples:
        raise ValueError("collate needs at least one example")
    T = max(len(ids) for ids, _ in examples) - 1
    if T < 1:
        raise ValueError("every example has fewer than 2 tokens: nothing to predict")
    B = len(examples)
    input_ids = torch.full((B, T), pad_id, dtype=torch.long)
    targets = torch.full((B, T), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros(B, T, dtype=torch.long)
    for b, (ids, labels) in enumerate(examples):
        n = len(ids) - 1
        input_ids[b, :n] = torch.tensor(ids[:-1])
        targets[b, :n] = torch.tensor(labels[1:])
        attention_mask[b, :n] = 1
    return input_ids, targets, attention_mask


class ConversationBatches:
    """Endless padded batches (input_ids, targets, attention_mask) of encoded
    conversations, in a new random order each epoch; like smol.data.Batches, the
    position (examples consumed, all ranks) is the whole state, so a run resumes
    exactly."""

    def __init__(
        self,
        examples,
        batch_size: int,
        pad_id: int,
        seed: int = 0,
        shuffle: bool = True,
        rank: int = 0,
        world_size: int = 1,
        position: int = 0,
    ):
        if not examples:
            raise ValueError("no examples: need at least one encoded conversation")
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.examples, self.batch_size, self.pad_id = list(examples), batch_size, pad_id
        self.seed, self.shuffle, self.rank, self.world_size = (
            seed,
            shuffle,
            rank,
            world_size,
        )
        self.position = position
        self._order: tuple[int, torch.Tensor] | None = None

    def __len__(self) -> int:
        return len(self.examples)

    def order(self, epoch: int) -> torch.Tensor:
        if not self.shuffle:
            return torch.arange(len(self.examples))
        if self._order is None or self._order[0] != epoch:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._order = (epoch, torch.randperm(len(self.examples), generator=g))
        return self._order[1]

    def __iter__(self):
        return self

    def __next__(self):
        n, start = len(self.examples), self.position + self.rank * self.batch_size
        self.position += self.batch_size * self.world_size
        picked = []
        for g in range(start, start + self.batch_size):
            picked.append(self.examples[int(self.order(g // n)[g % n])])
        return self.collate(picked)

    def collate(self, picked: list):
        """The batch of the picked examples (see collate)."""
        return collate(picked, self.pad_id)

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = int(state["position"])
