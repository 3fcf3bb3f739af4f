"""What a set of multiple-choice verdicts (smol.evaluate's Results) says: accuracy and
normalised accuracy with their 95% Wilson intervals, per subject, and whether two runs
on the same questions differ (the sign test over the verdicts that changed); and, for
sampled replies, pass@k (Chen et al., 2021) averaged over problems with a bootstrap
interval."""

from __future__ import annotations

import math
import numbers
import random
from collections import defaultdict

from smol.evaluate import Result


def wilson_interval(correct: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% (z = 1.96) Wilson score interval of an accuracy of correct / n."""
    if n == 0:
        return 0.0, 1.0
    p = correct / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def summarize(results: list[Result]) -> dict:
    """questions, correct, accuracy, its 95% interval, normalised accuracy."""
    n = len(results)
    correct = sum(r.correct for r in results)
    low, high = wilson_interval(correct, n)
    return {
        "questions": n,
        "correct": correct,
        "accuracy": correct / n if n else float("nan"),
        "ci_low": low,
        "ci_high": high,
        "acc_norm": sum(r.correct_norm for r in results) / n if n else float("nan"),
    }


def by_subject(results: list[Result]) -> dict[str, dict]:
    """summarize() of each subject's results, subjects in alphabetical order."""
    groups = defaultdict(list)
    for r in results:
        groups[r.question.subject].append(r)
    return {s: summarize(groups[s]) for s in sorted(groups)}


def subject_mean(results: list[Result], key: str = "acc_norm") -> float:
    """The mean over subjects of each subject's summarize()[key]: every subject weighs
    the same, however many questions it has (lighteval's MMLU score)."""
    subjects = by_subject(results)
    return sum(v[key] for v in subjects.values()) / len(subjects)


def sign_test(lost: int, gained: int) -> float:
    """Two-sided exact sign test (McNemar's exact test) of a paired comparison: if the
    change between two models were noise, each of the lost + gained questions whose
    verdict changed would be as likely to have gone either way, like a fair coin. The
    chance of a split at least as uneven as this one."""
    n, k = lost + gained, min(lost, gained)
    if n == 0:
        return 1.0
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n)


def paired(before: dict, after: dict) -> dict:
    """Compare two models' verdicts (question -> right or not) on the questions both
    answered: how many each got right, how many turned right to wrong (lost) and wrong
    to right (gained), and the sign test's p of that split."""
    common = sorted(before.keys() & after.keys())
    if not common:
        raise ValueError("the two runs share no question")
    lost = sum(before[q] and not after[q] for q in common)
    gained = sum(after[q] and not before[q] for q in common)
    return {
        "questions": len(common),
        "before": sum(before[q] for q in common) / len(common),
        "after": sum(after[q] for q in common) / len(common),
        "lost": lost,
        "gained": gained,
        "p": sign_test(lost, gained),
    }


def _count(name: str, value) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return int(value)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The chance that at least one of k replies drawn without replacement from n
    sampled replies, c of them right, is right: 1 - C(n - c, k) / C(n, k), the
    unbiased estimator of pass@k (Chen et al., 2021), as their product
    1 - prod_{i = n-c+1}^{n} (1 - k / i), which neither overflows nor divides huge
    numbers. (1 - (1 - c/n)^k, drawing with replacement, is biased.)"""
    n, c, k = _count("n", n), _count("c", c), _count("k", k)
    if k < 1:
        raise ValueError("k must be >= 1: pass@0 is not defined")
    if k > n:
        raise ValueError(f"k = {k} > n = {n}: k replies cannot be drawn from {n}")
    if c > n:
        raise ValueError(f"c = {c} > n = {n}: more right replies than replies")
    if n - c < k:
        return 1.0  # every k-subset holds a right reply
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def mean_pass_at_k(
    counts: list[tuple[int, int]],
    k: int,
    *,
    resamples: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> dict:
    """pass@k averaged over problems, each given as (n replies, c right), with a
    percentile bootstrap interval: the problems are drawn again with replacement
    `resamples` times (random.Random(seed): the same interval every run), and the
    interval holds the middle `level` of the resampled means. The per-problem
    estimates carry the sampling of replies too, so the interval covers both. When
    every problem has the same estimate (all 0 or all 1) the interval is that point:
    the bootstrap sees nothing beyond its data; report the problems' count beside it."""
    if not counts:
        raise ValueError("counts is empty: no problem to average over")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    if not isinstance(resamples, int) or isinstance(resamples, bool) or resamples < 1:
        raise ValueError(f"resamples must be a positive int, got {resamples!r}")
    estimates = []
    for i, (n, c) in enumerate(counts):
        try:
            estimates.append(pass_at_k(n, c, k))
        except (TypeError, ValueError) as e:
            raise type(e)(f"problem {i}: {e}") from None
    m, rng = len(estimates), random.Random(seed)
    means = sorted(sum(rng.choices(estimates, k=m)) / m for _ in range(resamples))
    tail = (1 - level) / 2
    return {
        "problems": m,
        "k": k,
        "pass_at_k": sum(estimates) / m,
        "ci_low": means[round(tail * (resamples - 1))],
        "ci_high": means[round((1 - tail) * (resamples - 1))],
    }
