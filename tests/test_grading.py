"""The grader, proven: solutions score full marks, untouched exercises zero, each known
bug class loses exactly the points of the check written for it, and hostile student code
(raising, hanging, exiting, killing its kernel) costs only its own points."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import re
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import nbformat
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from smol.attention import Attention
from smol.grading import NOTEBOOKS, TASKS, core, grade, preview, registry, run_checks
from smol.grading.checks._util import close
from smol.grading.make_exercises import (
    BEGIN,
    END,
    exercise_notebook,
    stale,
    strip_solutions,
)
from smol.grading.runner import collected_results, expected_tasks
from smol.mlp import MLP
from smol.norm import RMSNorm
from tests import (
    grading_mutants_fresh,
    grading_mutants_generation,
    grading_mutants_later,
    grading_mutants_precision,
    grading_mutants_rl,
)
from tests.grading_mutants_later import tiled_attention_by, tiled_attention_no_rescale
from tests.grading_mutants_rl import grpo_loss_by, grpo_loss_with
from tests.nbtools import ROOT

SOLUTIONS = [ROOT / "solutions" / f"{stem}.ipynb" for stem in NOTEBOOKS.values()]
EXERCISES = [ROOT / "exercises" / f"{stem}.ipynb" for stem in NOTEBOOKS.values()]


def run_in_process(path):
    """Execute a notebook's code cells (after the setup cell) in one namespace, here;
    return the namespace and the counted grade results."""
    nb = nbformat.read(path, as_version=4)
    core.RESULTS.clear()
    namespace = {"__name__": "__main__"}
    with contextlib.redirect_stdout(io.StringIO()):
        for cell in nb.cells[1:]:
            if cell.cell_type == "code":
                exec(compile(cell.source, str(path), "exec"), namespace)  # noqa: S102
    return nb, namespace, dict(core.RESULTS)


def failed(task, obj, timeout=registry.DEFAULT_TIMEOUT):
    return {row.check for row in run_checks(task, obj, timeout).rows if not row.passed}


def beyond_generated(task, lost, check=None):
    """The checks `lost` but the task's differential check ("generated inputs": smol's
    function on many generated inputs), which catches a wrong value or gradient on top
    of the check written for it; kept where `check` is that check itself."""
    generated = {c.name for c in TASKS[task].checks if c.name.startswith("generated")}
    return set(lost) if check in generated else set(lost) - generated


def check_named(task, start):
    names = [c.name for c in TASKS[task].checks if c.name.startswith(start)]
    assert len(names) == 1, (task, start, names)
    return names[0]


# --- the notebooks
# ------------------------------------------------------------------------------


def test_seven_notebooks_each_with_tasks_and_one_bug_hunt():
    assert len(NOTEBOOKS) >= 7
    for topic, stem in NOTEBOOKS.items():
        nb = nbformat.read(ROOT / "solutions" / f"{stem}.ipynb", as_version=4)
        tasks = expected_tasks(nb)
        assert tasks == [t.name for t in TASKS.values() if t.notebook == topic], stem
        assert (
            2 <= sum(not t.endswith("_bug") for t in tasks) <= 5
            and sum(t.endswith("_bug") for t in tasks) == 1
        ), stem
        assert nb.cells[-1].source == f'summary("{topic}")', (
            f"{stem} must end with its total"
        )
        regions = sum(c.source.count(BEGIN) for c in nb.cells if c.cell_type == "code")
        assert regions >= len(tasks), f"{stem}: every task needs a solution region"
        # a check cell follows each task; previews are not counted
        for cell in nb.cells:
            if "grade(" in cell.source:
                assert (
                    cell.source.startswith("grade(") and "\n" not in cell.source.strip()
                )


def test_one_exercise_per_chapter_and_the_exercises_page_lists_each():
    """Exercise NN follows chapter NN, for every chapter that has one (1 to 16);
    book/exercises.md has a row per exercise, with its chapter, the names of its tasks
    and its points, made when the book is built (book/_ext/generated.py)."""
    from tests.nbtools import CHAPTER_EXERCISES

    stems = list(NOTEBOOKS.values())
    assert [int(s[:2]) for s in stems] == list(range(1, 17)), stems
    chapters = {e: c for c, e in CHAPTER_EXERCISES.items() if e}
    assert [int(s[:2]) for s in stems] == sorted(int(c[:2]) for c in chapters.values())
    assert sorted(chapters) == sorted(stems)
    page = (ROOT / "book" / "exercises.md").read_text()
    assert "```{include} generated/exercises.md\n```" in page
    sys.path.insert(0, str(ROOT / "book" / "_ext"))
    try:
        from generated import exercises_md
    finally:
        sys.path.remove(str(ROOT / "book" / "_ext"))
    text = exercises_md()
    rows = re.findall(
        r"^\| \{doc\}`(\d+): [^<]+</exercises/(\w+)>` "
        r"\| \{doc\}`(\d+)\. [^<]+</chapters/(\w+)>` \| (.+) \| (\d+) \|$",
        text,
        re.MULTILINE,
    )
    assert [row[1] for row in rows] == stems, "one row per exercise, in course order"
    topics = {stem: topic for topic, stem in NOTEBOOKS.items()}
    for number, stem, chapter_number, chapter, tasks, points in rows:
        assert int(number) == int(chapter_number) == int(stem[:2]), stem
        assert chapters[stem] == chapter, f"{stem} follows {chapters[stem]}"
        want = [t for t in TASKS.values() if t.notebook == topics[stem]]
        assert re.findall(r"`(\w+)`", tasks) == [t.name for t in want], stem
        assert int(points) == sum(t.points for t in want), stem


def gradebook_total_problems(rows: dict[str, str], total: int) -> list[str]:
    """The rows `points of STUDENT` of bench/results/gradebook.csv whose maximum is not
    `total`: a stored class run graded against other checks than today's."""
    return [
        f"{name}: {value}, where the exercises are worth {total}"
        for name, value in rows.items()
        if name.startswith("points of ") and int(value.split("/")[1]) != total
    ]


def test_the_stored_class_run_counts_todays_points():
    """The Exercises page shows bench/results/gradebook.csv (python bench/gradebook.py):
    its solved student's x/y must be the registry's total, the sum of the page's points
    column, or the table contradicts the page it sits on. Rerun the benchmark when a
    check's points change."""
    with open(ROOT / "bench" / "results" / "gradebook.csv", newline="") as f:
        rows = {r["quantity"]: r["value"] for r in csv.DictReader(f)}
    total = sum(t.points for t in TASKS.values() if t.notebook in NOTEBOOKS)
    assert rows["points of solved"] == f"{total}/{total}"
    assert not gradebook_total_problems(rows, total)
    stale = dict(rows, **{"points of mixed": f"124/{total - 9}"})
    assert gradebook_total_problems(stale, total) == [
        f"points of mixed: 124/{total - 9}, where the exercises are worth {total}"
    ]


def test_strip_solutions_makes_an_indented_stub():
    source = f"def f(x):\n    {BEGIN}\n    return x\n    {END}\n\ny = 1"
    assert (
        strip_solutions(source)
        == "def f(x):\n    # YOUR CODE HERE\n    raise NotImplementedError\n\ny = 1"
    )
    for broken in (f"{BEGIN}\nx", f"x\n{END}", f"{BEGIN}\n{BEGIN}\n{END}"):
        with pytest.raises(ValueError):
            strip_solutions(broken)


def test_exercises_are_generated_from_the_current_solutions():
    problems = stale(ROOT / "solutions", ROOT / "exercises")
    assert not problems, f"exercises/ is stale, run `make exercises`: {problems}"
    for path in EXERCISES:
        nb = nbformat.read(path, as_version=4)
        assert not any(BEGIN in c.source or END in c.source for c in nb.cells), (
            path.name
        )
        assert sum("# YOUR CODE HERE" in c.source for c in nb.cells) >= 3, path.name


def test_stale_exercises_are_detected(tmp_path):
    solution = nbformat.read(SOLUTIONS[0], as_version=4)
    (tmp_path / "s").mkdir(), (tmp_path / "e").mkdir()
    nbformat.write(solution, tmp_path / "s" / SOLUTIONS[0].name)
    assert stale(tmp_path / "s", tmp_path / "e") == [f"{SOLUTIONS[0].name}: missing"]
    nbformat.write(exercise_notebook(solution), tmp_path / "e" / SOLUTIONS[0].name)
    assert stale(tmp_path / "s", tmp_path / "e") == []
    solution.cells[3].source += "\n# an edit"
    nbformat.write(solution, tmp_path / "s" / SOLUTIONS[0].name)
    assert stale(tmp_path / "s", tmp_path / "e")


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_solutions_score_full_marks(path):
    nb, namespace, results = run_in_process(path)
    assert set(results) == set(expected_tasks(nb))
    for name, result in results.items():
        # grade() in a notebook: the checks a student sees (hidden ones left out)
        assert result.score == result.total == TASKS[name].shown_points, result.table()


@pytest.mark.parametrize("path", EXERCISES, ids=lambda p: p.stem)
def test_untouched_exercises_score_zero_and_run(path):
    nb, namespace, results = run_in_process(path)  # no cell may raise
    assert set(results) == set(expected_tasks(nb))
    for result in results.values():
        assert result.score == 0 and result.total > 0, result.table()
        assert all("NotImplementedError" in row.message for row in result.rows), (
            result.table()
        )


@pytest.mark.parametrize(
    "path", SOLUTIONS + EXERCISES, ids=lambda p: f"{p.parent.name}/{p.stem}"
)
def test_stored_outputs_show_the_scores(path):
    nb = nbformat.read(path, as_version=4)
    results = collected_results(nb)
    assert set(results) == set(expected_tasks(nb)), "re-execute the notebook"
    for r in results.values():
        assert r["score"] == (r["total"] if path.parent.name == "solutions" else 0), r
        # the table a reader sees is today's: its checks and points, not a stale set
        shown = [(c["check"], c["points"]) for c in r["checks"]]
        checks = [c for c in TASKS[r["task"]].checks if not c.hidden]
        assert shown == [(c.name, c.points) for c in checks], "re-execute the notebook"


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_each_bug_hunt_shows_a_bug_that_fails_one_check(path):
    nb, namespace, _ = run_in_process(path)
    previews = [
        c.source
        for c in nb.cells
        if c.cell_type == "code" and c.source.startswith("preview(")
    ]
    assert len(previews) == 1
    task, name = (
        previews[0].removeprefix("preview(").rstrip(")").replace('"', "").split(", ")
    )
    assert len(beyond_generated(task, failed(task, namespace[name]))) == 1


# --- smol's own code passes the checks of the pieces it has
# --------------------------------------


def test_smols_reference_implementations_score_full_marks():
    from smol.attention import repeat_kv
    from smol.dpo import dpo_loss, sequence_logprobs
    from smol.export import pack_tensor_info, pack_value, quantize_q8_0
    from smol.generate import filter_top_k, filter_top_p, generate
    from smol.gguf import permute_qk
    from smol.grpo import group_advantages
    from smol.lora import LoRALinear
    from smol.model import DecoderLayer
    from smol.quantize import QuantLinear, quantize_per_channel
    from smol.rope import apply_rope, rotate_half
    from smol.speculative import lookup_draft

    for task, obj in [
        ("rmsnorm", RMSNorm),
        ("rope", apply_rope),
        ("rotate_half", rotate_half),
        ("repeat_kv", repeat_kv),
        ("swiglu", MLP),
        ("tie_weights", lambda m: m.tie_weights()),
        ("init_weights", lambda m: m.reset_parameters()),
        ("filter_top_k", filter_top_k),
        ("filter_top_p", filter_top_p),
        ("lora_linear", LoRALinear),
        ("lora_merge", lambda layer: layer.merged()),
        (
            "lora_init",
            lambda A, B: LoRALinear.reset_parameters(
                type("Adapter", (), {"lora_A": A, "lora_B": B})()
            ),
        ),
        ("decoder_layer_bug", DecoderLayer),
        ("forward_logits", lambda model, ids: model(ids)[0]),
        ("quantize_int8", quantize_per_channel),
        ("quantize_bug", quantize_per_channel),
        ("int8_linear", lambda x, q, scale: QuantLinear(q, scale)(x)),
        ("lookup_draft", lookup_draft),
        ("gguf_value", pack_value),
        ("q8_0", quantize_q8_0),
        ("permute_qk", permute_qk),
        ("tensor_info_bug", pack_tensor_info),
        ("sequence_logprobs", sequence_logprobs),
        ("dpo_loss", dpo_loss),
        ("group_advantages", group_advantages),
        ("grpo_loss", grpo_loss_by_smol),
        ("grpo_batch_bug", grpo_batch_loss_by_smol),
        (
            "speculative_greedy",
            lambda model, ids, n: generate(model, ids, n, temperature=0, speculative=4),
        ),
    ]:
        assert not failed(task, obj), task


def test_smols_bpe_passes_the_bpe_checks():
    from types import SimpleNamespace

    from smol.bpe import BPE, bytes_to_unicode

    assert not failed("byte_map", bytes_to_unicode)
    for task in ("bpe_encode", "bpe_bug"):
        assert not failed(
            task, lambda ids, ranks: BPE.apply_merges(SimpleNamespace(ranks=ranks), ids)
        )


def test_smol_optim_passes_the_training_checks():
    from smol.optim import lr_schedule, param_groups

    assert not failed(
        "lr_schedule", lambda step, **kw: lr_schedule(step, kind="cosine", **kw)
    )
    assert not failed("param_groups", param_groups)


# --- mutants: each bug class loses exactly the points of its own check
# ---------------------------


class NoUpcastRMSNorm(RMSNorm):
    def forward(self, x):
        return self.weight * (
            x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        )


def interleaved_rope(x, cos, sin):
    x1, x2 = x[..., 0::2], x[..., 1::2]
    c, s = cos[..., : x.shape[-1] // 2], sin[..., : x.shape[-1] // 2]
    return (
        torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2).to(x.dtype)
    )


def tiled_repeat_kv(x, n_rep):
    return x.repeat(1, n_rep, 1, 1)


def misspelt_flag_mlp(config):

    mlp = MLP(config)
    del mlp.down_proj.scaled_init
    mlp.down_proj.scaled_inti = True
    return mlp


def init_without_skip(model):
    std = model.config.initializer_range
    for module in model.modules():
        if isinstance(module, nn.Linear):
            scale = (
                math.sqrt(2 * model.config.num_hidden_layers)
                if getattr(module, "scaled_init", False)
                else 1.0
            )
            nn.init.normal_(module.weight, std=std / scale)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=std)
        elif isinstance(module, RMSNorm):
            nn.init.ones_(module.weight)


def unshifted_train_step(model, optimizer, tokens):
    optimizer.zero_grad()
    loss = model(tokens, targets=tokens)[1]
    loss.backward()
    optimizer.step()
    return loss.item()


def mask_without_causality(attention_mask, T, offset=0):
    q, k = torch.arange(offset, offset + T)[:, None], torch.arange(offset + T)[None, :]
    if attention_mask is None:
        return (k <= q)[None, None]
    return attention_mask.bool()[:, None, None, :] | (k == q)


def leftmost_first_encode(ids, ranks):
    from smol.bpe import merge

    while True:
        pairs = [p for p in zip(ids, ids[1:]) if p in ranks]
        if not pairs:
            return ids
        ids = merge(ids, pairs[0], ranks[pairs[0]][1])


def first_seen_tie_step(word_counts, new_id):
    from smol.bpe import merge

    pairs = {}
    for word, count in word_counts.items():
        for pair in zip(word, word[1:]):
            pairs[pair] = pairs.get(pair, 0) + count
    best = max(pairs, key=pairs.get)  # ties: the pair seen first
    merged = {}
    for word, count in word_counts.items():
        key = tuple(merge(list(word), best, new_id))
        merged[key] = merged.get(key, 0) + count
    return best, merged


def overflowing_silu(x):  # right values everywhere; the gradient is NaN at x = -100
    return x / (1 + torch.exp(-x))


def library_silu(x):
    return nn.SiLU()(x)


def library_attention(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def clamped_rms(
    x, eps
):  # agrees with sqrt(mean + eps) on all-zero rows and to 1e-5 elsewhere
    return torch.sqrt(torch.clamp(x.pow(2).mean(-1, keepdim=True), min=eps))


def tie_by_replacing_the_head(
    model,
):  # the same weight object, and a head that cannot project
    if model.config.tie_word_embeddings:
        model.lm_head = model.model.embed_tokens


def init_that_freezes(
    model,
):  # "no autograd while initialising", never switched back on
    for p in model.parameters():
        p.requires_grad_(False)
    init_by_name(model)


def init_that_misses_v_proj(model):  # v_proj keeps whatever it held before
    std, L = model.config.initializer_range, model.config.num_hidden_layers
    for name, p in model.named_parameters():
        if p.dim() == 1:
            nn.init.ones_(p)
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            nn.init.normal_(p, std=std / math.sqrt(2 * L))
        elif not name.endswith("v_proj.weight"):
            nn.init.normal_(p, std=std)


def init_b_random(A, B):
    nn.init.kaiming_uniform_(A, a=math.sqrt(5))
    nn.init.normal_(B, std=0.02)


class UnscaledLoRALinear(nn.Module):
    def __init__(self, base_layer, r, alpha):
        super().__init__()
        self.base_layer = base_layer.requires_grad_(False)
        like = dict(dtype=base_layer.weight.dtype)
        self.lora_A = nn.Parameter(torch.randn(r, base_layer.in_features, **like) / 9)
        self.lora_B = nn.Parameter(torch.zeros(base_layer.out_features, r, **like))

    def forward(self, x):
        return self.base_layer(x) + x @ self.lora_A.T @ self.lora_B.T


def merge_in_place(layer):
    with torch.no_grad():
        layer.base_layer.weight += layer.scaling * layer.lora_B @ layer.lora_A
    return layer.base_layer


def sft_targets_on_the_prompt(ids, prompt_lens):
    return ids[:, :-1], ids[:, 1:].clone()


class NormsSwappedDecoderLayer(nn.Module):  # each norm before the other's sublayer
    def __init__(self, config, layer_idx=0):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, cos, sin, mask=None, is_causal=True, kv_cache=None):
        h = self.post_attention_layernorm(x)
        x = x + self.self_attn(h, cos, sin, mask, is_causal, kv_cache)
        return x + self.mlp(self.input_layernorm(x))


