"""The model on its own: init statistics, tying, errors, RoPE tables, caching,
checkpointing, compile."""

import math

import pytest
import torch

from smol import SmolConfig, SmolLM
from smol.attention import eager_attention, grouped_decode_attention, repeat_kv
from smol.kv_cache import KVCache
from smol.norm import RMSNorm
from smol.rope import RotaryEmbedding


def test_135m_preset_is_smollm2_as_released():
    c = SmolConfig.preset("smollm2-135m")
    assert (
        c.hidden_size,
        c.num_hidden_layers,
        c.num_attention_heads,
        c.num_key_value_heads,
    ) == (576, 30, 9, 3)
    assert (c.head_dim, c.intermediate_size, c.vocab_size, c.n_rep) == (
        64,
        1536,
        49152,
        3,
    )
    assert (
        c.rope_theta,
        c.rms_norm_eps,
        c.max_position_embeddings,
        c.tie_word_embeddings,
    ) == (1e5, 1e-5, 8192, True)
    with torch.device("meta"):
        model = SmolLM(c)
    assert model.count_params() == 134_515_008
    assert model.count_params(non_embedding=True) == 134_515_008 - 49152 * 576


def test_config_round_trips_through_hf_dict():
    for name in ("smollm2-135m", "tiny"):
        c = SmolConfig.preset(name)
        assert SmolConfig.from_hf_dict(c.to_hf_dict()) == c
    # what readers of a config.json other than smol look for, spelled as transformers
    # spells it
    from transformers import LlamaConfig

    d = SmolConfig.preset("tiny").to_hf_dict()
    assert d["architectures"] == ["LlamaForCausalLM"] and d["torch_dtype"] == "float32"
    llama = LlamaConfig(**d)
    for key in ("head_dim", "hidden_act", "attention_bias", "mlp_bias"):
        assert d[key] == getattr(llama, key), key
    # a Llama config without model_type is read; another architecture is refused
    d = SmolConfig.preset("tiny").to_hf_dict()
    del d["model_type"]
    assert SmolConfig.from_hf_dict(d) == SmolConfig.preset("tiny")
    with pytest.raises(ValueError, match="mistral"):
        SmolConfig.from_hf_dict({**d, "model_type": "mistral"})


@pytest.mark.parametrize(
    "change, says",
    [
        (dict(hidden_act="gelu"), "SiLU-gated MLPs without biases"),
        (dict(attention_bias=True), "SiLU-gated MLPs without biases"),
        (dict(mlp_bias=True), "SiLU-gated MLPs without biases"),
        (dict(rope_scaling={"rope_type": "llama3", "factor": 8.0}), "plain RoPE"),
        (dict(rope_scaling={"type": "linear", "factor": 2.0}), "plain RoPE"),
        (dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e5}), "plain RoPE"),
    ],
)
def test_from_hf_dict_refuses_what_smol_does_not_model(change, says):
    """Each feature alone is refused (a check that needs two of them lets one pass)."""
    d = SmolConfig.preset("tiny").to_hf_dict()
    with pytest.raises(ValueError, match=says):
        SmolConfig.from_hf_dict({**d, **change})


def test_from_hf_dict_reads_rope_theta_where_each_version_writes_it():
    """transformers 4 writes rope_theta at the top level; 5 inside rope_parameters; an
    old config without either means Llama's 10000. Keys left out take their defaults:
    no biases, SiLU, plain RoPE."""
    d = SmolConfig.preset("tiny").to_hf_dict()
    for key in ("rope_theta", "hidden_act", "attention_bias", "mlp_bias"):
        d.pop(key, None)
    d.pop("rope_parameters", None)
    assert SmolConfig.from_hf_dict(d).rope_theta == 10000.0
    v5 = {**d, "rope_parameters": {"rope_type": "default", "rope_theta": 1e5}}
    assert SmolConfig.from_hf_dict(v5).rope_theta == 1e5
    v4 = {**d, "rope_theta": 3e4, "rope_scaling": {"type": "default"}}
    assert SmolConfig.from_hf_dict(v4).rope_theta == 3e4
    assert SmolConfig.from_hf_dict({**v5, "rope_theta": 5e4}).rope_theta == 5e4
    # no num_key_value_heads: one per query head; a runtime choice stored by another
    # library is not smol's to take
    mha = {k: v for k, v in d.items() if k != "num_key_value_heads"}
    assert SmolConfig.from_hf_dict(mha).num_key_value_heads == 4
    odd = {**d, "attn_implementation": "flash_attention_2"}
    assert SmolConfig.from_hf_dict(odd).attn_implementation == "sdpa"
    with pytest.raises(ValueError, match="head_dim 16 \\* heads 4 != hidden_size 128"):
        SmolConfig.from_hf_dict({**d, "head_dim": 16})


def test_init_statistics_follow_the_config():
    config = SmolConfig.preset("tiny", num_hidden_layers=6, vocab_size=8000)
    torch.manual_seed(0)
    model = SmolLM(config)
    std = config.initializer_range
    residual = std / math.sqrt(2 * config.num_hidden_layers)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            assert torch.equal(p, torch.ones_like(p)), name
            continue
        expected = (
            residual if name.endswith(("o_proj.weight", "down_proj.weight")) else std
        )
        assert p.mean().abs() < 3 * expected / math.sqrt(p.numel()), name
        assert abs(p.std().item() / expected - 1) < 0.05, (
            f"{name}: std {p.std().item():.5f}, expected {expected:.5f}"
        )


