"""Mutants of the grader's checks (exercises 1 to 6), kept with tests/test_grading.py's:
MUTANTS (bug: (task, mutant, the one check it loses)): each passes every targeted
check and only the differential check ("generated inputs") catches it. CAUGHT (bug:
(task, mutant)): one bug per task that the differential check catches too,
whatever else catches it (tests/test_grading_core_differential.py)."""

import math

import torch
import torch.nn.functional as F

from smol.attention import repeat_kv
from smol.mlp import MLP
from smol.model import DecoderLayer
from smol.norm import RMSNorm
from smol.rope import rotate_half

GENERATED = "generated inputs"


# --- 01 RMSNorm
def rms_clamped_at_eps(x, eps):
    return x.pow(2).mean(-1, keepdim=True).clamp(min=eps).sqrt()


class WeightBeforeTheCastRMSNorm(RMSNorm):
    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * h).to(x.dtype)


# --- 02 RoPE
def frequencies_of_i_not_2i(head_dim, theta):
    return 1.0 / theta ** (torch.arange(head_dim // 2, dtype=torch.float32) / head_dim)


def tables_of_bfloat16_positions(length, head_dim, theta):
    """Positions made in the model's dtype: bfloat16 holds integers exactly only up
    to 256."""
    freq = 1.0 / theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
    positions = torch.arange(length, dtype=torch.bfloat16).float()
    angles = torch.outer(positions, freq)
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half_by_rows(x):
    """Flattened to rows with view: a transposed x (attention's queries) has no such
    view."""
    rows = x.view(-1, x.shape[-1])
    x1, x2 = rows.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1).view(x.shape)


def rope_with_tables_sliced_to_t(x, cos, sin):
    """cos[:T]: right for (T, D) tables, but gathered (B, 1, T, D) ones lose every
    row past T (a batch of B > T, one decoding step)."""
    T = x.shape[-2]
    return (x * cos[:T] + rotate_half(x) * sin[:T]).to(x.dtype)


# --- 03 grouped-query attention
def repeat_kv_by_flat_heads(x, n_rep):
    """Each head flattened with view: keys transposed from (B, T, H, D) have no such
    view."""
    B, H_kv, T, D = x.shape
    flat = x.view(B, H_kv, 1, T * D).expand(B, H_kv, n_rep, T * D)
    return flat.reshape(B, H_kv * n_rep, T, D)


def gqa_masked_with_minus_1e9(q, k, v):
    """-1e9 beats every score and is finite in float32 and bfloat16; float16 cannot
    hold it."""
    n_rep = q.shape[1] // k.shape[1]
    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    T = q.shape[2]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    return scores.masked_fill(~causal, -1e9).softmax(-1) @ v


# --- 04 SwiGLU
def silu_clamped_for_float32(x):
    """exp(-x) kept below float32's overflow (exp(80)); float16's overflows from 11
    on, and the gradient is inf / inf."""
    return x / (1 + torch.exp(-x.clamp(min=-80)))


class MLPWithFloat32Silu(MLP):
    """silu in float32 for accuracy, not cast back: a bfloat16 down_proj refuses
    float32."""

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x).float()) * self.up_proj(x))


class MLPWithDetachedGate(MLP):
    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)).detach() * self.up_proj(x))


# --- 06 the assembled model
def count_params_with_full_width_keys(config):
    """k_proj and v_proj counted C x C, as in multi-head attention."""
    V, C, F_ = config.vocab_size, config.hidden_size, config.intermediate_size
    per_layer = 4 * C * C + 3 * C * F_ + 2 * C
    head = 0 if config.tie_word_embeddings else V * C
    return V * C + config.num_hidden_layers * per_layer + C + head


