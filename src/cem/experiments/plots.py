"""One figure per experiment, shaped like the paper's (matplotlib, Agg backend)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"Llama": "#e377c2", "CEM attention": "#1f77b4", "CEM MLP": "#1f77b4", "CEM MLP, parameter-matched": "#ff7f0e"}


def _finish(fig, ax, title: str, path: Path) -> None:
    ax.set_title(textwrap.fill(title, 60), fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_sizes(rows, title, path):
    """Perplexity against parameters; each CEM point linked to its Llama baseline of the same size (Fig. 2a, 2b)."""
    fig, ax = plt.subplots(figsize=(5.5, 4))
    by_size = {}
    for r in rows:
        by_size.setdefault(r["size"], []).append(r)
    for size, rs in by_size.items():
        base = next(r for r in rs if r["group"] == "Llama")
        for r in rs:
            if r is not base:
                ax.plot([base["parameters"] / 1e6, r["parameters"] / 1e6], [base["test_perplexity"], r["test_perplexity"]], color="gray", lw=0.8)
    marker = {"Llama": "D", "CEM attention": "o", "CEM MLP": "o", "CEM MLP, parameter-matched": "^"}
    for group in dict.fromkeys(r["group"] for r in rows):
        rs = [r for r in rows if r["group"] == group]
        ax.errorbar([r["parameters"] / 1e6 for r in rs], [r["test_perplexity"] for r in rs], yerr=[r["test_perplexity_std"] for r in rs],
                    fmt=marker.get(group, "o"), color=COLORS.get(group), label=group, capsize=3)
        for r in rs:
            ax.annotate(r["size"], (r["parameters"] / 1e6, r["test_perplexity"]), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("parameters (M)")
    ax.set_ylabel("test perplexity")
    ax.legend(fontsize=8)
    _finish(fig, ax, title, path)


def plot_steps(rows, title, path):
    """Perplexity against recursion steps T, one line per preconditioner, Llama dashed (Fig. 2c, 2d)."""
    fig, ax = plt.subplots(figsize=(5, 4))
    for r in rows:
        if r["group"] == "Llama":
            ax.axhline(r["test_perplexity"], ls="--", color=COLORS["Llama"], label=r["label"])
    for group in ("diag", "diag_lowrank"):
        rs = sorted((r for r in rows if r["group"] == group), key=lambda r: r["steps"])
        ax.errorbar([r["steps"] for r in rs], [r["test_perplexity"] for r in rs], yerr=[r["test_perplexity_std"] for r in rs], marker="o", capsize=3, label=group)
    ax.set_xticks([1, 2])
    ax.set_xlabel("recursion steps T")
    ax.set_ylabel("test perplexity")
    ax.legend(fontsize=8)
    _finish(fig, ax, title, path)


def plot_lr(rows, title, path, optima=None):
    """Perplexity against learning rate with Akima interpolants and their optima (stars) (Fig. 3a)."""
    import numpy as np
    from scipy.interpolate import Akima1DInterpolator

    fig, ax = plt.subplots(figsize=(5.5, 4))
    for group, color in (("Llama", "#ff7f0e"), ("CEM (T=2, diag+low-rank)", "#1f77b4")):
        rs = sorted((r for r in rows if r["group"] == group), key=lambda r: r["lr"])
        x = np.log2([r["lr"] for r in rs])
        y = [r["test_perplexity"] for r in rs]
        ax.errorbar([r["lr"] for r in rs], y, yerr=[r["test_perplexity_std"] for r in rs], fmt="o", color=color, capsize=3, label=group)
        grid = np.linspace(x[0], x[-1], 200)
        ax.plot(2**grid, Akima1DInterpolator(x, y)(grid), color=color, lw=1)
        if optima and group in optima:
            ax.plot(*optima[group], marker="*", ms=14, color=color)
    ax.set_xscale("log")
    lrs = sorted({r["lr"] for r in rows})
    ax.set_xticks(lrs, [f"{lr:g}" for lr in lrs])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("learning rate")
    ax.set_ylabel("test perplexity")
    ax.legend(fontsize=8)
    _finish(fig, ax, title, path)


def plot_bars(rows, title, path):
    """One bar per variant with seed error bars (Fig. 3b and our positional study)."""
    fig, ax = plt.subplots(figsize=(5.5, 4))
    labels = [r["label"] for r in rows]
    ax.bar(range(len(rows)), [r["test_perplexity"] for r in rows], yerr=[r["test_perplexity_std"] for r in rows], capsize=3,
           color=[COLORS["Llama"] if r["label"].startswith("Llama") else "#1f77b4" for r in rows])
    lo = min(r["test_perplexity"] - 2 * r["test_perplexity_std"] for r in rows)
    hi = max(r["test_perplexity"] + 2 * r["test_perplexity_std"] for r in rows)
    ax.set_ylim(lo - 0.1 * (hi - lo), hi + 0.1 * (hi - lo))
    ax.set_xticks(range(len(rows)), labels, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("test perplexity")
    _finish(fig, ax, title, path)


def plot_gains(rows, title, path):
    """Perplexity at T=1 (or x1) and T=2 (or x2) per setting (Fig. 3c, 4)."""
    fig, ax = plt.subplots(figsize=(5.5, 4))
    groups = list(dict.fromkeys(r["group"] for r in rows))
    for i, g in enumerate(groups):
        rs = sorted((r for r in rows if r["group"] == g), key=lambda r: r["steps"])
        for r, color, dx in zip(rs, ("#ff7f0e", "#1f77b4"), (-0.15, 0.15)):
            ax.errorbar(i + dx, r["test_perplexity"], yerr=r["test_perplexity_std"], fmt="o", color=color, capsize=3)
        ax.plot([i - 0.15, i + 0.15], [r["test_perplexity"] for r in rs], color="gray", lw=1)
    ax.set_xticks(range(len(groups)), groups, fontsize=8)
    ax.set_ylabel("test perplexity (orange: T=1 / x1, blue: T=2 / x2)")
    _finish(fig, ax, title, path)


def plot_test_time(curves: dict[str, list[dict]], title, path):
    """Test perplexity against the T used at evaluation, one line per training T."""
    fig, ax = plt.subplots(figsize=(5, 4))
    for label, rows in curves.items():
        ax.errorbar([r["eval_steps"] for r in rows], [r["test_perplexity"] for r in rows], yerr=[r.get("test_perplexity_std", 0) for r in rows], marker="o", capsize=3, label=label)
    ax.set_xlabel("recursion steps T at evaluation")
    ax.set_ylabel("test perplexity")
    ax.legend(fontsize=8)
    _finish(fig, ax, title, path)


def plot_energy(rows, title, path):
    """Energy relative to the start point, per layer, at each recursion step."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 4))
    for ax, kind in zip(axes, ("attention", "mlp")):
        for r in (r for r in rows if r["kind"] == kind):
            e = r["energy"]
            scale = abs(e[0]) or 1.0
            ax.plot(range(len(e)), [(v - e[0]) / scale for v in e], marker="o", label=r["layer"].replace("blocks.", "L").replace(".attn", "").replace(".mlp", ""))
        ax.axvline(rows[0]["trained_steps"], ls=":", color="gray")
        ax.set_xlabel("step t")
        ax.set_ylabel("(E_t - E_0) / |E_0|")
        ax.set_title(kind, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(textwrap.fill(title, 100), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
