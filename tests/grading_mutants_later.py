"""Mutants of the differential checks of exercises 07 to 12 and 14 (smol's
function on generated inputs), kept with tests/test_grading.py's: MUTANTS (bug:
(task, mutant, the one check it loses): bugs that every targeted check misses) and
CAUGHT (bug: (task, mutant): bugs the differential check catches as well as a
targeted one)."""

import math

import torch
from torch import nn

NEG = float("-inf")
GENERATED = "generated inputs"


# --- 07 BPE
def merge_step_counting_once_a_word(word_counts, new_id):
    pairs = {}
    for word, count in word_counts.items():
        for pair in set(zip(word, word[1:])):  # a pair twice in a word counts once
            pairs[pair] = pairs.get(pair, 0) + count
    best = min(pairs, key=lambda p: (-pairs[p], p))
    merged = {}
    for word, count in word_counts.items():
        out, i = [], 0
        while i < len(word):
            if word[i : i + 2] == best:
                out, i = [*out, new_id], i + 2
            else:
                out, i = [*out, word[i]], i + 1
        merged[tuple(out)] = merged.get(tuple(out), 0) + count
    return best, merged


def encode_leftmost_pair_first(ids, ranks):
    """The merge of the first pair that has one, not of the lowest rank."""
    ids = list(ids)
    while True:
        at = next(
            (i for i in range(len(ids) - 1) if tuple(ids[i : i + 2]) in ranks), None
        )
        if at is None:
            return ids
        ids[at : at + 2] = [ranks[tuple(ids[at : at + 2])][1]]


# --- 08 KV-cache generation
def top_k_in_float32(logits, k):
    """Upcast first, as log-probabilities are: bfloat16 logits come back float32."""
    x = logits.float()
    if k >= x.shape[-1]:
        return x
    return x.masked_fill(x < torch.topk(x, k, dim=-1).values[..., -1:], NEG)


def top_p_softmax_by_hand(logits, p):
    """exp / sum without the maximum taken out: exp(250) is inf, inf / inf NaN."""
    if p >= 1.0:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    e = sorted_logits.float().exp()
    probs = e / e.sum(-1, keepdim=True)
    before = probs.cumsum(-1) - probs
    remove = before >= p
    remove[..., 0] = False
    return logits.masked_fill(remove.scatter(-1, order, remove), NEG)


def mask_padding_replaces_causal(attention_mask, T, offset=0):  # exercise 8's bug
    q = torch.arange(offset, offset + T)[:, None]
    k = torch.arange(offset + T)[None, :]
    if attention_mask is None:
        return (k <= q)[None, None]
    return attention_mask.bool()[:, None, None, :] | (k == q)


# --- 09 fast generation
def quantize_upcasting_bfloat16_only(weight):
    """weight.float() for bfloat16 only: a float16 weight's scales in float16."""
    w = weight.float() if weight.dtype == torch.bfloat16 else weight
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127
    return torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8), scale


def draft_without_overlaps(tokens, max_ngram=3, num_draft=8):
    """Only earlier n-grams that end before the last one starts: in 1 1 1 1 the
    last two tokens' latest earlier place (starting at 1) is missed."""
    N = len(tokens)
    for n in range(min(max_ngram, N - 1), 0, -1):
        for start in range(N - 2 * n, -1, -1):
            if torch.equal(tokens[start : start + n], tokens[N - n :]):
                return tokens[start + n : start + n + num_draft]
    return tokens[:0]


def int8_linear_scaling_the_inputs(x, q, scale):
    """scale on the input axis: right only where out == in."""
    return (x * scale[: x.shape[-1]].to(x.dtype)) @ q.to(x.dtype).T


# --- 10 training loop
def batch_masked_by_arithmetic(tokens, attention_mask=None):
    """targets * mask + -100 * (1 - mask): right for a long mask; a bool mask
    raises, a float one makes float targets."""
    inputs, targets = tokens[:, :-1], tokens[:, 1:].clone()
    if attention_mask is None:
        return inputs, targets
    m = attention_mask[:, 1:]
    return inputs, targets * m + -100 * (1 - m)


