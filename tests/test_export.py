"""GGUF export (smol.export), proven by readers smol did not write: the `gguf` package,
transformers and llama.cpp (llama-cpp-python, optional: `make llama-cpp`)."""

import importlib.util
import sys

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
from tests.llama_cpp_run import run_llama_cpp
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
# llama.cpp's kernels round differently from smol's float32 products, and differently
# on each CPU kind (AVX2, AVX-512, AMX, NEON), so its greedy tokens may part from smol's
# at a near tie of a random tiny model. What the arithmetic fixes, and these tests
# assert: every logit of a sequence (the prompt, then smol's greedy tokens, fed to both:
# one near tie cannot derail the rest) lies within BOUNDS[type] of smol's on the weights
# the file holds, and so wherever smol's top two logits are more than twice the bound
# apart, llama.cpp's top token is smol's. Measured on an AVX-512 AMD EPYC with
# llama-cpp-python 0.3.36, the largest difference over every logit of the 24 positions
# of PROMPT and smol's 12 tokens (gqa-tied, mha-untied):
# - F32, with an F32 KV cache: llama.cpp rounds nothing that smol does not, only the
#   order of float32 sums differs (about 1e-6 of logits up to 15): 2.0e-5, 7.9e-5.
#   Bound 5e-4, which an exporter writing the RMSNorm epsilon 1e-6 for 1e-5 exceeds
#   (1.8e-3, 2.6e-3).
# - F16: llama.cpp rounds the activations of every product, and its KV cache, to
#   float16 (unit roundoff 2^-11): 0.064, 0.057. Bound 0.15.
# - Q8_0: it rounds the activations to 8-bit blocks, half a step of max|x| / 127, about
#   8 times float16's rounding: 0.47, 0.41. Bound 8 x 0.15 = 1.2.
# Another CPU sums in another order (the F32 row: 1e-4) but rounds to float16 and 8
# bits the same way (IEEE's and ggml's rules), so the bounds hold there with room.
# Broken exporters land far outside them: q/k rows not permuted 16.1 and 22.6 (all
# types), the RoPE base written wrong 13.7 and 16.1.
BOUNDS = {"f32": 5e-4, "f16": 0.15, "q8_0": 1.2}
# positions (of 24) that must be far enough from a tie to be compared: measured 23 and
# 24 for F32, 14 and 17 for F16, 1 and 1 for Q8_0 (there the logit bound carries it)
AT_LEAST = {"f32": 20, "f16": 8, "q8_0": 1}


def agree_beyond_ties(ours, theirs, bound, at_least):
    """ours, theirs (T, V): logits of the same tokens. Every logit within `bound` of
    smol's; wherever smol's top two logits are more than 2 * bound apart (no rounding
    within the bound can swap them), llama.cpp's top token is smol's, at `at_least`
    positions or more (never vacuous). Returns the mask of positions compared."""
    ours, theirs = ours.float(), torch.as_tensor(theirs).float()
    assert ours.shape == theirs.shape
    diff = (ours - theirs).abs().max().item()
    assert diff < bound, (
        f"llama.cpp's logits are {diff:.4g} from smol's (bound {bound})"
    )
    top = ours.topk(2, dim=-1).values
    sure = top[:, 0] - top[:, 1] > 2 * bound
    assert sure.sum().item() >= at_least, (sure.sum().item(), at_least)
    parted = (theirs.argmax(-1) != ours.argmax(-1)) & sure
    assert not parted.any(), f"top tokens part at positions {parted.nonzero()[:, 0]}"
    return sure


def first_tie(sure, n_prompt):
    """How many of the new tokens precede the first step (from the prompt's last
    position on) that is too near a tie to be compared."""
    steps = sure[n_prompt - 1 : -1].tolist()  # the positions that predict them
    return steps.index(False) if False in steps else len(steps)


def logits(model, tokens):
    with torch.no_grad():
        return model(torch.tensor([tokens]))[0][0]


@needs_llama_cpp
@pytest.mark.parametrize("type", sorted(TYPES))
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_llama_cpp_computes_what_smol_computes(tmp_path, shakespeare, name, type):
    """llama.cpp reads the file's tokenizer, config and weights as smol holds them: its
    tokens for PROMPT, its logits within BOUNDS[type], its top tokens wherever no
    rounding within the bound can swap them, and its own greedy decoding up to the
    first near tie. Rejected: q/k rows not permuted, a wrong RoPE base, and for F32 a
    wrong RMSNorm epsilon (see BOUNDS)."""
    model, path = exported(CONFIGS[name], shakespeare, tmp_path, type)
    ours = model if type == "f32" else stored(model, type)
    ids = shakespeare.encode(PROMPT)
    want = greedy(ours, ids)
    got = run_llama_cpp(
        path, ids + want, text=PROMPT, greedy=12, kv_f32=type == "f32", prompt=ids
    )
    assert got["tokens"] == ids
    sure = agree_beyond_ties(
        logits(ours, ids + want), got["logits"], BOUNDS[type], AT_LEAST[type]
    )
    n = first_tie(sure, len(ids))
    assert got["greedy"][:n] == want[:n]


