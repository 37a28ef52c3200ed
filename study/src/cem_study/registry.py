"""The experiments as data: each entry names its training runs (variants of a size and architecture), the
analysis that turns their results into the paper's findings, and its plot.

How findings are judged is in `cem_study.findings`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from . import analysis, plots
from .costs import COMMITTED
from .findings import Context, Finding, close, gains_more, lower, not_worse, training_gap
from .products import Product
from .scales import SCALES, Scale
from .stats import Interval
from .sweep import RunSpec, Variant
from cem.model.config import SIZES


@dataclass
class Experiment:
    id: str
    question: str
    variants: Callable[[Scale], list[Variant]] | None  # None: no language-model runs (table3)
    analyze: Callable[[Context], tuple[list[Finding], dict]]  # findings and extra results for the summary
    plot: Callable[[dict, str, Path], None]  # (summary, title, png path)
    seeds: str = "default"  # "recursion": the scale's recursion seeds (5 at cpu and gpu scale)
    paper: bool = True  # False for ours (beyond the paper)
    # what the analysis reads from a variant's run at a seed beyond its results (`cem_study.products`),
    # computed by the sweep as soon as the run finishes
    products: Callable[[Scale, Variant, int], list[Product]] | None = None
    # whether the analysis reads its rows alone at a scale (then `planned` gives its findings before any run)
    rows_only: Callable[[Scale], bool] = lambda s: True


CLOSE = 0.02  # every "close" claim: within ±2% of perplexity (fixed before the runs; see docs/experiments.md)


def _spec(s: Scale, size: str, arch: str, **model) -> RunSpec:
    """A run of `arch` at `size`, trained at the size's learning rate (the Llama baseline's best on validation)."""
    return RunSpec.make(size, arch, train=s.train_for(size), **model)


def _rope(s: Scale, v: Variant, kind: str = "default") -> Variant:
    """`v` with the scale's `rope_seeds` added to its seeds (those of `kind`, or its own): the RoPE Llama, or a variant
    compared with it."""
    if not s.rope_seeds:
        return v
    return replace(v, seeds=tuple(dict.fromkeys((*(v.seeds or s.seeds_for(kind)), *s.rope_seeds))))


def _llama(s: Scale, size: str, group: str = "Llama", kind: str = "default") -> Variant:
    return _rope(s, Variant(f"Llama {size}", _spec(s, size, "llama"), {"group": group}), kind)


def _llama_alibi(s: Scale, size: str, slopes: str = "standard", **model) -> Variant:
    """The position-matched control: Llama attention with CEM attention's ALiBi (the same slopes)."""
    name = "App. A slopes" if slopes == "app-a" else "ALiBi"
    return Variant(f"Llama {name} {size}", _spec(s, size, "llama-alibi", alibi=slopes, **model), {"group": f"Llama, {name}"})


# --- learning rates: the Llama baseline's sweep at every size (cem_study.lr) ---------------------


def lr_variants(s: Scale) -> list[Variant]:
    """The sweep of each size's Llama, and (once its rate is chosen) that Llama at every seed: the regime check's."""
    sweep = [Variant(f"Llama {size} lr={lr:g}", RunSpec.make(size, "llama", train={"lr": lr}), {"group": size, "lr": lr}, s.sweep_seeds(size))
             for size in s.sizes for lr in s.grid(size, "llama")]
    chosen = dict(s.chosen_lrs)
    return sweep + [_rope(s, Variant(f"Llama {size} (chosen rate, every seed)", _spec(s, size, "llama"), {"group": f"{size}, every seed", "lr": chosen[size], "regime": True}))
                    for size in s.sizes if size in chosen]


def lr_products(s: Scale, v: Variant, seed: int) -> list[Product]:
    """The regime check reads context use of the Llama sweep's runs at each size's chosen rate."""
    chosen = dict(s.chosen_lrs).get(v.tags["group"])
    return [analysis.CONTEXT_USE] if s.findings and chosen is not None and v.tags["lr"] == chosen and not v.tags.get("regime") else []


def lr_findings(c: Context):
    """The rate each size's variants train at (chosen on mean validation loss when its sweep finished, and
    recorded: `cem_study.lr`), and the regime check: is each size's Llama above n-gram level
    (`analysis.regime_check`)? Where a sweep run was trained again since and the best rate now differs, the
    summary says so (`best_now`); the recorded choice stands, since every run of its size trained at it."""
    chosen = {}
    for size in c.scale.sizes:
        rows = [r for r in c.rows if r["group"] == size and not r.get("regime")]
        best = min(rows, key=lambda r: r["valid_loss"])
        pick = next((r for r in rows if r["lr"] == dict(c.scale.chosen_lrs).get(size)), best)
        edge = pick["lr"] in (min(r["lr"] for r in rows), max(r["lr"] for r in rows))
        chosen[size] = {"lr": pick["lr"], "valid_loss": pick["valid_loss"], "bracketed": not edge, "seeds": pick["seeds"]}
        if pick is not best:
            chosen[size]["best_now"] = {"lr": best["lr"], "valid_loss": best["valid_loss"]}
    if not c.scale.findings:  # a smoke run: no regime check (its n-grams would be fit on a toy corpus)
        return [], {"chosen": chosen}
    findings, regime = analysis.regime_check(c, chosen)
    return findings, {"chosen": chosen, **regime}


# --- fig2a / fig2b: single-step CEM sublayers as drop-in replacements --------------------------------


def fig2a_variants(s: Scale) -> list[Variant]:
    out = []
    for size in s.sizes:
        out += [_llama(s, size), _llama_alibi(s, size), _rope(s, Variant(f"CEM attention {size}", _spec(s, size, "cem-attn"), {"group": "CEM attention"}, own_rate=True))]
    return out


