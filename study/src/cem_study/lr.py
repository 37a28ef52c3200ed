"""The paper's learning-rate rule (App. C): the Llama baseline of each size is swept over a grid of rates,
and every variant of that size trains at the rate that was best for Llama.

The grid starts as the scale's `lrs` (spaced by factors of 2). A rate is judged by its mean *validation*
loss over the sweep's seeds (`Scale.sweep_seeds`); while the best rate sits at an end of the grid, the grid
grows by one factor of 2 on that side (at most `Scale.lr_extend` times), so the chosen rate is bracketed.
The chosen rate is a grid point, so the sweep's own runs are the Llama baseline's runs at that rate.

A finished sweep's decision is made once and recorded in RESULTS/lr/choices.json (committed with the runs),
with the losses and the processors of the runs it was made on: every run of its size depends on it, so a sweep
run trained again later on the same processor (`cem_study.products`), whose validation loss moves by
noise, never re-decides it. A decision made on runs of another processor than the scale's (`Scale.processor`),
in whole or in part, compared losses across processors: it is made again once its runs have trained on the
scale's processor, and the record keeps the decision it replaces (`superseded`). A decision made with another tie
(`pick`) than the scale's now is made again on the same runs, over its whole recorded grid, and recorded the same
way: the tie rule changed, not the evidence (cpu128's, 2026-11-29: docs/LOG.md). Where the whole curve is read
(fig3a's optima), a sweep can be asked to `rebracket`: if a run trained again has moved the best rate on the
current results to an end of the grid, the grid grows as above until that best is bracketed again, and the
grown grid is recorded; the chosen rate stands.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from cem.io import LockedError, atomic_write_json, lock_folder, read_json
from cem.provenance import recorded_processors
from .records import Run
from .scales import Scale
from .sweep import RunSpec, other_processor, run_sweep


def sweep_key(template: RunSpec) -> str:
    """The name of a sweep (its record's key): `size-arch`, then the model settings that differ from the
    preset's, `-key=value` each (a variant's own-rate sweep)."""
    return "-".join([template.size, template.arch, *(f"{k}={v}" for k, v in template.model)])


def llama(size: str) -> RunSpec:
    """The template of a size's Llama sweep (the paper's rule)."""
    return RunSpec.make(size, "llama")


def at_rate(template: RunSpec, lr: float, seed: int = 0) -> RunSpec:
    """The run of a sweep's template at rate `lr` (made anew, so that it is the same run any experiment asks for)."""
    train = {**dict(template.train), "lr": lr}
    return RunSpec.make(template.size, template.arch, seed=seed, train=train, **dict(template.model))


def sweep_specs(scale: Scale, template: RunSpec, grid: tuple[float, ...]) -> list[RunSpec]:
    """One run per (rate, seed) of a sweep."""
    return [at_rate(template, lr, seed) for lr in grid for seed in scale.sweep_seeds(template.size)]


def pick(losses: dict[float, float], tie: float = 0.0) -> float:
    """The chosen rate: the lowest of those whose mean validation loss is within `tie` nats of the best (with
    `tie` 0, the best; a tie goes to the lower rate, which trains more stably)."""
    best = min(losses.values())
    return min(lr for lr, loss in losses.items() if loss <= best + tie)


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


def _record(root: Path) -> Path:
    return Path(root) / "lr" / "choices.json"


