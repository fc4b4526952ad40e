"""Seed statistics against scipy: t-intervals and paired differences."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from rla_ablate.dashboard.stats import mean_ci, paired_diff, seeds_for_power


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


def test_seeds_for_power_known_values_and_its_definition():
    from rla_ablate.dashboard.stats import paired_t_power

    # Standardized effect d = min_effect / sd of the differences; the textbook paired-t sample sizes (two-sided,
    # alpha 0.05, power 0.8): d = 0.5 -> 34 pairs, d = 1 -> 10 pairs.
    assert seeds_for_power(1.0, 0.5) == 34 and seeds_for_power(0.02, 0.01) == 34
    assert seeds_for_power(1.0, 1.0) == 10 and seeds_for_power(1.0, -1.0) == 10
    for sd, effect in ((0.003, 0.01), (0.05, 0.004), (0.011, 0.01)):
        n = seeds_for_power(sd, effect)
        # The fewest seeds that reach 80% power: n does, n - 1 does not.
        assert paired_t_power(n, effect, sd) >= 0.8
        assert n == 2 or paired_t_power(n - 1, effect, sd) < 0.8
    assert seeds_for_power(0.0, 0.01) == 2
    assert seeds_for_power(math.nan, 0.01) is None and seeds_for_power(0.01, 0.0) is None


def test_paired_t_power_matches_simulation():
    from rla_ablate.dashboard.stats import paired_t_power

    rng = np.random.default_rng(3)
    n, effect, sd = 10, 0.01, 0.01
    d = rng.normal(effect, sd, size=(20000, n))
    t = d.mean(axis=1) / (d.std(axis=1, ddof=1) / math.sqrt(n))
    simulated = float(np.mean(np.abs(t) > stats.t.ppf(0.975, n - 1)))
    assert paired_t_power(n, effect, sd) == pytest.approx(simulated, abs=0.015)


@pytest.mark.parametrize("mean, lo, hi, n, sign, verdict, why", [
    (0.050, 0.030, 0.070, 3, +1, "confirmed", "interval on the claimed side"),
    (-0.050, -0.070, -0.030, 3, -1, "confirmed", "interval on the claimed side"),
    (0.050, 0.030, 0.070, 3, -1, "contradicted", "reversed"),
    (0.005, 0.001, 0.009, 5, +1, "contradicted", "negligible"),     # real, but smaller than worth reporting
    (0.000, -0.004, 0.004, 5, +1, "contradicted", "negligible"),    # rules out the claimed effect
    (0.008, 0.001, 0.020, 5, +1, "unresolved", "below the minimum effect"),
    (0.010, -0.020, 0.040, 3, +1, "unresolved", "covers both"),
    (0.050, math.nan, math.nan, 1, +1, "unresolved", "1 paired seed: no interval"),
])
def test_verdict_rules(mean, lo, hi, n, sign, verdict, why):
    from rla_ablate.dashboard.stats import Summary, classify

    got, reason = classify(Summary(mean, lo, hi, n, 0.01), sign, 0.01)
    assert got == verdict and why in reason


def test_power_line_gives_a_seed_count_only_where_more_seeds_are_the_remedy():
    from rla_ablate.dashboard.spec import Claim
    from rla_ablate.dashboard.verdict import NO_POWER, Verdict

    claim = Claim(claim="c", treatment={"ablations": "no_fitting"}, reference={"ablations": "none"}, expect="higher",
                  min_effect=0.005)
    d = paired_diff({0: 3.000, 1: 3.100, 2: 3.050}, {0: 3.001, 1: 3.090, 2: 3.060})

    def verdict(diff, needed, mechanism="engaged", no_power=""):
        return Verdict("s", claim, "T", "R", "eval/val/loss", diff, "unresolved", "", needed, mechanism, "", no_power)

    needed = seeds_for_power(d.diff.std, 0.005)
    assert verdict(d, needed).seeds_text() == f"{needed} (rough: the spread from 3 seeds)" and needed > 3
    # from 5 paired seeds on, the count alone; a decided verdict's count is no advice to run more
    d5 = paired_diff({i: 3.0 + 0.01 * i for i in range(5)}, {i: 3.002 + 0.012 * (i % 2) for i in range(5)})
    assert verdict(d5, 7).seeds_text() == "7"
    decided = Verdict("s", claim, "T", "R", "eval/val/loss", d5, "confirmed", "", 7, "engaged", "", "")
    assert decided.seeds_text() == ("7 (decided at n=5; a rerun with this many seeds detects an effect of min_effect "
                                    "80% of the time)")
    # a count no one would run says how far the spread is from the effect looked for
    wide = paired_diff({i: 3.0 + 0.08 * (-1) ** i for i in range(6)}, {i: 3.0 for i in range(6)})
    needed = seeds_for_power(wide.diff.std, 0.005)
    assert needed > 100 and verdict(wide, needed).seeds_text() == (
        f"{needed} (the paired differences spread {wide.diff.std:.3g}, {wide.diff.std / 0.005:.0f}x min_effect: "
        "longer training, or a min_effect the question can afford, needs fewer)")
    # An invalid comparison: more seeds repeat it, so no count, and the line says what would help instead.
    assert verdict(d, None, "off", NO_POWER["off"]).seeds_text() == \
        "— (more seeds do not help until the mechanism is engaged)"
    assert verdict(d, None, "identical", NO_POWER["identical"]).seeds_text() == \
        "— (more seeds do not help: the results are identical)"
    assert verdict(d, None, "engaged", NO_POWER["not learned"]).seeds_text() == \
        "— (more seeds do not help until a model learns the task)"
    # Missing data says what is missing, never "needs 2+ seeds" when no seed was paired at all.
    assert verdict(None, None, "n/a").seeds_text() == "— (no paired seeds)"
    assert verdict(paired_diff({0: 3.0}, {0: 3.1}), None).seeds_text() == \
        "unknown (1 paired seed; 2+ estimate the spread)"
    saved = verdict(d, None, "off", NO_POWER["off"]).as_dict()
    assert saved["seeds_needed"] is None and saved["seeds_note"].startswith("— (more seeds do not help")


def test_many_claims_get_benjamini_hochberg_q_values():
    """Each verdict with a p-value gets its q among them (scipy's BH, checked by hand here); the lines name the
    decided verdicts that do not survive a 5% false-discovery rate, and the verdicts themselves stay as ruled."""
    from rla_ablate.dashboard.spec import Claim
    from rla_ablate.dashboard.stats import bh_adjust, classify
    from rla_ablate.dashboard.verdict import Verdict, adjust_for_many

    # p = 0.005, 0.01, 0.03, 0.04 -> q = 0.02, 0.02, 0.04, 0.04 (p_(i) m / i, then the running minimum from the top)
    assert bh_adjust([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.02, 0.04, 0.04, 0.02])
    claim = Claim(claim="c", metric="eval/val/loss", treatment={"ablations": "no_fitting"}, reference={"ablations": "none"},
                  expect="higher", min_effect=0.01)
    verdicts = []
    for shift, spread in ((0.5, 0.01), (0.05, 0.02), (0.03, 0.03), (0.0, 0.02)):
        treated = {s: 3.0 + shift + spread * (s - 1) ** 2 for s in range(3)}
        diff = paired_diff(treated, {s: 3.0 for s in range(3)})
        ruled, why = classify(diff.diff, +1, 0.01)
        verdicts.append(Verdict("spec", claim, "t", "r", "eval/val/loss", diff, ruled, why, None, "engaged"))
    verdicts.append(Verdict("spec", claim, "t", "r", None, paired_diff({0: 1.0}, {0: 0.0}), "unresolved", "", None,
                            "engaged"))  # one seed: no p, no q
    ps = [v.diff.p_value for v in verdicts[:4]]
    lines = adjust_for_many(verdicts)
    assert [v.q for v in verdicts[:4]] == pytest.approx(bh_adjust(ps)) and verdicts[4].q is None
    assert [v.verdict for v in verdicts[:4]] == [classify(v.diff.diff, +1, 0.01)[0] for v in verdicts[:4]]
    decided = [v for v in verdicts if v.verdict == "confirmed"]
    kept = [v for v in decided if v.q <= 0.05]
    assert len(decided) == 3 and len(kept) == 2
    assert lines[0].startswith("4 claims tested against zero at 0.05 each") and (
        "2 of the 3 verdicts that rest on excluding zero keep q <= 0.05") in lines[0]
    assert lines[1:] == [f"  q > 0.05: confirmed spec: c (p={verdicts[2].diff.p_value:.2g}, q={verdicts[2].q:.3g})"]
    # a negligible contradiction rests on the interval against the minimum effect, not on zero: never listed
    from rla_ablate.dashboard.verdict import rests_on_zero

    small = paired_diff({s: 3.0 + 0.001 * s for s in range(3)}, {s: 3.0 for s in range(3)})
    assert classify(small.diff, +1, 0.01)[0] == "contradicted"
    assert not rests_on_zero(Verdict("spec", claim, "t", "r", None, small, "contradicted", "", None, "engaged"))
    assert ", q=" in verdicts[0].diff_text() and verdicts[0].as_dict()["q"] == verdicts[0].q
    verdicts[0].q = None
    assert adjust_for_many(verdicts[:1]) == []  # one test: nothing to adjust for, and its q is its p
    assert verdicts[0].q == pytest.approx(verdicts[0].diff.p_value)
    # tested, but nothing decided by excluding zero: said so, not as '0 of the 0 verdicts'
    for v in verdicts:
        v.verdict = "unresolved"
    assert adjust_for_many(verdicts) == ["4 claims tested against zero at 0.05 each (Benjamini-Hochberg q "
                                         "beside each p); no verdict rests on excluding zero, so none needs q <= 0.05"]


def test_fractions_are_the_metrics_whose_intervals_stop_at_0_and_1():
    from rla_ablate.dashboard.data import fraction_metric

    assert all(fraction_metric(k) for k in ("eval/rla_choice/acc", "eval/piqa/acc_norm", "eval/mqar_kv8/acc_area",
                                            "eval/rla_complete/exact_match.strict-match"))
    assert not any(fraction_metric(k) for k in ("eval/val/loss", "eval/val/ppl", "train/loss", "diag/alpha_mean",
                                                "eval/rla_choice/examples", None))