def fig2a_findings(c: Context):
    out = []
    for size in c.scale.sizes:
        out.append(close(c.rows, f"CEM attention {size}", f"Llama {size}", f"{size}: CEM attention (T=1) is close to Llama (RoPE) with half the attention parameters", CLOSE))
        out.append(close(c.rows, f"CEM attention {size}", f"Llama ALiBi {size}", f"{size}: CEM attention (T=1) is close to Llama with the same ALiBi (position-matched)", CLOSE, family="control"))
    return out, {}


def fig2b_variants(s: Scale) -> list[Variant]:
    b = s.base
    return [
        _llama(s, b),
        Variant(f"CEM MLP {b}", _spec(s, b, "cem-mlp"), {"group": "CEM MLP"}, own_rate=True),
        Variant(f"CEM MLP matched {b}", _spec(s, b, "cem-mlp-matched"), {"group": "CEM MLP, parameter-matched"}, own_rate=True),
    ]


def fig2b_findings(c: Context):
    b = c.scale.base
    return [
        lower(c.rows, f"Llama {b}", f"CEM MLP {b}", f"{b}: CEM MLP (T=1) is worse than the gated MLP"),
        lower(c.rows, f"CEM MLP matched {b}", f"CEM MLP {b}", f"{b}: parameter matching (1.5x width) helps the CEM MLP"),
    ], {}


# --- fig2c / fig2d: recursion (diag+low-rank preconditioner), with the step-length control ------------
# The paper's second preconditioner (diag) is not run at the cpu scale: preconditioner differences were
# below 0.6% at the micro scale and needed 30+ seeds (docs/experiments.md).

PRECOND = "diag_lowrank"


def _sublayer(kind: str) -> tuple[str, str, str, str]:
    """(architecture, steps key, preconditioner key, name) of the CEM attention or MLP experiments."""
    return ("cem-attn", "attn_steps", "attn_precond", "CEM attention") if kind == "attn" else ("cem-mlp", "mlp_steps", "mlp_precond", "CEM MLP")


def _recursion_variants(s: Scale, kind: str, exp_id: str) -> list[Variant]:
    arch, steps_key, precond_key, name = _sublayer(kind)
    b = s.base
    out = [_llama(s, b, kind="recursion"), *([_llama_alibi(s, b)] if kind == "attn" else [])]
    pair = s.pair_seeds_of(exp_id)  # the T=1/T=2 pair's own seeds, where it has more than the controls
    for steps in (1, 2):
        v = Variant(f"{name} T={steps}", _spec(s, b, arch, **{steps_key: steps, precond_key: PRECOND}), {"group": name, "steps": steps},
                    pair, own_rate=True, paired=True)
        out.append(_rope(s, v, "recursion") if steps == 2 else v)  # T=2 is compared with Llama
    for steps in (1, 2):  # the step-length controls: one learned gain multiplies every step (at T=1 the key is left at its default)
        out.append(Variant(f"{name} T={steps} learned step", _spec(s, b, arch, learn_step_size=True, **{precond_key: PRECOND}, **({steps_key: steps} if steps > 1 else {})),
                           {"group": f"{name}, learned step gain", "steps": steps}))
    return out


def _recursion_findings(c: Context, kind: str) -> list[Finding]:
    name = _sublayer(kind)[3]
    return [
        lower(c.rows, f"{name} T=2", f"{name} T=1", f"{name}: T=2 improves on T=1 (diag+low-rank preconditioner)"),
        lower(c.rows, f"{name} T=2", f"{name} T=1 learned step", f"{name}: T=2 improves on T=1 with a learned step gain (more steps, not a longer step)", family="control"),
        lower(c.rows, f"{name} T=2 learned step", f"{name} T=1 learned step",
              f"{name}: T=2 improves on T=1 with the step length learned at both (not a step too long or short at T=2)", family="control"),
    ]


def _recursion_gap(c: Context, kind: str) -> dict:
    """T=2's training loss minus T=1's through training (`training_gap`), at η = 1 and with the step gain learned at
    both: where recursion's difference comes from."""
    name = _sublayer(kind)[3]
    gaps = [g for x in ("", " learned step") if (g := training_gap(c, f"{name} T=2{x}", f"{name} T=1{x}"))]
    return {"training_gap": gaps} if gaps else {}


def fig2c_findings(c: Context):
    b = c.scale.base
    return _recursion_findings(c, "attn") + [
        lower(c.rows, "CEM attention T=2", f"Llama {b}", "with T=2 and preconditioners, CEM attention beats Llama attention (RoPE)"),
        lower(c.rows, "CEM attention T=2", f"Llama ALiBi {b}", "with T=2 and preconditioners, CEM attention beats Llama attention with the same ALiBi (position-matched)", family="control"),
    ], _recursion_gap(c, "attn")


def fig2d_findings(c: Context):
    return _recursion_findings(c, "mlp") + [
        lower(c.rows, f"Llama {c.scale.base}", "CEM MLP T=2", "CEM MLP still trails the gated MLP at T=2 (that the gap narrows with T is the T=2 vs T=1 finding)")
    ], _recursion_gap(c, "mlp")


# --- fig3a: learning rates ---------------------------------------------------------------------------

LR_GROUPS = ("Llama", "CEM (T=2, diag+low-rank)")


