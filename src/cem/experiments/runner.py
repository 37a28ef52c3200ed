"""`run_experiment(ID, scale)`: train what an experiment needs (skipping finished runs), summarise over
seeds, check the paper's findings, plot; everything lands in RESULTS/ID/."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

from . import plots
from .analysis import energy_trace, save_json, test_time_curve
from .registry import ALL_IDS, EXPERIMENTS, Finding, akima_optimum
from .scales import get_scale
from .sweep import mean_std, run_sweep, summarize

GP_SCALES = {"cpu": "cpu", "gpu": "gpu", "paper": "paper", "tiny": "tiny"}


def machine() -> str:
    """The GPU's name, or the CPU's model name and core count."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{model}, {os.cpu_count()} cores"


def run_experiment(exp_id: str, scale: str = "cpu", results_dir: str | Path | None = None, data_dir: str | None = None, jobs: int = 1, **scale_overrides) -> dict:
    """Run one experiment and write RESULTS/ID/summary.json and RESULTS/ID/ID.png; returns the summary."""
    if exp_id not in ALL_IDS:
        raise ValueError(f"unknown experiment {exp_id!r}; expected one of {', '.join(ALL_IDS)}")
    root = Path(results_dir or f"results/{scale}")
    out = root / exp_id
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    if exp_id == "table3":
        summary = _table3(scale, out, scale_overrides)
    else:
        summary = _lm_experiment(exp_id, scale, root, out, data_dir, jobs, scale_overrides)
    summary.update({"experiment": exp_id, "machine": machine(), "wall_time_s": time.perf_counter() - started})
    save_json(summary, out / "summary.json")
    return summary


def _lm_experiment(exp_id, scale_name, root, out, data_dir, jobs, overrides) -> dict:
    exp = EXPERIMENTS[exp_id]
    scale = get_scale(scale_name, **overrides)
    variants = exp.variants(scale)
    specs = [v.spec.with_seed(s) for v in variants for s in scale.seeds]
    results = run_sweep(specs, scale, root, data_dir, jobs)
    rows = summarize(variants, results, scale.seeds)
    findings: list[Finding] = exp.findings(rows, scale)
    extra = {}
    png = out / f"{exp_id}.png"
    title = f"{exp_id}: {exp.question} ({scale.name} scale, {scale.data})"
    if exp.kind == "sizes":
        plots.plot_sizes(rows, title, png)
    elif exp.kind == "steps":
        plots.plot_steps(rows, title, png)
    elif exp.kind == "lr":
        optima = {}
        for group in ("Llama", "CEM (T=2, diag+low-rank)"):
            rs = sorted((r for r in rows if r["group"] == group), key=lambda r: r["lr"])
            optima[group] = akima_optimum([r["lr"] for r in rs], [r["test_perplexity"] for r in rs])
        extra["optima"] = {g: {"lr": lr, "test_perplexity": p} for g, (lr, p) in optima.items()}
        plots.plot_lr(rows, title, png, optima)
    elif exp.kind in ("bars",):
        plots.plot_bars(rows, title, png)
    elif exp.kind == "gains":
        plots.plot_gains(rows, title, png)
    elif exp.kind == "test-time":
        curves, f = _test_time(variants, scale, root, data_dir)
        extra["curves"], findings = curves, f
        plots.plot_test_time(curves, title, png)
    elif exp.kind == "energy":
        trace, f = _energy(variants[0], scale, root, data_dir)
        extra["energy"], findings = trace, f
        plots.plot_energy(trace, title, png)
    return {
        "question": exp.question,
        "scale": scale.to_dict(),
        "rows": rows,
        "findings": [f.__dict__ for f in findings],
        **extra,
    }


def _run_dir(root: Path, spec) -> Path:
    return root / "runs" / spec.slug


