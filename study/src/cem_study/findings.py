"""What an analysis produces and sees: a `Finding` (a claim, its verdict and the paired difference it rests
on), the `Context` of an analysis, and the finding helpers on seed-paired differences (`cem_study.stats`).

Every difference is of test loss in nats per token (log-perplexity), paired by seed, and also shown as a
perplexity ratio in % (exp(Δ) - 1), read one way (`oriented`): CEM minus the other model where a comparison has
CEM on one side only, else the side the claim favours minus the other, so that a negative Δ is always the first
side better. A directional claim is *held* when the 95% interval excludes zero with
the claim's sign; a "close" claim is an equivalence test (the whole interval within ±log(1 + tolerance));
"matches or beats" is a non-inferiority test (the interval's upper end below log(1 + margin)).

Families (for the Holm correction in the report): `paper` (the paper's own directional claims), `control`
(the same claims against the controls this project adds: the position-matched Llama, the learned step
gain), `ours` (beyond the paper), `twice` (the test-time recipes' confirmation: each confirmed recipe at twice
its mean trained depth against at it, per size, `analysis.recipes_confirm_study`), each fixed before the data: every directional claim the scale's suite judges
(`registry.planned`), a claim not measured yet counting as p = 1. Equivalence and non-inferiority findings are
outside the multiplicity correction.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

from .scales import Scale
from .stats import Interval
from .sweep import Variant

TWICE = "twice"  # the recipes' confirmation: each recipe at 2m against at m (`analysis.recipes_confirm_study`)
FAMILIES = ("paper", "control", "ours", TWICE)
# the tests a finding can rest on: the sign of an interval (directional), an interval inside ±margin (equivalence) or
# below +margin (non-inferiority), or a count over a model's layers and steps (one seed: no interval)
KINDS = ("directional", "equivalence", "non-inferiority", "count")


@dataclass
class Finding:
    claim: str
    verdict: str  # "held" | "not held" | "inconclusive" (raw: the 95% interval)
    evidence: str
    difference: dict | None = None  # the paired difference (mean, lo, hi, n, p) the verdict rests on
    family: str = "paper"
    p: float | None = None  # two-sided p-value of a directional claim (None: equivalence / non-inferiority)
    sign: int = 1  # the claim's sign of the difference
    p_adjusted: float | None = None  # Holm over the finding's family (set by the report)
    verdict_adjusted: str | None = None
    kind: str = "directional"  # the test (`KINDS`)
    margin: float | None = None  # an equivalence (±) or non-inferiority (+) margin, in nats
    contrast: str | None = None  # what `difference` is, where it is of test loss in nats ("A - B"); None: another quantity

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown kind of finding {self.kind!r}: expected one of {', '.join(KINDS)}")

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


def row(rows: list[dict], label: str) -> dict:
    for r in rows:
        if r["label"] == label:
            return r
    raise KeyError(label)


def _means(rows, *labels) -> str:
    return "; ".join(f"{lab}: ppl {row(rows, lab)['test_perplexity']:.3f}" for lab in labels)


def difference_text(d: Interval, dropped: int = 0) -> str:
    """A loss difference in nats with its interval, and as a perplexity ratio in %; the seeds left unpaired
    because their runs ran on different processors, if any."""
    pct = lambda x: f"{math.expm1(x):+.2%}"  # noqa: E731
    apart = f"; {dropped} seed{'s' if dropped != 1 else ''} left out: {'their' if dropped != 1 else 'its'} runs ran on different processors" if dropped else ""
    if d.n == 0:
        return f"no pair of runs on one processor, so no difference{apart}"
    if d.n < 2:
        return f"Δ {d.mean:+.4f} nats ({pct(d.mean)} ppl), one seed, no interval{apart}"
    return f"Δ {d.mean:+.4f} nats [95% CI {d.lo:+.4f}, {d.hi:+.4f}] ({pct(d.mean)} ppl [{pct(d.lo)}, {pct(d.hi)}]), {d.n} paired seeds, p = {d.p:.2g}{apart}"


def _power(d: Interval, margin: float | None = None) -> str:
    """What the seeds could resolve: the smallest difference they detect with 80% power (directional), or
    whether an interval of this width fits inside the margin at all (equivalence, non-inferiority)."""
    if d.n < 2 or d.hi == d.lo:
        return ""
    if margin is None:
        return f"; these seeds resolve |Δ| ≥ {d.detectable():.4f} nats (80% power)"
    half = d.hi - d.mean
    fits = "could" if half < margin else "could not"
    return f"; interval half-width {half:.4f} against a margin of {margin:.4f} nats: these seeds {fits} have held it at a true Δ of 0"


def _side(d: Interval, a: str, b: str) -> str:
    """Where an equivalence or non-inferiority interval excludes zero: that `a` is measurably better or worse than
    `b`, which such a verdict alone does not say (held within the margin, or inconclusive, may still be a gap)."""
    if d.n < 2 or d.lo <= 0 <= d.hi:
        return ""
    return f"; the interval excludes zero: {a} is measurably {'worse' if d.lo > 0 else 'better'} than {b}"


def by_seed(rs: list[dict], key: str = "test_loss") -> tuple[list[tuple[float, ...]], int]:
    """The rows' per-seed values of `key`, one tuple per seed they all have (paired by seed, not by position: a
    variant may have more seeds than another), leaving out a seed whose runs ran on different processors
    (another processor sums floats in another order: never paired); and how many seeds were left out so."""
    def by(r: dict, values: list | None) -> dict:
        return dict(zip(r.get("seeds") or range(len(r["test_loss_per_seed"])), values or []))

    values = [by(r, r[key + "_per_seed"]) for r in rs]
    procs = [by(r, r.get("processor_per_seed")) for r in rs]
    common = [s for s in values[0] if all(s in v for v in values[1:])]
    keep = [s for s in common if len({p[s] for p in procs if p.get(s) is not None}) <= 1]
    return [tuple(v[s] for v in values) for s in keep], len(common) - len(keep)


def paired(rows, a: str, b: str) -> Interval:
    """The interval of loss(a) - loss(b), paired by seed (`by_seed`)."""
    return _paired(rows, a, b)[0]


def _paired(rows, a: str, b: str) -> tuple[Interval, int]:
    pairs, dropped = by_seed([row(rows, a), row(rows, b)])
    return Interval.of([x - y for x, y in pairs]), dropped


def _is_cem(rows, label: str) -> bool:
    return row(rows, label).get("arch", "").startswith("cem")


def oriented(rows, favoured: str, other: str) -> tuple[str, str]:
    """The sides of a contrast in the order every difference is read (a - b, negative: a better): CEM first where
    exactly one side is a CEM model, else the side the claim favours first."""
    if _is_cem(rows, other) and not _is_cem(rows, favoured):
        return other, favoured
    return favoured, other


def lower(rows, better: str, worse: str, claim: str, family: str = "paper") -> Finding:
    """Claim: `better` has a lower test loss than `worse`, on the paired difference a - b of `oriented` sides (the
    claim's sign: negative where `better` is a, positive where it is b)."""
    a, b = oriented(rows, better, worse)
    sign = -1 if a == better else 1
    d, dropped = _paired(rows, a, b)
    return Finding(claim, d.verdict(sign), f"{_means(rows, better, worse)}; {a} - {b}: {difference_text(d, dropped)}{_power(d)}",
                   d.to_dict(), family, d.p, sign, contrast=f"{a} - {b}")


def close(rows, a: str, b: str, claim: str, tolerance: float, family: str = "paper") -> Finding:
    """Claim: `a` is within ±`tolerance` of `b` in perplexity: the interval of loss(a) - loss(b) lies inside
    ±log(1 + tolerance) (an equivalence test), its sides `oriented` (the test is symmetric)."""
    a, b = oriented(rows, a, b)
    d, dropped = _paired(rows, a, b)
    m = math.log1p(tolerance)
    verdict = d.within(m)
    side = _side(d, a, b)
    if verdict == "not held":  # outside the margin: say on which side, so that a better result does not read as a worse one
        side = f"; {a} is {'better' if d.mean < 0 else 'worse'} than {b} by more than the margin"
    evidence = f"{_means(rows, a, b)}; {a} - {b}: {difference_text(d, dropped)}; equivalence margin ±{tolerance:.0%} ppl{side}{_power(d, m)}"
    return Finding(claim, verdict, evidence, d.to_dict(), family, kind="equivalence", margin=m, contrast=f"{a} - {b}")


def not_worse(rows, a: str, b: str, claim: str, margin: float, note: str = "", family: str = "paper") -> Finding:
    """Claim: `a` matches or beats `b` (non-inferiority): the interval's upper end of loss(a) - loss(b) is below
    log(1 + margin); *not held* when its lower end is above it."""
    d, dropped = _paired(rows, a, b)
    m = math.log1p(margin)
    hi, lo = (d.hi, d.lo) if d.n > 1 else (d.mean, d.mean)
    verdict = "held" if hi < m else ("not held" if lo > m else "inconclusive")
    side = _side(d, a, b) if verdict != "not held" else f"; {a} is worse than {b} by more than the margin"
    evidence = f"{note + '; ' if note else ''}{_means(rows, a, b)}; {a} - {b}: {difference_text(d, dropped)}; non-inferiority margin +{margin:.0%} ppl{side}{_power(d, m)}"
    return Finding(claim, verdict, evidence, d.to_dict(), family, kind="non-inferiority", margin=m, contrast=f"{a} - {b}")


def gains_more(rows, reuse: tuple[str, str], cem: tuple[str, str], claim: str, family: str = "paper") -> Finding:
    """Claim: going from `cem[0]` to `cem[1]` lowers the loss more than going from `reuse[0]` to `reuse[1]`: the
    paired difference of the loss changes, (cem[1] - cem[0]) - (reuse[1] - reuse[0]), is below zero."""
    quads, dropped = by_seed([row(rows, label) for label in (*cem, *reuse)])
    c_cem = [c1 - c0 for c0, c1, _, _ in quads]
    c_reuse = [r1 - r0 for _, _, r0, r1 in quads]
    d = Interval.of([c - r for c, r in zip(c_cem, c_reuse)])
    evidence = (
        f"loss change {cem[0]} → {cem[1]}: {Interval.of(c_cem).mean:+.4f} nats; plain reuse {reuse[0]} → {reuse[1]}: "
        f"{Interval.of(c_reuse).mean:+.4f} nats; difference of changes {difference_text(d, dropped)}{_power(d)}"
    )
    return Finding(claim, d.verdict(-1), evidence, d.to_dict(), family, d.p, -1,
                   contrast=f"({cem[1]} - {cem[0]}) - ({reuse[1]} - {reuse[0]})")


def adjust(findings: list[Finding], sizes: dict[str, int] | None = None) -> None:
    """Holm-Bonferroni over each family's directional findings: sets `p_adjusted` and `verdict_adjusted` (held / not
    held when the adjusted p < 0.05, by the claim's sign) of those with a p-value. A family has the size `sizes` gives
    (the directional claims of the scale's suite, fixed before the data), its members without a p-value (not measured
    yet) counting as p = 1; without `sizes`, the findings given are the family."""
    from .stats import holm

    for family in FAMILIES:
        group = [f for f in findings if f.family == family and f.p is not None and f.p == f.p]
        unmeasured = max(0, (sizes or {}).get(family, 0) - len(group))
        for f, p in zip(group, holm([f.p for f in group] + [1.0] * unmeasured)):
            f.p_adjusted = p
            if p >= 0.05:
                f.verdict_adjusted = "inconclusive"
            else:
                f.verdict_adjusted = "held" if f.difference["mean"] * f.sign > 0 else "not held"


def training_gap(c: Context, a: str, b: str, stretches: int = 6) -> dict | None:
    """The training loss of `a` minus `b` through training, paired by seed (the same seed trains on the same batches
    in the same order, so each logged step is one paired difference): per stretch of steps, the mean over the
    stretch's logged steps and then over the seeds, with the seeds' lowest and highest. Whether a gap at the end is
    closing, steady or opening, and how it started. None where a run's metrics are missing."""
    from .records import Run

    spec = {v.label: v.spec for v in c.variants}
    seeds = [s for s in row(c.rows, a)["seeds"] if s in row(c.rows, b)["seeds"]]
    runs = c.scale.runs(c.root)
    curves = []
    for s in seeds:
        pair = []
        for label in (a, b):
            metrics = Run(runs / spec[label].with_seed(s).slug).metrics()
            if metrics is None:
                return None
            pair.append({r["step"]: r["loss"] for r in metrics if "loss" in r})
        curves.append({t: pair[0][t] - pair[1][t] for t in pair[0].keys() & pair[1].keys()})
    if not curves or not all(curves):
        return None
    last = min(max(d) for d in curves)
    edges = [round(last * i / stretches) for i in range(stretches + 1)]
    out = {"a": a, "b": b, "seeds": seeds, "edges": edges, "mean": [], "low": [], "high": []}
    for lo, hi in zip(edges, edges[1:]):
        per_seed_means = [sum(v for t, v in d.items() if lo < t <= hi) / max(1, sum(1 for t in d if lo < t <= hi)) for d in curves]
        out["mean"].append(sum(per_seed_means) / len(per_seed_means))
        out["low"].append(min(per_seed_means))
        out["high"].append(max(per_seed_means))
    return out