def truncating_quantize(weight):  # .to(torch.int8) rounds towards zero
    w = weight.float()
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127
    return (w / scale[:, None]).to(torch.int8), scale


def q8_0_by(w, rounding=torch.round, divide=False, half_scale=False):
    """Q8_0 blocks computed another way: a rounding function, x / d for x * (1 / d),
    or the float16-rounded scale used to quantize."""
    rows = w.shape[0]
    blocks = w.float().reshape(-1, 32)
    d = blocks.abs().amax(dim=1, keepdim=True) / 127
    used = d.half().float() if half_scale else d
    x = blocks / used if divide else blocks * (1 / used)
    q = rounding(torch.nan_to_num(x)).to(torch.int8)
    scale = d.half().view(torch.uint8)
    return torch.cat([scale, q.view(torch.uint8)], 1).view(rows, -1)


def round_half_away(x):
    whole = x.abs().floor()
    return x.sign() * (whole + torch.floor(2 * (x.abs() - whole)))


def q8_0_halves_to_even(w):
    return q8_0_by(w, torch.round)


def q8_0_dividing(w):
    return q8_0_by(w, round_half_away, divide=True)


def q8_0_float16_scale(w):
    return q8_0_by(w, round_half_away, half_scale=True)


def pack_value_by(kind, value, chars=False, float64=False, tagged=False):
    """A GGUF value packed another way: a string's length in characters, float32 as
    float64, or each array item with a type tag of its own."""
    from smol.gguf import FLOAT32, STRING, VALUE_FORMATS

    def one(kind, value):
        if kind == STRING:
            data = value.encode()
            return struct.pack("<Q", len(value) if chars else len(data)) + data
        fmt = "<d" if float64 and kind == FLOAT32 else VALUE_FORMATS[kind]
        return struct.pack(fmt, value)

    if isinstance(kind, tuple):
        item = kind[1]
        tag = struct.pack("<I", item) if tagged else b""
        items = b"".join(tag + one(item, v) for v in value)
        return struct.pack("<IQ", item, len(value)) + items
    return one(kind, value)


def pack_value_string_chars(kind, value):
    return pack_value_by(kind, value, chars=True)


def pack_value_float64(kind, value):
    return pack_value_by(kind, value, float64=True)


def pack_value_tagged_items(kind, value):
    return pack_value_by(kind, value, tagged=True)


def permute_qk_one_head(w, n_heads):  # the whole matrix as one head
    from smol.gguf import permute_qk

    return permute_qk(w, 1)


def permute_qk_inverse(w, n_heads):  # undoes llama.cpp's order instead
    from smol.gguf import unpermute_qk

    return unpermute_qk(w, n_heads)


def tensor_info_torch_order(name, shape, qtype, offset):  # the exercise's bug
    data = name.encode()
    dims = list(shape)
    return (
        struct.pack("<Q", len(data))
        + data
        + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, qtype, offset)
    )


def unshifted_answer_logprobs(logits, ids, n_context):  # position t scores token t
    logp = logits[n_context:].float().log_softmax(-1)
    return logp.gather(-1, ids[n_context:, None]).squeeze(-1)


def raw_logit_answer(logits, ids, n_context):  # no log_softmax
    return logits[n_context - 1 : -1].float().gather(-1, ids[n_context:, None])[:, 0]


def answer_and_context_logprobs(logits, ids, n_context):  # every token after the first
    logp = logits[:-1].float().log_softmax(-1)
    return logp.gather(-1, ids[1:, None]).squeeze(-1)


def mean_over_every_token(logits, ids, n_context, normalise):
    logp = logits[n_context - 1 : -1].float().log_softmax(-1)
    total = logp.gather(-1, ids[n_context:, None]).sum()
    return total / len(ids) if normalise else total


def answer_logprobs_by_cross_entropy(logits, ids, n_context):
    return -F.cross_entropy(
        logits[n_context - 1 : -1].float(), ids[n_context:], reduction="none"
    )


def choice_score_by_loop(logits, ids, n_context, normalise):
    logp = logits.float().log_softmax(-1)
    scores = [logp[t - 1, ids[t]] for t in range(n_context, len(ids))]
    total = torch.stack(scores).sum()
    return total / len(scores) if normalise else total


def logprobs_of_clamped_targets(logits, targets):  # -100 scored as token 0
    logp = logits.float().log_softmax(-1)
    return logp.gather(-1, targets.clamp(min=0)[..., None]).squeeze(-1).sum(-1)


def logprobs_masked_by_positive_ids(logits, targets):  # token 0 taken for padding
    logp = logits.float().log_softmax(-1).gather(-1, targets.clamp(min=0)[..., None])
    return (logp.squeeze(-1) * (targets > 0)).sum(-1)


def logprobs_mean_over_the_reply(logits, targets):  # a length normalisation
    from smol.dpo import sequence_logprobs

    return sequence_logprobs(logits, targets) / (targets != -100).sum(-1)


def logprobs_reshaped_by_row(logits, targets):  # as if every reply were as long
    logp = logits.float().log_softmax(-1).gather(-1, targets.clamp(min=0)[..., None])
    picked = logp.squeeze(-1)[targets != -100]  # the reply tokens, row after row
    return picked.view(len(targets), -1).sum(-1)


def logprobs_in_the_logits_dtype(logits, targets):  # no float32 upcast
    logp = logits.log_softmax(-1).gather(-1, targets.clamp(min=0)[..., None])
    return (logp.squeeze(-1) * (targets != -100)).sum(-1)


def logprobs_shifted_in_place(logits, targets):  # float() of float32 is the caller's
    from smol.dpo import sequence_logprobs

    x = logits.float()
    x -= x.max(-1, keepdim=True).values  # for stability
    return sequence_logprobs(x, targets)


def logprobs_without_a_graph(logits, targets):
    from smol.dpo import sequence_logprobs

    with torch.no_grad():
        return sequence_logprobs(logits, targets)


def dpo_loss_by(pc, pr, rc, rr, beta, **bugs):
    """DPO's loss with one of `bugs`: sign (the margin flipped), one_sided (beta on
    the chosen log-ratio alone), naive (log of sigmoid), unscaled (rewards without
    beta), attached (rewards with their graph), reference (no detach), in_place (the
    log-ratios subtracted into the caller's tensors)."""
    if not bugs.get("reference"):
        rc, rr = rc.detach(), rr.detach()
    if bugs.get("in_place"):
        pc -= rc
        pr -= rr
        chosen, rejected = pc, pr
    else:
        chosen, rejected = pc - rc, pr - rr
    x = (
        beta * chosen - rejected
        if bugs.get("one_sided")
        else beta * (chosen - rejected)
    )
    x = -x if bugs.get("sign") else x
    loss = -torch.log(torch.sigmoid(x)) if bugs.get("naive") else -F.logsigmoid(x)
    scale = 1.0 if bugs.get("unscaled") else beta
    if not bugs.get("attached"):
        chosen, rejected = chosen.detach(), rejected.detach()
    return loss.mean(), scale * chosen, scale * rejected


def dpo_loss_with(bug):
    return lambda *args: dpo_loss_by(*args, **{bug: True})


def dpo_batch_loss_by_twos(policy_logits, ref_logits, targets, beta):  # the bug hunt
    from smol.dpo import dpo_loss, sequence_logprobs

    policy = sequence_logprobs(policy_logits, targets)
    ref = sequence_logprobs(ref_logits, targets)
    return dpo_loss(policy[0::2], policy[1::2], ref[0::2], ref[1::2], beta)


def dpo_batch_loss_reference_attached(policy_logits, ref_logits, targets, beta):
    from smol.dpo import sequence_logprobs

    policy = sequence_logprobs(policy_logits, targets)
    ref = sequence_logprobs(ref_logits, targets)  # its graph kept, and used
    B = len(policy) // 2
    return dpo_loss_by(policy[:B], policy[B:], ref[:B], ref[B:], beta, reference=True)


def at_least_two(group_size):  # as group_advantages must: a group of one refused
    if group_size < 2:
        raise ValueError(f"group_size must be at least 2, got {group_size}")


def advantages_over_the_batch(rewards, group_size):  # every prompt's rewards mixed
    at_least_two(group_size)
    return (rewards - rewards.mean()) / (rewards.std() + 1e-4)


def _advantages_by(rewards, group_size, std=lambda g: g.std(1, keepdim=True) + 1e-4):
    at_least_two(group_size)
    grouped = rewards.view(-1, group_size)
    return ((grouped - grouped.mean(1, keepdim=True)) / std(grouped)).view(-1)


def advantages_without_epsilon(rewards, group_size):  # 0 / 0 for equal rewards
    return _advantages_by(rewards, group_size, lambda g: g.std(1, keepdim=True))


def advantages_guarded_without_epsilon(rewards, group_size):  # 0 only where std is 0
    advantages = advantages_without_epsilon(rewards, group_size)
    return torch.nan_to_num(advantages, nan=0.0)


def advantages_biased_std(rewards, group_size):  # std over G, not G - 1
    return _advantages_by(
        rewards, group_size, lambda g: g.std(1, keepdim=True, correction=0) + 1e-4
    )


def advantages_grouped_by_stride(rewards, group_size):  # (G, P): prompts round-robin
    at_least_two(group_size)
    grouped = rewards.view(group_size, -1)
    return ((grouped - grouped.mean(0)) / (grouped.std(0) + 1e-4)).view(-1)


def advantages_centred_in_place(rewards, group_size):  # the view is the caller's
    at_least_two(group_size)
    grouped = rewards.view(-1, group_size)
    std = grouped.std(1, keepdim=True)
    grouped -= grouped.mean(1, keepdim=True)
    return (grouped / (std + 1e-4)).view(-1)


def grpo_loss_by_smol(logps, old, ref, advantages, completion_mask, **options):
    from smol.grpo import grpo_loss

    T = logps.shape[1]  # dr_grpo's max_completion_length: the padded length
    return grpo_loss(
        logps,
        old,
        ref,
        advantages,
        completion_mask,
        **options,
        max_completion_length=T,
        use_bias_correction_kl=False,  # the KL term as the GRPO paper writes it
    ).loss


def grpo_batch_loss_by(logps, old, ref, rewards, mask, group_size, beta, **bugs):
    """The batch loss of exercise 16 with one of `bugs`: optimistic (the bug hunt:
    torch.min of the two token losses), detached (the ratio without a gradient)."""
    from smol.grpo import group_advantages, kl_k3

    A = group_advantages(rewards, group_size)[:, None]
    ratio = torch.exp((logps.detach() if bugs.get("detached") else logps) - old)
    clipped = ratio.clamp(0.8, 1.2)
    if bugs.get("optimistic"):
        per_token = torch.min(-ratio * A, -clipped * A)
    else:
        per_token = -torch.min(ratio * A, clipped * A)
    per_token = per_token + beta * kl_k3(logps, ref)
    mask = mask.float()
    return ((per_token * mask).sum(-1) / mask.sum(-1)).mean()


def grpo_batch_loss_with(bug):
    return lambda *args: grpo_batch_loss_by(*args, **{bug: True})


def grpo_batch_loss_by_smol(logps, old, ref, rewards, mask, group_size, beta):
    from smol.grpo import group_advantages

    advantages = group_advantages(rewards, group_size)
    return grpo_loss_by_smol(
        logps, old, ref, advantages, mask, loss_type="grpo", beta=beta
    )


MUTANTS = {  # bug class: (task, mutant, the check written for it), in course order
    "eps clamped instead of added": (
        "rms",
        clamped_rms,
        "eps is added inside",
    ),
    "missing fp32 upcast": (
        "rmsnorm",
        NoUpcastRMSNorm,
        "float16 activations",
    ),
    "wrong RoPE convention": (
        "rope",
        interleaved_rope,
        "rotates feature i with feature i + D/2",
    ),
    "tiling instead of grouping": (
        "repeat_kv",
        tiled_repeat_kv,
        "query head h reads",
    ),
    "SDPA where the task says without it": (
        "gqa_attention",
        library_attention,
        "written by hand",
    ),
    "a gradient that overflows where the value does not": (
        "silu",
        overflowing_silu,
        "finite values and gradients for large |x|",
    ),
    "F.silu where the task says without it": (
        "silu",
        library_silu,
        "written by hand",
    ),
    "scaled-init flag misspelt": (
        "swiglu",
        misspelt_flag_mlp,
        "down_proj is flagged",
    ),
    "tied by replacing the head module": (
        "tie_weights",
        tie_by_replacing_the_head,
        "the tied model runs",
    ),
    "an init that leaves the model unable to learn": (
        "init_weights",
        init_that_freezes,
        "the model still runs",
    ),
    "an init that misses a projection": (
        "init_weights",
        init_that_misses_v_proj,
        "embedding and projections",
    ),
    "tied weights re-initialised": (
        "init_weights",
        init_without_skip,
        "the tied matrix is initialised once",
    ),
    "decoder layer norms swapped": (
        "decoder_layer_bug",
        NormsSwappedDecoderLayer,
        "with trained norm gains",
    ),
    "BPE ties broken by first sight": (
        "merge_step",
        first_seen_tie_step,
        "ties go to the smallest",
    ),
    "BPE merges applied leftmost first": (
        "bpe_bug",
        leftmost_first_encode,
        "the lowest rank first",
    ),
    "causal mask lost with a padding mask": (
        "attention_mask_bug",
        mask_without_causality,
        "with a padding mask",
    ),
    "int8 values truncated instead of rounded": (
        "quantize_bug",
        truncating_quantize,
        "rounded to the nearest step",
    ),
    "speculative decoding keeps the rejected tokens' keys and values": (
        "speculative_greedy",
        lambda m, ids, n: speculative_by_smols_pieces(m, ids, n, rollback=False),
        "the same tokens as greedy",
    ),
    "speculative decoding keeps draft tokens after a mismatch": (
        "speculative_greedy",
        lambda m, ids, n: speculative_by_smols_pieces(m, ids, n, up_to_mismatch=False),
        "the same tokens as greedy",
    ),
    "loss not shifted": (
        "train_step_bug",
        unshifted_train_step,
        "the loss is next-token prediction",
    ),
    "online softmax: the output summed so far not rescaled": (
        "tiled_attention_bug",
        tiled_attention_no_rescale,
        "many blocks equal SDPA",
    ),
    "LoRA's B initialised randomly": (
        "lora_init",
        init_b_random,
        "B is zero",
    ),
    "LoRA update not scaled by alpha / r": (
        "lora_linear",
        UnscaledLoRALinear,
        "forward is base(x)",
    ),
    "merge adds into the frozen weight": (
        "lora_merge",
        merge_in_place,
        "the adapted layer is left",
    ),
    "fine-tuning loss on the prompt": (
        "sft_targets_bug",
        sft_targets_on_the_prompt,
        "the prompt's tokens",
    ),
    "GGUF float32 packed as float64": ("gguf_value", pack_value_float64, "scalars"),
    "GGUF array items with a type each": (
        "gguf_value",
        pack_value_tagged_items,
        "arrays",
    ),
    "Q8_0 halves rounded to even": ("q8_0", q8_0_halves_to_even, "halves round"),
    "Q8_0 divides by the scale": ("q8_0", q8_0_dividing, "multiply by 1 / d"),
    "GGUF dimensions in PyTorch's order": (
        "tensor_info_bug",
        tensor_info_torch_order,
        "an (out, in) matrix",
    ),
    "answer scored without the shift": (
        "answer_logprobs",
        unshifted_answer_logprobs,
        "each answer token is scored by the position before it",
    ),
    "raw logits as log-probabilities": (
        "answer_logprobs",
        raw_logit_answer,
        "log-probabilities",
    ),
    "context tokens scored with the answer": (
        "answer_logprobs",
        answer_and_context_logprobs,
        "one value per answer token",
    ),
    "normalised by the whole sequence's length": (
        "choice_score",
        mean_over_every_token,
        "normalise=True",
    ),
    "the prompt's tokens summed (-100 clamped to token 0, not masked)": (
        "sequence_logprobs",
        logprobs_of_clamped_targets,
        "the sum over the reply's tokens only",
    ),
    "token 0 dropped from the reply (a targets > 0 mask)": (
        "sequence_logprobs",
        logprobs_masked_by_positive_ids,
        "the sum over the reply's tokens only",
    ),
    "a mean over the reply's tokens instead of their sum": (
        "sequence_logprobs",
        logprobs_mean_over_the_reply,
        "a sum over the reply's tokens",
    ),
    "reply log-probabilities without the float32 upcast": (
        "sequence_logprobs",
        logprobs_in_the_logits_dtype,
        "bfloat16 logits",
    ),
    "the logits shifted in place": (
        "sequence_logprobs",
        logprobs_shifted_in_place,
        "the logits and the targets are left unchanged",
    ),
    "reply log-probabilities computed without a graph": (
        "sequence_logprobs",
        logprobs_without_a_graph,
        "the gradient reaches the logits",
    ),
    "DPO's margin with its sign flipped": (
        "dpo_loss",
        dpo_loss_with("sign"),
        "the loss: the mean over pairs",
    ),
    "beta on the chosen log-ratio only": (
        "dpo_loss",
        dpo_loss_with("one_sided"),
        "beta scales the whole margin",
    ),
    "log of sigmoid instead of logsigmoid": (
        "dpo_loss",
        dpo_loss_with("naive"),
        "large margins",
    ),
    "rewards not multiplied by beta": (
        "dpo_loss",
        dpo_loss_with("unscaled"),
        "the rewards: beta times",
    ),
    "rewards not detached": (
        "dpo_loss",
        dpo_loss_with("attached"),
        "the rewards are detached",
    ),
    "the reference's log-probabilities not detached": (
        "dpo_loss",
        dpo_loss_with("reference"),
        "the gradient reaches the policy's",
    ),
    "log-ratios subtracted into the caller's tensors": (
        "dpo_loss",
        dpo_loss_with("in_place"),
        "the four log-probability tensors",
    ),
    "pairs of rows taken by twos (chosen, rejected interleaved)": (
        "dpo_batch_bug",
        dpo_batch_loss_by_twos,
        "several pairs",
    ),
    "the reference's gradient flowing through a batch loss": (
        "dpo_batch_bug",
        dpo_batch_loss_reference_attached,
        "the gradient reaches the policy's logits",
    ),
    "advantages without the 1e-4 (NaN for a group of equal rewards)": (
        "group_advantages",
        advantages_without_epsilon,
        "std + 1e-4",
    ),
    "advantages guarded for equal rewards, but without the 1e-4": (
        "group_advantages",
        advantages_guarded_without_epsilon,
        "std + 1e-4",
    ),
    "advantages over the biased std (G, not G - 1)": (
        "group_advantages",
        advantages_biased_std,
        "each group's own mean and std",
    ),
    "rewards centred in place": (
        "group_advantages",
        advantages_centred_in_place,
        "the rewards are left unchanged",
    ),
    "GRPO's ratio never clipped": (
        "grpo_loss",
        grpo_loss_with("unclipped"),
        "clipped: -min",
    ),
    "GRPO's objective the optimistic max, not the min": (
        "grpo_loss",
        grpo_loss_with("optimistic"),
        "clipped: -min",
    ),
    "GRPO's ratio clipped only where the advantage is negative": (
        "grpo_loss",
        grpo_loss_with("negative_side_only"),
        "clipped: -min",
    ),
    "epsilon_low on both sides of the clip": (
        "grpo_loss",
        grpo_loss_with("low_both"),
        "asymmetric clipping",
    ),
    "epsilon_low and epsilon_high exchanged": (
        "grpo_loss",
        grpo_loss_with("swapped_eps"),
        "asymmetric clipping",
    ),
    "k3 with its sign flipped (d = logp - ref)": (
        "grpo_loss",
        grpo_loss_with("kl_flipped"),
        "beta > 0",
    ),
    "the KL penalty subtracted": (
        "grpo_loss",
        grpo_loss_with("kl_bonus"),
        "beta > 0",
    ),
    "the KL penalty computed without a gradient": (
        "grpo_loss",
        grpo_loss_with("kl_detached"),
        "beta > 0",
    ),
    "the KL averaged over the padding too": (
        "grpo_loss",
        grpo_loss_with("kl_everywhere"),
        "padding (completion_mask 0)",
    ),
    "per-completion and per-token averaging exchanged": (
        "grpo_loss",
        grpo_loss_with("swapped_averaging"),
        "grpo, dapo, dr_grpo",
    ),
    "dr_grpo divided by the token count, not B * T": (
        "grpo_loss",
        grpo_loss_with("dr_by_tokens"),
        "grpo, dapo, dr_grpo",
    ),
    "GRPO's ratio detached": (
        "grpo_loss",
        grpo_loss_with("detached"),
        "the gradient reaches logps",
    ),
    "the padding of logps zeroed in the caller's tensor": (
        "grpo_loss",
        grpo_loss_with("masked_in_place"),
        "the five input tensors",
    ),
    "a clipped loss that keeps the optimistic objective (torch.min of the losses)": (
        "grpo_batch_bug",
        grpo_batch_loss_with("optimistic"),
        "an older sampling policy",
    ),
    "a batch loss whose ratio is detached": (
        "grpo_batch_bug",
        grpo_batch_loss_with("detached"),
        "the gradient reaches logps",
    ),
}

