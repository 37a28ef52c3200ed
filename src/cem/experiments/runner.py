"""`run_experiment(ID, scale)` and `run_suite(scale)`: train what the experiments need (finished runs are
skipped, interrupted ones resume), then analyse, judge the findings and plot; everything lands in
RESULTS/ID/ (summary.json, ID.png) and the runs in RESULTS/runs/."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from ..checks import check_positive_int
from ..device import cpu_model
from ..io import atomic_write_json
from . import lr
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


def _runs(exp_id: str, scale: Scale) -> list:
    """(variant, seed) of every run an experiment needs."""
    exp = EXPERIMENTS[exp_id]
    if exp.variants is None:
        return []
    return [(v, s) for v in exp.variants(scale) for s in (v.seeds or scale.seeds_for(exp.seeds))]


def _specs(exp_id: str, scale: Scale) -> list:
    return [v.spec.with_seed(s) for v, s in _runs(exp_id, scale)]


def _products(ids, scale: Scale) -> dict:
    """What the experiments `ids` read from each run's weights (`cem.experiments.products`), by spec."""
    out: dict = {}
    for i in ids:
        if EXPERIMENTS[i].products is not None:
            for v, s in _runs(i, scale):
                spec = v.spec.with_seed(s)
                out[spec] = tuple(dict.fromkeys(out.get(spec, ()) + tuple(EXPERIMENTS[i].products(scale, v, s))))
    return out


def run_experiment(exp_id: str, scale: str = "cpu", results_dir: str | Path | None = None, data_dir: str | None = None,
                   jobs: int = 1, device: str = "auto", **scale_overrides) -> dict:
    """Run one experiment and write RESULTS/ID/summary.json and RESULTS/ID/ID.png; returns the summary."""
    _check_id(exp_id)
    return run_suite(scale, results_dir, data_dir, jobs, (exp_id,), device, **scale_overrides)[0]


def train_runs(ids, sc: Scale, root: Path, data_dir: str | None = None, jobs: int = 1) -> tuple[Scale, dict]:
    """Train every run the experiments `ids` need; returns the scale (with its chosen learning rates) and
    the results by spec. At a scale that sweeps learning rates (`cem.experiments.lr`) it goes size by size,
    the base first: a size's Llama sweep, then that size's runs in the order of `ids` (fig3a's CEM sweep is
    extended, where its optimum is not bracketed yet, after the base size's other runs)."""
    if not sc.lr_sweep:
        return sc, run_sweep([s for i in ids for s in _specs(i, sc)], sc, root, data_dir, jobs, _products(ids, sc))
    results: dict = {}
    order = [sc.base] + [z for z in sc.sizes if z != sc.base]
    for n, size in enumerate(order):
        sc = lr.choose(sc, size, "llama", root, data_dir, jobs)
        done = replace(sc, sizes=tuple(z for z in sc.sizes if z in order[: n + 1]))
        specs = [s for i in ids for s in _specs(i, done)]
        print(f"== training the runs of {', '.join(ids)} at size {size} ({sc.name} scale)", file=sys.stderr, flush=True)
        results.update(run_sweep(specs, done, root, data_dir, jobs, _products(ids, done)))
        if size == sc.base and "fig3a" in ids:
            sc = lr.choose(sc, size, "cem-t2", root, data_dir, jobs)
    specs = [s for i in ids for s in _specs(i, sc)]
    results.update(run_sweep(specs, sc, root, data_dir, jobs, _products(ids, sc)))  # everything finished: only reads results
    return sc, results


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
    ids=None,
    device: str = "auto",
    **scale_overrides,
) -> list[dict]:
    """Several experiments at a scale (default: the scale's suite): every run they need is trained first in
    one pool (shared runs once, the recursion experiments first; `train_runs`), then each is analysed."""
    check_positive_int("jobs", jobs)
    sc = get_scale(scale, **scale_overrides)
    ids = tuple(ids or sc.suite or SUITE_ORDER)
    for i in ids:
        _check_id(i)
    root = Path(results_dir or f"results/{scale}")
    print(f"== training the runs of {', '.join(ids)} ({sc.name} scale)", file=sys.stderr, flush=True)
    sc, results = train_runs(ids, sc, root, data_dir, jobs)
    summaries = []
    for exp_id in ids:
        print(f"== {exp_id}", file=sys.stderr, flush=True)
        needed = {s: results[s] for s in _specs(exp_id, sc)}
        summaries.append(_analyse(exp_id, sc, root, needed, data_dir, device))
    return summaries