def fig3a_variants(s: Scale) -> list[Variant]:
    """Both curves over the rate grid at every seed; at a scale with the own-rate rule, Llama and full CEM at
    their validation-best rates (full CEM's from its seed-0 sweep) and the position-matched control."""
    b = s.base
    if s.own_rates:
        return [_llama(s, b), _rope(s, Variant("full CEM", _spec(s, b, "cem-t2"), {"group": LR_GROUPS[1]}, own_rate=True)),
                _llama_alibi(s, b)]
    out = [Variant(f"Llama lr={lr:g}", RunSpec.make(b, "llama", train={"lr": lr}), {"group": LR_GROUPS[0], "lr": lr}) for lr in s.grid(b, "llama")]
    out += [Variant(f"CEM lr={lr:g}", RunSpec.make(b, "cem-t2", train={"lr": lr}), {"group": LR_GROUPS[1], "lr": lr}) for lr in s.grid(b, "cem-t2")]
    if s.lr_sweep:  # the position-matched control at Llama's rate
        out.append(Variant("Llama ALiBi (Llama's rate)", _spec(s, b, "llama-alibi"), {"group": "Llama, ALiBi"}))
    return out


def akima_optimum(lrs: list[float], losses: list[float]) -> tuple[float, float]:
    """Learning rate and loss at the minimum of an Akima interpolant over log2(lr) (paper Fig. 3a)."""
    import numpy as np
    from scipy.interpolate import Akima1DInterpolator

    x = np.log2(np.asarray(lrs, dtype=float))
    order = np.argsort(x)
    x, y = x[order], np.asarray(losses, dtype=float)[order]
    grid = np.linspace(x[0], x[-1], 1001)
    curve = Akima1DInterpolator(x, y)(grid)
    i = int(np.nanargmin(curve))
    return float(2 ** grid[i]), float(curve[i])


def lr_optima(rows: list[dict]) -> dict[str, dict]:
    """Per group, all on the validation split: the best grid rate (lowest mean validation loss), the Akima
    optimum of the seed means, and the Akima optimum of each seed's own curve."""
    out = {}
    for group in LR_GROUPS:
        rs = sorted((r for r in rows if r["group"] == group), key=lambda r: r["lr"])
        lrs = [r["lr"] for r in rs]
        lr, loss = akima_optimum(lrs, [r["valid_loss"] for r in rs])
        seeds = [akima_optimum(lrs, [r["valid_loss_per_seed"][i] for r in rs]) for i in range(len(rs[0]["seeds"]))]
        best = min(rs, key=lambda r: r["valid_loss"])
        out[group] = {"lr": lr, "valid_loss": loss, "best_grid_lr": best["lr"], "best_label": best["label"],
                      "per_seed": [{"lr": a, "valid_loss": b} for a, b in seeds]}
    return out


def fig3a_findings(c: Context):
    b = c.scale.base
    if c.scale.own_rates:  # the two models at their rates (the rate rule says which), three seeds each
        return [not_worse(c.rows, "full CEM", f"Llama {b}", "full CEM (T=2, preconditioners) matches or beats Llama", 0.01),
                not_worse(c.rows, "full CEM", f"Llama ALiBi {b}", "full CEM matches or beats Llama with the same ALiBi (position-matched)", 0.01,
                          family="control")], {}
    opt = lr_optima(c.rows)
    llama, cem = opt[LR_GROUPS[0]], opt[LR_GROUPS[1]]
    ev = (f"validation-chosen rates: Llama {llama['best_grid_lr']:g} (Akima {llama['lr']:.2e}), "
          f"CEM {cem['best_grid_lr']:g} (Akima {cem['lr']:.2e}); test read once per run")
    out = [not_worse(c.rows, cem["best_label"], llama["best_label"], "full CEM (T=2, preconditioners) matches or beats Llama, each at its best learning rate", 0.01, ev)]
    dlr = Interval.of([math.log2(x["lr"] / y["lr"]) for x, y in zip(cem["per_seed"], llama["per_seed"])])
    out.append(Finding("full CEM prefers a higher learning rate than Llama", dlr.verdict(+1),
                       f"{ev}; paired difference of the per-seed validation optima, log2 lr (CEM - Llama): {dlr.text('+.2f')}",
                       dlr.to_dict(), p=dlr.p))
    if any(r["label"] == "Llama ALiBi (Llama's rate)" for r in c.rows):
        out.append(not_worse(c.rows, cem["best_label"], "Llama ALiBi (Llama's rate)", "full CEM matches or beats Llama with the same ALiBi (position-matched)", 0.01, ev, family="control"))
    return out, {"optima": opt}


# --- fig3b: the key-query diagonal ---------------------------------------------------------------------


def fig3b_variants(s: Scale) -> list[Variant]:
    b = s.base
    out = [_llama(s, b)]
    for diag in ("none", "shared", "per_head"):
        out.append(Variant(f"diagonal {diag}", _spec(s, b, "cem-attn", kq_diag=diag, attn_precond="diag"), {"group": diag}))
    return out


def fig3b_findings(c: Context):
    return [
        lower(c.rows, "diagonal shared", "diagonal none", "a key-query diagonal is needed (shared beats none)"),
        close(c.rows, "diagonal shared", "diagonal per_head", "a shared diagonal is about as good as per-head diagonals", CLOSE),
    ], {}


# --- fig3c (MLP) / fig4 (attention): recursion vs plain layer reuse, with the step-length control --------
# fig3c's parameter-matched pair is not run at the cpu scale (MLP differences below 0.6% at micro).


