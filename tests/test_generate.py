"""Generation: the KV cache changes nothing but speed, padding changes nothing,
sampling obeys its knobs."""

import copy

import pytest
import torch

from smol import SmolLM
from smol.generate import (
    FiniteLogits,
    GenerationConfig,
    decoding_path,
    filter_top_k,
    filter_top_p,
    generate,
    left_pad,
    sample_next_token,
)
from smol.kv_cache import KVCache
from smol.reference import llama_twin
from tests.tiny_models import config, peaked

CONFIG = config(211, 48, 96, 3, 6, 2, 128, rope_theta=10000.0)


@pytest.fixture(scope="module")
def model():
    return peaked(CONFIG)


def prompts(lengths, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, CONFIG.vocab_size, (1, n), generator=g) for n in lengths]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_cached_equals_uncached(model, attn):
    m = SmolLM(CONFIG.replace(attn_implementation=attn)).eval()
    m.load_state_dict(model.state_dict())
    ids = torch.cat(prompts([9, 9]))
    cached = generate(m, ids, 40, temperature=0)
    assert cached.shape == (2, 49) and cached.dtype == torch.long
    assert torch.equal(cached, generate(m, ids, 40, temperature=0, use_cache=False))
    assert cached[:, 9:].unique().numel() > 5  # not a degenerate constant
    kw = dict(temperature=0.8, top_k=50, top_p=0.9)  # sampling: same seed, same tokens
    a = generate(m, ids, 30, generator=torch.Generator().manual_seed(7), **kw)
    b = generate(
        m, ids, 30, generator=torch.Generator().manual_seed(7), use_cache=False, **kw
    )
    assert torch.equal(a, b)


@pytest.mark.parametrize("use_cache", [True, False])
def test_left_padded_batch_equals_one_by_one(model, use_cache):
    seqs = prompts([3, 11, 7])
    ids, mask = left_pad(seqs)
    batched = generate(
        model, ids, 25, temperature=0, attention_mask=mask, use_cache=use_cache
    )
    for row, s in enumerate(seqs):
        alone = generate(model, s, 25, temperature=0)
        assert torch.equal(batched[row, ids.shape[1] :], alone[0, s.shape[1] :]), row


def test_greedy_equals_transformers_generate(model):
    ref = llama_twin(CONFIG).eval()
    ref.load_state_dict(model.state_dict(), strict=False)
    ref.tie_weights()
    ids = torch.cat(prompts([8, 8], seed=3))
    expected = ref.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=30,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    assert torch.equal(generate(model, ids, 30, temperature=0), expected)


def test_eos_stops_rows_and_pads_them(model):
    ids = torch.cat(prompts([6, 6], seed=4))
    free = generate(model, ids, 20, temperature=0)
    eos = free[0, 6 + 3].item()  # row 0's fourth new token becomes "eos"
    out = generate(model, ids, 20, temperature=0, eos_token_id=eos)
    first = [
        (row[6:] == eos).nonzero()[0, 0].item() if (row[6:] == eos).any() else None
        for row in free
    ]
    for row in range(2):
        if first[row] is not None:  # after its eos a row only holds eos
            assert (out[row, 6 + first[row] :] == eos).all()
            assert torch.equal(out[row, : 6 + first[row]], free[row, : 6 + first[row]])
    if all(f is not None for f in first):
        assert out.shape[1] == 6 + max(first) + 1  # stopped once every row was done
    unused = next(i for i in range(CONFIG.vocab_size) if not (free == i).any())
    assert (
        generate(model, ids, 20, temperature=0, eos_token_id=[eos, unused]).shape
        == out.shape
    )
    # a tokenizer's eos as a tensor, 0-d or a list of ids, stops rows the same way
    for given in (torch.tensor(eos), torch.tensor([eos, unused])):
        assert torch.equal(
            generate(model, ids, 20, temperature=0, eos_token_id=given), out
        )


