"""LoRA by hand equals peft's LoRA on LlamaForCausalLM: logits, gradients, merging,
adapter files."""

import copy
import json

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from torch import nn
from transformers import AutoModelForCausalLM

from smol import SmolLM
from smol.attention import Attention
from smol.lora import (
    TARGETS,
    LoRALinear,
    apply_lora,
    check_settings,
    count_trainable,
    load_peft_adapter,
    lora_config,
    lora_layers,
    merge_lora,
    save_peft_adapter,
)
from smol.checkpoint import CheckpointError
from smol.pretrained import save_pretrained
from tests.conftest import TINY_CONFIGS
from tests.test_parity import ATOL, llama_pair
from tests.tiny_models import same_random_lora

ALL = list(TARGETS)


def peft_pair(config, r=4, alpha=8.0, targets=("q_proj", "v_proj"), seed=0):
    """peft's LoRA on a LlamaForCausalLM and smol's on a SmolLM with the same base
    weights and the same (random, nonzero) A and B."""
    ref, model = llama_pair(config, seed=seed)
    config = LoraConfig(
        r=r, lora_alpha=alpha, target_modules=list(targets), lora_dropout=0.0
    )
    peft_model = get_peft_model(ref, config)
    apply_lora(model, r, alpha, targets)
    same_random_lora(model, dict(peft_model.named_parameters()), seed + 1)
    return peft_model, model


def ids_for(config, shape=(2, 11), seed=3):
    return torch.randint(
        0, config.vocab_size, shape, generator=torch.Generator().manual_seed(seed)
    )


@pytest.mark.parametrize("targets", [("q_proj", "v_proj"), ALL])
def test_logits_equal_peft(tiny_config, targets):
    peft_model, model = peft_pair(tiny_config, targets=targets)
    ids = ids_for(tiny_config)
    with torch.no_grad():
        expected = peft_model(ids).logits
        logits, _ = model(ids)
    torch.testing.assert_close(logits, expected, atol=ATOL, rtol=0)


def test_gradients_of_a_and_b_equal_peft(tiny_config):
    peft_model, model = peft_pair(tiny_config, targets=ALL)
    peft_model.train(), model.train()
    ids = ids_for(tiny_config)
    targets = torch.cat([ids[:, 1:], torch.full((2, 1), -100)], dim=1)
    ref_loss = peft_model(ids, labels=ids).loss
    _, loss = model(ids, targets)
    torch.testing.assert_close(loss, ref_loss, atol=ATOL, rtol=0)
    ref_loss.backward(), loss.backward()
    theirs = dict(peft_model.named_parameters())
    ours = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert len(ours) == 2 * len(ALL) * tiny_config.num_hidden_layers
    for name, p in ours.items():  # model.layers.0.self_attn.q_proj.lora_A
        ref = theirs[f"base_model.model.{name}.default.weight"]
        torch.testing.assert_close(p.grad, ref.grad, atol=ATOL, rtol=0, msg=name)
    assert all(p.grad is None for p in model.parameters() if not p.requires_grad)


def test_trainable_parameters_equal_peft(tiny_config):
    peft_model, model = peft_pair(tiny_config, r=3, targets=("k_proj", "gate_proj"))
    theirs, total = peft_model.get_nb_trainable_parameters()
    assert count_trainable(model) == (theirs, total)
    c = tiny_config
    per_layer = 3 * (c.hidden_size + c.num_key_value_heads * c.head_dim)
    per_layer += 3 * (c.hidden_size + c.intermediate_size)
    assert theirs == c.num_hidden_layers * per_layer


def test_starts_as_the_base_model_and_merged_equals_unmerged(tiny_config):
    torch.manual_seed(0)
    base = SmolLM(tiny_config).eval()
    model = apply_lora(copy.deepcopy(base), 4, 8.0, ALL)
    ids = ids_for(tiny_config)
    with torch.no_grad():
        torch.testing.assert_close(model(ids)[0], base(ids)[0], atol=0, rtol=0)  # B = 0
        for layer in lora_layers(model).values():
            layer.lora_B.normal_(std=0.1)
        unmerged = model(ids)[0]
        assert not torch.allclose(unmerged, base(ids)[0], atol=1e-3)
        merged = merge_lora(model)
        torch.testing.assert_close(merged(ids)[0], unmerged, atol=ATOL, rtol=0)
    assert not lora_layers(merged)
    assert set(merged.state_dict()) == set(base.state_dict())
    assert all(p.requires_grad for p in merged.parameters())
    assert merged.model.layers[0].mlp.down_proj.scaled_init  # flags survive the merge
    assert (
        merged.lm_head.weight is merged.model.embed_tokens.weight
        or not tiny_config.tie_word_embeddings
    )


