"""What a set of multiple-choice verdicts (smol.evaluate's Results) says: accuracy and
normalised accuracy with their 95% Wilson intervals, per subject, and whether two runs
on the same questions differ (the sign test over the verdicts that changed)."""

from __future__ import annotations

import math
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
