"""Text generation with a key/value cache."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from smol.config import GenerationConfig
from smol.kv_cache import KVCache


def filter_top_k(logits: torch.Tensor, k: int | None) -> torch.Tensor:
    """Keep the k largest logits of each row (B, V); set the rest to -inf. None or k >=
    V keeps all."""
    if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k < 1):
        raise ValueError(f"top_k must be a positive int, got {k!r}")
    if k is None or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # (B, 1): the k-th largest
    return logits.masked_fill(logits < kth, float("-inf"))


def filter_top_p(logits: torch.Tensor, p: float | None) -> torch.Tensor:
    """Nucleus filtering (Holtzman et al., 2020): keep the smallest set of most likely
    tokens whose probabilities sum to at least p (always the most likely one); set the
    rest to -inf."""
    if p is not None and not (isinstance(p, (int, float)) and 0 <= p <= 1):  # not NaN
        raise ValueError(f"top_p must lie in [0, 1], got {p!r}")
    if p is None or p == 1:
        return logits
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
    """Pick one token per row of logits (B, V) -> (B,), or of one row (V,) -> ().
    temperature 0 is greedy (argmax)."""
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


class FiniteLogits(torch.nn.Module):
    """`model` for generate's sampling, the NaN and inf logits of its last position
    (those sampled from) made zeros and counted in the 0-d `nonfinite` flag, which
    the caller reads once after: a diverged model is then found and named where
    torch.multinomial would stop with a RuntimeError of its own. Its rows of zeros
    sample uniformly."""

    def __init__(self, model):
        super().__init__()
        self.inner = model
        device = next(model.parameters()).device
        self.nonfinite = torch.zeros((), dtype=torch.bool, device=device)
        self.train(model.training)  # generate's _eval restores this mode

    config = property(lambda self: self.inner.config)
    model = property(lambda self: self.inner.model)  # KVCache.for_model's

    def forward(self, *args, **kwargs):
        logits, loss = self.inner(*args, **kwargs)  # (B, T, V)
        last = logits[:, -1]  # (B, V): no copy of a prefill's (B, T, V)
        finite = torch.isfinite(last)
        self.nonfinite |= ~finite.all()  # no sync
        logits[:, -1] = last.where(finite, 0.0)
        return logits, loss


def left_pad(seqs, pad_id: int = 0, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts of different lengths (lists of ids or 1-d tensors) -> (ids (B, T), mask
    (B, T)), each row right-aligned after pad_id padding, the mask 0 on the padding:
    what generate takes as input_ids and attention_mask."""
    seqs = [torch.as_tensor(s, dtype=torch.long).flatten() for s in seqs]
    if not seqs or min(len(s) for s in seqs) == 0:
        raise ValueError("left_pad needs at least one prompt, and no empty prompt")
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - len(s) :], mask[i, width - len(s) :] = s, 1
    return ids.to(device), mask.to(device)


@torch.no_grad()
def generate(
    model,
    input_ids: torch.Tensor,
    max_new_tokens: int | None = None,
    *,
    config: GenerationConfig | None = None,
    attention_mask: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    stream=None,
    draft_model=None,
    kv_cache: KVCache | None = None,
    **settings,
) -> torch.Tensor:
    """Continue input_ids (B, T) by up to max_new_tokens tokens -> (B, T + new) token
    ids.

    How it decodes is a GenerationConfig (smol.config): `config`, with max_new_tokens
    and any of its fields given as keywords (temperature=0, top_k=50, eos_token_id=2,
    use_cache, compile, compile_mode, speculative) put in its place; or, without a
    config, those alone (temperature 1 unless given).

    With `use_cache` the prompt runs once (prefill) into a preallocated KVCache, then
    each step feeds only the newest token; without it every step reruns the whole
    sequence (same tokens, slower). Batched prompts of different lengths are
    left-padded: attention_mask (B, T) holds 0 on the padding, and positions count real
    tokens only. A row that emits eos_token_id (an int or a list) is finished and padded
    with eos; generation stops early once every row is. `stream(tokens)` is called with
    each step's new tokens (B,).

    Faster paths, same tokens: `compile=True` runs each step through a StaticCache
    compiled with torch.compile (`compile_mode="reduce-overhead"` adds CUDA graphs on a
    GPU; a string names the compile backend, e.g. "aot_eager"); `speculative=k` (greedy,
    batch 1) drafts up to k tokens per step by prompt lookup, or with `draft_model` (a
    cheaper model of the same vocabulary, e.g. a bfloat16 copy, whose drafts end after
    a near tie; see smol.speculative.ModelDraft), and verifies them in one pass.
    `kv_cache`: a KVCache already holding the keys and values of
    input_ids[:, :kv_cache.length] (a chat's earlier turns); only the rest is
    prefilled, and the cache keeps the new tokens. decoding_path says which path."""
    if max_new_tokens is not None:
        settings["max_new_tokens"] = max_new_tokens
    config = GenerationConfig.build(config, **settings)
    B, T = _check_input_ids(input_ids)
    mask, padded = _prompt_mask(input_ids, attention_mask)
    if stream is not None and not callable(stream):
        raise TypeError(f"stream must be a callable, got {type(stream).__name__}")
    eos = _eos_ids(config.eos_token_id, model.config.vocab_size, input_ids.device)
    path = decoding_path(config, B, padded, kv_cache, draft_model is not None)
    n = config.max_new_tokens
    sampling = dict(
        temperature=config.temperature,
        top_k=config.top_k,
        top_p=config.top_p,
        generator=generator,
    )
    steps = (n, eos, stream, sampling)
    if path.kind == "static":
        compiled = (config.compile, config.compile_mode)
        return _generate_static(model, input_ids, mask, *steps, *compiled)
    cache = kv_cache
    if path.kind != "no cache" and cache is None:
        cache = KVCache.for_model(model, B, T + n + config.speculative)
    if path.kind == "speculative":
        from smol.speculative import speculative_greedy

        with _eval(model), _eval(draft_model or model):
            return speculative_greedy(
                model,
                input_ids,
                n,
                cache,
                num_draft=config.speculative,
                draft_model=draft_model,
                eos=eos,
                stream=stream,
            )
    if cache is not None and cache.length:
        _check_kv_cache(cache, T, n)
    with _eval(model):
        return _decode(model, input_ids, mask if padded else None, cache, *steps)


