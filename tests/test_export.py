"""GGUF export (smol.export), proven by readers smol did not write: the `gguf` package,
transformers and llama.cpp (llama-cpp-python, optional: `make llama-cpp`)."""

import importlib.util

import gguf
import numpy as np
import pytest
import torch
from gguf.constants import GGMLQuantizationType as Q

from smol.commands.export import main
from smol.data import load_tokenizer
from smol.export import (
    TYPES,
    UNUSED,
    export_gguf,
    gguf_metadata,
    gguf_tensors,
    pre_tokenizer_name,
    quantize_q8_0,
)
from smol.generate import generate
from smol.gguf import BLOCK_SIZES, GGUFFile, bundled_gguf_path, read_gguf
from smol.pretrained import build_model, load_pretrained, read_model, save_pretrained
from tests.tiny_models import config, peaked

LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None
needs_llama_cpp = pytest.mark.skipif(
    not LLAMA_CPP, reason="llama-cpp-python is not installed (make llama-cpp)"
)
PROMPT = "To be, or not to be, that is the question"
# rows of a multiple of 32 (Q8_0), grouped and plain attention, tied and untied heads,
# a vocabulary larger than the tokenizer's (padded with unused entries)
CONFIGS = {
    "gqa-tied": config(4096, 64, 96, 2, 4, 2, 128, rope_theta=10000.0),
    "mha-untied": config(
        4100, 96, 160, 2, 3, 3, 128, rope_theta=500.0, tie_word_embeddings=False
    ),
}


@pytest.fixture(scope="module")
def shakespeare():
    return load_tokenizer("shakespeare")


def exported(cfg, tokenizer, folder, type, seed=0):
    """(model, path): a peaked random model and its GGUF file of `type`."""
    model = peaked(cfg, seed)
    path = export_gguf(
        cfg, model.state_dict(), tokenizer, folder / f"m.{type}.gguf", type
    )
    return model, path


def stored(model, type):
    """The weights a file of `type` holds, as float32: what its readers compute with."""
    state = {}
    for name, w in model.state_dict().items():
        if type == "f16" and w.dim() == 2:
            w = w.half().float()
        if type == "q8_0" and w.dim() == 2:
            w = gguf.quants.dequantize(quantize_q8_0(w).numpy(), Q.Q8_0)
            w = torch.from_numpy(w).reshape(model.state_dict()[name].shape)
        state[name] = w
    return build_model(model.config, state, "cpu")


def greedy(model, ids, n=12, eos=None):
    """smol's greedy continuation of ids, up to n tokens or through eos."""
    out = generate(model, torch.tensor([ids]), n, temperature=0, eos_token_id=eos)
    return until(out[0, len(ids) :].tolist(), eos)


def until(tokens, eos):
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


# --- Q8_0 by hand ---------------------------------------------------------------------
def test_q8_0_bytes_equal_the_gguf_quantizer():
    """Halves (x / d exactly k + 0.5), an all-zero block, wide and tiny scales: a
    quantizer that rounds halves to even (torch.round), divides by d instead of
    multiplying by 1/d, or scales by the float16-rounded d differs somewhere."""
    torch.manual_seed(0)
    w = torch.randn(64, 256) * torch.logspace(-6, 3, 64)[:, None]
    w[0, :32] = 0  # a block of zeros: scale 0, every value 0
    w[2, :32] = torch.arange(32) - 15.5  # the scale is 127 / 127: halves everywhere
    w[2, 31] = 127
    w[3, :32] = 0  # 0.1254576 * (1 / d) rounds to 2.4999998, 0.1254576 / d to 2.5
    w[3, :2] = torch.tensor([6.373247146606445, 0.12545761466026306])
    ours = quantize_q8_0(w).numpy()
    theirs = gguf.quants.quantize(w.numpy(), Q.Q8_0)
    assert ours.dtype == np.uint8 and ours.shape == theirs.shape == (64, 8 * 34)
    assert np.array_equal(ours, theirs)


def test_q8_0_refuses_rows_not_made_of_blocks():
    with pytest.raises(ValueError, match="multiple of 32 values, got 36"):
        quantize_q8_0(torch.randn(4, 36))


