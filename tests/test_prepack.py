"""PackedLinear and prepack: float32 weights that oneDNN reorders once, for decoding on
a CPU."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import smol.prepack
from smol.generate import generate
from smol.kv_cache import KVCache
from smol.prepack import PackedLinear, prepack
from smol.speculative import SpeculativeStats, speculative_greedy
from tests.tiny_models import config, peaked

pytestmark = pytest.mark.skipif(
    not smol.prepack.available(), reason="this torch build lacks oneDNN"
)


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal up to float32 sums taken in another order."""
    scale = b.abs().max().item() if b.numel() else 1.0
    return torch.allclose(a, b, rtol=1e-5, atol=1e-5 * scale)


@pytest.mark.parametrize("shape", [(48,), (1, 48), (9, 48), (2, 5, 48), (0, 48)])
def test_packed_linear_is_f_linear(shape):
    """Any number of rows and leading dimensions, one oneDNN layout. Kills: the weight
    used transposed (a square weight would hide it: 80 x 48 here), outputs reshaped with
    the input's width, rows of a (2, 5) batch flattened in another order."""
    torch.manual_seed(0)
    w, x = torch.randn(80, 48), torch.randn(*shape)
    y = PackedLinear(w)(x)
    assert y.shape == (*shape[:-1], 80)
    assert close(y, F.linear(x, w))


def test_the_weight_comes_back_unchanged_and_copies():
    torch.manual_seed(0)
    w = torch.randn(80, 48)
    layer = PackedLinear(w)
    assert torch.equal(layer.weight(), w)
    twin = copy.deepcopy(layer)  # an opaque oneDNN tensor has no storage to copy
    assert twin.packed is not layer.packed and torch.equal(twin.weight(), w)
    assert repr(layer) == "PackedLinear(in_features=48, out_features=80, prepacked)"


def test_packed_linear_refusals():
    w = torch.randn(80, 48)
    with pytest.raises(ValueError, match="float32 weight"):
        PackedLinear(w.to(torch.bfloat16))
    with pytest.raises(ValueError, match="2-d float32 weight"):
        PackedLinear(torch.randn(80))
    layer = PackedLinear(w)
    with pytest.raises(
        ValueError, match="float32 inputs on the CPU, got torch.bfloat16"
    ):
        layer(torch.randn(3, 48, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="on meta"):
        layer(torch.randn(3, 48, device="meta"))
    with pytest.raises(ValueError, match="48 features, got shape \\(3, 47\\)"):
        layer(torch.randn(3, 47))


def tiny():
    return peaked(config(101, 48, 96, 3, 6, 2, 128))


def test_prepack_copies_every_linear_and_leaves_the_model_alone():
    """Every Linear of the copy is a PackedLinear holding the model's weight, the tied
    head included; the model keeps its Linears, its tie and its gradients. Kills: a
    copy that skips the head (or the MLP), packs in place, or packs a layer's
    neighbour's weight."""
    model = tiny()
    packed = prepack(model)
    linears = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    assert len(linears) == 3 * 7 + 1
    for name, linear in linears.items():
        twin = packed.get_submodule(name)
        assert isinstance(twin, PackedLinear), name
        assert torch.equal(twin.weight(), linear.weight), name
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert not packed.training
    assert not any(isinstance(m, PackedLinear) for m in model.modules())


def test_a_prepacked_model_decodes_as_the_model_does():
    """Logits equal up to summation order; greedy decoding and speculative decoding
    checked by the prepacked copy give the model's tokens."""
    model = tiny()
    packed = prepack(model)
    torch.manual_seed(1)
    ids = torch.randint(0, 101, (2, 11))
    with torch.no_grad():
        assert close(packed(ids)[0], model(ids)[0])
    prompt = ids[:1]
    expected = generate(model, prompt, 30, temperature=0)
    assert torch.equal(generate(packed, prompt, 30, temperature=0), expected)
    stats = SpeculativeStats()
    cache = KVCache.for_model(model, 1, prompt.shape[1] + 30 + 8)
    checked = speculative_greedy(
        packed, prompt, 30, cache, draft_model=model, num_draft=8, stats=stats
    )
    assert torch.equal(checked, expected)
    assert stats.accepted > 0  # drafts were taken, not only single steps


def test_prepack_refusals(monkeypatch):
    model = tiny()
    with pytest.raises(
        ValueError, match="layers.0.self_attn.q_proj is torch.bfloat16 on cpu"
    ):
        prepack(copy.deepcopy(model).to(torch.bfloat16))
    with pytest.raises(ValueError, match="Sequential has no nn.Linear"):
        prepack(nn.Sequential(nn.ReLU()))
    with pytest.raises(ValueError, match="0 has a bias"):
        prepack(nn.Sequential(nn.Linear(4, 4)))
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="lacks oneDNN"):
        prepack(model)