def test_a_is_kaiming_uniform_as_peft_and_b_is_zero():
    torch.manual_seed(0)
    layer = LoRALinear(nn.Linear(256, 64, bias=False), r=16, alpha=32)
    bound = (
        1 / 256**0.5
    )  # kaiming_uniform_(a=sqrt(5)) on fan_in 256, as nn.Linear's default
    assert layer.lora_A.abs().max() <= bound and layer.lora_A.abs().max() > 0.9 * bound
    # drawn exactly as nn.Linear draws its weight (a=sqrt(5)): a near miss such as
    # a=sqrt(6) shrinks the bound by 7% only, inside the loose check above
    torch.manual_seed(0)
    drawn = LoRALinear(layer.base_layer, r=16, alpha=32).lora_A
    torch.manual_seed(0)
    assert torch.equal(drawn, nn.Linear(256, 16, bias=False).weight)
    assert torch.equal(layer.lora_B, torch.zeros(64, 16))
    assert layer.scaling == 2.0
    assert not layer.base_layer.weight.requires_grad
    assert layer.lora_A.requires_grad and layer.lora_B.requires_grad


def test_dropout_acts_on_the_adapter_input_only_in_training():
    torch.manual_seed(0)
    layer = LoRALinear(nn.Linear(8, 8), r=2, alpha=2, dropout=0.5)
    nn.init.ones_(layer.lora_B)
    x = torch.randn(4, 8)
    layer.eval()
    a, b = layer(x), layer(x)
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(a, layer.base_layer(x) + x @ layer.delta_weight().T)
    layer.train()
    assert not torch.allclose(layer(x), a)


@pytest.mark.parametrize(
    "dtype, device",
    [
        (torch.float64, "cpu"),
        (torch.bfloat16, "cpu"),
        # meta stands in for a GPU: a merged layer built on the default device (the
        # CPU) would not sit where its base does, and could not even be filled
        (torch.float32, "meta"),
    ],
)
def test_lora_layer_and_its_merge_keep_the_base_layers_dtype_device_and_bias(
    dtype, device
):
    torch.manual_seed(0)
    base = nn.Linear(8, 4, dtype=dtype, device=device)
    layer = LoRALinear(base, 2, 4.0)
    for part in (layer.lora_A, layer.lora_B):
        assert (part.dtype, part.device) == (dtype, base.weight.device)
    nn.init.normal_(layer.lora_B)
    merged = layer.merged()
    for got, want in ((merged.weight, base.weight), (merged.bias, base.bias)):
        assert (got.dtype, got.device) == (dtype, want.device)
    if device == "meta":
        return
    assert torch.equal(merged.bias, base.bias)
    x = torch.randn(3, 8, dtype=dtype)
    with torch.no_grad():
        tol = 1e-12 if dtype == torch.float64 else 0.05  # bfloat16 rounds W + dW
        torch.testing.assert_close(merged(x), layer(x), atol=tol, rtol=tol)


def test_merged_model_saves_and_loads_in_transformers(tmp_path, tiny_config):
    torch.manual_seed(0)
    model = apply_lora(SmolLM(tiny_config).eval(), 2, 4.0, ALL)
    with torch.no_grad():
        for layer in lora_layers(model).values():
            layer.lora_B.normal_(std=0.1)
    ids = ids_for(tiny_config)
    with torch.no_grad():
        expected = model(ids)[0]
    save_pretrained(merge_lora(model), None, tmp_path)
    ref = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(ref(ids).logits, expected, atol=ATOL, rtol=0)


