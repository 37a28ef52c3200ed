"""How many seeds a recursion experiment's T=1/T=2 pair trains: its first seeds (the scale's recursion seeds),
and the seeds `Scale.more_pair_seeds` names where the first ones do not resolve half their observed difference.

Validation decides, never the test split: the difference is of validation loss (T=1 - T=2, paired by seed, at
the Llama rate), and "resolve" is the smallest difference a two-sided 5% t-test detects with 80% power at its
observed spread (`stats.Interval.detectable`). The decision is read from the finished runs each time it is
needed (nothing is recorded: the same runs give the same decision); a decided scale carries it in `pair_seeds`,
which the experiments' variants read (`registry`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from .records import Run
from .registry import EXPERIMENTS
from .scales import Scale
from .stats import Interval
from .sweep import other_processor


@dataclass(frozen=True)
class PairSeeds:
    """The seeds decision of one experiment's T=1/T=2 pair."""

    exp_id: str
    first: tuple[int, ...]  # the seeds every variant trains
    diffs: tuple[float, ...]  # validation loss, T=1 - T=2, on each first seed
    resolves: float | None  # the smallest difference the first seeds detect (80% power); None: no spread
    more: tuple[int, ...]  # the seeds added (empty: the first seeds resolve half the observed difference)

    @property
    def seeds(self) -> tuple[int, ...]:
        return self.first + self.more

    def to_dict(self) -> dict:
        return {"first": list(self.first), "valid_diffs": list(self.diffs), "resolves": self.resolves, "more": list(self.more)}

    def text(self) -> str:
        """One sentence for the report."""
        mean = sum(self.diffs) / len(self.diffs)
        by = f"{len(self.first)} seeds resolve {self.resolves:.4f} nats" if self.resolves is not None else f"{len(self.first)} seeds show no spread"
        verdict = f"so it trains seeds {list(self.more)} too" if self.more else "so it keeps them"
        return (f"the T=1/T=2 pair's validation difference (T=1 - T=2) on seeds {list(self.first)} is {mean:+.4f} nats "
                f"({', '.join(f'{d:+.4f}' for d in self.diffs)}); {by} (80% power), "
                f"{'more than' if self.more else 'at most'} half the observed difference, {verdict}")


def decide(scale: Scale, exp_id: str, root: str | Path) -> PairSeeds | None:
    """The pair's seeds, or None where the scale adds none to `exp_id` or its pair's first runs have not all
    finished (on the scale's processor)."""
    more = scale.more_pair_seeds_of(exp_id)
    if not more:
        return None
    exp = EXPERIMENTS[exp_id]
    first = tuple(scale.seeds_for(exp.seeds))
    pair = [v for v in exp.variants(replace(scale, pair_seeds=())) if v.paired]
    if len(pair) != 2:
        raise ValueError(f"{exp_id} has {len(pair)} paired variants, not a T=1/T=2 pair: it cannot add seeds to its pair")
    losses = []
    for v in pair:
        results = [Run(scale.runs(root) / v.spec.with_seed(s).slug).results() for s in first]
        if any(r is None or (scale.processor and other_processor(r, scale.processor)) for r in results):
            return None
        losses.append([r["valid_loss"] for r in results])
    diffs = tuple(a - b for a, b in zip(*losses))
    interval = Interval.of(list(diffs))
    resolves = interval.detectable()
    unresolved = resolves is not None and resolves > abs(interval.mean) / 2
    return PairSeeds(exp_id, first, diffs, resolves, tuple(s for s in more if s not in first) if unresolved else ())


def decided(scale: Scale, ids, root: str | Path) -> Scale:
    """`scale` with the pair seeds of every experiment of `ids` that can be decided now (`pair_seeds`)."""
    chosen = dict(scale.pair_seeds)
    for exp_id in ids:
        if (d := decide(scale, exp_id, root)) is not None:
            chosen[exp_id] = d.seeds
    return replace(scale, pair_seeds=tuple(chosen.items()))


def undecided(scale: Scale, ids, root: str | Path) -> list[str]:
    """The experiments of `ids` whose pair may still add seeds: their first runs have not all finished."""
    return [i for i in ids if scale.more_pair_seeds_of(i) and decide(scale, i, root) is None]
