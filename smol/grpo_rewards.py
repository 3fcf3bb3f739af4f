"""The rewards of GRPO training (smol.grpo_train). A reward function takes (problem,
reply) and returns a number; a reply's reward is the weighted sum of the functions'
(task_rewards: 1 for a right answer, tasks.check, and format_weight for a reply that
is a number only, tasks.well_formed). A reward function that raises or returns a
number that is not finite stops the run with a RewardError that names it, the
question and the reply, before that step changes a weight: a checker that fails once
may be wrong unnoticed elsewhere."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from smol import tasks
from smol.tasks import Problem

Reward = Callable[[Problem, str], float]


class RewardError(ValueError):
    """A reward function raised or gave a number that is not finite."""


def correct(problem: Problem, reply: str) -> float:
    """1 when the reply's last number is the answer (tasks.check), else 0."""
    return float(tasks.check(reply, problem.answer))


def number_only(problem: Problem, reply: str) -> float:
    """1 when the reply is one number and nothing else (tasks.well_formed), else 0."""
    return float(tasks.well_formed(reply))


def task_rewards(format_weight: float = 0.0) -> dict[str, tuple[Reward, float]]:
    """{name: (function, weight)}: correct with weight 1, and number_only with
    format_weight when it is not 0."""
    rewards = {"correct": (correct, 1.0)}
    if format_weight:
        rewards["format"] = (number_only, float(format_weight))
    return rewards


def score(rewards: dict, problems: list[Problem], replies: list[str]) -> torch.Tensor:
    """(N,) float32: each reply's weighted sum of rewards. A function that raises or
    gives a value that is not a finite number is a RewardError naming it."""
    if len(problems) != len(replies):
        raise ValueError(f"{len(problems)} problems but {len(replies)} replies")
    total = torch.zeros(len(replies))
    for name, (function, weight) in rewards.items():
        for i, (problem, reply) in enumerate(zip(problems, replies)):
            where = f"on {problem.question!r} and the reply {reply[:60]!r}"
            try:
                value = float(function(problem, reply))
            except Exception as e:
                raise RewardError(
                    f"reward {name!r} raised {type(e).__name__}: {e} {where}; "
                    "stopping before this step trains"
                ) from e
            if not math.isfinite(value):
                raise RewardError(
                    f"reward {name!r} gave {value} {where}: not a finite number; "
                    "stopping before this step trains"
                )
            total[i] += weight * value
    return total


def check_rewards(rewards) -> dict:
    """{name: (function, weight)}, each function callable and each weight finite."""
    if not isinstance(rewards, dict) or not rewards:
        raise ValueError(f"rewards must be a non-empty dict, got {rewards!r}")
    for name, entry in rewards.items():
        ok = isinstance(entry, tuple) and len(entry) == 2 and callable(entry[0])
        weight = entry[1] if ok else None
        real = isinstance(weight, (int, float)) and not isinstance(weight, bool)
        if not (real and math.isfinite(weight)):
            raise ValueError(
                f"reward {name!r} must be (function, finite weight), got {entry!r}"
            )
    return dict(rewards)
