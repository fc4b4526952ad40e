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
