"""The differential checks of exercises 1 to 6 (norm_rope_differential,
gqa_swiglu_differential, model_differential): their cases reach the edges their
docstrings name, correct rewrites keep full marks, and each bug of
tests/grading_mutants_core.py loses exactly the differential check's point, the
MUTANTS there passing every targeted check."""

import pytest
import torch

from smol.grading import TASKS, run_checks
from smol.grading.checks import model_differential
from smol.grading.checks.norm_rope_differential import TABLES
from tests.grading_mutants_core import CAUGHT, MUTANTS, WIDE_MUTANTS
from tests.test_grading import beyond_generated, check_named

GENERATED = {
    t.name: c
    for t in TASKS.values()
    for c in t.checks
    if c.name.startswith("generated")
}
# the tasks of exercises 1 to 6 that have none, and why (book/exercises.md says so)
NONE = {
    "tie_weights": "whether two names hold one Parameter: no value to compare",
    "init_weights": "random draws: only their statistics are smol's",
    "init_bug": "random draws: only their statistics are smol's",
}
FIRST_SIX = ("rmsnorm", "rope", "gqa_repeat_kv", "swiglu", "tying_and_init")


def _cases(task):
    return GENERATED[task].inputs()


def test_every_task_of_exercises_1_to_6_has_one_but_tying_and_init():
    tasks = {
        t.name for t in TASKS.values() if t.notebook in (*FIRST_SIX, "assembled_model")
    }
    assert set(CAUGHT) == tasks - set(NONE) == tasks & set(GENERATED)
    for task in CAUGHT:
        assert GENERATED[task].points == 1
        assert len(_cases(task)) >= 40


def _dtypes(cases, name):
    return {c["args"][name].dtype for c in cases}


def test_norm_cases_reach_half_precision_overflow_zero_rows_and_eps():
    cases = _cases("rmsnorm") + _cases("rmsnorm_bug")
    assert (
        _dtypes(cases, "x")
        == _dtypes(cases, "weight")
        == {
            torch.float32,
            torch.bfloat16,
            torch.float16,
        }
    )
    mixed = {(c["args"]["x"].dtype, c["args"]["weight"].dtype) for c in cases}
    assert (torch.float32, torch.bfloat16) in mixed and len(mixed) >= 6
    half = [c["args"]["x"] for c in cases if c["args"]["x"].dtype == torch.float16]
    assert sum(bool(x.pow(2).isinf().any()) for x in half) >= 3  # 300 ** 2 > 65504
    for task in ("rms", "rmsnorm"):
        cases = _cases(task)
        xs = [c["args"]["x"] for c in cases]
        assert {x.dim() for x in xs} == {1, 2, 3, 4, 5}
        assert {x.shape[-1] % 2 for x in xs} == {0, 1}
        assert sum(bool((x == 0).all(-1).any()) for x in xs) >= 5
        # eps near or above mean(x^2): where it decides the result
        decided = [
            c
            for c in cases
            if c["args"]["eps"] >= c["args"]["x"].float().pow(2).mean(-1).min()
        ]
        assert len(decided) >= 10, task


def test_rope_cases_reach_offsets_gathered_rows_one_token_and_strided_x():
    cases = _cases("rope") + _cases("rope_bug")
    kinds = {kind for c in cases for kind in TABLES if f"tables {kind}" in c["what"]}
    assert kinds == set(TABLES)
    decode = [  # gathered tables, one token, more rows than tokens
        c
        for c in cases
        if c["args"]["cos"].dim() == 4 and c["args"]["x"].shape[0] > 1
        if c["args"]["x"].shape[2] == 1
    ]
    assert len(decode) >= 3
    assert {c["args"]["x"].shape[1] for c in cases} == {1, 3, 5, 9}  # odd head counts
    assert _dtypes(cases, "x") == {torch.float32, torch.bfloat16, torch.float16}
    assert {c["args"]["layout"] for c in cases} == {"contiguous", "strided"}
    lengths = [c["args"]["length"] for c in _cases("rope_tables")]
    assert max(lengths) > 2048 and min(lengths) == 1  # float16 rounds past 2048
    heads = [c["args"]["head_dim"] for c in _cases("rope_frequencies")]
    assert {2, 256} <= set(heads)


