"""Mutants of the grader's checks (precision), kept with tests/test_grading.py's:
MUTANTS (bug: (task, mutant, the one check it loses)) and WIDE_MUTANTS (bug: (task,
mutant, the set of checks it loses))."""

import math

import torch

from smol.attention import repeat_kv
from smol.norm import RMSNorm
from smol.rope import rotate_half
from tests.grading_mutants_later import tiled_attention_by


class ScaledInHalfPrecisionRMSNorm(RMSNorm):
    """The statistics in float32, but x * rsqrt(...) in x's dtype: rounded twice."""

    def forward(self, x):
        inv = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * (x * inv.to(x.dtype))


class WeightBeforeTheCastRMSNorm(RMSNorm):
    """Scaled by the weight in float32, then cast: a float32 weight and bfloat16 x give
    bfloat16, where HF's LlamaRMSNorm gives float32."""

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * h).to(x.dtype)


def rope_in_x_dtype(x, cos, sin):
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return x * cos + rotate_half(x) * sin


def _causal_scores(q, k):
    k = repeat_kv(k, q.shape[1] // k.shape[1])
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    T = q.shape[2]
    return scores, torch.ones(T, T, dtype=torch.bool).tril()


def gqa_softmax_without_the_max(q, k, v):
    scores, causal = _causal_scores(q, k)
    weights = scores.masked_fill(~causal, -math.inf).exp()
    v = repeat_kv(v, q.shape[1] // v.shape[1])
    return weights / weights.sum(-1, keepdim=True) @ v


def gqa_masked_with_minus_1e4(q, k, v):
    scores, causal = _causal_scores(q, k)
    v = repeat_kv(v, q.shape[1] // v.shape[1])
    return scores.masked_fill(~causal, -1e4).softmax(-1) @ v


def tiled_attention_in_bfloat16(q, k, v, block_size, is_causal=False):
    """Sums, maxima and blocks in q's dtype: no float32 upcast."""
    return tiled_attention_by(q, k, v, block_size, is_causal, dtype=q.dtype)


def merge_stats_into_l_a(m_a, l_a, m_b, l_b):
    m = torch.maximum(m_a, m_b)
    safe = torch.where(m == -math.inf, 0.0, m)
    l_a *= torch.exp(m_a - safe)
    l_a += l_b * torch.exp(m_b - safe)
    return m, l_a


HALF = "float16 activations"


def permute_qk_in_float32(w, n_heads):
    """The right rows, in float32 whatever w's dtype (a bfloat16 weight, uint8
    codes)."""
    out, fan_in = w.shape
    w = w.float().reshape(n_heads, 2, out // n_heads // 2, fan_in)
    return w.transpose(1, 2).reshape(out, fan_in)


MUTANTS: dict = {
    "RMSNorm's x * rsqrt(...) in half precision": (
        "rmsnorm",
        ScaledInHalfPrecisionRMSNorm,
        HALF,
    ),
    "RMSNorm's weight applied before the cast back": (
        "rmsnorm",
        WeightBeforeTheCastRMSNorm,
        HALF,
    ),
    "RMSNorm's weight applied before the cast back (bug hunt)": (
        "rmsnorm_bug",
        WeightBeforeTheCastRMSNorm,
        HALF,
    ),
    "RoPE computed in x's dtype": (
        "rope",
        rope_in_x_dtype,
        "shape, dtype and rounding",
    ),
    "RoPE computed in x's dtype (bug hunt)": (
        "rope_bug",
        rope_in_x_dtype,
        "shape, dtype and rounding",
    ),
    "softmax as exp / sum, without the row's max": (
        "gqa_attention",
        gqa_softmax_without_the_max,
        "large scores",
    ),
    "the future masked with -1e4, not -inf": (
        "gqa_attention",
        gqa_masked_with_minus_1e4,
        "large scores",
    ),
    "tiled attention summed in bfloat16": (
        "tiled_attention",
        tiled_attention_in_bfloat16,
        "bfloat16 q, k and v",
    ),
    "merge_stats writes into l_a": (
        "merge_stats",
        merge_stats_into_l_a,
        "m_a, l_a, m_b and l_b",
    ),
}
MUTANTS["permute_qk returning float32 for a bfloat16 weight"] = (
    "permute_qk",
    permute_qk_in_float32,
    "generated inputs",
)
WIDE_MUTANTS: dict = {}
