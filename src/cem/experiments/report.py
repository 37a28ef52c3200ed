"""`cem report RESULTS_DIR`: one Markdown report of every experiment found there, with the paper's
findings marked held / not held / inconclusive, the numbers, and the plots."""

from __future__ import annotations

import json
from pathlib import Path

from .registry import ALL_IDS

MARK = {"held": "✅ held", "not held": "❌ not held", "inconclusive": "➖ inconclusive"}


def _table(rows: list[dict]) -> list[str]:
    if rows and "rmse_mean" in rows[0]:  # table3
        out = ["| kernel | T | RMSE | normalised RMSE | params | FLOPs/example |", "|---|---|---|---|---|---|"]
        for r in rows:
            out.append(f"| {r['kernel']} | {r['steps']} | {r['rmse_mean']:.4f} ± {r['rmse_std']:.4f} | {r['nrmse_mean']:.4f} ± {r['nrmse_std']:.4f} | {r['params']:,} | {r['flops']:,} |")
        return out
    out = ["| variant | parameters | attention | MLP | test perplexity | bits per byte | tokens |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(
            f"| {r['label']} | {r['parameters'] / 1e6:.3f}M | {r['attention_parameters'] / 1e6:.3f}M | {r['mlp_parameters'] / 1e6:.3f}M | "
            f"{r['test_perplexity']:.3f} ± {r['test_perplexity_std']:.3f} | {r['test_bits_per_byte']:.4f} ± {r['test_bits_per_byte_std']:.4f} | {r['tokens']:,} |"
        )
    return out


def write_report(results_dir: str | Path) -> Path:
    """Write RESULTS_DIR/report.md from RESULTS_DIR/*/summary.json."""
    root = Path(results_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"no results directory at {root}")
    summaries = [json.loads((root / i / "summary.json").read_text()) for i in ALL_IDS if (root / i / "summary.json").exists()]
    if not summaries:
        raise ValueError(f"{root} holds no experiment results (expected {root}/ID/summary.json from `cem experiment`)")
    findings = [(s["experiment"], f) for s in summaries for f in s["findings"]]
    counts = {k: sum(f["verdict"] == k for _, f in findings) for k in MARK}
    lm = next((s for s in summaries if "scale" in s and isinstance(s["scale"], dict)), None)
    lines = ["# CEM experiments: findings of the paper, checked", ""]
    if lm:
        sc = lm["scale"]
        lines += [
            f"Scale `{sc['name']}`: corpus `{sc['data']}`, tokenizer `{sc['tokenizer']}`, sizes {', '.join(sc['sizes'])} (base `{sc['base']}`), "
            f"sequence length {sc['seq_len']}, batch {sc['batch_size']}×{sc['grad_accum']}, "
            f"{'max_steps ' + str(sc['max_steps']) if sc['max_steps'] else 'tokens ' + str(sc['tokens'])} per run, seeds {sc['seeds']}.",
            "",
        ]
    machines = sorted({s["machine"] for s in summaries})
    runs = [json.loads(p.read_text()) for p in sorted(root.glob("runs/*/results.json"))]
    train_h = sum(r["wall_time_s"] for r in runs) / 3600
    lines += [
        f"Machine: {', '.join(machines)}. {len(runs)} training runs (shared between experiments, each trained once) "
        f"took {train_h:.2f} h of training time, summed over runs.",
        "",
    ]
    lines += [f"Findings: {counts['held']} held, {counts['not held']} not held, {counts['inconclusive']} inconclusive "
              "(held = the paper's sign beyond one standard error of the seed means).", ""]
    if lm and len(lm["scale"]["seeds"]) == 1:
        lines += ["With a single seed there is no noise estimate: verdicts go by the sign of the difference alone, "
                  "as in the paper's single runs.", ""]
    lines += ["| experiment | finding | verdict | evidence |", "|---|---|---|---|"]
    lines += [f"| {e} | {f['claim']} | {MARK[f['verdict']]} | {f['evidence']} |" for e, f in findings]
    for s in summaries:
        lines += ["", f"## {s['experiment']}: {s['question']}", ""]
        lines += _table(s["rows"])
        if "optima" in s:
            lines += [""] + [f"- Akima optimum, {g}: lr {o['lr']:.2e}, perplexity {o['test_perplexity']:.3f}" for g, o in s["optima"].items()]
        if "curves" in s:
            lines += ["", "| trained | " + " | ".join(f"eval T={r['eval_steps']}" for r in next(iter(s["curves"].values()))) + " |"]
            lines += ["|---" * (1 + len(next(iter(s["curves"].values())))) + "|"]
            lines += [f"| {k} | " + " | ".join(f"{r['test_perplexity']:.3f}" for r in rows) + " |" for k, rows in s["curves"].items()]
        lines += ["", *[f"- {MARK[f['verdict']]}: {f['claim']} ({f['evidence']})" for f in s["findings"]]]
        png = f"{s['experiment']}/{'table3' if s['experiment'] == 'table3' else s['experiment']}.png"
        if (root / png).exists():
            lines += ["", f"![{s['experiment']}]({png})"]
    path = root / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
