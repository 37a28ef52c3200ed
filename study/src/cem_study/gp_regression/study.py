"""The study: one (kernel, T, seed) cell, and every cell of a scale with resumable rows and summaries."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from cem.device import pick_device
from .config import KERNELS, GPConfig, _check_kernel, scale_config
from .data import GPData, gp_oracle_rmse, sample_gp_dataset
from .model import CEMRegressor, config_flops, count_params
from .plots import plot_table3
from .summary import format_table, summarize
from .training import train_regressor


def run_cell(kernel: str, steps: int, seed: int, cfg: GPConfig, data: GPData | None = None) -> dict:
    """Train and evaluate one (kernel, T, seed) cell; returns its row. Model init depends on the seed only
    (identical for every T), data on (kernel, seed)."""
    device = pick_device(cfg.device)
    if data is None:
        data = sample_gp_dataset(kernel, seed, cfg, device)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        model = CEMRegressor.from_config(cfg, steps).to(device)
        t0 = time.perf_counter()
        metrics = train_regressor(model, data, cfg, seed)
        if device.type == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    if not all(math.isfinite(metrics[k]) for k in ("rmse", "train_rmse")):
        metrics["diverged"] = True
    return {
        "kernel": kernel,
        "steps": int(steps),
        "seed": int(seed),
        **metrics,
        "params": count_params(model),
        "flops": config_flops(cfg, steps),
        "wall_s": wall,
        "device": str(device),
        "config_id": cfg.fingerprint(),
    }


# ---------------------------------------------------------------------------------------------- study


def _load_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut by an interrupted write
                continue
    return rows


def run_gp_study(
    kernels=KERNELS,
    steps=(1, 2, 4, 8),
    seeds=(0, 1, 2),
    scale: str | GPConfig = "cpu",
    out_dir: str | os.PathLike | None = None,
    progress: bool = True,
    **overrides,
) -> list[dict]:
    """Run every (kernel, T, seed) cell; returns the rows (one per cell, in kernel, seed, T order).

    `scale` is "tiny" | "cpu" | "gpu" | "paper" or a `GPConfig`; `overrides` replace config fields. With
    `out_dir`, each finished row is appended to out_dir/rows.jsonl at once, cells already there with the
    same config fingerprint are not rerun (an interrupted run resumes), and summary.json, table3.md and
    table3.png are (re)written at the end.
    """
    cfg = scale_config(scale, **overrides)
    for k in kernels:
        _check_kernel(k)
    steps = [int(t) for t in steps]
    seeds = [int(s) for s in seeds]
    fid = cfg.fingerprint()
    out = Path(out_dir) if out_dir is not None else None
    done: dict[tuple, dict] = {}
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        for r in _load_rows(out / "rows.jsonl"):
            if r.get("config_id") == fid:
                done[(r["kernel"], r["steps"], r["seed"])] = r
    device = pick_device(cfg.device)
    scale_name = scale if isinstance(scale, str) else "custom"
    rows = []
    total, i = len(kernels) * len(steps) * len(seeds), 0
    for kernel in kernels:
        for seed in seeds:
            todo = [t for t in steps if (kernel, t, seed) not in done]
            data = oracle = None
            if todo:
                data = sample_gp_dataset(kernel, seed, cfg, device)
                oracle = gp_oracle_rmse(data, cfg, device)
            for t in steps:
                i += 1
                key = (kernel, t, seed)
                if key in done:
                    rows.append(done[key])
                    continue
                row = run_cell(kernel, t, seed, cfg, data)
                row["gp_oracle_rmse"] = oracle
                row["scale"] = scale_name
                rows.append(row)
                if out is not None:
                    with open(out / "rows.jsonl", "a") as fh:
                        fh.write(json.dumps(row) + "\n")
                if progress:
                    print(
                        f"[table3 {i}/{total}] {kernel} T={t} seed={seed}: rmse {row['rmse']:.4f} "
                        f"(nrmse {row['nrmse']:.3f}, oracle {oracle:.4f}) {row['wall_s']:.1f}s",
                        file=sys.stderr,
                        flush=True,
                    )
    if out is not None:
        summary = summarize(rows)
        meta = {"scale": scale_name, "config": asdict(cfg), "config_id": fid}
        (out / "summary.json").write_text(json.dumps({"meta": meta, "summary": summary}, indent=2) + "\n")
        (out / "table3.md").write_text(format_table(summary, cfg) + "\n")
        plot_table3(summary, out / "table3.png")
    return rows