def fig3c_variants(s: Scale) -> list[Variant]:
    b, pair = s.base, s.pair_seeds_of("fig3c")  # the T=1/T=2 pair's own seeds, where it has more than the controls
    return [
        Variant("Llama MLP x1", _spec(s, b, "llama"), {"group": "plain reuse", "steps": 1}),
        Variant("Llama MLP x2", _spec(s, b, "llama", mlp_reuse=2), {"group": "plain reuse", "steps": 2}),
        Variant("CEM MLP T=1", _spec(s, b, "cem-mlp"), {"group": "CEM MLP", "steps": 1}, pair, paired=True),
        Variant("CEM MLP T=2", _spec(s, b, "cem-mlp", mlp_steps=2), {"group": "CEM MLP", "steps": 2}, pair, paired=True),
        Variant("CEM MLP T=1 learned step", _spec(s, b, "cem-mlp", learn_step_size=True), {"group": "CEM MLP, learned step gain", "steps": 1}),
        Variant("CEM MLP x2", _spec(s, b, "cem-mlp", mlp_reuse=2), {"group": "plain reuse, CEM MLP", "steps": 2, "one_pass": "CEM MLP T=1"}),
    ]


def fig4_variants(s: Scale) -> list[Variant]:
    b, pair = s.base, s.pair_seeds_of("fig4")
    return [
        _rope(s, Variant("Llama attention x1", _spec(s, b, "llama"), {"group": "plain reuse", "steps": 1}), "recursion"),
        _rope(s, Variant("Llama attention x2", _spec(s, b, "llama", attn_reuse=2), {"group": "plain reuse", "steps": 2}), "recursion"),
        Variant("Llama ALiBi attention x1", _spec(s, b, "llama-alibi"), {"group": "plain reuse, ALiBi", "steps": 1}),
        Variant("Llama ALiBi attention x2", _spec(s, b, "llama-alibi", attn_reuse=2), {"group": "plain reuse, ALiBi", "steps": 2}),
        Variant("CEM attention T=1", _spec(s, b, "cem-attn"), {"group": "CEM attention", "steps": 1}, pair, own_rate=True, paired=True),
        Variant("CEM attention T=2", _spec(s, b, "cem-attn", attn_steps=2), {"group": "CEM attention", "steps": 2}, pair, own_rate=True, paired=True),
        Variant("CEM attention T=1 learned step", _spec(s, b, "cem-attn", learn_step_size=True), {"group": "CEM attention, learned step gain", "steps": 1}),
        Variant("CEM attention x2", _spec(s, b, "cem-attn", attn_reuse=2), {"group": "plain reuse, CEM attention", "steps": 2,
                                                                              "one_pass": "CEM attention T=1"}),
    ]


def _recursion_improves(rows, one: str, two: str, what: str) -> Finding:
    return lower(rows, two, one, f"{what}: within-layer recursion improves ({two} vs {one})")


def _reuse_findings(rows, reuse: tuple[str, str], one: str, two: str, gain: str, twice: str, what: str) -> list[Finding]:
    """The paper's two claims and two controls: a longer step (`gain`), and the CEM sublayer itself applied twice
    (`twice`), whose second pass recomputes from the updated state what a second step of recursion re-reads
    from the layer's input (the keys ĥ_{1:i}, the MLP's gate W ĥ_i: §2.3 conditions every step on h)."""
    return [
        _recursion_improves(rows, one, two, what),
        gains_more(rows, reuse, (one, two), f"{what}: recursion gains more than plain reuse ({two})"),
        lower(rows, two, gain, f"{what}: T=2 beats T=1 with a learned step gain (more steps, not a longer step)", family="control"),
        gains_more(rows, (one, twice), (one, two),
                   f"{what}: recursion gains more than the same CEM sublayer applied twice (which recomputes from the "
                   "updated state what recursion re-reads from the layer's input)", family="control"),
    ]


def fig3c_findings(c: Context):
    return _reuse_findings(c.rows, ("Llama MLP x1", "Llama MLP x2"), "CEM MLP T=1", "CEM MLP T=2", "CEM MLP T=1 learned step", "CEM MLP x2", "MLP"), {}


def _alibi_reuse_finding(rows) -> Finding:
    return gains_more(rows, ("Llama ALiBi attention x1", "Llama ALiBi attention x2"), ("CEM attention T=1", "CEM attention T=2"),
                      "attention: recursion gains more than plain reuse of Llama attention with the same ALiBi (position-matched)", family="control")


def fig4_findings(c: Context):
    out = _reuse_findings(c.rows, ("Llama attention x1", "Llama attention x2"), "CEM attention T=1", "CEM attention T=2", "CEM attention T=1 learned step",
                          "CEM attention x2", "attention")
    return out + [_alibi_reuse_finding(c.rows)], {}


# fig4's position-matched quartet: CEM attention T=1 and T=2 against Llama-ALiBi x1 and x2 (plain reuse)
FIG4_ALIBI = ("Llama ALiBi attention x1", "Llama ALiBi attention x2", "CEM attention T=1", "CEM attention T=2")


def fig4_alibi_variants(s: Scale) -> list[Variant]:
    return [v for v in fig4_variants(s) if v.label in FIG4_ALIBI]