def test_a_padded_batch_generates_up_to_the_whole_context(model):
    # positions count real tokens only, so the longest row reaches the last position
    # the RoPE tables hold (max_position_embeddings - 1), not past it
    ids, mask = left_pad([[5, 6, 7], [8, 9, 10, 11, 12]])
    n = CONFIG.max_position_embeddings - ids.shape[1]
    out = generate(model, ids, n, temperature=0, attention_mask=mask)
    assert out.shape == (2, CONFIG.max_position_embeddings)
    alone = generate(model, ids[1:], n, temperature=0)
    assert torch.equal(out[1], alone[0])


def test_the_prompt_mask_and_eos_ids_are_made_on_the_prompts_device():
    from smol.generate import _eos_ids, _prompt_mask

    ids = torch.zeros(2, 3, dtype=torch.long, device="meta")  # a stand-in for a GPU
    mask, padded = _prompt_mask(ids, None)
    assert (mask.shape, mask.dtype, mask.device, padded) == (
        (2, 3),
        torch.long,
        ids.device,
        False,
    )
    assert _eos_ids([1, 2], 10, ids.device).device == ids.device


def test_stream_and_training_mode(model):
    seen = []
    model.train()
    try:
        out = generate(
            model, torch.cat(prompts([4, 4])), 5, temperature=0, stream=seen.append
        )
        assert model.training  # restored
    finally:
        model.eval()
    assert torch.equal(torch.stack(seen, dim=1), out[:, 4:])
    assert generate(model, out, 0).shape == out.shape


def test_finite_logits_flags_a_diverged_model_instead_of_failing_in_sampling(model):
    """FiniteLogits leaves a sound model's sampling as it is (the same tokens, the
    flag down, the mode kept) and turns a diverged one's (a NaN in the last norm's
    weight) from torch.multinomial's RuntimeError into the flag; a wrapper that
    changed finite logits, or forgot a NaN, fails here."""
    ids = torch.cat(prompts([4, 4]))
    g = torch.Generator().manual_seed(0)
    plain = generate(model, ids, 5, generator=g)
    watched = FiniteLogits(model)
    g = torch.Generator().manual_seed(0)
    assert torch.equal(generate(watched, ids, 5, generator=g), plain)
    assert not watched.nonfinite and not model.training
    broken = copy.deepcopy(model)
    with torch.no_grad():
        broken.model.norm.weight[0] = float("nan")
    with pytest.raises(RuntimeError, match="probability tensor contains"):
        generate(broken, ids, 5)
    watched = FiniteLogits(broken)
    assert generate(watched, ids, 5).shape == (2, 9) and watched.nonfinite


def test_filter_top_k():
    logits = torch.tensor([[1.0, 5.0, 3.0, 2.0, 4.0]])
    kept = filter_top_k(logits, 2)
    assert torch.isinf(kept).tolist() == [[True, False, True, True, False]]
    assert torch.equal(filter_top_k(logits, None), logits) and torch.equal(
        filter_top_k(logits, 9), logits
    )
    with pytest.raises(ValueError, match="top_k"):
        filter_top_k(logits, 0)


def test_filter_top_p():
    probs = torch.tensor([[0.5, 0.05, 0.3, 0.15]])
    logits = probs.log()
    assert torch.isfinite(filter_top_p(logits, 0.5)).tolist() == [
        [True, False, False, False]
    ]
    assert torch.isfinite(filter_top_p(logits, 0.7)).tolist() == [
        [True, False, True, False]
    ]  # 0.5 + 0.3 >= 0.7
    assert torch.isfinite(filter_top_p(logits, 0.9)).tolist() == [
        [True, False, True, True]
    ]
    assert (
        torch.isfinite(filter_top_p(logits, 0.0)).sum() == 1
    )  # always the most likely token
    assert torch.equal(filter_top_p(logits, 1.0), logits)