def recorded(scale: Scale, template: RunSpec, root: Path) -> dict | None:
    """The recorded decision of the sweep of `template` (None: none, or one made with other seeds or another
    first grid, which this sweep does not reuse)."""
    path = _record(root)
    if not path.exists():
        return None
    key = sweep_key(template)
    size, arch = template.size, key[len(template.size) + 1:]
    entry = read_json(path).get(key)
    if entry is None:
        return None
    try:
        grid = tuple(float(x) for x in entry["grid"])
        first, seeds, best = tuple(float(x) for x in entry["first_grid"]), tuple(int(x) for x in entry["seeds"]), float(entry["lr"])
        losses = {float(k): float(v) for k, v in entry["valid_loss"].items()}
    except (KeyError, TypeError, ValueError, AttributeError):
        raise ValueError(f"{path} is corrupted: its entry {key} is not a recorded sweep (lr, grid, first_grid, seeds, valid_loss)") from None
    if best not in grid:
        raise ValueError(f"{path} is corrupted: the chosen rate {best:g} of {key} is not in its grid")
    if first != tuple(scale.grid(size, arch)) or seeds != scale.sweep_seeds(size):
        return None
    return {"lr": best, "grid": grid, "valid_loss": losses, "processors": entry.get("processors"),
            "tie": float(entry.get("tie", 0.0))}  # a record older than its tie was made with none


def processors_of(results: list[dict | None]) -> list[str] | None:
    """The processors a sweep's finished runs trained on (None while a run is missing)."""
    if any(r is None for r in results):
        return None
    return sorted({p for r in results for p in recorded_processors(r)})


def decided_elsewhere(scale: Scale, template: RunSpec, root: Path, done: dict) -> list[str]:
    """The processors other than the scale's that a recorded decision was made on (empty: it stands). A record
    older than its `processors` is read from the runs in the folder where they are still the ones it was made on
    (their validation losses are the recorded ones); otherwise, and at a scale without a processor, it stands."""
    if not scale.processor:
        return []
    procs = done.get("processors")
    if procs is None:
        seeds = scale.sweep_seeds(template.size)
        results = {lr: [Run(scale.runs(root) / at_rate(template, lr, s).slug).results() for s in seeds] for lr in done["grid"]}
        if any(r is None for rs in results.values() for r in rs) or any(
                mean_valid_loss(rs) != done["valid_loss"].get(lr) for lr, rs in results.items()):
            return []
        procs = processors_of([r for rs in results.values() for r in rs])
    return [p for p in procs if p != scale.processor]


@dataclass(frozen=True)
class SweepState:
    """Where a sweep stands: its chosen rate (None while undecided), its grid so far, the mean validation
    loss per rate, and the runs still to train (a dry look: `sweep(..., dry=True)`)."""

    best: float | None
    grid: tuple[float, ...]
    losses: dict
    pending: tuple = ()


