"""Preference tuning with Direct Preference Optimization (Rafailov et al., 2023): a
policy learns to prefer the chosen reply of each pair over the rejected one, held near
a frozen reference by beta. The command is `smol dpo` (smol/commands/dpo.py).

Each line of a pairs file is one pair in TRL's conversational format, `{"prompt":
[{"role": "user", "content": "..."}], "chosen": [{"role": "assistant", "content":
"..."}], "rejected": [{"role": "assistant", "content": "..."}]}`; plain strings for the
prompt and replies are taken too.

The loss of a pair, with log-probabilities of the replies' tokens only (the prompt is
context) under the policy pi and the reference pi_ref:

    margin = (log pi(chosen) - log pi_ref(chosen))
             - (log pi(rejected) - log pi_ref(rejected))
    loss   = -log sigmoid(beta * margin)

and beta times each log-ratio is that reply's implicit reward."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from smol.finetune import SFTTrainer, numbered_records
from smol.lora import lora_layers
from smol.model import IGNORE_INDEX
from smol.sft import (
    ConversationBatches,
    _show,
    check_messages,
    collate,
    encode_conversation,
)
from smol.train import TrainConfig


def check_pair(record) -> dict:
    """A pair as {"prompt": messages, "chosen": text, "rejected": text}, from TRL's
    conversational or plain format; raises a ValueError saying what is wrong."""
    if not isinstance(record, dict):
        raise ValueError(
            'expected an object {"prompt", "chosen", "rejected"}, '
            f"got {_show(record)}"
        )
    missing = [k for k in ("prompt", "chosen", "rejected") if k not in record]
    if missing:
        raise ValueError(f"the pair has no {' or '.join(map(repr, missing))}")
    prompt = record["prompt"]
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    if not isinstance(prompt, list) or not prompt:
        raise ValueError(
            f"prompt must be a string or a non-empty list of messages, "
            f"got {_show(prompt)}"
        )
    last = prompt[-1]
    if not (isinstance(last, dict) and last.get("role") == "user"):
        raise ValueError(
            f"the prompt's last message must be the user's, got {_show(last)}"
        )
    if isinstance(last.get("content"), str) and not last["content"].strip():
        raise ValueError("the prompt's user message is empty: no message to reply to")
    replies = {side: _reply(record[side], side) for side in ("chosen", "rejected")}
    # checks the prompt's messages too: roles, contents, a system message only first
    check_messages(prompt + [{"role": "assistant", "content": replies["chosen"]}])
    if replies["chosen"] == replies["rejected"]:
        raise ValueError(
            f"chosen and rejected are the same reply ({_show(replies['chosen'])}): "
            "nothing to prefer"
        )
    return {"prompt": prompt, **replies}


def _reply(value, side: str) -> str:
    """The text of one reply: a string, or one assistant message in a list."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], dict):
        if value[0].get("role") != "assistant":
            raise ValueError(f"{side} must be the assistant's message: {_show(value)}")
        value = value[0].get("content")
    if not isinstance(value, str):
        raise ValueError(
            f"{side} must be a string or one assistant message, got {_show(value)}"
        )
    if not value.strip():
        raise ValueError(f"{side} is an empty reply")
    return value


def read_pairs(path: str | Path) -> list[dict]:
    """The pairs of a JSONL file (see check_pair), one a line; blank lines are
    skipped. A malformed line raises a ValueError naming the file and the line."""
    return list(numbered_pairs(path).values())


def numbered_pairs(path: str | Path) -> dict[int, dict]:
    """{line number: pair} of a JSONL file of pairs."""
    return numbered_records(path, "pairs", check_pair)


def encode_pair(tokenizer, pair: dict, max_len: int | None = None):
    """((ids, labels) of prompt + chosen, (ids, labels) of prompt + rejected): the
    chat template's tokens, labelled (not -100) on the reply's tokens only. As TRL
    splits a pair, the reply is every token after the prompt's generation header:
    the text, <|im_end|> and the newline the template writes after it. The prompt's
    own assistant turns (a conversation's earlier replies) are context: -100."""
    pair = check_pair(pair)
    encoded = []
    for side in ("chosen", "rejected"):
        messages = pair["prompt"] + [{"role": "assistant", "content": pair[side]}]
        ids, labels = encode_conversation(tokenizer, messages)
        start = max(i for i, t in enumerate(labels) if t != IGNORE_INDEX)
        while labels[start - 1] != IGNORE_INDEX:  # back to the last reply's start
            start -= 1
        labels = [IGNORE_INDEX] * start + ids[start:]  # and the template's tail
        encoded.append((ids[:max_len], labels[:max_len]))
    return tuple(encoded)