def test_tied_matrix_is_one_tensor_initialised_once(monkeypatch):
    calls = []
    original = torch.nn.init.normal_

    def spy(tensor, *args, **kwargs):
        calls.append(tensor.data_ptr())
        return original(tensor, *args, **kwargs)

    model = SmolLM(SmolConfig.preset("tiny"))
    monkeypatch.setattr(torch.nn.init, "normal_", spy)
    model.reset_parameters()
    shared = model.model.embed_tokens.weight
    assert model.lm_head.weight is shared
    assert calls.count(shared.data_ptr()) == 1
    assert (
        len(calls)
        == len(set(calls))
        == sum(1 for n, _ in model.named_parameters() if not n.endswith("norm.weight"))
    )
    # counted once, and it stays shared through a dtype/device move
    assert model.count_params() == sum(
        p.numel() for p in {id(p): p for p in model.parameters()}.values()
    )
    model = model.to(torch.bfloat16)
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_untied_head_is_its_own_matrix():
    model = SmolLM(SmolConfig.preset("tiny", tie_word_embeddings=False))
    assert model.lm_head.weight is not model.model.embed_tokens.weight
    tied = SmolLM(SmolConfig.preset("tiny"))
    assert model.count_params() - tied.count_params() == 4096 * 128
    # an untied model never borrows the embedding for a head its checkpoint lacks
    sd = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    with pytest.raises(ValueError, match="lm_head.weight"):
        model.load_state_dict(sd)


def test_initial_loss_is_near_uniform():
    torch.manual_seed(0)
    config = SmolConfig.preset("tiny")
    model = SmolLM(config)
    ids = torch.randint(0, config.vocab_size, (4, 64))
    targets = torch.randint(0, config.vocab_size, (4, 64))
    _, loss = model(ids, targets)
    assert abs(loss.item() - math.log(config.vocab_size)) < 0.1


def test_ignore_index_and_loss_shape_errors():
    torch.manual_seed(0)
    model = SmolLM(SmolConfig.preset("tiny"))
    ids = torch.randint(0, 4096, (2, 8))
    targets = ids.roll(-1, dims=1)
    _, full = model(ids, targets)
    masked = targets.clone()
    masked[:, 4:] = -100
    logits, part = model(ids, masked)
    expected = torch.nn.functional.cross_entropy(
        logits[:, :4].reshape(-1, 4096), targets[:, :4].reshape(-1)
    )
    torch.testing.assert_close(part, expected)
    assert not torch.isclose(part, full)
    with pytest.raises(ValueError, match="targets must have the shape"):
        model(ids, targets[:, :-1])


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            dict(num_key_value_heads=4, num_attention_heads=6, hidden_size=48),
            "divisible by num_key_value_heads",
        ),
        (
            dict(hidden_size=130),
            "hidden_size \\(130\\) must be divisible by num_attention_heads",
        ),
        (
            dict(hidden_size=12, num_attention_heads=4, num_key_value_heads=2),
            "head_dim \\(3\\) must be even",
        ),
        (dict(num_hidden_layers=0), "num_hidden_layers must be a positive int"),
        (dict(vocab_size=0), "vocab_size must be a positive int, got 0"),
        (dict(attn_implementation="flash"), "attn_implementation"),
    ],
)
def test_bad_configs_are_refused(changes, message):
    with pytest.raises(ValueError, match=message):
        SmolConfig.preset("tiny", **changes)
    with pytest.raises(KeyError, match="unknown preset 'huge'"):
        SmolConfig.preset("huge")


def test_bad_inputs_get_clear_errors():
    model = SmolLM(SmolConfig.preset("tiny", max_position_embeddings=32))
    with pytest.raises(
        ValueError, match="longer than the context \\(max_position_embeddings=32\\)"
    ):
        model(torch.zeros(1, 33, dtype=torch.long))
    with pytest.raises(
        ValueError,
        match="token ids must lie in \\[0, 4096\\), got values from 0 to 4096",
    ):
        model(torch.tensor([[0, 4096]]))
    with pytest.raises(ValueError, match="from -1"):
        model(torch.tensor([[-1, 3]]))
    with pytest.raises(TypeError, match="input_ids must hold integers"):
        model(torch.zeros(1, 4))
    with pytest.raises(ValueError, match="shape \\(batch, seq_len\\), got \\(4,\\)"):
        model(torch.zeros(4, dtype=torch.long))
    with pytest.raises(TypeError, match="got list"):
        model([[1, 2]])
    with pytest.raises(ValueError, match="attention_mask must have shape"):
        model(torch.zeros(2, 4, dtype=torch.long), attention_mask=torch.ones(2, 5))


def test_token_ids_are_range_checked_on_cpu_without_reading_back_other_devices():
    """On a CPU out-of-range ids get a clear error; elsewhere the check must not read
    values back (on a GPU that is a host sync per forward). A meta tensor has no values:
    a check that read them (`.item()` on every device) raises here: for the ids, the
    targets, the positions and the mask alike."""
    with torch.device("meta"):
        model = SmolLM(SmolConfig.preset("tiny"))
        ids = torch.zeros(2, 5, dtype=torch.long)
        logits, loss = model(
            ids,
            targets=ids,
            attention_mask=torch.ones(2, 5),
            position_ids=ids + 3,
        )
    assert logits.shape == (2, 5, 4096) and loss.shape == ()
    with pytest.raises(ValueError, match="token ids must lie in \\[0, 4096\\)"):
        SmolLM(SmolConfig.preset("tiny"))(torch.tensor([[5, 4096]]))