def test_adapter_folder_loads_in_peft_and_back_in_smol(tmp_path, tiny_config):
    peft_model, model = peft_pair(tiny_config, targets=("q_proj", "o_proj", "up_proj"))
    ids = ids_for(tiny_config)
    with torch.no_grad():
        expected = model(ids)[0]
    save_peft_adapter(model, tmp_path, base_model_name_or_path="smol-tiny")
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8.0
    assert config["target_modules"] == ["o_proj", "q_proj", "up_proj"]
    base = peft_model.unload()  # the same LlamaForCausalLM, without the adapters
    base_weights = {k: v.clone() for k, v in base.state_dict().items()}
    loaded = PeftModel.from_pretrained(base, tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, expected, atol=ATOL, rtol=0)
    fresh = SmolLM(tiny_config).eval()
    fresh.load_state_dict(base_weights)
    load_peft_adapter(fresh, tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(fresh(ids)[0], expected, atol=0, rtol=0)


def test_adapter_written_by_peft_loads_in_smol(tmp_path, tiny_config):
    peft_model, model = peft_pair(tiny_config, targets=("v_proj",))
    peft_model.save_pretrained(tmp_path)
    ids = ids_for(tiny_config)
    fresh = SmolLM(tiny_config).eval()
    fresh.load_state_dict(peft_model.unload().state_dict())
    load_peft_adapter(fresh, tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(fresh(ids)[0], model(ids)[0], atol=0, rtol=0)


def test_adapter_config_is_spelled_as_peft_reads_it(tmp_path):
    model = apply_lora(SmolLM(TINY_CONFIGS["gqa3-tied"]), 2, 4.0, dropout=0.1)
    # a folder whose parent does not exist yet is created, parents and all
    folder = save_peft_adapter(model, tmp_path / "runs" / "a", "smol-tiny")
    assert folder == tmp_path / "runs" / "a"
    text = (folder / "adapter_config.json").read_text()
    written = json.loads(text)
    # one setting a line, indented by 2 as peft's own save_pretrained writes it
    assert text == json.dumps(written, indent=2) + "\n"
    # peft takes a misspelled key (TASK_TYPE, Bias) for an unknown one and falls back
    # to its default: every key must be one of LoraConfig's fields
    assert set(written) <= set(LoraConfig.__dataclass_fields__)
    theirs = LoraConfig.from_pretrained(folder)
    assert (theirs.peft_type, theirs.task_type) == ("LORA", "CAUSAL_LM")
    assert theirs.base_model_name_or_path == "smol-tiny"
    assert (theirs.r, theirs.lora_alpha, theirs.lora_dropout) == (2, 4.0, 0.1)
    assert set(theirs.target_modules) == {"q_proj", "v_proj"}
    # as peft's own save_pretrained writes them: a saved adapter is for inference, and
    # its A and B were initialised as peft does
    assert theirs.inference_mode is True and theirs.init_lora_weights is True
    assert theirs.bias == "none" and theirs.modules_to_save is None
    assert not (theirs.fan_in_fan_out or theirs.use_rslora or theirs.use_dora)


def test_lora_dropout_round_trips_and_a_config_without_it_means_none(tmp_path):
    config = TINY_CONFIGS["gqa3-tied"]
    model = apply_lora(SmolLM(config), 2, 4.0, ("q_proj", "v_proj"), dropout=0.25)
    folder = save_peft_adapter(model, tmp_path)
    loaded = load_peft_adapter(SmolLM(config), folder)
    assert lora_config(loaded) == lora_config(model)
    assert lora_config(loaded)["lora_dropout"] == 0.25
    assert all(m.lora_dropout.p == 0.25 for m in lora_layers(loaded).values())
    # peft's LoraConfig defaults lora_dropout to 0.0: a config that leaves it out
    # loads with no dropout (not as a missing setting, nor as dropout 1.0)
    (folder / "manifest.json").unlink()
    path = folder / "adapter_config.json"
    written = json.loads(path.read_text())
    del written["lora_dropout"]
    path.write_text(json.dumps(written))
    loaded = load_peft_adapter(SmolLM(config), folder)
    assert lora_config(loaded)["lora_dropout"] == 0.0
    # no Dropout module at all, as peft builds a layer without dropout
    assert all(
        isinstance(m.lora_dropout, nn.Identity) for m in lora_layers(loaded).values()
    )


def test_apply_lora_defaults_and_a_single_target_name():
    config = TINY_CONFIGS["gqa3-tied"]
    # rank 8, alpha 16 on the attention's q_proj and v_proj, no dropout
    assert lora_config(apply_lora(SmolLM(config))) == {
        "r": 8,
        "lora_alpha": 16.0,
        "lora_dropout": 0.0,
        "target_modules": ["q_proj", "v_proj"],
    }
    # a str names one layer (not a sequence of letters)
    model = apply_lora(SmolLM(config), 2, 4.0, "k_proj")
    assert lora_config(model)["target_modules"] == ["k_proj"]
    # check_settings's own defaults: no dropout, every target
    assert check_settings(8, 16.0) == TARGETS
    assert check_settings(8, 16.0, targets="q_proj") == ("q_proj",)


def test_lora_linear_checks_its_settings_as_apply_lora_does():
    linear = nn.Linear(4, 4)
    # nn.Dropout(1.0) builds without complaint, and zeroes the adapter's input
    with pytest.raises(ValueError, match=r"dropout must lie in \[0, 1\), got 1.0"):
        LoRALinear(linear, 2, 4.0, dropout=1.0)
    with pytest.raises(ValueError, match="the rank r must be an int >= 1, got 0"):
        LoRALinear(linear, 0, 4.0)


def test_lora_config_reads_the_settings_back_and_refuses_mixed_adapters():
    config = TINY_CONFIGS["gqa3-tied"]
    model = apply_lora(SmolLM(config), 3, 6.0, ("v_proj", "down_proj"), dropout=0.2)
    assert lora_config(model) == {
        "r": 3,
        "lora_alpha": 6.0,
        "lora_dropout": 0.2,
        "target_modules": ["down_proj", "v_proj"],
    }
    # a single attention block holds its layers at the top: `q_proj`, no dot
    block = apply_lora(Attention(config), 2, 4.0, ("q_proj", "o_proj"))
    assert lora_config(block)["target_modules"] == ["o_proj", "q_proj"]
    # one layer of another rank: no single r describes the adapters
    attn = model.model.layers[1].self_attn
    attn.v_proj = LoRALinear(attn.v_proj.base_layer, 2, 6.0, dropout=0.2)
    with pytest.raises(ValueError, match=r"differ in \(r, alpha, dropout\)"):
        lora_config(model)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(targets=("q_proj", "qproj")), "unknown LoRA targets ['qproj']"),
        (dict(targets=("lm_head",)), "unknown LoRA targets ['lm_head']"),
        (dict(targets=()), "targets is empty"),
        (dict(r=0), "the rank r must be an int >= 1, got 0"),
        (dict(r=2.0), "the rank r must be an int >= 1, got 2.0"),
        (dict(alpha=0), "alpha must be a positive finite number"),
        # NaN passes `alpha <= 0` unnoticed, and every logit becomes NaN
        (dict(alpha=float("nan")), "alpha must be a positive finite number, got nan"),
        (dict(alpha=float("inf")), "alpha must be a positive finite number, got inf"),
        (dict(dropout=1.0), "dropout must lie in [0, 1)"),
    ],
)
def test_apply_lora_rejects_bad_arguments(tiny_config, kwargs, message):
    model = SmolLM(tiny_config)
    with pytest.raises(ValueError) as info:
        apply_lora(model, **kwargs)
    assert message in str(info.value)
    assert not lora_layers(model) and all(p.requires_grad for p in model.parameters())


