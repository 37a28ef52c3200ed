"""The Table 3 figure: test RMSE against T per kernel, with the GP oracle."""

from __future__ import annotations

import os



def plot_table3(summary: list[dict], path: str | os.PathLike) -> None:
    """Test RMSE vs T (log2 axis) with ±std error bars, one line per kernel; dashed: the GP oracle."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    kernels = list(dict.fromkeys(s["kernel"] for s in summary))
    for i, k in enumerate(kernels):
        ss = sorted((s for s in summary if s["kernel"] == k), key=lambda s: s["steps"])
        ts = [s["steps"] for s in ss]
        color = f"C{i}"
        ax.errorbar(
            ts,
            [s["rmse_mean"] for s in ss],
            yerr=[s["rmse_std"] for s in ss],
            marker="o",
            capsize=3,
            color=color,
            label=k,
        )
        oracle = [s["gp_oracle_rmse_mean"] for s in ss if "gp_oracle_rmse_mean" in s]
        if oracle:
            ax.axhline(sum(oracle) / len(oracle), color=color, ls="--", lw=0.8, label=f"{k} GP oracle")
    ax.set_xscale("log", base=2)
    all_t = sorted({s["steps"] for s in summary})
    ax.set_xticks(all_t)
    ax.set_xticklabels([str(t) for t in all_t])
    ax.set_xlabel("recursion steps T")
    ax.set_ylabel("test RMSE")
    ax.set_title("Table 3: recursive CEM MLP on GP regression (d=10)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
