"""Text generation with a key/value cache."""

from __future__ import annotations

import torch

from smol.kv_cache import KVCache


def filter_top_k(logits: torch.Tensor, k: int | None) -> torch.Tensor:
    """Keep the k largest logits of each row (B, V); set the rest to -inf. None or k >= V keeps all."""
    if k is None or k >= logits.shape[-1]:
        return logits
    if k < 1:
        raise ValueError(f"top_k must be a positive int, got {k}")
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # (B, 1): the k-th largest
    return logits.masked_fill(logits < kth, float("-inf"))


def filter_top_p(logits: torch.Tensor, p: float | None) -> torch.Tensor:
    """Nucleus filtering (Holtzman et al., 2020): keep the smallest set of most likely tokens whose
    probabilities sum to at least p (always the most likely one); set the rest to -inf."""
    if p is None or p >= 1.0:
        return logits
    if p < 0:
        raise ValueError(f"top_p must lie in [0, 1], got {p}")
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # (B, V)
    probs = sorted_logits.float().softmax(dim=-1)
    before = probs.cumsum(dim=-1) - probs  # probability mass of the more likely tokens
    remove = before >= p
    remove[..., 0] = False
    return logits.masked_fill(remove.scatter(-1, order, remove), float("-inf"))


def sample_next_token(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Pick one token per row of logits (B, V) -> (B,). temperature 0 is greedy (argmax)."""
    if not (
        isinstance(temperature, (int, float)) and 0 <= temperature < float("inf")
    ):  # not NaN
        raise ValueError(
            f"temperature must be a finite number >= 0, got {temperature!r}"
        )
    if top_k is not None and (
        not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1
    ):
        raise ValueError(f"top_k must be a positive int or None, got {top_k!r}")
    if top_p is not None and not (isinstance(top_p, (int, float)) and 0 <= top_p <= 1):
        raise ValueError(f"top_p must lie in [0, 1] or be None, got {top_p!r}")
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = filter_top_p(filter_top_k(logits.float() / temperature, top_k), top_p)
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.no_grad()
def generate(
    model,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_token_id=None,
    attention_mask: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    use_cache: bool = True,
    stream=None,
) -> torch.Tensor:
    """Continue input_ids (B, T) by up to max_new_tokens tokens -> (B, T + new) token ids.

    With `use_cache` the prompt runs once (prefill) into a preallocated KVCache, then each step feeds
    only the newest token; without it every step reruns the whole sequence (same tokens, slower).
    Batched prompts of different lengths are left-padded: attention_mask (B, T) holds 0 on the
    padding, and positions count real tokens only. A row that emits eos_token_id (an int or a list)
    is finished and padded with eos; generation stops early once every row is. `stream(tokens)` is
    called with each step's new tokens (B,).
    """
    if input_ids.dim() != 2:
        raise ValueError(
            f"input_ids must have shape (batch, seq_len), got {tuple(input_ids.shape)}"
        )
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    B, T = input_ids.shape
    device = input_ids.device
    vocab_size = model.config.vocab_size
    if eos_token_id is not None:
        ids = torch.as_tensor(eos_token_id).flatten().tolist()
        if not ids or not all(isinstance(i, int) and 0 <= i < vocab_size for i in ids):
            raise ValueError(
                f"eos_token_id must be token ids in [0, {vocab_size}), got {eos_token_id!r}"
            )
    mask = (
        torch.ones(B, T, dtype=torch.long, device=device)
        if attention_mask is None
        else attention_mask.to(device=device, dtype=torch.long)
    )
    if mask.shape != (B, T):
        raise ValueError(
            f"attention_mask must have the shape of input_ids {(B, T)}, got {tuple(mask.shape)}"
        )
    if attention_mask is not None and not bool(
        mask.any(-1).all()
    ):  # one sync, before the loop
        row = int((~mask.any(-1)).nonzero()[0])
        raise ValueError(
            f"attention_mask row {row} has no tokens: every prompt needs at least one"
        )
    was_training = model.training
    model.eval()
    padded = not bool(mask.all())  # without padding the model's plain causal path does
    eos = (
        None
        if eos_token_id is None
        else torch.as_tensor(eos_token_id, device=device).flatten()
    )
    finished = torch.zeros(B, dtype=torch.bool, device=device)
    cache = None
    if use_cache:
        dtype = next(model.parameters()).dtype
        cache = KVCache(model.config, B, T + max_new_tokens, device=device, dtype=dtype)
    tokens, step_ids = input_ids, input_ids
    try:
        for _ in range(max_new_tokens):
            position_ids = None
            if padded:
                position_ids = (mask.cumsum(-1) - 1).clamp(
                    min=0
                )  # (B, T'): padding does not count
                if use_cache:
                    position_ids = position_ids[:, cache.length :]
            logits, _ = model(
                step_ids,
                attention_mask=mask if padded else None,
                position_ids=position_ids,
                kv_cache=cache,
            )
            next_token = sample_next_token(
                logits[:, -1], temperature, top_k, top_p, generator
            )  # (B,)
            if eos is not None:
                next_token = torch.where(finished, eos[0], next_token)
                finished |= torch.isin(next_token, eos)
            tokens = torch.cat([tokens, next_token[:, None]], dim=1)
            mask = torch.cat([mask, mask.new_ones(B, 1)], dim=1)
            step_ids = next_token[:, None] if use_cache else tokens
            if stream is not None:
                stream(next_token)
            if eos is not None and bool(finished.all()):
                break
    finally:
        model.train(was_training)
    return tokens