@pytest.mark.parametrize("r, alpha", [(1, 1.0), (1, 0.5), (2, 1)])
def test_apply_lora_accepts_rank_one_and_an_alpha_below_one(r, alpha):
    # the bounds are r >= 1 and alpha > 0: not r > 1, nor alpha > 1
    model = apply_lora(SmolLM(TINY_CONFIGS["gqa3-tied"]), r, alpha)
    settings = lora_config(model)
    assert (settings["r"], settings["lora_alpha"]) == (r, alpha)
    assert all(m.scaling == alpha / r for m in lora_layers(model).values())


def test_apply_twice_merge_without_lora_and_wrong_layers_fail_clearly(tiny_config):
    model = apply_lora(SmolLM(tiny_config), 2, 4.0)
    with pytest.raises(ValueError, match="already holds LoRA layers"):
        apply_lora(model, 2, 4.0)
    with pytest.raises(ValueError, match="holds no LoRA layers"):
        merge_lora(SmolLM(tiny_config))
    with pytest.raises(TypeError, match="wraps an nn.Linear, got Embedding"):
        LoRALinear(nn.Embedding(4, 4), 2, 4.0)
    with pytest.raises(ValueError, match="no nn.Linear named"):
        apply_lora(nn.Sequential(nn.Linear(2, 2)), 2, 4.0)


def test_only_adapters_train(tiny_config):
    model = apply_lora(SmolLM(tiny_config), 2, 4.0, ("q_proj", "down_proj"))
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    assert names and all(n.endswith(("lora_A", "lora_B")) for n in names)
    trainable, total = count_trainable(model)
    assert trainable == sum(model.get_parameter(n).numel() for n in names)
    assert total == SmolLM(tiny_config).count_params() + trainable


def test_lora_functions_name_a_model_of_the_wrong_kind():
    for fn in (apply_lora, merge_lora):
        with pytest.raises(TypeError, match="expected a model .nn.Module., got str"):
            fn("model")