def test_the_masks_the_model_makes_are_made_on_its_device():
    """A model moved to another device (meta here: no values, no CUDA needed), called
    outside any default-device context: the causal and padding masks it builds must
    be made there too (a mask left on the CPU cannot meet the meta scores)."""
    model = SmolLM(SmolConfig.preset("tiny")).to("meta")
    ids = torch.zeros(2, 5, dtype=torch.long, device="meta")
    mask = torch.ones(2, 5, dtype=torch.long, device="meta")
    logits, _ = model(ids, attention_mask=mask)
    assert logits.shape == (2, 5, 4096) and logits.device.type == "meta"


def test_the_range_check_is_skipped_while_compiling(monkeypatch):
    """Compiled graphs skip the data-dependent range check (reading values back would
    break the graph): while compiling, even out-of-range values pass unread."""
    from smol.model import _check_range

    with pytest.raises(ValueError, match="must lie in"):
        _check_range("ids", torch.tensor([5]), 0, 3)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert _check_range("ids", torch.tensor([5]), 0, 3) is None


def test_under_autocast_the_cache_holds_the_autocast_dtype():
    """Under bfloat16 autocast the layers write bfloat16 keys and values: a bfloat16
    cache fits a float32 model there, and a float32 one is refused, by name."""
    torch.manual_seed(0)
    config = SmolConfig.preset("tiny")
    model = SmolLM(config).eval()
    ids = torch.randint(0, config.vocab_size, (1, 4))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        cache = KVCache(config, batch_size=1, max_len=8, dtype=torch.bfloat16)
        model(ids, kv_cache=cache)
        assert cache.length == 4
        with pytest.raises(ValueError, match="kv_cache does not fit"):
            model(ids, kv_cache=KVCache(config, batch_size=1, max_len=8))


def test_a_prompt_after_one_cached_token_equals_one_pass():
    """One token, then three, then four, through a cache without a mask: each query
    sees every earlier token, cached or new, as in one pass over all of them (SDPA's
    is_causal alone would align a chunk's causal triangle with the cache's start)."""
    torch.manual_seed(0)
    config = SmolConfig.preset("tiny")
    model = SmolLM(config).eval()
    ids = torch.randint(0, config.vocab_size, (1, 8))
    with torch.no_grad():
        whole = model(ids)[0]
        cache = KVCache(config, batch_size=1, max_len=8)
        parts = [
            model(ids[:, a:b], kv_cache=cache)[0] for a, b in ((0, 1), (1, 4), (4, 8))
        ]
    torch.testing.assert_close(torch.cat(parts, 1), whole, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "inputs, error, says",
    [
        (
            dict(attention_mask=[[1, 1, 1]]),
            TypeError,
            "attention_mask must be a torch.Tensor, got list",
        ),
        (dict(targets=[[1, 2, 3]]), TypeError, "targets must be a torch.Tensor"),
        (dict(targets=torch.ones(1, 3)), TypeError, "targets must hold integers"),
        (
            dict(targets=torch.ones(1, 3, dtype=torch.complex64)),
            TypeError,
            "targets must hold integers",
        ),
        (dict(position_ids=[[0, 1, 2]]), TypeError, "position_ids must be a torch"),
        (dict(kv_cache={}), TypeError, "kv_cache must be a KVCache, got dict"),
        (dict(logits_to_keep=-1), ValueError, "logits_to_keep must be an int >= 0"),
        (dict(logits_to_keep=True), ValueError, "an int >= 0, got True"),
        (
            dict(targets=torch.tensor([[1, 5000, 2]])),
            ValueError,
            r"targets \(other than -100\) must lie in \[0, 4096\), .* from 1 to 5000",
        ),
        (dict(targets=torch.tensor([[1, -3, 2]])), ValueError, "from -3 to 2"),
        # a negative position would read the RoPE tables from their end
        (
            dict(position_ids=torch.tensor([[-1, 0, 1]])),
            ValueError,
            "position_ids must lie in .* from -1 to 1",
        ),
        (
            dict(position_ids=torch.tensor([[30, 31, 32]])),
            ValueError,
            r"position_ids must lie in \[0, 32\)",
        ),
    ],
)
def test_wrong_kinds_and_ranges_of_inputs_are_named(inputs, error, says):
    model = SmolLM(SmolConfig.preset("tiny", max_position_embeddings=32))
    with pytest.raises(error, match=says):
        model(torch.tensor([[1, 2, 3]]), **inputs)


def test_ignored_targets_pass_the_range_check_of_any_vocabulary():
    """-100 stands in as a valid id when targets are range-checked: even a one-token
    vocabulary, where 0 is the only id, accepts them."""
    model = SmolLM(SmolConfig.preset("tiny", vocab_size=1))
    _, loss = model(torch.tensor([[0, 0, 0]]), targets=torch.tensor([[0, -100, 0]]))
    assert loss.item() == 0.0  # one class: probability 1