def collate_pairs(pairs, pad_id: int):
    """Encoded pairs -> input_ids, targets, attention_mask, each (2B, T): the B chosen
    rows, then the B rejected rows (as TRL concatenates them), padded on the right."""
    return collate([c for c, _ in pairs] + [r for _, r in pairs], pad_id)


def sequence_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(B, T, V) logits, (B, T) shifted targets -> (B,): each row's sum of log p(target)
    over the tokens whose target is not -100 (the reply's), in float32."""
    if logits.shape[:-1] != targets.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} do not match targets {tuple(targets.shape)}"
        )
    # log p(target) is minus the cross-entropy of that one token; -100 counts 0
    nll = F.cross_entropy(
        logits.float().flatten(0, 1),
        targets.flatten(),
        ignore_index=IGNORE_INDEX,
        reduction="none",
    )  # (B * T,)
    return -nll.view(targets.shape).sum(-1)


def reply_logprobs(model, input_ids, targets, attention_mask=None) -> torch.Tensor:
    """(B,) log-probabilities of each row's reply under the model (sequence_logprobs
    of its logits)."""
    logits, _ = model(input_ids, attention_mask=attention_mask)
    return sequence_logprobs(logits, targets)


@contextlib.contextmanager
def adapters_off(model: nn.Module):
    """The model with each LoRA layer replaced by its frozen base layer, put back on
    exit: a LoRA policy's reference model for free, with no second copy of the
    weights."""
    layers = lora_layers(model)
    if not layers:
        raise ValueError(
            "this model holds no LoRA layers: give a reference model to compare with"
        )
    try:
        for name, layer in layers.items():
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, layer.base_layer)
        yield model
    finally:
        for name, layer in layers.items():
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, layer)


@dataclasses.dataclass
class DPOLoss:
    """The mean loss of a batch of pairs, and each pair's implicit rewards (beta times
    the policy's log-ratio to the reference, detached), the numbers people watch."""

    loss: torch.Tensor  # ()
    chosen_rewards: torch.Tensor  # (B,)
    rejected_rewards: torch.Tensor  # (B,)

    @property
    def margins(self) -> torch.Tensor:  # (B,)
        return self.chosen_rewards - self.rejected_rewards

    @property
    def accuracy(self) -> torch.Tensor:  # (): the share of pairs ranked right
        return (self.chosen_rewards > self.rejected_rewards).float().mean()


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float = 0.1,
) -> DPOLoss:
    """DPO's loss from four (B,) tensors of reply log-probabilities: the mean over
    pairs of -log sigmoid(beta * margin), margin = the chosen reply's log-ratio to the
    reference minus the rejected one's (TRL's loss_type="sigmoid"). The reference's
    log-probabilities are constants: no gradient reaches them."""
    if not (isinstance(beta, (int, float)) and beta > 0):
        raise ValueError(f"beta must be a positive number, got {beta!r}")
    shapes = {tuple(t.shape) for t in (policy_chosen, policy_rejected)}
    shapes |= {tuple(t.shape) for t in (ref_chosen, ref_rejected)}
    if len(shapes) != 1 or len(next(iter(shapes))) != 1:
        raise ValueError(f"expected four tensors of one shape (B,), got {shapes}")
    chosen = policy_chosen - ref_chosen.detach()  # (B,) log-ratios
    rejected = policy_rejected - ref_rejected.detach()
    loss = -F.logsigmoid(beta * (chosen - rejected)).mean()
    return DPOLoss(loss, beta * chosen.detach(), beta * rejected.detach())


class PairBatches(ConversationBatches):
    """Endless batches of encoded pairs, chosen rows then rejected (collate_pairs);
    the position is the whole state, so a run resumes exactly."""

    def collate(self, picked: list):
        return collate_pairs(picked, self.pad_id)


