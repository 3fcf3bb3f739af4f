"""smol.stats.pass_at_k against brute force and the wrong versions it must not be
(drawing with replacement, an off-by-one in the product, k > n let through), and
mean_pass_at_k's bootstrap interval."""

import itertools
import math
import random
from fractions import Fraction

import numpy as np
import pytest

from smol import stats


def brute_force(n: int, c: int, k: int) -> float:
    """The share of k-subsets of n replies (the first c right) with a right one."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


def biased(n: int, c: int, k: int) -> float:
    """k draws with replacement: 1 - (1 - c/n)^k."""
    return 1 - (1 - c / n) ** k


def off_by_one(n: int, c: int, k: int) -> float:
    """The product started one term early, over n - c .. n."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c, n + 1))


def no_k_check(n: int, c: int, k: int) -> float:
    """The product formula without refusing k > n."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def agrees_with_brute_force(estimator) -> bool:
    return all(
        math.isclose(estimator(n, c, k), brute_force(n, c, k), abs_tol=1e-12)
        for n in range(1, 8)
        for c in range(n + 1)
        for k in range(1, n + 1)
    )


def test_pass_at_k_is_the_share_of_k_subsets_holding_a_right_reply():
    assert agrees_with_brute_force(stats.pass_at_k)
    assert not agrees_with_brute_force(biased)
    assert not agrees_with_brute_force(off_by_one)


def expected(estimator, n: int, k: int, p: float) -> float:
    """The estimator's mean over c ~ Binomial(n, p): what it averages to over many
    problems whose replies are right with chance p."""
    return sum(
        math.comb(n, c) * p**c * (1 - p) ** (n - c) * estimator(n, c, k)
        for c in range(n + 1)
    )


@pytest.mark.parametrize("n, k, p", [(8, 4, 0.1), (10, 3, 0.35), (5, 5, 0.8)])
def test_pass_at_k_is_unbiased_and_the_with_replacement_estimate_is_not(n, k, p):
    truth = 1 - (1 - p) ** k  # k independent replies, each right with chance p
    assert math.isclose(expected(stats.pass_at_k, n, k, p), truth, rel_tol=1e-12)
    assert expected(biased, n, k, p) < truth - 1e-3  # it underestimates


def test_pass_at_k_known_values():
    assert math.isclose(stats.pass_at_k(4, 2, 2), 5 / 6)  # 1 - C(2,2)/C(4,2)
    assert math.isclose(stats.pass_at_k(10, 3, 1), 0.3)  # pass@1 is c / n
    assert stats.pass_at_k(10, 0, 10) == 0.0
    assert stats.pass_at_k(10, 8, 3) == 1.0  # 2 wrong replies cannot fill 3 places
    assert stats.pass_at_k(10, 7, 3) < 1.0  # 3 wrong ones can
    assert stats.pass_at_k(np.int64(4), np.int64(2), np.int64(2)) == pytest.approx(
        5 / 6
    )


def test_pass_at_k_stays_exact_where_the_binomials_are_huge():
    n, c, k = 5000, 7, 1000  # C(5000, 1000) has more than 1000 digits
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert math.isclose(stats.pass_at_k(n, c, k), float(exact), rel_tol=1e-12)


@pytest.mark.parametrize(
    "n, c, k, error, words",
    [
        (3, 1, 4, ValueError, "k = 4 > n = 3"),
        (3, 4, 1, ValueError, "c = 4 > n = 3"),
        (3, -1, 1, ValueError, "c must be >= 0"),
        (-3, 0, 1, ValueError, "n must be >= 0"),
        (3, 1, -1, ValueError, "k must be >= 0"),
        (3, 1, 0, ValueError, "k must be >= 1"),
        (3.0, 1, 1, TypeError, "n must be an int"),
        (3, 1.5, 1, TypeError, "c must be an int"),
        (3, 1, True, TypeError, "k must be an int"),
    ],
)
def test_pass_at_k_names_bad_input(n, c, k, error, words):
    with pytest.raises(error, match=words):
        stats.pass_at_k(n, c, k)


def test_k_above_n_is_refused_where_the_formula_alone_says_certain():
    assert no_k_check(3, 1, 4) == 1.0  # 4 of 3 replies "surely" hold the right one
    with pytest.raises(ValueError, match="k = 4 > n = 3"):
        stats.pass_at_k(3, 1, 4)


def test_mean_pass_at_k_averages_problems_and_brackets_the_mean():
    counts = [(8, c) for c in (0, 1, 3, 8, 2, 0)]
    s = stats.mean_pass_at_k(counts, 4)
    mean = sum(stats.pass_at_k(n, c, 4) for n, c in counts) / len(counts)
    assert s["problems"] == 6 and s["k"] == 4
    assert s["pass_at_k"] == pytest.approx(mean)
    assert s["ci_low"] < s["pass_at_k"] < s["ci_high"]
    assert stats.mean_pass_at_k(counts, 4) == s  # the same seed, the same interval
    assert stats.mean_pass_at_k(counts, 4, seed=1) != s


def test_mean_pass_at_k_interval_has_the_normal_width_on_many_problems():
    # 400 problems, half always right, half never: the mean's standard error is
    # 0.5 / sqrt(400) = 0.025, so a 95% interval is about 2 * 1.96 * 0.025 wide
    counts = [(4, 4), (4, 0)] * 200
    s = stats.mean_pass_at_k(counts, 2)
    assert s["ci_high"] - s["ci_low"] == pytest.approx(0.098, abs=0.01)
    assert s["ci_low"] < 0.5 < s["ci_high"]
    narrow = stats.mean_pass_at_k(counts, 2, level=0.5)
    assert narrow["ci_high"] - narrow["ci_low"] == pytest.approx(0.0337, abs=0.006)


def test_mean_pass_at_k_covers_the_truth_about_as_often_as_it_says():
    rng, p, k, covered = random.Random(0), 0.3, 2, 0
    truth = 1 - (1 - p) ** k
    for trial in range(200):
        counts = [(4, sum(rng.random() < p for _ in range(4))) for _ in range(60)]
        s = stats.mean_pass_at_k(counts, k, resamples=400, seed=trial)
        covered += s["ci_low"] <= truth <= s["ci_high"]
    assert 0.88 <= covered / 200 <= 0.99


def test_mean_pass_at_k_all_alike_gives_a_point_and_bad_input_is_named():
    s = stats.mean_pass_at_k([(5, 0)] * 10, 3)
    assert s["pass_at_k"] == s["ci_low"] == s["ci_high"] == 0.0
    with pytest.raises(ValueError, match="empty"):
        stats.mean_pass_at_k([], 1)
    with pytest.raises(ValueError, match="problem 1: k = 3 > n = 2"):
        stats.mean_pass_at_k([(4, 1), (2, 1)], 3)
    with pytest.raises(ValueError, match="level"):
        stats.mean_pass_at_k([(4, 1)], 1, level=95)
    with pytest.raises(ValueError, match="resamples"):
        stats.mean_pass_at_k([(4, 1)], 1, resamples=0)