def _test_time(variants, scale, root, data_dir):
    curves = {}
    for v in variants:
        per_seed = []
        for s in scale.seeds:
            cache = _run_dir(root, v.spec.with_seed(s)) / "test_time.json"
            if not cache.exists():
                save_json(test_time_curve(_run_dir(root, v.spec.with_seed(s)), data_dir=data_dir), cache)
            per_seed.append(json.loads(cache.read_text()))
        rows = []
        for i, r in enumerate(per_seed[0]):
            m, sd = mean_std([c[i]["test_perplexity"] for c in per_seed])
            rows.append({"eval_steps": r["eval_steps"], "test_perplexity": m, "test_perplexity_std": sd})
        curves[v.label] = rows
    findings = []
    for label, rows in curves.items():
        trained = 1 if "T=1" in label else 2
        at = {r["eval_steps"]: r["test_perplexity"] for r in rows}
        best = min(at, key=at.get)
        findings.append(Finding(
            f"(ours) {label}: evaluating with one more step than trained (T={trained + 1}) lowers perplexity",
            "held" if at[trained + 1] < at[trained] else "not held",
            ", ".join(f"T={t}: {p:.3f}" for t, p in at.items()) + f"; best T={best}",
        ))
    return curves, findings


def _energy(variant, scale, root, data_dir):
    run_dir = _run_dir(root, variant.spec.with_seed(scale.seeds[0]))
    cache = run_dir / "energy.json"
    if not cache.exists():
        save_json(energy_trace(run_dir, data_dir=data_dir), cache)
    trace = json.loads(cache.read_text())
    findings = []
    for kind in ("attention", "mlp"):
        rs = [r for r in trace if r["kind"] == kind]
        trained = rs[0]["trained_steps"]
        within = [r["energy"][t + 1] < r["energy"][t] for r in rs for t in range(trained)]
        beyond = [r["energy"][t + 1] < r["energy"][t] for r in rs for t in range(trained, len(r["energy"]) - 1)]
        findings.append(Finding(
            f"(ours) {kind}: the trained steps descend the layer's energy",
            "held" if all(within) else ("not held" if not any(within) else "inconclusive"),
            f"{sum(within)}/{len(within)} (layer, step) pairs within the trained T={trained} lower the energy; "
            f"{sum(beyond)}/{len(beyond)} beyond it",
        ))
    return trace, findings


def _table3(scale: str, out: Path, overrides: dict) -> dict:
    from .gp_regression import run_gp_study, summarize as gp_summarize

    rows = run_gp_study(seeds=overrides.get("seeds", (0, 1, 2)), scale=GP_SCALES[scale], out_dir=out, progress=True)
    summary = gp_summarize(rows)
    findings = []
    for kernel in dict.fromkeys(r["kernel"] for r in summary):
        ks = sorted((r for r in summary if r["kernel"] == kernel), key=lambda r: r["steps"])
        first, last = ks[0], ks[-1]
        noise = (first["rmse_std"] ** 2 / first["n_seeds"] + last["rmse_std"] ** 2 / last["n_seeds"]) ** 0.5
        diff = first["rmse_mean"] - last["rmse_mean"]
        findings.append(Finding(
            f"{kernel}: more recursion steps lower the regression error (T={last['steps']} vs T={first['steps']})",
            "held" if diff > noise else ("not held" if diff < -noise else "inconclusive"),
            ", ".join(f"T={r['steps']}: {r['rmse_mean']:.4f} ± {r['rmse_std']:.4f}" for r in ks),
        ))
    return {"question": "recursion on synthetic Gaussian-process regression (10 input dims)", "rows": summary, "findings": [f.__dict__ for f in findings]}


def run_suite(scale: str = "cpu", results_dir: str | Path | None = None, data_dir: str | None = None, jobs: int = 1, ids=ALL_IDS, **overrides) -> None:
    """Every experiment at a scale (runs shared between experiments are trained once)."""
    for exp_id in ids:
        print(f"== {exp_id} ({scale})", file=sys.stderr, flush=True)
        run_experiment(exp_id, scale, results_dir, data_dir, jobs, **overrides)
