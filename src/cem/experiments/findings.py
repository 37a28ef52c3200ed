"""What an analysis produces and sees: a `Finding` (a claim, its verdict and the paired difference it rests
on), the `Context` of an analysis, and the finding helpers on seed-paired differences (`cem.experiments.stats`).

Findings are judged on seed-paired differences: *held* only when the 95% confidence interval of the mean
paired difference excludes zero with the paper's sign; "A is close to B" findings are equivalence tests
(the whole interval of the relative difference inside the tolerance).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from .scales import Scale
from .stats import Interval
from .sweep import Variant


@dataclass
class Finding:
    claim: str
    verdict: str  # "held" | "not held" | "inconclusive"
    evidence: str
    difference: dict | None = None  # the paired difference (mean, lo, hi, n) the verdict rests on

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Context:
    """What an analysis sees: the scale, one row per variant (per-seed metrics in `*_per_seed`), where the
    runs live, and the data directory (analyses that evaluate trained models need it)."""

    scale: Scale
    rows: list[dict]
    variants: list[Variant]
    root: Path
    out: Path
    data_dir: str | None = None
    device: str = "auto"


# --- findings on seed-paired differences -------------------------------------------------------------


def row(rows: list[dict], label: str) -> dict:
    for r in rows:
        if r["label"] == label:
            return r
    raise KeyError(label)


def per_seed(rows, label: str, key: str = "test_perplexity") -> list[float]:
    return row(rows, label)[key + "_per_seed"]


def _means(rows, *labels) -> str:
    return "; ".join(f"{lab}: {row(rows, lab)['test_perplexity']:.3f}" for lab in labels)


def lower(rows, better: str, worse: str, claim: str) -> Finding:
    """Claim: `better` has a lower test perplexity than `worse` (paired difference worse - better > 0)."""
    d = Interval.of([w - b for b, w in zip(per_seed(rows, better), per_seed(rows, worse))])
    rel = d.mean / row(rows, worse)["test_perplexity"]
    evidence = f"{_means(rows, better, worse)}; paired difference {d.text()} ({rel:+.1%} of {worse})"
    return Finding(claim, d.verdict(+1), evidence, d.to_dict())


def close(rows, a: str, b: str, claim: str, tolerance: float) -> Finding:
    """Claim: `a` is within `tolerance` (relative) of `b`: the interval of (a - b) / b lies inside ±tolerance."""
    d = Interval.of([(x - y) / y for x, y in zip(per_seed(rows, a), per_seed(rows, b))])
    evidence = f"{_means(rows, a, b)}; relative paired difference {d.text('+.2%')}, tolerance ±{tolerance:.0%}"
    return Finding(claim, d.within(tolerance), evidence, d.to_dict())


def gains_more(rows, reuse: tuple[str, str], cem: tuple[str, str], claim: str) -> Finding:
    """Claim: going from `cem[0]` to `cem[1]` lowers perplexity more than going from `reuse[0]` to `reuse[1]`."""
    g_cem = [a - b for a, b in zip(per_seed(rows, cem[0]), per_seed(rows, cem[1]))]
    g_reuse = [a - b for a, b in zip(per_seed(rows, reuse[0]), per_seed(rows, reuse[1]))]
    d = Interval.of([c - r for c, r in zip(g_cem, g_reuse)])
    evidence = (
        f"perplexity gain {cem[0]} → {cem[1]}: {Interval.of(g_cem).mean:+.3f}; plain reuse {reuse[0]} → {reuse[1]}: "
        f"{Interval.of(g_reuse).mean:+.3f}; difference of gains {d.text()}"
    )
    return Finding(claim, d.verdict(+1), evidence, d.to_dict())