def fig4_alibi_findings(c: Context):
    """fig4's position-matched claims, after the regime check of its Llama (Llama-ALiBi x1) against the n-grams
    (`analysis.regime_finding`): recursion improves, and gains more than plain reuse of Llama-ALiBi."""
    out = [_recursion_improves(c.rows, "CEM attention T=1", "CEM attention T=2", "attention"), _alibi_reuse_finding(c.rows)]
    if not c.scale.findings:  # a smoke run: no regime check (its n-grams would be fit on a toy corpus)
        return out, {}
    label = FIG4_ALIBI[0]
    row, spec = next(r for r in c.rows if r["label"] == label), next(v.spec for v in c.variants if v.label == label)
    ngrams, tokens, window = analysis.regime_ngrams(c, c.scale.base, row, spec)
    finding, against = analysis.regime_finding(c.scale.base, "Llama-ALiBi", row, ngrams, tokens, window)
    return [finding, *out], {"regime": {c.scale.base: {"valid_loss": row["valid_loss"], "seeds": row["seeds"], "window": window,
                                                        "ngrams": ngrams, "against": against, "speaks": against["windowed"]["speaks"]}}}


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
                spec = _spec(s, s.base, arch, step_schedule=schedule, **{steps_key: steps, precond_key: "diag_lowrank"})
                out.append(Variant(f"{name} T={steps} {label}", spec, {"group": f"{name}, {label}", "sublayer": name, "schedule": schedule, "steps": steps}))
    return out


def step_size_findings(c: Context):
    out = []
    for name in ("CEM attention", "CEM MLP"):
        for schedule, label in SCHEDULES.items():
            one = f"{name} T=1 {SCHEDULES['constant' if schedule == 'inverse' else schedule]}"
            out.append(lower(c.rows, f"{name} T=2 {label}", one, f"{name}, {label}: T=2 improves on T=1", family="ours"))
        for steps in (2, 3):
            for schedule in ("inverse", "learned"):
                out.append(lower(c.rows, f"{name} T={steps} {SCHEDULES[schedule]}", f"{name} T={steps} η=1",
                                 f"(ours) {name} at T={steps}: {SCHEDULES[schedule]} beats η=1", family="ours"))
    return out, {}


# --- beyond the paper ------------------------------------------------------------------------------------


def positional_variants(s: Scale) -> list[Variant]:
    b = s.base
    return [
        Variant("Llama RoPE", _spec(s, b, "llama"), {"group": "Llama"}),
        Variant("Llama ALiBi", _spec(s, b, "llama-alibi"), {"group": "Llama"}),
        Variant("Llama ALiBi, App. A slopes", _spec(s, b, "llama-alibi", alibi="app-a"), {"group": "Llama"}),
        Variant("CEM attention (ALiBi)", _spec(s, b, "cem-attn"), {"group": "CEM"}),
        Variant("CEM attention (App. A slopes)", _spec(s, b, "cem-attn", alibi="app-a"), {"group": "CEM"}),
    ]


def positional_findings(c: Context):
    return [
        close(c.rows, "Llama ALiBi", "Llama RoPE", "(ours) ALiBi costs little against RoPE in Llama attention", CLOSE, family="ours"),
        close(c.rows, "CEM attention (ALiBi)", "Llama ALiBi", "(ours) with the same position encoding, CEM attention is close to Llama attention", CLOSE, family="ours"),
        close(c.rows, "CEM attention (App. A slopes)", "Llama ALiBi, App. A slopes", "(ours) with App. A's slopes in both, CEM attention is close to Llama attention", CLOSE, family="ours"),
        not_worse(c.rows, "CEM attention (App. A slopes)", "CEM attention (ALiBi)", "(ours) App. A's ALiBi slopes 2^(-k) do at least as well as the standard 2^(-8k/K) in CEM attention", CLOSE, family="ours"),
        not_worse(c.rows, "Llama ALiBi, App. A slopes", "Llama ALiBi", "(ours) App. A's ALiBi slopes do at least as well as the standard ones in Llama attention", CLOSE, family="ours"),
    ], {}


def readings_variants(s: Scale) -> list[Variant]:
    b = s.base
    return [
        Variant("full CEM, x0 = h", _spec(s, b, "cem"), {"group": "start point"}),
        Variant("full CEM, x0 = RMSNorm(h) (Alg. 1)", _spec(s, b, "cem", start="norm"), {"group": "start point"}),
    ]


def readings_findings(c: Context):
    return [
        not_worse(c.rows, "full CEM, x0 = RMSNorm(h) (Alg. 1)", "full CEM, x0 = h", "(ours) Algorithm 1 read literally (x0 = RMSNorm(h)) does at least as well as x0 = h", CLOSE, family="ours"),
    ], {}


# --- the size trend: the headline gaps at every size --------------------------------------------------------


def size_trend_variants(s: Scale) -> list[Variant]:
    out = []
    for size in s.sizes:
        out += [_llama(s, size), _llama_alibi(s, size),
                Variant(f"CEM attention {size}", _spec(s, size, "cem-attn"), {"group": "CEM attention"}),
                Variant(f"full CEM {size}", _spec(s, size, "cem-t2"), {"group": "full CEM (T=2, diag+low-rank)"})]
    return out


def size_trend_findings(c: Context):
    return analysis.size_trend(c, [("CEM attention", "Llama ALiBi", "CEM attention vs position-matched Llama attention"),
                          ("full CEM", "Llama", "full CEM (cem-t2) vs Llama")])


# the test-time recipes (cem.layers.steps): Huginn's heavy-tailed depth with truncated backpropagation, a
# fixed-point penalty, steps whose total length converges (geometric), all three, steps whose total length
# is the same at every T (η/T), and steps pulled back to their start (the anchor); each is trained with random depths
RANDOM_DEPTH = dict(attn_steps=3, mlp_steps=3, train_depth="model", train_depth_max=3)
HEAVY_DEPTH = dict(attn_steps=3, mlp_steps=3, train_depth="model", train_depth_dist="poisson-lognormal", train_depth_mean=3.0,
                   train_depth_max=8, backprop_steps=2)