def test_a_crash_in_llama_cpp_fails_one_test_naming_it(tmp_path):
    """A child that dies of a segmentation fault (as llama-cpp-python 0.3.36 did reading
    the bundled Q4_1 file in batches on a Sapphire Rapids, AVX-512 and AMX) fails the
    test that ran it, with the signal, the file and the settings, and the run goes on;
    a child that fails otherwise says so too."""
    segfault = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), 11)"]
    with pytest.raises(pytest.fail.Exception) as failed:
        run_llama_cpp(tmp_path / "m.gguf", [1, 2], n_batch=8, child=segfault)
    assert "llama.cpp crashed (SIGSEGV) reading m.gguf with n_batch=8" in str(
        failed.value
    )
    fails = [sys.executable, "-c", "import sys; sys.exit('no such file')"]
    with pytest.raises(pytest.fail.Exception, match="failed .status 1. on m.gguf"):
        run_llama_cpp(tmp_path / "m.gguf", [1, 2], child=fails)


ANSWERS_THEN_CRASHES = """
import json, os, sys
for n, line in enumerate(sys.stdin):
    if n == 2:
        os.kill(os.getpid(), 11)
    print(json.dumps(list(range(100, 100 + json.loads(line)["k"]))), flush=True)
"""


def test_the_benchmarks_llama_cpp_child_reports_a_crash_by_its_signal(monkeypatch):
    """bench/llama_child.py: the benchmarks' llama.cpp runs in a child process that
    answers each request with its tokens; a child that dies (as llama-cpp-python
    0.3.36 did on a Sapphire Rapids) raises LlamaCppCrashed naming the signal, at
    once when it dies reading the prompt, not the benchmark's process."""
    import importlib.util

    from bench import llama_child

    installed = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: object() if name == "llama_cpp" else installed(name, *a),
    )
    monkeypatch.setattr(llama_child, "CHILD", ANSWERS_THEN_CRASHES)
    run = llama_child.llama_cpp("m.gguf", torch.tensor([[5, 6]]), 1)  # request 1
    assert run(3).tolist() == [[5, 6, 100, 101, 102]]  # request 2
    with pytest.raises(llama_child.LlamaCppCrashed, match=r"\(SIGSEGV\) on m.gguf"):
        run(3)
    at_once = "import os; os.kill(os.getpid(), 11)"
    monkeypatch.setattr(llama_child, "CHILD", at_once)
    with pytest.raises(llama_child.LlamaCppCrashed, match="SIGSEGV"):
        llama_child.llama_cpp("m.gguf", torch.tensor([[5, 6]]), 1)


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


# SmolLM2-135M-Instruct on the chat prompt and smol's 8 tokens ("The capital of France
# is Paris.<|im_end|>", 45 positions, logits up to 38), llama.cpp against smol on the
# bundled file's weights, measured as above:
# - our F16 export: float16 activations and KV cache, and the weights rounded to float16
#   on export: 0.089 (n_batch 512), 0.070 (n_batch 1). Bound 0.3; 30 or more of the 45
#   positions are compared (measured 34).
# - the Q4_1 file itself: llama.cpp rounds the activations to Q8_1 blocks (8 bits, as
#   Q8_0 above, and more where a block holds an outlier): 1.77. Bound 4; the 4
#   positions further than 8 from a tie are compared. smol reading the file without
#   undoing llama.cpp's q/k order lands at 37.5. Read one token at a time (n_batch=1):
#   on a 2-core Sapphire Rapids (AVX-512, AMX) llama-cpp-python 0.3.36 crashed with
#   SIGSEGV reading this file's prompt in batches.
RELEASED = {"f16": (0.3, 30), "q4_1": (4.0, 4)}


