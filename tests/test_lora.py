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
from smol.lora import (
    TARGETS,
    LoRALinear,
    apply_lora,
    count_trainable,
    load_peft_adapter,
    lora_layers,
    merge_lora,
    save_peft_adapter,
)
from smol.checkpoint import CheckpointError
from smol.pretrained import save_pretrained
from tests.conftest import TINY_CONFIGS
from tests.test_parity import ATOL, llama_pair

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
    theirs = dict(peft_model.named_parameters())
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, layer in lora_layers(model).items():
            for part in ("lora_A", "lora_B"):
                value = torch.randn(getattr(layer, part).shape, generator=g) * 0.1
                getattr(layer, part).copy_(value)
                theirs[f"base_model.model.{name}.{part}.default.weight"].copy_(value)
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


def _edit_weights(folder, value):
    from safetensors.torch import load_file, save_file

    path = folder / "adapter_model.safetensors"
    tensors = load_file(path)
    next(iter(tensors.values()))[0, 0] = value
    save_file(tensors, path)