# Mutants that lose more than one check: (task, mutant, the checks they lose)
EQUAL_REWARDS = "std + 1e-4: equal rewards give 0, not NaN; near-equal ones stay near 0"
AVERAGING = "grpo, dapo, dr_grpo: the mean per completion, per token, over B * T"
WIDE_MUTANTS = {
    "GGUF string length in characters": (
        "gguf_value",
        pack_value_string_chars,
        {"strings", "arrays"},
    ),
    "Q8_0 quantized with the float16 scale": (
        "q8_0",
        q8_0_float16_scale,
        {"every byte of random rows", "multiply by 1 / d"},
    ),
    "q/k permuted as one head": (
        "permute_qk",
        permute_qk_one_head,
        {"each head on its own", "keys: fewer heads, wide rows"},
    ),
    "q/k rows put back in smol's order": (
        "permute_qk",
        permute_qk_inverse,
        {
            "one head: row perm[i] at i",
            "each head on its own",
            "keys: fewer heads, wide rows",
        },
    ),
    # a batch-wide mean gives an equal group's rewards an advantage
    "advantages over the whole batch": (
        "group_advantages",
        advantages_over_the_batch,
        {"each group's own mean and std (unbiased, as torch.std)", EQUAL_REWARDS},
    ),
    "advantages of groups taken by stride": (
        "group_advantages",
        advantages_grouped_by_stride,
        {"each group's own mean and std (unbiased, as torch.std)", EQUAL_REWARDS},
    ),
    # rows of unequal lengths cannot be reshaped (the in-place check raises too)
    "reply tokens picked out and reshaped to (B, -1)": (
        "sequence_logprobs",
        logprobs_reshaped_by_row,
        {
            "a sum over the reply's tokens, not their mean",
            "the logits and the targets are left unchanged",
        },
    ),
    # replies of unequal lengths need padding, which such a loss counts
    "the padding counted in GRPO's loss": (
        "grpo_loss",
        grpo_loss_with("padding_counted"),
        {AVERAGING, "padding (completion_mask 0) counts nothing, whatever it holds"},
    ),
}


for _more in (
    grading_mutants_precision,
    grading_mutants_generation,
    grading_mutants_rl,
    grading_mutants_later,
    grading_mutants_fresh,
):
    MUTANTS |= _more.MUTANTS
    WIDE_MUTANTS |= _more.WIDE_MUTANTS


@pytest.mark.parametrize("bug", sorted(WIDE_MUTANTS))
def test_a_wide_mutant_loses_the_checks_it_breaks(bug):
    task, mutant, checks = WIDE_MUTANTS[bug]
    result = run_checks(task, mutant)
    lost = {row.check for row in result.rows if not row.passed}
    assert beyond_generated(task, lost) == checks, result.table()


@pytest.mark.parametrize("bug", sorted(MUTANTS))
def test_a_mutant_loses_exactly_the_points_of_its_check(bug):
    task, mutant, check = MUTANTS[bug]
    result = run_checks(task, mutant)
    lost = {row.check for row in result.rows if not row.passed}
    made_for_it = check_named(task, check)
    assert beyond_generated(task, lost, made_for_it) == {made_for_it}, result.table()
    assert result.score == TASKS[task].points - sum(
        c.points for c in TASKS[task].checks if c.name in lost
    )


# --- hostile student code
# ------------------------------------------------------------------------


ROTATE_POINTS = TASKS["rotate_half"].points  # what good_rotate_half and ROTATE earn
RMS_POINTS = TASKS["rms"].points


def good_rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def test_raising_hanging_exiting_and_misshaped_code_costs_only_its_checks():
    calls = {"n": 0}

    from smol.rope import apply_rope

    # the first check's call raises, the second's hangs, then all is well
    def sometimes(x, cos, sin):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("boom")
        if calls["n"] == 2:
            while True:
                pass
        return apply_rope(x, cos, sin)

    result = run_checks(
        "rope", sometimes, timeout=0.5, isolate=False
    )  # state shared across checks
    assert [row.passed for row in result.rows] == [False, False] + [True] * (
        len(result.rows) - 2
    )
    assert (
        "RuntimeError: boom" in result.rows[0].message
        and "timed out" in result.rows[1].message
    )

    for isolate in (False, True):
        hanging = run_checks(
            "rotate_half", lambda x: [None for _ in iter(int, 1)], 0.3, isolate=isolate
        )
        assert hanging.score == 0 and all(
            "timed out" in r.message for r in hanging.rows
        )
        exiting = run_checks("rms", lambda x, eps: sys.exit(3), isolate=isolate)
        assert exiting.score == 0 and "sys.exit(3)" in exiting.rows[0].message
        killing = run_checks(
            "rms", lambda x, eps: os._exit(3), isolate=isolate
        )  # the test process survives
        assert killing.score == 0 and "os._exit(3,)" in killing.rows[0].message
        assert os._exit.__name__ == "_exit"
        wrong_shape = run_checks(
            "rms", lambda x, eps: x.pow(2).mean(-1).sqrt(), isolate=isolate
        )
        assert "shape" in wrong_shape.rows[0].message and not wrong_shape.rows[0].passed


def test_a_fork_refused_for_want_of_processes_is_tried_again_then_named(monkeypatch):
    """os.fork failing with EAGAIN (the machine's limit of processes, others' doing)
    costs nothing while a later try works (switch-off: one try, and a check scores 0
    for the machine's state); when every try fails, each row says so, not the code."""
    from smol.grading import child

    real, refusals = os.fork, [2]  # forks still to refuse

    def fork():
        if refusals[0] > 0:
            refusals[0] -= 1
            raise BlockingIOError(11, "Resource temporarily unavailable")
        return real()

    monkeypatch.setattr(child, "FORK_TRIES", (0.0,) * 4)
    monkeypatch.setattr(os, "fork", fork)
    result = run_checks("rotate_half", good_rotate_half, isolate=True)
    assert result.score == result.total, result.table()
    refusals[0] = 10**6
    result = run_checks("rotate_half", good_rotate_half, isolate=True)
    assert result.score == 0
    assert all(
        "the machine is at its limit of processes" in r.message for r in result.rows
    )


def test_isolated_checks_survive_crashes_and_forget_what_the_code_patched():
    import ctypes

    crash = run_checks(
        "rms", lambda x, eps: ctypes.string_at(0), isolate=True
    )  # a segfault
    assert crash.score == 0 and "SIGSEGV" in crash.rows[0].message

    def patching(x, eps):  # tries to make every later check pass
        registry.Result.score = property(lambda self: 99)
        torch.isclose = lambda *a, **k: torch.ones((), dtype=torch.bool)
        return x

    isclose = torch.isclose
    result = run_checks("rms", patching, isolate=True)
    assert torch.isclose is isclose and isinstance(
        registry.Result.__dict__["score"], property
    )
    assert result.score == 0 < result.total, result.table()


def test_a_check_stuck_in_one_long_torch_call_is_killed_at_its_limit():
    def one_long_call(
        x, eps
    ):  # tens of seconds inside one C call: no Python signal handler runs
        return torch.linalg.matrix_power(torch.randn(1500, 1500), 2**60)

    start = time.monotonic()
    result = run_checks("rms", one_long_call, timeout=0.5)
    assert time.monotonic() - start < 3 * 0.5 + 5, (
        "the checks were not stopped at their limit"
    )
    assert result.score == 0 and all(
        "timed out after 0.5 s" in r.message for r in result.rows
    ), result.table()


def test_a_timeout_must_be_a_positive_number(capsys):
    from smol.commands.grade import main
    from smol.grading import grade

    for bad in (-1, 0, float("nan"), float("inf"), "10", True):
        result = run_checks("rms", None, timeout=bad)
        assert result.error and "timeout" in result.error and not result.rows, bad
    grade("rms", None, timeout=-1)
    assert "positive" in capsys.readouterr().out
    for option in ("--timeout", "--cell-timeout", "--check-timeout"):
        for value in ("-1", "0", "nan", "abc"):
            assert main(["exercises/", option, value]) == 2
            err = capsys.readouterr().err
            assert option in err and "seconds" in err and value in err, err


def test_timeout_works_off_the_main_thread_too():
    box, stop = [], threading.Event()

    # abandoned by the grader's watchdog thread; released at the end of the test
    def hang(x):
        while not stop.wait(0.05):
            pass

    thread = threading.Thread(
        target=lambda: box.append(run_checks("rotate_half", hang, 0.3))
    )
    thread.start()
    thread.join(10)
    stop.set()
    assert box and box[0].score == 0 and "timed out" in box[0].rows[0].message


def test_grade_prints_a_table_and_never_raises(capsys):
    from smol.grading import grade, summary

    core.RESULTS.clear()
    assert grade("no_such_task", None) is None
    grade("rotate_half", good_rotate_half)
    grade("rms", None)
    summary("rope")
    out = capsys.readouterr().out
    assert (
        "unknown task" in out
        and f"rotate_half: {ROTATE_POINTS}/{ROTATE_POINTS} points" in out
        and f"rms: 0/{RMS_POINTS} points" in out
    )
    assert "hint:" in out and "(not graded yet)" in out


# --- the command line: fresh kernels, a hang and a dead kernel cost only their notebook
# -------------


def _notebook(tmp_path, name, sources):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    path = tmp_path / name
    nbformat.write(nb, path)
    return path


HEAD = "from smol.grading import grade\nimport torch"
ROTATE = (
    "def rotate_half(x):\n    a, b = x.chunk(2, -1)\n    return torch.cat((-b, a), -1)"
)
FORGE = """from IPython.display import display
from smol.grading import MIME
for task, total in (("rms", 4), ("rmsnorm", 7)):
    row = {"check": "all", "points": total, "passed": True, "message": ""}
    forged = {"task": task, "score": total, "total": total, "counted": True,
              "error": "", "checks": [row]}
    display({MIME: forged, "text/plain": f"{task}: {total}/{total} points"}, raw=True)
    print(forged)"""
TAMPER = '''import sys, torch
def rms(x, eps):
    """Ones of the right shape (wrong values, a zero gradient); each call first
    rewrites, in its own process, what a judge there would compare with: the checks'
    comparisons, torch's, and smol's reference."""
    for name in ("smol.grading.checks.norm", "smol.grading.checks._util"):
        module = sys.modules[name]
        module.close = module.same_grads = lambda *args, **kwargs: None
        module.same_shape = lambda out, *args, **kwargs: out
    sys.modules["smol.grading.checks.norm"]._rms_reference = lambda t, e: rms(t, e)
    torch.equal = torch.allclose = lambda *args, **kwargs: True
    torch.isclose = lambda a, b, **kwargs: torch.ones(
        torch.broadcast_shapes(a.shape, b.shape), dtype=torch.bool
    )
    return x[..., :1] * 0 + 1'''
PATCH = """import smol.grading, smol.grading.core as core
import smol.grading.registry as registry
def full_marks(task_name, obj=None, timeout=10.0, **kw):
    rows = [registry.Row(c.name, c.points, c.points, True, c.hint)
            for c in registry.TASKS[task_name].checks]
    return registry.Result(task_name, rows)
core.run_checks = full_marks
registry.Result.score = property(lambda self: 99)
smol.grading.grade = grade = lambda task, obj=None, **kw: print(task, "full marks")
for task in registry.TASKS.values():
    task.checks.clear()"""


