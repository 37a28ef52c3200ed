"""Metrics sinks of a run: `metrics.jsonl` and `metrics.csv` in the run directory, TensorBoard when
installed, Weights & Biases when asked."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

from ..io import open_append, refuse_link
from .rundir import RunDir


class MetricsLogger:
    """Append one record per call to every sink (main process only)."""

    def __init__(self, run_dir: Path, tensorboard: bool = True, wandb_project: str | None = None, config: dict | None = None,
                 notices: bool = True) -> None:
        paths = RunDir(run_dir)
        if tensorboard:
            refuse_link(paths.tensorboard_dir)  # before anything is opened
        self.jsonl = open_append(paths.metrics_jsonl)
        self.csv_path = paths.metrics_csv
        self.tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(paths.tensorboard_dir))
            except ImportError:
                if notices:
                    print("TensorBoard is not installed: metrics go to metrics.jsonl and metrics.csv only "
                          "(pip install 'cem-transformers[tensorboard]', or tensorboard=false to silence this)", file=sys.stderr)
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
        new = not self.csv_path.exists()
        with open_append(self.csv_path) as f:
            writer = csv.writer(f)
            if new:
                writer.writerow(["step", "key", "value"])
            writer.writerows([step, k, v] for k, v in values.items())
        if self.tb is not None:
            for k, v in values.items():
                self.tb.add_scalar(k, v, step)
        if self.wandb is not None:
            self.wandb.log(values, step=step)

    def close(self) -> None:
        self.jsonl.close()
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()