def sweep(scale: Scale, template: RunSpec, root: Path, data_dir: str | None = None, jobs: int = 1, dry: bool = False,
          rebracket: bool = False, wait: bool = True) -> SweepState:
    """Train the sweep of `template` (a run without its rate and seed) until its chosen rate (`pick`) is
    bracketed. A recorded decision stands: its runs are only trained where missing (and, with `rebracket`, its
    grid grows until the rate the current results pick is bracketed again: module docstring). With `dry`,
    nothing is trained: the decision the finished runs allow, or the runs it waits for; without `wait`, runs
    another sweep holds are left to it (`run_sweep`), and the state names them as pending."""
    key = sweep_key(template)
    size, what = template.size, key[len(template.size) + 1:]
    scale = replace(scale, lr_grids=tuple((k, g) for k, g in scale.lr_grids if k != key))  # the sweep's own first grid
    first = scale.grid(size, what)
    done = recorded(scale, template, root)
    why, grid = None, first
    elsewhere = decided_elsewhere(scale, template, root, done) if done else []
    if elsewhere:  # made again on this processor's runs
        why = f"decided on runs of {', '.join(elsewhere)}, not of {scale.processor} only"
    elif done and done["tie"] != scale.lr_tie:  # made again on the same runs, its whole grid (module docstring)
        why, grid = f"decided with ties within {done['tie']:g} nats; the scale's tie is now {scale.lr_tie:g}", done["grid"]
    if why:
        print(f"== learning-rate sweep: {key} was {why}: deciding it again", file=sys.stderr, flush=True)
        superseded, done = read_json(_record(root))[key], None
    grid = done["grid"] if done else grid
    seeds = scale.sweep_seeds(size)
    while True:
        specs = sweep_specs(scale, template, grid)
        if dry:  # a run of another processor than the scale's is one to train again
            results = {s: Run(scale.runs(root) / s.slug).results() for s in specs}
            results = {s: None if r is not None and scale.processor and other_processor(r, scale.processor) else r for s, r in results.items()}
        else:
            print(f"== learning-rate sweep: {key}, rates {', '.join(f'{lr:g}' for lr in grid)}", file=sys.stderr, flush=True)
            results = run_sweep(specs, scale, root, data_dir, jobs, wait=wait)
        pending = tuple(s for s in specs if results[s] is None)
        if pending or (done and not rebracket):
            return SweepState(done["lr"] if done else None, tuple(sorted(grid)), done["valid_loss"] if done else {}, pending)
        losses = {lr: mean_valid_loss([results[at_rate(template, lr, s)] for s in seeds]) for lr in grid}
        best = pick(losses, scale.lr_tie)
        grown = extend(grid, best, first, scale.lr_extend)
        if done:  # rebracket: the decision stands, the grid grows around the current pick
            if grown is None:
                return SweepState(done["lr"], tuple(sorted(grid)), done["valid_loss"], ())
            if not dry:
                _write_record(root, key, {**read_json(_record(root))[key], "grid": sorted(grown)})
            grid = grown
            continue
        if grown is None:
            if not dry:
                entry = {"lr": best, "grid": sorted(grid), "first_grid": list(first), "seeds": list(seeds), "tie": scale.lr_tie,
                         "valid_loss": {str(k): v for k, v in losses.items()}, "processors": processors_of(list(results.values()))}
                if why and (elsewhere or best != superseded["lr"]):
                    entry["superseded"] = {**superseded, "why": why}
                elif why and "superseded" in superseded:  # the same rate under the new tie: its history stands
                    entry["superseded"] = superseded["superseded"]
                _write_record(root, key, entry)
            return SweepState(best, tuple(sorted(grid)), losses)
        grid = grown


def _write_record(root: Path, key: str, entry: dict) -> None:
    """Put one sweep's entry in the record, read and written under the record folder's lock: two lanes that decide
    two sweeps at once both land (the lock is held for milliseconds: wait for it, a minute at most)."""
    path = _record(root)
    for _ in range(RECORD_LOCK_TRIES):
        try:
            with lock_folder(path.parent, f"the learning-rate record {path}"):
                record = read_json(path) if path.exists() else {}
                atomic_write_json(path, {**record, key: entry})
                return
        except LockedError:
            time.sleep(0.1)
    raise LockedError(f"the learning-rate record {path} stayed locked for a minute; is another process stuck writing it?")


RECORD_LOCK_TRIES = 600  # tenths of a second


def choose(scale: Scale, template: RunSpec, root: Path, data_dir: str | None = None, jobs: int = 1, rebracket: bool = False) -> Scale:
    """The scale with the sweep of `template` finished and recorded (for a size's Llama: the size's chosen rate)."""
    return with_choice(scale, template, sweep(scale, template, root, data_dir, jobs, rebracket=rebracket))


def with_choice(scale: Scale, template: RunSpec, state: SweepState) -> Scale:
    """The scale with a decided sweep's grid and rate recorded: a size's Llama rate in `chosen_lrs` (every
    variant's rate under the paper's rule), any other sweep's in `own_lrs`."""
    def put(pairs: tuple, key: str, value) -> tuple:  # in place where the key is there, else at the end
        return tuple((k, value if k == key else v) for k, v in pairs) + (() if key in dict(pairs) else ((key, value),))

    key = sweep_key(template)
    grids = put(scale.lr_grids, key, state.grid)
    if template == llama(template.size):
        return replace(scale, lr_grids=grids, chosen_lrs=put(scale.chosen_lrs, template.size, state.best))
    return replace(scale, lr_grids=grids, own_lrs=put(scale.own_lrs, key, state.best))
