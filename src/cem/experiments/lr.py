"""The paper's learning-rate rule (App. C): the Llama baseline of each size is swept over a grid of rates,
and every variant of that size trains at the rate that was best for Llama.

The grid starts as the scale's `lrs` (spaced by factors of 2). A rate is judged by its mean *validation*
loss over the sweep's seeds (`Scale.sweep_seeds`); while the best rate sits at an end of the grid, the grid
grows by one factor of 2 on that side (at most `Scale.lr_extend` times), so the chosen rate is bracketed.
The chosen rate is a grid point, so the sweep's own runs are the Llama baseline's runs at that rate.
"""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path

from .scales import Scale
from .sweep import RunSpec, run_sweep


def sweep_specs(scale: Scale, size: str, arch: str, grid: tuple[float, ...]) -> list[RunSpec]:
    """One run per (rate, seed) of a sweep."""
    return [RunSpec.make(size, arch, train={"lr": lr}).with_seed(seed) for lr in grid for seed in scale.sweep_seeds(size)]


def mean_valid_loss(results: list[dict]) -> float:
    """Mean validation loss of a rate's runs; a run that diverged (no finite loss) counts as infinite."""
    losses = [r.get("valid_loss", math.inf) for r in results]
    return math.inf if any(not math.isfinite(x) for x in losses) else sum(losses) / len(losses)


def extend(grid: tuple[float, ...], best: float, first: tuple[float, ...], limit: int) -> tuple[float, ...] | None:
    """The grid grown by a factor of 2 beyond `best` when `best` is an end of it (at most `limit` steps
    beyond the first grid on each side); None when `best` is bracketed or the limit is reached."""
    lo, hi = min(grid), max(grid)
    if best == lo and lo > min(first) / 2**limit * 1.0001:
        return (lo / 2, *sorted(grid))
    if best == hi and hi < max(first) * 2**limit / 1.0001:
        return (*sorted(grid), hi * 2)
    return None


def sweep(scale: Scale, size: str, arch: str, root: Path, data_dir: str | None = None, jobs: int = 1) -> tuple[float, tuple[float, ...], dict]:
    """Train the sweep of `arch` at `size` until its best rate is bracketed; returns (best rate, final grid,
    mean validation loss per rate)."""
    grid = scale.grid(size, arch)
    while True:
        specs = sweep_specs(scale, size, arch, grid)
        print(f"== learning-rate sweep: {arch} {size}, rates {', '.join(f'{lr:g}' for lr in grid)}", file=sys.stderr, flush=True)
        results = run_sweep(specs, scale, root, data_dir, jobs)
        losses = {lr: mean_valid_loss([results[RunSpec.make(size, arch, train={"lr": lr}).with_seed(s)] for s in scale.sweep_seeds(size)]) for lr in grid}
        best = min(grid, key=lambda lr: losses[lr])
        grown = extend(grid, best, scale.grid(size, arch), scale.lr_extend)
        if grown is None:
            return best, tuple(sorted(grid)), losses
        grid = grown


def choose(scale: Scale, size: str, arch: str, root: Path, data_dir: str | None = None, jobs: int = 1) -> Scale:
    """The scale with the sweep of `arch` at `size` finished and recorded (for Llama: the size's chosen rate)."""
    best, grid, _ = sweep(scale, size, arch, root, data_dir, jobs)
    grids = tuple((k, g) for k, g in scale.lr_grids if k != f"{size}-{arch}") + ((f"{size}-{arch}", grid),)
    chosen = scale.chosen_lrs
    if arch == "llama":
        chosen = tuple((z, lr) for z, lr in chosen if z != size) + ((size, best),)
    return replace(scale, lr_grids=grids, chosen_lrs=chosen)
