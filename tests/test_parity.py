"""smol equals transformers' LlamaForCausalLM: same state dict, same logits, same
gradients."""

import pytest
import torch
from smol import SmolConfig, SmolLM
from smol.reference import llama_twin

ATOL = 1e-5


def llama_pair(config: SmolConfig, attn="sdpa", seed=0):
    """A randomly initialised LlamaForCausalLM and a SmolLM holding its weights."""
    torch.manual_seed(seed)
    ref = llama_twin(config, attn).eval()
    with torch.no_grad():  # transformers initialises norms to one: make them random too
        for name, p in ref.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    model = SmolLM(config.replace(attn_implementation=attn)).eval()
    model.load_state_dict(ref.state_dict(), strict=True)
    return ref, model


@pytest.mark.parametrize("attn", ["sdpa", "sdpa-repeat-kv", "eager"])
def test_logits_equal_transformers(tiny_config, attn, monkeypatch):
    # the path CUDA takes in fp32 or on pre-Ampere GPUs: repeat_kv, then SDPA
    if attn == "sdpa-repeat-kv":
        monkeypatch.setattr("smol.attention.sdpa_uses_gqa", lambda q: False)
        attn = "sdpa"
    ref, model = llama_pair(tiny_config, attn)
    ids = torch.randint(
        0, tiny_config.vocab_size, (3, 17), generator=torch.Generator().manual_seed(1)
    )
    with torch.no_grad():
        expected = ref(ids).logits
        logits, loss = model(ids)
    assert loss is None
    assert logits.shape == (3, 17, tiny_config.vocab_size)
    torch.testing.assert_close(logits, expected, atol=ATOL, rtol=0)


def test_state_dict_round_trip(tiny_config):
    ref, model = llama_pair(tiny_config)
    # smol -> transformers, strictly, into a fresh reference with other weights
    other, _ = llama_pair(tiny_config, seed=1)
    other.load_state_dict(model.state_dict(), strict=True)
    for k, v in ref.state_dict().items():
        assert torch.equal(other.state_dict()[k], v), k
    assert set(model.state_dict()) == set(ref.state_dict())
    assert (
        model.lm_head.weight is model.model.embed_tokens.weight
    ) == tiny_config.tie_word_embeddings


def test_loss_and_gradients_equal_transformers(tiny_config):
    ref, model = llama_pair(tiny_config)
    ref.train(), model.train()
    ids = torch.randint(
        0, tiny_config.vocab_size, (2, 13), generator=torch.Generator().manual_seed(2)
    )
    # transformers shifts labels inside; smol takes targets already shifted
    targets = torch.cat([ids[:, 1:], torch.full((2, 1), -100)], dim=1)
    ref_loss = ref(ids, labels=ids).loss
    _, loss = model(ids, targets)
    torch.testing.assert_close(loss, ref_loss, atol=ATOL, rtol=0)
    ref_loss.backward()
    loss.backward()
    ref_grads = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        torch.testing.assert_close(
            p.grad, ref_grads[name].grad, atol=ATOL, rtol=0, msg=name
        )


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_padded_batch_equals_transformers_and_stays_causal(tiny_config, attn):
    ref, model = llama_pair(tiny_config, attn)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, tiny_config.vocab_size, (3, 12), generator=g)
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[1, 9:] = 0  # right padding
    mask[2, :4] = 0  # left padding
    with torch.no_grad():
        expected = ref(ids, attention_mask=mask).logits
        logits, _ = model(ids, attention_mask=mask)
    real = mask.bool()
    assert torch.isfinite(logits).all()
    torch.testing.assert_close(logits[real], expected[real], atol=ATOL, rtol=0)
    # Causal: changing a later token never changes an earlier position's logits.
    changed = ids.clone()
    changed[:, 8] = (changed[:, 8] + 1) % tiny_config.vocab_size
    with torch.no_grad():
        after, _ = model(changed, attention_mask=mask)
    torch.testing.assert_close(after[:, :8], logits[:, :8], atol=0, rtol=0)
    assert not torch.allclose(after[0, 8:], logits[0, 8:])
    # Padding is hidden: changing a padded token never changes a real token's logits.
    repadded = ids.clone()
    repadded[~real] = 0
    with torch.no_grad():
        same, _ = model(repadded, attention_mask=mask)
    torch.testing.assert_close(same[real], logits[real], atol=ATOL, rtol=0)


def test_real_size_config_matches_transformers_layout():
    config = SmolConfig.preset("smollm2-135m")
    with torch.device("meta"):
        ref, model = llama_twin(config), SmolLM(config)
    ours = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    theirs = {k: tuple(v.shape) for k, v in ref.state_dict().items()}
    assert ours == theirs
    assert (
        sum(p.numel() for p in ref.parameters()) == model.count_params() == 134_515_008
    )