def test_positions_past_the_built_rope_tables_are_read_from_grown_ones():
    """Attention depends on relative positions only: shifting every position by 40
    leaves the logits as they were, though the tables were built for 3 positions."""
    torch.manual_seed(0)
    model = SmolLM(SmolConfig.preset("tiny", max_position_embeddings=64)).eval()
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        plain, _ = model(ids)
        shifted, _ = model(ids, position_ids=torch.tensor([[40, 41, 42]]))
    torch.testing.assert_close(shifted, plain, atol=1e-4, rtol=0)
    # built for one past the largest position: not the whole context, not one more
    assert model.model.rotary_emb.cos.shape[0] == 43


@pytest.mark.parametrize(
    "change, says",
    [
        (dict(num_hidden_layers=3), r"\(3, 2, 2, 8, 32\) of torch.float32"),
        (dict(num_key_value_heads=1), r"\(4, 2, 1, 8, 32\)"),
        (dict(batch_size=1), r"\(4, 1, 2, 8, 32\)"),
        (dict(dtype=torch.bfloat16), r"of torch.bfloat16 on cpu, the model writes"),
    ],
)
def test_a_cache_that_does_not_fit_the_model_and_batch_is_refused(change, says):
    config = SmolConfig.preset("tiny")
    model = SmolLM(config).eval()
    batch_size = change.pop("batch_size", 2)
    dtype = change.pop("dtype", torch.float32)
    cache = KVCache(config.replace(**change), batch_size, 8, dtype=dtype)
    with pytest.raises(ValueError, match="kv_cache does not fit this model") as info:
        model(torch.zeros(2, 3, dtype=torch.long), kv_cache=cache)
    assert info.match(says) and cache.length == 0


def test_the_loss_with_no_counted_target_is_zero_without_gradient():
    """Every target -100 (a batch of padding, a reply cut off): the mean over no token
    is 0 with zero gradients, not NaN, which would poison a sum of losses."""
    torch.manual_seed(0)
    model = SmolLM(SmolConfig.preset("tiny"))
    ids = torch.randint(0, 4096, (2, 5))
    _, loss = model(ids, targets=torch.full((2, 5), -100))
    loss.backward()
    assert loss.item() == 0.0
    assert all(not p.grad.any() for p in model.parameters())
    targets = ids.roll(-1, 1)
    targets[0, :3] = -100  # the mean counts the 7 others only
    logits, loss = model(ids, targets=targets)
    kept = targets != -100
    torch.testing.assert_close(
        loss, torch.nn.functional.cross_entropy(logits[kept], targets[kept])
    )


def test_state_dict_from_another_config_names_keys_and_shapes():
    model = SmolLM(SmolConfig.preset("tiny"))
    other = SmolLM(
        SmolConfig.preset("tiny", num_hidden_layers=5, intermediate_size=320)
    )
    with pytest.raises(ValueError) as err:
        model.load_state_dict(other.state_dict())
    text = str(err.value)
    assert "unexpected keys" in text and "model.layers.4.mlp.up_proj.weight" in text
    assert (
        "model.layers.0.mlp.up_proj.weight: checkpoint (320, 128), model (384, 128)"
        in text
    )
    with pytest.raises(ValueError, match="missing keys:\n    model.layers.4"):
        other.load_state_dict(model.state_dict())


def test_each_kind_of_state_dict_mismatch_alone_is_named_with_at_most_eight_keys():
    """Unexpected keys alone, shapes alone, and a long list cut after eight names with
    the count of the rest (nine keys: eight shown, one more); strict=False loads what
    fits and reports the rest."""
    model = SmolLM(SmolConfig.preset("tiny"))
    sd = model.state_dict()
    with pytest.raises(ValueError) as err:
        model.load_state_dict({**sd, "extra": torch.zeros(1)})
    assert str(err.value).endswith("config?)\n1 unexpected keys:\n    extra")
    with pytest.raises(ValueError, match="1 shape mismatches:\n    model.norm.weight"):
        model.load_state_dict({**sd, "model.norm.weight": torch.ones(3)})
    layers = [k for k in sd if k.startswith("model.layers.")]
    with pytest.raises(ValueError) as err:
        model.load_state_dict({k: v for k, v in sd.items() if k not in layers[:9]})
    text = str(err.value)
    assert "9 missing keys:" in text and text.count("\n    model.layers.") == 8
    assert "... and 1 more" in text
    with pytest.raises(ValueError) as err:
        model.load_state_dict({k: v for k, v in sd.items() if k not in layers[:8]})
    assert str(err.value).endswith(f"\n    {sorted(layers[:8])[-1]}")
    partial = {k: v for k, v in sd.items() if k != "model.norm.weight"}
    result = SmolLM(SmolConfig.preset("tiny")).load_state_dict(partial, strict=False)
    assert result.missing_keys == ["model.norm.weight"]


