"""The differential checks (smol.grading.checks._differential): their generated
inputs are reproducible and reach the combinations the targeted checks try one at a
time, correct rewrites keep full marks, and a mismatch names its case."""

import re

import pytest
import torch

from smol.grading import NOTEBOOKS, TASKS, run_checks
from smol.grading.checks import _differential as diff
from smol.grading.checks import dpo_differential, gguf_differential, grpo_differential
from smol.grading.checks.dpo import IGNORE
from tests.grading_mutants_core import CAUGHT
from tests.test_grading_differential_later import LATER

GENERATED = {  # task name: its differential check
    t.name: c
    for t in TASKS.values()
    for c in t.checks
    if c.name.startswith("generated")
}


def test_every_task_of_exercises_15_and_16_has_one_and_it_is_reproducible():
    wanted = {t.name for t in TASKS.values() if t.notebook in ("dpo", "grpo")}
    wanted.add("permute_qk")
    wanted |= set(CAUGHT)  # exercises 1 to 6 (tests/test_grading_core_differential.py)
    wanted |= LATER  # exercises 07 to 12 and 14
    assert set(GENERATED) == wanted
    for c in GENERATED.values():
        first, again = c.inputs(), c.inputs()
        assert len(first) == len(again) >= 40
        for a, b in zip(first, again):
            assert a["what"] == b["what"]
            for k, v in a["args"].items():
                w = b["args"][k]
                assert (
                    torch.equal(v.nan_to_num(), w.nan_to_num())
                    if torch.is_tensor(v)
                    else v == w
                ), k


def _cases(task):
    return GENERATED[task].inputs()


def test_logprob_cases_reach_gaps_overflow_underflow_and_bfloat16():
    cases = _cases("sequence_logprobs") + _cases("dpo_batch_bug")
    gaps = 0
    for c in cases:
        scored = c["args"]["targets"] != IGNORE
        after = scored.int().cummax(-1).values.bool()
        before = scored.int().flip(-1).cummax(-1).values.flip(-1).bool()
        gaps += int((after & before & ~scored).any())
    logits = [c["args"].get("logits", c["args"].get("policy_logits")) for c in cases]
    assert gaps >= 10
    assert sum(bool((x.float() > 88).any()) for x in logits) >= 10
    assert sum(bool((x.float().amax(-1) < -103).all()) for x in logits) >= 10
    assert sum(x.dtype == torch.bfloat16 for x in logits) >= 10


def test_loss_cases_combine_every_option_with_unequal_lengths():
    """beta > 0 with completions of unequal lengths under each loss_type, ratios
    clipped (off-policy), non-finite padding, group sizes 0 and negative."""
    combos, nonfinite = set(), 0
    for c in _cases("grpo_loss"):
        a = c["args"]
        lengths = a["completion_mask"].sum(-1)
        unequal = bool((lengths != lengths[0]).any())
        ratio = (a["logps"] - a["old_logps"]).float().exp()[a["completion_mask"] == 1]
        clipped = bool(((ratio < 0.8) | (ratio > 1.2)).any())
        combos.add((a["loss_type"], a["beta"] > 0, unequal, clipped))
        pad = a["completion_mask"] == 0
        nonfinite += int((~torch.isfinite(a["logps"][pad])).any())
    for loss_type in ("grpo", "dapo", "dr_grpo"):
        assert (loss_type, True, True, True) in combos, loss_type
    assert nonfinite >= 5
    sizes = {c["args"]["group_size"] for c in _cases("group_advantages")}
    assert {-3, 0, 1} <= sizes


def logprobs_by_logsumexp_by_hand(logits, targets):  # the maximum taken out first
    x = logits.float()
    top = x.amax(-1, keepdim=True)
    logp = x - top - (x - top).exp().sum(-1, keepdim=True).log()
    picked = logp.gather(-1, targets.clamp(min=0)[..., None]).squeeze(-1)
    return picked.masked_fill(targets == IGNORE, 0.0).sum(-1)


def grpo_loss_by_where_on_inputs(
    logps,
    old,
    ref,
    advantages,
    mask,
    loss_type="grpo",
    beta=0.0,
    epsilon_low=0.2,
    epsilon_high=0.2,
):  # the padding replaced by torch.where before exp; the KL's term of its own
    real = mask.bool()
    logps, old, ref = (
        torch.where(real, x, torch.zeros_like(x)) for x in (logps, old, ref)
    )
    ratio = (logps - old).exp()
    A = advantages[:, None]
    clipped = torch.where(A > 0, ratio.clamp(max=1 + epsilon_high), ratio)
    clipped = torch.where(A < 0, ratio.clamp(min=1 - epsilon_low), clipped)
    d = ref - logps
    per_token = -clipped * A
    if beta:  # at beta 0 the reference may be anything: zeros, where exp(d) is inf
        per_token = per_token + beta * (d.exp() - d - 1)
    m = mask.to(per_token.dtype)
    if loss_type == "grpo":
        return ((per_token * m).sum(-1) / m.sum(-1)).mean()
    denominator = m.sum() if loss_type == "dapo" else m.numel()
    return (per_token * m).sum() / denominator


