"""Each feature the book names is on when it says so: these tests fail when the feature
is switched off or applied to the wrong thing, not only when the code stops running.
Each names the broken implementation it rejects."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from smol import SmolConfig, SmolLM
from smol.generate import generate
from smol.lora import LoRALinear
from smol.model import DecoderLayer
from smol.quantize import QuantLinear
from tests.test_train import small_config, trainer

COMPILE = torch.compile  # the real one, whatever a test patches


def check_compiled_training_updates_the_saved_model(tmp_path, monkeypatch, target):
    """Train 3 compiled steps (the eager backend: quick), with torch.compile applied to
    target(model); the model that is saved must be the one that trained."""
    monkeypatch.setattr(
        torch, "compile", lambda m, **kw: COMPILE(target(m), backend="eager", **kw)
    )
    t = trainer(small_config(tmp_path, steps=3, compile=True, eval_every=0))
    before = {k: v.clone() for k, v in t.model.state_dict().items()}
    t.fit()
    trained = {id(p) for p in t.train_model.parameters()}
    assert trained == {id(p) for p in t.model.parameters()}
    state = t.model.state_dict()
    assert not torch.equal(
        state["model.layers.0.self_attn.q_proj.weight"],
        before["model.layers.0.self_attn.q_proj.weight"],
    )
    saved = load_file(t.last_checkpoint / "model.safetensors")
    for name, value in saved.items():
        torch.testing.assert_close(value, state[name], atol=0, rtol=0)


def test_compiled_training_updates_the_model_it_saves(tmp_path, monkeypatch):
    """Rejects compiling a copy of the model: the copy would train while the model
    that is evaluated, sampled and saved keeps its initial weights."""
    check_compiled_training_updates_the_saved_model(tmp_path, monkeypatch, lambda m: m)
    with pytest.raises(AssertionError):  # the mutant
        check_compiled_training_updates_the_saved_model(
            tmp_path / "copy", monkeypatch, copy.deepcopy
        )


def linear_output_dtypes(model) -> tuple[list, list]:
    """Hooks that record the dtype of every nn.Linear output of `model`."""
    seen = []
    hooks = [
        m.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
        for m in model.modules()
        if isinstance(m, nn.Linear)
    ]
    return seen, hooks


def test_bf16_autocast_runs_the_matrix_products_in_bfloat16(tmp_path):
    """Rejects an autocast that is never entered (or entered with enabled=False): the
    weights stay float32, and so would every product."""
    t = trainer(small_config(tmp_path, steps=2, dtype="bf16", eval_every=0))
    seen, hooks = linear_output_dtypes(t.model)
    t.fit()
    for h in hooks:
        h.remove()
    assert seen and set(seen) == {torch.bfloat16}
    assert all(p.dtype == torch.float32 for p in t.model.parameters())
    assert all(math.isfinite(x) for x in t.history["loss"])


def test_autocast_switched_off_is_caught(tmp_path, monkeypatch):
    t = trainer(small_config(tmp_path, steps=2, dtype="bf16", eval_every=0))
    monkeypatch.setattr(
        type(t), "autocast", lambda self: torch.autocast("cpu", enabled=False)
    )
    seen, hooks = linear_output_dtypes(t.model)
    t.fit()
    assert set(seen) == {torch.float32}  # what the test above rejects


def layer_calls(model, ids) -> int:
    """How many times decoder layers run in one forward and backward pass."""
    calls = []
    hooks = [
        m.register_forward_pre_hook(lambda m, a: calls.append(1))
        for m in model.modules()
        if isinstance(m, DecoderLayer)
    ]
    model(ids, ids.roll(-1, 1))[1].backward()
    for h in hooks:
        h.remove()
    return len(calls)


def test_gradient_checkpointing_recomputes_every_layer():
    """Rejects a flag that is never read: gradients are equal either way, but with
    checkpointing each layer runs again in the backward pass instead of keeping its
    activations."""
    torch.manual_seed(0)
    model = SmolLM(SmolConfig.preset("tiny", num_hidden_layers=3)).train()
    ids = torch.randint(0, 4096, (2, 16))
    assert layer_calls(model, ids) == 3
    model.gradient_checkpointing = True
    assert layer_calls(model, ids) == 6
    model.eval()  # inference keeps nothing for a backward pass: no recomputation
    with torch.no_grad():
        calls = []
        h = model.model.layers[0].register_forward_pre_hook(
            lambda m, a: calls.append(1)
        )
        model(ids)
        h.remove()
    assert len(calls) == 1


def test_lora_dropout_masks_the_adapter_input_only():
    """Rejects dropout on the whole output (the frozen layer's output would be dropped
    too) and dropout after the adapter's down-projection (other entries dropped): the
    output must be base(x) + scaling * B A dropout(x) with the very mask dropout draws
    for x."""
    torch.manual_seed(0)
    layer = LoRALinear(nn.Linear(8, 6), r=2, alpha=4, dropout=0.5).train()
    nn.init.normal_(layer.lora_B)
    x = torch.randn(5, 8)
    torch.manual_seed(1)
    got = layer(x)
    torch.manual_seed(1)
    dropped = F.dropout(x, 0.5, training=True)
    expected = layer.base_layer(x) + layer.scaling * (
        dropped @ layer.lora_A.T @ layer.lora_B.T
    )
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)
    # with a zero adapter, training mode leaves the frozen layer's output untouched
    nn.init.zeros_(layer.lora_B)
    torch.testing.assert_close(layer(x), layer.base_layer(x), atol=0, rtol=0)


def test_quant_linear_stays_within_int8_rounding_of_the_original_layer():
    """Rejects a scale that is not each row's own (a per-tensor scale, or absmax / 255)
    and codes that are truncated instead of rounded: per-channel int8 moves each weight
    by at most half its row's step, absmax / 127. Read from the layer's outputs and
    compared with the original layer, not with its own dequantization."""
    torch.manual_seed(0)
    linear = nn.Linear(64, 48, bias=False)
    with torch.no_grad():  # rows of very different sizes
        linear.weight.mul_(torch.logspace(-3, 1, 48)[:, None])
    step = linear.weight.abs().amax(dim=1, keepdim=True) / 127  # (48, 1)

    def within_half_a_step(layer) -> bool:
        with torch.no_grad():
            effective = layer(torch.eye(64)).T  # (48, 64): the weight it multiplies by
        return bool(((effective - linear.weight).abs() <= step / 2 * 1.0001).all())

    assert within_half_a_step(QuantLinear.from_linear(linear))
    # the mutants: truncated codes, one scale for the whole matrix
    w = linear.weight.detach()
    truncated = torch.trunc(w / step).clamp(-127, 127).to(torch.int8)
    assert not within_half_a_step(QuantLinear(truncated, step[:, 0]))
    one = w.abs().max() / 127
    per_tensor = torch.round(w / one).to(torch.int8)
    assert not within_half_a_step(QuantLinear(per_tensor, one.expand(48).clone()))


@pytest.fixture(scope="module")
def tiny_model():
    torch.manual_seed(0)
    cfg = SmolConfig.preset(
        "tiny", num_hidden_layers=2, hidden_size=64, intermediate_size=128
    )
    return SmolLM(cfg).eval()


def test_inductor_compiled_decoding_equals_eager(tiny_model):
    """The compiled static-cache step as users run it (inductor, which generates C++ on
    a CPU): the same greedy tokens as eager decoding, and one compiled graph for every
    step after the prompt."""
    import torch._dynamo

    torch._dynamo.reset()
    ids = torch.randint(0, tiny_model.config.vocab_size, (1, 6))
    expected = generate(tiny_model, ids, 10, temperature=0)
    counts = torch._dynamo.utils.counters
    counts.clear()
    got = generate(tiny_model, ids, 10, temperature=0, compile="inductor")
    assert torch.equal(got, expected)
    again = generate(tiny_model, ids, 12, temperature=0, compile="inductor")
    assert torch.equal(again[:, : got.shape[1]], got)
    assert counts["stats"]["unique_graphs"] <= 2  # the step; no recompile per token


def test_inductor_compiled_training_equals_eager(tmp_path):
    """The trainer's --compile with inductor: the same losses as eager training, to
    float32 rounding."""
    import torch._dynamo

    torch._dynamo.reset()
    losses = []
    for compiled in (False, True):
        t = trainer(
            small_config(
                tmp_path / str(compiled), steps=3, compile=compiled, eval_every=0
            )
        )
        t.fit()
        losses.append(t.history["loss"])
    assert losses[0] == pytest.approx(losses[1], abs=1e-4)


def dropout_on_the_output(self, x):
    adapter = F.linear(F.linear(x, self.lora_A), self.lora_B) * self.scaling
    return self.lora_dropout(self.base_layer(x) + adapter)


def dropout_after_the_down_projection(self, x):
    h = self.lora_dropout(F.linear(x, self.lora_A))
    return self.base_layer(x) + F.linear(h, self.lora_B) * self.scaling


@pytest.mark.parametrize(
    "forward", [dropout_on_the_output, dropout_after_the_down_projection]
)
def test_misplaced_lora_dropout_is_caught(monkeypatch, forward):
    monkeypatch.setattr(LoRALinear, "forward", forward)
    with pytest.raises(AssertionError):
        test_lora_dropout_masks_the_adapter_input_only()


def test_a_checkpointing_flag_that_is_never_read_is_caught(monkeypatch):
    """A model whose forward ignores the flag runs each layer once."""
    monkeypatch.setattr(
        SmolLM,
        "gradient_checkpointing",
        property(lambda self: False, lambda self, value: None),
        raising=False,
    )
    with pytest.raises(AssertionError):
        test_gradient_checkpointing_recomputes_every_layer()