def test_tied_checkpoint_without_head_loads_and_assign_keeps_the_tie():
    source = SmolLM(SmolConfig.preset("tiny"))
    sd = {k: v.clone() for k, v in source.state_dict().items() if k != "lm_head.weight"}
    with torch.device("meta"):
        model = SmolLM(SmolConfig.preset("tiny"))
    model.load_state_dict(sd, assign=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert torch.equal(model.lm_head.weight, source.lm_head.weight)


def test_rope_tables_are_fp32_lazy_and_grow_to_the_context():
    rope = RotaryEmbedding(head_dim=8, theta=10000.0, max_positions=100)
    assert rope.cos is None
    cos, sin = rope(10, torch.device("cpu"))
    assert (
        cos.shape == (10, 8) and rope.cos.shape[0] == 10 and cos.dtype == torch.float32
    )
    cos40, _ = rope(40, torch.device("cpu"))
    assert rope.cos.shape[0] == 40
    torch.testing.assert_close(cos40[:10], cos)
    rope(60, torch.device("cpu"))
    assert rope.cos.shape[0] == 80  # doubles, so growth happens only log(n) times
    rope(90, torch.device("cpu"))
    assert rope.cos.shape[0] == 100  # never past the context
    table = rope.cos
    rope(100, torch.device("cpu")), rope(7, torch.device("cpu"))
    assert rope.cos is table  # long enough, on this device: read, not built again
    first = RotaryEmbedding(head_dim=8, theta=10000.0, max_positions=100)
    first(1, torch.device("cpu"))
    assert first.cos.shape[0] == 1  # the first table is as long as asked
    with pytest.raises(ValueError, match="longer than the context"):
        rope(101, torch.device("cpu"))
    # the relative-position property: q.k after rotation depends only on the offset
    q, k = torch.randn(8), torch.randn(8)
    cos, sin = rope(100, torch.device("cpu"))
    from smol.rope import apply_rope

    def score(i, j):
        return apply_rope(q, cos[i], sin[i]) @ apply_rope(k, cos[j], sin[j])

    torch.testing.assert_close(score(7, 3), score(57, 53), atol=1e-5, rtol=0)


def test_model_in_bf16_keeps_rope_tables_fp32():
    model = SmolLM(SmolConfig.preset("tiny")).to(torch.bfloat16)
    logits, _ = model(torch.randint(0, 4096, (1, 8)))
    assert logits.dtype == torch.bfloat16
    assert model.model.rotary_emb.cos.dtype == torch.float32


def test_rmsnorm_matches_torch_and_computes_in_fp32():
    x = torch.randn(4, 7, 32) * 3
    norm = RMSNorm(32, eps=1e-5)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    ref = torch.nn.RMSNorm(32, eps=1e-5)
    ref.weight = norm.weight
    torch.testing.assert_close(norm(x), ref(x))
    # bf16 input: normalised in fp32 then cast back, so it matches the fp32 result
    # rounded once
    xb = (torch.randn(2, 256) * 300).to(torch.bfloat16)
    expected = (norm_fp32 := RMSNorm(256))(xb.float()).to(torch.bfloat16)
    assert torch.equal(norm_fp32(xb), expected)


def test_repeat_kv_groups_query_heads_as_repeat_interleave():
    kv = torch.randn(2, 3, 5, 4)
    out = repeat_kv(kv, 3)
    torch.testing.assert_close(out, kv.repeat_interleave(3, dim=1), atol=0, rtol=0)
    assert not torch.equal(out, kv.repeat(1, 3, 1, 1))  # tiling is the classic bug
    assert repeat_kv(kv, 1) is kv


def test_sdpa_attention_on_a_cpu_never_copies_the_shared_heads(monkeypatch):
    """On a CPU, SDPA's enable_gqa reads each key/value head in place: prompt
    attention (many queries) must not build repeat_kv's copies. Elsewhere the copies
    stay, except in the fused half-precision CUDA kernels (checked on meta tensors:
    neither CPU nor CUDA, float32 or bfloat16). Mutants: a device test that sends the
    CPU to the copying path, or that lets a half-precision tensor of another device
    skip it."""
    import smol.attention as attention

    torch.manual_seed(0)
    model = SmolLM(SmolConfig.preset("tiny")).eval()  # 4 query heads on 2 kv heads
    ids = torch.randint(0, 4096, (2, 7))
    expected = model(ids)[0]

    def refuse(*args):
        raise AssertionError("repeat_kv copied the key/value heads on a CPU")

    monkeypatch.setattr(attention, "repeat_kv", refuse)
    torch.testing.assert_close(model(ids)[0], expected, atol=0, rtol=0)
    for dtype in (torch.float32, torch.bfloat16):
        assert not attention.sdpa_uses_gqa(torch.empty(1, device="meta", dtype=dtype))


@pytest.mark.parametrize(
    "dtype, capability, shares",
    [
        (torch.bfloat16, (8, 0), True),  # an A100: the fused kernels share heads
        (torch.float16, (9, 0), True),  # an H100
        (torch.float16, (7, 5), False),  # a T4: no fused kernel takes enable_gqa
        (torch.float32, (9, 0), False),  # float32 falls back to the math kernel
    ],
)
def test_which_cuda_attention_shares_key_value_heads(
    monkeypatch, dtype, capability, shares
):
    """The CUDA side of sdpa_uses_gqa, without a GPU: a stand-in query on a cuda
    device and a stand-in for the device's compute capability, asked of the query's
    own device."""
    from types import SimpleNamespace

    import smol.attention as attention

    asked = []
    monkeypatch.setattr(
        torch.cuda, "get_device_capability", lambda d: asked.append(d) or capability
    )
    q = SimpleNamespace(device=torch.device("cuda", 1), dtype=dtype)
    assert attention.sdpa_uses_gqa(q) is shares
    assert asked in ([], [q.device])


def test_a_decode_step_takes_the_grouped_path_and_a_prompt_does_not(monkeypatch):
    """One new token with a cache attends through grouped_decode_attention, in every
    layer; a prompt goes to SDPA whole. Mutants: a routing test that reads another
    axis, or that wants the step causal (either leaves decoding on the slower path,
    with the same numbers)."""
    import smol.attention as attention

    torch.manual_seed(0)
    config = SmolConfig.preset("tiny")
    model = SmolLM(config).eval()
    grouped = attention.grouped_decode_attention
    calls = []

    def counted(*args):
        calls.append(1)
        return grouped(*args)

    monkeypatch.setattr(attention, "grouped_decode_attention", counted)
    ids = torch.randint(0, config.vocab_size, (2, 6))
    cache = KVCache(config, batch_size=2, max_len=8)
    with torch.no_grad():
        model(ids[:, :5], kv_cache=cache)
        assert calls == []
        model(ids[:, 5:], kv_cache=cache)
    assert len(calls) == config.num_hidden_layers


def test_the_copying_fallback_equals_sdpa_with_shared_heads(monkeypatch):
    """Where SDPA cannot share key/value heads in place (float32 on CUDA, a T4),
    attention copies them with repeat_kv: the same outputs, the padding mask
    included (forced here on a CPU). Mutant: the fallback drops the mask."""
    import smol.attention as attention

    torch.manual_seed(0)
    model = SmolLM(SmolConfig.preset("tiny")).eval()
    ids = torch.randint(0, 4096, (2, 6))
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    with torch.no_grad():
        expected = model(ids, attention_mask=mask)[0]
        monkeypatch.setattr(attention, "sdpa_uses_gqa", lambda q: False)
        got = model(ids, attention_mask=mask)[0]
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_grouped_decode_attention_equals_sdpa_on_repeated_heads():
    """One query token: the query heads folded into the query axis attend as SDPA over
    repeat_kv's copies does, with and without a mask. Mutant: folding them as (r h),
    which pairs query head h with key/value head h % H_kv (tiling), fails."""
    from einops import rearrange

    q = torch.randn(2, 6, 1, 8)  # 6 query heads on 2 key/value heads
    k, v = torch.randn(2, 2, 2, 9, 8).unbind(0)
    mask = torch.rand(2, 1, 1, 9) > 0.4
    mask[..., -1] = True  # the new token sees itself
    for m in (None, mask):
        expected = torch.nn.functional.scaled_dot_product_attention(
            q, repeat_kv(k, 3), repeat_kv(v, 3), attn_mask=m
        )
        got = grouped_decode_attention(q, k, v, m, 3)
        torch.testing.assert_close(got, expected)
        tiled = rearrange(
            torch.nn.functional.scaled_dot_product_attention(
                rearrange(q, "b (r h) 1 d -> b h r d", r=3), k, v, attn_mask=m
            ),
            "b h r d -> b (r h) 1 d",
        )
        assert not torch.allclose(tiled, expected, atol=1e-3)


def test_eager_attention_matches_sdpa():
    q, k, v = torch.randn(3, 2, 4, 7, 8).unbind(0)
    mask = torch.rand(2, 1, 7, 7) > 0.3
    mask |= torch.eye(7, dtype=torch.bool)
    for kwargs in (dict(is_causal=True), dict(mask=mask)):
        sdpa = torch.nn.functional.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=kwargs.get("mask"),
            is_causal=kwargs.get("is_causal", False),
        )
        torch.testing.assert_close(
            eager_attention(q, k, v, **kwargs), sdpa, atol=1e-6, rtol=1e-5
        )


