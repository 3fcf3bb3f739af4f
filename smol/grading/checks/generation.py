"""08 KV-cache generation: top-k and top-p filters, greedy decoding with a cache, and an
attention mask that stops being causal when a padding mask is passed."""

import torch

from smol import SmolLM
from smol.generate import (
    filter_top_k as reference_top_k,
    filter_top_p as reference_top_p,
    generate,
)
from smol.grading.checks._util import close, is_tensor, same_shape, small_config
from smol.grading.core import check, task

task(
    "filter_top_k",
    "kv_cache_generation",
    "filter_top_k(logits, k): keep the k largest logits",
)
task(
    "filter_top_p", "kv_cache_generation", "filter_top_p(logits, p): nucleus filtering"
)
task(
    "kv_generate",
    "kv_cache_generation",
    "greedy_generate(model, input_ids, n): decoding with a KV cache",
)
task(
    "attention_mask_bug",
    "kv_cache_generation",
    "Find the bug: a padding mask that switches causality off",
)

NEG = float("-inf")


def _same_filter(out, want, what):
    same_shape(out, want.shape, what)
    kept, want_kept = out != NEG, want != NEG
    if not torch.equal(kept, want_kept):
        raise AssertionError(
            f"{what}: keeps {kept.sum(-1).tolist()} tokens per row, expected "
            f"{want_kept.sum(-1).tolist()}"
        )
    close(out[kept], want[want_kept], f"{what}: the kept logits")


def _keeps_every_logit(fn, name, logits, arguments):
    """fn(logits, argument) returns the logits unchanged, for every argument of
    `arguments` ({argument: how a message shows it})."""
    for argument, shown in arguments.items():
        _same_filter(fn(logits, argument), logits, f"{name}(logits, {shown})")


@check(
    "filter_top_k",
    "keeps exactly the k largest logits of each row, the rest -inf",
    2,
    "the k-th largest value is torch.topk(logits, k).values[..., -1:]; masked_fill "
    "what is below it",
)
def _(fn):
    logits = torch.randn(3, 50)
    for k in (1, 5, 17):
        _same_filter(
            fn(logits, k), reference_top_k(logits, k), f"filter_top_k(logits, {k})"
        )


@check(
    "filter_top_k",
    "k >= vocabulary size keeps every logit",
    1,
    "nothing to remove when k >= V",
)
def _(fn):
    _keeps_every_logit(fn, "filter_top_k", torch.randn(2, 10), {10: "V", 25: "25"})


@check(
    "filter_top_k",
    "leaves its input unchanged",
    1,
    "masked_fill (not masked_fill_) returns a new tensor",
)
def _(fn):
    logits = torch.randn(2, 20)
    before = logits.clone()
    fn(logits, 3)
    assert torch.equal(logits, before), "filter_top_k wrote into the caller's logits"


@check(
    "filter_top_p",
    "keeps the smallest set of most likely tokens whose probability reaches p",
    2,
    "sort descending, softmax, cumsum; drop a token when the mass of the tokens before "
    "it is already >= p",
)
def _(fn):
    logits = torch.randn(4, 40) * 2
    for p in (0.3, 0.9):
        want = reference_top_p(logits, p)
        _same_filter(fn(logits, p), want, f"filter_top_p(logits, {p})")


@check(
    "filter_top_p",
    "always keeps the most likely token, even for a tiny p",
    1,
    "the first sorted token is never removed (remove[..., 0] = False)",
)
def _(fn):
    logits = torch.randn(3, 30)
    _same_filter(
        fn(logits, 1e-4), reference_top_p(logits, 1e-4), "filter_top_p(logits, 1e-4)"
    )


@check(
    "filter_top_p",
    "leaves its input unchanged",
    1,
    "masked_fill (not masked_fill_, nor logits[remove] = ...) returns a new tensor",
)
def _(fn):
    logits = torch.randn(2, 20)
    before = logits.clone()
    fn(logits, 0.5)
    assert torch.equal(logits, before), "filter_top_p wrote into the caller's logits"


@check(
    "filter_top_p",
    "p = 1 keeps every logit",
    1,
    "the whole distribution has probability 1",
)
def _(fn):
    _keeps_every_logit(fn, "filter_top_p", torch.randn(2, 30), {1.0: "1.0"})


CONFIG = small_config(67)


def _model():
    model = SmolLM(CONFIG).eval()
    # larger weights than the init: distinct, confident greedy choices
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(8)
    return model


class _Spy:
    """Records, for each forward call, how many tokens came in and whether a cache came
    along."""

    def __init__(self, model):
        self.calls, self.forward = [], model.forward

    def __call__(self, input_ids, *args, **kwargs):
        cache = kwargs.get("kv_cache", args[3] if len(args) > 3 else None)
        self.calls.append((input_ids.shape[1], cache is not None))
        return self.forward(input_ids, *args, **kwargs)


@check(
    "kv_generate",
    "returns (B, T + max_new_tokens) token ids starting with the prompt",
    1,
    "append one token per step with torch.cat([tokens, next_token[:, None]], dim=1)",
)
def _(fn):
    model, prompt = _model(), torch.randint(0, CONFIG.vocab_size, (2, 5))
    out = same_shape(fn(model, prompt, 6), (2, 11), "greedy_generate(model, prompt, 6)")
    assert torch.equal(out[:, :5], prompt), "the output does not start with the prompt"


