"""03 grouped-query attention and 04 SwiGLU, every task against smol's on generated
inputs (`_differential`): one to five key/value heads shared by one to seven query
heads each, one token or many, head sizes from 1 to 16, keys and values in the
strided memory attention's view(B, T, H, D).transpose(1, 2) leaves them; float32,
bfloat16 and float16 (where a mask of -1e9 overflows), scores from moderate to
beyond exp's range; silu from -1e4 to 1e4 (float16's exp overflows from 11 on);
MLPs of other widths in float32 and bfloat16; values, dtypes and the gradients of
every input and weight compared."""

import torch
import torch.nn.functional as F

from smol.grading.checks import _differential as diff
from smol.grading.checks._util import small_config
from smol.grading.checks.norm_rope_differential import (
    DTYPES,
    HALF,
    NAME,
    relative_tol,
    strided,
    with_weights,
)

CASES = 40


def _layout(g) -> str:
    return diff.pick(g, ("contiguous", "strided"))


def _laid_out(x, layout: str):
    return strided(x) if layout == "strided" else x


# --- 03 grouped-query attention
def _repeat_case(g) -> dict:
    B, H_kv = int(torch.randint(1, 4, (), generator=g)), diff.pick(g, (1, 2, 3, 5))
    n_rep, T = diff.pick(g, (1, 1, 2, 3, 4, 7)), diff.pick(g, (1, 2, 6))
    D, dtype, layout = diff.pick(g, (1, 2, 5, 8)), diff.pick(g, DTYPES), _layout(g)
    x = torch.randn(B, H_kv, T, D, generator=g).to(dtype)
    step = torch.finfo(dtype).eps if dtype in HALF else 1e-6
    return {
        "what": f"x {(B, H_kv, T, D)} {diff.dtype_name(x)}, {layout}, n_rep={n_rep}",
        "args": {"x": x, "n_rep": n_rep, "layout": layout},
        "grad": ["x"],
        "up": [torch.randn(B, H_kv * n_rep, T, D, generator=g)],
        "tol": (0.0, 0.0),
        "gtol": (2 * n_rep * step, 2 * step),  # a sum of n_rep, in any order
        "dtype": True,
    }


def _call_repeat(fn, args):
    return [fn(_laid_out(args["x"], args["layout"]), args["n_rep"])]


def _smol_repeat():
    from smol.attention import repeat_kv

    return repeat_kv


SCORES = ("moderate", "large", "far below zero")


def _attention_case(g) -> dict:
    B, H_kv = int(torch.randint(1, 3, (), generator=g)), diff.pick(g, (1, 2, 3))
    n_rep, T = diff.pick(g, (1, 2, 3)), diff.pick(g, (1, 2, 5, 9))
    D, dtype, layout = diff.pick(g, (2, 5, 6, 16)), diff.pick(g, DTYPES), _layout(g)
    scores = diff.pick(g, SCORES) if dtype == torch.float32 else "moderate"
    q = torch.randn(B, H_kv * n_rep, T, D, generator=g)
    k, v = (torch.randn(B, H_kv, T, D, generator=g) for _ in range(2))
    if scores == "large":  # q . k / sqrt(D) up to about 1500: exp overflows
        q, k = 20 * q, 20 * k
    elif scores == "far below zero":  # every score about -2e4: exp underflows
        q, k = -100 * (1 + 0.1 * q), 100 * (1 + 0.1 * k)
    q, k, v = (t.to(dtype) for t in (q, k, v))
    wide = {torch.bfloat16: (3e-2, 3e-2), torch.float16: (4e-3, 4e-3)}
    return {
        "what": f"q {tuple(q.shape)}, k and v {tuple(k.shape)}, {diff.dtype_name(q)}, "
        f"{layout}, scores {scores}",
        "args": {"q": q, "k": k, "v": v, "layout": layout},
        "grad": ["q", "k", "v"],
        "up": [torch.randn(*q.shape, generator=g)],
        "tol": wide.get(dtype, (1e-5, 1e-5)),
        "gtol": wide.get(dtype, (1e-4, 1e-4)),
        "dtype": True,
    }


def _call_attention(fn, args):
    q, k, v = (_laid_out(args[n], args["layout"]) for n in "qkv")
    return [fn(q, k, v)]


def _smol_attention():
    return lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, is_causal=True, enable_gqa=True
    )