def test_the_configured_attention_implementation_is_the_one_that_runs(monkeypatch):
    import smol.attention

    calls = []
    eager = smol.attention.eager_attention
    monkeypatch.setattr(
        smol.attention,
        "eager_attention",
        lambda *a, **k: calls.append(1) or eager(*a, **k),
    )
    ids = torch.tensor([[1, 2, 3]])
    SmolLM(SmolConfig.preset("tiny", attn_implementation="sdpa"))(ids)
    assert not calls
    SmolLM(SmolConfig.preset("tiny", attn_implementation="eager"))(ids)
    assert len(calls) == 4  # one per layer


def test_rope_tables_are_float32_on_the_device_asked_for():
    """Even where the default dtype is float64, and on the meta device (a table built
    on the CPU there cannot be combined with the other)."""
    rope = RotaryEmbedding(8, 10000.0, 64)
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        cos, sin = rope(5, torch.device("cpu"))
        assert cos.dtype == sin.dtype == torch.float32
        assert rope.inv_freq().dtype == torch.float32
    finally:
        torch.set_default_dtype(before)
    cos, sin = RotaryEmbedding(8, 10000.0, 64)(5, torch.device("meta"))
    assert cos.device.type == sin.device.type == "meta" and cos.shape == (5, 8)


def test_rmsnorm_defaults_to_smollm2s_epsilon():
    assert RMSNorm(8).eps == SmolConfig().rms_norm_eps