@check(
    "kv_generate",
    "the same tokens as greedy decoding without a cache",
    2,
    "prefill the whole prompt once, then feed only the newest token; take argmax of "
    "the last logits",
)
def _(fn):
    model, prompt = _model(), torch.randint(0, CONFIG.vocab_size, (3, 4))
    want = generate(model, prompt, 8, temperature=0.0, use_cache=False)
    out = is_tensor(fn(model, prompt, 8))
    assert torch.equal(out, want), (
        f"generated {out[:, 4:].tolist()}, expected {want[:, 4:].tolist()}"
    )


@check(
    "kv_generate",
    "uses the cache: after the prompt, each forward call sees one new token",
    1,
    "KVCache(model.config, B, T + max_new_tokens); model(ids, kv_cache=cache) appends "
    "to it itself",
)
def _(fn):
    model, prompt = _model(), torch.randint(0, CONFIG.vocab_size, (1, 6))
    spy = _Spy(model)
    model.forward = spy
    fn(model, prompt, 5)
    lengths = [n for n, _ in spy.calls]
    assert spy.calls and all(c for _, c in spy.calls), (
        "the model was called without kv_cache="
    )
    assert lengths[0] == 6 and all(n == 1 for n in lengths[1:]), (
        f"tokens per call {lengths}, expected [6, 1, 1, ...]"
    )


@check(
    "kv_generate",
    "a one-token prompt works too",
    1,
    "the prefill may be a single token",
)
def _(fn):
    model, prompt = _model(), torch.randint(0, CONFIG.vocab_size, (2, 1))
    want = generate(model, prompt, 4, temperature=0.0, use_cache=False)
    out = is_tensor(fn(model, prompt, 4))
    assert torch.equal(out, want), f"generated {out.tolist()}, expected {want.tolist()}"


def _reference_mask(attention_mask, T, offset=0):
    Tk = offset + T
    q = torch.arange(offset, Tk)[:, None]
    k = torch.arange(Tk)[None, :]
    mask = (k <= q)[None, None]
    if attention_mask is not None:
        mask = mask & attention_mask.bool()[:, None, None, :] | (k == q)
    return mask


def _mask(fn, attention_mask, T, offset=0):
    out = is_tensor(fn(attention_mask, T, offset), "the mask")
    assert out.dtype == torch.bool, (
        f"the mask has dtype {out.dtype}, expected torch.bool"
    )
    B = 1 if attention_mask is None else attention_mask.shape[0]
    try:
        return out.expand(B, 1, T, offset + T)
    except RuntimeError:
        raise AssertionError(
            f"the mask has shape {tuple(out.shape)}, which does not broadcast to "
            f"(B, 1, T, offset + T) = {(B, 1, T, offset + T)}"
        ) from None


# left padding (generation), none, right padding (training batches)
PADDED = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])


@check(
    "attention_mask_bug",
    "no padding mask: causal, also with cached tokens before",
    1,
    "query at position offset + i sees keys 0 .. offset + i",
)
def _(fn):
    for T, offset in ((5, 0), (3, 4)):
        got = _mask(fn, None, T, offset)
        assert torch.equal(got, _reference_mask(None, T, offset)), (
            f"wrong causal mask for T={T}, offset={offset}"
        )


@check(
    "attention_mask_bug",
    "padded keys are hidden from real tokens",
    1,
    "combine with attention_mask.bool()[:, None, None, :] (the keys' axis)",
)
def _(fn):
    got = _mask(fn, PADDED, 6)
    real = PADDED.bool()
    for b in range(len(PADDED)):
        for i in range(6):
            if real[b, i]:
                assert not got[b, 0, i][~real[b]].any(), (
                    f"row {b}: token {i} sees a padded key"
                )


@check(
    "attention_mask_bug",
    "real tokens see every real token up to themselves (left or right padding, with "
    "cached tokens too)",
    1,
    "hide only what is padding or later: causal AND attention_mask, with the query "
    "positions offset + 0 .. offset + T - 1; nothing more",
)
def _(fn):
    real = PADDED.bool()
    for T, offset in ((6, 0), (2, 4)):
        got = _mask(fn, PADDED, T, offset)
        for b in range(len(PADDED)):
            for i in range(T):
                q = offset + i
                want = real[b, : q + 1]  # the real keys up to the query
                if real[b, q] and not got[b, 0, i, : q + 1][want].all():
                    raise AssertionError(
                        f"row {b}: the token at position {q} does not see every "
                        f"real token up to itself (T={T}, offset={offset})"
                    )


@check(
    "attention_mask_bug",
    "with a padding mask, attention is still causal (no peeking at later tokens)",
    2,
    "AND the padding mask with the causal mask; do not replace one by the other",
)
def _(fn):
    for am, T, offset in ((PADDED, 6, 0), (PADDED, 2, 4)):
        got = _mask(fn, am, T, offset)
        q = torch.arange(offset, offset + T)[:, None]
        k = torch.arange(offset + T)[None, :]
        assert not got[..., k > q].any(), (
            f"a query sees a later key (T={T}, offset={offset})"
        )


@check(
    "attention_mask_bug",
    "a padding query still sees itself (no all-masked row, no NaN)",
    1,
    "OR the diagonal back in: (k_pos == q_pos); a row of only -inf makes softmax "
    "return NaN",
)
def _(fn):
    got = _mask(fn, PADDED, 6)
    assert got.any(-1).all(), "some query row masks every key"
    for i in range(6):
        assert got[0, 0, i, i], f"row 0: query {i} does not see itself"
