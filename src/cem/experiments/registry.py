"""The experiments as data: each entry names its training runs (variants of a size and architecture), the
analysis that turns their results into the paper's findings, and its plot.

How findings are judged is in `cem.experiments.findings`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import analysis, plots
from .findings import Context, Finding, close, gains_more, lower
from .scales import Scale
from .stats import Interval
from .sweep import RunSpec, Variant


@dataclass
class Experiment:
    id: str
    question: str
    variants: Callable[[Scale], list[Variant]] | None  # None: no language-model runs (table3)
    analyze: Callable[[Context], tuple[list[Finding], dict]]  # findings and extra results for the summary
    plot: Callable[[dict, str, Path], None]  # (summary, title, png path)
    seeds: str = "default"  # "recursion": the scale's recursion seeds (5 at cpu and gpu scale)
    paper: bool = True  # False for ours (beyond the paper)


def _llama(size: str, group: str = "Llama") -> Variant:
    return Variant(f"Llama {size}", RunSpec.make(size, "llama"), {"group": group})


# --- fig2a / fig2b: single-step CEM sublayers as drop-in replacements --------------------------------


def fig2a_variants(s: Scale) -> list[Variant]:
    out = []
    for size in s.sizes:
        out += [_llama(size), Variant(f"CEM attention {size}", RunSpec.make(size, "cem-attn"), {"group": "CEM attention"})]
    return out


def fig2a_findings(c: Context):
    return [
        close(c.rows, f"CEM attention {size}", f"Llama {size}", f"{size}: CEM attention (T=1) is close to Llama (within 5%) with half the attention parameters", 0.05)
        for size in c.scale.sizes
    ], {}


def fig2b_variants(s: Scale) -> list[Variant]:
    out = []
    for size in s.sizes:
        out += [
            _llama(size),
            Variant(f"CEM MLP {size}", RunSpec.make(size, "cem-mlp"), {"group": "CEM MLP"}),
            Variant(f"CEM MLP matched {size}", RunSpec.make(size, "cem-mlp-matched"), {"group": "CEM MLP, parameter-matched"}),
        ]
    return out


def fig2b_findings(c: Context):
    out = []
    for size in c.scale.sizes:
        out.append(lower(c.rows, f"Llama {size}", f"CEM MLP {size}", f"{size}: CEM MLP (T=1) is worse than the gated MLP"))
        out.append(lower(c.rows, f"CEM MLP matched {size}", f"CEM MLP {size}", f"{size}: parameter matching (1.5x width) helps the CEM MLP"))
    return out, {}


# --- fig2c / fig2d: recursion and preconditioners ---------------------------------------------------

PRECONDS = ("diag", "diag_lowrank")


def _sublayer(kind: str) -> tuple[str, str, str, str]:
    """(architecture, steps key, preconditioner key, name) of the CEM attention or MLP experiments."""
    return ("cem-attn", "attn_steps", "attn_precond", "CEM attention") if kind == "attn" else ("cem-mlp", "mlp_steps", "mlp_precond", "CEM MLP")


def _recursion_variants(s: Scale, kind: str) -> list[Variant]:
    arch, steps_key, precond_key, name = _sublayer(kind)
    out = [_llama(s.base)]
    for precond in PRECONDS:
        for steps in (1, 2):
            spec = RunSpec.make(s.base, arch, **{steps_key: steps, precond_key: precond})
            out.append(Variant(f"{name} T={steps} {precond}", spec, {"group": precond, "steps": steps}))
    return out


def _recursion_findings(c: Context, kind: str) -> list[Finding]:
    name = _sublayer(kind)[3]
    out = [lower(c.rows, f"{name} T=2 {p}", f"{name} T=1 {p}", f"{name}: T=2 improves on T=1 ({p} preconditioner)") for p in PRECONDS]
    out.append(lower(c.rows, f"{name} T=2 diag_lowrank", f"{name} T=2 diag", f"{name}: at T=2 the diagonal-plus-low-rank preconditioner beats the diagonal one"))
    return out


def fig2c_findings(c: Context):
    return _recursion_findings(c, "attn") + [
        lower(c.rows, "CEM attention T=2 diag_lowrank", f"Llama {c.scale.base}", "with T=2 and preconditioners, CEM attention beats Llama attention")
    ], {}


def fig2d_findings(c: Context):
    return _recursion_findings(c, "mlp") + [
        lower(c.rows, f"Llama {c.scale.base}", "CEM MLP T=2 diag_lowrank", "CEM MLP still trails the gated MLP at T=2 (the gap narrows)")
    ], {}


# --- fig3a: learning rates ---------------------------------------------------------------------------

LR_GROUPS = ("Llama", "CEM (T=2, diag+low-rank)")


def fig3a_variants(s: Scale) -> list[Variant]:
    out = []
    for lr in s.lrs:
        out.append(Variant(f"Llama lr={lr:g}", RunSpec.make(s.base, "llama", train={"lr": lr}), {"group": LR_GROUPS[0], "lr": lr}))
        out.append(Variant(f"CEM lr={lr:g}", RunSpec.make(s.base, "cem-t2", train={"lr": lr}), {"group": LR_GROUPS[1], "lr": lr}))
    return out


def akima_optimum(lrs: list[float], ppls: list[float]) -> tuple[float, float]:
    """Learning rate and perplexity at the minimum of an Akima interpolant over log2(lr) (paper Fig. 3a)."""
    import numpy as np
    from scipy.interpolate import Akima1DInterpolator

    x = np.log2(np.asarray(lrs, dtype=float))
    order = np.argsort(x)
    x, y = x[order], np.asarray(ppls, dtype=float)[order]
    grid = np.linspace(x[0], x[-1], 1001)
    curve = Akima1DInterpolator(x, y)(grid)
    i = int(np.nanargmin(curve))
    return float(2 ** grid[i]), float(curve[i])


def lr_optima(rows: list[dict]) -> dict[str, dict]:
    """Per group: the Akima optimum of the seed means, and the optimum of each seed's own curve."""
    out = {}
    for group in LR_GROUPS:
        rs = sorted((r for r in rows if r["group"] == group), key=lambda r: r["lr"])
        lrs = [r["lr"] for r in rs]
        lr, ppl = akima_optimum(lrs, [r["test_perplexity"] for r in rs])
        seeds = [akima_optimum(lrs, [r["test_perplexity_per_seed"][i] for r in rs]) for i in range(len(rs[0]["seeds"]))]
        out[group] = {"lr": lr, "test_perplexity": ppl, "per_seed": [{"lr": a, "test_perplexity": b} for a, b in seeds]}
    return out