class DPOTrainer(SFTTrainer):
    """smol.finetune's SFTTrainer with DPO's loss, on batches of preference pairs:
    `model` is the policy (with LoRA adapters only they train), `reference` a frozen
    model of the same config; None takes the policy with its adapters off
    (adapters_off). Pairs are cut to seq_len + 1 tokens; those whose chosen or rejected
    reply is left with no token are left out (`dropped` holds their indices by
    "training" and "validation", `cut` counts the others that were cut).
    length_normalized compares mean instead of summed log-probabilities per reply
    token, a remedy for the loss's pull towards long replies."""

    Batches = PairBatches
    too_long = "no {what} pair has both replies within seq_len {seq_len} tokens"

    def __init__(
        self,
        config: TrainConfig,
        model,
        tokenizer,
        train: list,
        val: list = (),
        *,
        beta: float = 0.1,
        reference: nn.Module | None = None,
        length_normalized: bool = False,
    ):
        if not (isinstance(beta, (int, float)) and beta > 0):
            raise ValueError(f"beta must be a positive number, got {beta!r}")
        if reference is None:
            with adapters_off(model):  # raises without adapters
                pass
        elif reference.config != model.config:
            raise ValueError(
                "the reference model's config differs from the policy's: "
                "DPO compares the two on the same tokens"
            )
        self.beta, self.length_normalized = float(beta), length_normalized
        super().__init__(config, model, tokenizer, train, val)
        self.reference = reference
        if reference is not None:
            self.reference = reference.to(self.device).eval().requires_grad_(False)
        for name in ("chosen_reward", "rejected_reward", "margin", "accuracy"):
            self.history.setdefault(name, [])
        self.history.setdefault("val_accuracy", [])
        self._rewards: list[torch.Tensor] = []  # this step's micro-batches'
        self._pending_rewards: list[torch.Tensor] = []  # steps not yet read back

    def encode_example(self, pair, n: int):
        """(the pair's chosen and rejected (ids, labels), cut to n tokens; the same
        uncut)."""
        sides = encode_pair(self.tokenizer, pair)
        return tuple((ids[:n], labels[:n]) for ids, labels in sides), sides

    def pair_loss(self, model, batch) -> DPOLoss:
        """DPO's loss of a batch from collate_pairs, the policy run through `model`
        (the training or the evaluation wrapper of self.model)."""
        x, y, mask = (t.to(self.device, non_blocking=True) for t in batch)
        with self.autocast():
            policy = reply_logprobs(model, x, y, mask)  # (2B,)
            with torch.no_grad():
                if self.reference is None:
                    with adapters_off(self.model):
                        ref = reply_logprobs(self.model, x, y, mask)
                else:
                    ref = reply_logprobs(self.reference, x, y, mask)
        if self.length_normalized:
            tokens = (y != IGNORE_INDEX).sum(-1)  # (2B,)
            policy, ref = policy / tokens, ref / tokens
        B = x.shape[0] // 2
        return dpo_loss(policy[:B], policy[B:], ref[:B], ref[B:], self.beta)

    def batch_loss(self, batch) -> torch.Tensor:
        out = self.pair_loss(self.train_model, batch)
        logs = (out.chosen_rewards, out.rejected_rewards, out.margins)
        self._rewards.append(torch.stack([*(t.mean() for t in logs), out.accuracy]))
        return out.loss

    def train_step(self) -> torch.Tensor:
        loss = super().train_step()
        rewards = torch.stack(self._rewards).mean(0)  # (4,) over micro-batches
        self._rewards = []
        if self.world_size > 1:
            dist.all_reduce(rewards)
            rewards /= self.world_size
        self._pending_rewards.append(rewards)
        return loss

    def _read_back(self, pending, due, caught) -> bool:
        stop = super()._read_back(pending, due, caught)
        names = ("chosen_reward", "rejected_reward", "margin", "accuracy")
        for rewards in self._pending_rewards:
            for name, value in zip(names, rewards.tolist()):
                self.history[name].append(value)
        self._pending_rewards = []
        return stop

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean DPO loss over the validation pairs (at most eval_batches batches of
        them; NaN when there are none); their preference accuracy goes into
        history["val_accuracy"]."""
        if not self.val_examples:
            return float("nan")
        loss, right, pairs = self.validation_sums(3, self._loss_and_accuracy)
        self.history["val_accuracy"].append((right / pairs).item())
        return (loss / pairs).item()

    def _loss_and_accuracy(self, chunk: list) -> torch.Tensor:
        batch = collate_pairs(chunk, self.tokenizer.pad_token_id)
        out = self.pair_loss(self.eval_model, batch)
        k = out.loss.new_tensor(len(chunk), dtype=torch.float64)
        return torch.stack([out.loss.double() * k, out.accuracy.double() * k, k])
