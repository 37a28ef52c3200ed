"""`cem report RESULTS_DIR`: one Markdown report of every experiment found there: an opening paragraph
that says which of the paper's findings hold at this scale, then every finding with its seed-paired
difference and 95% confidence interval, the tables and the plots.

A report of runs short of the Chinchilla budget (or of the `smoke` scale) is refused unless asked for,
and then says so on its first line.
"""

from __future__ import annotations

import json
from pathlib import Path

from .registry import SUITE_ORDER

MARK = {"held": "✅ held", "not held": "❌ not held", "inconclusive": "➖ inconclusive"}


class ShortOfBudget(ValueError):
    """The results were not trained to the paper's budget (a report would mislead)."""


def _table(s: dict) -> list[str]:
    if s["experiment"] == "table3":
        out = ["| kernel | T | RMSE | normalised RMSE | params | FLOPs/example |", "|---|---|---|---|---|---|"]
        for r in s.get("gp_rows", []):
            out.append(f"| {r['kernel']} | {r['steps']} | {r['rmse_mean']:.4f} ± {r['rmse_std']:.4f} | {r['nrmse_mean']:.4f} ± {r['nrmse_std']:.4f} | {r['params']:,} | {r['flops']:,} |")
        return out
    out = ["| variant | parameters | attention | MLP | test perplexity (mean ± std) | bits per byte | tokens (per Llama parameter) |", "|---|---|---|---|---|---|---|"]
    for r in s["rows"]:
        out.append(
            f"| {r['label']} | {r['parameters'] / 1e6:.3f}M | {r['attention_parameters'] / 1e6:.3f}M | {r['mlp_parameters'] / 1e6:.3f}M | "
            f"{r['test_perplexity']:.3f} ± {r['test_perplexity_std']:.3f} | {r['test_bits_per_byte']:.4f} ± {r['test_bits_per_byte_std']:.4f} | "
            f"{r['tokens']:,} ({r['tokens_per_llama_parameter']:.1f}) |"
        )
    return out


def _curves(s: dict) -> list[str]:
    curves = s["curves"]
    first = next(iter(curves.values()))
    lines = ["", "| trained | " + " | ".join(f"T={r['eval_steps']}" for r in first) + " |", "|---" * (1 + len(first)) + "|"]
    for label, rows in curves.items():
        lines.append(f"| {label} | " + " | ".join(f"{r['test_perplexity']:.3f} ({r['flops_per_token'] / 1e6:.2f} MFLOP)" for r in rows) + " |")
    lines += ["", "Cells: mean test perplexity over seeds (forward FLOPs per token at that T). The Llama row applies each "
              "sublayer T times (plain reuse)."]
    if s.get("adaptive"):
        lines += ["", "| adaptive evaluation (at most T steps) | T | average steps per CEM layer | MFLOP per token | test perplexity |", "|---|---|---|---|---|"]
        for label, rows in s["adaptive"].items():
            lines += [f"| {label} | {r['eval_steps']} | {r['steps_used']:.2f} | {r['flops_per_token'] / 1e6:.2f} | {r['test_perplexity']:.3f} |" for r in rows]
    return lines


def _short_runs(summaries: list[dict]) -> list[str]:
    out = []
    for s in summaries:
        if not s["scale"].get("findings", True):
            out.append(f"{s['experiment']}: the {s['scale']['name']} scale (a few steps per run)")
        out += [f"{s['experiment']}: {label}" for label in s.get("short_runs", [])]
    return out


def _opening(summaries: list[dict]) -> list[str]:
    """The paper's findings at this scale, in plain words with numbers; ours separately."""
    paper = [(s["experiment"], f) for s in summaries if s.get("paper", True) for f in s["findings"]]
    ours = [(s["experiment"], f) for s in summaries if not s.get("paper", True) for f in s["findings"]]

    def counts(fs):
        return ", ".join(f"{sum(f['verdict'] == k for _, f in fs)} {k}" for k in MARK)

    def listing(fs, verdict):
        items = [f"{f['claim']} ({e}{'; ' + _diff(f) if f.get('difference') else ''})" for e, f in fs if f["verdict"] == verdict]
        return "; ".join(items) if items else "none"

    scale = summaries[0]["scale"]["name"]
    lines = [
        f"**In plain words:** at the `{scale}` scale, with every run at the paper's budget, {sum(f['verdict'] == 'held' for _, f in paper)} of the "
        f"paper's {len(paper)} findings checked hold, {sum(f['verdict'] == 'not held' for _, f in paper)} are contradicted (the interval excludes "
        f"zero with the other sign) and {sum(f['verdict'] == 'inconclusive' for _, f in paper)} cannot be told from seed noise. Each item below gives "
        "the seed-paired difference (perplexity, or relative where the claim is relative) with its 95% interval.",
        "",
        f"**The paper's findings at this scale:** {counts(paper)}.",
    ]
    for verdict in MARK:
        lines.append(f"- **{verdict.capitalize()}:** {listing(paper, verdict)}.")
    if ours:
        lines += ["", f"**Ours, beyond the paper:** {counts(ours)}."]
        for verdict in MARK:
            lines.append(f"- **{verdict.capitalize()}:** {listing(ours, verdict)}.")
    return lines