# --- 04 SwiGLU
def _silu_case(g) -> dict:
    shape, dtype = (int(torch.randint(1, 40, (), generator=g)),), diff.pick(g, DTYPES)
    span = diff.pick(g, (3.0, 20.0, 100.0, 1e4))
    x = torch.randn(*shape, generator=g) * span
    if dtype == torch.float16:
        x = x.clamp(-6e4, 6e4)
    x, up = x.to(dtype), torch.randn(*shape, generator=g)
    # sigmoid(x) rounded to x's dtype is a step of it off, times x: as right
    eps = torch.finfo(dtype).eps
    step = eps * float(x.float().abs().max())
    return {
        "what": f"x {shape} {diff.dtype_name(x)} of scale {span:g}",
        "args": {"x": x},
        "grad": ["x"],
        "up": [up],
        "tol": (step, 2 * eps),
        "gtol": (step * float(up.abs().max()), 4 * eps),
        "dtype": True,
    }


def _call_silu(fn, args):
    return [fn(args["x"])]


def _smol_silu():
    return F.silu


WEIGHTS = ("gate_proj.weight", "up_proj.weight", "down_proj.weight")


def _mlp_case(g) -> dict:
    C, Fw = diff.pick(g, (8, 16, 24, 40)), diff.pick(g, (12, 20, 33, 64))
    B, T = int(torch.randint(1, 4, (), generator=g)), diff.pick(g, (1, 2, 6))
    dtype = diff.pick(g, (torch.float32, torch.bfloat16))
    scale = diff.pick(g, (1.0, 10.0))
    shapes = ((Fw, C), (Fw, C), (C, Fw))
    weights = {
        n: (torch.randn(*s, generator=g) / s[1] ** 0.5).to(dtype)
        for n, s in zip(WEIGHTS, shapes)
    }
    x = (torch.randn(B, T, C, generator=g) * scale).to(dtype)
    case = {
        "what": f"hidden_size={C}, intermediate_size={Fw}, x {(B, T, C)} "
        f"{diff.dtype_name(x)} of scale {scale:g}",
        "args": {"x": x, "hidden_size": C, "intermediate_size": Fw} | weights,
        "grad": ["x", *WEIGHTS],
        "up": [torch.randn(B, T, C, generator=g)],
        "tol": (1e-5 * scale, 1e-5),
        "gtol": (1e-5 * scale, 1e-4),
        "dtype": True,
    }
    if dtype == torch.bfloat16:  # silu's rounding in the sums: 4% of the largest
        return relative_tol(case, _call_mlp, _smol_mlp, 4e-2)
    return case


def _call_mlp(cls, args):
    config = small_config(
        16, hidden_size=args["hidden_size"], intermediate_size=args["intermediate_size"]
    )
    weights = {n: args[n] for n in WEIGHTS}
    return [with_weights(cls(config), weights, args["x"])]


def _smol_mlp():
    from smol.mlp import MLP

    return MLP


for tasks, make, call, reference, hint in (
    (
        ("repeat_kv", "repeat_kv_bug"),
        _repeat_case,
        _call_repeat,
        _smol_repeat,
        "the case named below differs from smol.attention.repeat_kv in a value, the "
        "dtype or the gradient of x: each head repeated in place (k0 k0 k1 k1) for "
        "every n_rep, 1 included, in x's dtype, on keys of any memory layout "
        "(reshape, not view: attention's keys are a transposed view); each head's "
        "gradient sums those of its n_rep copies",
    ),
    (
        ("gqa_attention",),
        _attention_case,
        _call_attention,
        _smol_attention,
        "the case named below differs from causal SDPA with grouped heads in a "
        "value, the dtype or the gradient of q, k or v: mask the future with -inf "
        "(-1e9 overflows float16; any finite number is beaten by scores below it), "
        "softmax over the last dimension, any T (1 too), in q's dtype",
    ),
    (
        ("silu",),
        _silu_case,
        _call_silu,
        _smol_silu,
        "the case named below differs from F.silu in a value, the dtype or the "
        "gradient: x * torch.sigmoid(x) in x's dtype (exp(-x) overflows float16 "
        "from x = -11 on, bfloat16 and float32 from -89: a clamp that keeps float32 "
        "finite does not keep float16's)",
    ),
    (
        ("swiglu", "swiglu_bug"),
        _mlp_case,
        _call_mlp,
        _smol_mlp,
        "the case named below differs from smol.mlp.MLP in a value, the dtype or the "
        "gradient of x or a weight: down_proj(silu(gate_proj(x)) * up_proj(x)), "
        "sizes from the config, in the module's dtype (a float32 silu cast back "
        "before down_proj), the gradient through the gate too",
    ),
):
    diff.register(tasks, NAME, 1, hint, make, call, reference, CASES)