@needs_llama_cpp
@pytest.mark.parametrize("type", sorted(RELEASED))
def test_released_weights_round_trip_in_llama_cpp(released_f16, real_model, type):
    """llama.cpp runs the exported F16 file, and the Q4_1 file it came from, as smol
    runs the original weights: logits within RELEASED[type]'s bound, the same top
    token wherever no rounding within it can swap them. (Greedy text is not compared:
    this prompt's first token is a near tie, 0.08 apart, that llama.cpp's Q4_1 products
    break the other way on an AVX-512 CPU.)"""
    model, tokenizer = real_model
    ids = tokenizer.apply_chat_template(CHAT, tokenize=True)
    want = greedy(model, ids, 10, tokenizer.eos_token_id)
    assert "Paris" in tokenizer.decode(want)
    path, n_batch = (released_f16, 512) if type == "f16" else (bundled_gguf_path(), 1)
    got = run_llama_cpp(path, ids + want, n_batch=n_batch)
    agree_beyond_ties(logits(model, ids + want), got["logits"], *RELEASED[type])


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
        (["smollm2", out, "--name", "caf\udce9"], "--name is not UTF-8 text"),
        (["", out], "the model is empty"),
        ([str(tmp_path / "nowhere"), out], "no such model: "),
        ([str(tmp_path / "m.gguf")] * 2, "is the model being exported"),
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0], (argv, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.gguf", "m.gguf"]
    assert (tmp_path / "m.gguf").read_bytes() == b"GGUF"


def test_a_folder_out_cannot_be_written_in_is_a_usage_error(
    tmp_path, capsys, monkeypatch
):
    """Found before the model is read and converted, not when its file is written."""

    def denied(*args, **kwargs):  # a folder read-only to this user
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(type(tmp_path), "write_bytes", denied)
    assert main(["smollm2", str(tmp_path / "o.gguf")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    says = f"cannot write to the folder of OUT {tmp_path}: Permission denied"
    assert err == [f"smol export: error: {says}"]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("inherited", ["handled", "ignored"])
@pytest.mark.parametrize("stop", ["SIGINT", "SIGTERM"])
def test_an_interrupted_export_leaves_no_file_under_the_final_name(
    tmp_path, shakespeare, capsys, monkeypatch, stop, inherited
):
    """Ctrl-C or SIGTERM halfway through the tensors: the file being replaced is as it
    was, a new one is not there, no temporary file is left, and the one line says so
    (status 130 or 143). So too where the process found the signal ignored, as one
    started in the background of a script finds SIGINT (Python then sets no handler
    of its own; the command sets its own), and the command leaves it as it found it."""
    import os
    import signal

    import smol.export

    signum = getattr(signal, stop)
    save_pretrained(peaked(CONFIGS["gqa-tied"]), shakespeare, tmp_path / "model")
    infos = []
    pack = smol.export.pack_tensor_info

    def signalled(*args, **kwargs):  # the header is on disk by now
        infos.append(args[0])
        if len(infos) == 3:
            os.kill(os.getpid(), signum)
        return pack(*args, **kwargs)

    monkeypatch.setattr(smol.export, "pack_tensor_info", signalled)
    earlier = tmp_path / "earlier.gguf"
    earlier.write_bytes(b"an earlier export")
    found = signal.getsignal(signum)
    if inherited == "ignored":
        signal.signal(signum, signal.SIG_IGN)
    try:
        for out, extra, kept in (
            (earlier, ["--overwrite"], " (the earlier"),
            ("new", [], ""),
        ):
            path = tmp_path / "new.gguf" if out == "new" else out
            infos.clear()
            status = main([str(tmp_path / "model"), str(path), *extra])
            assert status == 128 + signum
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and f"{path} was not written{kept}" in err[0], err
            ignored = inherited == "ignored"
            assert signal.getsignal(signum) == (signal.SIG_IGN if ignored else found)
    finally:
        signal.signal(signum, found)
    assert earlier.read_bytes() == b"an earlier export"
    assert not (tmp_path / "new.gguf").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["earlier.gguf", "model"]


def test_a_gguf_lacking_a_weight_is_named_as_the_problem(tmp_path, capsys):
    """A GGUF whose tensor of layer 0 is named as layer 1's (damaged, or written by a
    broken tool): the one line names the file as not a valid GGUF, not LoRA."""
    data = bundled_gguf_path().read_bytes()
    name = b"blk.0.attn_q.weight"
    at = data.index(name)
    damaged = tmp_path / "damaged.gguf"
    damaged.write_bytes(data[:at] + b"blk.1.attn_q.weight" + data[at + len(name) :])
    assert main([str(damaged), str(tmp_path / "o.gguf")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "LoRA" not in err[0], err
    assert err[0].startswith(f"smol export: error: {damaged} is not a valid GGUF: ")
    assert "missing ['model.layers.0.self_attn.q_proj.weight']" in err[0]
    assert not (tmp_path / "o.gguf").exists()


def test_the_released_name_and_a_folder_of_that_name_are_refused_together(
    tmp_path, capsys, monkeypatch
):
    """`smol export smollm2 OUT` where ./smollm2 exists: which one is meant? A usage
    error that says how to name the folder; ./smollm2 names it."""
    (tmp_path / "smollm2").mkdir()
    monkeypatch.chdir(tmp_path)
    assert main(["smollm2", "o.gguf"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "smol export: error: 'smollm2' names the released model, and a file or "
        "folder here too: write ./smollm2 for yours, or run elsewhere for the "
        "released one"
    ]
    assert main(["./smollm2", "o.gguf"]) == 1  # the folder, which holds no model
    assert "smollm2" in capsys.readouterr().err
    assert not (tmp_path / "o.gguf").exists()


def test_refusals(shakespeare):
    cfg = CONFIGS["gqa-tied"]
    model = peaked(cfg)
    lora = dict(
        model.state_dict(), **{"model.layers.0.self_attn.q_proj.lora_A": torch.ones(1)}
    )
    with pytest.raises(ValueError, match="merge LoRA adapters first"):
        gguf_tensors(cfg, lora, Q.F16)
    lacking = dict(model.state_dict())
    del lacking["model.layers.0.self_attn.q_proj.weight"]
    with pytest.raises(ValueError, match=r"model: unexpected .*, missing") as e:
        gguf_tensors(cfg, lacking, Q.F16)  # not blamed on LoRA: none is there
    assert "LoRA" not in str(e.value)
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
