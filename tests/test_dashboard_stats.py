"""Seed statistics against scipy: t-intervals and paired differences."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from rla_ablate.dashboard.stats import mean_ci, paired_diff


@pytest.mark.parametrize("n", [2, 3, 5, 17])
@pytest.mark.parametrize("confidence", [0.9, 0.95])
def test_mean_ci_matches_scipy_t_interval(n, confidence):
    x = np.random.default_rng(42 + n).normal(3.0, 0.7, size=n)
    s = mean_ci(list(x), confidence)
    lo, hi = stats.t.interval(confidence, n - 1, loc=x.mean(), scale=stats.sem(x))
    assert s.n == n and s.mean == pytest.approx(x.mean(), rel=1e-12)
    assert (s.lo, s.hi) == (pytest.approx(lo, rel=1e-10), pytest.approx(hi, rel=1e-10))
    assert s.std == pytest.approx(x.std(ddof=1), rel=1e-12)


def test_mean_ci_known_value_and_edge_cases():
    # n = 2: t_{0.975, 1} = 12.7062..., sem = |a - b| / 2.
    s = mean_ci([1.0, 2.0])
    assert s.half_width == pytest.approx(12.706204736 * 0.5, rel=1e-9)
    one = mean_ci([4.2])
    assert one.n == 1 and one.mean == 4.2 and math.isnan(one.lo) and one.format() == "4.200 (n=1)"
    assert mean_ci([]).n == 0 and mean_ci([]).format() == "missing"
    # A diverged seed (NaN loss) is not a number to average; it is left out.
    assert mean_ci([1.0, float("nan"), 3.0]).n == 2
    assert mean_ci([1.0, 2.0]).format(2) == "1.50 ± 6.35 (n=2)"


def test_paired_diff_matches_scipy_ttest_rel():
    rng = np.random.default_rng(42)
    ref = {seed: 3.0 + rng.normal(0, 0.2) for seed in range(6)}
    treat = {seed: ref[seed] - 0.05 + rng.normal(0, 0.02) for seed in range(6)}
    d = paired_diff(treat, ref)
    a = np.array([treat[s] for s in range(6)])
    b = np.array([ref[s] for s in range(6)])
    res = stats.ttest_rel(a, b)
    lo, hi = res.confidence_interval(0.95)
    assert d.seeds == tuple(range(6))
    assert d.diff.mean == pytest.approx((a - b).mean(), rel=1e-12)
    assert (d.diff.lo, d.diff.hi) == (pytest.approx(lo, rel=1e-9), pytest.approx(hi, rel=1e-9))
    assert d.p_value == pytest.approx(res.pvalue, rel=1e-9)
    # Pairing matters: the seed-to-seed spread (0.2) would swamp a 0.05 effect in an unpaired comparison.
    assert d.p_value < 0.001 < stats.ttest_ind(a, b).pvalue


def test_paired_diff_uses_only_common_seeds():
    d = paired_diff({0: 1.0, 1: 2.0, 2: 4.0, 3: float("nan")}, {1: 1.5, 2: 3.0, 3: 1.0, 4: 9.0})
    assert d.seeds == (1, 2) and d.diff.n == 2 and d.diff.mean == pytest.approx(0.75)
    assert paired_diff({0: 1.0}, {1: 1.0}).format() == "no paired seeds"
    single = paired_diff({0: 1.25}, {0: 1.0})
    assert single.diff.n == 1 and math.isnan(single.p_value) and single.format() == "+0.250 (n=1)"
