"""The experiments: each is a list of labelled runs at a scale, and the paper's findings checked on them.

A finding is *held* when the measured difference has the paper's sign and exceeds the seeds' noise
(one standard error of the difference), *not held* when it has the opposite sign beyond the noise, and
*inconclusive* otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from .scales import Scale
from .sweep import RunSpec, Variant


@dataclass
class Finding:
    claim: str
    verdict: str  # "held" | "not held" | "inconclusive"
    evidence: str


def _row(rows: list[dict], label: str) -> dict:
    for r in rows:
        if r["label"] == label:
            return r
    raise KeyError(label)


def _noise(a: dict, b: dict, key: str = "test_perplexity") -> float:
    """Standard error of the difference of two seed means."""
    return math.sqrt(a[key + "_std"] ** 2 / max(a["seeds"], 1) + b[key + "_std"] ** 2 / max(b["seeds"], 1))


def lower(rows, better: str, worse: str, claim: str, margin: float = 0.0) -> Finding:
    """Claim: `better` has a lower test perplexity than `worse` (by more than `margin`, relative)."""
    a, b = _row(rows, better), _row(rows, worse)
    diff = b["test_perplexity"] - a["test_perplexity"] - margin * b["test_perplexity"]
    noise = _noise(a, b)
    verdict = "held" if diff > noise else ("not held" if diff < -noise else "inconclusive")
    evidence = (
        f"{better}: {a['test_perplexity']:.3f} ± {a['test_perplexity_std']:.3f}; "
        f"{worse}: {b['test_perplexity']:.3f} ± {b['test_perplexity_std']:.3f}"
    )
    return Finding(claim, verdict, evidence)


def close(rows, a_label: str, b_label: str, claim: str, tolerance: float) -> Finding:
    """Claim: the two perplexities are within `tolerance` (relative) of each other."""
    a, b = _row(rows, a_label), _row(rows, b_label)
    rel = abs(a["test_perplexity"] - b["test_perplexity"]) / b["test_perplexity"]
    verdict = "held" if rel <= tolerance else "not held"
    evidence = (
        f"{a_label}: {a['test_perplexity']:.3f} ± {a['test_perplexity_std']:.3f}; {b_label}: "
        f"{b['test_perplexity']:.3f} ± {b['test_perplexity_std']:.3f} ({rel:.1%} apart, tolerance {tolerance:.0%})"
    )
    return Finding(claim, verdict, evidence)


@dataclass
class Experiment:
    id: str
    question: str
    variants: Callable[[Scale], list[Variant]]
    findings: Callable[[list[dict], Scale], list[Finding]]
    kind: str = "bars"  # how to plot: "sizes", "steps", "lr", "bars", "gains"


def _llama(size: str) -> Variant:
    return Variant(f"Llama {size}", RunSpec.make(size, "llama"), {"group": "Llama"})


# --- fig2a / fig2b: single-step CEM sublayers as drop-in replacements --------------------------------


def fig2a_variants(s: Scale) -> list[Variant]:
    out = []
    for size in s.sizes:
        out += [_llama(size), Variant(f"CEM attention {size}", RunSpec.make(size, "cem-attn"), {"group": "CEM attention"})]
    return out


def fig2a_findings(rows, s: Scale) -> list[Finding]:
    return [
        close(rows, f"CEM attention {size}", f"Llama {size}", f"{size}: CEM attention (T=1) is close to Llama with half the attention parameters", 0.05)
        for size in s.sizes
    ]


def fig2b_variants(s: Scale) -> list[Variant]:
    out = []
    for size in s.sizes:
        out += [
            _llama(size),
            Variant(f"CEM MLP {size}", RunSpec.make(size, "cem-mlp"), {"group": "CEM MLP"}),
            Variant(f"CEM MLP matched {size}", RunSpec.make(size, "cem-mlp-matched"), {"group": "CEM MLP, parameter-matched"}),
        ]
    return out


def fig2b_findings(rows, s: Scale) -> list[Finding]:
    out = []
    for size in s.sizes:
        out.append(lower(rows, f"Llama {size}", f"CEM MLP {size}", f"{size}: CEM MLP (T=1) is worse than the gated MLP"))
        out.append(lower(rows, f"CEM MLP matched {size}", f"CEM MLP {size}", f"{size}: parameter matching (1.5x width) helps the CEM MLP"))
    return out


# --- fig2c / fig2d: recursion and preconditioners ---------------------------------------------------


def _recursion_variants(s: Scale, arch: str, steps_key: str, precond_key: str, name: str) -> list[Variant]:
    out = [_llama(s.base)]
    for precond in ("diag", "diag_lowrank"):
        for steps in (1, 2):
            spec = RunSpec.make(s.base, arch, **{steps_key: steps, precond_key: precond})
            out.append(Variant(f"{name} T={steps} {precond}", spec, {"group": precond, "steps": steps}))
    return out


def _recursion_findings(rows, s: Scale, name: str) -> list[Finding]:
    out = [lower(rows, f"{name} T=2 {p}", f"{name} T=1 {p}", f"{name}: T=2 improves on T=1 ({p} preconditioner)") for p in ("diag", "diag_lowrank")]
    out.append(lower(rows, f"{name} T=2 diag_lowrank", f"{name} T=2 diag", f"{name}: at T=2 the diagonal-plus-low-rank preconditioner beats the diagonal one"))
    return out


def fig2c_findings(rows, s):
    return _recursion_findings(rows, s, "CEM attention") + [
        lower(rows, "CEM attention T=2 diag_lowrank", f"Llama {s.base}", "with T=2 and preconditioners, CEM attention beats Llama attention")
    ]


def fig2d_findings(rows, s):
    return _recursion_findings(rows, s, "CEM MLP") + [
        lower(rows, f"Llama {s.base}", "CEM MLP T=2 diag_lowrank", "CEM MLP still trails the gated MLP at T=2 (the gap narrows)")
    ]


# --- fig3a: learning rates ---------------------------------------------------------------------------


def fig3a_variants(s: Scale) -> list[Variant]:
    out = []
    for lr in s.lrs:
        out.append(Variant(f"Llama lr={lr:g}", RunSpec.make(s.base, "llama", train={"lr": lr}), {"group": "Llama", "lr": lr}))
        out.append(Variant(f"CEM lr={lr:g}", RunSpec.make(s.base, "cem-t2", train={"lr": lr}), {"group": "CEM (T=2, diag+low-rank)", "lr": lr}))
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


def fig3a_findings(rows, s) -> list[Finding]:
    opt = {}
    for group in ("Llama", "CEM (T=2, diag+low-rank)"):
        rs = sorted((r for r in rows if r["group"] == group), key=lambda r: r["lr"])
        opt[group] = akima_optimum([r["lr"] for r in rs], [r["test_perplexity"] for r in rs])
    (llr, lppl), (clr, cppl) = opt["Llama"], opt["CEM (T=2, diag+low-rank)"]
    ev = f"Akima optima: Llama lr {llr:.2e} ppl {lppl:.3f}; CEM lr {clr:.2e} ppl {cppl:.3f}"
    return [
        Finding("full CEM (T=2, preconditioners) matches or beats Llama at its best learning rate", "held" if cppl <= lppl * 1.01 else "not held", ev),
        Finding("full CEM prefers a higher learning rate than Llama", "held" if clr > llr * 1.05 else ("not held" if clr < llr / 1.05 else "inconclusive"), ev),
    ]


# --- fig3b: the key-query diagonal ---------------------------------------------------------------------


def fig3b_variants(s: Scale) -> list[Variant]:
    out = [_llama(s.base)]
    for diag in ("none", "shared", "per_head"):
        out.append(Variant(f"diagonal {diag}", RunSpec.make(s.base, "cem-attn", kq_diag=diag, attn_precond="diag"), {"group": diag}))
    return out


def fig3b_findings(rows, s):
    return [
        lower(rows, "diagonal shared", "diagonal none", "a key-query diagonal is needed (shared beats none)"),
        close(rows, "diagonal shared", "diagonal per_head", "a shared diagonal is about as good as per-head diagonals", 0.02),
    ]


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


def _gain(rows, one: str, two: str) -> float:
    return _row(rows, one)["test_perplexity"] - _row(rows, two)["test_perplexity"]


def _reuse_findings(rows, reuse: tuple[str, str], cems: list[tuple[str, str]], what: str) -> list[Finding]:
    g_reuse = _gain(rows, *reuse)
    out = []
    for one, two in cems:
        g = _gain(rows, one, two)
        out.append(lower(rows, two, one, f"{what}: within-layer recursion improves ({two} vs {one})"))
        noise = math.hypot(_noise(_row(rows, one), _row(rows, two)), _noise(_row(rows, reuse[0]), _row(rows, reuse[1])))
        verdict = "held" if g - g_reuse > noise else ("not held" if g - g_reuse < -noise else "inconclusive")
        out.append(Finding(
            f"{what}: recursion gains more than plain reuse ({two})",
            verdict,
            f"perplexity gain T=1→2: {g:.3f}; plain reuse x1→x2: {g_reuse:.3f}; noise (1 s.e. of the difference) {noise:.3f}",
        ))
    return out


def fig3c_findings(rows, s):
    return _reuse_findings(rows, ("Llama MLP x1", "Llama MLP x2"), [("CEM MLP T=1", "CEM MLP T=2"), ("CEM MLP matched T=1", "CEM MLP matched T=2")], "MLP")


def fig4_findings(rows, s):
    return _reuse_findings(rows, ("Llama attention x1", "Llama attention x2"), [("CEM attention T=1", "CEM attention T=2")], "attention")


# --- beyond the paper ------------------------------------------------------------------------------------


def positional_variants(s: Scale) -> list[Variant]:
    b = s.base
    return [
        Variant("Llama RoPE", RunSpec.make(b, "llama"), {"group": "Llama"}),
        Variant("Llama ALiBi", RunSpec.make(b, "llama-alibi"), {"group": "Llama"}),
        Variant("CEM attention (ALiBi)", RunSpec.make(b, "cem-attn"), {"group": "CEM"}),
    ]


def positional_findings(rows, s):
    return [
        close(rows, "Llama ALiBi", "Llama RoPE", "(ours) ALiBi costs little against RoPE in Llama attention", 0.02),
        close(rows, "CEM attention (ALiBi)", "Llama ALiBi", "(ours) with the same position encoding, CEM attention is close to Llama attention", 0.03),
    ]


def testtime_variants(s: Scale) -> list[Variant]:
    b = s.base
    return [
        Variant("full CEM trained T=1", RunSpec.make(b, "cem"), {"group": "trained T=1", "steps": 1}),
        Variant("full CEM trained T=2", RunSpec.make(b, "cem", attn_steps=2, mlp_steps=2), {"group": "trained T=2", "steps": 2}),
    ]


def energy_variants(s: Scale) -> list[Variant]:
    return testtime_variants(s)[1:]


EXPERIMENTS: dict[str, Experiment] = {
    e.id: e
    for e in [
        Experiment("fig2a", "CEM attention (T=1) vs Llama attention, per model size", fig2a_variants, fig2a_findings, "sizes"),
        Experiment("fig2b", "CEM MLP (T=1) vs gated MLP, dimension- and parameter-matched", fig2b_variants, fig2b_findings, "sizes"),
        Experiment("fig2c", "recursion and preconditioners in CEM attention", lambda s: _recursion_variants(s, "cem-attn", "attn_steps", "attn_precond", "CEM attention"), fig2c_findings, "steps"),
        Experiment("fig2d", "recursion and preconditioners in the CEM MLP", lambda s: _recursion_variants(s, "cem-mlp", "mlp_steps", "mlp_precond", "CEM MLP"), fig2d_findings, "steps"),
        Experiment("fig3a", "full CEM (T=2, diag+low-rank) vs Llama over learning rates", fig3a_variants, fig3a_findings, "lr"),
        Experiment("fig3b", "key-query diagonal: none / shared / per head", fig3b_variants, fig3b_findings, "bars"),
        Experiment("fig3c", "within-layer recursion vs plain layer reuse (MLP)", fig3c_variants, fig3c_findings, "gains"),
        Experiment("fig4", "within-layer recursion vs plain layer reuse (attention)", fig4_variants, fig4_findings, "gains"),
        Experiment("positional", "position encoding (RoPE, ALiBi) vs energy structure", positional_variants, positional_findings, "bars"),
        Experiment("test-time", "models trained with T=1 and T=2, evaluated at T=1..6", testtime_variants, lambda rows, s: [], "test-time"),
        Experiment("energy", "the energy of each layer at each recursion step on held-out text", energy_variants, lambda rows, s: [], "energy"),
    ]
}

ALL_IDS = (*EXPERIMENTS, "table3")
