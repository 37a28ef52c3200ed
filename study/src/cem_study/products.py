"""Run products: what an analysis computes from a finished run's weights (a depth study, an energy trace,
context use), kept as JSON in the run's `evals/` folder (and its row's `evals`, `cem_study.records`).

Checkpoints are not committed and may not outlive the machine that trained them, so a product is computed
as soon as its run finishes, by the sweep that trained it (`run_sweep(..., products=...)`), and committed
with the run's results (its row in the campaign's runs.jsonl); an analysis then reads it and never needs the weights. A finished run that lacks a
product its experiment needs is evaluated from its checkpoint, or, when the checkpoint is gone, trained
again (`cem_study.sweep`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from cem.io import atomic_write_json, refuse_link
from cem.training import RunDir
from .records import TIMES, Run  # evals/times.json: the seconds each product of the run took, by name (for `--plan`)


class MissingWeights(FileNotFoundError):
    """A product is needed but neither it nor the checkpoint it is computed from is in the run directory."""


@dataclass(frozen=True)
class Product:
    """`fn(run_dir, data_dir=..., device=..., **kwargs)` of a finished run, stored as `evals/NAME`.
    `fn` is a module-level function (a sweep's worker process receives it pickled)."""

    fn: Callable[..., Any]
    name: str
    kwargs: tuple = ()  # sorted (key, value) pairs

    def path(self, run_dir: str | Path) -> Path:
        return RunDir(run_dir).evals_dir / self.name

    def exists(self, run_dir: str | Path) -> bool:
        return Run(run_dir).has_eval(self.name)

    def get(self, run_dir: str | Path, data_dir: str | None = None, device: str = "auto"):
        """The product: read from the run directory, else computed from the run's checkpoint and written."""
        path = self.path(run_dir)
        if not self.exists(run_dir):
            if RunDir(run_dir).checkpoint() is None:
                raise MissingWeights(
                    f"{path} is missing and {run_dir} has no checkpoint to compute it from; run the experiment "
                    "again (`cem-study experiment`), which trains the run again and computes it"
                )
            refuse_link(path.parent).mkdir(exist_ok=True)
            started = time.perf_counter()
            atomic_write_json(path, self.fn(Path(run_dir), data_dir=data_dir, device=device, **dict(self.kwargs)))
            _record_time(run_dir, self.name, time.perf_counter() - started)
        return Run(run_dir).eval(self.name)


def recorded_times(run_dir: str | Path) -> dict[str, float]:
    """The seconds each product of a run took to compute, by name ({} when none were recorded, or the record
    is unreadable: it only feeds an estimate)."""
    try:
        times = Run(run_dir).eval(TIMES) or {}
    except ValueError:
        return {}
    if not isinstance(times, dict):
        return {}
    return {k: float(v) for k, v in times.items() if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0}


def _record_time(run_dir: str | Path, name: str, seconds: float) -> None:
    atomic_write_json(RunDir(run_dir).evals_dir / TIMES, {**recorded_times(run_dir), name: seconds})


def missing(products, run_dir: str | Path) -> list[Product]:
    """The products not yet computed for a run."""
    return [p for p in products if not p.exists(run_dir)]