def fig3a_findings(c: Context):
    opt = lr_optima(c.rows)
    llama, cem = opt[LR_GROUPS[0]]["per_seed"], opt[LR_GROUPS[1]]["per_seed"]
    # matches or beats: CEM's best perplexity at most 1% above Llama's (a one-sided non-inferiority margin)
    rel = Interval.of([(x["test_perplexity"] - y["test_perplexity"]) / y["test_perplexity"] for x, y in zip(cem, llama)])
    hi = rel.hi if rel.n > 1 else rel.mean
    lo = rel.lo if rel.n > 1 else rel.mean
    matches = "held" if hi < 0.01 else ("not held" if lo > 0.01 else "inconclusive")
    dlr = Interval.of([math.log2(x["lr"] / y["lr"]) for x, y in zip(cem, llama)])
    ev = (
        f"Akima optima of the seed means: Llama lr {opt[LR_GROUPS[0]]['lr']:.2e} ppl {opt[LR_GROUPS[0]]['test_perplexity']:.3f}; "
        f"CEM lr {opt[LR_GROUPS[1]]['lr']:.2e} ppl {opt[LR_GROUPS[1]]['test_perplexity']:.3f}"
    )
    return [
        Finding("full CEM (T=2, preconditioners) matches or beats Llama at its best learning rate (within +1%)", matches,
                f"{ev}; relative paired difference of the per-seed optima {rel.text('+.2%')}, margin +1%", rel.to_dict()),
        Finding("full CEM prefers a higher learning rate than Llama", dlr.verdict(+1),
                f"{ev}; paired difference of the per-seed optimal log2 lr (CEM - Llama) {dlr.text('+.2f')}", dlr.to_dict()),
    ], {"optima": opt}


