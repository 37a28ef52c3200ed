"""Statistics of the suite: seed means, paired differences with a 95% confidence interval and a p-value,
and the Holm-Bonferroni correction over a family of findings.

Runs are paired by seed: the same seed gives the same data order and the same initial value of every
same-named, same-shaped parameter (`LanguageModel(cfg, init_seed)`: common random numbers), so a finding
compares variants seed by seed, on differences of test loss (log-perplexity, nats per token). Its raw
verdict is *held* only when the 95% t-interval of the mean paired difference excludes zero with the
paper's sign, *not held* when it excludes zero with the opposite sign, and *inconclusive* otherwise; the
adjusted verdict reads the Holm-adjusted p-value at 0.05 the same way.
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
    p: float = float("nan")  # two-sided p-value of a zero mean (one-sample t-test; nan for fewer than 2 values)

    @classmethod
    def of(cls, values: list[float]) -> "Interval":
        if not values:  # nothing to pair (e.g. every pair ran on two processors): no mean, no verdict
            return cls(math.nan, math.nan, math.nan, 0)
        m, h = mean_std(values)[0], ci_halfwidth(values)
        return cls(m, m - h, m + h, len(values), t_test_p(values))

    @property
    def se(self) -> float:
        """Standard error of the mean, recovered from the interval's half-width (nan with fewer than 2 seeds)."""
        from scipy import stats

        if self.n < 2:
            return float("nan")
        return (self.hi - self.mean) / float(stats.t.ppf(0.975, self.n - 1))

    def exceeds(self, margin: float) -> float:
        """One-sided p-value that the mean exceeds `margin` is false (H0: mean >= margin), for non-inferiority."""
        from scipy import stats

        if self.n < 2 or self.hi == self.lo:
            return float("nan")
        return float(stats.t.cdf((self.mean - margin) / self.se, self.n - 1))

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

    def detectable(self, power: float = 0.8) -> float | None:
        """The smallest true difference (nats) that these seeds would detect with `power` in a two-sided 5%
        t-test at the observed spread (statsmodels' `TTestPower`): what the seeds could have resolved. None
        with fewer than 2 seeds or no spread."""
        from statsmodels.stats.power import TTestPower

        if self.n < 2 or self.hi == self.lo:
            return None
        effect = TTestPower().solve_power(effect_size=None, nobs=self.n, alpha=0.05, power=power, alternative="two-sided")
        return float(effect) * self.se * math.sqrt(self.n)

    def text(self, fmt: str = "+.3f", unit: str = "", seeds: str = "paired seeds") -> str:
        """The mean with its interval (in `unit`, if given) and the seeds it rests on (`seeds`: "seeds" where each
        value is one run's against a fixed reference, nothing to pair)."""
        unit = f" {unit}" if unit else ""
        if self.n < 2:
            return f"{self.mean:{fmt}}{unit} (one seed, no interval)"
        return f"{self.mean:{fmt}} [95% CI {self.lo:{fmt}}, {self.hi:{fmt}}]{unit}, {self.n} {seeds}"

    def to_dict(self) -> dict:
        return {"mean": self.mean, "lo": self.lo, "hi": self.hi, "n": self.n, "p": self.p}


def t_test_p(values: list[float]) -> float:
    """Two-sided p-value of the one-sample t-test of a zero mean (nan for fewer than two values, or no spread)."""
    from scipy import stats

    if len(values) < 2 or len(set(values)) < 2:
        return float("nan")
    return float(stats.ttest_1samp(values, 0.0).pvalue)


def holm(pvalues: list[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (statsmodels), in the order given; nan stays nan (not counted)."""
    from statsmodels.stats.multitest import multipletests

    idx = [i for i, p in enumerate(pvalues) if p == p]
    out = [float("nan")] * len(pvalues)
    if idx:
        adjusted = multipletests([pvalues[i] for i in idx], alpha=0.05, method="holm")[1]
        for i, a in zip(idx, adjusted):
            out[i] = float(a)
    return out