def test_eager_attention_keeps_the_inputs_dtype_and_device():
    """bfloat16 in, bfloat16 out (the softmax runs in float32 and is cast back, or the
    product with v mixes dtypes); the causal mask is made where q is: on the meta device
    a mask made on the CPU cannot be combined with the scores."""
    q, k, v = torch.randn(3, 2, 4, 7, 8).unbind(0)
    want = eager_attention(q, k, v, is_causal=True)
    got = eager_attention(*(t.bfloat16() for t in (q, k, v)), is_causal=True)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, atol=0.05, rtol=0.05)
    out = eager_attention(*(t.to("meta") for t in (q, k, v)), is_causal=True)
    assert out.device.type == "meta" and out.shape == (2, 4, 7, 8)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_kv_cache_gives_the_full_forward_logits(attn):
    torch.manual_seed(0)
    config = SmolConfig.preset("tiny", attn_implementation=attn)
    model = SmolLM(config).eval()
    ids = torch.randint(0, config.vocab_size, (2, 20))
    with torch.no_grad():
        full, _ = model(ids)
        cache = KVCache(config, batch_size=2, max_len=32)
        prefill, _ = model(ids[:, :12], kv_cache=cache)
        chunk, _ = model(ids[:, 12:15], kv_cache=cache)  # several tokens after a cache
        steps = [model(ids[:, t : t + 1], kv_cache=cache)[0] for t in range(15, 20)]
    torch.testing.assert_close(
        torch.cat([prefill, chunk, *steps], dim=1), full, atol=1e-5, rtol=0
    )
    assert cache.length == 20


def test_an_attention_or_layer_built_alone_caches_in_the_first_slot():
    # Chapter 4 builds one Attention (and chapter 5 one DecoderLayer) without a layer
    # index: with a cache sized for a one-layer model it must write slot 0, not past it.
    from smol.attention import Attention
    from smol.model import DecoderLayer

    torch.manual_seed(0)
    config = SmolConfig.preset("tiny", num_hidden_layers=1)
    rope = RotaryEmbedding(config.head_dim, config.rope_theta, 4)
    cos, sin = rope(3, torch.device("cpu"))
    x = torch.randn(1, 3, config.hidden_size)
    for block in (Attention(config), DecoderLayer(config)):
        cache = KVCache(config, batch_size=1, max_len=4)
        with torch.no_grad():
            block(x, cos, sin, kv_cache=cache)
        assert cache.k[0, :, :, :3].abs().sum() > 0


def test_an_attention_or_layer_called_alone_is_causal():
    """Chapters 3 and 5 call one block on x, cos and sin alone: by default a token
    must not see the tokens after it (mutant: is_causal=False by default)."""
    from smol.attention import Attention
    from smol.model import DecoderLayer

    torch.manual_seed(0)
    config = SmolConfig.preset("tiny")
    cos, sin = RotaryEmbedding(config.head_dim, config.rope_theta, 8)(
        5, torch.device("cpu")
    )
    x = torch.randn(1, 5, config.hidden_size)
    changed = x.clone()
    changed[:, -1] += 1.0  # only the last token differs
    for block in (Attention(config), DecoderLayer(config)):
        with torch.no_grad():
            a, b = block(x, cos, sin), block(changed, cos, sin)
        torch.testing.assert_close(a[:, :-1], b[:, :-1], atol=0, rtol=0)
        assert not torch.allclose(a[:, -1], b[:, -1])


