"""Features whose removal keeps the output: a KV cache that is refilled, a chat cache
emptied each turn, attention written out instead of SDPA's fused kernel, quantized
layers that keep a float weight, a GGUF file read instead of mapped, an accumulated
gradient not divided by the micro-batches. The same tokens, logits or losses come out
either way, so each test looks at the feature itself (the tokens a forward pass
receives, the kernels that run, the bytes a layer holds, the object a file is read
into, the gradient), and proves it does by catching the switch-off: the feature
removed, as a patch of smol's own source or a stand-in layer, kept here."""

import inspect
import mmap
import textwrap
import types

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import smol.attention
import smol.chat
import smol.generate
import smol.gguf
import smol.train
from smol.chat import ChatSession
from smol.int4 import Int4Linear
from smol.quantize import QuantLinear, _int8_kernel
from tests.test_int4 import tiny_layer
from tests.test_train import small_config, trainer
from tests.tiny_models import config, peaked, with_real_vocab


def switched_off(function, old: str, new: str):
    """`function` with `old` (one place in its source) replaced by `new`, compiled in
    its module: a feature removed by a patch that the test names."""
    source = textwrap.dedent(inspect.getsource(function))
    assert source.count(old) == 1, f"{old!r} is not once in {function.__qualname__}"
    namespace = {}
    exec(
        compile(source.replace(old, new), inspect.getfile(function), "exec"),
        function.__globals__,
        namespace,
    )
    return namespace[function.__name__]


class Ops(TorchDispatchMode):
    """The names of the operations dispatched inside the block."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.__name__.split(".")[0])
        return func(*args, **(kwargs or {}))


def widths_fed(model, run) -> list[int]:
    """The number of positions each forward pass of `model` receives during run()."""
    widths = []
    hook = model.model.embed_tokens.register_forward_pre_hook(
        lambda module, args: widths.append(args[0].shape[1])
    )
    try:
        run()
    finally:
        hook.remove()
    return widths


# KV cache: each decoding step feeds one new token


@pytest.fixture(scope="module")
def model():
    return peaked(config(97, 32, 64, 2, 4, 2, 64))


def check_decoding_feeds_one_token_a_step(model):
    ids = torch.randint(0, 97, (2, 7), generator=torch.Generator().manual_seed(0))
    widths = widths_fed(
        model, lambda: smol.generate.generate(model, ids, 6, temperature=0)
    )
    assert widths == [7, 1, 1, 1, 1, 1], widths


REFILL = (
    "step_ids = next_token[:, None] if cache is not None else tokens",
    "step_ids = tokens\n        if cache is not None:\n            cache.length = 0",
)


def test_decoding_feeds_the_cache_one_token_a_step(model, monkeypatch):
    check_decoding_feeds_one_token_a_step(model)
    expected = smol.generate.generate(
        model, torch.tensor([[3, 4, 5]]), 6, temperature=0
    )
    # the switch-off: the cache emptied and refilled with the whole sequence each step
    monkeypatch.setattr(
        smol.generate, "_decode", switched_off(smol.generate._decode, *REFILL)
    )
    refilled = smol.generate.generate(
        model, torch.tensor([[3, 4, 5]]), 6, temperature=0
    )
    assert torch.equal(refilled, expected)  # the same tokens: only the check sees it
    with pytest.raises(AssertionError):
        check_decoding_feeds_one_token_a_step(model)


# Chat: the next turn reads only what the cache does not hold


def check_a_turn_feeds_only_the_new_tokens(model, tokenizer):
    session = ChatSession(model, tokenizer, system="Be brief.")
    session.send("What is the capital of France?", 8, temperature=0)
    widths = widths_fed(model, lambda: session.send("And of Italy?", 8, temperature=0))
    conversation = tokenizer.encode(
        tokenizer.apply_chat_template(session.messages[:-1], add_generation_prompt=True)
    )
    assert widths[0] == session.fed < len(conversation) // 2, (widths[0], session.fed)


def test_a_chat_turn_reads_only_what_its_cache_lacks(real_model, monkeypatch):
    model, tokenizer = peaked(with_real_vocab(256)), real_model[1]
    check_a_turn_feeds_only_the_new_tokens(model, tokenizer)
    # the switch-off: the cache emptied each turn while `fed` still counts the reuse
    send = switched_off(ChatSession.send, "cache.length = shared", "cache.length = 0")
    monkeypatch.setattr(ChatSession, "send", send)
    with pytest.raises(AssertionError):
        check_a_turn_feeds_only_the_new_tokens(model, tokenizer)


# Attention: SDPA's fused kernel, never the scores written out


def written_out(q, k, v, attn_mask=None, is_causal=False, enable_gqa=False, **kw):
    """SDPA's result by hand: the (B, H, Tq, Tk) scores and their softmax."""
    if enable_gqa:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    if is_causal:
        causal = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    return scores.softmax(-1) @ v


