"""Summaries over seeds (mean ± std, the paired change against T=1) and the Markdown table."""

from __future__ import annotations

from ..stats import mean_std
from .config import KERNELS, GPConfig


def summarize(rows: list[dict]) -> list[dict]:
    """Mean ± std (sample std, ddof 1; 0 for a single seed) over seeds per (kernel, T).

    `rel_t1` is the paired change against T=1 on the same seeds (same data, same init): the mean ± std of
    rmse_T / rmse_1 - 1, when T=1 is among the rows.
    """
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["kernel"], r["steps"]), []).append(r)
    base = {(r["kernel"], r["seed"]): r["rmse"] for r in rows if r["steps"] == 1}
    order = {k: i for i, k in enumerate(KERNELS)}
    out = []
    for (kernel, t), rs in sorted(groups.items(), key=lambda kv: (order.get(kv[0][0], 99), kv[0][0], kv[0][1])):
        s = {"kernel": kernel, "steps": t, "n_seeds": len(rs), "seeds": sorted(r["seed"] for r in rs)}
        for key in ("rmse", "nrmse", "rmse_f", "train_rmse", "wall_s", "gp_oracle_rmse"):
            vals = [r[key] for r in rs if r.get(key) is not None]
            if vals:
                s[f"{key}_mean"], s[f"{key}_std"] = mean_std(vals)
        rel = [r["rmse"] / base[(kernel, r["seed"])] - 1 for r in rs if (kernel, r["seed"]) in base]
        if rel:
            s["rel_t1_mean"], s["rel_t1_std"] = mean_std(rel)
        s["params"] = rs[0]["params"]
        s["flops"] = rs[0]["flops"]
        out.append(s)
    return out


def _fmt_flops(n: float) -> str:
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= div:
            return f"{n / div:.3g}{unit}"
    return str(int(n))


def format_table(summary: list[dict], cfg: GPConfig | None = None) -> str:
    """Markdown table of the summary (the paper's Table 3 layout plus the paired change against T=1)."""
    lines = []
    if cfg is not None:
        lines += [
            f"GP regression, d={cfg.input_dim}, {cfg.n_train} train / {cfg.n_val} validation / {cfg.n_test} test "
            f"points, noise std {cfg.noise_std}, ℓ0={cfg.ell:.3g}, Gibbs α={cfg.ns_alpha}; CEM MLP D={cfg.dim}, "
            f"m={cfg.hidden_dim}, η={cfg.step_size}, precond={cfg.precond}; Adam lr {cfg.lr} (cosine), weight decay "
            f"{cfg.weight_decay}, {cfg.train_steps} steps, batch {cfg.batch_size or 'full'}"
            + (f", best validation checkpoint (every {cfg.eval_every} steps)." if cfg.n_val > 0 else ", last iterate."),
            "",
        ]
    lines += [
        "| kernel | T | params | FLOPs/example | test RMSE | test nRMSE | vs T=1 (paired) | train RMSE "
        "| GP oracle RMSE | wall s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for s in summary:
        if s["steps"] == 1:
            rel = "(ref)"
        elif "rel_t1_mean" in s:
            rel = f"{100 * s['rel_t1_mean']:+.1f}% ± {100 * s['rel_t1_std']:.1f}%"
        else:
            rel = "-"
        oracle = f"{s['gp_oracle_rmse_mean']:.4f}" if "gp_oracle_rmse_mean" in s else "-"
        lines.append(
            f"| {s['kernel']} | {s['steps']} | {s['params']:,} | {_fmt_flops(s['flops'])} "
            f"| {s['rmse_mean']:.4f} ± {s['rmse_std']:.4f} | {s['nrmse_mean']:.3f} ± {s['nrmse_std']:.3f} "
            f"| {rel} | {s['train_rmse_mean']:.4f} | {oracle} | {s['wall_s_mean']:.1f} |"
        )
    n = sorted({s["n_seeds"] for s in summary})
    lines += [
        "",
        f"Mean ± sample std over {'/'.join(map(str, n))} seeds. RMSE against the noisy test targets, in units of y; "
        "nRMSE = RMSE / std(y_test). 'vs T=1': paired relative change of RMSE on the same data and init. "
        "GP oracle: posterior mean with the true kernel and noise.",
    ]
    return "\n".join(lines)