# --- fig3b: the key-query diagonal ---------------------------------------------------------------------


def fig3b_variants(s: Scale) -> list[Variant]:
    out = [_llama(s.base)]
    for diag in ("none", "shared", "per_head"):
        out.append(Variant(f"diagonal {diag}", RunSpec.make(s.base, "cem-attn", kq_diag=diag, attn_precond="diag"), {"group": diag}))
    return out


def fig3b_findings(c: Context):
    return [
        lower(c.rows, "diagonal shared", "diagonal none", "a key-query diagonal is needed (shared beats none)"),
        close(c.rows, "diagonal shared", "diagonal per_head", "a shared diagonal is about as good as per-head diagonals (within 2%)", 0.02),
    ], {}


# --- fig3c (MLP) / fig4 (attention): recursion vs plain layer reuse ------------------------------------


def fig3c_variants(s: Scale) -> list[Variant]:
    b = s.base
    return [
        Variant("Llama MLP x1", RunSpec.make(b, "llama"), {"group": "plain reuse", "steps": 1}),
        Variant("Llama MLP x2", RunSpec.make(b, "llama", mlp_reuse=2), {"group": "plain reuse", "steps": 2}),
        Variant("CEM MLP T=1", RunSpec.make(b, "cem-mlp"), {"group": "CEM MLP", "steps": 1}),
        Variant("CEM MLP T=2", RunSpec.make(b, "cem-mlp", mlp_steps=2), {"group": "CEM MLP", "steps": 2}),
        Variant("CEM MLP matched T=1", RunSpec.make(b, "cem-mlp-matched"), {"group": "CEM MLP, parameter-matched", "steps": 1}),
        Variant("CEM MLP matched T=2", RunSpec.make(b, "cem-mlp-matched", mlp_steps=2), {"group": "CEM MLP, parameter-matched", "steps": 2}),
    ]


def fig4_variants(s: Scale) -> list[Variant]:
    b = s.base
    return [
        Variant("Llama attention x1", RunSpec.make(b, "llama"), {"group": "plain reuse", "steps": 1}),
        Variant("Llama attention x2", RunSpec.make(b, "llama", attn_reuse=2), {"group": "plain reuse", "steps": 2}),
        Variant("CEM attention T=1", RunSpec.make(b, "cem-attn"), {"group": "CEM attention", "steps": 1}),
        Variant("CEM attention T=2", RunSpec.make(b, "cem-attn", attn_steps=2), {"group": "CEM attention", "steps": 2}),
    ]


def _reuse_findings(rows, reuse: tuple[str, str], cems: list[tuple[str, str]], what: str) -> list[Finding]:
    out = []
    for one, two in cems:
        out.append(lower(rows, two, one, f"{what}: within-layer recursion improves ({two} vs {one})"))
        out.append(gains_more(rows, reuse, (one, two), f"{what}: recursion gains more than plain reuse ({two})"))
    return out


def fig3c_findings(c: Context):
    pairs = [("CEM MLP T=1", "CEM MLP T=2"), ("CEM MLP matched T=1", "CEM MLP matched T=2")]
    return _reuse_findings(c.rows, ("Llama MLP x1", "Llama MLP x2"), pairs, "MLP"), {}