FUSED = "_scaled_dot_product_flash_attention_for_cpu"


def check_attention_runs_the_fused_kernel(model):
    """A padded prompt (the masked path) and a training step (forward and backward):
    one fused kernel a layer each way, no softmax anywhere."""
    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[0, :3] = 0
    layers = model.config.num_hidden_layers
    with torch.no_grad(), Ops() as prompt:
        model(ids, attention_mask=mask)
    with Ops() as step:
        model(ids, targets=ids)[1].backward()
    for ops in (prompt.names, step.names):
        assert ops.count(FUSED) == layers, sorted(set(ops))
        # (the loss's log-softmax is not attention's)
        assert not {"_softmax", "_safe_softmax"} & set(ops), sorted(set(ops))
    assert step.names.count(FUSED + "_backward") == layers


def test_prompt_and_training_attention_run_sdpas_fused_kernel(model, monkeypatch):
    model = peaked(model.config)
    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(1))
    expected = model(ids)[0]
    check_attention_runs_the_fused_kernel(model)
    # the switch-off: SDPA replaced by the same arithmetic written out
    monkeypatch.setattr(F, "scaled_dot_product_attention", written_out)
    torch.testing.assert_close(model(ids)[0], expected, atol=1e-5, rtol=1e-5)
    with pytest.raises(AssertionError):
        check_attention_runs_the_fused_kernel(model)


# Quantized layers: the weight stays quantized, the kernel multiplies it


def held_bytes(module) -> int:
    """Bytes of every tensor a module keeps: parameters, buffers and plain attributes,
    each storage once."""
    storages = {}
    for m in module.modules():
        tensors = [*m._parameters.values(), *m._buffers.values()]
        tensors += [v for v in vars(m).values() if isinstance(v, torch.Tensor)]
        for t in tensors:
            if t is not None:
                storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(storages.values())


def check_int8_layer(layer, x):
    out, fan_in = layer.out_features, layer.in_features
    # int8 codes and one scale a row (in the layer's dtype, float32 here)
    assert held_bytes(layer) <= out * fan_in + 4 * out, held_bytes(layer)
    with torch.no_grad(), Ops() as ops:
        layer(x)
    assert "_weight_int8pack_mm" in ops.names and "mm" not in ops.names, ops.names


class DenseInt8(QuantLinear):
    """The switch-off: a QuantLinear that keeps its weight dequantized to float32 and
    multiplies by it (the same output, four times the memory)."""

    def forward(self, x):
        if not hasattr(self, "dense"):
            self.dense = self.dequantize()
        return F.linear(x, self.dense.to(x.dtype))


def test_the_int8_layer_holds_int8_codes_and_runs_the_int8_kernel():
    torch.manual_seed(0)
    layer = QuantLinear.from_linear(torch.nn.Linear(64, 48, bias=False))
    x = torch.randn(5, 64, dtype=torch.bfloat16)
    assert _int8_kernel(x, layer.weight)  # the path the kernel serves
    check_int8_layer(layer, x)
    dense = DenseInt8(layer.weight, layer.scale)
    torch.testing.assert_close(dense(x), layer(x), atol=0.05, rtol=0.02)
    with pytest.raises(AssertionError):
        check_int8_layer(dense, x)


