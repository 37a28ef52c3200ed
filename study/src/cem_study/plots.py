"""One figure per experiment, shaped like the paper's (matplotlib, Agg backend), and the report's figure of the
verdicts across experiments (`plot_verdicts`). Each experiment's takes its summary, a title and a path. Error
bars are 95% confidence intervals (Student t); every figure says of what, and over how many seeds, in its caption."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .stats import ci_halfwidth  # noqa: E402

COLORS = {"Llama": "#e377c2", "CEM attention": "#1f77b4", "CEM MLP": "#1f77b4", "CEM MLP, parameter-matched": "#ff7f0e"}


def _err(r: dict, key: str = "test_perplexity") -> float:
    """Half-width of the 95% CI of a row's seed mean of `key` (0 with one seed)."""
    h = ci_halfwidth(r[key + "_per_seed"])
    return 0.0 if h != h else h


def _caption(summary: dict) -> str:
    counts = sorted({len(r["seeds"]) for r in summary.get("rows", []) if "seeds" in r}) or [len(summary.get("seeds", []))]
    n = f"{counts[0]}" if len(counts) == 1 else f"each variant's ({'/'.join(map(str, counts))})"
    return f"Points: mean test perplexity over {n} seeds; error bars: 95% confidence interval of the mean (t, {n} seeds)."


def _caption_below(fig, caption: str) -> float:
    """Write the caption (7 pt, wrapped to the figure's width) at the bottom; returns the fraction of the
    figure's height it takes, for `tight_layout` to keep the axes and their labels above it."""
    text = textwrap.fill(caption, int(18 * fig.get_figwidth()))
    fig.text(0.01, 0.005, text, fontsize=7, va="bottom")
    return ((text.count("\n") + 1) * 7 * 1.25 / 72 + 0.08) / fig.get_figheight()