# --- readers: smol's own and the gguf package -----------------------------------------
@pytest.mark.parametrize("type", sorted(TYPES))
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_readers_get_back_every_key_and_tensor(tmp_path, shakespeare, name, type):
    cfg = CONFIGS[name]
    model, path = exported(cfg, shakespeare, tmp_path, type)
    metadata = gguf_metadata(cfg, shakespeare, TYPES[type])
    tensors = gguf_tensors(cfg, model.state_dict(), TYPES[type])

    reader = gguf.GGUFReader(path)  # the gguf package's own reader
    fields = {
        k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")
    }
    assert fields.keys() == metadata.keys()
    for key, (kind, value) in metadata.items():
        if kind == gguf.GGUFValueType.FLOAT32:
            value = float(np.float32(value))
        assert fields[key] == value, key
    assert [t.name for t in reader.tensors] == list(tensors)
    for t in reader.tensors:
        qtype, shape, data = tensors[t.name]
        assert t.tensor_type == qtype and tuple(reversed(t.shape.tolist())) == shape
        assert t.data_offset % 32 == 0
        assert np.array_equal(t.data.view(np.uint8).reshape(data.shape), data.numpy())
    assert ("output.weight" in tensors) == (not cfg.tie_word_embeddings)

    # smol's reader: the same config, the weights as stored, the same tokenizer
    config2, state, tokenizer = read_gguf(path)
    assert config2 == cfg.replace(initializer_range=config2.initializer_range)
    want = stored(model, type).state_dict()
    assert state.keys() == want.keys() - (
        {"lm_head.weight"} if cfg.tie_word_embeddings else set()
    )
    for k, v in state.items():
        torch.testing.assert_close(v, want[k], rtol=0, atol=0, msg=k)
    assert tokenizer.encode(PROMPT) == shakespeare.encode(PROMPT)
    assert tokenizer.eos_token_id == shakespeare.eos_token_id


def test_vocabulary_padding_and_token_types(shakespeare):
    meta = gguf_metadata(CONFIGS["mha-untied"], shakespeare, Q.F32)
    tokens, types = (
        meta["tokenizer.ggml.tokens"][1],
        meta["tokenizer.ggml.token_type"][1],
    )
    assert len(tokens) == len(types) == 4100
    assert tokens[4096:] == [f"[PAD{i}]" for i in range(4096, 4100)]
    assert types[4096:] == [UNUSED] * 4 and types[0] == 3 and set(types[1:4096]) == {1}
    assert meta["tokenizer.ggml.pre"][1] == "gpt-2"  # llama.cpp's name
    assert "tokenizer.ggml.bos_token_id" not in meta  # this tokenizer has none


def test_smollm2_tokenizer_metadata_equals_the_released_file():
    """Tokens, types, merges, pre-tokenizer, special ids and chat template written from
    the tokenizer equal what llama.cpp's converter wrote for SmolLM2."""
    released = GGUFFile(bundled_gguf_path())
    config, _, tokenizer = read_gguf(bundled_gguf_path())
    meta = gguf_metadata(config, tokenizer, Q.F16)
    for key, value in released.metadata.items():
        if key.startswith("tokenizer.") and key != "tokenizer.ggml.add_space_prefix":
            assert meta[key][1] == value, key
        if key.startswith("llama."):
            assert np.float32(meta[key][1]) == np.float32(value), key