FIXED_POINT = dict(fixed_point_weight=0.1)  # λ: not swept at this scale; at micro (validation, one seed) 1 and 10 did no better
GEOMETRIC = dict(step_schedule="geometric", step_decay=0.5)
INVERSE = dict(step_schedule="inverse")  # η_t = η / T: the same total step length at every T, finer steps as T grows
ANCHOR = dict(anchor_weight=1.0)  # λ η = 1: x^(t+1) = h + η d(u^(t)), the input re-injected at every step (no drift)


def testtime_variants(s: Scale) -> list[Variant]:
    """The test-time experiment's models at the base size (tags: `steps`, the T each is evaluated at by
    default; `mean_depth`, its mean training depth m, whose 2m the findings evaluate it at)."""
    b = s.base
    return [
        Variant("full CEM trained T=1", _spec(s, b, "cem"), {"group": "trained T=1", "steps": 1, "mean_depth": 1}),
        Variant("full CEM trained T=2", _spec(s, b, "cem", attn_steps=2, mlp_steps=2), {"group": "trained T=2", "steps": 2, "mean_depth": 2}),
        Variant("full CEM trained T~U{1..3}", _spec(s, b, "cem", **RANDOM_DEPTH), {"group": "random depth", "steps": 3, "mean_depth": 2}),
        Variant("Llama, plain reuse at test time", _spec(s, b, "llama"), {"group": "plain reuse", "steps": 1, "mean_depth": 1, "kind": "reuse"}),
        Variant("full CEM, T~PLN(3), backprop through 2", _spec(s, b, "cem", **HEAVY_DEPTH),
                {"group": "heavy-tailed depth", "steps": 3, "mean_depth": 3}),
        Variant("full CEM, T~U{1..3}, fixed-point penalty", _spec(s, b, "cem", **RANDOM_DEPTH, **FIXED_POINT),
                {"group": "fixed-point penalty", "steps": 3, "mean_depth": 2}),
        Variant("full CEM, T~U{1..3}, η_t = 2^-t", _spec(s, b, "cem", **RANDOM_DEPTH, **GEOMETRIC),
                {"group": "geometric steps", "steps": 3, "mean_depth": 2}),
        Variant("full CEM, T~PLN(3), backprop through 2, η_t = 2^-t, fixed-point penalty", _spec(s, b, "cem", **HEAVY_DEPTH, **GEOMETRIC, **FIXED_POINT),
                {"group": "all three", "steps": 3, "mean_depth": 3}),
        Variant("full CEM, T~U{1..3}, η_t = 1/T", _spec(s, b, "cem", **RANDOM_DEPTH, **INVERSE),
                {"group": "constant path length", "steps": 3, "mean_depth": 2}),
        Variant("full CEM, T~U{1..3}, anchored (λ = 1)", _spec(s, b, "cem", **RANDOM_DEPTH, **ANCHOR),
                {"group": "anchored steps", "steps": 3, "mean_depth": 2}),
        _deeper_llama(s, b),
    ]


def _deeper_llama(s: Scale, size: str) -> Variant:
    """A Llama with twice the layers of `size` at its width, on the size's budget (the Chinchilla tokens of the preset's
    Llama: cem.training.budget), evaluated as trained (tag `kind`: deeper)."""
    layers = SIZES[size]["n_layers"]
    return Variant(f"Llama with {2 * layers} layers", _spec(s, size, "llama", n_layers=2 * layers), {"group": "deeper Llama", "steps": 1, "kind": "deeper"})


# the third round's recipes (issue 64), each a setting of cem's config (`cem.layers.steps`, `cem.model.config`); fixed
# before the data: not swept (μ, the gate's start, the curriculum's stages as the sources give them)
# LoopUS: the loss at T_1 ~ U{1, 2} and T_2 = 3 of one batch, + μ·max(0, L(T_2) − L(T_1)); mean supervised depth 2.25
MONOTONE = dict(attn_steps=3, mlp_steps=3, train_depth="model", train_depth_max=3, supervise_depths=2, monotonicity_weight=1.0)
GATE = dict(step_gate=True)  # LoopUS: x ← x + g(u)·η d, g = σ(w·u + b) per position
CURRICULUM = dict(attn_steps=4, mlp_steps=4, train_depth="curriculum", train_depth_max=4, train_depth_curriculum=(1, 2, 4))  # T = 1, 2, 4 in thirds
MIDDLE = dict(recur_layers="middle")  # the first and last layer keep T = 1


def recipes_variants(s: Scale) -> list[Variant]:
    """The test-time recipes' models at the base size, against fixed T=2 (`recipes_at`)."""
    return recipes_at(s, s.base)


def recipes_at(s: Scale, b: str) -> list[Variant]:
    """The test-time recipes' models at size `b`, against fixed T=2 (tags as `testtime_variants`'; `baseline`: the model
    the chosen recipe is compared with). A curriculum's m is the depth of its last stage, the one its weights end at;
    middle-layer recursion needs a size of at least 3 layers (not the smoke scale's 2)."""
    heavy_full = {k: v for k, v in HEAVY_DEPTH.items() if k != "backprop_steps"}
    return [
        Variant("full CEM trained T=2", _spec(s, b, "cem", attn_steps=2, mlp_steps=2), {"group": "trained T=2", "steps": 2, "mean_depth": 2, "baseline": True}),
        Variant("full CEM, deep supervision at T=1..2 and 3, monotonicity μ=1", _spec(s, b, "cem", **MONOTONE),
                {"group": "monotonicity", "steps": 3, "mean_depth": 2}),
        Variant("full CEM, T~U{1..3}, gated steps", _spec(s, b, "cem", **RANDOM_DEPTH, **GATE), {"group": "gate", "steps": 3, "mean_depth": 2}),
        Variant("full CEM, deep supervision at T=1..2 and 3, monotonicity μ=1, gated steps", _spec(s, b, "cem", **MONOTONE, **GATE),
                {"group": "monotonicity + gate", "steps": 3, "mean_depth": 2}),
        Variant("full CEM, curriculum T=1→2→4", _spec(s, b, "cem", **CURRICULUM), {"group": "curriculum", "steps": 4, "mean_depth": 4}),
        Variant("full CEM, T~PLN(3), full backprop", _spec(s, b, "cem", **heavy_full), {"group": "heavy-tailed, full backprop", "steps": 3, "mean_depth": 3}),
    ] + ([Variant("full CEM, T~U{1..3} in the middle layers only", _spec(s, b, "cem", **RANDOM_DEPTH, **MIDDLE),
                  {"group": "middle layers", "steps": 3, "mean_depth": 2})] if SIZES[b]["n_layers"] >= 3 else [])  # a middle needs 3 blocks