def _diff(f: dict) -> str:
    d = f["difference"]
    if d["n"] < 2:
        return f"difference {d['mean']:+.3g}, one seed"
    return f"difference {d['mean']:+.3g} [95% CI {d['lo']:+.3g}, {d['hi']:+.3g}]"


def write_report(results_dir: str | Path, allow_short: bool = False) -> Path:
    """Write RESULTS_DIR/report.md from RESULTS_DIR/*/summary.json; refuses results short of the budget
    (a `ShortOfBudget` error) unless `allow_short`."""
    root = Path(results_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"no results directory at {root}")
    summaries = [json.loads((root / i / "summary.json").read_text()) for i in SUITE_ORDER if (root / i / "summary.json").exists()]
    if not summaries:
        raise ValueError(f"{root} holds no experiment results (expected {root}/ID/summary.json from `cem experiment`)")
    short = _short_runs(summaries)
    if short and not allow_short:
        raise ShortOfBudget(
            f"{len(short)} result(s) in {root} were not trained to the paper's budget (the Chinchilla tokens of the "
            f"Llama baseline), e.g. {short[0]}; they are not findings. Pass --allow-short to write the report anyway "
            "(its first line will say so)."
        )
    lines = []
    if short:
        lines += [f"> **Not the paper's protocol: {len(short)} result(s) below were trained short of the Chinchilla budget "
                  f"(e.g. {short[0]}). Nothing here is a finding.**", ""]
    lines += ["# CEM experiments: the paper's findings, checked", ""]
    sc = next((s["scale"] for s in summaries if s["rows"]), summaries[0]["scale"])
    machines = sorted({s["machine"] for s in summaries})
    runs = [json.loads(p.read_text()) for p in sorted(root.glob("runs/*/results.json"))]
    train_h = sum(r["wall_time_s"] for r in runs) / 3600
    lines += [
        f"Scale `{sc['name']}`: corpus `{sc['data']}`, tokenizer `{sc['tokenizer']}`, sizes {', '.join(sc['sizes'])} (base `{sc['base']}`), "
        f"sequences of {sc['seq_len']} tokens, batch {sc['batch_size']}×{sc['grad_accum']}, "
        + (f"{sc['max_steps']} steps per run" if sc.get("max_steps") else "every run trained on the Chinchilla budget of its Llama baseline (20 tokens per Llama parameter) with a 5% warm-up")
        + f"; seeds {sc['seeds']} ({sc['recursion_seeds']} for the recursion experiments).",
        "",
        f"Machine: {', '.join(machines)}. {len(runs)} training runs (shared between experiments, each trained once) took "
        f"{train_h:.2f} h of training time, summed over runs.",
        "",
        "How findings are judged: runs are paired by seed (same seed, same data order); a finding is **held** only when the "
        "95% confidence interval (Student t) of the mean paired difference excludes zero with the paper's sign, **not held** when it "
        "excludes zero with the opposite sign, **inconclusive** otherwise; \"close\" findings are held when the whole interval of the "
        "relative difference lies within the stated tolerance.",
        "",
    ]
    lines += _opening(summaries)
    lines += ["", "| experiment | finding | verdict | evidence |", "|---|---|---|---|"]
    lines += [f"| {s['experiment']} | {f['claim']} | {MARK[f['verdict']]} | {f['evidence']} |" for s in summaries for f in s["findings"]]
    for s in summaries:
        lines += ["", f"## {s['experiment']}: {s['question']}", ""]
        lines += _table(s)
        if "optima" in s:
            lines += [""] + [f"- Akima optimum of the seed means, {g}: lr {o['lr']:.2e}, perplexity {o['test_perplexity']:.3f}" for g, o in s["optima"].items()]
        if "curves" in s:
            lines += _curves(s)
        lines += ["", *[f"- {MARK[f['verdict']]}: {f['claim']} ({f['evidence']})" for f in s["findings"]]]
        png = f"{s['experiment']}/{s['experiment']}.png"
        if (root / png).exists():
            lines += ["", f"![{s['experiment']}]({png})"]
    path = root / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