def test_sample_next_token():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 50, generator=g)
    greedy = logits.argmax(-1)
    assert torch.equal(sample_next_token(logits, temperature=0), greedy)
    assert torch.equal(sample_next_token(logits, top_k=1, generator=g), greedy)
    draws = torch.stack(
        [sample_next_token(logits, top_k=3, generator=g) for _ in range(200)]
    )
    assert all(
        set(draws[:, r].tolist()) <= set(logits[r].topk(3).indices.tolist())
        for r in range(4)
    )
    assert len(set(draws[:, 0].tolist())) > 1  # and it does sample
    a = sample_next_token(logits, generator=torch.Generator().manual_seed(5))
    assert torch.equal(
        a, sample_next_token(logits, generator=torch.Generator().manual_seed(5))
    )
    # temperature sharpens: at 0.01 (near) always the argmax
    cold = torch.stack(
        [sample_next_token(logits, temperature=0.01, generator=g) for _ in range(50)]
    )
    assert (cold == greedy).float().mean() > 0.95
    with pytest.raises(ValueError, match="temperature"):
        sample_next_token(logits, temperature=-1)


def test_sampling_defaults_bounds_and_nucleus():
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.0]] * 3)

    def seeded(**kw):
        return sample_next_token(
            logits, generator=torch.Generator().manual_seed(9), **kw
        )

    # the default temperature is 1: the model's own distribution
    assert torch.equal(seeded(), seeded(temperature=1.0))
    assert not all(torch.equal(seeded(), seeded(temperature=t)) for t in (0.3, 3.0))
    # top_p's bounds are both allowed: 0 keeps the most likely token, 1 keeps all
    assert torch.equal(seeded(top_p=0.0), logits.argmax(-1))
    assert torch.equal(seeded(top_p=1.0), seeded())
    # top_p acts when sampling: 0.4 of the mass is the first token alone
    g = torch.Generator().manual_seed(1)
    draws = torch.stack(
        [sample_next_token(logits, top_p=0.4, generator=g) for _ in range(50)]
    )
    assert (draws == 0).all()
    # one row (V,) gives one token ()
    assert sample_next_token(logits[0], temperature=0).shape == ()
    one = sample_next_token(logits[0], generator=torch.Generator().manual_seed(9))
    assert one.shape == () and one == seeded()[0]


def test_kv_cache_is_preallocated_and_bounded():
    cache = KVCache(CONFIG, batch_size=2, max_len=10)
    assert cache.k.shape == (3, 2, 2, 10, 8) and cache.length == 0
    k = torch.randn(2, 2, 4, 8)
    keys, values = cache.update(0, k, k)
    assert torch.equal(keys, k) and keys.shape[2] == 4
    cache.advance(4)
    with pytest.raises(ValueError, match="KV cache is full"):
        cache.update(0, torch.randn(2, 2, 7, 8), torch.randn(2, 2, 7, 8))
    with pytest.raises(ValueError, match="longer than the context"):
        KVCache(CONFIG, 1, 129)


@pytest.mark.parametrize(
    "kw, says",
    [
        (
            dict(temperature=float("inf")),
            "temperature must be a finite number >= 0, got inf",
        ),
        (
            dict(temperature=float("nan")),
            "temperature must be a finite number >= 0, got nan",
        ),
        (dict(temperature=-1.0), "temperature must be a finite number >= 0, got -1.0"),
        (dict(temperature=0, top_k=-5), "top_k must be a positive int or None, got -5"),
        (dict(temperature=0, top_k=0), "top_k must be a positive int or None, got 0"),
        (
            dict(temperature=1.0, top_k=2.5),
            "top_k must be a positive int or None, got 2.5",
        ),
        (
            dict(temperature=0, top_p=1.5),
            r"top_p must lie in \[0, 1\] or be None, got 1.5",
        ),
    ],
)
def test_sampling_settings_are_checked_even_when_greedy(kw, says):
    with pytest.raises(ValueError, match=says):
        sample_next_token(torch.zeros(2, 7), **kw)


def test_generate_checks_eos_ids_and_empty_rows(model):
    ids = torch.randint(0, CONFIG.vocab_size, (2, 4))
    for eos in (-1, CONFIG.vocab_size, [2, -1]):
        with pytest.raises(
            ValueError,
            match=rf"eos_token_id must be token ids in \[0, {CONFIG.vocab_size}\)",
        ):
            generate(model, ids, 2, temperature=0, eos_token_id=eos)
    with pytest.raises(ValueError, match="attention_mask row 1 has no tokens"):
        generate(
            model,
            ids,
            2,
            temperature=0,
            attention_mask=torch.tensor([[1, 1, 1, 1], [0, 0, 0, 0]]),
        )