# where the confirmation reads the screening's choice (`recipes_study`): its committed summary at the screen64 scale
SCREENING = COMMITTED / "screen64" / "recipes" / "summary.json"
SCREENING_SCALE = "screen64"


class RecipesNotChosen(ValueError):
    """The confirmation asked for the recipes the screening chose before the screening had a choice over all its seeds."""


class RecipesNotAtSize(ValueError):
    """A recipe the screening chose that a size of the scale cannot build (middle-layer recursion needs 3 layers): the
    confirmation has no runs at that scale."""


def screening_choice() -> list[str]:
    """The labels of the two recipes the screening chose to confirm (its summary's `choice["confirm"]`, at SCREENING),
    RecipesNotChosen before it has that choice over every recursion seed of the screen64 scale."""
    seeds = list(SCALES[SCREENING_SCALE].seeds_for("recursion"))
    not_yet = lambda what: RecipesNotChosen(f"the screening's recipes are not chosen yet: {SCREENING} {what}")  # noqa: E731
    if not SCREENING.exists():
        raise not_yet(f"does not exist (the recipes experiment at the {SCREENING_SCALE} scale writes it)")
    summary = json.loads(SCREENING.read_text())
    if summary.get("seeds") != seeds:
        raise not_yet(f"was analysed on seeds {summary.get('seeds')}, not on all of {seeds}")
    if summary.get("awaits"):
        raise not_yet(f"is an earlier analysis: the screening awaits {summary['awaits']}")
    confirm = (summary.get("choice") or {}).get("confirm") or []
    if len(confirm) != 2:
        raise not_yet(f"has no two recipes in choice['confirm'] (it has {confirm})")
    return confirm


def recipes_confirm_variants(s: Scale) -> list[Variant]:
    """At each size of the scale: fixed T=2, the screening's two recipes (`screening_choice`; tag `recipe`: the rank in
    its choice) and a Llama with twice the layers (`_deeper_llama`), each built as its screening built it (`recipes_at`),
    its label ending in the size."""
    chosen = screening_choice()
    out = []
    for size in s.sizes:
        models = {v.label: v for v in recipes_at(s, size)}
        if lacking := [label for label in chosen if label not in models]:
            raise RecipesNotAtSize(f"the screening's recipes {lacking} are not recipes at size {size} (it has {list(models)})")
        baseline = next(v for v in models.values() if v.tags.get("baseline"))
        recipes = [replace(models[label], tags={**models[label].tags, "recipe": rank}) for rank, label in enumerate(chosen)]
        out += [replace(v, label=f"{v.label} {size}") for v in (baseline, *recipes, _deeper_llama(s, size))]
    return out


# --- the rate rules: which rate each variant of an experiment trains at ------------------------------------

RATE_RULES = {
    "paper": "every variant at its size's Llama rate, chosen on validation loss (the paper's rule, App. C)",
    "own": "each CEM variant of a headline comparison at its own validation-best rate (a seed-0 sweep from half to twice "
           "its size's Llama rate, grown until bracketed; ties within the scale's tolerance go to the lower rate), the "
           "Llamas and the controls at the Llama rate as under the paper's rule",
}


def own_template(spec: RunSpec) -> RunSpec:
    """A variant's own-rate sweep: its run without rate and seed."""
    return RunSpec(spec.size, spec.arch, spec.model, tuple((k, v) for k, v in spec.train if k != "lr"))


def variants_under(exp: "Experiment", s: Scale, rule: str) -> list[Variant]:
    """The experiment's variants under a rate rule (`RATE_RULES`): under "own", each `own_rate` variant at the
    rate its own sweep chose (`LearningRateNotChosen` before that sweep has finished)."""
    from .lr import at_rate, sweep_key

    if rule not in RATE_RULES:
        raise ValueError(f"unknown rate rule {rule!r}; expected one of {', '.join(RATE_RULES)}")
    variants = exp.variants(s) if exp.variants else []
    if rule == "paper":
        return variants
    return [replace(v, spec=at_rate(own_template(v.spec), s.own_lr(sweep_key(own_template(v.spec))))) if v.own_rate else v for v in variants]


def own_templates(exp: "Experiment", s: Scale) -> list[RunSpec]:
    """The own-rate sweeps an experiment needs at a scale with the own rule (none at the others)."""
    if not s.own_rates or exp.variants is None:
        return []
    return list(dict.fromkeys(own_template(v.spec) for v in exp.variants(s) if v.own_rate))


