"""Speculative decoding: guess the next tokens cheaply, check them all in one forward
pass, keep the ones greedy decoding would have chosen.

The guess (the *draft*) comes from one of two places. *Prompt lookup*: summaries,
answers about a document and code edits repeat long stretches of their prompt, so when
the last few tokens appeared before, the tokens that followed them then are a guess that
needs no second model. A *draft model*: a cheaper model with the same vocabulary, such
as the same weights in bfloat16, decodes a few tokens greedily (`ModelDraft`). Either
way, one forward pass of the model over the newest token and the draft gives its greedy
choice after each of them: the draft is kept up to its first wrong token, and that
position's choice is the next token. So the output is exactly what greedy decoding with
the model gives, token for token, in fewer (slightly larger) forward passes."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from smol.kv_cache import KVCache

# A draft model's near tie (see ModelDraft): one rounding step of bfloat16 for logits
# between 16 and 32, 16 * 2**-7.
NEAR_TIE = 0.125


def lookup_draft(
    tokens: torch.Tensor, max_ngram: int = 3, num_draft: int = 8
) -> torch.Tensor:
    """The tokens (k,) that followed the latest earlier occurrence of the last n tokens
    of `tokens` (N,), trying n = max_ngram down to 1; an empty tensor when none occurred
    before."""
    if tokens.dim() != 1:
        raise ValueError(
            f"expected a 1-d tensor of token ids, got shape {tuple(tokens.shape)}"
        )
    if max_ngram < 1 or num_draft < 1:
        raise ValueError(
            f"max_ngram and num_draft must be >= 1, got {max_ngram}, {num_draft}"
        )
    N = tokens.shape[0]
    for n in range(min(max_ngram, N - 1), 0, -1):
        windows = tokens.unfold(0, n, 1)[:-1]  # (N - n, n): every earlier n-gram
        hits = (windows == tokens[N - n :]).all(dim=1).nonzero()
        if len(hits):
            start = int(hits[-1]) + n  # right after the latest earlier occurrence
            return tokens[start : start + num_draft]
    return tokens[:0]


def next_draft_limit(limit: int, drafted: int, accepted: int, num_draft: int) -> int:
    """The next draft's longest length: two more after a draft accepted whole, one fewer
    (down to 1) after a rejection, unchanged when nothing was drafted."""
    if drafted == 0:
        return limit
    return min(num_draft, limit + 2) if accepted == drafted else max(1, limit - 1)


class ModelDraft:
    """Drafts by greedy decoding with `model` (e.g. a bfloat16 copy of the verifying
    model), which keeps its own KV cache of `max_len` tokens across drafts.

    `draft(tokens, k)` feeds the tokens (N,) its cache lacks and returns its next (up
    to) k greedy tokens; `keep(n)` forgets every cached token after the first n, once
    verification has settled how much of the text stands.

    A draft ends early after a *near tie*: a token whose logit leads the runner-up's by
    at most `stop_margin` (None: never). There the verifying model may well choose the
    other token, and every token drafted after it would then be a step spent in vain;
    checking at once costs one pass instead. The default, 1/8, is one rounding step of
    bfloat16 for logits between 16 and 32, where SmolLM2's top logits lie: given
    float32's 200 greedy tokens after the story and the summary prompts of
    bench/generate.py, every position where the bfloat16 copy picks another token is
    such a tie (it leads by 0 or 1/8)."""

    def __init__(self, model, max_len: int, stop_margin: float | None = NEAR_TIE):
        self.model = model
        self.stop_margin = stop_margin
        self.cache = KVCache.for_model(model, 1, max_len)

    @torch.inference_mode()
    def draft(self, tokens: torch.Tensor, k: int) -> torch.Tensor:
        feed, out = tokens[self.cache.length :], []  # what the cache has not seen
        for _ in range(k):
            logits, _ = self.model(feed[None], kv_cache=self.cache)
            top = logits[0, -1].topk(2)
            feed = top.indices[:1]
            out.append(feed)
            if self.stop_margin is None:
                continue  # (reading the lead would wait for the GPU at every step)
            if float(top.values[0] - top.values[1]) <= self.stop_margin:
                break  # a near tie: let the verifying model settle it first
        return torch.cat(out) if out else tokens[:0]

    def keep(self, n: int) -> None:
        self.cache.length = min(self.cache.length, n)

    def start_from(self, cache: KVCache) -> None:
        """Take the keys and values of the tokens in `cache` (the verifying model's,
        after the prompt) in the draft's dtype, instead of computing them: the draft's
        own pass over a long prompt costs as much as many of its steps. A draft cache
        of the same shape is taken to belong to a rounded copy of the model (bfloat16
        weights, int4 codes), whose keys and values differ from the model's only by that
        rounding; a draft model of another shape computes its own."""
        mine, theirs = self.cache.k.shape, cache.k.shape
        same = mine[:3] == theirs[:3] and mine[4:] == theirs[4:]
        if not same or self.cache.length or cache.length > self.cache.max_len:
            return
        n = cache.length
        self.cache.k[:, :, :, :n] = cache.k[:, :, :, :n]
        self.cache.v[:, :, :, :n] = cache.v[:, :, :, :n]
        self.cache.length = n


@dataclass
class SpeculativeStats:
    """Drafted and accepted tokens, and forward passes after the prefill."""

    drafted: int = 0
    accepted: int = 0
    forward_passes: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


def accepted(choice: torch.Tensor, draft: torch.Tensor, eos=None) -> int:
    """How many draft tokens (k,) greedy decoding would have chosen too: the draft up to
    its first token unlike the choice (1 + k,) before it, and up to an end token."""
    agree = (choice[:-1] == draft).int().cumprod(0)  # 1 while the draft matched
    n_ok = int(agree.sum())
    if eos is not None and n_ok:  # stop accepting after an accepted end token
        ends = torch.isin(draft[:n_ok], eos).nonzero()
        n_ok = int(ends[0]) + 1 if len(ends) else n_ok
    return n_ok


def speculative_greedy(
    model,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    cache,
    *,
    max_ngram: int = 3,
    num_draft: int = 8,
    draft_model=None,
    draft_stop_margin: float | None = NEAR_TIE,
    eos=None,
    stream=None,
    stats: SpeculativeStats | None = None,
) -> torch.Tensor:
    """Greedy continuation of input_ids (1, T) by up to max_new_tokens tokens -> (1, T +
    new), equal to plain greedy decoding with `model`. `cache` is an empty KVCache with
    room for T + max_new_tokens + num_draft tokens; `eos` a tensor of end ids or None;
    `stream(tokens (1,))` gets each token.

    Drafts come from prompt lookup, or from `draft_model` (a model with the same
    vocabulary, decoding greedily with a cache of its own; its drafts end after a near
    tie, a lead of at most draft_stop_margin, see `ModelDraft`). They are at most
    num_draft tokens long, and their length adapts: two more after a draft accepted
    whole, one fewer (down to 1) after a rejection, so that where drafts stop being
    right the passes shrink back towards one token's step.

    It runs under torch.inference_mode, which skips the bookkeeping no_grad still does
    for every view and in-place write (a draft step of the bundled int4 model, 2 CPU
    threads: about 10% faster), and returns an ordinary tensor, one that autograd may
    save."""
    if input_ids.shape[0] != 1:
        raise ValueError(
            f"speculative decoding takes one sequence, got a batch of "
            f"{input_ids.shape[0]}"
        )
    drafter = None
    if draft_model is not None:
        if draft_model.config.vocab_size != model.config.vocab_size:
            raise ValueError(
                f"the draft model's vocabulary ({draft_model.config.vocab_size} "
                f"tokens) is not the model's ({model.config.vocab_size})"
            )
        where = draft_model.model.embed_tokens.weight.device
        if where != input_ids.device:
            raise ValueError(
                f"the draft model is on {where}, the tokens on {input_ids.device}"
            )
    stats = stats if stats is not None else SpeculativeStats()
    with torch.inference_mode():
        if draft_model is not None:
            drafter = ModelDraft(draft_model, cache.max_len, draft_stop_margin)
        tokens = input_ids[0]
        logits, _ = model(input_ids, kv_cache=cache)  # prefill
        if drafter is not None:
            # the prompt's keys and values, not computed again
            drafter.start_from(cache)
        next_token = logits[0, -1].argmax()
        new, limit = 0, num_draft
        while new < max_new_tokens:
            tokens = torch.cat([tokens, next_token[None]])
            new += 1
            if stream is not None:
                stream(next_token[None])
            if new == max_new_tokens or (
                eos is not None and bool(torch.isin(next_token, eos))
            ):
                break
            k = min(limit, max_new_tokens - new)
            if drafter is not None:
                draft = drafter.draft(tokens, k)
            else:
                draft = lookup_draft(tokens, max_ngram, k)
            step = torch.cat([next_token[None], draft])[None]  # (1, 1 + k)
            logits, _ = model(step, kv_cache=cache)
            stats.forward_passes += 1
            # (1 + k,): greedy's token after each of step's tokens
            choice = logits[0].argmax(dim=-1)
            n_ok = min(accepted(choice, draft, eos), max_new_tokens - new)
            stats.drafted += len(draft)
            stats.accepted += n_ok
            limit = next_draft_limit(limit, len(draft), n_ok, num_draft)
            # forget the rejected tokens' keys and values
            cache.length -= len(draft) - n_ok
            for token in draft[:n_ok]:
                tokens = torch.cat([tokens, token[None]])
                new += 1
                if stream is not None:
                    stream(token[None])
            if drafter is not None:  # the draft's cache keeps only the verified text
                drafter.keep(len(tokens))
            if eos is not None and n_ok and bool(torch.isin(draft[n_ok - 1], eos)):
                break
            next_token = choice[n_ok]
    return tokens[None].clone()  # an inference tensor cannot be saved for backward