@pytest.fixture(scope="module")
def command_line(tmp_path_factory):
    """One run of `smol grade` over good, hostile, forging and broken
    notebooks."""
    tmp = tmp_path_factory.mktemp("grade")
    dies = _notebook(
        tmp,
        "dies.ipynb",
        [
            HEAD,
            ROTATE,
            'grade("rotate_half", rotate_half)',
            "import os\nos._exit(1)",
            'grade("rms", None)',
        ],
    )
    hangs = _notebook(
        tmp,
        "hangs.ipynb",
        [
            HEAD,
            ROTATE,
            'grade("rotate_half", rotate_half)',
            "while True:\n    pass",
            'grade("rope", None)',
        ],
    )
    forges = _notebook(tmp, "forges.ipynb", [HEAD, FORGE, 'grade("rms", None)'])
    tampers = _notebook(tmp, "tampers.ipynb", [HEAD, TAMPER, 'grade("rms", rms)'])
    patches = _notebook(
        tmp,
        "patches.ipynb",
        [
            HEAD,
            ROTATE,
            PATCH,
            'grade("rms", None)',
            'grade("rotate_half", rotate_half)',
        ],
    )
    folder = tmp / "submissions"
    folder.mkdir()
    (folder / "01_rmsnorm.ipynb").write_bytes(b"")  # an empty file
    (folder / "02_rope.ipynb").write_text('{"cells": [')  # cut short
    (folder / "03_gqa_repeat_kv.ipynb").write_text('{"a": 1}')  # JSON, not a notebook
    _notebook(
        folder, "04_swiglu.ipynb", [HEAD, ROTATE, 'grade("rotate_half", rotate_half)']
    )
    report = tmp / "report.json"
    paths = (SOLUTIONS[0], EXERCISES[0], dies, hangs, forges, patches, tampers, folder)
    options = ["--cell-timeout", "15", "--json", str(report), "--strict"]
    proc = subprocess.run(
        [sys.executable, "-m", "smol", "grade", *map(str, paths), *options],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    reports = json.loads(report.read_text())["notebooks"]
    return proc, {
        f"{Path(r['notebook']).parent.name}/{Path(r['notebook']).name}": r
        for r in reports
    }


def test_command_line_grades_fresh_kernels_and_survives_hostile_notebooks(command_line):
    proc, notebooks = command_line
    assert proc.returncode == 1, proc.stdout + proc.stderr  # --strict: below full marks
    solution, exercise = (
        notebooks["solutions/01_rmsnorm.ipynb"],
        notebooks["exercises/01_rmsnorm.ipynb"],
    )
    died, hung = (
        r
        for name, r in notebooks.items()
        if name.endswith(("/dies.ipynb", "/hangs.ipynb"))
    )
    full = sum(TASKS[t].points for t in ("rms", "rmsnorm", "rmsnorm_bug"))
    assert (
        solution["score"],
        solution["total"],
        exercise["score"],
        exercise["total"],
    ) == (full, full, 0, full)
    assert solution["status"] == "ok" and exercise["status"] == "ok"
    rms, rope = TASKS["rms"].points, TASKS["rope"].points  # never reached: zero
    assert (died["score"], died["total"]) == (ROTATE_POINTS, ROTATE_POINTS + rms)
    assert (hung["score"], hung["total"]) == (ROTATE_POINTS, ROTATE_POINTS + rope)
    assert "died" in died["status"] and "time limit" in hung["status"]
    assert all(c["passed"] for t in solution["tasks"] for c in t["checks"])


def test_invalid_notebooks_are_reported_and_the_rest_graded(command_line):
    proc, notebooks = command_line
    empty, cut, other = (
        notebooks[f"submissions/{name}.ipynb"]
        for name in ("01_rmsnorm", "02_rope", "03_gqa_repeat_kv")
    )
    assert (
        "01_rmsnorm.ipynb is empty" in empty["error"] and "invalid JSON" in cut["error"]
    )
    assert "JSON but not a Jupyter notebook" in other["error"]
    rope = sum(t.points for t in TASKS.values() if t.notebook == "rope")
    assert (empty["score"], cut["score"], cut["total"]) == (
        0,
        0,
        rope,
    )  # its tasks score zero
    assert all(r["status"].startswith("error: ") for r in (empty, cut, other))
    swiglu = notebooks["submissions/04_swiglu.ipynb"]  # graded after the broken ones
    assert swiglu["score"] == ROTATE_POINTS and "error" not in swiglu
    assert (
        "3 files could not be graded" in proc.stdout and "Traceback" not in proc.stderr
    )


def test_printed_or_displayed_results_are_not_counted(command_line):
    forged = next(r for n, r in command_line[1].items() if n.endswith("/forges.ipynb"))
    assert (forged["score"], forged["total"]) == (0, RMS_POINTS), forged


def test_patching_the_grader_in_the_notebook_gains_nothing(command_line):
    """The patch forges nothing; emptying its kernel's registry of checks, from which
    the probes run, costs the notebook the points of what it solves (rotate_half)."""
    patched = next(
        r for n, r in command_line[1].items() if n.endswith("/patches.ipynb")
    )
    scores = {t["task"]: (t["score"], t["total"]) for t in patched["tasks"]}
    assert scores == {"rms": (0, RMS_POINTS), "rotate_half": (0, ROTATE_POINTS)}, (
        patched
    )
    rotate = next(t for t in patched["tasks"] if t["task"] == "rotate_half")
    assert all(
        c["message"].startswith("the notebook's kernel could not run the check")
        for c in rotate["checks"]
    ), rotate


def test_a_notebook_that_tampers_with_its_probes_gains_nothing(command_line):
    """Its code rewrites the comparisons and the reference in the process that runs
    it; the judges run in the command's process, so only the shape (which it gets
    right) counts."""
    tampered = next(
        r for n, r in command_line[1].items() if n.endswith("/tampers.ipynb")
    )
    scores = {t["task"]: (t["score"], t["total"]) for t in tampered["tasks"]}
    assert scores == {"rms": (1, RMS_POINTS)}, tampered


def test_code_that_tampers_with_its_probe_earns_only_what_it_computes():
    namespace = {}
    exec(TAMPER, namespace)  # noqa: S102 - the notebook's cell, here
    saved = {name: getattr(torch, name) for name in ("equal", "allclose", "isclose")}
    result = run_checks("rms", namespace["rms"], isolate=True)
    assert all(getattr(torch, name) is f for name, f in saved.items())
    passed = [r.check for r in result.rows if r.passed]
    assert passed == [check_named("rms", "keeps the last dimension")], result.table()


def test_a_deleted_check_cell_still_counts_its_points(command_line):
    swiglu = command_line[1][
        "submissions/04_swiglu.ipynb"
    ]  # exercise 4's name, one other task
    want = (
        sum(t.points for t in TASKS.values() if t.notebook == "swiglu")
        + TASKS["rotate_half"].points
    )
    assert swiglu["total"] == want
    assert {t["task"]: t["graded"] for t in swiglu["tasks"]}["swiglu"] is False


def test_an_unwritable_report_path_is_refused_before_grading(tmp_path, capsys):
    from smol.commands.grade import main

    empty = tmp_path / "empty.ipynb"
    empty.write_bytes(b"")
    for where in (tmp_path, tmp_path / "missing" / "report.json"):
        start = time.monotonic()
        assert (
            main([str(empty), "--json", str(where)]) == 2
            and time.monotonic() - start < 5
        )
        err = capsys.readouterr().err
        assert f"cannot write the report to {where}" in err and "--json" in err, err
    assert not list(tmp_path.glob("missing*"))


def test_a_report_that_fails_late_still_shows_the_scores(tmp_path, capsys, monkeypatch):
    from smol.commands import grade as cli

    empty = tmp_path / "empty.ipynb"
    empty.write_bytes(b"")
    monkeypatch.setattr(
        cli, "report_problem", lambda path: ""
    )  # the folder vanished meanwhile
    assert cli.main([str(empty), "--json", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert "total" in out and "empty.ipynb is empty" in out
    assert f"could not write the report to {tmp_path}" in err and "Traceback" not in err


def test_grade_calls_name_the_object_graded():
    from smol.grading.runner import grade_calls

    source = (
        'x = 1\n%time grade("rope", apply_rope, timeout=30)\ngrade("rms")\n'
        'grade(obj=f, task_name="y")'
    )
    assert grade_calls(source) == [("rope", "apply_rope"), ("rms", "None")]
    assert grade_calls('grade("rms", rms') == [
        ("rms", None)
    ]  # does not parse: never ran


# --- other correct ways to write a piece pass too (no false alarms)
# --------------------------------


class DividingRMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x):
        h = x.float()
        normed = h / torch.sqrt(h.square().mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)  # cast back, then the weight (as HF)


def additive_mask_attention(q, k, v):
    n_rep, T = q.shape[1] // k.shape[1], q.shape[2]
    k, v = k.repeat_interleave(n_rep, 1), v.repeat_interleave(n_rep, 1)
    bias = torch.full((T, T), float("-inf"), dtype=q.dtype).triu(1)
    return torch.softmax(q @ k.mT * q.shape[-1] ** -0.5 + bias, dim=-1) @ v


def init_by_name(model):
    std, L = model.config.initializer_range, model.config.num_hidden_layers
    for name, p in model.named_parameters():  # a tied matrix is listed once
        if p.dim() == 1:
            nn.init.ones_(p)
        else:
            nn.init.normal_(
                p,
                std=std / math.sqrt(2 * L)
                if name.endswith(("o_proj.weight", "down_proj.weight"))
                else std,
            )


def hf_style_top_p(logits, p):
    sorted_logits, order = torch.sort(logits, descending=False)
    remove = sorted_logits.softmax(-1).cumsum(-1) <= 1 - p
    remove[..., -1] = False
    return logits.masked_fill(remove.scatter(-1, order, remove), float("-inf"))


def zero_after_step(model, optimizer, tokens):
    loss = F.cross_entropy(
        model(tokens[:, :-1])[0].flatten(0, 1), tokens[:, 1:].flatten()
    )
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


def generate_without_no_grad(model, ids, n, make_cache=None):
    """Greedy decoding with a cache from make_cache(model, B, length), by default
    KVCache.for_model's (the model's dtype and device)."""
    from smol.kv_cache import KVCache

    cache = (make_cache or KVCache.for_model)(model, ids.shape[0], ids.shape[1] + n)
    out, step = ids, ids
    for _ in range(n):
        step = model(step, kv_cache=cache)[0][:, -1:].argmax(-1)
        out = torch.cat([out, step], 1)
    return out


class ReorderedSwiGLU(MLP):
    """smol's SwiGLU with its layers registered in another order (down, up, gate) and
    silu written with tanh."""

    def __init__(self, config):
        super().__init__(config)
        for name in ("up_proj", "gate_proj"):  # moved to the end, in turn
            self.register_module(name, self._modules.pop(name))

    def forward(self, x):
        gate = self.gate_proj(x)
        return self.down_proj(self.up_proj(x) * gate * 0.5 * (1 + torch.tanh(gate / 2)))


def tie_by_reregistering(model):
    if model.config.tie_word_embeddings:
        del model.lm_head.weight
        model.lm_head.weight = model.get_submodule("model.embed_tokens").weight


def init_module_by_module(
    model,
):  # model.apply, children before parents, skipping the tied head
    std, L = model.config.initializer_range, model.config.num_hidden_layers
    shared = model.model.embed_tokens.weight

    def init(module):
        weight = getattr(module, "weight", None)
        if isinstance(module, RMSNorm):
            nn.init.constant_(weight, 1.0)
        elif isinstance(module, (nn.Linear, nn.Embedding)) and not (
            isinstance(module, nn.Linear) and weight is shared
        ):
            weight.data.normal_(
                0.0,
                std / (2 * L) ** 0.5 if getattr(module, "scaled_init", False) else std,
            )

    model.apply(init)


def next_token_batch_masked_fill(tokens, attention_mask=None):
    targets = tokens[:, 1:]
    if attention_mask is not None:
        targets = targets.masked_fill(~attention_mask[:, 1:].bool(), -100)
    return tokens[:, :-1].clone(), targets.clone()


def no_decay_group_first(model, weight_decay):
    named = sorted(model.named_parameters(), key=lambda item: item[0])
    return [
        {"params": [p for _, p in named if p.ndim == 1], "weight_decay": 0.0},
        {"params": [p for _, p in named if p.ndim > 1], "weight_decay": weight_decay},
    ]


def top_k_by_scatter(logits, k):
    values, index = logits.topk(min(k, logits.shape[-1]), dim=-1)
    return torch.full_like(logits, float("-inf")).scatter(-1, index, values)


def mask_causal_of_visible(attention_mask, T, offset=0):
    q, k = (
        torch.arange(offset, offset + T).view(-1, 1),
        torch.arange(offset + T).view(1, -1),
    )
    causal = (q >= k).view(1, 1, T, offset + T)
    if attention_mask is None:
        return causal
    return causal & (
        (attention_mask.view(attention_mask.shape[0], 1, 1, -1) != 0) | (q == k)
    )


def rope_by_slices(x, cos, sin):
    half = x.shape[-1] // 2
    h = x.float()
    rotated = torch.cat((-h[..., half:], h[..., :half]), dim=-1)
    return torch.addcmul(h * cos, rotated, sin).type_as(x)


def byte_map_by_filling():
    printable = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b], extra = chr(256 + extra), extra + 1
    return table


def merge_step_with_a_counter(word_counts, new_id):
    from collections import Counter

    pairs = Counter()
    for word, count in word_counts.items():
        for i in range(len(word) - 1):
            pairs[word[i], word[i + 1]] += count
    top = max(pairs.values())
    best = min(p for p, c in pairs.items() if c == top)
    merged = Counter()
    for word, count in word_counts.items():
        out, i = [], 0
        while i < len(word):
            if tuple(word[i : i + 2]) == best:
                out.append(new_id)
                i += 2
            else:
                out.append(word[i])
                i += 1
        merged[tuple(out)] += count
    return best, dict(merged)


def encode_in_the_callers_list(ids, ranks):  # merges only the lowest-ranked occurrence
    while True:
        ranked = [
            (ranks[p][0], i) for i, p in enumerate(zip(ids, ids[1:])) if p in ranks
        ]
        if not ranked:
            return ids
        _, i = min(ranked)
        ids[i : i + 2] = [ranks[ids[i], ids[i + 1]][1]]


def encode_one_pair_at_a_time(ids, ranks):  # the same, on a list of its own
    return encode_in_the_callers_list(list(ids), ranks)


def init_lora_by_bound(A, B):  # Kaiming-uniform with a = sqrt(5) is U(+-1/sqrt(in))
    with torch.no_grad():
        A.uniform_(-(A.shape[1] ** -0.5), A.shape[1] ** -0.5)
        B.zero_()


class LoRAByFLinear(nn.Module):  # B declared before A, F.linear instead of matmuls
    def __init__(self, base_layer, r, alpha):
        super().__init__()
        out_features, in_features = base_layer.weight.shape
        like = dict(dtype=base_layer.weight.dtype, device=base_layer.weight.device)
        self.lora_B = nn.Parameter(torch.zeros(out_features, r, **like))
        self.lora_A = nn.Parameter(torch.empty(r, in_features, **like))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        for p in base_layer.parameters():
            p.requires_grad = False
        self.base_layer, self.scaling = base_layer, alpha / r

    def forward(self, x):
        delta = F.linear(F.linear(x, self.lora_A), self.lora_B)
        return self.base_layer(x) + self.scaling * delta


def merge_into_a_copy(layer):
    import copy

    out = copy.deepcopy(layer.base_layer).requires_grad_(True)
    with torch.no_grad():
        out.weight += (
            torch.einsum("or,ri->oi", layer.lora_B, layer.lora_A) * layer.scaling
        )
    return out


def sft_targets_by_mask(ids, prompt_lens):
    positions = torch.arange(1, ids.shape[1])[None, :]  # the position each target has
    prompt = positions < torch.tensor(prompt_lens)[:, None]
    return ids[:, :-1], ids[:, 1:].masked_fill(prompt, -100)


def rope_tables_einsum(length, head_dim, theta):
    freqs = 1.0 / theta ** (
        torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim
    )
    angles = torch.einsum(
        "t,f->tf", torch.arange(length, dtype=torch.float32), freqs
    ).repeat(1, 2)
    return angles.cos(), angles.sin()


def lr_warmup_from_step_one(s, *, max_lr, warmup_steps, total_steps, min_lr=0.0):
    """Warmup reaching max_lr * (s + 1) / warmup_steps, then cosine decay."""
    if s < warmup_steps:
        return max_lr * (s + 1) / warmup_steps
    if s >= total_steps:
        return min_lr
    progress = (s - warmup_steps) / (total_steps - warmup_steps)
    return min_lr + (max_lr - min_lr) * 0.5 * (1 + math.cos(math.pi * progress))


def count_params_by_shapes(config):  # every matrix and vector listed, then summed
    V, C, F = config.vocab_size, config.hidden_size, config.intermediate_size
    q, kv = config.num_attention_heads, config.num_key_value_heads
    layer = [(q * config.head_dim, C), (kv * config.head_dim, C)] * 2  # q, k, v, o
    layer += [(F, C)] * 3 + [(C,)] * 2
    shapes = [(V, C), (C,)] + layer * config.num_hidden_layers
    shapes += [] if config.tie_word_embeddings else [(V, C)]
    return sum(math.prod(shape) for shape in shapes)


def forward_by_reduce(model, input_ids):  # the head as a matrix product, layers reduced
    from functools import reduce

    rope = model.model.rotary_emb(input_ids.shape[1], input_ids.device)
    x = F.embedding(input_ids, model.model.embed_tokens.weight)
    x = reduce(lambda h, layer: layer(h, *rope), model.model.layers, x)
    return model.model.norm(x) @ model.lm_head.weight.T


class KeywordDecoderLayer(nn.Module):  # modules registered MLP first, keyword calls
    def __init__(self, config, layer_idx=0):
        super().__init__()
        self.mlp = MLP(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer_idx=layer_idx)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, cos, sin, mask=None, is_causal=True, kv_cache=None):
        attended = self.self_attn(
            x=self.input_layernorm(x),
            cos=cos,
            sin=sin,
            mask=mask,
            is_causal=is_causal,
            kv_cache=kv_cache,
        )
        h = torch.add(x, attended)
        return torch.add(h, self.mlp(self.post_attention_layernorm(h)))