def test_attention_cases_reach_every_ratio_one_token_and_float16():
    repeats = _cases("repeat_kv")
    assert {c["args"]["n_rep"] for c in repeats} >= {1, 2, 7}
    assert {c["args"]["x"].shape[1] for c in repeats} == {1, 2, 3, 5}
    strided = {(c["args"]["layout"], c["args"]["x"].dtype) for c in repeats}
    assert len(strided) == 6
    cases = _cases("gqa_attention")
    n_reps = {c["args"]["q"].shape[1] // c["args"]["k"].shape[1] for c in cases}
    assert n_reps == {1, 2, 3}
    assert {c["args"]["q"].shape[2] for c in cases} >= {1, 9}
    assert _dtypes(cases, "q") == {torch.float32, torch.bfloat16, torch.float16}
    assert {c["what"].split("scores ")[1] for c in cases} == {
        "moderate",
        "large",
        "far below zero",
    }


def test_silu_and_mlp_cases_reach_float16_overflow_and_bfloat16():
    cases = _cases("silu")
    half = [c["args"]["x"] for c in cases if c["args"]["x"].dtype == torch.float16]
    assert sum(bool((x < -11).any()) for x in half) >= 3  # exp(-x) is inf there
    assert _dtypes(cases, "x") == {torch.float32, torch.bfloat16, torch.float16}
    mlps = _cases("swiglu")
    assert _dtypes(mlps, "x") == {torch.float32, torch.bfloat16}
    assert len({c["args"]["intermediate_size"] for c in mlps}) == 4


def test_model_cases_reach_other_configs_bfloat16_and_padding():
    for task in ("count_params", "forward_logits", "decoder_layer_bug"):
        cases = _cases(task)
        fields = [{k: c["args"][k] for k in model_differential.FIELDS} for c in cases]
        ratios = {f["num_attention_heads"] // f["num_key_value_heads"] for f in fields}
        assert ratios == {1, 2, 3}, task
        assert {f["tie_word_embeddings"] for f in fields} == {True, False}, task
        assert {f["rms_norm_eps"] for f in fields} == {1e-6, 1e-5, 1e-3}, task
    assert max(c["args"]["num_hidden_layers"] for c in _cases("count_params")) == 30
    logits = _cases("forward_logits")
    assert {c["args"]["input_ids"].shape[1] for c in logits} >= {1, 9}
    layers = _cases("decoder_layer_bug")
    assert _dtypes(layers, "x") == {torch.float32, torch.bfloat16}
    # small activations in float32, where eps 1e-6 and 1e-3 give other outputs
    small = {
        c["args"]["rms_norm_eps"]
        for c in layers
        if c["args"]["x"].dtype == torch.float32 and c["args"]["x"].abs().max() < 0.1
    }
    assert {1e-6, 1e-3} <= small
    assert {c["args"]["masked"] for c in layers} == {True, False}


def rms_by_norm(x, eps):  # the L2 norm over sqrt(D), eps inside the root
    return (x.norm(dim=-1, keepdim=True).pow(2) / x.shape[-1] + eps).sqrt()


def rotate_half_by_indexing(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def repeat_kv_by_repeat_interleave(x, n_rep):
    return x.repeat_interleave(n_rep, dim=1)


def silu_in_float32(x):  # rounded once, as F.silu
    return (x.float() * torch.sigmoid(x.float())).to(x.dtype)


@pytest.mark.parametrize(
    "task, variant",
    [
        ("rms", rms_by_norm),
        ("rotate_half", rotate_half_by_indexing),
        ("repeat_kv", repeat_kv_by_repeat_interleave),
        ("silu", silu_in_float32),
    ],
)
def test_correct_rewrites_keep_full_marks(task, variant):
    result = run_checks(task, variant)
    assert result.score == result.total, result.table()


@pytest.mark.parametrize("task", sorted(CAUGHT))
def test_the_differential_check_catches_a_bug_of_every_task(task):
    result = run_checks(task, CAUGHT[task])
    row = next(r for r in result.rows if r.check == GENERATED[task].name)
    assert not row.passed and row.message.startswith("case "), result.table()


@pytest.mark.parametrize("bug", sorted(MUTANTS))
def test_a_mutant_only_the_differential_check_catches(bug):
    task, mutant, check = MUTANTS[bug]
    result = run_checks(task, mutant)
    lost = {row.check for row in result.rows if not row.passed}
    made_for_it = check_named(task, check)
    assert lost == beyond_generated(task, lost, made_for_it) == {made_for_it}
    assert result.score == TASKS[task].points - 1
    assert not WIDE_MUTANTS