@pytest.mark.parametrize(
    "mask",
    [
        [[1.0, 1.0, 1.0, 1.0], [0.5, 1.0, 1.0, 1.0]],  # cast to long, 0.5 was padding
        [[1, 1, 1, 1], [2, 1, 1, 1]],
        [[1, 1, 1, 1], [-1, 1, 1, 1]],
    ],
)
def test_generate_refuses_masks_of_other_values_than_0_and_1(model, mask):
    ids = torch.randint(0, CONFIG.vocab_size, (2, 4))
    with pytest.raises(ValueError, match="must hold only 0 .padding. and 1"):
        generate(model, ids, 2, temperature=0, attention_mask=torch.tensor(mask))


def test_generate_takes_a_bool_or_float_mask_of_0_and_1(model):
    ids = torch.randint(0, CONFIG.vocab_size, (2, 4))
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    want = generate(model, ids, 3, temperature=0, attention_mask=mask)
    for same in (mask.bool(), mask.float()):
        got = generate(model, ids, 3, temperature=0, attention_mask=same)
        assert torch.equal(got, want)


def test_left_pad_right_aligns_prompts_and_refuses_empty_ones():
    ids, mask = left_pad([[5, 6, 7], [8]], pad_id=2)
    assert ids.tolist() == [[5, 6, 7], [2, 2, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    for bad in ([], [[1, 2], []]):
        with pytest.raises(ValueError, match="no empty prompt"):
            left_pad(bad)


def test_left_pad_pads_with_0_by_default_on_the_device_asked_for():
    ids, mask = left_pad([[5, 6], [7]])
    assert ids.tolist() == [[5, 6], [0, 7]] and mask.tolist() == [[1, 1], [0, 1]]
    ids, mask = left_pad([[5, 6], [7]], device="meta")  # both tensors moved
    assert ids.device.type == mask.device.type == "meta"


def test_generate_continues_a_cache_that_holds_part_of_the_prompt(model):
    """A chat's earlier turns stay cached: generate prefills only the rest. A cache of
    exactly prompt + new tokens is enough; one holding the whole prompt (nothing left
    to prefill) or too short for the new tokens is refused before anything runs."""
    ids = prompts([10])[0]
    want = generate(model, ids, 5, temperature=0)

    def cached(max_len, n):  # a cache of max_len slots holding ids[:, :n]
        cache = KVCache.for_model(model, 1, max_len)
        with torch.no_grad():
            model(ids[:, :n], kv_cache=cache)
        return cache

    cache = cached(15, 6)
    assert torch.equal(generate(model, ids, 5, temperature=0, kv_cache=cache), want)
    assert cache.length == 14  # every token but the last new one, not fed yet
    for max_len, n in ((15, 10), (14, 6)):
        cache = cached(max_len, n)
        with pytest.raises(ValueError, match=f"kv_cache holds {n} tokens of {max_len}"):
            generate(model, ids, 5, temperature=0, kv_cache=cache)
        assert cache.length == n  # untouched


@pytest.mark.parametrize(
    "kw, error, says",
    [
        (dict(input_ids=[[1, 2, 3]]), TypeError, "input_ids must be a tensor of token"),
        (dict(input_ids=torch.ones(1, 3)), TypeError, "got torch.float32"),
        (dict(max_new_tokens=2.0), TypeError, "max_new_tokens must be an int, got 2.0"),
        (dict(eos_token_id="2"), ValueError, r"token ids in \[0, 211\), got '2'"),
        (dict(eos_token_id=2.0), ValueError, r"token ids in \[0, 211\), got 2.0"),
        (
            dict(attention_mask=[[1, 1, 1]]),
            TypeError,
            "attention_mask must be a tensor",
        ),
        (dict(stream=5), TypeError, "stream must be a callable, got int"),
    ],
)
def test_generate_names_arguments_of_the_wrong_kind(model, kw, error, says):
    args = dict(input_ids=torch.tensor([[1, 2, 3]]), max_new_tokens=2) | kw
    with pytest.raises(error, match=says):
        generate(model, **args, temperature=0)


def test_filters_refuse_a_float_k_and_a_nan_p():
    logits = torch.randn(2, 10)
    with pytest.raises(ValueError, match="top_k must be a positive int, got 2.5"):
        filter_top_k(logits, 2.5)
    # NaN compares false with everything: unchecked, it kept every token
    with pytest.raises(ValueError, match=r"top_p must lie in \[0, 1\], got nan"):
        filter_top_p(logits, float("nan"))
    with pytest.raises(ValueError, match=r"top_p must lie in \[0, 1\], got 1.5"):
        filter_top_p(logits, 1.5)


@pytest.mark.parametrize("shape", [(), (2,), (2, 3)])
def test_filters_act_on_the_last_dimension_whatever_the_leading_ones(shape):
    """One row (V,), a batch (B, V), or every position's logits (B, T, V): each row
    is filtered on its own, as the same rows in a (rows, V) batch are."""
    torch.manual_seed(0)
    logits = torch.randn(*shape, 50) * 3
    rows = logits.reshape(-1, 50)
    for k in (1, 7):
        got = filter_top_k(logits, k)
        assert torch.equal(got.reshape(-1, 50), filter_top_k(rows, k))
        assert (torch.isfinite(got).sum(-1) == k).all()
    for p in (0.3, 0.8):
        got = filter_top_p(logits, p)
        assert torch.equal(got.reshape(-1, 50), filter_top_p(rows, p))
        # the kept tokens are the row's most likely ones, and hold at least p
        kept = torch.isfinite(got)
        probs = logits.softmax(-1)
        assert (
            probs.masked_fill(~kept, 2).amin(-1) >= probs.masked_fill(kept, -1).amax(-1)
        ).all()
        assert (probs.masked_fill(~kept, 0).sum(-1) >= p).all()


def test_top_p_of_1_keeps_every_token_even_where_the_mass_rounds_to_1():
    # in float32 the first token's probability rounds to 1.0, so the mass before each
    # other token is 1.0 already: p = 1 must still keep them all (no filtering)
    logits = torch.tensor([[30.0, 0.0, -1.0]])
    assert logits.softmax(-1)[0, 0] == 1.0
    assert torch.equal(filter_top_p(logits, 1.0), logits)


@pytest.mark.parametrize(
    "args, error, says",
    [
        ((CONFIG, 1.5, 10), ValueError, "batch_size must be a positive int, got 1.5"),
        ((CONFIG, 1, "10"), ValueError, "max_len must be a positive int, got '10'"),
        ((CONFIG, 0, 10), ValueError, "batch_size must be a positive int, got 0"),
        ((CONFIG.to_hf_dict(), 1, 10), TypeError, "config must be a SmolConfig"),
    ],
)
def test_kv_cache_names_bad_arguments(args, error, says):
    with pytest.raises(error, match=says):
        KVCache(*args)
    with pytest.raises(TypeError, match="dtype must be a floating torch.dtype"):
        KVCache(CONFIG, 1, 10, dtype="float32")


# --- the settings object -------------------------------------------------------------
@pytest.mark.parametrize(
    "kw, error, says",
    [
        (
            dict(max_new_tokens=True),
            TypeError,
            "max_new_tokens must be an int, got True",
        ),
        (dict(max_new_tokens=-1), ValueError, "max_new_tokens must be >= 0, got -1"),
        (dict(temperature="1"), ValueError, "temperature must be a finite .*, got '1'"),
        (dict(temperature=float("nan")), ValueError, "temperature must .*, got nan"),
        (
            dict(temperature=1e-320),
            ValueError,
            r"temperature must be 0 \(greedy\) or at least 1e-06, got 1e-320",
        ),
        (dict(top_k=0), ValueError, "top_k must be a positive int or None, got 0"),
        (dict(top_k=2.0), ValueError, "top_k must be a positive int or None, got 2.0"),
        (dict(top_p=1.01), ValueError, r"top_p must lie in \[0, 1\] .*, got 1.01"),
        (dict(top_p=True), ValueError, r"top_p must lie in \[0, 1\] .*, got True"),
        (dict(use_cache=1), ValueError, "use_cache must be True or False, got 1"),
        (dict(compile=""), ValueError, "compile must be True, False or a backend's"),
        (dict(compile_mode=3), ValueError, "compile_mode must be a str or None, got 3"),
        (dict(speculative=-2), ValueError, "speculative must be a number of draft"),
        (dict(speculative=2), ValueError, "greedy: use temperature=0, got 1.0"),
    ],
)
def test_generation_config_names_the_bad_field_and_value(kw, error, says):
    with pytest.raises(error, match=says):
        GenerationConfig(**{"max_new_tokens": 4, **kw})


def test_generation_config_and_keywords_decode_alike(model):
    ids = torch.cat(prompts([6, 6]))
    greedy = GenerationConfig(12, temperature=0, eos_token_id=[7, 9])
    assert greedy.eos_token_id == (7, 9)  # a list is kept as a tuple: frozen
    expected = generate(model, ids, 12, temperature=0, eos_token_id=[7, 9])
    assert torch.equal(generate(model, ids, config=greedy), expected)
    # keywords and max_new_tokens override the config's fields, as in transformers
    shorter = generate(model, ids, 5, config=greedy, eos_token_id=None)
    assert torch.equal(shorter, generate(model, ids, 5, temperature=0))
    sampled = GenerationConfig(12, top_k=5)  # temperature 1 unless given
    a = generate(model, ids, config=sampled, generator=torch.Generator().manual_seed(4))
    b = generate(model, ids, 12, top_k=5, generator=torch.Generator().manual_seed(4))
    assert torch.equal(a, b) and not torch.equal(a, generate(model, ids, config=greedy))
    assert greedy.replace(max_new_tokens=3).max_new_tokens == 3
    with pytest.raises(TypeError, match="'temprature' is not a setting of generation"):
        generate(model, ids, 4, temprature=0)
    with pytest.raises(TypeError, match="max_new_tokens is missing"):
        generate(model, ids, temperature=0)
    with pytest.raises(TypeError, match="config must be a GenerationConfig, got dict"):
        generate(model, ids, config={"max_new_tokens": 4})
    with pytest.raises(ValueError, match="top_k must be a positive int or None"):
        greedy.replace(top_k=0)  # a replaced field is checked too


def test_decoding_path_is_decided_once_from_the_settings():
    def path(**kw):
        return decoding_path(GenerationConfig(8, temperature=0, **kw))

    assert (path().kind, str(path())) == ("cache", "a KV cache")
    assert path(use_cache=False).kind == "no cache"
    assert path(compile=True).kind == "static"
    assert str(path(compile="aot_eager", compile_mode="max-autotune")) == (
        "a static KV cache, compiled (aot_eager, mode max-autotune)"
    )
    assert str(path(compile=True)) == "a static KV cache, compiled (inductor)"
    assert path(speculative=4).kind == "speculative"
    assert str(path(speculative=4)).endswith(
        "up to 4 tokens a step drafted by prompt lookup"
    )
    spec = GenerationConfig(8, temperature=0, speculative=3)
    assert str(decoding_path(spec, draft=True)).endswith("drafted by a draft model")
    cache = KVCache(CONFIG, 1, 16)
    assert decoding_path(GenerationConfig(8), kv_cache=cache).kind == "cache"
    refused = [
        (
            dict(config=GenerationConfig(8, use_cache=False), kv_cache=cache),
            "use_cache",
        ),
        (dict(config=spec, kv_cache=cache), "keep their own cache"),
        (dict(config=GenerationConfig(8), draft=True), "pass speculative=k"),
        (dict(config=spec, batch_size=2), "one unpadded sequence, got a batch of 2"),
        (dict(config=spec, padded=True), "one unpadded sequence"),
    ]
    for kw, says in refused:
        with pytest.raises(ValueError, match=says):
            decoding_path(**kw)