def test_the_q_k_rows_are_permuted_for_llama_cpp(tmp_path, shakespeare):
    """A file written without the permutation still loads (q/k have the right shapes)
    but its attention is wrong: llama.cpp's rotary layout needs it."""
    cfg = CONFIGS["gqa-tied"]
    model, path = exported(cfg, shakespeare, tmp_path, "f32")
    file = GGUFFile(path)
    q = model.model.layers[0].self_attn.q_proj.weight
    k = model.model.layers[0].self_attn.k_proj.weight
    head = cfg.head_dim
    # row 2j of a head holds the features the model's row j held, row 2j+1 row j + D/2
    assert torch.equal(file.tensor("blk.0.attn_q.weight")[0:head:2], q[: head // 2])
    assert torch.equal(
        file.tensor("blk.0.attn_q.weight")[1:head:2], q[head // 2 : head]
    )
    assert torch.equal(
        file.tensor("blk.0.attn_k.weight")[1:head:2], k[head // 2 : head]
    )
    assert torch.equal(
        file.tensor("blk.0.attn_v.weight"),
        model.state_dict()["model.layers.0.self_attn.v_proj.weight"],
    )


# --- transformers ---------------------------------------------------------------------
@pytest.mark.parametrize("type", sorted(TYPES))
def test_transformers_generates_what_smol_generates(tmp_path, shakespeare, type):
    """F32: the model itself; F16 and Q8_0: smol running the weights the file holds."""
    from transformers import AutoModelForCausalLM

    cfg = CONFIGS["gqa-tied"]
    model, path = exported(cfg, shakespeare, tmp_path, type)
    ours = model if type == "f32" else stored(model, type)
    hf = AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file=path.name, dtype=torch.float32
    ).eval()
    ids = shakespeare.encode(PROMPT)
    with torch.no_grad():
        torch.testing.assert_close(
            hf(torch.tensor([ids])).logits,
            ours(torch.tensor([ids]))[0],
            atol=1e-4,
            rtol=0,
        )
        out = hf.generate(
            torch.tensor([ids]), max_new_tokens=12, do_sample=False, eos_token_id=None
        )
    assert out[0, len(ids) :].tolist() == greedy(ours, ids)


# --- llama.cpp ------------------------------------------------------------------------
def llama(path, n_ctx=128):
    from llama_cpp import Llama

    return Llama(str(path), n_ctx=n_ctx, n_threads=1, verbose=False, seed=0)


def llama_greedy(llm, ids, n=12, eos=None):
    """llama.cpp's greedy continuation of ids, up to n tokens or through eos."""
    llm.reset()
    out = []
    for token in llm.generate(ids, temp=0.0, top_k=1, top_p=1.0, repeat_penalty=1.0):
        out.append(token)
        if len(out) == n or token == eos:
            return out
    return out


# Not Q8_0: llama.cpp multiplies Q8_0 weights by activations rounded to 8 bits too, so a
# random model's near ties go other ways than in smol's float32 products
@needs_llama_cpp
@pytest.mark.parametrize("type", ["f16", "f32"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_llama_cpp_generates_what_smol_generates(tmp_path, shakespeare, name, type):
    model, path = exported(CONFIGS[name], shakespeare, tmp_path, type)
    llm = llama(path)
    ids = shakespeare.encode(PROMPT)
    assert llm.tokenize(PROMPT.encode(), add_bos=False, special=True) == ids
    ours = model if type == "f32" else stored(model, type)
    assert llama_greedy(llm, ids) == greedy(ours, ids)


# --- the released weights, round trip
CHAT = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def released_f16(tmp_path_factory):
    """The bundled Q4_1 SmolLM2-135M-Instruct exported as F16."""
    path = tmp_path_factory.mktemp("released") / "smollm2.f16.gguf"
    assert main(["smollm2", str(path), "--type", "f16"]) == 0
    return path


def test_released_weights_round_trip_in_transformers(released_f16, real_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tokenizer = real_model
    ids = tokenizer.apply_chat_template(CHAT, tokenize=True)
    want = greedy(model, ids, 10, tokenizer.eos_token_id)
    where = {"pretrained_model_name_or_path": str(released_f16.parent)}
    hf = AutoModelForCausalLM.from_pretrained(
        **where, gguf_file=released_f16.name, dtype=torch.float32
    )
    hf_tokenizer = AutoTokenizer.from_pretrained(**where, gguf_file=released_f16.name)
    text = tokenizer.apply_chat_template(CHAT)
    assert hf_tokenizer(text, add_special_tokens=False).input_ids == ids
    out = hf.generate(torch.tensor([ids]), max_new_tokens=10, do_sample=False)
    assert until(out[0, len(ids) :].tolist(), tokenizer.eos_token_id) == want
    assert "Paris" in tokenizer.decode(want)


@needs_llama_cpp
def test_released_weights_round_trip_in_llama_cpp(released_f16, real_model):
    """llama.cpp runs the exported F16 file with smol's text on the original weights.
    (llama.cpp on the Q4_1 file itself differs here: its Q4_1 products round the
    activations to 8 bits, and this prompt's first token is a near tie.)"""
    model, tokenizer = real_model
    ids = tokenizer.apply_chat_template(CHAT, tokenize=True)
    eos = tokenizer.eos_token_id
    got = llama_greedy(llama(released_f16), ids, 10, eos)
    assert got == greedy(model, ids, 10, eos)
    assert "Paris" in tokenizer.decode(got)


# --- the command line and what it refuses ---------------------------------------------
def test_command_line_exports_a_saved_model_folder(tmp_path, shakespeare, capsys):
    cfg = CONFIGS["gqa-tied"]
    model = peaked(cfg)
    save_pretrained(model, shakespeare, tmp_path / "model")
    out = tmp_path / "model.gguf"
    assert main([str(tmp_path / "model"), str(out), "--type", "q8_0"]) == 0
    assert "wrote" in capsys.readouterr().out
    config2, _, _ = read_model(out)
    assert config2.num_hidden_layers == cfg.num_hidden_layers
    assert GGUFFile(out).get("general.name") == "model"
    assert GGUFFile(out).tensors["blk.0.attn_q.weight"][0] == Q.Q8_0
    assert main([str(tmp_path / "model"), str(out)]) == 2  # exists
    assert "exists; pass --overwrite" in capsys.readouterr().err
    assert main([str(tmp_path / "model"), str(out), "--overwrite"]) == 0


def test_command_line_names_what_it_cannot_write(tmp_path, shakespeare, capsys):
    cfg = config(4096, 48, 96, 1, 3, 1, 64)  # rows of 48: no Q8_0 blocks
    save_pretrained(peaked(cfg), shakespeare, tmp_path / "model")
    out = tmp_path / "m.gguf"
    assert main([str(tmp_path / "model"), str(out), "--type", "q8_0"]) == 1
    assert "multiple of 32 values, got 48" in capsys.readouterr().err
    assert not out.exists() and not list(tmp_path.glob(".m.gguf*"))
    assert main([str(tmp_path / "nothing"), str(out)]) == 2  # before any work
    assert "no such model: " in capsys.readouterr().err


def test_command_line_refusals_are_usage_errors_naming_the_input(tmp_path, capsys):
    """A folder under OUT's name (even with --overwrite), an empty --name or model, a
    model that is not there, or OUT the model itself: status 2 before any work, one
    line naming what was wrong, nothing written."""
    (tmp_path / "dir.gguf").mkdir()
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    out = str(tmp_path / "o.gguf")
    for argv, says in (
        (
            ["smollm2", str(tmp_path / "dir.gguf"), "--overwrite"],
            "dir.gguf is a folder",
        ),
        (["smollm2", out, "--name", " "], "--name is empty"),
        (["", out], "the model is empty"),
        ([str(tmp_path / "nowhere"), out], "no such model: "),
        ([str(tmp_path / "m.gguf")] * 2, "is the model being exported"),
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0], (argv, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.gguf", "m.gguf"]
    assert (tmp_path / "m.gguf").read_bytes() == b"GGUF"


@pytest.mark.parametrize("stop", ["SIGINT", "SIGTERM"])
def test_an_interrupted_export_leaves_no_file_under_the_final_name(
    tmp_path, shakespeare, capsys, monkeypatch, stop
):
    """Ctrl-C or SIGTERM halfway through the tensors: the file being replaced is as it
    was, a new one is not there, no temporary file is left, and the one line says so
    (status 130 or 143)."""
    import os
    import signal

    import smol.export

    save_pretrained(peaked(CONFIGS["gqa-tied"]), shakespeare, tmp_path / "model")
    infos = []
    pack = smol.export.pack_tensor_info

    def signalled(*args, **kwargs):  # the header is on disk by now
        infos.append(args[0])
        if len(infos) == 3:
            os.kill(os.getpid(), getattr(signal, stop))
        return pack(*args, **kwargs)

    monkeypatch.setattr(smol.export, "pack_tensor_info", signalled)
    earlier = tmp_path / "earlier.gguf"
    earlier.write_bytes(b"an earlier export")
    for out, extra, kept in (
        (earlier, ["--overwrite"], " (the earlier"),
        ("new", [], ""),
    ):
        path = tmp_path / "new.gguf" if out == "new" else out
        infos.clear()
        status = main([str(tmp_path / "model"), str(path), *extra])
        assert status == 128 + getattr(signal, stop)
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{path} was not written{kept}" in err[0], err
    assert earlier.read_bytes() == b"an earlier export"
    assert not (tmp_path / "new.gguf").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["earlier.gguf", "model"]


def test_refusals(shakespeare):
    cfg = CONFIGS["gqa-tied"]
    model = peaked(cfg)
    lora = dict(
        model.state_dict(), **{"model.layers.0.self_attn.q_proj.lora_A": torch.ones(1)}
    )
    with pytest.raises(ValueError, match="merge LoRA adapters first"):
        gguf_tensors(cfg, lora, Q.F16)
    big = dict(model.state_dict())
    big["model.norm.weight"] = big["model.norm.weight"].clone()
    big["model.layers.0.mlp.up_proj.weight"] = (
        big["model.layers.0.mlp.up_proj.weight"] * 1e5
    )
    with pytest.raises(ValueError, match="beyond float16's range"):
        gguf_tensors(cfg, big, Q.F16)
    with pytest.raises(ValueError, match="more than the model's vocab_size 4000"):
        gguf_metadata(cfg.replace(vocab_size=4000), shakespeare, Q.F16)
    with pytest.raises(ValueError, match="cannot write this tokenizer's pre-tokenizer"):
        pre_tokenizer_name({"type": "Whitespace"})
    with pytest.raises(ValueError, match="type must be one of"):
        export_gguf(cfg, model.state_dict(), shakespeare, "x.gguf", "q4_0")


# --- memory-mapped loading ------------------------------------------------------------
def test_f32_tensors_are_read_in_place(tmp_path, shakespeare):
    """An F32 tensor is a view of the mapped file, not a copy of it."""
    _, path = exported(CONFIGS["gqa-tied"], shakespeare, tmp_path, "f32")
    file = GGUFFile(path)
    mapped = np.frombuffer(file.buffer, np.uint8)
    assert np.shares_memory(file.tensor("token_embd.weight").numpy(), mapped)
    config2, state = read_gguf(path)[:2]
    emb = build_model(config2, state, "cpu").model.embed_tokens.weight
    assert emb.data_ptr() == state["model.embed_tokens.weight"].data_ptr()  # no copy
    before = emb[0, 0].item()
    emb.data[0, 0] += 1  # a private mapping: the file is never written
    assert GGUFFile(path).tensor("token_embd.weight")[0, 0].item() == before


def test_f16_tensors_read_as_float16_are_read_in_place(tmp_path, shakespeare):
    """Asked for float16, an F16 file's tensors are views of the mapping (q and k, whose
    rows are reordered, excepted) holding the values a float32 read holds."""
    _, path = exported(CONFIGS["gqa-tied"], shakespeare, tmp_path, "f16")
    half = read_gguf(path, dtype=torch.float16)[1]
    full = read_gguf(path)[1]
    for name, tensor in half.items():
        assert tensor.dtype == torch.float16, name
        assert torch.equal(tensor.float(), full[name]), name
    file = GGUFFile(path)
    mapped = np.frombuffer(file.buffer, np.uint8)
    assert np.shares_memory(
        file.tensor("token_embd.weight", torch.float16).numpy(), mapped
    )
    assert not np.shares_memory(file.tensor("token_embd.weight").numpy(), mapped)
    model, _ = load_pretrained(path, device="cpu", dtype=torch.float16)
    assert model.model.embed_tokens.weight.dtype == torch.float16
    assert full["model.embed_tokens.weight"].dtype == torch.float32


def test_the_tensor_types_smol_knows_match_the_gguf_package():
    """smol's own table of types (numbers and block sizes: it spares a load importing
    `gguf`) equals the package's."""
    from gguf.constants import GGML_QUANT_SIZES

    for qtype, sizes in BLOCK_SIZES.items():
        assert Q(int(qtype)).name == qtype.name
        assert GGML_QUANT_SIZES[Q(int(qtype))] == sizes