def forward_logits_in_float32(model, input_ids):
    """The logits upcast for the loss, as Hugging Face's LlamaForCausalLM once did:
    smol's model returns them in its own dtype."""
    T = input_ids.shape[1]
    cos, sin = model.model.rotary_emb(T, input_ids.device)
    x = model.model.embed_tokens(input_ids)
    for layer in model.model.layers:
        x = layer(x, cos, sin)
    return model.lm_head(model.model.norm(x)).float()


class DecoderLayerOfDefaultEps(DecoderLayer):
    """RMSNorm(config.hidden_size): eps 1e-5, SmolLM2's, whatever the config says
    (other Llamas have 1e-6)."""

    def __init__(self, config, layer_idx=0):
        super().__init__(config, layer_idx)
        self.input_layernorm = RMSNorm(config.hidden_size)
        self.post_attention_layernorm = RMSNorm(config.hidden_size)


class DecoderLayerWithSwappedNorms(DecoderLayer):
    def forward(self, x, cos, sin, mask=None, is_causal=True, kv_cache=None):
        h = self.post_attention_layernorm(x)
        x = x + self.self_attn(h, cos, sin, mask, is_causal, kv_cache)
        return x + self.mlp(self.input_layernorm(x))


MUTANTS: dict = {
    "rope_tables of bfloat16 positions": (
        "rope_tables",
        tables_of_bfloat16_positions,
        GENERATED,
    ),
    "rotate_half by view(-1, D)": ("rotate_half", rotate_half_by_rows, GENERATED),
    "rope with the tables sliced to T": (
        "rope",
        rope_with_tables_sliced_to_t,
        GENERATED,
    ),
    "rope with the tables sliced to T (bug hunt)": (
        "rope_bug",
        rope_with_tables_sliced_to_t,
        GENERATED,
    ),
    "repeat_kv by a view of each head": (
        "repeat_kv",
        repeat_kv_by_flat_heads,
        GENERATED,
    ),
    "repeat_kv by a view of each head (bug hunt)": (
        "repeat_kv_bug",
        repeat_kv_by_flat_heads,
        GENERATED,
    ),
    "the future masked with -1e9": (
        "gqa_attention",
        gqa_masked_with_minus_1e9,
        GENERATED,
    ),
    "silu with exp clamped for float32": ("silu", silu_clamped_for_float32, GENERATED),
    "SwiGLU's silu in float32, not cast back": (
        "swiglu",
        MLPWithFloat32Silu,
        GENERATED,
    ),
    "SwiGLU's silu in float32, not cast back (bug hunt)": (
        "swiglu_bug",
        MLPWithFloat32Silu,
        GENERATED,
    ),
    "logits upcast to float32": (
        "forward_logits",
        forward_logits_in_float32,
        GENERATED,
    ),
    "decoder layer norms of the default eps": (
        "decoder_layer_bug",
        DecoderLayerOfDefaultEps,
        GENERATED,
    ),
}
WIDE_MUTANTS: dict = {}

# one bug a task (the targeted checks may catch it as well)
CAUGHT: dict = {
    "rms": rms_clamped_at_eps,
    "rmsnorm": WeightBeforeTheCastRMSNorm,
    "rmsnorm_bug": WeightBeforeTheCastRMSNorm,
    "rope_frequencies": frequencies_of_i_not_2i,
    "rope_tables": tables_of_bfloat16_positions,
    "rotate_half": rotate_half_by_rows,
    "rope": rope_with_tables_sliced_to_t,
    "rope_bug": rope_with_tables_sliced_to_t,
    "repeat_kv": repeat_kv_by_flat_heads,
    "repeat_kv_bug": repeat_kv_by_flat_heads,
    "gqa_attention": gqa_masked_with_minus_1e9,
    "silu": silu_clamped_for_float32,
    "swiglu": MLPWithDetachedGate,
    "swiglu_bug": MLPWithFloat32Silu,
    "count_params": count_params_with_full_width_keys,
    "forward_logits": forward_logits_in_float32,
    "decoder_layer_bug": DecoderLayerWithSwappedNorms,
}