@pytest.fixture
def adapter(tmp_path):
    """A saved adapter of a tiny model, with nonzero B."""
    config = TINY_CONFIGS["gqa3-tied"]
    torch.manual_seed(0)
    model = apply_lora(SmolLM(config), 2, 4.0, ("q_proj", "v_proj"))
    with torch.no_grad():
        for layer in lora_layers(model).values():
            layer.lora_B.normal_()
    return save_peft_adapter(model, tmp_path / "adapter"), config


def _flip(path, at=-3):
    data = bytearray(path.read_bytes())
    data[at] ^= 0x10
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("name", ["adapter_model.safetensors", "adapter_config.json"])
def test_a_flipped_byte_in_a_saved_adapter_is_caught_naming_the_file(adapter, name):
    folder, config = adapter
    _flip(folder / name)
    model = SmolLM(config)
    with pytest.raises(CheckpointError, match=f"adapter {folder} is corrupted: {name}"):
        load_peft_adapter(model, folder)
    assert not lora_layers(model)


@pytest.mark.parametrize(
    "damage, says",
    [
        (lambda f: (f / "adapter_config.json").write_text("{oops"), "not valid JSON"),
        (
            lambda f: (f / "adapter_model.safetensors").write_bytes(b"cut"),
            "adapter_model.safetensors is not a readable safetensors file",
        ),
        (
            lambda f: _edit_config(f, lora_alpha=float("nan")),
            "adapter_config.json: alpha must be a positive finite number, got nan",
        ),
        (lambda f: _edit_config(f, r=3), r"lora_A.weight is \(2, 48\), this model"),
        (lambda f: _edit_config(f, r=None), "the rank r must be an int"),
        (
            lambda f: _edit_config(f, target_modules=["q"]),
            r"unknown LoRA targets \['q'\]",
        ),
        (lambda f: _edit_weights(f, float("nan")), "holds values that are not finite"),
        # AdaLoRA, DoRA and the rest share LoRA's keys but not its arithmetic
        (
            lambda f: _edit_config(f, peft_type="ADALORA"),
            "adapter_config.json: expected peft_type 'LORA', got 'ADALORA'",
        ),
        (
            lambda f: (f / "adapter_config.json").write_text("[1, 2]"),
            r"expected peft_type 'LORA', got \[1, 2\]",
        ),
        (
            lambda f: _edit_config(f, use_rslora=True),
            "use_rslora=True: smol loads plain LoRA only",
        ),
        (
            lambda f: _edit_config(f, use_dora=True),
            "use_dora=True: smol loads plain LoRA only",
        ),
        (
            lambda f: _edit_config(f, fan_in_fan_out=True),
            "fan_in_fan_out=True: smol loads plain LoRA only",
        ),
        (
            lambda f: _drop_from_config(f, "r", "target_modules"),
            "adapter_config.json: no r, target_modules",
        ),
    ],
)
def test_a_damaged_adapter_without_manifest_names_its_fault(adapter, damage, says):
    """Folders written by peft carry no manifest.json: their faults are named one by
    one, and the model is changed only once the whole adapter is checked."""
    folder, config = adapter
    (folder / "manifest.json").unlink()
    damage(folder)
    model = SmolLM(config)
    with pytest.raises(ValueError, match=says):
        load_peft_adapter(model, folder)
    assert not lora_layers(model) and all(p.requires_grad for p in model.parameters())


def _edit_config(folder, **changes):
    path = folder / "adapter_config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | changes))


def _drop_from_config(folder, *keys):
    path = folder / "adapter_config.json"
    config = json.loads(path.read_text())
    path.write_text(json.dumps({k: v for k, v in config.items() if k not in keys}))


@pytest.mark.parametrize(
    "targets, says",
    [
        # the file holds v_proj's A and B, which the config no longer names
        (["q_proj"], "0 missing (e.g. []), 4 unexpected"),
        # the config names k_proj, for which the file holds no weights
        (["q_proj", "v_proj", "k_proj"], "4 missing"),
    ],
)
def test_adapter_weights_that_do_not_fit_its_config_are_named(adapter, targets, says):
    folder, config = adapter
    (folder / "manifest.json").unlink()
    _edit_config(folder, target_modules=targets)
    model = SmolLM(config)
    with pytest.raises(ValueError) as info:
        load_peft_adapter(model, folder)
    message = str(info.value)
    assert message.startswith(f"{folder}: adapter weights do not fit this model: ")
    assert says in message and "unexpected" in message
    assert not lora_layers(model)


def _edit_weights(folder, value):
    from safetensors.torch import load_file, save_file

    path = folder / "adapter_model.safetensors"
    tensors = load_file(path)
    next(iter(tensors.values()))[0, 0] = value
    save_file(tensors, path)