def planned(exp: Experiment, s: Scale) -> list[Finding] | None:
    """The findings an experiment judges at a scale, fixed before its runs (the Holm families): its analysis on rows
    with no seed, each finding unmeasured (no difference, no p-value). None where the analysis reads more than its
    rows (n-grams, trained weights, rate curves): such an experiment's findings are known once it is analysed."""
    if exp.variants is None or not exp.rows_only(s):
        return None
    variants = exp.variants(s)
    rows = [{"label": v.label, "arch": v.spec.arch, **v.tags, "seeds": [], "test_loss_per_seed": [], "test_perplexity": math.nan}
            for v in variants]
    return exp.analyze(Context(s, rows, variants, Path("/nonexistent"), Path("/nonexistent")))[0]


EXPERIMENTS: dict[str, Experiment] = {
    e.id: e
    for e in [
        Experiment("lr", "the learning rate of each size: the Llama baseline swept, chosen on validation loss (the paper's rule)", lr_variants, lr_findings, plots.plot_lr_sweep,
                   products=lr_products, rows_only=lambda s: False),
        Experiment("fig2a", "CEM attention (T=1) vs Llama attention, per model size", fig2a_variants, fig2a_findings, plots.plot_sizes),
        Experiment("fig2b", "CEM MLP (T=1) vs gated MLP, dimension- and parameter-matched", fig2b_variants, fig2b_findings, plots.plot_sizes),
        Experiment("fig2c", "recursion and preconditioners in CEM attention", lambda s: _recursion_variants(s, "attn", "fig2c"), fig2c_findings, plots.plot_steps, "recursion"),
        Experiment("fig2d", "recursion and preconditioners in the CEM MLP", lambda s: _recursion_variants(s, "mlp", "fig2d"), fig2d_findings, plots.plot_steps, "recursion"),
        Experiment("fig3a", "full CEM (T=2, diag+low-rank) vs Llama over learning rates", fig3a_variants, fig3a_findings, plots.plot_lr,
                   rows_only=lambda s: s.own_rates),  # elsewhere it reads both rate curves
        Experiment("fig3b", "key-query diagonal: none / shared / per head", fig3b_variants, fig3b_findings, plots.plot_points),
        Experiment("fig3c", "within-layer recursion vs plain layer reuse (MLP)", fig3c_variants, fig3c_findings, plots.plot_gains, "recursion"),
        Experiment("fig4", "within-layer recursion vs plain layer reuse (attention)", fig4_variants, fig4_findings, plots.plot_gains, "recursion"),
        Experiment("fig4-alibi", "fig4's position-matched quartet: CEM attention T=1, T=2 vs Llama-ALiBi x1, x2, after its Llama's regime check",
                   fig4_alibi_variants, fig4_alibi_findings, plots.plot_gains, "recursion", rows_only=lambda s: not s.findings),
        Experiment("step-size", "step size η at T = 1, 2, 3: constant 1, 1/T, or learned per step (diag+low-rank P)", step_size_variants, step_size_findings, plots.plot_step_sizes, "recursion", paper=False),
        Experiment("positional", "position encoding (RoPE, ALiBi with both slope sets) vs energy structure", positional_variants, positional_findings, plots.plot_points, paper=False),
        Experiment("readings", "the paper's ambiguous start point x0 (its other ambiguity, the ALiBi slopes, is read in positional)", readings_variants, readings_findings, plots.plot_points, paper=False),
        Experiment("test-time", "perplexity against test-time compute: full CEM trained at T=1, T=2, random depth and with the test-time recipes, evaluated at more T (fixed, and with exit rules against the per-token oracle), against Llama with plain reuse and a Llama twice as deep", testtime_variants, analysis.test_time_study, plots.plot_test_time, "recursion", paper=False,
                   products=analysis.test_time_products, rows_only=lambda s: False),
        Experiment("recipes", "the third round of test-time recipes: recursion trained to keep improving past its trained depth (monotonicity with deep supervision, gated steps, both, a depth curriculum, middle-layer recursion, heavy-tailed depth with full backprop) against fixed T=2", recipes_variants, analysis.recipes_study, plots.plot_recipes, "recursion", paper=False,
                   products=analysis.recipes_products, rows_only=lambda s: False),
        Experiment("recipes-confirm", "the two test-time recipes the screening chose, confirmed at each size against fixed T=2 and a Llama with twice the layers at the same token budget (FLOP-matched at the test-time depth)", recipes_confirm_variants, analysis.recipes_confirm_study, plots.plot_recipes_confirm, "recursion", paper=False,
                   products=analysis.recipes_products, rows_only=lambda s: False),
        Experiment("energy", "the energy of each layer at each recursion step on held-out text", lambda s: testtime_variants(s)[1:2], analysis.energy_study, plots.plot_energy, paper=False,
                   products=lambda s, v, seed: [analysis.ENERGY] if seed == s.seeds[0] else [], rows_only=lambda s: False),
        Experiment("size-trend", "the headline gaps at every size, and their trend in log(parameters)", size_trend_variants, size_trend_findings, plots.plot_size_trend, paper=False, rows_only=lambda s: False),
        Experiment("table3", "recursion on synthetic Gaussian-process regression (10 input dims)", None, analysis.gp_study, plots.plot_table3),
    ]
}

ALL_IDS = tuple(EXPERIMENTS)
# the order `all` runs them: the recursion findings first, so a suite cut short has the most important ones
SUITE_ORDER = ("lr", "fig2c", "fig2d", "fig4", "fig4-alibi", "fig3c", "step-size", "test-time", "energy", "recipes", "recipes-confirm", "fig2a", "fig2b", "fig3b", "positional", "readings", "fig3a", "size-trend", "table3")
assert sorted(SUITE_ORDER) == sorted(ALL_IDS)
