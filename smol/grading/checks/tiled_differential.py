"""11 Attention by tiles, every task against smol's reference on generated inputs
(`_differential`). merge_stats: statistics of one to three axes, blocks hidden
(m = -inf, l = 0) now and then, on one side, the other or both, row by row, equal
maxima, scores near +-1000; m and l compared (no gradient is asked of it).
tiled_attention: one query to twenty, keys not a
multiple of the block (blocks of one, of more than Tk), Tq != Tk, causal or not,
float32, bfloat16 and float16, scores up to about 1000; the output, its dtype and
the gradients of q, k and v compared with F.scaled_dot_product_attention's on the
float32 inputs."""

import math

import torch
import torch.nn.functional as F

from smol.grading.checks import _differential as diff
from smol.grading.checks.tiled import BOTH, STATS

NAME = "generated inputs: values, dtypes and gradients equal smol's"
VALUES = "generated inputs: values equal smol's"
CASES = 40
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _stats_case(g) -> dict:
    shape = tuple(
        int(s)
        for s in torch.randint(1, 5, (int(diff.pick(g, (1, 2, 3))),), generator=g)
    )
    spread, centre = diff.pick(g, ((3.0, 0.0), (3.0, 1000.0), (30.0, -1000.0)))
    args = {}
    for side in ("a", "b"):
        m = torch.randn(shape, generator=g) * spread + centre
        l = 1 + 9 * torch.rand(shape, generator=g)  # a sum of exp(x - m) is >= 1
        hidden = torch.rand(shape, generator=g) < 0.3
        args[f"m_{side}"] = m.masked_fill(hidden, -math.inf)
        args[f"l_{side}"] = l.masked_fill(hidden, 0.0)
    tie = torch.rand(shape, generator=g) < 0.2  # the same maximum in both blocks
    args["m_b"] = torch.where(tie, args["m_a"], args["m_b"])
    hidden_a, hidden_b = torch.isinf(args["m_a"]), torch.isinf(args["m_b"])
    both = hidden_a & hidden_b
    return {
        "what": f"statistics {shape}, maxima near {centre:g} (spread {spread:g}), "
        f"{int(hidden_a.sum())} and {int(hidden_b.sum())} hidden (both: "
        f"{int(both.sum())}), {int(tie.sum())} equal maxima",
        "args": args,
        "grad": [],  # no gradient is asked of merge_stats
        "up": [None, None],
        # near +-1000 float32 holds m to 6e-5: a sum kept as a log beside it is
        # that close (the targeted check's tolerance)
        "tol": (1e-5, 5e-4 if centre else 1e-5),
        "regions": {"hidden in both blocks": both},
    }


def _call_stats(fn, args):
    return list(fn(*(args[k] for k in STATS)))


def _smol_stats():
    def merge_stats(m_a, l_a, m_b, l_b):
        m = torch.maximum(m_a, m_b)
        safe = torch.where(m == -math.inf, 0.0, m)  # -inf - (-inf) would be NaN
        return m, l_a * torch.exp(m_a - safe) + l_b * torch.exp(m_b - safe)

    return merge_stats


def _attention_case(g) -> dict:
    B, H = diff.pick(g, (1, 2)), diff.pick(g, (1, 3))
    Tq, Tk = (diff.pick(g, (1, 2, 5, 7, 16, 20)) for _ in range(2))
    D, block = diff.pick(g, (4, 8)), diff.pick(g, (1, 3, 4, 8, 32))
    causal, dtype = bool(torch.randint(2, (), generator=g)), diff.pick(g, DTYPES)
    scale = diff.pick(g, (1.0, 1.0, 20.0))  # 20: scores up to about 1000
    q = torch.randn(B, H, Tq, D, generator=g) * scale
    k = torch.randn(B, H, Tk, D, generator=g) * scale
    v = torch.randn(B, H, Tk, D, generator=g)
    wide = dtype != torch.float32
    return {
        "what": f"q (B={B}, H={H}, Tq={Tq}, D={D}), Tk={Tk}, block_size={block}, "
        f"is_causal={causal}, {diff.dtype_name(q.to(dtype))}, scale {scale:g}",
        "args": {"q": q.to(dtype), "k": k.to(dtype), "v": v.to(dtype)}
        | {"block": block, "causal": causal},
        "grad": ["q", "k", "v"],
        "up": [torch.randn(B, H, Tq, D, generator=g)],
        "tol": (2e-2, 2e-2) if wide else (1e-5, 1e-4),
        "gtol": (5e-2, 5e-2) if wide else (1e-4, 1e-3),
        "dtype": True,
    }


def _call_attention(fn, args):
    qkv = (args[k] for k in ("q", "k", "v"))
    return [fn(*qkv, args["block"], args["causal"])]


def _smol_attention():
    def attention(q, k, v, block, causal):
        qkv = (t.float() for t in (q, k, v))
        return F.scaled_dot_product_attention(*qkv, is_causal=causal).to(q.dtype)

    return attention


diff.register(
    "merge_stats",
    VALUES,
    1,
    "the case named below differs from smol's merge: row by row, a block with "
    "nothing visible (m = -inf, l = 0) changes nothing and two give (-inf, 0): "
    "decide with torch.where per element, not with one test of the whole tensor",
    _stats_case,
    _call_stats,
    _smol_stats,
    CASES,
)
diff.register(
    BOTH,
    NAME,
    1,
    "the case named below differs from F.scaled_dot_product_attention on the "
    "float32 inputs: every block, the last one shorter; the causal mask aligned "
    "to the top left; m, l and the sum in float32, returned in q's dtype",
    _attention_case,
    _call_attention,
    _smol_attention,
    CASES,
)
