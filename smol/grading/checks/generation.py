"""08 KV-cache generation: top-k and top-p filters, greedy decoding with a cache, and an
attention mask that stops being causal when a padding mask is passed."""

import torch

from smol import SmolLM
from smol.generate import (
    filter_top_k as reference_top_k,
    filter_top_p as reference_top_p,
    generate,
)
from smol.grading.checks._util import (
    after_prefill,
    close,
    forward_calls,
    is_tensor,
    same_shape,
    small_config,
)
from smol.grading.registry import probe_check, task

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


def _judge_filters(name, arguments, logits, outs, reference):
    """Judge side: each of `outs`, fn(logits, argument) for an argument of
    `arguments` ({argument: how a message shows it}), equals reference(argument)."""
    for (argument, shown), out in zip(arguments.items(), outs, strict=True):
        _same_filter(out, reference(argument), f"{name}(logits, {shown})")


def _filter_check(task_name, name, points, hint, make_logits, arguments, reference):
    """A check that the filter of `task_name` on logits from make_logits() equals
    reference(logits, argument) for every argument of `arguments` (each call on a
    copy: writing into the logits is the business of `_leaves_input`)."""
    probe_check(
        task_name,
        name,
        points,
        hint,
        inputs=make_logits,
        judge=lambda logits, outs: _judge_filters(
            task_name, arguments, logits, outs, lambda a: reference(logits, a)
        ),
    )(lambda fn, logits: [fn(logits.clone(), argument) for argument in arguments])


def _leaves_input(task_name, hint, argument):
    """A check that the filter of `task_name` does not write into its logits."""

    def judge(logits, after):
        assert isinstance(after, torch.Tensor) and torch.equal(after, logits), (
            f"{task_name} wrote into the caller's logits"
        )

    def probe(fn, logits):
        fn(logits, argument)
        return logits

    probe_check(
        task_name,
        "leaves its input unchanged",
        1,
        hint,
        inputs=lambda: torch.randn(2, 20),
        judge=judge,
    )(probe)


_filter_check(
    "filter_top_k",
    "keeps exactly the k largest logits of each row, the rest -inf",
    2,
    "the k-th largest value is torch.topk(logits, k).values[..., -1:]; masked_fill "
    "what is below it",
    lambda: torch.randn(3, 50),
    {1: "1", 5: "5", 17: "17"},
    reference_top_k,
)
_filter_check(
    "filter_top_k",
    "k >= vocabulary size keeps every logit",
    1,
    "nothing to remove when k >= V",
    lambda: torch.randn(2, 10),
    {10: "V", 25: "25"},
    lambda logits, k: logits,
)
_leaves_input("filter_top_k", "masked_fill (not masked_fill_) returns a new tensor", 3)
_filter_check(
    "filter_top_p",
    "keeps the smallest set of most likely tokens whose probability reaches p",
    2,
    "sort descending, softmax, cumsum; drop a token when the mass of the tokens before "
    "it is already >= p",
    lambda: torch.randn(4, 40) * 2,
    {0.3: "0.3", 0.9: "0.9"},
    reference_top_p,
)
_filter_check(
    "filter_top_p",
    "always keeps the most likely token, even for a tiny p",
    1,
    "the first sorted token is never removed (remove[..., 0] = False)",
    lambda: torch.randn(3, 30),
    {1e-4: "1e-4"},
    reference_top_p,
)
_leaves_input(
    "filter_top_p",
    "masked_fill (not masked_fill_, nor logits[remove] = ...) returns a new tensor",
    0.5,
)


def _judge_nucleus(logits, outs, ps, tol):
    """Judge side: each of `outs`, the filter at p for p of `ps`, keeps a set of most
    likely tokens whose exact (float64) mass reaches p - tol and that without its
    least likely token falls below p + tol: ties and float32 sums may pick other
    tokens than smol's sort, but not more or fewer than within `tol`."""
    probs = logits.double().softmax(-1)
    for p, out in zip(ps, outs, strict=True):
        what = f"filter_top_p({logits.dtype} logits, {p})"
        kept = same_shape(out, logits.shape, what) != NEG
        for row, (k, pr) in enumerate(zip(kept, probs)):
            mass, least = pr[k].sum().item(), pr[k].min().item()
            dropped = pr[~k]
            assert not len(dropped) or dropped.max().item() <= least, (
                f"{what}, row {row}: drops a token more likely than one it keeps"
            )
            assert mass >= p - tol and mass - least < p + tol, (
                f"{what}, row {row}: keeps {int(k.sum())} tokens of mass "
                f"{mass:.6f}; the smallest set of mass >= {p} has "
                f"{'more' if mass < p - tol else 'fewer'}"
            )


def _nucleus_check(name, hint, make_logits, ps, tol):
    """A check of filter_top_p at each p of `ps` on logits from make_logits(), judged
    by `_judge_nucleus` (within `tol`)."""
    probe_check(
        "filter_top_p",
        name,
        1,
        hint,
        inputs=make_logits,
        judge=lambda logits, outs: _judge_nucleus(logits, outs, ps, tol),
    )(lambda fn, logits: [fn(logits.clone(), p) for p in ps])


def _uniform_rows():
    """Probabilities 1/4 (four tokens, the rest -inf) and 1/8: masses of multiples
    of 1/8, exact in every float type, reach p = 0.25 and 0.5 exactly."""
    logits = torch.zeros(2, 8)
    logits[0, 4:] = NEG
    return logits


