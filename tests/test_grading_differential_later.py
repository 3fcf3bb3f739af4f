"""The differential checks of exercises 07 to 12 and 14: the solutions
keep full marks, each check catches the bugs kept in tests/grading_mutants_later.py
(those of MUTANTS lose it alone: test_grading.py), and the generated inputs reach
the edges their docstrings name."""

import math

import nbformat
import pytest
import torch

from smol.grading import TASKS, run_checks
from tests.grading_mutants_later import CAUGHT, GENERATED
from tests.nbtools import ROOT

SOLVED = {  # notebook: {task: the solution's name for what it grades}
    "07_bpe": {
        "merge_step": "merge_step",
        "bpe_encode": "encode_ids",
        "bpe_bug": "encode_ids_fixed",
    },
    "08_kv_cache_generation": {
        "filter_top_k": "filter_top_k",
        "filter_top_p": "filter_top_p",
        "attention_mask_bug": "build_attention_mask",
    },
    "09_fast_generation": {
        "quantize_int8": "quantize_per_channel",
        "int8_linear": "int8_linear",
        "lookup_draft": "lookup_draft",
        "quantize_bug": "quantize_fixed",
    },
    "10_training_loop": {
        "next_token_batch": "next_token_batch",
        "lr_schedule": "lr_schedule",
    },
    "11_tiled_attention": {
        "merge_stats": "merge_stats",
        "tiled_attention": "tiled_attention",
        "tiled_attention_bug": "tiled_attention_fixed",
    },
    "12_lora": {
        "lora_linear": "LoRALinear",
        "lora_merge": "merge",
        "sft_targets_bug": "sft_targets",
    },
    "14_multiple_choice": {
        "answer_logprobs": "answer_logprobs",
        "choice_score": "choice_score",
        "answer_logprobs_bug": "answer_logprobs",
    },
}
LATER = {task for tasks in SOLVED.values() for task in tasks}


def _generated(task):
    (check,) = [c for c in TASKS[task].checks if c.name.startswith(GENERATED)]
    return check


def _solution(stem):
    """The solution notebook's definitions (its grade cells left out)."""
    nb = nbformat.read(ROOT / "solutions" / f"{stem}.ipynb", as_version=4)
    namespace = {"__name__": "__main__"}
    for cell in nb.cells[1:]:
        if cell.cell_type == "code" and not cell.source.startswith(
            ("grade(", "preview(", "summary(", "from smol.grading")
        ):
            exec(compile(cell.source, stem, "exec"), namespace)  # noqa: S102
    return namespace


@pytest.mark.parametrize("stem", sorted(SOLVED))
def test_the_solutions_keep_full_marks(stem):
    namespace = _solution(stem)
    for task, name in SOLVED[stem].items():
        result = run_checks(task, namespace[name])
        assert result.score == result.total, result.table()


def test_each_check_is_worth_one_point_and_its_cases_are_many():
    for task in LATER:
        check = _generated(task)
        assert check.points == 1
        assert len(check.inputs()) == 40


@pytest.mark.parametrize("bug", sorted(CAUGHT))
def test_the_differential_check_catches(bug):
    task, mutant = CAUGHT[bug]
    result = run_checks(task, mutant)
    row = next(r for r in result.rows if r.check == _generated(task).name)
    assert not row.passed and row.message.startswith("case "), result.table()


def _args(task):
    return [c["args"] for c in _generated(task).inputs()]


def test_bpe_cases_reach_overlaps_ties_unicode_and_empty_words():
    overlapping = ties = pairless = 0
    for a in _args("merge_step"):
        words = a["word_counts"]
        overlapping += any(
            w[i] == w[i + 1] == w[i + 2] for w in words for i in range(len(w) - 2)
        )
        pairs = {}
        for w, n in words.items():
            for p in zip(w, w[1:]):
                pairs[p] = pairs.get(p, 0) + n
        ties += list(pairs.values()).count(max(pairs.values())) > 1
        pairless += any(len(w) < 2 for w in words)
    assert min(overlapping, ties, pairless) >= 5, (overlapping, ties, pairless)
    args = _args("bpe_encode")
    lengths = {len(a["ids"]) for a in args}
    assert {0, 1} <= lengths
    assert (
        sum(any(i >= 0x80 for i in a["ids"]) and len(a["ranks"]) > 100 for a in args)
        >= 3
    )
    unmerged = sum(
        any(i not in {s for p in a["ranks"] for s in p} for i in a["ids"]) for a in args
    )
    unordered = sum(
        sorted(a["ranks"].values()) != sorted(a["ranks"].values(), key=lambda r: r[1])
        for a in args
    )
    assert unmerged >= 5 and unordered >= 5, (unmerged, unordered)


def test_filter_cases_reach_overflow_minus_inf_and_every_dtype_without_ties():
    """No two logits of a row tie, and p stands 0.02 or more from every cumulative
    mass (or is 0 or 1): what is kept is the same whatever the sort's order and
    the sum's precision."""
    for task in ("filter_top_k", "filter_top_p"):
        args = _args(task)
        for a in args:
            x = a["logits"].float()
            finite = [r[torch.isfinite(r)] for r in x]
            assert all(len(r.unique()) == len(r) for r in finite)
        assert sum(bool(torch.isinf(a["logits"]).any()) for a in args) >= 5, task
        dtypes = {a["logits"].dtype for a in args}
        assert dtypes == {torch.float32, torch.bfloat16, torch.float16}, task
    assert sum(a["arg"] >= a["logits"].shape[-1] for a in _args("filter_top_k")) >= 3
    args = _args("filter_top_p")
    assert sum(bool((a["logits"].float() > 88).any()) for a in args) >= 5
    assert {0.0, 1.0} <= {a["arg"] for a in args}
    inside = 0
    for a in args:
        x, p = a["logits"].double(), a["arg"]
        for row in x:
            mass = row.sort(descending=True).values.softmax(-1).cumsum(-1)
            assert p in (0.0, 1.0) or (mass - p).abs().min() >= 0.02 - 1e-6
        inside += 0 < p < 1
    assert inside >= 20


