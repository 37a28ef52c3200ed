"""`run_experiment(ID, scale)` and `run_suite(scale)`: train what the experiments need (finished runs are
skipped, interrupted ones resume), then analyse, judge the findings and plot; everything lands in
RESULTS/ID/ (summary.json, ID.png) and the runs in RESULTS/runs/."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch

from ..device import cpu_model
from ..io import atomic_write_json
from .findings import Context
from .registry import ALL_IDS, EXPERIMENTS, SUITE_ORDER
from .scales import Scale, get_scale
from .sweep import run_sweep, summarize


def machine() -> str:
    """The GPU's name, or the CPU's model name and core count."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return f"{cpu_model()}, {os.cpu_count()} cores"


def _check_id(exp_id: str) -> None:
    if exp_id not in ALL_IDS:
        raise ValueError(f"unknown experiment {exp_id!r}; expected one of {', '.join(ALL_IDS)}, or all")


def _specs(exp_id: str, scale: Scale) -> list:
    exp = EXPERIMENTS[exp_id]
    if exp.variants is None:
        return []
    return [v.spec.with_seed(s) for v in exp.variants(scale) for s in scale.seeds_for(exp.seeds)]


def run_experiment(
    exp_id: str,
    scale: str = "cpu",
    results_dir: str | Path | None = None,
    data_dir: str | None = None,
    jobs: int = 1,
    device: str = "auto",
    **scale_overrides,
) -> dict:
    """Run one experiment and write RESULTS/ID/summary.json and RESULTS/ID/ID.png; returns the summary."""
    _check_id(exp_id)
    sc = get_scale(scale, **scale_overrides)
    root = Path(results_dir or f"results/{scale}")
    specs = _specs(exp_id, sc)
    results = run_sweep(specs, sc, root, data_dir, jobs) if specs else {}
    return _analyse(exp_id, sc, root, results, data_dir, device)


def _analyse(exp_id: str, sc: Scale, root: Path, results: dict, data_dir: str | None, device: str) -> dict:
    exp = EXPERIMENTS[exp_id]
    out = root / exp_id
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    variants = exp.variants(sc) if exp.variants else []
    rows = summarize(variants, results, sc.seeds_for(exp.seeds)) if variants else []
    findings, extra = exp.analyze(Context(sc, rows, variants, root, out, data_dir, device))
    summary = {
        "experiment": exp_id,
        "question": exp.question,
        "paper": exp.paper,
        "scale": sc.to_dict(),
        "seeds": list(sc.seeds_for(exp.seeds)),
        "rows": rows,
        "findings": [f.to_dict() for f in findings],
        **extra,
        "short_runs": [r["label"] for r in rows if r["tokens"] < r["budget_tokens"]],
        "machine": machine(),
        "analysis_time_s": time.perf_counter() - started,
        "train_time_s": sum(r["wall_time_s"] for r in results.values()),
    }
    exp.plot(summary, f"{exp_id}: {exp.question} ({sc.name} scale, {sc.data})", out / f"{exp_id}.png")
    atomic_write_json(out / "summary.json", summary)
    return summary


def run_suite(
    scale: str = "cpu",
    results_dir: str | Path | None = None,
    data_dir: str | None = None,
    jobs: int = 1,
    ids=SUITE_ORDER,
    device: str = "auto",
    **scale_overrides,
) -> list[dict]:
    """Several experiments at a scale: every run they need is trained first in one pool (shared runs once,
    the recursion experiments first), then each experiment is analysed."""
    for i in ids:
        _check_id(i)
    sc = get_scale(scale, **scale_overrides)
    root = Path(results_dir or f"results/{scale}")
    specs = [s for i in ids for s in _specs(i, sc)]
    print(f"== training the runs of {', '.join(ids)} ({sc.name} scale)", file=sys.stderr, flush=True)
    results = run_sweep(specs, sc, root, data_dir, jobs)
    summaries = []
    for exp_id in ids:
        print(f"== {exp_id}", file=sys.stderr, flush=True)
        needed = {s: results[s] for s in _specs(exp_id, sc)}
        summaries.append(_analyse(exp_id, sc, root, needed, data_dir, device))
    return summaries
