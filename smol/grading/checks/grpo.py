"""16 GRPO: each completion's advantage against its group, a group of one refused
(the clipped objective: `grpo_loss`, a batch loss of both: `grpo_batch`)."""

import torch

from smol.grading.checks._util import close, is_tensor, untouched
from smol.grading.registry import probe_check, task

task(
    "group_advantages",
    "grpo",
    "group_advantages(rewards, group_size): each reward against its group's mean "
    "and std",
)


def _groups(rows: list[list[float]]) -> dict:
    """Groups of one size, consecutive, as (N,) float32 rewards."""
    return {"rewards": torch.tensor(rows).flatten(), "group_size": len(rows[0])}


def _spread_cases():
    """Groups of 2, 3, 4, 6 and 8 rewards, each group's mean and spread its own, no
    group of equal rewards: a checker's 0 and 1, partial credit, a scalar score,
    scores near 3000 (a length in tokens, a sum of log-probabilities: the variance as
    E[x^2] - E[x]^2 cancels there); and bfloat16 rewards (advantages within
    bfloat16's rounding)."""
    pairs = [[0.0, 1.0], [1.0, 0.0], [0.5, 2.0], [3.0, 1.0]]
    fours = torch.tensor([[0.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    fours = torch.cat([fours, torch.randint(0, 3, (3, 2)) / 2], 1)
    eights = torch.randn(2, 8) * 2 + torch.tensor([[5.0], [-3.0]])
    return [
        _groups(pairs),
        _groups(fours.tolist()),
        _groups(eights.tolist()),
        _groups([[1.0, 0.0, 0.0], [2.0, 5.0, 3.0]]),
        _groups([[0.0, 1.0, 1.0, 1.0, 0.0, 1.0]]),  # one prompt: the batch is a group
        _groups((eights + 3000.0).tolist()),
        {**_groups(pairs), "rewards": _groups(pairs)["rewards"].bfloat16()},
    ]


def _rounding_neighbours(value: float, n: int) -> list[float]:
    """n rewards equal up to rounding: value and the next float32 after it, in turn."""
    x = torch.tensor(value)
    after = torch.nextafter(x, torch.tensor(float("inf")))
    return [(x if i % 2 == 0 else after).item() for i in range(n)]


def _equal_cases():
    """Groups of equal rewards (advantages 0), equal up to float32 rounding (std
    1e-8: the 1e-4 keeps them near 0, whichever way the mean rounds), and 16 rewards
    1e-4 apart (std 5e-5, where std + 1e-4 and max(std, 1e-4) part; the biased std,
    the other check's, is within 2% of the unbiased)."""
    return [
        _groups([[1.0] * 4, [0.0] * 4, _rounding_neighbours(0.3, 4), [2.0] * 4]),
        _groups([[0.5, 0.5], [1.0, 1.0], _rounding_neighbours(0.7, 2)]),
        _groups([[0.25] * 8, _rounding_neighbours(1.3, 8)]),
        _groups([[1.0] * 3]),
        _groups([[0.0, 1e-4] * 8, [0.3] * 16]),
    ]


def _what_rewards(c: dict) -> str:
    G = c["group_size"]
    dtype = str(c["rewards"].dtype).removeprefix("torch.")
    return f"{len(c['rewards']) // G} groups of {G}, {dtype}"


def _run_advantages(fn, inputs):
    return [fn(c["rewards"], c["group_size"]) for c in inputs]


def _judge_advantages(atol: float, rtol: float):
    def judge(inputs, outputs) -> None:
        from smol.grpo import group_advantages

        assert isinstance(outputs, list) and len(outputs) == len(inputs)
        for c, out in zip(inputs, outputs):
            want = group_advantages(c["rewards"], c["group_size"])
            wide = c["rewards"].dtype == torch.bfloat16  # 8 bits of mantissa
            a, r = (2e-2, 2e-2) if wide else (atol, rtol)
            close(is_tensor(out), want, f"the advantages ({_what_rewards(c)})", a, r)

    return judge


for name, points, hint, make, judge in (
    (
        "each group's own mean and std (unbiased, as torch.std)",
        2,
        "the rewards of a prompt's group are consecutive: rewards.view(-1, group_size) "
        "gives a row per group; subtract each row's mean and divide by its std "
        "(.std(1, keepdim=True), unbiased, as torch.std and TRL), then flatten back; "
        "the whole batch's mean and std mix the prompts; mean(x**2) - mean(x)**2 "
        "loses the variance of rewards far from 0",
        _spread_cases,
        _judge_advantages(1e-3, 1e-3),
    ),
    (
        "std + 1e-4: equal rewards give 0, not NaN; near-equal ones stay near 0",
        2,
        "divide by std + 1e-4 (smol.grpo.EPS, TRL's), every std: equal rewards have "
        "std 0, and 0 / 0 is NaN; rewards equal up to rounding a std of 1e-8, which "
        "alone blows rounding up to advantages near +-1; max(std, 1e-4) is another "
        "number where rewards differ by 1e-4",
        _equal_cases,
        _judge_advantages(1e-2, 1e-2),  # near 0: the mean's rounding, / 1e-4
    ),
):
    probe_check("group_advantages", name, points, hint, inputs=make, judge=judge)(
        _run_advantages
    )


def _judge_rewards_kept(inputs, outputs) -> None:
    for c, after in zip(inputs, outputs):
        untouched(after, c["rewards"], f"the rewards ({_what_rewards(c)})")


@probe_check(
    "group_advantages",
    "the rewards are left unchanged",
    1,
    "rewards.view(...) shares the caller's memory: grouped -= grouped.mean(...) "
    "writes into it; write grouped - grouped.mean(...) instead",
    inputs=lambda: _spread_cases()[:3],
    judge=_judge_rewards_kept,
)
def _(fn, inputs):
    for c in inputs:
        fn(c["rewards"], c["group_size"])
    return [c["rewards"] for c in inputs]


def _judge_refused(inputs, outputs) -> None:
    for c, out in zip(inputs, outputs):
        got = f"{out['raised']}: {out['message']}" if out["raised"] else out["message"]
        assert out["raised"] == "ValueError" and "group" in out["message"].lower(), (
            f"{_what_rewards(c)}: expected a ValueError that names group_size; {got}"
        )


@probe_check(
    "group_advantages",
    "group_size < 2 is refused: a ValueError that names group_size",
    1,
    "a group of one has no baseline to compare with (torch.std of one value is NaN, "
    "and TRL asks for at least two generations): if group_size < 2, raise "
    'ValueError(f"group_size must be at least 2, got {group_size}")',
    inputs=lambda: [_groups([[1.0], [0.0], [0.5]]), _groups([[2.0]])],
    judge=_judge_refused,
)
def _(fn, inputs):
    """The error fn raises on each case (its type and message), or what it returns
    instead, as a string."""
    out = []
    for c in inputs:
        try:
            result = fn(c["rewards"], c["group_size"])
        except Exception as e:  # noqa: BLE001 -- the error is what is judged
            out.append({"raised": type(e).__name__, "message": str(e)})
        else:
            out.append({"raised": "", "message": f"it returned {result!r}"[:200]})
    return out