def test_checkpointed_padded_training_gives_the_same_gradients_by_autograd_grad():
    """Gradient checkpointing of a padded batch: the layers recomputed in backward
    see the same mask, and torch.autograd.grad reaches the parameters (the
    non-reentrant checkpoint; the reentrant one leaves them out of the graph).
    Mutants: the mask or is_causal not handed to the checkpointed layer, or
    use_reentrant other than False."""
    torch.manual_seed(0)
    model = SmolLM(SmolConfig.preset("tiny"))
    ids = torch.randint(0, 4096, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[0, :3] = 0  # the first row is left-padded
    targets = ids.roll(-1, 1).masked_fill(mask == 0, -100)
    params = list(model.parameters())
    grads = []
    for flag in (False, True):
        model.gradient_checkpointing = flag
        loss = model(ids, targets, attention_mask=mask)[1]
        grads.append(torch.autograd.grad(loss, params))
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_one_counted_target_gives_its_own_cross_entropy():
    """The mean runs over counted targets: with every target but one ignored, the
    loss is that token's cross-entropy (mutant: dividing by at least 2)."""
    torch.manual_seed(0)
    model = SmolLM(SmolConfig.preset("tiny")).eval()
    ids = torch.randint(0, 4096, (1, 4))
    targets = torch.full((1, 4), -100)
    targets[0, 2] = 7
    with torch.no_grad():
        logits, loss = model(ids, targets)
    expected = torch.nn.functional.cross_entropy(logits[0, 2:3], targets[0, 2:3])
    torch.testing.assert_close(loss, expected)


def test_logits_to_keep_gives_the_last_positions_logits():
    torch.manual_seed(0)
    model = SmolLM(SmolConfig.preset("tiny")).eval()
    ids = torch.randint(0, 4096, (2, 5))
    with torch.no_grad():
        whole = model(ids)[0]
        kept = model(ids, logits_to_keep=2)[0]
    assert kept.shape == (2, 2, 4096)
    torch.testing.assert_close(kept, whole[:, -2:], atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="the loss needs every position's logits"):
        model(ids, ids, logits_to_keep=2)


def test_gradient_checkpointing_gives_the_same_gradients():
    torch.manual_seed(0)
    model = SmolLM(SmolConfig.preset("tiny"))
    ids = torch.randint(0, 4096, (2, 16))
    grads = []
    for flag in (False, True):
        model.zero_grad()
        model.gradient_checkpointing = flag
        model(ids, ids.roll(-1, 1))[1].backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_torch_compile_in_train_and_eval():
    torch.manual_seed(0)
    model = SmolLM(SmolConfig.preset("tiny", num_hidden_layers=2))
    compiled = torch.compile(model)
    ids = torch.randint(0, 4096, (2, 16))
    targets = ids.roll(-1, 1)
    _, loss = compiled(ids, targets)
    loss.backward()
    _, eager_loss = model(ids, targets)
    torch.testing.assert_close(loss, eager_loss, atol=1e-5, rtol=0)
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(compiled(ids)[0], model(ids)[0], atol=1e-5, rtol=0)
        cache = KVCache(model.config, batch_size=2, max_len=20)
        compiled(ids, kv_cache=cache)
        step, _ = compiled(ids[:, :1], kv_cache=cache)
    assert step.shape == (2, 1, 4096) and cache.length == 17


# What the API refuses, and what it means by the rest


@pytest.mark.parametrize(
    "bad, says",
    [
        (
            dict(tie_word_embeddings="no"),
            "tie_word_embeddings must be True or False, got 'no'",
        ),
        (
            dict(initializer_range=float("nan")),
            "initializer_range must be a positive finite number, got nan",
        ),
        (
            dict(initializer_range=-0.02),
            "initializer_range must be a positive finite number, got -0.02",
        ),
        (
            dict(rope_theta=float("inf")),
            "rope_theta must be a positive finite number, got inf",
        ),
        (
            dict(rms_norm_eps="1e-5"),
            "rms_norm_eps must be a positive finite number, got '1e-5'",
        ),
        (
            dict(rms_norm_eps=0.0),
            "rms_norm_eps must be a positive finite number, got 0.0",
        ),
        (dict(hidden_size=32.0), "hidden_size must be a positive int, got 32.0"),
        (
            dict(attn_implementation="flash"),
            "attn_implementation must be 'sdpa' or 'eager'",
        ),
    ],
)
def test_config_rejects_values_of_the_wrong_kind(bad, says):
    with pytest.raises(ValueError, match=says):
        SmolConfig.preset("tiny", **bad)


# The tiny preset with 2 query heads, as many as its key/value heads (see
# test_position_ids_must_have_the_shape_of_input_ids)
SMALL = SmolConfig.preset("tiny", num_attention_heads=2)


def test_attention_mask_must_hold_zeros_and_ones():
    model = SmolLM(SMALL).eval()
    ids = torch.randint(0, SMALL.vocab_size, (2, 5))
    with pytest.raises(
        ValueError, match="attention_mask must hold 0 .padding. and 1 .token., got 0.5"
    ):
        model(ids, attention_mask=torch.full((2, 5), 0.5))
    with pytest.raises(
        TypeError, match="attention_mask must be a bool, integer or float tensor"
    ):
        model(ids, attention_mask=torch.full((2, 5), 1j))
    ones = model(ids)[0]
    for mask in (
        torch.ones(2, 5),
        torch.ones(2, 5, dtype=torch.bool),
        torch.ones(2, 5, dtype=torch.long),
    ):
        torch.testing.assert_close(model(ids, attention_mask=mask)[0], ones)


def test_an_all_padding_row_gives_finite_outputs_that_the_loss_can_ignore():
    """Documented meaning: a row of zeros is all padding; its logits are finite but
    meaningless."""
    model = SmolLM(SMALL).eval()
    ids = torch.randint(0, SMALL.vocab_size, (2, 5))
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 0, 0, 0]])
    logits, _ = model(ids, attention_mask=mask)
    assert torch.isfinite(logits).all()
    torch.testing.assert_close(logits[0], model(ids[:1])[0][0])


def test_position_ids_must_have_the_shape_of_input_ids():
    # 2 tokens and 2 key/value heads (and 2 query heads): positions of shape (T,) would
    # broadcast along the head axis without an error, giving every head one position.
    model = SmolLM(SMALL).eval()
    ids = torch.randint(0, SMALL.vocab_size, (1, 2))
    with pytest.raises(
        ValueError,
        match=r"position_ids must have shape \(batch, seq_len\) = \(1, 2\), got \(2,\)",
    ):
        model(ids, position_ids=torch.arange(2))
    with pytest.raises(TypeError, match="position_ids must hold integers"):
        model(ids, position_ids=torch.zeros(1, 2))
    torch.testing.assert_close(
        model(ids, position_ids=torch.arange(2)[None])[0], model(ids)[0]
    )


def test_state_dicts_holding_nan_or_inf_are_refused():
    model = SmolLM(SMALL)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state["model.layers.1.mlp.up_proj.weight"][3, 4] = float("nan")
    state["model.norm.weight"][0] = float("inf")
    with pytest.raises(
        ValueError,
        match="not finite.*model.layers.1.mlp.up_proj.weight.*model.norm.weight",
    ):
        model.load_state_dict(state)
