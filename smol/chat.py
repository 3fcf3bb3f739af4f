"""A multi-turn conversation that keeps its KV cache from one turn to the next.

Each turn renders the whole conversation with the chat template, as the model was
trained to read it. Without a cache kept across turns, every reply would first re-read
the whole conversation; a ChatSession instead keeps the keys and values of every token
it has already run, and feeds the model only the tokens after the longest prefix that
the cache and the new rendering share (usually just the new message)."""

from __future__ import annotations

import torch

from smol.generate import generate
from smol.kv_cache import KVCache


class ChatSession:
    """History, tokens and cache of one conversation with `model`."""

    def __init__(
        self,
        model,
        tokenizer,
        system: str | None = None,
        reuse_cache: bool = True,
        max_len: int = 4096,
    ):
        self.model, self.tokenizer = model, tokenizer
        self.system, self.reuse_cache = system, reuse_cache
        self.max_len = min(max_len, model.config.max_position_embeddings)
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
        if total > self.model.config.max_position_embeddings:
            raise ValueError(
                f"the conversation needs {total} positions, more than the model's "
                f"context of {self.model.config.max_position_embeddings}: /reset it"
            )
        if self.cache is None or self.cache.max_len < total:
            size = min(
                self.model.config.max_position_embeddings, max(self.max_len, 2 * total)
            )
            self.cache = KVCache.for_model(self.model, 1, size)
            self.cached = []
        return self.cache

    def send(
        self, text: str, max_new_tokens: int = 256, stream=None, **sampling
    ) -> str:
        """Add the user's message, generate the reply (streamed to `stream(tokens
        (1,))`), keep it in the history and return its text."""
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"expected a non-empty message, got {text!r}")
        messages = self.messages + [{"role": "user", "content": text}]
        ids = self.tokenizer.apply_chat_template(messages, tokenize=True)
        cache = self._cache_for(len(ids) + max_new_tokens)
        shared = 0
        if self.reuse_cache:
            limit = min(
                len(self.cached), len(ids) - 1
            )  # at least one token must be fed
            while shared < limit and self.cached[shared] == ids[shared]:
                shared += 1
        cache.length = shared  # keep the common prefix, overwrite the rest
        self.fed = len(ids) - shared  # tokens this turn's prefill runs
        device = self.model.model.embed_tokens.weight.device
        out = generate(
            self.model,
            torch.tensor([ids], device=device),
            max_new_tokens,
            eos_token_id=self.tokenizer.eos_token_id,
            kv_cache=cache,
            stream=stream,
            **sampling,
        )
        self.cached = out[0, : cache.length].tolist()
        reply = out[0, len(ids) :].tolist()
        if reply and reply[-1] == self.tokenizer.eos_token_id:
            reply = reply[:-1]
        answer = self.tokenizer.decode(reply, skip_special_tokens=True)
        self.messages = messages + [{"role": "assistant", "content": answer}]
        return answer