def fig4_findings(c: Context):
    return _reuse_findings(c.rows, ("Llama attention x1", "Llama attention x2"), [("CEM attention T=1", "CEM attention T=2")], "attention"), {}


# --- step sizes: η = 1, 1/T or learned per step, at T = 1, 2, 3 (the paper fixes η = 1 only for T = 1) ----

SCHEDULES = {"constant": "η=1", "inverse": "η=1/T", "learned": "η learned"}


def step_size_variants(s: Scale) -> list[Variant]:
    out = []
    for kind in ("attn", "mlp"):
        arch, steps_key, precond_key, name = _sublayer(kind)
        for schedule, label in SCHEDULES.items():
            for steps in (1, 2, 3):
                if steps == 1 and schedule == "inverse":
                    continue  # η / 1 = η: the constant run
                spec = RunSpec.make(s.base, arch, step_schedule=schedule, **{steps_key: steps, precond_key: "diag_lowrank"})
                out.append(Variant(f"{name} T={steps} {label}", spec, {"group": f"{name}, {label}", "sublayer": name, "schedule": schedule, "steps": steps}))
    return out


def step_size_findings(c: Context):
    out = []
    for name in ("CEM attention", "CEM MLP"):
        for schedule, label in SCHEDULES.items():
            one = f"{name} T=1 {SCHEDULES['constant' if schedule == 'inverse' else schedule]}"
            out.append(lower(c.rows, f"{name} T=2 {label}", one, f"{name}, {label}: T=2 improves on T=1"))
        for steps in (2, 3):
            for schedule in ("inverse", "learned"):
                out.append(lower(c.rows, f"{name} T={steps} {SCHEDULES[schedule]}", f"{name} T={steps} η=1",
                                 f"(ours) {name} at T={steps}: {SCHEDULES[schedule]} beats η=1"))
    return out, {}


# --- beyond the paper ------------------------------------------------------------------------------------


def positional_variants(s: Scale) -> list[Variant]:
    b = s.base
    return [
        Variant("Llama RoPE", RunSpec.make(b, "llama"), {"group": "Llama"}),
        Variant("Llama ALiBi", RunSpec.make(b, "llama-alibi"), {"group": "Llama"}),
        Variant("CEM attention (ALiBi)", RunSpec.make(b, "cem-attn"), {"group": "CEM"}),
    ]


def positional_findings(c: Context):
    return [
        close(c.rows, "Llama ALiBi", "Llama RoPE", "(ours) ALiBi costs little against RoPE in Llama attention (within 2%)", 0.02),
        close(c.rows, "CEM attention (ALiBi)", "Llama ALiBi", "(ours) with the same position encoding, CEM attention is close to Llama attention (within 3%)", 0.03),
    ], {}


def readings_variants(s: Scale) -> list[Variant]:
    b = s.base
    return [
        Variant("CEM attention, slopes 2^(-8k/K)", RunSpec.make(b, "cem-attn"), {"group": "ALiBi slopes"}),
        Variant("CEM attention, slopes 2^(-k) (App. A)", RunSpec.make(b, "cem-attn", alibi="app-a"), {"group": "ALiBi slopes"}),
        Variant("full CEM, x0 = h", RunSpec.make(b, "cem"), {"group": "start point"}),
        Variant("full CEM, x0 = RMSNorm(h) (Alg. 1)", RunSpec.make(b, "cem", start="norm"), {"group": "start point"}),
    ]


def readings_findings(c: Context):
    return [
        close(c.rows, "CEM attention, slopes 2^(-k) (App. A)", "CEM attention, slopes 2^(-8k/K)", "(ours) App. A's ALiBi slopes 2^(-k) do as well as the standard 2^(-8k/K) (within 2%)", 0.02),
        close(c.rows, "full CEM, x0 = RMSNorm(h) (Alg. 1)", "full CEM, x0 = h", "(ours) Algorithm 1 read literally (x0 = RMSNorm(h)) does as well as x0 = h (within 2%)", 0.02),
    ], {}