def advantages_refusing_below_two(rewards, group_size):
    if not group_size >= 2:
        raise ValueError(f"group_size {group_size} leaves no group to compare with")
    grouped = rewards.reshape(-1, group_size)
    return (
        (grouped - grouped.mean(-1, keepdim=True))
        / (grouped.std(-1, keepdim=True) + 1e-4)
    ).flatten()


@pytest.mark.parametrize(
    "task, variant",
    [
        ("sequence_logprobs", logprobs_by_logsumexp_by_hand),
        ("grpo_loss", grpo_loss_by_where_on_inputs),
        ("group_advantages", advantages_refusing_below_two),
    ],
)
def test_correct_rewrites_keep_full_marks(task, variant):
    result = run_checks(task, variant)
    assert result.score == result.total, result.table()


def test_a_mismatch_names_its_case_and_where():
    from tests.grading_mutants_rl import grpo_loss_with

    result = run_checks("grpo_loss", grpo_loss_with("padding_by_where"))
    row = next(r for r in result.rows if r.check.startswith("generated"))
    assert not row.passed
    assert row.message.startswith("case ") and " of 48 (" in row.message
    assert "(padding): nan, expected 0" in row.message, row.message


def test_the_comparison_requires_zero_gradients_where_smols_are_zero():
    case = {"grad": ["x"], "tol": (1e-6, 1e-6), "gtol": (1e-6, 1e-6)}
    want = {"out": [torch.ones(2)], "grads": {"x": None}}
    got = {"out": [torch.ones(2)], "grads": {"x": torch.tensor([0.0, 1e-3])}}
    with pytest.raises(AssertionError, match="a gradient reaches x"):
        diff._compare(got, want, case)
    nan = {"out": [torch.ones(2)], "grads": {"x": torch.tensor([1.0, float("nan")])}}
    want = {"out": [torch.ones(2)], "grads": {"x": torch.tensor([1.0, 0.0])}}
    regions = {"padding": torch.tensor([False, True])}
    with pytest.raises(AssertionError, match=r"at \[1\] \(padding\): nan"):
        diff._compare(nan, want, case | {"regions": regions})
    assert dpo_differential.CASES == grpo_differential.CASES == 48


def test_the_exercises_page_gives_the_generated_inputs_and_each_task_without():
    """The Exercises page says how many generated inputs each differential check tries
    (the modules' CASES: 48 for exercises 15 and 16, 40 elsewhere) and names every task
    without one, exercise 5's and exercise 13's but permute_qk, as the registry has
    them: a check added or removed without the page changes fails here."""
    import importlib
    import pkgutil

    from smol.grading import checks
    from tests.nbtools import ROOT

    text = " ".join((ROOT / "book" / "exercises.md").read_text().split())
    assert f"Exercises 15 and 16 have {dpo_differential.CASES} generated inputs" in text
    assert (
        f"the others 40 (`permute_qk` {gguf_differential.CASES} weights in four" in text
    )
    assert len(gguf_differential.DTYPES) == 4
    cases = {
        m.name: importlib.import_module(f"{checks.__name__}.{m.name}").CASES
        for m in pkgutil.iter_modules(checks.__path__)
        if m.name.endswith("_differential") and not m.name.startswith("_")
    }
    assert cases.pop("dpo_differential") == cases.pop("grpo_differential") == 48
    assert set(cases.values()) == {40}, cases
    without = re.search(r"The tasks without one: (.+?)\.(?: |$)", text)[1]
    named = set(re.findall(r"`(\w+)`", without)) - {"Parameter", "permute_qk"}
    by_notebook = {
        n: [t.name for t in TASKS.values() if t.notebook == n] for n in NOTEBOOKS
    }
    assert (
        "those of exercise 5" in without
        and "of exercise 13 all but `permute_qk`" in without
    )
    named |= set(by_notebook["tying_and_init"]) | set(by_notebook["gguf"]) - {
        "permute_qk"
    }
    course = {t.name for t in TASKS.values() if t.notebook in NOTEBOOKS}
    assert named == course - set(GENERATED)
    assert NOTEBOOKS["tying_and_init"].startswith("05") and NOTEBOOKS[
        "gguf"
    ].startswith("13")


def test_a_stub_is_not_written_yet_there_too():
    from smol.grading.registry import NOT_WRITTEN

    def stub(*args, **kwargs):
        raise NotImplementedError

    for task, check in GENERATED.items():
        row = next(r for r in run_checks(task, stub).rows if r.check == check.name)
        assert row.message == NOT_WRITTEN, (task, row.message)