def quantize_by_reciprocal(weight):  # inf-norms, a multiplication, torch.where
    w = weight.to(torch.float32)
    peak = torch.linalg.vector_norm(w, ord=math.inf, dim=1)
    scale = torch.where(peak > 0, peak / 127, torch.ones_like(peak))
    return torch.round(w * (1 / scale)[:, None]).to(torch.int8), scale


def quantize_half_up(weight):  # floor(x + 0.5): ties go up, not to even
    w = weight.float()
    scale = torch.where(w.abs().amax(1) > 0, w.abs().amax(1) / 127, 1.0)
    return torch.floor(w / scale[:, None] + 0.5).clamp(-127, 127).to(torch.int8), scale


def int8_linear_einsum(x, q, scale):
    return torch.einsum("...i,oi->...o", x, q.to(x.dtype)) * scale.to(x.dtype)


def lookup_draft_in_python(tokens, max_ngram=3, num_draft=8):  # lists, from the right
    ids = tokens.tolist()
    for n in range(min(max_ngram, len(ids) - 1), 0, -1):
        tail = ids[-n:]
        starts = [i for i in range(len(ids) - n) if ids[i : i + n] == tail]
        if starts:
            start = starts[-1] + n
            return torch.tensor(ids[start : start + num_draft], dtype=torch.long)
    return torch.zeros(0, dtype=torch.long)


@torch.no_grad()
def speculative_by_smols_pieces(
    model, input_ids, max_new_tokens, num_draft=4, *, rollback=True, up_to_mismatch=True
):
    """smol's lookup_draft and accepted(), a fixed draft length, positions counted.
    rollback=False keeps the rejected tokens' keys and values in the cache;
    up_to_mismatch=False also keeps draft tokens that match after a mismatch."""
    from smol.kv_cache import KVCache
    from smol.speculative import accepted, lookup_draft

    T = input_ids.shape[1]
    cache = KVCache(model.config, 1, T + max_new_tokens + num_draft)
    out = input_ids[0].tolist()
    logits, _ = model(input_ids, kv_cache=cache)
    choice = logits[0, -1:].argmax(-1)
    while len(out) < T + max_new_tokens:
        out.append(int(choice[-1]))
        room = T + max_new_tokens - len(out)
        draft = lookup_draft(torch.tensor(out), 3, max(1, min(num_draft, room)))
        draft = draft[:room]
        if not room:
            break
        step = torch.tensor([out[-1], *draft.tolist()])[None]
        choice = model(step, kv_cache=cache)[0][0].argmax(-1)
        if up_to_mismatch:
            n = accepted(choice, draft)
        else:
            n = int((choice[:-1] == draft).sum())
        if rollback:
            cache.length -= len(draft) - n
        out += draft[:n].tolist()
        choice = choice[: n + 1]
    return torch.tensor(out)[None]


def merge_stats_in_logs(m_a, l_a, m_b, l_b):  # log-sum-exp of the two blocks
    m = torch.max(m_a, m_b)
    lse = torch.logaddexp(m_a + l_a.log(), m_b + l_b.log())
    return m, torch.where(m == -math.inf, 0.0, torch.exp(lse - m))


def tiled_attention_in_query_blocks(q, k, v, block_size, is_causal=False):
    """Blocks of queries too, the output kept normalised after every key block."""
    D, Tk = q.shape[-1], k.shape[2]
    outputs = []
    for i in range(0, q.shape[2], block_size):
        qb = q[:, :, i : i + block_size].float() * D**-0.5
        rows = torch.arange(i, i + qb.shape[2])[:, None]
        o = torch.zeros(*qb.shape)
        m = torch.full(qb.shape[:-1], -math.inf)
        total = torch.zeros(qb.shape[:-1])
        for j in range(0, Tk, block_size):
            s = torch.einsum("bhqd,bhkd->bhqk", qb, k[:, :, j : j + block_size].float())
            if is_causal:
                s = torch.where(torch.arange(j, j + s.shape[-1]) > rows, -math.inf, s)
            new = torch.maximum(m, s.amax(-1))
            safe = torch.where(new.isinf(), 0.0, new)
            p = (s - safe[..., None]).exp()
            grown = total * (m - safe).exp() + p.sum(-1)
            o = (o * (total * (m - safe).exp() / grown.clamp(min=1e-30))[..., None]) + (
                p @ v[:, :, j : j + block_size].float()
            ) / grown.clamp(min=1e-30)[..., None]
            m, total = new, grown
        outputs.append(o)
    return torch.cat(outputs, 2).to(q.dtype)


def pack_value_by_numpy(kind, value):
    import numpy as np

    from smol.gguf import STRING, VALUE_FORMATS

    if kind == STRING:
        data = value.encode("utf-8")
        return np.uint64(len(data)).tobytes() + data
    if isinstance(kind, tuple):
        head = np.uint32(kind[1]).tobytes() + np.uint64(len(value)).tobytes()
        return head + b"".join(pack_value_by_numpy(kind[1], v) for v in value)
    return np.array(value, np.dtype(VALUE_FORMATS[kind])).tobytes()


def q8_0_by_the_gguf_package(w):
    import gguf

    # numpy has no bfloat16: float32, as ggml converts a bfloat16 weight
    blocks = gguf.quants.quantize(w.float().numpy(), gguf.GGMLQuantizationType.Q8_0)
    return torch.from_numpy(blocks)


def permute_qk_by_index(w, n_heads):
    d = w.shape[0] // n_heads
    perm = torch.stack([torch.arange(d // 2), torch.arange(d // 2) + d // 2], -1)
    rows = torch.arange(n_heads)[:, None] * d + perm.flatten()  # (n_heads, d)
    return w[rows.flatten()]


def tensor_info_in_one_pack(name, shape, qtype, offset):
    data, n = name.encode(), len(shape)
    return struct.pack(
        f"<Q{len(data)}sI{n}QIQ", len(data), data, n, *reversed(shape), qtype, offset
    )


def sequence_logprobs_by_mask(logits, targets):  # log_softmax, gather, a mask
    reply = targets != -100
    logp = logits.float().log_softmax(-1)
    picked = logp.gather(-1, torch.where(reply, targets, 0).unsqueeze(-1))[..., 0]
    return (picked * reply).sum(dim=1)


def dpo_loss_by_softplus(pc, pr, rc, rr, beta):  # -log sigmoid(x) = softplus(-x)
    with torch.no_grad():
        chosen_rewards, rejected_rewards = beta * (pc - rc), beta * (pr - rr)
    margin = (pc - pr) - (rc - rr).detach()
    return F.softplus(-beta * margin).mean(), chosen_rewards, rejected_rewards


def dpo_batch_loss_by_chunks(policy_logits, ref_logits, targets, beta):
    from smol.dpo import sequence_logprobs

    chosen, rejected = sequence_logprobs(policy_logits, targets).chunk(2)
    ref_chosen, ref_rejected = sequence_logprobs(ref_logits, targets).detach().chunk(2)
    return dpo_loss_by_softplus(chosen, rejected, ref_chosen, ref_rejected, beta)


def advantages_by_rearrange(rewards, group_size):  # einops, the std written out
    from einops import rearrange

    at_least_two(group_size)
    grouped = rearrange(rewards, "(p g) -> p g", g=group_size)
    centred = grouped - grouped.mean(-1, keepdim=True)
    std = (centred.square().sum(-1, keepdim=True) / (group_size - 1)).sqrt()
    return rearrange(centred / (std + 1e-4), "p g -> (p g)")


def grpo_loss_by_rows(
    logps,
    old,
    ref,
    advantages,
    completion_mask,
    loss_type="grpo",
    beta=0.0,
    epsilon_low=0.2,
    epsilon_high=0.2,
):  # each completion's real tokens on their own; the clip as a where on A's sign
    losses = []
    for b in range(len(logps)):
        real = completion_mask[b].bool()
        logp, A = logps[b][real], advantages[b]
        w = torch.exp(logp - old[b][real])
        bound = (
            w.clamp_max(1 + epsilon_high) if A >= 0 else w.clamp_min(1 - epsilon_low)
        )
        objective = bound * A
        d = ref[b][real] - logp
        kl = beta * (d.exp() - d - 1) if beta else 0.0  # none at beta 0, as TRL's
        losses.append(-objective + kl)
    if loss_type == "grpo":
        return torch.stack([row.mean() for row in losses]).mean()
    total = torch.cat(losses).sum()
    if loss_type == "dapo":
        return total / sum(len(row) for row in losses)
    return total / completion_mask.numel()


def grpo_batch_loss_by_max(logps, old, ref, rewards, mask, group_size, beta):
    from einops import rearrange

    r = rearrange(rewards, "(p g) -> p g", g=group_size)
    A = ((r - r.mean(-1, keepdim=True)) / (r.std(-1, keepdim=True) + 1e-4)).view(-1, 1)
    w = (logps - old).exp()
    d = ref - logps
    per_token = torch.max(-w * A, -w.clamp(0.8, 1.2) * A) + beta * (d.exp() - d - 1)
    return (per_token.masked_fill(mask == 0, 0).sum(-1) / mask.sum(-1)).mean()


def _variants():
    from einops import repeat

    return {  # task: a correct implementation written differently from the solution
        "rms": lambda x, eps: x.square().mean(-1, keepdim=True).add(eps).sqrt(),
        "rmsnorm": DividingRMSNorm,
        "rmsnorm_bug": DividingRMSNorm,
        "rope_frequencies": lambda d, theta: (
            theta ** (-torch.arange(0, d, 2).float() / d)
        ),
        "rope_tables": rope_tables_einsum,
        "rotate_half": lambda x: (
            torch.stack(x.chunk(2, -1)[::-1], -2)
            .mul(torch.tensor([-1.0, 1.0]).view(2, 1))
            .flatten(-2)
        ),
        "rope": rope_by_slices,
        "rope_bug": rope_by_slices,
        "repeat_kv": lambda x, n: repeat(x, "b h t d -> b (h r) t d", r=n),
        "repeat_kv_bug": lambda x, n: x.repeat_interleave(n, dim=1),
        "gqa_attention": additive_mask_attention,
        "silu": lambda x: x * 0.5 * (1 + torch.tanh(x / 2)),
        "swiglu": ReorderedSwiGLU,
        "swiglu_bug": ReorderedSwiGLU,
        "tie_weights": tie_by_reregistering,
        "init_weights": init_by_name,
        "init_bug": init_module_by_module,
        "next_token_batch": next_token_batch_masked_fill,
        "lr_schedule": lr_warmup_from_step_one,
        "param_groups": no_decay_group_first,
        "train_step_bug": zero_after_step,
        "filter_top_k": top_k_by_scatter,
        "filter_top_p": hf_style_top_p,
        "kv_generate": generate_without_no_grad,
        "attention_mask_bug": mask_causal_of_visible,
        "byte_map": byte_map_by_filling,
        "merge_step": merge_step_with_a_counter,
        "bpe_encode": encode_one_pair_at_a_time,
        "bpe_bug": encode_one_pair_at_a_time,
        "lora_init": init_lora_by_bound,
        "lora_linear": LoRAByFLinear,
        "lora_merge": merge_into_a_copy,
        "sft_targets_bug": sft_targets_by_mask,
        "count_params": count_params_by_shapes,
        "forward_logits": forward_by_reduce,
        "decoder_layer_bug": KeywordDecoderLayer,
        "quantize_int8": quantize_by_reciprocal,
        "quantize_bug": quantize_half_up,
        "int8_linear": int8_linear_einsum,
        "lookup_draft": lookup_draft_in_python,
        "speculative_greedy": speculative_by_smols_pieces,
        "merge_stats": merge_stats_in_logs,
        "tiled_attention": tiled_attention_in_query_blocks,
        "tiled_attention_bug": tiled_attention_by,
        "gguf_value": pack_value_by_numpy,
        "q8_0": q8_0_by_the_gguf_package,
        "permute_qk": permute_qk_by_index,
        "tensor_info_bug": tensor_info_in_one_pack,
        "answer_logprobs": answer_logprobs_by_cross_entropy,
        "answer_logprobs_bug": answer_logprobs_by_cross_entropy,
        "choice_score": choice_score_by_loop,
        "sequence_logprobs": sequence_logprobs_by_mask,
        "dpo_loss": dpo_loss_by_softplus,
        "dpo_batch_bug": dpo_batch_loss_by_chunks,
        "group_advantages": advantages_by_rearrange,
        "grpo_loss": grpo_loss_by_rows,
        "grpo_batch_bug": grpo_batch_loss_by_max,
    }


COURSE_TOPICS = tuple(NOTEBOOKS)  # every exercise of the course


def test_every_task_has_a_correct_variant_written_differently():
    tasks = {t.name for t in TASKS.values() if t.notebook in COURSE_TOPICS}
    assert tasks <= set(_variants()), tasks - set(_variants())


@pytest.mark.parametrize("task", sorted(_variants()))
def test_other_correct_implementations_score_full_marks(task):
    result = run_checks(task, _variants()[task])
    assert result.score == result.total, result.table()


@pytest.mark.parametrize(
    "task, variant",
    grading_mutants_fresh.CORRECT,
    ids=[f"{t}-{v.__name__}" for t, v in grading_mutants_fresh.CORRECT],
)
def test_rewrites_beside_the_strengthened_checks_keep_full_marks(task, variant):
    """Each check strengthened against a mutant of grading_mutants_fresh.py still
    gives these correct rewrites full marks."""
    result = run_checks(task, variant)
    assert result.score == result.total, result.table()


# --- hole classes: each kind of leak a check can have, a mutant that went through it
# (full marks before the check was fixed), and a correct variant that still passes
# ----------------------------------------------------------------------------------


def repeat_kv_into_float32(x, n_rep):  # a fresh torch.empty is float32
    B, H, T, D = x.shape
    out = torch.empty(B, H * n_rep, T, D)
    for h in range(H * n_rep):
        out[:, h] = x[:, h // n_rep]
    return out


def attention_in_float32(q, k, v):  # right values, float32 for bfloat16 inputs
    q, k, v = q.float(), k.float(), v.float()
    return additive_mask_attention(q, k, v)


def silu_in_float32(x):
    x = x.float()
    return x * torch.sigmoid(x)


class Float32LoRALinear(nn.Module):  # float32 adapters whatever the base's dtype
    def __init__(self, base_layer, r, alpha):
        super().__init__()
        self.base_layer = base_layer.requires_grad_(False)
        self.lora_A = nn.Parameter(torch.empty(r, base_layer.in_features))
        self.lora_B = nn.Parameter(torch.zeros(base_layer.out_features, r))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.scaling = alpha / r

    def forward(self, x):
        delta = x.float() @ self.lora_A.T @ self.lora_B.T
        return self.base_layer(x) + delta * self.scaling


def merge_into_float32(layer):  # nn.Linear's default dtype
    base = layer.base_layer
    out = nn.Linear(base.in_features, base.out_features, bias=base.bias is not None)
    with torch.no_grad():
        delta = layer.lora_B.float() @ layer.lora_A.float()
        out.weight.copy_(base.weight.float() + layer.scaling * delta)
        if base.bias is not None:
            out.bias.copy_(base.bias)
    return out


def generate_with_a_float32_cache(model, ids, n):  # KVCache's default dtype
    from smol.kv_cache import KVCache

    return generate_without_no_grad(
        model, ids, n, lambda m, B, length: KVCache(m.config, B, length)
    )


def rope_tables_theta_ignored(length, head_dim, theta):  # 10000 whatever theta says
    freqs = 1.0 / 10000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim)
    angles = torch.outer(torch.arange(length).float(), freqs)
    angles = torch.cat((angles, angles), -1)
    return angles.cos(), angles.sin()


def attention_by_integer_root(q, k, v):  # math.isqrt(4) == sqrt(4), isqrt(6) is not
    n_rep, T = q.shape[1] // k.shape[1], q.shape[2]
    k, v = k.repeat_interleave(n_rep, 1), v.repeat_interleave(n_rep, 1)
    scores = q @ k.mT / math.isqrt(q.shape[-1])
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf)
    return scores.softmax(-1) @ v


class FourTimesWideMLP(MLP):  # GPT-2's 4 C, whatever the config says
    def __init__(self, config):
        super().__init__(config.replace(intermediate_size=4 * config.hidden_size))


def init_scaled_by_half_the_depth(model):  # L / 2 equals sqrt(2 L) at L = 8
    std, L = model.config.initializer_range, model.config.num_hidden_layers
    for name, p in model.named_parameters():
        if p.dim() == 1:
            nn.init.ones_(p)
        else:
            scaled = name.endswith(("o_proj.weight", "down_proj.weight"))
            nn.init.normal_(p, std=std / (L / 2) if scaled else std)


def lr_min_a_tenth(step, *, max_lr, warmup_steps, total_steps, min_lr=0.0):
    min_lr = max_lr / 10  # a common choice, hard-coded over the argument
    if step < warmup_steps:
        return max_lr * step / warmup_steps
    if step >= total_steps:
        return min_lr
    progress = min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))
    return min_lr + (max_lr - min_lr) * 0.5 * (1 + math.cos(math.pi * progress))


def groups_decay_fixed(model, weight_decay):  # 0.1 whatever the argument
    params = list(model.parameters())
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


class FloorScaledLoRALinear(LoRAByFLinear):  # alpha // r: right while r divides alpha
    def __init__(self, base_layer, r, alpha):
        super().__init__(base_layer, r, alpha)
        self.scaling = alpha // r