def testtime_variants(s: Scale) -> list[Variant]:
    b = s.base
    return [
        Variant("full CEM trained T=1", RunSpec.make(b, "cem"), {"group": "trained T=1", "steps": 1}),
        Variant("full CEM trained T=2", RunSpec.make(b, "cem", attn_steps=2, mlp_steps=2), {"group": "trained T=2", "steps": 2}),
        Variant(
            "full CEM trained T~U{1..3}",
            RunSpec.make(b, "cem", attn_steps=3, mlp_steps=3, train_depth="model", train_depth_max=3),
            {"group": "random depth", "steps": 3},
        ),
        Variant("Llama, plain reuse at test time", RunSpec.make(b, "llama"), {"group": "plain reuse", "steps": 1, "kind": "reuse"}),
    ]


EXPERIMENTS: dict[str, Experiment] = {
    e.id: e
    for e in [
        Experiment("fig2a", "CEM attention (T=1) vs Llama attention, per model size", fig2a_variants, fig2a_findings, plots.plot_sizes),
        Experiment("fig2b", "CEM MLP (T=1) vs gated MLP, dimension- and parameter-matched", fig2b_variants, fig2b_findings, plots.plot_sizes),
        Experiment("fig2c", "recursion and preconditioners in CEM attention", lambda s: _recursion_variants(s, "attn"), fig2c_findings, plots.plot_steps, "recursion"),
        Experiment("fig2d", "recursion and preconditioners in the CEM MLP", lambda s: _recursion_variants(s, "mlp"), fig2d_findings, plots.plot_steps, "recursion"),
        Experiment("fig3a", "full CEM (T=2, diag+low-rank) vs Llama over learning rates", fig3a_variants, fig3a_findings, plots.plot_lr),
        Experiment("fig3b", "key-query diagonal: none / shared / per head", fig3b_variants, fig3b_findings, plots.plot_points),
        Experiment("fig3c", "within-layer recursion vs plain layer reuse (MLP)", fig3c_variants, fig3c_findings, plots.plot_gains, "recursion"),
        Experiment("fig4", "within-layer recursion vs plain layer reuse (attention)", fig4_variants, fig4_findings, plots.plot_gains, "recursion"),
        Experiment("step-size", "step size η at T = 1, 2, 3: constant 1, 1/T, or learned per step (diag+low-rank P)", step_size_variants, step_size_findings, plots.plot_step_sizes, "recursion", paper=False),
        Experiment("positional", "position encoding (RoPE, ALiBi) vs energy structure", positional_variants, positional_findings, plots.plot_points, paper=False),
        Experiment("readings", "the paper's two ambiguous readings: ALiBi slopes and the start point x0", readings_variants, readings_findings, plots.plot_points, paper=False),
        Experiment("test-time", "perplexity against test-time compute: full CEM trained at T=1, T=2 and random depth, evaluated at T=1..8 (fixed and adaptive), against Llama with plain reuse", testtime_variants, analysis.test_time_study, plots.plot_test_time, "recursion", paper=False),
        Experiment("energy", "the energy of each layer at each recursion step on held-out text", lambda s: testtime_variants(s)[1:2], analysis.energy_study, plots.plot_energy, paper=False),
        Experiment("table3", "recursion on synthetic Gaussian-process regression (10 input dims)", None, analysis.gp_study, plots.plot_table3),
    ]
}

ALL_IDS = tuple(EXPERIMENTS)
# the order `all` runs them: the recursion findings first, so a suite cut short has the most important ones
SUITE_ORDER = ("fig2c", "fig2d", "fig4", "fig3c", "step-size", "test-time", "energy", "fig2a", "fig2b", "fig3b", "positional", "readings", "fig3a", "table3")
assert sorted(SUITE_ORDER) == sorted(ALL_IDS)
