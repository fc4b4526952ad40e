"""Seed statistics: mean with a two-sided t confidence interval, and paired differences by seed."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class Summary:
    """Mean of n values with a t-interval [lo, hi]; with n < 2 the interval is undefined (NaN)."""

    mean: float
    lo: float
    hi: float
    n: int
    std: float

    @property
    def half_width(self) -> float:
        return (self.hi - self.lo) / 2

    def format(self, digits: int = 3, signed: bool = False) -> str:
        if self.n == 0:
            return "missing"
        fmt = f"{{:{'+' if signed else ''}.{digits}f}}"
        text = fmt.format(self.mean)
        if self.n >= 2:
            text += f" ± {self.half_width:.{digits}f}"
        return text + f" (n={self.n})"


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> Summary:
    """Mean and the `confidence` t-interval over seeds: mean ± t_{(1+c)/2, n-1} · s / sqrt(n)."""
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    n = int(x.size)
    if n == 0:
        return Summary(math.nan, math.nan, math.nan, 0, math.nan)
    mean = float(x.mean())
    if n == 1:
        return Summary(mean, math.nan, math.nan, 1, math.nan)
    std = float(x.std(ddof=1))
    half = float(stats.t.ppf((1 + confidence) / 2, n - 1)) * std / math.sqrt(n)
    return Summary(mean, mean - half, mean + half, n, std)


@dataclass(frozen=True)
class PairedDiff:
    """treatment - reference over the seeds both have: mean, t-interval and the paired t-test p-value."""

    diff: Summary
    p_value: float
    seeds: tuple

    def format(self, digits: int = 3) -> str:
        if self.diff.n == 0:
            return "no paired seeds"
        text = self.diff.format(digits, signed=True)
        return text + (f", p={self.p_value:.2g}" if math.isfinite(self.p_value) else "")


def paired_diff(treatment: Mapping[object, float], reference: Mapping[object, float],
                confidence: float = 0.95) -> PairedDiff:
    """Difference treatment - reference paired by seed (the keys); seeds missing on either side are left out."""
    seeds = tuple(sorted((s for s in treatment if s in reference
                          and math.isfinite(treatment[s]) and math.isfinite(reference[s])), key=str))
    d = [treatment[s] - reference[s] for s in seeds]
    summary = mean_ci(d, confidence)
    p = math.nan
    if len(d) >= 2:
        std = float(np.std(d, ddof=1))
        if std > 0:
            t = summary.mean / (std / math.sqrt(len(d)))
            p = float(2 * stats.t.sf(abs(t), len(d) - 1))
        else:
            p = 0.0 if summary.mean != 0 else 1.0
    return PairedDiff(summary, p, seeds)


# The power analysis behind "seeds needed": a two-sided paired t-test at level ALPHA with power POWER.
ALPHA, POWER = 0.05, 0.8
MAX_SEEDS = 100_000


def paired_t_power(n: int, effect: float, sd: float, alpha: float = ALPHA) -> float:
    """Power of the two-sided paired t-test with n pairs to detect a true mean difference `effect` when the
    differences have standard deviation `sd`: P(|T| > t_{1-α/2, n-1}) with T ~ noncentral t(n-1, δ),
    δ = effect·√n / sd."""
    if n < 2:
        return math.nan
    if sd == 0:
        return 1.0 if effect != 0 else alpha
    df = n - 1
    crit = float(stats.t.ppf(1 - alpha / 2, df))
    nc = abs(effect) * math.sqrt(n) / sd
    return float(stats.nct.sf(crit, df, nc) + stats.nct.cdf(-crit, df, nc))


def seeds_for_power(sd: float, effect: float, power: float = POWER, alpha: float = ALPHA) -> int | None:
    """The fewest seeds n >= 2 whose paired t-test (two-sided, level `alpha`) detects a mean difference of
    `effect` with probability `power`, if the differences vary with standard deviation `sd` (the observed
    one). None when it cannot be said (sd unknown or not finite, effect 0); MAX_SEEDS + 1 past the cap."""
    if not (math.isfinite(sd) and math.isfinite(effect)) or effect == 0 or sd < 0:
        return None
    if sd == 0:
        return 2

    def enough(n: int) -> bool:
        return paired_t_power(n, effect, sd, alpha) >= power

    # Power grows with n. Start at the normal approximation n ≈ ((z_{1-α/2} + z_power)·sd/effect)², bracket
    # the answer between a failing lo and a passing hi, then bisect.
    z = float(stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(power))
    start = min(MAX_SEEDS, max(2, int((z * sd / abs(effect)) ** 2)))
    if enough(start):
        lo, hi = 1, start                 # n = 1 has no test: it always fails
    else:
        lo, hi = start, start
        while not enough(hi):
            if hi > MAX_SEEDS:
                return MAX_SEEDS + 1
            lo, hi = hi, min(2 * hi, MAX_SEEDS + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if mid >= 2 and enough(mid):
            hi = mid
        else:
            lo = mid
    return hi


def bh_adjust(p_values: Sequence[float]) -> list[float]:
    """Benjamini-Hochberg adjusted p-values (q-values) of a family of tests, in their order (scipy's
    `false_discovery_control`): rejecting every q <= α keeps the expected share of false discoveries among the
    rejections at α or below (independent or positively dependent tests)."""
    return [float(q) for q in stats.false_discovery_control(list(p_values), method="bh")]


CONFIRMED, CONTRADICTED, UNRESOLVED = "confirmed", "contradicted", "unresolved"


def classify(diff: Summary, sign: int, min_effect: float) -> tuple[str, str]:
    """Verdict on a claim that the paired difference (treatment - reference) has sign `sign` (+1 or -1) and
    is at least `min_effect` in size, from its mean and 95% t-interval [lo, hi]. Oriented (e = sign·diff):

      confirmed     the interval lies entirely on the claimed side (e_lo > 0) and the mean e >= min_effect;
      contradicted  the interval excludes every effect of min_effect or more in the claimed direction
                    (e_hi < min_effect): either the effect goes the other way (e_hi < 0, 'reversed') or it is,
                    at most, too small to be worth reporting ('negligible');
      unresolved    anything else, and always with fewer than two paired seeds (no interval).

    The two are exclusive: confirmed needs e >= min_effect, contradicted e <= e_hi < min_effect."""
    if diff.n < 2 or not (math.isfinite(diff.lo) and math.isfinite(diff.hi)):
        return UNRESOLVED, (f"{diff.n} paired seed{'s' if diff.n != 1 else ''}: no interval"
                            if diff.n else "no paired seeds")
    lo, hi = sorted((sign * diff.lo, sign * diff.hi))
    mean = sign * diff.mean
    if lo > 0 and mean >= min_effect:
        return CONFIRMED, f"interval on the claimed side and mean {mean:+.4g} >= {min_effect:g}"
    if hi < min_effect:
        if hi < 0:
            return CONTRADICTED, "reversed: the interval lies entirely on the other side"
        return CONTRADICTED, f"negligible: the interval rules out an effect of {min_effect:g} or more"
    if lo > 0:
        return UNRESOLVED, f"on the claimed side, but the mean {mean:+.4g} is below the minimum effect {min_effect:g}"
    return UNRESOLVED, "the interval covers both no effect and an effect of the claimed size"