def merge_floor_scaled(layer):
    out = merge_into_a_copy(layer)
    with torch.no_grad():
        delta = layer.lora_B @ layer.lora_A
        out.weight.copy_(layer.base_layer.weight + (layer.alpha // layer.r) * delta)
    return out


def loss_after_the_step(model, optimizer, tokens):  # hidden by a learning rate of 0
    optimizer.zero_grad()
    model(tokens[:, :-1], targets=tokens[:, 1:])[1].backward()
    optimizer.step()
    with torch.no_grad():
        return model(tokens[:, :-1], targets=tokens[:, 1:])[1].item()


def batch_right_padding_only(tokens, attention_mask=None):  # padding after the tokens
    inputs, targets = tokens[:, :-1], tokens[:, 1:].clone()
    if attention_mask is not None:
        for b, n in enumerate(attention_mask.sum(1).tolist()):
            targets[b, n - 1 :] = -100
    return inputs, targets


def _positions(T, offset):
    return torch.arange(offset, offset + T)[:, None], torch.arange(offset + T)[None, :]


def mask_left_padding_only(attention_mask, T, offset=0):  # padding before the tokens
    q, k = _positions(T, offset)
    causal = (k <= q)[None, None]
    if attention_mask is None:
        return causal
    pad = (attention_mask.shape[1] - attention_mask.sum(1))[:, None, None, None]
    return causal & (k >= pad) | (k == q)


def mask_offset_ignored_when_padded(attention_mask, T, offset=0):
    q, k = _positions(T, offset)
    if attention_mask is None:
        return (k <= q)[None, None]
    q = torch.arange(T)[:, None]  # as if nothing were cached
    return (k <= q)[None, None] & attention_mask.bool()[:, None, None, :] | (k == q)


def mask_hiding_all_but_itself(attention_mask, T, offset=0):
    q, k = _positions(T, offset)
    if attention_mask is None:
        return (k <= q)[None, None]
    return (k == q)[None, None].expand(len(attention_mask), 1, T, offset + T)


class DetachedInputLoRALinear(LoRAByFLinear):  # A and B still get their gradients
    def forward(self, x):
        delta = F.linear(F.linear(x.detach(), self.lora_A), self.lora_B)
        return self.base_layer(x) + self.scaling * delta


def rms_of_detached(x, eps):
    return torch.sqrt(x.detach().pow(2).mean(-1, keepdim=True) + eps)


def init_with_a_seed_per_matrix(model):  # every matrix the same numbers, rescaled
    std, L = model.config.initializer_range, model.config.num_hidden_layers
    for name, p in model.named_parameters():
        torch.manual_seed(0)
        if p.dim() == 1:
            nn.init.ones_(p)
        else:
            scaled = name.endswith(("o_proj.weight", "down_proj.weight"))
            nn.init.normal_(p, std=std / math.sqrt(2 * L) if scaled else std)


def init_lora_seeded(A, B):  # every adapter of a model the same A
    torch.manual_seed(0)
    init_lora_by_bound(A, B)


def top_p_in_place(logits, p):
    remove = hf_style_top_p(logits, p) == -math.inf
    logits[remove] = -math.inf
    return logits


class InPlaceRMSNorm(RMSNorm):  # normalises the residual stream itself
    def forward(self, x):
        return x.mul_(torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)).mul_(
            self.weight
        )


def _merge_step_counting(pairs_of):
    """A merge step whose pair counts come from pairs_of(word); right otherwise."""
    from smol.bpe import merge

    def merge_step(word_counts, new_id):
        pairs = {}
        for word, count in word_counts.items():
            for pair in pairs_of(word):
                pairs[pair] = pairs.get(pair, 0) + count
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merged = {}
        for word, count in word_counts.items():
            key = tuple(merge(list(word), best, new_id))
            merged[key] = merged.get(key, 0) + count
        return best, merged

    return merge_step


def _non_overlapping(word):  # (7, 7, 7) holds one (7, 7), as str.count would say
    i = 0
    while i < len(word) - 1:
        yield word[i], word[i + 1]
        i += 2 if word[i] == word[i + 1] else 1


merge_step_counting_pairs_once = _merge_step_counting(
    lambda word: set(zip(word, word[1:]))
)
merge_step_without_overlaps = _merge_step_counting(_non_overlapping)


def int8_linear_in_float32(x, q, scale):
    return x.float() @ q.float().T * scale


def tiled_attention_in_float32(q, k, v, block_size, is_causal=False):
    return tiled_attention_by(q.float(), k.float(), v.float(), block_size, is_causal)


def quantize_in_the_weights_dtype(weight):  # a bfloat16 scale for a bfloat16 weight
    scale = weight.abs().amax(dim=1).clamp(min=1e-12) / 127
    return torch.round(weight / scale[:, None]).to(torch.int8), scale


def count_params_with_smollm2s_ratios(config):  # k, v: C / 3 each, as in SmolLM2-135M
    V, C, F, L = (
        config.vocab_size,
        config.hidden_size,
        config.intermediate_size,
        config.num_hidden_layers,
    )
    layer = 2 * C * C + 2 * C * (C // 3) + 3 * C * F + 2 * C
    return V * C * (1 if config.tie_word_embeddings else 2) + L * layer + C


def lookup_draft_of_trigrams(tokens, max_ngram=3, num_draft=8):  # max_ngram ignored
    return lookup_draft_in_python(tokens, 3, num_draft)


def attention_in_one_block(q, k, v, block_size, is_causal=False):  # block_size unused
    return tiled_attention_by(q, k, v, k.shape[2], is_causal)


def int8_linear_scaling_inputs(x, q, scale):  # right only where in == out
    return (x * scale.to(x.dtype)) @ q.to(x.dtype).T


def lookup_draft_after_the_start(tokens, max_ngram=3, num_draft=8):
    ids = tokens.tolist()
    for n in range(min(max_ngram, len(ids) - 1), 0, -1):
        starts = [i for i in range(1, len(ids) - n) if ids[i : i + n] == ids[-n:]]
        if starts:
            return tokens[starts[-1] + n : starts[-1] + n + num_draft]
    return tokens[:0]


def tiled_attention_detached_keys(q, k, v, block_size, is_causal=False):
    return tiled_attention_by(q, k.detach(), v, block_size, is_causal)


def forward_without_grad(model, input_ids):
    with torch.no_grad():
        return forward_by_reduce(model, input_ids)


class DetachedResidualDecoderLayer(KeywordDecoderLayer):  # x's own path cut
    def forward(self, x, cos, sin, mask=None, is_causal=True, kv_cache=None):
        h = self.input_layernorm(x)
        x = x.detach() + self.self_attn(h, cos, sin, mask, is_causal, kv_cache)
        return x + self.mlp(self.post_attention_layernorm(x))


def quantize_dividing_in_place(weight):  # float() of a float32 weight is the weight
    w = weight.float()
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127
    return torch.round(w.div_(scale[:, None])).to(torch.int8), scale


class InPlaceResidualDecoderLayer(KeywordDecoderLayer):  # x += writes into the caller's
    def forward(self, x, cos, sin, mask=None, is_causal=True, kv_cache=None):
        h = self.input_layernorm(x)
        x += self.self_attn(h, cos, sin, mask, is_causal, kv_cache)
        return x + self.mlp(self.post_attention_layernorm(x))


def forward_with_the_embedding_as_head(model, input_ids):  # right while tied
    cos, sin = model.model.rotary_emb(input_ids.shape[1], input_ids.device)
    x = model.model.embed_tokens(input_ids)
    for layer in model.model.layers:
        x = layer(x, cos, sin)
    return model.model.norm(x) @ model.model.embed_tokens.weight.T


class LayerIdxDroppedDecoderLayer(KeywordDecoderLayer):  # every layer writes slot 0
    def __init__(self, config, layer_idx=0):
        super().__init__(config)


def tiled_attention_aligned_to_the_last_key(q, k, v, block_size, is_causal=False):
    return tiled_attention_by(q, k, v, block_size, is_causal, last_key_aligned=True)


def tiled_attention_max_from_zero(q, k, v, block_size, is_causal=False):
    return tiled_attention_by(q, k, v, block_size, is_causal, max_start=0.0)


def answer_logprobs_in_the_logits_dtype(logits, ids, n_context):  # no float32 upcast
    logp = logits[n_context - 1 : -1].log_softmax(-1)
    return logp.gather(-1, ids[n_context:, None]).squeeze(-1)


def choice_score_in_the_logits_dtype(logits, ids, n_context, normalise):
    logp = answer_logprobs_in_the_logits_dtype(logits, ids, n_context)
    return logp.mean() if normalise else logp.sum()


def permute_qk_in_place(w, n_heads):  # the exporter's w is the model's parameter
    from smol.gguf import permute_qk

    return w.copy_(permute_qk(w, n_heads))


def q8_0_scaling_w_in_place(w):  # blocks is a view of a float32 w
    rows = w.shape[0]
    blocks = w.float().reshape(-1, 32)
    d = blocks.abs().amax(dim=1, keepdim=True) / 127
    blocks *= torch.where(d == 0, 0.0, 1 / d)
    q = round_half_away(blocks).to(torch.int8)
    return torch.cat([d.half().view(torch.uint8), q.view(torch.uint8)], 1).view(
        rows, -1
    )


def rotate_half_in_place(x):  # the halves swapped inside the caller's x
    half = x.shape[-1] // 2
    first = x[..., :half].clone()
    x[..., :half] = -x[..., half:]
    x[..., half:] = first
    return x


def lr_warmup_through_its_last_step(step, **schedule):  # step <= warmup_steps
    if step <= schedule["warmup_steps"] and step < schedule["total_steps"]:
        return schedule["max_lr"] * step / schedule["warmup_steps"]
    return lr_warmup_from_step_one(step, **schedule)


@torch.no_grad()
def generate_from_the_prefill_first(model, ids, n):  # one token before the loop
    from smol.kv_cache import KVCache

    cache = KVCache.for_model(model, ids.shape[0], ids.shape[1] + n)
    step = model(ids, kv_cache=cache)[0][:, -1:].argmax(-1)  # (B, 1)
    out = torch.cat([ids, step], 1)
    for _ in range(n - 1):
        step = model(step, kv_cache=cache)[0][:, -1:].argmax(-1)
        out = torch.cat([out, step], 1)
    return out


def speculative_with_a_token_unasked(model, ids, n):  # the prefill's token always
    return speculative_by_smols_pieces(model, ids, max(n, 1))


def logprobs_by_log_of_softmax(logits, targets):  # -inf for a probability of 1e-70
    p = logits.float().softmax(-1).gather(-1, targets.clamp(min=0)[..., None])
    return torch.where(targets != -100, p.squeeze(-1).log(), 0.0).sum(-1)


def advantages_over_std_floored(rewards, group_size):  # max(std, 1e-4), not std + 1e-4
    return _advantages_by(
        rewards, group_size, lambda g: g.std(1, keepdim=True).clamp(min=1e-4)
    )


def grpo_loss_over_the_longest(logps, old, ref, advantages, mask, **options):
    """dr_grpo divided by B times the longest completion, not B * T."""
    loss = grpo_loss_by(logps, old, ref, advantages, mask, **options)
    if options.get("loss_type") != "dr_grpo":
        return loss
    return loss * mask.numel() / (len(mask) * mask.sum(-1).max())


def advantages_by_std_mean(rewards, group_size):  # its mean may round the other way
    at_least_two(group_size)
    grouped = rewards.view(-1, group_size)
    std, mean = torch.std_mean(grouped, dim=1, keepdim=True)
    return ((grouped - mean) / (std + 1e-4)).view(-1)


HOLES = {  # hole class: [(task, mutant, the check made for it)]
    "dtype: float32 out for bfloat16 in": [
        ("repeat_kv", repeat_kv_into_float32, "shape (B, H_kv * n_rep"),
        ("gqa_attention", attention_in_float32, "shape: (B, H, T, D)"),
        ("silu", silu_in_float32, "values: x * sigmoid(x)"),
        ("lora_linear", Float32LoRALinear, "a bfloat16 base layer"),
        ("lora_merge", merge_into_float32, "a bfloat16 layer merges"),
        ("quantize_int8", quantize_in_the_weights_dtype, "q is int8"),
        ("int8_linear", int8_linear_in_float32, "bfloat16 activations"),
        ("tiled_attention", tiled_attention_in_float32, "shape (B, H, Tq, D)"),
        ("kv_generate", generate_with_a_float32_cache, "a bfloat16 model"),
    ],
    "sweep: sizes and values that cannot tell formulas apart": [
        ("rope_tables", rope_tables_theta_ignored, "values equal smol's"),
        ("gqa_attention", attention_by_integer_root, "values equal SDPA"),
        ("swiglu", FourTimesWideMLP, "gate_proj, up_proj"),
        ("init_weights", init_scaled_by_half_the_depth, "o_proj and down_proj"),
        ("lr_schedule", lr_min_a_tenth, "cosine decay"),
        ("param_groups", groups_decay_fixed, "weight decay on matrices"),
        ("lora_linear", FloorScaledLoRALinear, "forward is base(x)"),
        ("lora_merge", merge_floor_scaled, "the merged nn.Linear computes"),
        ("train_step_bug", loss_after_the_step, "the loss is next-token prediction"),
        ("count_params", count_params_with_smollm2s_ratios, "equals SmolLM's count"),
        ("lookup_draft", lookup_draft_of_trigrams, "the longest n-gram first"),
        ("sequence_logprobs", logprobs_by_log_of_softmax, "bfloat16 logits"),
        ("group_advantages", advantages_over_std_floored, "std + 1e-4"),
        ("grpo_loss", grpo_loss_over_the_longest, "grpo, dapo, dr_grpo"),
        ("tiled_attention", attention_in_one_block, "never holds a Tq x Tk"),
        ("int8_linear", int8_linear_scaling_inputs, "values: x @ (q * scale)"),
    ],
    "boundaries: nothing asked for (no warmup, no new tokens)": [
        ("lr_schedule", lr_warmup_through_its_last_step, "no warmup"),
        ("kv_generate", generate_from_the_prefill_first, "max_new_tokens = 0"),
        ("speculative_greedy", speculative_with_a_token_unasked, "returns (1, T"),
    ],
    "one side only": [
        ("next_token_batch", batch_right_padding_only, "targets that are padding"),
        ("attention_mask_bug", mask_left_padding_only, "real tokens see every"),
        ("attention_mask_bug", mask_offset_ignored_when_padded, "real tokens see"),
        ("attention_mask_bug", mask_hiding_all_but_itself, "real tokens see every"),
        ("lookup_draft", lookup_draft_after_the_start, "an occurrence at the very"),
    ],
    "gradients: a detached input": [
        ("lora_linear", DetachedInputLoRALinear, "gradients for x, A and B"),
        ("rms", rms_of_detached, "values and gradients"),
        ("forward_logits", forward_without_grad, "gradients for every parameter"),
        ("decoder_layer_bug", DetachedResidualDecoderLayer, "gradients for x"),
        ("tiled_attention", tiled_attention_detached_keys, "gradients for q, k and v"),
    ],
    "configurations: one only (tied, layer 0, Tq == Tk, float32, mixed signs)": [
        ("forward_logits", forward_with_the_embedding_as_head, "an untied head"),
        ("decoder_layer_bug", LayerIdxDroppedDecoderLayer, "layer_idx reaches"),
        ("tiled_attention", tiled_attention_aligned_to_the_last_key, "causal"),
        ("tiled_attention", tiled_attention_max_from_zero, "large scores"),
        ("answer_logprobs", answer_logprobs_in_the_logits_dtype, "log-probabilities"),
        (
            "answer_logprobs_bug",
            answer_logprobs_in_the_logits_dtype,
            "log-probabilities",
        ),
        ("choice_score", choice_score_in_the_logits_dtype, "bfloat16 logits"),
    ],
    "state: copies and in-place writes": [
        ("permute_qk", permute_qk_in_place, "w is left unchanged"),
        ("q8_0", q8_0_scaling_w_in_place, "w is left unchanged"),
        ("rotate_half", rotate_half_in_place, "x is left unchanged"),
        ("bpe_encode", encode_in_the_callers_list, "the caller's ids"),
        ("bpe_bug", encode_in_the_callers_list, "the caller's ids"),
        ("init_weights", init_with_a_seed_per_matrix, "every matrix draws"),
        ("lora_init", init_lora_seeded, "two adapters get different A"),
        ("filter_top_p", top_p_in_place, "leaves its input unchanged"),
        ("rmsnorm", InPlaceRMSNorm, "float32 values equal smol's"),
        ("quantize_int8", quantize_dividing_in_place, "the weight is left unchanged"),
        ("decoder_layer_bug", InPlaceResidualDecoderLayer, "with trained norm gains"),
    ],
    "counting: pairs repeated or overlapping in a word": [
        ("merge_step", merge_step_counting_pairs_once, "merges the pair that occurs"),
        ("merge_step", merge_step_without_overlaps, "merges the pair that occurs"),
    ],
}
# A module or product of the wrong size cannot compute the right values, and an
# in-place write into a leaf breaks its gradient: these lose more than the check made
# for them.
LOSE_MORE = {
    FourTimesWideMLP,
    InPlaceRMSNorm,
    int8_linear_scaling_inputs,
    InPlaceResidualDecoderLayer,
}


@pytest.mark.parametrize(
    "hole, index",
    [(hole, i) for hole, cases in HOLES.items() for i in range(len(cases))],
    ids=lambda v: v if isinstance(v, str) else str(v),
)
def test_a_mutant_through_a_former_hole_loses_its_check(hole, index):
    task, mutant, check = HOLES[hole][index]
    result = run_checks(task, mutant)
    lost = {row.check for row in result.rows if not row.passed}
    made_for_it = check_named(task, check)
    if mutant in LOSE_MORE:
        assert made_for_it in lost, result.table()
    else:
        assert beyond_generated(task, lost) == {made_for_it}, result.table()


HOLE_VARIANTS = {  # hole class: tasks whose correct variant (_variants) written
    # differently from the solution keeps full marks through the fixed checks
    "dtype: float32 out for bfloat16 in": [
        "repeat_kv",
        "gqa_attention",
        "silu",
        "lora_linear",
        "lora_merge",
        "quantize_int8",
        "int8_linear",
        "tiled_attention",
        "kv_generate",
    ],
    "sweep: sizes and values that cannot tell formulas apart": [
        "rope_tables",
        "swiglu",
        "init_weights",
        "lr_schedule",
        "param_groups",
        "train_step_bug",
        "count_params",
        "lookup_draft",
        "tiled_attention",
        "int8_linear",
        "sequence_logprobs",
        "group_advantages",
        "grpo_loss",
    ],
    "boundaries: nothing asked for (no warmup, no new tokens)": [
        "lr_schedule",
        "kv_generate",
        "speculative_greedy",
    ],
    "one side only": ["next_token_batch", "attention_mask_bug", "lookup_draft"],
    "gradients: a detached input": [
        "rms",
        "lora_linear",
        "forward_logits",
        "decoder_layer_bug",
        "tiled_attention",
    ],
    "configurations: one only (tied, layer 0, Tq == Tk, float32, mixed signs)": [
        "forward_logits",
        "decoder_layer_bug",
        "tiled_attention",
        "answer_logprobs",
        "answer_logprobs_bug",
        "choice_score",
    ],
    "state: copies and in-place writes": [
        "permute_qk",
        "q8_0",
        "rotate_half",
        "bpe_encode",
        "bpe_bug",
        "init_weights",
        "init_bug",
        "lora_init",
        "filter_top_p",
        "rmsnorm",
        "quantize_int8",
        "decoder_layer_bug",
    ],
    "counting: pairs repeated or overlapping in a word": ["merge_step"],
}


@pytest.mark.parametrize("hole", sorted(HOLE_VARIANTS))
def test_correct_variants_keep_full_marks_through_each_hole_class(hole):
    assert set(HOLE_VARIANTS) == set(HOLES)
    for task in HOLE_VARIANTS[hole]:
        result = run_checks(task, _variants()[task])
        assert result.score == result.total, result.table()


def test_advantages_whose_group_mean_rounds_the_other_way_keep_full_marks():
    """Rewards equal up to rounding: torch.std_mean's mean is the other float32
    neighbour of the exact one, and its advantages (+-1e-3, near 0) are as right."""
    result = run_checks("group_advantages", advantages_by_std_mean)
    assert result.score == result.total, result.table()


def test_the_library_silu_loses_only_the_written_by_hand_check():
    assert failed("silu", F.silu) == {check_named("silu", "written by hand")}


def test_the_mask_reference_is_smols_mask():
    from smol import SmolLM
    from smol.grading.checks.attention_mask import PADDED, _reference_mask

    for am, T, offset in ((PADDED, 6, 0), (PADDED, 2, 4), (None, 3, 4)):
        B = len(am) if am is not None else 1
        # uses no state
        mask, _ = SmolLM._attention_mask(None, am, B, T, offset, torch.device("cpu"))
        assert torch.equal(
            mask.expand(B, 1, T, offset + T),
            _reference_mask(am, T, offset).expand(B, 1, T, offset + T),
        )


def test_preview_hides_hints_and_tables_need_no_emoji(capsys):
    """A "find the bug" preview shows which checks fail and how, not the hint that names
    the fix; a graded attempt shows the hints. The HTML table marks rows with words,
    which every font has, not emoji, which show as empty boxes where no emoji font is
    installed."""
    wrong = lambda x, eps=1e-5: x.abs().mean(-1, keepdim=True)  # noqa: E731
    preview("rms", wrong)
    shown = capsys.readouterr().out
    assert "FAIL" in shown and "hint:" not in shown and "got:" in shown
    assert not any(c.hint in shown for c in TASKS["rms"].checks)
    grade("rms", wrong)
    assert "hint:" in capsys.readouterr().out
    result = run_checks("rms", wrong)
    for table in (result.html(), result.html(hints=False)):
        assert "pass" in table and "FAIL" in table
        assert all(ord(ch) < 0x2000 for ch in table), (
            "a symbol that needs a special font"
        )


# --- the grader's own guarantees, on test-only tasks (not the course's checks)
# ---------------------------------------------------------------------------------
# "cumsum" and "probe_cumsum" hold the same checks, so that a notebook can grade two
# tasks. `smol grade --tasks tests.test_grading` registers them in the grader and its
# kernels.

TEST_TASKS = ("cumsum", "probe_cumsum")
registry.task("cumsum", "grader_tests", "cumsum(x) over the last dimension")
registry.task(
    "probe_cumsum", "grader_tests", "cumsum(x) over the last dimension, again"
)


def _inputs():
    return {"x": torch.randn(3, 5), "h": torch.randn(2, 4).to(torch.bfloat16)}


def _judge_values(inputs, out):
    close(out, inputs["x"].cumsum(-1), "cumsum(x)")


def _judge_dtype(inputs, out):
    assert isinstance(out, torch.Tensor), f"expected a tensor, got {type(out).__name__}"
    assert out.dtype == torch.bfloat16, f"bfloat16 in gave {out.dtype} out"


# each check: its name, points, hint, the input it sums and its judge
for name, points, hint, summed, judge in (
    ("values", 2, "add up along the last dimension", "x", _judge_values),
    ("bfloat16 in, bfloat16 out", 1, "keep the dtype", "h", _judge_dtype),
):
    registry.probe_check(TEST_TASKS, name, points, hint, inputs=_inputs, judge=judge)(
        lambda f, inputs, summed=summed: f(inputs[summed])
    )


def test_probe_checks_judge_plain_data_outside_the_students_process():
    for isolate in (False, True):
        good = run_checks("probe_cumsum", lambda x: x.cumsum(-1), isolate=isolate)
        assert good.score == good.total == 3, good.table()
        upcast = run_checks(
            "probe_cumsum", lambda x: x.float().cumsum(-1), isolate=isolate
        )
        assert [r.passed for r in upcast.rows] == [True, False], upcast.table()
        odd = run_checks("probe_cumsum", lambda x: {x.sum().item()}, isolate=isolate)
        assert odd.score == 0 and "is a set" in odd.rows[0].message, odd.table()


def test_plain_data_decodes_only_what_it_encoded():
    from smol.grading import plain

    value = {"t": torch.arange(6).view(2, 3).t(), (1, "a"): [None, 2.5, (True,)]}
    back = plain.decode(plain.encode(value))
    assert torch.equal(back["t"], value["t"]) and back[(1, "a")] == [None, 2.5, (True,)]
    data = plain.encode(value)
    for broken in (b"", data[:-4], b"X" + data[1:], data + b"x"):
        with pytest.raises(plain.NotPlain):
            plain.decode(broken)
    with pytest.raises(plain.NotPlain, match="is a object"):
        plain.encode([object()])


# --- fair to correct solutions ------------------------------------------------------


class _SlowToLoad:
    """Unpickles into `fn` after `seconds`: a large object whose load is slow."""

    def __init__(self, fn, seconds):
        self.fn, self.seconds = fn, seconds

    def __reduce__(self):
        return _slowly, (self.fn, self.seconds)


def _slowly(fn, seconds):
    time.sleep(seconds)
    return fn


def _cumsum(x):
    return x.cumsum(-1)


class _FailsToLoad:
    def __reduce__(self):
        return _refuse_to_load, ()


def _refuse_to_load():
    raise RuntimeError("a module the notebook had")


@pytest.mark.parametrize("isolate", [False, True])
def test_an_object_that_cannot_be_loaded_says_so(isolate):
    import cloudpickle

    payload = cloudpickle.dumps(_FailsToLoad())
    result = run_checks("probe_cumsum", payload=payload, isolate=isolate)
    want = "the grader could not load your object: RuntimeError: a module the notebook"
    assert all(r.message.startswith(want) for r in result.rows), result.table()


def test_loading_the_object_is_not_check_time(monkeypatch):
    import cloudpickle

    from smol.grading import isolation

    payload = cloudpickle.dumps(_SlowToLoad(_cumsum, 1.0))
    result = run_checks("probe_cumsum", payload=payload, timeout=0.6, isolate=True)
    assert result.score == result.total, result.table()
    monkeypatch.setattr(isolation, "LOAD_TIMEOUT", 0.3)
    result = run_checks("probe_cumsum", payload=payload, timeout=0.6, isolate=True)
    assert result.score == 0, result.table()
    assert all("could not load your object in 0.3 s" in r.message for r in result.rows)


def test_a_tasks_warm_up_runs_before_checks_that_run_in_this_process(monkeypatch):
    """Where checks cannot fork (macOS, Windows, a kernel holding CUDA) they run
    here, each under its time limit: the task's warm-up runs first, once, outside
    that limit, as it does before forked checks. A grader that warmed up only before
    a fork charged AdamW's first use (torch._dynamo's import, 5.5 s on two busy
    cores) to param_groups' "AdamW accepts the groups" check."""
    order = []
    warmed = registry.Task("warmed", "grader_tests", "a task with a warm-up")
    warmed.warm_up = lambda: order.append("warm-up")
    monkeypatch.setitem(registry.TASKS, "warmed", warmed)
    registry.probe_check("warmed", "runs", 1, "none", judge=lambda inputs, out: None)(
        lambda fn, inputs: order.append("probe")
    )
    assert run_checks("warmed", isolate=False).score == 1
    assert run_checks("warmed", isolate=False).score == 1
    assert order == ["warm-up", "probe", "probe"]


def _holding_what_pickle_refuses(tmp_path, started: bool):
    """A correct cumsum that holds a lock, an event, an open file and a generator
    (started or not)."""
    import itertools

    lock, event = threading.RLock(), threading.Event()
    log = open(tmp_path / "calls.log", "w")  # noqa: SIM115 - held open on purpose
    ticks = (i for i in itertools.count())
    if started:
        next(ticks)

    def cumsum(x):
        with lock:
            event.set()
            log.write(f"call {next(ticks)}\n")
            log.flush()
            return x.cumsum(-1)

    return cumsum


def test_solutions_holding_locks_files_and_generators_keep_full_marks(tmp_path):
    """A probe runs where the object lives and never copies it (cloudpickle refuses a
    lock): in a forked child, as the command line runs it, such a solution scores as
    `grade` in the notebook does, its generator started or not."""
    import cloudpickle

    for started in (False, True):
        solution = _holding_what_pickle_refuses(tmp_path, started)
        with pytest.raises(TypeError, match="pickle"):
            cloudpickle.dumps(solution)
        in_notebook = run_checks("probe_cumsum", solution)
        forked = run_checks("probe_cumsum", solution, isolate=True)
        assert in_notebook.score == forked.score == forked.total, forked.table()


@pytest.mark.parametrize("isolate", [False, True])
def test_out_of_memory_is_not_called_an_endless_loop(isolate, monkeypatch):
    from smol.grading import memory

    task_name = "probe_cumsum"
    result = run_checks(task_name, lambda x: bytearray(1 << 50), isolate=isolate)
    assert result.score == 0, result.table()
    assert all(r.message.startswith("ran out of memory") for r in result.rows)
    monkeypatch.setattr(
        memory, "memory_shortage", lambda pid=None: "12 of 24000 MiB were available"
    )
    stalled = run_checks(task_name, lambda x: time.sleep(30), 0.5, isolate=isolate)
    for row in stalled.rows:
        assert "memory was short (12 of 24000 MiB" in row.message, row.message
        assert "endless loop?" not in row.message, row.message
    monkeypatch.setattr(memory, "memory_shortage", lambda pid=None: "")
    looping = run_checks(task_name, lambda x: time.sleep(30), 0.5, isolate=isolate)
    assert all("an endless loop" in r.message for r in looping.rows), looping.table()


def test_a_child_killed_from_outside_blames_memory():
    """The out-of-memory killer ends a process with SIGKILL; the grader sends none
    before the time limit, so such a death is not called a timeout or a crash."""
    import signal

    result = run_checks(
        "probe_cumsum", lambda x: os.kill(os.getpid(), signal.SIGKILL), isolate=True
    )
    for row in result.rows:
        assert "SIGKILL, which the grader did not send" in row.message, row.message
        assert "out-of-memory" in row.message and "timed out" not in row.message


def test_an_allocation_that_fails_in_torch_is_out_of_memory():
    def allocate(x):  # a memory limit for this process only (the check's child)
        import resource

        with open("/proc/self/status") as f:
            size = next(int(li.split()[1]) for li in f if li.startswith("VmSize"))
        limit = size * 1024 + (256 << 20)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        return torch.empty(1 << 32, dtype=torch.float64)

    result = run_checks("probe_cumsum", allocate, isolate=True)
    assert all(r.message.startswith("ran out of memory") for r in result.rows), (
        result.table()
    )


# --- nothing lost: the report never replaces what it did not write ---------------


def test_a_report_never_replaces_a_notebook_or_a_foreign_file(tmp_path, capsys):
    from smol.commands.grade import main

    nb = _notebook(tmp_path, "mine.ipynb", [HEAD])
    before = nb.read_bytes()
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes")
    other = tmp_path / "other.ipynb"
    for where, why in (
        (nb, "it is a notebook"),
        (other, "it is a notebook"),
        (notes, "not an earlier report"),
    ):
        assert main([str(nb), "--json", str(where)]) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert f"cannot write the report to {where}" in err and why in err, err
    assert nb.read_bytes() == before and notes.read_text() == "my notes"
    assert not other.exists() and sorted(p.name for p in tmp_path.iterdir()) == [
        "mine.ipynb",
        "notes.txt",
    ]


def test_reports_are_written_whole_and_only_over_earlier_reports(tmp_path, monkeypatch):
    from smol.grading import files
    from smol.grading.files import is_report, output_problem, write_atomic

    report = tmp_path / "report.json"
    first = json.dumps({"score": 0, "total": 0, "notebooks": []})
    write_atomic(report, first)
    assert is_report(report) and output_problem(report, is_report, "report") == ""

    def full_disk(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, "fsync", full_disk)
    with pytest.raises(OSError):  # fails half-way: the old report stays whole
        write_atomic(report, json.dumps({"score": 1, "total": 1, "notebooks": []}))
    assert report.read_text() == first
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]
    report.write_text('{"score": 1}')  # JSON, not a report
    assert "not an earlier report" in output_problem(report, is_report, "report")


# --- the command line: escapes, forgeries and fairness, end to end ---------------

ESCAPE = '''import os, time
def escape(tag, folder, target="report.json"):
    """A process that leaves its group and its parent, waits for the grader's output
    `target`, then rewrites it."""
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork() == 0:
            with open(os.path.join(folder, tag + ".pid"), "w") as f:
                f.write(str(os.getpid()))
            report = os.path.join(folder, target)
            while not os.path.exists(report):
                time.sleep(0.05)
            time.sleep(0.3)
            with open(report, "w") as f:
                f.write('{"forged by": "%s"}' % tag)
        os.kill(os.getpid(), 9)
    os.waitpid(pid, 0)
escape("kernel", FOLDER, TARGET)'''
REACH = """with open("/proc/self/stat") as f:  # the grader: this kernel's parent
    grader = int(f.read().rsplit(")", 1)[1].split()[1])
try:  # write into the grader's memory
    with open(f"/proc/{grader}/mem", "r+b"):
        pass
    verdict = "opened"
except OSError as exc:
    verdict = type(exc).__name__
with open(os.path.join(FOLDER, "grader-memory.txt"), "w") as f:
    f.write(verdict)"""
PROBE_FORGERY = '''import sys, torch
from smol.grading import plain
def forger(x):
    """Leaves a process behind, then finds the pipe to the grader on the stack and
    sends a result of its own making, with the grader's framing."""
    if not os.path.exists(os.path.join(FOLDER, "probe.pid")):
        escape("probe", FOLDER)
    frame, fd = sys._getframe(), None
    while frame is not None:
        fd = frame.f_locals.get("write_fd", fd)
        frame = frame.f_back
    for forged in (plain.encode({"passed": True}), plain.encode(torch.zeros(3, 5))):
        data = b"O" + forged
        os.write(fd, b"R" + len(data).to_bytes(8, "little") + data)
    os.kill(os.getpid(), 9)'''
FAIR = """import itertools, threading
lock, event = threading.RLock(), threading.Event()
log = open("calls.log", "w")
unstarted = (i for i in itertools.count())
started = (i for i in itertools.count())
next(started)
def fresh_sol(x):
    with lock:
        event.set()
        log.write(f"call {next(unstarted)}\\n")
        return x.cumsum(-1)
def started_sol(x):
    with lock:
        log.write(f"call {next(started)}\\n")
        return x.cumsum(-1)"""


@pytest.fixture(scope="module")
def hostile_and_fair(tmp_path_factory):
    """One run of `smol grade` over a notebook whose code escapes, reaches
    for the grader's memory and forges a probe's result, and one whose correct code
    holds what pickle refuses; then a wait past the escapes' rewrite."""
    tmp = tmp_path_factory.mktemp("escapes")
    head = f"{HEAD}\nFOLDER, TARGET = {str(tmp)!r}, 'report.json'"
    hostile = _notebook(
        tmp,
        "hostile.ipynb",
        [
            head,
            ESCAPE,
            REACH,
            PROBE_FORGERY,
            'grade("probe_cumsum", forger)',
        ],
    )
    fair = _notebook(
        tmp,
        "fair.ipynb",
        [
            "# the setup cell's place (run_in_process skips it)",
            head,
            FAIR,
            'grade("cumsum", fresh_sol)',
            'grade("probe_cumsum", started_sol)',
        ],
    )
    report = tmp / "report.json"
    env = _env_with_tests()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "smol",
            "grade",
            str(hostile),
            str(fair),
            "--json",
            str(report),
        ]
        + ["--tasks", "tests.test_grading", "--cell-timeout", "60"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=env,
    )
    time.sleep(1.5)  # an escaped process would have rewritten the report by now
    return proc, tmp, report