def check_int4_layer(layer, x):
    out, fan_in = layer.out_features, layer.in_features
    # two codes a byte, and a bfloat16 scale and zero for every 32 weights
    assert held_bytes(layer) <= out * fan_in // 2 + out * (fan_in // 32) * 4
    with torch.no_grad(), Ops() as ops:
        layer(x)
    assert "_weight_int4pack_mm_for_cpu" in ops.names, ops.names
    assert "mm" not in ops.names and "addmm" not in ops.names, ops.names


class DenseInt4(Int4Linear):
    """The switch-off: an Int4Linear that multiplies a kept float32 weight."""

    def forward(self, x):
        if not hasattr(self, "dense"):
            self.dense = self.dequantize()
        return F.linear(x.float(), self.dense).to(x.dtype)


def test_the_int4_layer_holds_packed_codes_and_runs_the_int4_kernel():
    layer, codes, d, m = tiny_layer()
    x = torch.randn(3, layer.in_features, dtype=torch.bfloat16)
    check_int4_layer(layer, x)
    dense = DenseInt4(codes, d, m)
    torch.testing.assert_close(dense(x), layer(x), atol=0.05, rtol=0.02)
    with pytest.raises(AssertionError):
        check_int4_layer(dense, x)


# The GGUF file: mapped, not read


def check_gguf_is_mapped(path):
    file = smol.gguf.GGUFFile(path)
    assert isinstance(file.buffer, mmap.mmap), type(file.buffer)


def read_whole(fileno, length, access=None):
    """The switch-off of mmap.mmap: the whole file read into memory."""
    with open(fileno, "rb", closefd=False) as f:
        f.seek(0)
        return bytearray(f.read())


def test_the_gguf_file_is_memory_mapped(real_model, monkeypatch):
    path = smol.gguf.bundled_gguf_path()
    check_gguf_is_mapped(path)
    shown = smol.gguf.GGUFFile(path).metadata
    monkeypatch.setattr(
        smol.gguf, "mmap", types.SimpleNamespace(mmap=read_whole, ACCESS_COPY=None)
    )
    assert smol.gguf.GGUFFile(path).metadata == shown  # the same file, read
    with pytest.raises(AssertionError):
        check_gguf_is_mapped(path)


# Gradient accumulation: the micro-batches' gradients add up to the big batch's


CLIP = torch.nn.utils.clip_grad_norm_


def gradient_norms(t, monkeypatch) -> list[float]:
    """The gradient norm of each step, before clipping."""
    norms = []

    def recording(parameters, max_norm, *args, **kw):
        norm = CLIP(parameters, max_norm, *args, **kw)
        norms.append(float(norm))
        return norm

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", recording)
    t.fit()
    return norms


def check_accumulation_adds_up(tmp_path, monkeypatch):
    settings = dict(eval_every=0, steps=3, grad_clip=1.0)
    big = trainer(small_config(tmp_path / "big", batch_size=4, **settings))
    acc = trainer(
        small_config(tmp_path / "acc", batch_size=2, grad_accum=2, **settings)
    )
    assert gradient_norms(acc, monkeypatch) == pytest.approx(
        gradient_norms(big, monkeypatch), rel=1e-4
    )
    assert acc.history["loss"] == pytest.approx(big.history["loss"], rel=1e-5)


def test_accumulated_gradients_equal_one_big_batchs(tmp_path, monkeypatch):
    check_accumulation_adds_up(tmp_path / "on", monkeypatch)
    # the switch-off: backward on the undivided loss; the reported loss stays the mean
    step = switched_off(
        smol.train.Trainer.train_step,
        "self.scaler.scale(loss).backward()",
        "self.scaler.scale(loss * self.cfg.grad_accum).backward()",
    )
    monkeypatch.setattr(smol.train.Trainer, "train_step", step)
    with pytest.raises(AssertionError):
        check_accumulation_adds_up(tmp_path / "off", monkeypatch)