def lr_decay_one_step_longer(step, *, max_lr, warmup_steps, total_steps, min_lr=0.0):
    if step < warmup_steps:
        return max_lr * step / warmup_steps
    if step >= total_steps:
        return min_lr
    progress = (step - warmup_steps) / (total_steps - warmup_steps + 1)
    return min_lr + (max_lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


# --- 11 tiled attention
def merge_stats_hidden_blocks_whole(m_a, l_a, m_b, l_b):
    """A hidden block recognised only when all of it is hidden: a row hidden in
    both blocks beside visible rows is exp(-inf - (-inf)), NaN."""
    if torch.isinf(m_b).all():
        return m_a, l_a
    if torch.isinf(m_a).all():
        return m_b, l_b
    m = torch.maximum(m_a, m_b)
    return m, l_a * torch.exp(m_a - m) + l_b * torch.exp(m_b - m)


def tiled_attention_by(
    q,
    k,
    v,
    block_size,
    is_causal=False,
    *,
    rescale=True,
    last_key_aligned=False,
    max_start=-math.inf,
    dtype=torch.float32,
    cast=lambda out, q: out.to(q.dtype),
):
    """Attention over blocks of keys with an online softmax, summed in `dtype`, the
    result `cast` back; a bug by option: rescale=False forgets to rescale the output
    summed so far when the running maximum grows (exercise 11's), last_key_aligned
    lets the last query see the last key (not query i key i), max_start=0.0 starts
    the running maximum at 0 instead of -inf."""
    B, H, Tq, D = q.shape
    shift = k.shape[2] - Tq if last_key_aligned else 0
    qs = q.to(dtype) / math.sqrt(D)
    m = torch.full((B, H, Tq), max_start, dtype=dtype)
    l = torch.zeros(B, H, Tq, dtype=dtype)
    acc, rows = torch.zeros(B, H, Tq, D, dtype=dtype), torch.arange(Tq)[:, None]
    for start in range(0, k.shape[2], block_size):
        kb = k[:, :, start : start + block_size].to(dtype)
        vb = v[:, :, start : start + block_size].to(dtype)
        s = qs @ kb.transpose(-2, -1)
        if is_causal:
            cols = torch.arange(start, start + kb.shape[2])[None, :]
            s = s.masked_fill(cols > rows + shift, -math.inf)
        m_new = torch.maximum(m, s.amax(-1))
        safe = torch.where(m_new == -math.inf, 0.0, m_new)
        p = torch.exp(s - safe[..., None])
        rescaled = torch.exp(m - safe)
        l = l * rescaled + p.sum(-1)
        acc = (acc * rescaled[..., None] if rescale else acc) + p @ vb
        m = m_new
    return cast(acc / l[..., None], q)


def tiled_attention_bfloat16_only(q, k, v, block_size, is_causal=False):
    """The result cast back for bfloat16 only: float16 in, float32 out."""

    def cast(out, q):
        return out.bfloat16() if q.dtype == torch.bfloat16 else out

    return tiled_attention_by(q, k, v, block_size, is_causal, cast=cast)


def tiled_attention_no_rescale(q, k, v, block_size, is_causal=False):
    return tiled_attention_by(q, k, v, block_size, is_causal, rescale=False)


# --- 12 LoRA
class RsLoRALinear(nn.Module):
    """alpha / sqrt(r) (rsLoRA's scaling), not alpha / r."""

    def __init__(self, base_layer, r, alpha):
        super().__init__()
        self.base_layer = base_layer.requires_grad_(False)
        w = base_layer.weight
        self.lora_A = nn.Parameter(torch.zeros(r, w.shape[1], dtype=w.dtype))
        self.lora_B = nn.Parameter(torch.zeros(w.shape[0], r, dtype=w.dtype))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.scaling = alpha / math.sqrt(r)

    def forward(self, x):
        return self.base_layer(x) + (x @ self.lora_A.T @ self.lora_B.T) * self.scaling


def merge_without_scaling(layer):
    base = layer.base_layer
    out = nn.Linear(
        base.in_features,
        base.out_features,
        bias=base.bias is not None,
        dtype=base.weight.dtype,
    )
    with torch.no_grad():
        out.weight.copy_(base.weight + layer.lora_B @ layer.lora_A)
        if base.bias is not None:
            out.bias.copy_(base.bias)
    return out


def sft_targets_training_on_the_prompt(ids, prompt_lens):  # exercise 12's bug
    return ids[:, :-1], ids[:, 1:].clone()


# --- 14 multiple choice
def answer_logprobs_upcasting_bfloat16_only(logits, ids, n_context):
    """logits.float() for bfloat16 only: float16 logits scored in float16."""
    x = logits.float() if logits.dtype == torch.bfloat16 else logits
    logp = x[n_context - 1 : -1].log_softmax(-1)
    return logp.gather(-1, ids[n_context:, None]).squeeze(-1)


def choice_score_upcasting_bfloat16_only(logits, ids, n_context, normalise):
    logp = answer_logprobs_upcasting_bfloat16_only(logits, ids, n_context)
    return logp.mean() if normalise else logp.sum()


MUTANTS: dict = {
    "top-k returning float32 for bfloat16 logits": (
        "filter_top_k",
        top_k_in_float32,
        GENERATED,
    ),
    "top-p's softmax as exp / sum, without the maximum": (
        "filter_top_p",
        top_p_softmax_by_hand,
        GENERATED,
    ),
    "int8 scales in float16 for a float16 weight": (
        "quantize_int8",
        quantize_upcasting_bfloat16_only,
        GENERATED,
    ),
    "int8 scales in float16 for a float16 weight (bug hunt)": (
        "quantize_bug",
        quantize_upcasting_bfloat16_only,
        GENERATED,
    ),
    "a prompt-lookup draft that skips overlapping n-grams": (
        "lookup_draft",
        draft_without_overlaps,
        GENERATED,
    ),
    "next-token targets masked by arithmetic": (
        "next_token_batch",
        batch_masked_by_arithmetic,
        GENERATED,
    ),
    "merge_stats testing whole blocks for -inf": (
        "merge_stats",
        merge_stats_hidden_blocks_whole,
        GENERATED,
    ),
    "tiled attention cast back for bfloat16 only": (
        "tiled_attention",
        tiled_attention_bfloat16_only,
        GENERATED,
    ),
    "tiled attention cast back for bfloat16 only (bug hunt)": (
        "tiled_attention_bug",
        tiled_attention_bfloat16_only,
        GENERATED,
    ),
    "answer log-probabilities upcast for bfloat16 only": (
        "answer_logprobs",
        answer_logprobs_upcasting_bfloat16_only,
        GENERATED,
    ),
    "answer log-probabilities upcast for bfloat16 only (bug hunt)": (
        "answer_logprobs_bug",
        answer_logprobs_upcasting_bfloat16_only,
        GENERATED,
    ),
    "choice score upcast for bfloat16 only": (
        "choice_score",
        choice_score_upcasting_bfloat16_only,
        GENERATED,
    ),
}
WIDE_MUTANTS: dict = {}
CAUGHT: dict = {
    "merge_step counting a pair once a word": (
        "merge_step",
        merge_step_counting_once_a_word,
    ),
    "encode_ids merging the leftmost pair first": (
        "bpe_encode",
        encode_leftmost_pair_first,
    ),
    "encode_ids merging the leftmost pair first (bug hunt)": (
        "bpe_bug",
        encode_leftmost_pair_first,
    ),
    "the padding mask replacing the causal one": (
        "attention_mask_bug",
        mask_padding_replaces_causal,
    ),
    "int8_linear scaling the inputs": ("int8_linear", int8_linear_scaling_the_inputs),
    "lr decayed over one step more": ("lr_schedule", lr_decay_one_step_longer),
    "tiled attention without the rescale": (
        "tiled_attention_bug",
        tiled_attention_no_rescale,
    ),
    "LoRA scaled by alpha / sqrt(r)": ("lora_linear", RsLoRALinear),
    "merge without alpha / r": ("lora_merge", merge_without_scaling),
    "SFT targets training on the prompt": (
        "sft_targets_bug",
        sft_targets_training_on_the_prompt,
    ),
}