@dataclass(frozen=True)
class DecodingPath:
    """The loop generate runs: "cache" (a KVCache: the prompt once, then a token a
    step), "no cache" (the whole sequence each step), "static" (a compiled
    StaticCache) or "speculative" (drafts checked in one pass), and why it is fast."""

    kind: str
    about: str

    def __str__(self) -> str:
        return self.about


def decoding_path(
    config: GenerationConfig,
    batch_size: int = 1,
    padded: bool = False,
    kv_cache: KVCache | None = None,
    draft: bool = False,
) -> DecodingPath:
    """How generate decodes with `config` a batch of batch_size prompts (padded: some
    row is), given a kv_cache or none, and a draft model or none; a ValueError names a
    combination that has no path."""
    if kv_cache is not None and not config.use_cache:
        raise ValueError("kv_cache was given with use_cache=False")
    k = config.speculative
    if kv_cache is not None and (config.compile or k):
        raise ValueError(
            "compile and speculative decoding keep their own cache: pass neither "
            "kv_cache nor use_cache=False with them"
        )
    if draft and not k:
        raise ValueError(
            "draft_model drafts for speculative decoding: pass speculative=k (its "
            "longest draft) too"
        )
    if k and (batch_size != 1 or padded):
        raise ValueError(
            f"speculative decoding takes one unpadded sequence, got a batch of "
            f"{batch_size}"
        )
    if k:
        by = "a draft model" if draft else "prompt lookup"
        about = f"speculative decoding, up to {k} tokens a step drafted by {by}"
        return DecodingPath("speculative", about)
    if config.compile:
        backend = config.compile if isinstance(config.compile, str) else "inductor"
        mode = f", mode {config.compile_mode}" if config.compile_mode else ""
        return DecodingPath("static", f"a static KV cache, compiled ({backend}{mode})")
    if config.use_cache:
        return DecodingPath("cache", "a KV cache")
    return DecodingPath("no cache", "no cache: each step reruns the sequence")


def _decode(model, input_ids, mask, cache, max_new_tokens, eos, stream, sampling):
    """The plain decoding loop: with a cache, the prompt runs once (prefill), then each
    step feeds only the newest token; without, every step reruns the whole sequence.
    mask (B, T) or None when no row is padded."""
    B = input_ids.shape[0]
    finished = torch.zeros(B, dtype=torch.bool, device=input_ids.device)
    # earlier turns of a chat may be cached already: feed only what is new
    tokens = input_ids
    step_ids = input_ids[:, cache.length :] if cache is not None else input_ids
    for _ in range(max_new_tokens):
        position_ids = None
        if mask is not None:  # (B, T'): padding does not count
            position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
            if cache is not None:
                position_ids = position_ids[:, cache.length :]
        logits, _ = model(
            step_ids, attention_mask=mask, position_ids=position_ids, kv_cache=cache
        )
        next_token = sample_next_token(logits[:, -1], **sampling)  # (B,)
        if eos is not None:
            next_token = torch.where(finished, eos[0], next_token)
            finished |= torch.isin(next_token, eos)
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
        if mask is not None:
            mask = torch.cat([mask, mask.new_ones(B, 1)], dim=1)
        step_ids = next_token[:, None] if cache is not None else tokens
        if stream is not None:
            stream(next_token)
        if eos is not None and bool(finished.all()):
            break
    return tokens