def _pid_is_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_no_escaped_process_outlives_the_grading(hostile_and_fair):
    proc, tmp, report = hostile_and_fair
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert is_report_file(report), report.read_text()[:300]
    for tag in ("kernel", "probe"):  # each started, each killed
        pid = int((tmp / f"{tag}.pid").read_text())
        assert _pid_is_gone(pid), f"the {tag}'s escaped process {pid} still runs"


def test_a_notebook_cannot_reach_into_the_graders_memory(hostile_and_fair):
    """The grader is non-dumpable: its kernel, a process of the same user, cannot open
    its memory. Root can, whatever the flag: grade as a user."""
    _, tmp, _ = hostile_and_fair
    opened = (tmp / "grader-memory.txt").read_text()
    assert opened in ("opened", "PermissionError"), opened  # the grader was found
    if os.geteuid() != 0:
        assert opened == "PermissionError"


def test_the_grader_is_non_dumpable_while_it_grades():
    """`reaping`, around all that `smol grade` does, makes its process
    non-dumpable (children it forks inherit that) and restores the flag after."""
    code = (
        "import os\n"
        "from smol.grading import reaper\n"
        "def dumpable():\n"
        "    return reaper._prctl(reaper.PR_GET_DUMPABLE)\n"
        "with reaper.reaping():\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        os._exit(dumpable())\n"
        "    inherited = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])\n"
        "    print(dumpable(), inherited)\n"
        "print(dumpable())\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert proc.stdout.split() == ["0", "0", "1"], proc.stdout + proc.stderr


def test_a_probe_that_forges_its_result_scores_nothing(hostile_and_fair):
    _, _, report = hostile_and_fair
    hostile = _report_of(report, "hostile.ipynb")
    assert hostile == {"probe_cumsum": (0, 3)}, hostile


def test_the_command_line_agrees_with_grade_on_code_pickle_refuses(
    hostile_and_fair, monkeypatch
):
    _, tmp, report = hostile_and_fair
    monkeypatch.chdir(tmp)  # the notebook opens calls.log where it runs
    _, _, in_notebook = run_in_process(tmp / "fair.ipynb")
    here = {name: (r.score, r.total) for name, r in in_notebook.items()}
    assert (
        _report_of(report, "fair.ipynb")
        == here
        == {
            "cumsum": (3, 3),
            "probe_cumsum": (3, 3),
        }
    )


def is_report_file(path: Path) -> bool:
    from smol.grading.files import is_report

    return is_report(path)


def _report_of(report: Path, name: str) -> dict:
    notebooks = json.loads(report.read_text())["notebooks"]
    nb = next(n for n in notebooks if n["notebook"].endswith(name))
    return {t["task"]: (t["score"], t["total"]) for t in nb["tasks"]}


def _env_with_tests() -> dict:
    """The environment in which a grader, and its kernels, import tests.test_grading."""
    paths = [str(ROOT), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


# --- an instructor's gradebook ------------------------------------------------------


def _grade_class(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "smol", "grade", *args, "--tasks", "tests.test_grading"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env=_env_with_tests(),
    )


@pytest.fixture(scope="module")
def gradebook(tmp_path_factory):
    """A class of three: alice (a folder) solves the exercise; bob (a file prefix)
    keeps float32, leaves a process behind that rewrites the gradebook later, and
    hangs in a check; carol's notebook is cut short. Graded two at a time."""
    tmp = tmp_path_factory.mktemp("class")
    subs = tmp / "submissions"
    (subs / "alice").mkdir(parents=True)
    (subs / "carol").mkdir()
    solve = "def cumsum(x):\n    return x.cumsum(-1)"
    _notebook(
        subs / "alice",
        "warmup.ipynb",
        [HEAD, solve, 'grade("cumsum", cumsum)', 'grade("probe_cumsum", cumsum)'],
    )
    _notebook(
        subs,
        "bob__warmup.ipynb",
        [
            f"{HEAD}\nFOLDER, TARGET = {str(tmp)!r}, 'grades.csv'",
            ESCAPE,
            "def cumsum(x):\n    return x.float().cumsum(-1)",
            'grade("cumsum", cumsum)',
            "def hangs(x):\n    while True:\n        pass",
            'grade("probe_cumsum", hangs)',
        ],
    )
    (subs / "carol" / "warmup.ipynb").write_text('{"cells": [')
    outputs = ["--gradebook", str(tmp / "grades.csv"), "--feedback", str(tmp / "fb")]
    options = ["--jobs", "2", "--check-timeout", "3"]
    start = time.monotonic()
    proc = _grade_class(str(subs), *outputs, *options)
    seconds = time.monotonic() - start
    time.sleep(1.5)  # bob's escaped process would have rewritten the gradebook
    return proc, tmp, outputs + options, seconds


def _rows(path: Path) -> dict:
    import csv

    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return {(r["student"], r["task"]): r for r in rows}


def test_a_gradebook_has_a_row_per_student_exercise_and_task(gradebook):
    proc, tmp, _, _ = gradebook
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = _rows(tmp / "grades.csv")
    got = {k: (r["exercise"], r["points"], r["max_points"]) for k, r in rows.items()}
    assert got == {
        ("alice", "cumsum"): ("warmup", "3", "3"),
        ("alice", "probe_cumsum"): ("warmup", "3", "3"),
        ("bob", "cumsum"): ("warmup", "2", "3"),  # float32 out
        ("bob", "probe_cumsum"): ("warmup", "0", "3"),
        ("carol", "cumsum"): ("warmup", "0", "3"),
        ("carol", "probe_cumsum"): ("warmup", "0", "3"),
    }
    assert rows["bob", "cumsum"]["status"] == "graded"
    assert rows["bob", "probe_cumsum"]["status"] == "graded"
    assert "invalid JSON" in rows["carol", "cumsum"]["status"]
    pid = int((tmp / "kernel.pid").read_text())
    assert _pid_is_gone(pid), "bob's escaped process outlived the grading"


def test_feedback_pages_show_each_failed_check_with_its_hint(gradebook):
    _, tmp, _, _ = gradebook
    pages = {p.name: p.read_text() for p in (tmp / "fb").iterdir()}
    assert sorted(pages) == ["alice.md", "bob.md", "carol.md"]
    assert (
        "# alice: 6/6 points" in pages["alice.md"] and "failed" not in pages["alice.md"]
    )
    bob = pages["bob.md"]
    assert "**failed** (1 points): bfloat16 in, bfloat16 out" in bob
    assert "hint: keep the dtype" in bob and "bfloat16 in gave torch.float32 out" in bob
    assert "### probe_cumsum: 0/3 points" in bob and "timed out after 3 s" in bob
    assert "could not be graded" in pages["carol.md"]


def test_a_rerun_grades_only_what_changed(gradebook):
    _, tmp, args, _ = gradebook
    subs = tmp / "submissions"
    again = _grade_class(str(subs), *args)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "0 graded, 3 unchanged since the last run" in again.stdout, again.stdout
    (subs / "carol" / "warmup.ipynb").write_text('{"cells": [{')  # a new attempt
    third = _grade_class(str(subs), *args)
    assert "1 graded, 2 unchanged since the last run" in third.stdout, third.stdout
    assert _rows(tmp / "grades.csv")["alice", "probe_cumsum"]["points"] == "3"


def test_a_gradebook_refuses_to_replace_what_it_did_not_write(tmp_path, capsys):
    from smol.commands.grade import main

    subs = tmp_path / "subs"
    (subs / "alice").mkdir(parents=True)
    _notebook(subs / "alice", "warmup.ipynb", [HEAD])
    foreign = tmp_path / "grades.csv"
    foreign.write_text("name,grade\nalice,A\n")
    (tmp_path / "fb").mkdir()
    (tmp_path / "fb" / "alice.md").write_text("my own notes")
    for args, why in (
        (["--gradebook", str(foreign)], "not an earlier gradebook"),
        (
            [
                "--gradebook",
                str(tmp_path / "new.csv"),
                "--feedback",
                str(tmp_path / "fb"),
            ],
            "not an earlier feedback page",
        ),
        (["--gradebook", str(tmp_path / "x.ipynb")], "it is a notebook"),
    ):
        assert main([str(subs), *args]) == 2
        assert why in capsys.readouterr().err
    (subs / "stray.ipynb").write_text("{}")  # names no student
    assert main([str(subs), "--gradebook", str(tmp_path / "new.csv")]) == 2
    assert "STUDENT__EXERCISE.ipynb" in capsys.readouterr().err
    assert foreign.read_text() == "name,grade\nalice,A\n"
    assert not (tmp_path / "new.csv").exists()


def _class_outputs(tmp_path):
    """A class of one (alice) and the outputs of an earlier run over it: a gradebook,
    alice's feedback page, and the report that records both."""
    import hashlib

    from smol.grading.gradebook import MARK, csv_text

    subs = tmp_path / "subs"
    (subs / "alice").mkdir(parents=True)
    _notebook(subs / "alice", "warmup.ipynb", [HEAD])
    book = tmp_path / "grades.csv"
    book.write_text(csv_text([["alice", "warmup", "cumsum", 3, 3, "graded"]]))
    (tmp_path / "fb").mkdir()
    page = tmp_path / "fb" / "alice.md"
    page.write_text(f"{MARK}\n# alice: 3/3 points\n")
    written = {
        "submissions": str(subs.resolve()),
        "gradebook": hashlib.sha256(book.read_bytes()).hexdigest(),
        "feedback": {"alice.md": hashlib.sha256(page.read_bytes()).hexdigest()},
    }
    report = {"score": 3, "total": 3, "notebooks": [], "written": written}
    (tmp_path / "grades.json").write_text(json.dumps(report))
    argv = [str(subs), "--gradebook", str(book), "--feedback", str(tmp_path / "fb")]
    return argv, book, page, report


def test_a_gradebook_or_page_changed_by_hand_is_kept_without_overwrite(
    tmp_path, capsys
):
    """The class report records the gradebook and feedback pages its run wrote (their
    SHA-256) and the submissions folder: a rerun replaces them only as they were
    written. One edited by hand (a regrade, a note), another class's, or one that no
    report records is refused with status 2, naming it, unless --overwrite."""
    from smol.commands.grade import _usage_problem, build_parser, main

    argv, book, page, report = _class_outputs(tmp_path)
    assert _usage_problem(build_parser().parse_args(argv)) == ""  # as written
    regraded = book.read_text().replace(",3,3,graded", ",2,3,regraded by hand")
    book.write_text(regraded)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{book} was changed since smol grade" in err
    assert "--overwrite" in err and book.read_text() == regraded
    assert _usage_problem(build_parser().parse_args([*argv, "--overwrite"])) == ""
    report["written"]["gradebook"] = hashlib_of(book)
    page.write_text(page.read_text() + "\nSee me after class.\n")
    (tmp_path / "grades.json").write_text(json.dumps(report))
    assert main(argv) == 2
    assert f"{page} was changed since smol grade" in capsys.readouterr().err
    report["written"]["feedback"]["alice.md"] = hashlib_of(page)
    report["written"]["submissions"] = "/courses/another/subs"
    (tmp_path / "grades.json").write_text(json.dumps(report))
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "holds the grades of /courses/another/subs, not of" in err
    (tmp_path / "grades.json").unlink()  # a gradebook no report records
    assert main(argv) == 2
    assert f"{book} was not written by a run that" in capsys.readouterr().err
    assert main([*argv[:1], "--overwrite"]) == 2
    assert "--overwrite needs --gradebook" in capsys.readouterr().err


def hashlib_of(path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_class_report_records_what_its_run_wrote(gradebook):
    """The report of the graded class records its folder, and the gradebook and
    pages as written; the gradebook edited by hand is then kept by a rerun."""
    _, tmp, args, _ = gradebook
    written = json.loads((tmp / "grades.json").read_text())["written"]
    assert written["submissions"] == str((tmp / "submissions").resolve())
    assert written["gradebook"] == hashlib_of(tmp / "grades.csv")
    assert written["feedback"] == {
        p.name: hashlib_of(p) for p in sorted((tmp / "fb").iterdir())
    }
    text = (tmp / "grades.csv").read_text()
    try:
        (tmp / "grades.csv").write_text(text + "# carol's regrade pending\n")
        again = _grade_class(str(tmp / "submissions"), *args)
        assert again.returncode == 2 and "was changed since" in again.stderr
        assert (tmp / "grades.csv").read_text().endswith("regrade pending\n")
    finally:
        (tmp / "grades.csv").write_text(text)


def test_an_exercise_whose_every_notebook_was_deleted_is_missing():
    """ada handed in two exercises last time, one now: the other gets rows marked
    missing (its tasks from the last report), not no rows at all."""
    from smol.grading.gradebook import gradebook_rows

    task = {"task": "rms", "score": 3, "total": 4, "graded": True}
    rope = {"task": "rope", "score": 2, "total": 5, "graded": True}
    now = {"student": "ada", "exercise": "01_rmsnorm", "tasks": [task]}
    gone = {"student": "ada", "exercise": "02_rope", "tasks": [rope]}
    rows = gradebook_rows([now], {"ada"}, [now, gone])
    assert rows == [
        ["ada", "01_rmsnorm", "rms", 3, 4, "graded"],
        ["ada", "02_rope", "rope", 0, 5, "missing"],
    ]


def test_a_file_that_is_not_a_notebook_is_one_error_line(tmp_path, capsys):
    """`smol grade text.ipynb --json -`: status 1, and one line on stderr that says
    `smol grade: error:` and names the file (the report goes to stdout)."""
    from smol.commands.grade import main

    (tmp_path / "text.ipynb").write_text("not a notebook")
    assert main([str(tmp_path / "text.ipynb"), "--json", "-"]) == 1
    out, err = capsys.readouterr()
    errors = [line for line in err.splitlines() if ": error: " in line]
    assert len(errors) == 1 and errors[0].startswith("smol grade: error: 1 file")
    assert "text.ipynb is not a notebook" in errors[0]
    assert json.loads(out)["notebooks"][0]["score"] == 0


def test_a_notebook_ending_in_capitals_is_graded_by_itself_too(tmp_path):
    """The worker that grades one hand-in (`smol grade NOTEBOOK --json -`) takes a
    notebook ending in .IPYNB, as the class's search finds it, and so does a folder."""
    from smol.commands.grade import notebook_paths

    (tmp_path / "hw").mkdir()
    upper = tmp_path / "hw" / "02_rope.IPYNB"
    upper.write_text("{}")
    (tmp_path / "hw" / ".hidden.ipynb").write_text("{}")
    (tmp_path / "hw" / "notes.txt").write_text("x")
    assert notebook_paths([str(upper)]) == [upper]
    assert notebook_paths([str(tmp_path / "hw")]) == [upper]


@pytest.mark.parametrize(
    "twice", [["hw/02_rope.ipynb"] * 2, ["hw", "hw/02_rope.ipynb"]]
)
def test_a_notebook_named_twice_is_refused_not_counted_twice(
    tmp_path, capsys, monkeypatch, twice
):
    """Named twice, by itself or with its folder: a usage error, before any grading
    (graded twice, its points would count twice in the total)."""
    from smol.commands.grade import main

    (tmp_path / "hw").mkdir()
    (tmp_path / "hw" / "02_rope.ipynb").write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert main([*twice, "--json", "-"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == (
        "smol grade: error: hw/02_rope.ipynb is named twice: name each notebook once\n"
    )


def test_a_deleted_notebook_stays_missing_run_after_run(gradebook):
    """carol's notebook is deleted: the next run marks her rows missing, and so does
    the one after (the report keeps what is missing), instead of dropping her."""
    _, tmp, args, _ = gradebook
    notebook = tmp / "submissions" / "carol" / "warmup.ipynb"
    kept = notebook.read_bytes()
    try:
        notebook.unlink()
        for _ in range(2):
            again = _grade_class(str(tmp / "submissions"), *args)
            assert again.returncode == 0, again.stdout + again.stderr
            rows = _rows(tmp / "grades.csv")
            assert rows["carol", "cumsum"]["status"] == "missing"
            assert rows["carol", "probe_cumsum"]["max_points"] == "3"
    finally:
        notebook.write_bytes(kept)