_nucleus_check(
    "a mass of exactly p is enough: no token after it is kept",
    "remove a token when the mass before it is >= p (not > p): with probabilities "
    "1/4 each and p = 0.5, two tokens reach p",
    _uniform_rows,
    (0.25, 0.5),
    0.0,
)
_nucleus_check(
    "bfloat16 logits: the probabilities summed in float32",
    "softmax and cumsum of sorted_logits.float(): summed in bfloat16, the mass near "
    "p = 0.9 is off by ~0.004, a token or two",
    lambda: (torch.randn(64, 200, generator=torch.Generator().manual_seed(0)) * 2).to(
        torch.bfloat16
    ),
    (0.9, 0.95),
    1e-3,
)


_filter_check(
    "filter_top_p",
    "p = 1 keeps every logit",
    1,
    "the whole distribution has probability 1",
    lambda: torch.randn(2, 30),
    {1.0: "1.0"},
    lambda logits, p: logits,
)


CONFIG = small_config(67)


def _model(state):
    model = SmolLM(CONFIG).eval()
    model.load_state_dict(state)
    return model


def _scaled_model(scale=8):
    """A model of CONFIG whose matrices are `scale` times the init's: larger weights
    make distinct, confident greedy choices."""
    model = SmolLM(CONFIG).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(scale)
    return model


def _model_and_prompt(*shape):
    prompt = torch.randint(0, CONFIG.vocab_size, shape)
    return {"state": _scaled_model().state_dict(), "prompt": prompt}


def _greedy(fn, inputs, n):
    """Probe side: the student's decoding of n tokens on the inputs' model and
    prompt."""
    return fn(_model(inputs["state"]), inputs["prompt"], n)


def _passes(n):
    """A probe: the forward calls (smol.grading.checks._util.forward_calls) of the
    student's decoding of n tokens on the inputs' model and prompt."""
    return lambda fn, inputs: forward_calls(
        fn, _model(inputs["state"]), inputs["prompt"], n
    )


def _judge_prompt_kept(n: int, model="model"):
    """Judge side: the output of greedy_generate(model, prompt, n) is (B, T + n)
    and starts with the prompt."""

    def judge(inputs, out):
        B, T = inputs["prompt"].shape
        same_shape(out, (B, T + n), f"greedy_generate({model}, prompt, {n})")
        assert torch.equal(out[:, :T], inputs["prompt"]), (
            "the output does not start with the prompt"
        )

    return judge


@probe_check(
    "kv_generate",
    "returns (B, T + max_new_tokens) token ids starting with the prompt",
    1,
    "append one token per step with torch.cat([tokens, next_token[:, None]], dim=1)",
    inputs=lambda: _model_and_prompt(2, 5),
    judge=_judge_prompt_kept(6),
)
def _(fn, inputs):
    return _greedy(fn, inputs, 6)


def _judge_greedy(inputs, out, n, show=slice(None)):
    prompt = inputs["prompt"]
    want = generate(
        _model(inputs["state"]), prompt, n, temperature=0.0, use_cache=False
    )
    is_tensor(out)
    assert out.shape == want.shape and torch.equal(out, want), (
        f"generated {out[:, show].tolist()}, expected {want[:, show].tolist()}"
    )


@probe_check(
    "kv_generate",
    "the same tokens as greedy decoding without a cache",
    2,
    "prefill the whole prompt once, then feed only the newest token; take argmax of "
    "the last logits",
    inputs=lambda: _model_and_prompt(3, 4),
    judge=lambda inputs, out: _judge_greedy(inputs, out, 8, slice(4, None)),
)
def _(fn, inputs):
    return _greedy(fn, inputs, 8)


def _judge_cache_used(inputs, calls):
    steps = after_prefill(calls, 6)
    assert all(n == 1 for n in steps), (
        f"tokens per call after the prefill {steps}, expected [1, 1, ...]"
    )


probe_check(
    "kv_generate",
    "uses the cache: after the prompt, each forward call sees one new token",
    1,
    "KVCache(model.config, B, T + max_new_tokens); model(ids, kv_cache=cache) appends "
    "to it itself",
    inputs=lambda: _model_and_prompt(1, 6),
    judge=_judge_cache_used,
)(_passes(5))


@probe_check(
    "kv_generate",
    "a one-token prompt works too",
    1,
    "the prefill may be a single token",
    inputs=lambda: _model_and_prompt(2, 1),
    judge=lambda inputs, out: _judge_greedy(inputs, out, 4),
)
def _(fn, inputs):
    return _greedy(fn, inputs, 4)


@probe_check(
    "kv_generate",
    "max_new_tokens = 0 returns the prompt itself",
    1,
    "generate inside the loop over range(max_new_tokens), prefill included: a token "
    "taken from the prefill before the loop is one too many when none is asked for",
    inputs=lambda: _model_and_prompt(2, 5),
    judge=_judge_prompt_kept(0),
)
def _(fn, inputs):
    return _greedy(fn, inputs, 0)


@probe_check(
    "kv_generate",
    "a bfloat16 model decodes too (a cache in the model's dtype)",
    1,
    "KVCache.for_model(model, B, length) takes the model's dtype and device (or pass "
    "dtype= and device= to KVCache); a float32 cache does not fit a bfloat16 model",
    inputs=lambda: _model_and_prompt(2, 4),
    judge=_judge_prompt_kept(3, "a bfloat16 model"),
)
def _(fn, inputs):
    return fn(_model(inputs["state"]).bfloat16(), inputs["prompt"], 3)