def _finish(fig, ax, title: str, path: Path, caption: str) -> None:
    ax.set_title(textwrap.fill(title, 60), fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout(rect=(0, _caption_below(fig, caption), 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _finish_panels(fig, title: str, path: Path, caption: str) -> None:
    """`_finish` for a figure of several panels: one title above them all, the caption below."""
    fig.suptitle(textwrap.fill(title, int(11 * fig.get_figwidth())), fontsize=9)
    fig.tight_layout(rect=(0, _caption_below(fig, caption), 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_sizes(summary, title, path):
    """Perplexity against parameters; each CEM point linked to its Llama baseline of the same size (Fig. 2a, 2b)."""
    rows = summary["rows"]
    fig, ax = plt.subplots(figsize=(5.5, 4.4))
    by_size: dict[str, list] = {}
    for r in rows:
        by_size.setdefault(r["size"], []).append(r)
    for rs in by_size.values():
        base = next(r for r in rs if r["group"] == "Llama")
        for r in rs:
            if r is not base:
                ax.plot([base["parameters"] / 1e6, r["parameters"] / 1e6], [base["test_perplexity"], r["test_perplexity"]], color="gray", lw=0.8)
    marker = {"Llama": "D", "CEM attention": "o", "CEM MLP": "o", "CEM MLP, parameter-matched": "^"}
    for group in dict.fromkeys(r["group"] for r in rows):
        rs = [r for r in rows if r["group"] == group]
        ax.errorbar([r["parameters"] / 1e6 for r in rs], [r["test_perplexity"] for r in rs], yerr=[_err(r) for r in rs],
                    fmt=marker.get(group, "o"), color=COLORS.get(group), label=group, capsize=3)
        for r in rs:
            ax.annotate(r["size"], (r["parameters"] / 1e6, r["test_perplexity"]), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("parameters (M)")
    ax.set_ylabel("test perplexity")
    ax.legend(fontsize=8)
    _finish(fig, ax, title, path, _caption(summary) + " Gray lines join each CEM model to the Llama of its size.")


def plot_steps(summary, title, path):
    """Perplexity against recursion steps T, one line per CEM setting, the Llama baselines dashed (Fig. 2c, 2d)."""
    rows = summary["rows"]
    gaps = summary.get("training_gap", [])
    fig, axes = plt.subplots(1, 1 + bool(gaps), figsize=(5 + 4.6 * bool(gaps), 4.4), squeeze=False)
    ax = axes[0][0]
    for r, ls in zip((r for r in rows if r["group"].startswith("Llama")), ("--", ":", "-.")):
        ax.axhline(r["test_perplexity"], ls=ls, color=COLORS["Llama"], label=f"{r['label']}")
    for group in dict.fromkeys(r["group"] for r in rows if not r["group"].startswith("Llama")):
        rs = sorted((r for r in rows if r["group"] == group), key=lambda r: r["steps"])
        ax.errorbar([r["steps"] for r in rs], [r["test_perplexity"] for r in rs], yerr=[_err(r) for r in rs], marker="o", capsize=3, label=group)
    ax.set_xticks(sorted({r["steps"] for r in rows if "steps" in r}))
    ax.set_xlabel("recursion steps T")
    ax.set_ylabel("test perplexity")
    ax.legend(fontsize=8)
    caption = _caption(summary) + " Horizontal lines: the Llama baselines (means)."
    for g in gaps:  # right: where the difference comes from, through training
        gx = axes[0][1]
        mid = [(lo + hi) / 2 for lo, hi in zip(g["edges"], g["edges"][1:])]
        gx.fill_between(mid, g["low"], g["high"], alpha=0.25)
        gx.plot(mid, g["mean"], marker="o", label=f"{g['a']} - {g['b']}")
        gx.axhline(0, color="k", lw=0.8)
        gx.set_xlabel("training step")
        gx.set_ylabel("training-loss difference (nats)")
        gx.legend(fontsize=7, loc="upper right")
        gx.grid(alpha=0.3)
    if gaps:
        ax.grid(alpha=0.3)
        caption += (" Right: training loss paired by seed on the same batches, mean over each stretch of steps and over the seeds; "
                    "band: the lowest and highest seed.")
        _finish_panels(fig, title, path, caption)
    else:
        _finish(fig, ax, title, path, caption)


def _lr_panel(ax, rows: list[dict], groups, key: str, optima: dict) -> None:
    """Mean `key` against the learning rate per group, with Akima interpolants over log2(lr) and their minima."""
    import numpy as np
    from scipy.interpolate import Akima1DInterpolator

    for group, color in groups:
        rs = sorted((r for r in rows if r["group"] == group), key=lambda r: r["lr"])
        if not rs:
            continue
        x = np.log2([r["lr"] for r in rs])
        y = [r[key] for r in rs]
        ax.errorbar([r["lr"] for r in rs], y, yerr=[_err(r, key) for r in rs], fmt="o", color=color, capsize=3, label=group)
        if len(rs) > 2:
            grid = np.linspace(x[0], x[-1], 200)
            ax.plot(2**grid, Akima1DInterpolator(x, y)(grid), color=color, lw=1)
        if group in optima:
            ax.plot(optima[group]["lr"], optima[group][key], marker="*", ms=14, color=color, ls="none", label=f"{group}: Akima optimum")
    ax.set_xscale("log")
    lrs = sorted({r["lr"] for r in rows})
    ax.set_xticks(lrs, [f"{lr:g}" for lr in lrs], fontsize=7)
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("learning rate")
    ax.set_ylabel(key.replace("_", " ") + " (nats per token)")
    ax.legend(fontsize=7)


def plot_lr(summary, title, path):
    """Validation loss against learning rate with Akima interpolants and their optima (Fig. 3a; chosen on validation)."""
    fig, ax = plt.subplots(figsize=(5.5, 4.4))
    _lr_panel(ax, summary["rows"], (("Llama", "#ff7f0e"), ("CEM (T=2, diag+low-rank)", "#1f77b4")), "valid_loss", summary.get("optima", {}))
    _finish(fig, ax, title, path, _caption(summary).replace("test perplexity", "validation loss")
            + " Lines: Akima interpolants of the means over log2(lr); stars: their minima. Rates are chosen on validation; test is read once per run.")


def plot_lr_sweep(summary, title, path):
    """The Llama baseline's validation loss against the learning rate, one panel per size; the chosen rate marked."""
    sizes = list(dict.fromkeys(r["group"] for r in summary["rows"] if not r.get("regime")))
    fig, axes = plt.subplots(1, len(sizes), figsize=(4.2 * len(sizes), 4), squeeze=False)
    for ax, size in zip(axes[0], sizes):
        rows = [r for r in summary["rows"] if r["group"] == size]
        _lr_panel(ax, rows, ((size, "#ff7f0e"),), "valid_loss", {})
        chosen = summary.get("chosen", {}).get(size)
        if chosen:
            ax.axvline(chosen["lr"], color="gray", ls="--", lw=0.8)
        ax.set_title(f"Llama {size} (seeds {rows[0]['seeds']})", fontsize=8)
    _finish_panels(fig, title, path, "Points: mean validation loss over the seeds shown; error bars: 95% CI of the mean (t) where there is "
                   "more than one seed. Dashed line: the chosen rate (lowest mean validation loss), at which every variant of that size trains.")


def plot_size_trend(summary, title, path):
    """The paired loss gap of each headline comparison against parameters, with its fitted trend."""
    import numpy as np

    trend = summary.get("trend", {})
    fig, ax = plt.subplots(figsize=(5.5, 4.4))
    for name, entry in trend.items():
        pts = entry["points"]
        x = [p["parameters"] / 1e6 for p in pts]
        y = [p["mean"] for p in pts]
        err = [0.0 if p["n"] < 2 else p["hi"] - p["mean"] for p in pts]
        line = ax.errorbar(x, y, yerr=err, fmt="o", capsize=3, label=name)
        if "slope" in entry:
            lx = np.log([p["parameters"] for p in pts])
            b = entry["slope"]["mean"]
            a = entry.get("intercept", np.mean(y) - b * np.mean(lx))
            ax.plot(x, a + b * lx, color=line[0].get_color(), lw=1)
    ax.axhline(0, color="gray", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("parameters of the Llama baseline (M)")
    ax.set_ylabel("test loss gap, variant - baseline (nats per token)")
    ax.legend(fontsize=7)
    _finish(fig, ax, title, path, "Points: mean paired gap over the size's seeds; error bars: 95% CI of the mean paired gap (t; "
            "none where a size has one seed). Lines: fits in log(parameters) on the size means, weighted by 1/se² of each mean "
            "(equal weights where a size has one seed); the tested range only. Where fig3a "
            "was analysed, full CEM's point at the base size is at its own best rate. Below 0: the variant is better.")


def plot_points(summary, title, path):
    """One point per variant with its interval (Fig. 3b, our positional and readings studies). Points, not
    bars: a bar's length would have to start at 0 to be honest, and then the differences vanish."""
    rows = summary["rows"]
    fig, ax = plt.subplots(figsize=(5.5, 4.4))
    for i, r in enumerate(rows):
        color = COLORS["Llama"] if r["label"].startswith("Llama") else "#1f77b4"
        ax.errorbar(i, r["test_perplexity"], yerr=_err(r), fmt="o", color=color, capsize=4)
    ax.set_xticks(range(len(rows)), [textwrap.fill(r["label"], 18) for r in rows], fontsize=7)
    ax.set_xlim(-0.5, len(rows) - 0.5)
    ax.set_ylabel("test perplexity")
    _finish(fig, ax, title, path, _caption(summary) + " Pink: Llama; blue: CEM.")


STEP_MARKS = {1: (-0.15, "#ff7f0e"), 2: (0.15, "#1f77b4")}  # x offset and colour of T=1 (x1) and T=2 (x2)
STEP_LABELS = {1: "one step / one pass (T=1, x1)", 2: "two steps / two passes (T=2, x2)"}


def plot_gains(summary, title, path):
    """Perplexity at T=1 (or x1) and T=2 (or x2) per setting (Fig. 3c, 4)."""
    rows = summary["rows"]
    fig, ax = plt.subplots(figsize=(5.5, 4.4))
    groups, seen = list(dict.fromkeys(r["group"] for r in rows)), set()
    by_label = {r["label"]: r for r in rows}
    for i, g in enumerate(groups):
        rs = sorted((r for r in rows if r["group"] == g), key=lambda r: r["steps"])
        if rs[0].get("one_pass"):  # a sublayer applied twice whose one pass is another group's T=1 point: drawn here too
            rs = [by_label[rs[0]["one_pass"]], *rs]
        for r in rs:  # a control group (T=1 with a learned step gain) has its T=1 point only
            (dx, color), label = STEP_MARKS[r["steps"]], STEP_LABELS[r["steps"]]
            ax.errorbar(i + dx, r["test_perplexity"], yerr=_err(r), fmt="o", color=color, capsize=3, label=label if label not in seen else None)
            seen.add(label)
        if len(rs) == 2:
            ax.plot([i + STEP_MARKS[r["steps"]][0] for r in rs], [r["test_perplexity"] for r in rs], color="gray", lw=1)
    ax.set_xticks(range(len(groups)), [textwrap.fill(g, 16) for g in groups], fontsize=8)
    ax.set_ylabel("test perplexity")
    ax.legend(fontsize=8)
    _finish(fig, ax, title, path, _caption(summary))


def plot_step_sizes(summary, title, path):
    """Perplexity against T, one line per step-size schedule, attention and MLP side by side."""
    rows = summary["rows"]
    fig, axes = plt.subplots(1, 2, figsize=(9, 4.4))
    for ax, name in zip(axes, ("CEM attention", "CEM MLP")):
        rs = [r for r in rows if r["sublayer"] == name]
        for schedule in dict.fromkeys(r["schedule"] for r in rs):
            pts = sorted((r for r in rs if r["schedule"] == schedule or (schedule == "inverse" and r["schedule"] == "constant" and r["steps"] == 1)),
                         key=lambda r: r["steps"])
            label = {"constant": "η = 1", "inverse": "η = 1/T", "learned": "η learned per step"}[schedule]
            ax.errorbar([r["steps"] for r in pts], [r["test_perplexity"] for r in pts], yerr=[_err(r) for r in pts], marker="o", capsize=3, label=label)
        ax.set_xticks([1, 2, 3])
        ax.set_xlabel("recursion steps T (training and evaluation)")
        ax.set_ylabel("test perplexity")
        ax.set_title(name, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    _finish_panels(fig, title, path, _caption(summary) + " At T=1, η = 1/T is η = 1.")


def plot_test_time(summary, title, path):
    """Left: test perplexity against forward FLOPs per token as T at evaluation grows, one line per trained
    model (fixed T), plain reuse of a Llama dashed, the deeper Llama a star. Middle: each exit rule's test-loss
    gain over the fixed-T curve at the same FLOPs (> 0: the rule spends its steps where they help). Right:
    where the steps from m to 2m cost, per CEM model: its attention layers alone, its MLP layers alone, all."""
    extra = summary.get("extra_steps") or {}
    fig, axes = plt.subplots(1, 3 if extra else 2, figsize=(18 if extra else 13, 5.5),
                             gridspec_kw={"width_ratios": [3, 2, 2] if extra else [3, 2]})
    ax, bx = axes[0], axes[1]
    for label, rows in summary["curves"].items():
        x = [r["flops_per_token"] / 1e6 for r in rows]
        y = [r["test_perplexity"] for r in rows]
        err = [_ci_err(r) for r in rows]
        if len(rows) == 1:
            ax.errorbar(x, y, yerr=err, marker="*", ms=12, capsize=3, ls="none", label=f"{label} (as trained)")
            continue
        ax.errorbar(x, y, yerr=err, marker="o", ms=4, capsize=3, label=f"{label} (fixed T)", ls="--" if "reuse" in label else "-")
        for xi, yi, r in zip(x, y, rows):
            ax.annotate(f"{r['eval_steps']}", (xi, yi), fontsize=6, xytext=(2, 3), textcoords="offset points")
    ax.set_xlabel("forward FLOPs per token (M); numbers: the T (or reuse count) at evaluation")
    ax.set_ylabel("test perplexity")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
    names, gains, errs = [], [], []
    for label, (row,) in summary.get("adaptive", {}).items():
        g = row.get("gain_over_fixed")
        if g is None:
            continue
        names.append(f"{label} ({row['steps_used']:.1f} steps)")
        gains.append(g["mean"])
        errs.append(_half_width(g))
    if names:
        bx.barh(range(len(names)), gains, xerr=errs, capsize=2, color="tab:gray")
        bx.set_yticks(range(len(names)), names, fontsize=5)
        bx.axvline(0, color="black", lw=0.8)
        bx.invert_yaxis()
        bx.set_xlabel("test loss gain over fixed T at equal FLOPs (nats)")
        bx.grid(alpha=0.3, axis="x")
    else:
        bx.set_axis_off()
    if extra:
        cx, parts, height = axes[2], ("attention", "mlp", "all"), 0.27
        for j, part in enumerate(parts):
            costs = [e["cost"].get(part) for e in extra.values()]
            ys = [i + (j - 1) * height for i in range(len(extra))]
            cx.barh(ys, [c["mean"] if c else 0.0 for c in costs], height, xerr=[_half_width(c) if c else 0.0 for c in costs],
                    capsize=2, label={"mlp": "MLP layers only", "attention": "attention layers only", "all": "every CEM layer"}[part])
        cx.set_yticks(range(len(extra)), [textwrap.fill(f"{label} ({e['base']} → {e['more']})", 36) for label, e in extra.items()], fontsize=5)
        cx.axvline(0, color="black", lw=0.8)
        cx.invert_yaxis()
        cx.set_xlabel("test loss increase, m → 2m steps (nats)")
        cx.grid(alpha=0.3, axis="x")
        cx.legend(fontsize=6)
    n = next(iter(summary["curves"].values()))[0]["test_perplexity_ci"]["n"]
    _finish_panels(fig, title, path, f"Left: mean test perplexity over {n} seeds; error bars: 95% confidence interval of the mean (t). "
                   f"Middle: each exit rule (at most the deepest T, per position) minus the fixed-T curve interpolated at the rule's average "
                   f"FLOPs, mean over {n} seeds with its 95% interval; the energy the energy rule also computes is not counted."
                   + (" Right: the test loss with the named CEM layers at twice the mean trained depth m (the others at m) minus the loss "
                      f"with all at m, mean over {n} seeds with its 95% interval." if extra else ""))


def _loss_lines(ax, curves: dict, depth: dict, name=lambda label: label) -> None:
    """Mean test loss against T at evaluation with 95% error bars, a line per model of `curves` (labelled `name(label)`),
    its mean trained depth m (`depth`) marked with a filled circle and 2m with an open one."""
    for label, rows in curves.items():
        ts = [r["eval_steps"] for r in rows]
        loss = [float(sum(r["test_loss_per_seed"]) / len(r["test_loss_per_seed"])) for r in rows]
        err = [0.0 if (h := ci_halfwidth(r["test_loss_per_seed"])) != h else h for r in rows]
        line = ax.errorbar(ts, loss, yerr=err, marker=".", ms=4, capsize=2, label=name(label))
        m = depth.get(label)
        for t, face in ((m and round(m), None), (m and round(2 * m), "none")):
            if t in ts:
                ax.plot([t], [loss[ts.index(t)]], "o", ms=9, color=line[0].get_color(), mfc=face)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("T at evaluation (every recursing CEM layer)")
    ax.set_ylabel("test loss (nats per token)")


def _depths(summary: dict) -> dict:
    """Each model's mean trained depth m (its `steps` where it has none), by label."""
    return {r["label"]: r.get("mean_depth", r.get("steps")) for r in summary.get("rows", [])}


def plot_recipes(summary, title, path):
    """The test-time recipes: test loss against T at evaluation, one line per trained model, its mean trained
    depth m marked with a filled circle and 2m with an open one (below m's: more steps helped)."""
    fig, ax = plt.subplots(figsize=(9, 5.5))
    _loss_lines(ax, summary["curves"], _depths(summary))
    ax.legend(fontsize=6)
    n = next(iter(summary["curves"].values()))[0]["test_perplexity_ci"]["n"]
    _finish(fig, ax, title, path, f"Mean test loss over {n} seeds; error bars: 95% confidence interval of the mean (t). Filled circle: "
            "the model's mean trained depth m; open circle: 2m (the test-time question: is the open circle below the filled one?).")


ZOOM_NATS = 0.25  # the confirmation's lower panels: the test loss within this of the lowest point of the size


def plot_recipes_confirm(summary, title, path):
    """The recipes' confirmation: test loss against T at evaluation, a panel per size, a line per CEM model with its
    trained depth m (filled circle) and 2m (open) marked, the deeper Llama (evaluated as trained) a horizontal line;
    below each, the same within ZOOM_NATS of the size's lowest loss (where the recipes' differences of a few
    hundredths of a nat are read)."""
    sizes, depth = summary["scale"]["sizes"], _depths(summary)
    size_of = {r["label"]: r["size"] for r in summary["rows"]}
    deeper = {r["label"] for r in summary["rows"] if r.get("kind") == "deeper"}
    mean = lambda r: sum(r["test_loss_per_seed"]) / len(r["test_loss_per_seed"])  # noqa: E731
    fig, axes = plt.subplots(2, len(sizes), figsize=(7 * len(sizes), 10), squeeze=False)
    for col, size in enumerate(sizes):
        here = {label: rows for label, rows in summary["curves"].items() if size_of[label] == size}
        for ax in axes[:, col]:
            _loss_lines(ax, {label: rows for label, rows in here.items() if label not in deeper}, depth, lambda label: label.removesuffix(f" {size}"))
            for label in (label for label in here if label in deeper):
                (r,) = here[label]
                ax.axhline(mean(r), color="black", ls="--", lw=1, label=f"{label.removesuffix(f' {size}')} (as trained)")
            ax.grid(alpha=0.3)
        lowest = min(mean(r) for rows in here.values() for r in rows)
        axes[1, col].set_ylim(lowest - 0.02, lowest + ZOOM_NATS)
        axes[0, col].set_title(size, fontsize=9)
        axes[1, col].set_title(f"{size}: within {ZOOM_NATS} nats of its lowest loss", fontsize=9)
        axes[0, col].legend(fontsize=6)
    n = next(iter(summary["curves"].values()))[0]["test_perplexity_ci"]["n"]
    _finish_panels(fig, title, path, f"Mean test loss over {n} seeds; error bars: 95% confidence interval of the mean (t). Filled circle: "
                   "the model's mean trained depth m; open circle: 2m. Dashed: the Llama with twice the layers, evaluated as trained. "
                   f"Lower panels: the same, the loss axis cut at {ZOOM_NATS} nats above each size's lowest point.")


def _half_width(interval: dict) -> float:
    """Half the width of a 95% interval (0 for one seed)."""
    return max(0.0, (interval["hi"] - interval["lo"]) / 2) if interval["n"] > 1 else 0.0


def _ci_err(r: dict) -> float:
    return _half_width(r["test_perplexity_ci"])


def plot_energy(summary, title, path):
    """Energy relative to the start point, per layer, at each recursion step."""
    rows = summary["energy"]
    fig, axes = plt.subplots(1, 2, figsize=(9, 4.4))
    for ax, kind in zip(axes, ("attention", "mlp")):
        for r in (r for r in rows if r["kind"] == kind):
            e = r["energy"]
            scale = abs(e[0]) or 1.0
            ax.plot(range(len(e)), [(v - e[0]) / scale for v in e], marker="o", label=r["layer"].replace("blocks.", "layer ").replace(".attn", "").replace(".mlp", ""))
        ax.axvline(rows[0]["trained_steps"], ls=":", color="gray", label="trained T (dotted)")
        ax.set_xlabel("step t")
        ax.set_ylabel("(E_t - E_0) / |E_0|")
        ax.set_title(kind, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    _finish_panels(fig, title, path, "Mean energy over 4 held-out sequences (one seed), relative to the start point; steps left of the dotted line are the trained ones.")


def plot_table3(summary, title, path):
    """The GP regression study's own figure (RMSE against T per kernel)."""
    from .gp_regression import plot_table3 as gp_plot

    gp_plot(summary["gp_rows"], path)


VERDICT_COLORS = {"held": "#2ca02c", "not held": "#d62728", "inconclusive": "#7f7f7f"}


def held_region(f: dict) -> tuple[float, float]:
    """Where a finding of test loss holds, in nats of its difference: above or below 0 (directional, by the claim's
    sign), inside ±margin (equivalence), below +margin (non-inferiority)."""
    if f["kind"] == "equivalence":
        return -f["margin"], f["margin"]
    if f["kind"] == "non-inferiority":
        return -math.inf, f["margin"]
    return (0.0, math.inf) if f.get("sign", 1) > 0 else (-math.inf, 0.0)


def plot_verdicts(entries: list[tuple[str, dict, dict | None]], title: str, path: Path) -> None:
    """The seed-paired differences the verdicts rest on, one row per finding of test loss (experiment, finding at
    the paper's rate rule, the same finding at each CEM variant's own rate or None): its mean and 95% interval as a
    perplexity ratio, over the region where the claim holds, coloured by the raw verdict; each Δ as its finding reads it
    (`findings.oriented`: left of zero CEM, or the side the claim favours, better)."""
    pct = lambda x: 100 * math.expm1(x)  # noqa: E731
    fig, ax = plt.subplots(figsize=(8.5, 1.2 + 0.62 * len(entries)))
    ends = [x for _, f, g in entries for h in (f, g) if h for x in (h["difference"]["lo"], h["difference"]["hi"], h["difference"]["mean"])
            if math.isfinite(x)]  # one seed: a mean, no interval
    ends += [m for _, f, _ in entries if f.get("margin") for m in (f["margin"], -f["margin"] if f["kind"] == "equivalence" else 0.0)]
    lo, hi = min(ends + [0.0]), max(ends + [0.0])
    pad = 0.12 * (hi - lo or 0.01)
    lo, hi = lo - pad, hi + pad
    labels = []
    for i, (exp_id, f, own) in enumerate(entries):
        y = len(entries) - 1 - i
        a, b = held_region(f)
        ax.fill_betweenx([y - 0.42, y + 0.42], pct(max(a, lo)), pct(min(b, hi)), color=VERDICT_COLORS["held"], alpha=0.12, lw=0)
        for h, dy, marker, fill in ((f, 0.12 if own else 0.0, "o", True), (own, -0.18, "s", False)):
            if not h:
                continue
            d, color = h["difference"], VERDICT_COLORS[h["verdict"]]
            xerr = [[pct(d["mean"]) - pct(d["lo"])], [pct(d["hi"]) - pct(d["mean"])]] if d["n"] > 1 else None
            ax.errorbar(pct(d["mean"]), y + dy, xerr=xerr, fmt=marker, color=color, mfc=color if fill else "white", capsize=3, ms=5)
        tag = f"({f.get('family', 'paper')})"  # the family, unless it is the paper's or the claim already says it
        family = "" if tag == "(paper)" or f["claim"].startswith(tag) else f" {tag}"
        labels.append(textwrap.fill(f"{exp_id}{family}: {f['claim']}", 70) + "\n" + textwrap.fill(f"Δ = {f['contrast']}", 70))
    ax.axvline(0, color="black", lw=0.8)
    ax.set_yticks(range(len(entries) - 1, -1, -1), labels, fontsize=6)
    ax.set_ylim(-0.6, len(entries) - 0.4)
    ax.set_xlim(pct(lo), pct(hi))
    ax.set_xlabel("← better      Δ of test loss as a perplexity ratio, exp(Δ) − 1 (%)      worse →")
    _finish(fig, ax, title, path, (
        "Each row: a finding's difference Δ of test loss (nats, the contrast under its claim), paired by seed, shown as exp(Δ) − 1 in %, "
        "read one way: left of zero is CEM better where the row compares CEM with another model, else the side the claim favours "
        "better. "
        "Point: the mean over the paired seeds; error bar: its 95% confidence interval (Student t over those seeds; none with one seed). "
        "Shaded: where the claim holds (held: the whole interval inside it). Filled circle: the paper's rate rule (every run at its "
        "Llama's best rate); open square: each CEM variant at its own best rate, where that reads other runs. Colour: the raw verdict "
        "(green held, red not held, grey inconclusive); the Holm-adjusted verdicts are in the table."))