def _check_input_ids(input_ids: torch.Tensor) -> tuple[int, int]:
    if not isinstance(input_ids, torch.Tensor) or input_ids.is_floating_point():
        raise TypeError(
            "input_ids must be a tensor of token ids, got "
            f"{getattr(input_ids, 'dtype', type(input_ids).__name__)}"
        )
    if input_ids.dim() != 2:
        raise ValueError(
            f"input_ids must have shape (batch, seq_len), got {tuple(input_ids.shape)}"
        )
    return input_ids.shape


def _prompt_mask(input_ids, attention_mask) -> tuple[torch.Tensor, bool]:
    """The prompt's mask as (B, T) longs of 0 (padding) and 1, and whether any row is
    padded. A mask of other values (0.5, say) is an error, not rounded to padding."""
    B, T = input_ids.shape
    if attention_mask is None:
        return torch.ones(B, T, dtype=torch.long, device=input_ids.device), False
    if not isinstance(attention_mask, torch.Tensor):
        raise TypeError(
            f"attention_mask must be a tensor, got {type(attention_mask).__name__}"
        )
    if attention_mask.shape != (B, T):
        raise ValueError(
            f"attention_mask must have the shape of input_ids {(B, T)}, got "
            f"{tuple(attention_mask.shape)}"
        )
    # checked once, before the loop (each check reads the mask back to the host)
    if not bool(((attention_mask == 0) | (attention_mask == 1)).all()):
        raise ValueError("attention_mask must hold only 0 (padding) and 1 (tokens)")
    mask = attention_mask.to(device=input_ids.device, dtype=torch.long)
    if not bool(mask.any(-1).all()):
        row = int((~mask.any(-1)).nonzero()[0])
        raise ValueError(
            f"attention_mask row {row} has no tokens: every prompt needs at least one"
        )
    return mask, not bool(mask.all())


def _eos_ids(eos_token_id, vocab_size: int, device) -> torch.Tensor | None:
    """eos_token_id (an int or a list of them) as a 1-d tensor, each id checked."""
    if eos_token_id is None:
        return None
    ids = eos_token_id
    if isinstance(ids, torch.Tensor):
        ids = ids.flatten().tolist()
    elif not isinstance(ids, (list, tuple)):
        ids = [ids]
    if not ids or not all(
        isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab_size
        for i in ids
    ):
        raise ValueError(
            f"eos_token_id must be token ids in [0, {vocab_size}), got {eos_token_id!r}"
        )
    return torch.tensor(ids, device=device)


def _check_kv_cache(cache: KVCache, T: int, max_new_tokens: int) -> None:
    if cache.length >= T or cache.max_len < T + max_new_tokens:
        raise ValueError(
            f"kv_cache holds {cache.length} tokens of {cache.max_len}; it must hold "
            f"fewer than the {T} input tokens, with room for {max_new_tokens} more"
        )


class _eval:
    """Put a model in eval mode for a block, then restore its mode."""

    def __init__(self, model):
        self.model, self.was_training = model, model.training

    def __enter__(self):
        self.model.eval()

    def __exit__(self, *exc):
        self.model.train(self.was_training)


def _generate_static(
    model, input_ids, mask, max_new_tokens, eos, stream, sampling, compile, mode
):
    """generate() through a StaticCache whose one-token step is compiled (once per
    model, batch size and cache size): no tensor changes shape from one step to the
    next."""
    from smol.static_cache import static_cache_for

    B, T = input_ids.shape
    device = input_ids.device
    out = torch.empty(B, max_new_tokens, dtype=torch.long, device=device)
    if max_new_tokens == 0:
        return input_ids
    cache = static_cache_for(model, B, T + max_new_tokens, compile=compile, mode=mode)
    cache.reset()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (B, T): padding does not count
    finished = torch.zeros(B, dtype=torch.bool, device=device)
    ones = torch.ones(B, 1, dtype=torch.bool, device=device)
    with _eval(model):
        logits = cache(
            input_ids, positions, torch.arange(T, device=device), mask
        )  # prefill
        position = positions[:, -1:] + 1  # (B, 1)
        for n in range(max_new_tokens):  # at least one: 0 returned above
            next_token = sample_next_token(logits[:, -1], **sampling)  # (B,)
            if eos is not None:
                next_token = torch.where(finished, eos[0], next_token)
                finished |= torch.isin(next_token, eos)
            out[:, n] = next_token
            if stream is not None:
                stream(next_token)
            if n + 1 == max_new_tokens or (eos is not None and bool(finished.all())):
                break
            slot = torch.full((1,), T + n, dtype=torch.long, device=device)
            logits = cache.step(
                next_token[:, None].clone(), position.clone(), slot, ones
            )
            position += 1
    return torch.cat([input_ids, out[:, : n + 1]], dim=1)
