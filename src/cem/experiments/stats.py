"""Statistics of the suite: seed means, and paired differences with a 95% confidence interval.

Runs are paired by seed: the same seed gives the same data order (and the same initial draw where the
architectures agree), so a finding compares variants seed by seed. Its verdict is *held* only when the
95% t-interval of the mean paired difference excludes zero with the paper's sign, *not held* when it
excludes zero with the opposite sign, and *inconclusive* otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return mean, std


def ci_halfwidth(values: list[float], level: float = 0.95) -> float:
    """Half-width of the t-interval of the mean of `values` (nan for fewer than two values)."""
    from scipy import stats

    n = len(values)
    if n < 2:
        return float("nan")
    return float(stats.t.ppf(0.5 + level / 2, n - 1)) * mean_std(values)[1] / math.sqrt(n)


@dataclass(frozen=True)
class Interval:
    """Mean of per-seed values with its 95% confidence interval [lo, hi] over n seeds."""

    mean: float
    lo: float
    hi: float
    n: int

    @classmethod
    def of(cls, values: list[float]) -> "Interval":
        m, h = mean_std(values)[0], ci_halfwidth(values)
        return cls(m, m - h, m + h, len(values))

    def verdict(self, sign: int = 1) -> str:
        """`held` when the interval excludes 0 on the side of `sign`, `not held` on the other side. With one
        seed there is no interval: the sign alone decides (as in the paper's single runs)."""
        lo, hi = (self.lo, self.hi) if self.n > 1 else (self.mean, self.mean)
        if (sign > 0 and lo > 0) or (sign < 0 and hi < 0):
            return "held"
        if (sign > 0 and hi < 0) or (sign < 0 and lo > 0):
            return "not held"
        return "inconclusive"

    def within(self, tolerance: float) -> str:
        """Equivalence: `held` when the whole interval lies in [-tolerance, tolerance], `not held` when it lies
        wholly outside, `inconclusive` otherwise."""
        lo, hi = (self.lo, self.hi) if self.n > 1 else (self.mean, self.mean)
        if -tolerance <= lo and hi <= tolerance:
            return "held"
        if lo > tolerance or hi < -tolerance:
            return "not held"
        return "inconclusive"

    def text(self, fmt: str = "+.3f") -> str:
        if self.n < 2:
            return f"{self.mean:{fmt}} (one seed, no interval)"
        return f"{self.mean:{fmt}} [95% CI {self.lo:{fmt}}, {self.hi:{fmt}}], {self.n} paired seeds"

    def to_dict(self) -> dict:
        return {"mean": self.mean, "lo": self.lo, "hi": self.hi, "n": self.n}
