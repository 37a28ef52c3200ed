"""Metrics sinks of a run: `metrics.jsonl` in the run directory (one JSON record per logged step, the one
metrics file), TensorBoard when installed, Weights & Biases when asked.

The same numbers as a table (`step,key,value`, one row per value) are derived on demand: `metrics_csv`.
Runs started before 2026-11-27 also wrote that table as `metrics.csv`; such a run, resumed, keeps appending
to it, and `drop_duplicate_csv` removes it from finished runs once it holds exactly the jsonl's rows.
"""

from __future__ import annotations

import csv
import io
import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path

from ..io import open_append, refuse_link
from .rundir import RunDir

CSV_HEADER = ("step", "key", "value")


def csv_rows(record: dict) -> list[list]:
    """The table rows of one metrics record: `[step, key, value]` for each value."""
    step = record["step"]
    return [[step, k, v] for k, v in record.items() if k != "step"]


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The records a run logged (its metrics.jsonl), oldest first."""
    path = RunDir(run_dir).metrics_jsonl
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def metrics_csv(records: Iterable[dict]) -> str:
    """The records as CSV text: a `step,key,value` header, then one row per logged value."""
    out = io.StringIO(newline="")
    writer = csv.writer(out)
    writer.writerow(CSV_HEADER)
    for record in records:
        writer.writerows(csv_rows(record))
    return out.getvalue()


def _first_difference(actual: str, expected: str) -> str:
    a, e = actual.splitlines(), expected.splitlines()
    n = next((i for i, (x, y) in enumerate(zip(a, e)) if x != y), min(len(a), len(e)))
    if n < min(len(a), len(e)):
        return f"line {n + 1} is {a[n]!r}, the jsonl gives {e[n]!r}"
    return f"it has {len(a)} lines, the jsonl gives {len(e)}"


def drop_duplicate_csv(root: str | Path) -> list[Path]:
    """Remove the `metrics.csv` of every finished run (results.json present) in or below `root` whose rows are
    exactly those derived from its `metrics.jsonl` (`metrics_csv`); returns the removed files. Every file is
    checked first: if one differs (or its metrics.jsonl is missing), a ValueError names each such file and
    how it differs, and nothing is removed. Unfinished runs are left alone."""
    found = []
    for folder, _, files in os.walk(root):  # does not follow links to folders
        run = RunDir(folder)
        if "metrics.csv" in files and run.results_json.is_file():
            found.append(run)
    differ = []
    for run in found:
        refuse_link(run.metrics_csv)
        if not run.metrics_jsonl.is_file():
            differ.append(f"{run.metrics_csv}: no {run.metrics_jsonl.name} beside it")
            continue
        with open(run.metrics_csv, encoding="utf-8", newline="") as f:
            actual = f.read()
        expected = metrics_csv(read_metrics(run.path))
        if actual != expected:
            differ.append(f"{run.metrics_csv} differs from {run.metrics_jsonl.name}: {_first_difference(actual, expected)}")
    if differ:
        raise ValueError("refusing to remove any metrics.csv; these do not hold their metrics.jsonl's rows:\n" + "\n".join(differ))
    for run in found:
        run.metrics_csv.unlink()
    return [run.metrics_csv for run in found]


class MetricsLogger:
    """Append one record per call to every sink (main process only)."""

    def __init__(self, run_dir: Path, tensorboard: bool = True, wandb_project: str | None = None, config: dict | None = None,
                 notices: bool = True) -> None:
        paths = RunDir(run_dir)
        if tensorboard:
            refuse_link(paths.tensorboard_dir)  # before anything is opened
        # a run started before metrics.csv was dropped keeps it whole when it resumes (`drop_duplicate_csv`)
        legacy = refuse_link(paths.metrics_csv)
        self.jsonl = open_append(paths.metrics_jsonl)
        self.csv = open_append(legacy) if legacy.exists() else None
        self.tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(paths.tensorboard_dir))
            except ImportError:
                if notices:
                    print("TensorBoard is not installed: metrics go to metrics.jsonl only "
                          "(pip install -e '.[tensorboard]' in the cem clone, or tensorboard=false to silence this)", file=sys.stderr)
        self.wandb = None
        if wandb_project:
            try:
                import wandb
            except ImportError:
                raise ValueError("wandb=true but Weights & Biases is not installed (pip install wandb)") from None

            self.wandb = wandb.init(project=wandb_project, dir=str(paths.path), config=config, resume="allow")

    def log(self, step: int, **values: float) -> None:
        record = {"step": step, **values}
        self.jsonl.write(json.dumps(record) + "\n")
        self.jsonl.flush()
        if self.csv is not None:
            csv.writer(self.csv).writerows(csv_rows(record))
            self.csv.flush()
        if self.tb is not None:
            for k, v in values.items():
                self.tb.add_scalar(k, v, step)
        if self.wandb is not None:
            self.wandb.log(values, step=step)

    def close(self) -> None:
        self.jsonl.close()
        if self.csv is not None:
            self.csv.close()
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()