def _padding(mask):
    """(gaps, empty rows) of 0/1 masks: a 0 between two 1s, a row of 0s."""
    m = mask.long()
    after = m.cummax(-1).values.bool()
    before = m.flip(-1).cummax(-1).values.flip(-1).bool()
    return int((after & before & (m == 0)).any()), int((m.sum(-1) == 0).any())


def test_mask_and_batch_cases_reach_gaps_empty_rows_and_every_mask_dtype():
    for task, key in (("attention_mask_bug", "mask"), ("next_token_batch", "mask")):
        masks = [a[key] for a in _args(task) if a[key] is not None]
        gaps, empty = (sum(x) for x in zip(*map(_padding, masks)))
        assert gaps >= 5 and empty >= 5, (task, gaps, empty)
        assert {m.dtype for m in masks} == {
            torch.long,
            torch.bool,
            torch.int32,
            torch.float,
        }
        assert len(masks) < 40  # no mask at all too
    assert {a["offset"] for a in _args("attention_mask_bug")} >= {0, 1, 4}


def test_fast_cases_reach_zero_rows_overlaps_and_every_dtype():
    weights = [a["w"] for a in _args("quantize_int8")]
    assert sum(bool((w == 0).all(1).any()) for w in weights) >= 5
    assert {w.dtype for w in weights} == {torch.float32, torch.bfloat16, torch.float16}
    assert {a["x"].dtype for a in _args("int8_linear")} == {w.dtype for w in weights}
    overlapping = 0
    for a in _args("lookup_draft"):
        t, n = a["tokens"].tolist(), a["ngram"]
        overlapping += any(
            t[s : s + k] == t[-k:] and s + k > len(t) - k
            for k in range(1, min(n, len(t) - 1) + 1)
            for s in range(len(t) - k)
        )
    assert overlapping >= 5
    assert {len(a["tokens"]) for a in _args("lookup_draft")} >= {1, 2}


def test_schedule_cases_reach_no_warmup_warmup_to_the_end_and_beyond():
    schedules = [a["schedule"] for a in _args("lr_schedule")]
    assert any(s["warmup_steps"] == 0 for s in schedules)
    assert any(s["warmup_steps"] == s["total_steps"] for s in schedules)
    assert any(s["total_steps"] == 1 for s in schedules)
    assert all(
        max(a["steps"]) > a["schedule"]["total_steps"] for a in _args("lr_schedule")
    )


def test_tiled_cases_reach_one_query_partial_blocks_causal_offsets_and_large_scores():
    both_hidden = 0
    for a in _args("merge_stats"):
        both = torch.isinf(a["m_a"]) & torch.isinf(a["m_b"])
        both_hidden += bool(both.any() and not both.all())
    assert both_hidden >= 5
    assert any(a["m_a"].abs().max() > 900 for a in _args("merge_stats"))
    seen = set()
    for a in _args("tiled_attention"):
        (B, _, Tq, D), Tk = a["q"].shape, a["k"].shape[2]
        scores = a["q"].float() @ a["k"].float().transpose(-2, -1) / math.sqrt(D)
        seen |= {
            ("T=1", Tq == 1),
            ("partial block", Tk % a["block"] != 0),
            ("block beyond Tk", a["block"] > Tk),
            ("causal, Tq < Tk", a["causal"] and Tq < Tk),
            ("causal, Tq > Tk", a["causal"] and Tq > Tk),
            ("scores above 88", bool(scores.abs().max() > 88)),
            ("B > 1", B > 1),
            (a["q"].dtype, True),
        }
    for want in ("T=1", "partial block", "block beyond Tk", "causal, Tq < Tk"):
        assert (want, True) in seen, want
    for want in ("causal, Tq > Tk", "scores above 88", "B > 1"):
        assert (want, True) in seen, want
    assert {(d, True) for d in (torch.float32, torch.bfloat16, torch.float16)} <= seen


def test_lora_cases_reach_rank_one_fractional_scaling_bfloat16_and_no_bias():
    args = _args("lora_linear")
    assert any(a["r"] == 1 for a in args)
    assert any(a["alpha"] / a["r"] != a["alpha"] // a["r"] for a in args)
    assert any(a["W"].dtype == torch.bfloat16 for a in args)
    assert any(a["b"] is None for a in args) and any(a["b"] is not None for a in args)
    assert any(a["x"].dim() == 1 for a in args) and any(a["x"].dim() == 3 for a in args)
    prompts = [
        (n, a["ids"].shape[1]) for a in _args("sft_targets_bug") for n in a["prompts"]
    ]
    assert any(n == 1 for n, _ in prompts) and any(n == T for n, T in prompts)


def test_choice_cases_reach_one_token_answers_overflow_and_both_normalisations():
    args = _args("choice_score")
    assert any(a["n"] == a["ids"].shape[0] - 1 for a in args)
    assert sum(bool((a["logits"].float() > 88).any()) for a in args) >= 5
    assert sum(bool((a["logits"].float().amax(-1) < -103).all()) for a in args) >= 3
    assert {a["normalise"] for a in args} == {True, False}
    assert {a["logits"].dtype for a in args} == {
        torch.float32,
        torch.bfloat16,
        torch.float16,
    }
