"""A multi-turn conversation that keeps its KV cache from one turn to the next.

Each turn renders the whole conversation with the chat template, as the model was
trained to read it. Without a cache kept across turns, every reply would first re-read
the whole conversation; a ChatSession instead keeps the keys and values of every token
it has already run, and feeds the model only the tokens after the longest prefix that
the cache and the new rendering share (usually just the new message).

A conversation that outgrows the model's context drops its oldest turns (the system
prompt stays), as local chat tools do; a reply stopped midway (Ctrl-C) stays in the
conversation as far as it got."""

from __future__ import annotations

from collections.abc import Callable

import torch

from smol.generate import generate
from smol.kv_cache import KVCache


class ChatSession:
    """History, tokens and cache of one conversation with `model`. `notice(text)` is
    told when old turns are dropped to make room."""

    def __init__(
        self,
        model,
        tokenizer,
        system: str | None = None,
        reuse_cache: bool = True,
        max_len: int = 4096,
        notice: Callable[[str], None] | None = None,
    ):
        self.model, self.tokenizer = model, tokenizer
        self.system, self.reuse_cache = system, reuse_cache
        self.max_len = min(max_len, model.config.max_position_embeddings)
        self.notice = notice
        self.cache = None
        self.reset()

    def reset(self) -> None:
        """Forget the conversation (the cache's memory is kept for the next one)."""
        self.messages = (
            [{"role": "system", "content": self.system}] if self.system else []
        )
        self.cached: list[int] = []  # the tokens whose keys and values the cache holds
        if self.cache is not None:
            self.cache.length = 0

    def _cache_for(self, total: int) -> KVCache:
        if self.cache is None or self.cache.max_len < total:
            size = min(
                self.model.config.max_position_embeddings, max(self.max_len, 2 * total)
            )
            self.cached = []  # first: a new cache holds nothing
            self.cache = KVCache.for_model(self.model, 1, size)
        return self.cache

    def _fit(self, text: str, max_new_tokens: int) -> tuple[list[dict], list[int]]:
        """(messages, token ids) of the conversation with the user's new message,
        without its oldest turns where it would not fit the context with
        max_new_tokens more."""
        context = self.model.config.max_position_embeddings
        head = self.messages[:1] if self.system else []  # the system prompt stays
        turns = self.messages[len(head) :] + [{"role": "user", "content": text}]
        while True:
            ids = self.tokenizer.apply_chat_template(head + turns, tokenize=True)
            if len(ids) + max_new_tokens <= context:
                break
            if len(turns) == 1:
                raise ValueError(
                    f"the message takes {len(ids)} tokens: with {max_new_tokens} for "
                    f"the reply, more than the model's context of {context}"
                )
            # drop the oldest exchange: all before the next user message
            start = next(i for i in range(1, len(turns)) if turns[i]["role"] == "user")
            turns = turns[start:]
        dropped = len(self.messages) - len(head) - (len(turns) - 1)
        if dropped and self.notice is not None:
            self.notice(
                f"the conversation outgrew the context of {context} tokens: its "
                f"{dropped} oldest messages are left out"
            )
        return head + turns, ids

    def send(
        self, text: str, max_new_tokens: int = 256, stream=None, **sampling
    ) -> str:
        """Add the user's message, generate the reply (streamed to `stream(tokens
        (1,))`), keep it in the history and return its text. A KeyboardInterrupt
        (Ctrl-C) stops the reply: what came of it is kept, and the interrupt raised."""
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"expected a non-empty message, got {text!r}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"the message is not valid text: {e.reason}") from None
        messages, ids = self._fit(text, max_new_tokens)
        cache = self._cache_for(len(ids) + max_new_tokens)
        shared = 0
        if self.reuse_cache:
            limit = min(
                len(self.cached), len(ids) - 1
            )  # at least one token must be fed
            while shared < limit and self.cached[shared] == ids[shared]:
                shared += 1
        self.cached = self.cached[:shared]  # what the cache keeps; the rest is new
        cache.length = shared
        self.fed = len(ids) - shared  # tokens this turn's prefill runs
        received = []  # this turn's new tokens, (1,) each, kept on the device

        def keep(tokens):
            received.append(tokens)
            if stream is not None:
                stream(tokens)

        device = self.model.model.embed_tokens.weight.device
        try:
            generate(
                self.model,
                torch.tensor([ids], device=device),
                max_new_tokens,
                eos_token_id=self.tokenizer.eos_token_id,
                kv_cache=cache,
                stream=keep,
                **sampling,
            )
        except KeyboardInterrupt:
            if received:  # a reply stopped midway: keep what was said
                self._keep(messages, ids, received)
            raise
        return self._keep(messages, ids, received)

    def _keep(self, messages, ids: list[int], received: list) -> str:
        """The reply's text, once it is in the history and its tokens in `cached`."""
        new = torch.cat(received).tolist() if received else []
        self.cached = (ids + new)[: self.cache.length]
        if new and new[-1] == self.tokenizer.eos_token_id:
            new = new[:-1]
        answer = self.tokenizer.decode(new, skip_special_tokens=True)
        self.messages = messages + [{"role": "assistant", "content": answer}]
        return answer
