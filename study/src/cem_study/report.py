"""`cem-study report RESULTS_DIR`: one Markdown report of every experiment found there: an opening paragraph
that says which of the paper's findings hold at this scale, then every finding with its seed-paired
difference and 95% confidence interval, the tables and the plots.

A report of runs short of the Chinchilla budget is refused unless asked for, and then says so on its first
line. A scale that never speaks (`smoke`: a few steps per run) gives a pipeline check: written without being
asked, so labelled, its differences printed without verdicts, p-values or power (`pipeline_scale`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from cem.io import read_json
from .analysis import GUARD_STUDIED
from .findings import FAMILIES, KINDS, TWICE, Finding, adjust
from .records import Run, runs_in
from .registry import EXPERIMENTS, LR_GROUPS, RATE_RULES, SUITE_ORDER, own_templates, planned
from .scales import Scale

MARK = {"held": "✅ held", "not held": "❌ not held", "inconclusive": "➖ inconclusive"}


class ShortOfBudget(ValueError):
    """The results were not trained to the paper's budget (a report would mislead)."""


class StaleSummary(ValueError):
    """A summary waits for an own-rate sweep that lr/choices.json records as decided: analysed before the sweep landed."""


def _check_fresh(root: Path, summaries: list[dict]) -> None:
    """Refuse summaries written before a sweep they wait for was decided (their report would call it waiting)."""
    record = root / "lr" / "choices.json"
    decided = read_json(record) if record.exists() else {}
    for s in summaries:
        what = (s.get("pending") or {}).get("own") or ""
        if done := [key for key in decided if f"{key} (" in what]:  # the pending text names each sweep as "KEY (N runs to train)"
            raise StaleSummary(f"{root / s['experiment'] / 'summary.json'} waits for the own-rate sweep of {', '.join(done)}, which "
                               f"{record} records as decided: analyse {s['experiment']} again (`cem experiment {s['experiment']} "
                               "--analyse-only`) before writing the report")


def _table(s: dict) -> list[str]:
    if s["experiment"] == "table3":
        out = ["| kernel | T | RMSE | normalised RMSE | params | FLOPs/example |", "|---|---|---|---|---|---|"]
        for r in s.get("gp_rows", []):
            out.append(f"| {r['kernel']} | {r['steps']} | {r['rmse_mean']:.4f} ± {r['rmse_std']:.4f} | {r['nrmse_mean']:.4f} ± {r['nrmse_std']:.4f} | {r['params']:,} | {r['flops']:,} |")
        return out
    out = ["| variant | parameters | attention | MLP | test perplexity (mean ± std over seeds) | bits per byte | tokens (per Llama parameter) |", "|---|---|---|---|---|---|---|"]
    for r in s["rows"]:
        out.append(
            f"| {r['label']} | {r['parameters'] / 1e6:.3f}M | {r['attention_parameters'] / 1e6:.3f}M | {r['mlp_parameters'] / 1e6:.3f}M | "
            f"{_spread(r, 'test_perplexity', '.3f')} | {_spread(r, 'test_bits_per_byte', '.4f')} | "
            f"{r['tokens']:,} ({r['tokens_per_llama_parameter']:.1f}) |"
        )
    return out


def _spread(row: dict, key: str, fmt: str) -> str:
    """A row's metric as `mean ± std` over its seeds, or `value (seed s)` when one seed ran (no spread to give)."""
    seeds = row.get("seeds", [])
    if len(seeds) == 1:
        return f"{row[key]:{fmt}} (seed {seeds[0]})"
    return f"{row[key]:{fmt}} ± {row[key + '_std']:{fmt}}"


def _ci(d: dict, fmt: str = "+.3f") -> str:
    """An interval (an `Interval.to_dict()`) as `mean [lo, hi]`."""
    return f"{d['mean']:{fmt}} [{d['lo']:{fmt}}, {d['hi']:{fmt}}]"


def _answer(answer: dict) -> list[str]:
    """The test-time question in plain words: which CEM models are better at twice their mean trained depth
    m than at m, and how each there compares with the FLOP-matched deeper Llama (paired 95% intervals)."""
    def listing(group: dict, verdict: str) -> str:
        at = lambda e: f"T={e['m']} → {e['2m']}" if "m" in e else f"at T={e['2m']}"  # noqa: E731
        items = [f"{label} ({at(e)}: {_ci(e['difference'])})"
                 for label, e in group.items() if e["verdict"] == verdict]
        return "; ".join(items) or "none"

    twice, deeper = answer.get("twice", {}), answer.get("deeper", {})
    lines = ["", f"**In plain words:** of {len(twice)} CEM model{'' if len(twice) == 1 else 's'}, these have a lower test loss at twice their mean trained depth "
             f"than at it (loss at m minus at 2m, nats, 95% interval): {listing(twice, 'held')}. Higher there: "
             f"{listing(twice, 'not held')}. Not told apart: {listing(twice, 'inconclusive')}."]
    if deeper:
        than = next(iter(deeper.values()))["than"]
        lines[-1] += (f" Against {than} (the Llama of the same budget with twice the layers, loss of it minus the model's at 2m): "
                      f"better {listing(deeper, 'held')}; worse {listing(deeper, 'not held')}; "
                      f"not told apart {listing(deeper, 'inconclusive')}.")
    return lines


def _choice(choice: dict) -> list[str]:
    """The recipes' choice on validation (`analysis.recipes_study`): their ranking at 2m, the two to confirm, the first
    at its validation-best T."""
    ranked = "; ".join(f"{i}. {r['label']} ({r['valid_loss_at_2m']:.4f})" for i, r in enumerate(choice["ranked_on_valid_at_2m"], 1))
    lines = ["", f"**Chosen on validation** (mean validation loss at twice the mean trained depth, nats): {ranked or 'none evaluable'}. "
             f"To confirm at the larger sizes: {', '.join(choice['confirm']) or 'none'}."]
    if best := choice.get("best"):
        lines[-1] += (f" The first at its validation-best T={best['T']} against {best['against']} on test "
                      f"({best['against']} minus it, nats): {_ci(best['difference'], '+.4f')}.")
    return lines


def _curves(s: dict) -> list[str]:
    curves = s["curves"]
    first = next(iter(curves.values()))
    lines = ["", "| trained | " + " | ".join(f"T={r['eval_steps']}" for r in first) + " |", "|---" * (1 + len(first)) + "|"]
    for label, rows in curves.items():
        lines.append(f"| {label} | " + " | ".join(f"{r['test_perplexity']:.3f} ({r['flops_per_token'] / 1e6:.2f} MFLOP)" for r in rows) + " |")
    lines += ["", "Cells: mean test perplexity over seeds (forward FLOPs per token at that T). The Llama row applies each "
              "sublayer T times (plain reuse)."]
    if s.get("adaptive"):
        gains = any("gain_over_fixed" in r for rows in s["adaptive"].values() for r in rows)
        lines += ["", "| adaptive evaluation (at most T steps) | T | average steps per CEM layer | MFLOP per token | test perplexity |"
                  + (" gain over fixed T at equal FLOPs (nats, 95% CI) | loss above the oracle (nats) | rank correlation of its steps with the oracle's best T |" if gains else ""),
                  "|---|---|---|---|---|" + ("---|---|---|" if gains else "")]
        for label, rows in s["adaptive"].items():
            for r in rows:
                extra = ""
                if "gain_over_fixed" in r:
                    g = r["gain_over_fixed"]
                    extra = f" {_ci(g, '+.4f')} | {r['regret']:.4f} | {'n/a' if r['oracle_rank_correlation'] is None else format(r['oracle_rank_correlation'], '+.3f')} |"
                lines.append(f"| {label} | {r['eval_steps']} | {r['steps_used']:.2f} | {r['flops_per_token'] / 1e6:.2f} | {r['test_perplexity']:.3f} |{extra}")
    if s.get("oracle"):
        lines += ["", "| model | oracle: lowest loss per token over the evaluated T (nats) | its mean best T | best fixed T's loss (nats) |", "|---|---|---|---|"]
        lines += [f"| {label} | {o['test_loss']:.4f} | {o['mean_best_steps']:.2f} | {o['fixed_best_loss']:.4f} |" for label, o in s["oracle"].items()]
        lines += ["", "The oracle reads each token's target to pick its T: a bound no causal exit rule reaches, which says how much "
                  "a per-position depth could gain at most."]
    if s.get("extra_steps"):
        lines += _extra_steps(s["extra_steps"])
    if s.get("against_random_depth"):
        lines += _against_random_depth(s["against_random_depth"])
    if s.get("drift"):
        lines += _drift(s["drift"])
    return lines


def _against_random_depth(table: dict) -> list[str]:
    """What each recipe (and each fixed-depth model) changes against plain random depth, at its m and 2m."""
    plain = next(iter(table.values()))["than"]
    cell = lambda d: f"T={d['T']}: {_ci(d)}" if d else "not evaluated"  # noqa: E731
    lines = ["", "| model | at its mean trained depth m | at 2m |", "|---|---|---|"]
    lines += [f"| {label} | {cell(e.get('m'))} | {cell(e.get('2m'))} |" for label, e in table.items()]
    return lines + ["", f"Cells: the test loss of {plain} minus the model's at the same T (nats, mean over paired seeds with its 95% "
                    "interval); positive: the model is better there than plain random depth. A table, not findings."]


def _drift(drift: dict) -> list[str]:
    """How far the CEM layers' outputs move from their inputs as T grows: one row per model."""
    steps = next(iter(drift.values()))["steps"]
    lines = ["", "| model | " + " | ".join(f"T={t}" for t in steps) + " | along x, last doubling |", "|---|" + "---|" * (len(steps) + 1)]
    for label, d in drift.items():
        lines.append(f"| {label} | " + " | ".join(f"{a:.2f} ({b:+.2f})" for a, b in zip(d["drift"], d["cos_h"])) + f" | {d['radial'][-1]:+.2f} |")
    return lines + ["", "Cells: ‖x^(T) − h‖ / ‖h‖, how far a CEM layer's output has moved from its input h after T steps, with "
                    "cos(x^(T), h) in brackets; the median layer, mean over seeds, on the first 4 test windows. Last column: "
                    f"cos(x^({steps[-1]}) − x^({steps[-2]}), x^({steps[-2]})), 1 when the later steps only lengthen x. Without "
                    "an anchor the recursion has no fixed point in x: once norm(x) settles, every step adds the same vector "
                    "along x, so x moves away from h linearly in T (docs/design.md)."]


def _extra_steps(extra: dict) -> list[str]:
    """Where a model's steps beyond its trained depth cost: one row per model, one column per part of it."""
    parts = list(next(iter(extra.values()))["cost"])
    lines = ["", "| model | m → 2m | loss at m (nats) | " + " | ".join(p.replace("layer blocks.", "only ") for p in parts) + " |",
             "|---|---|---|" + "---|" * len(parts)]
    for label, e in extra.items():
        lines.append(f"| {label} | {e['base']} → {e['more']} | {e['loss']:.4f} | " + " | ".join(_ci(e["cost"][p]) for p in parts) + " |")
    lines += ["", "Where the steps past the trained depth cost: the test loss (nats, on a quarter of the batches above) when "
              "the named CEM layers run 2m steps and the others m, minus the loss with all at m (m: the mean trained depth, "
              "rounded); mean over seeds with its 95% interval. `only 0.mlp`: the first block's MLP alone."]
    lines += ["", "| model | energy-guarded steps at m: loss increase (nats) | at 2m | 2m finer steps, the path length of m |", "|---|---|---|---|"]
    lines += [f"| {label} | " + " | ".join(_ci(e["knobs"][k]) for k in ("guarded at m", "guarded at 2m", "finer at 2m")) + " |" for label, e in extra.items()]
    return lines + ["", "Energy-guarded steps make every step descend its layer's energy (a step that raises it is halved, up to "
                    f"{GUARD_STUDIED} times); the loss with them minus the loss of the plain steps at m, as above. Positive at m: the "
                    "trained model relies on steps that do not descend the energy. Last column: 2m steps with η scaled so that their "
                    "path length Σ_t η_t is that of m steps (η/2 under a constant η, unchanged under η/T): the same path in finer "
                    "steps, closer to the energy's gradient flow, minus the loss at m."]


def _short_runs(summaries: list[dict]) -> list[str]:
    out = []
    for s in summaries:
        if not s["scale"].get("findings", True):
            out.append(f"{s['experiment']}: the {s['scale']['name']} scale (a few steps per run)")
        out += [f"{s['experiment']}: {label}" for label in s.get("short_runs", [])]
    return out


def pipeline_scale(summaries: list[dict]) -> str | None:
    """The name of the scale when these results are of one that never speaks (`Scale.findings` False: smoke), else None."""
    return next((s["scale"]["name"] for s in summaries if not s["scale"].get("findings", True)), None)


def pipeline_check(f: dict) -> str:
    """A finding as a pipeline check: its claim and its difference, no verdict, p-value or power."""
    return f"{f['claim']}: {_diff(f)}" if f.get("difference") else f["claim"]


def _scale(sc: dict) -> Scale | None:
    """The `Scale` a summary was analysed at, from its record (None for a record older than the current fields)."""
    try:
        return Scale(**{k: v for k, v in sc.items() if k in Scale.__dataclass_fields__})
    except TypeError:
        return None


def _suite(sc: dict, summaries: list[dict]) -> list[str]:
    """The experiments of the scale's suite (all of them where it names none); for summaries written before scales
    recorded their suite, the experiments analysed."""
    return (sc["suite"] or list(SUITE_ORDER)) if "suite" in sc else [s["experiment"] for s in summaries]


def _family_sizes(summaries: list[dict], sc: dict) -> tuple[dict[str, int], list[str]]:
    """Each Holm family's size, fixed before the data: the directional findings of every experiment of the scale's
    suite, as its summary has them (the paper's rule judges every claim of an analysed experiment; one measured on a
    single seed has no p-value and is left out) or, not analysed yet, as the registry plans them (`registry.planned`);
    and the experiments not analysed whose findings are known only once they are (not counted yet)."""
    analysed = {s["experiment"]: s["findings"] for s in summaries}
    scale = _scale(sc)
    sizes, uncounted = dict.fromkeys(FAMILIES, 0), []
    for i in _suite(sc, summaries):
        found = analysed.get(i)
        if found is None:
            plan = planned(EXPERIMENTS[i], scale) if scale else None
            if plan is None:
                uncounted.append(i)
                continue
            found = [f.to_dict() for f in plan]
        for f in found:  # a finding measured on one seed by design (context use) has no p-value to correct
            if kind(f) == "directional" and (f.get("difference") or {}).get("n") != 1:
                sizes[f.get("family", "paper")] += 1
    return sizes, uncounted


def _borrow_own(summaries: list[dict]) -> None:
    """Under the second rate rule, an analysed experiment with no CEM variant at an own rate (fig3b) is judged on its
    paper-rule runs (its paper findings copied, in place), so that both rules judge the same family of claims."""
    for s in summaries:
        if "own" not in (s["scale"].get("rate_rules") or ()) or s.get("rules", {}).get("own") or (s.get("pending") or {}).get("own"):
            continue
        if paper := [dict(f) for f in s["findings"] if f.get("family", "paper") == "paper"]:
            s.setdefault("rules", {})["own"] = {"rule": RATE_RULES["own"], "rows": s["rows"], "findings": paper, "no_own_rate": True}


def _adjust(summaries: list[dict], sizes: dict[str, int]) -> None:
    """Holm-Bonferroni over each family of directional findings across every experiment (in place), each family of
    the size `sizes` gives (`_family_sizes`), under each rate rule on its own: the paper's rule's findings, and those
    judged again at the CEM variants' own rates (the paper's family alone, of the same size)."""
    for findings, family_sizes in (([f for s in summaries for f in s["findings"]], sizes),
                                   ([f for s in summaries for f in _own(s).values()], {"paper": sizes["paper"]})):
        found = [(f, Finding(**{k: v for k, v in f.items() if k in Finding.__dataclass_fields__})) for f in findings]
        adjust([g for _, g in found], family_sizes)
        for f, g in found:
            f["p_adjusted"], f["verdict_adjusted"] = g.p_adjusted, g.verdict_adjusted


def _verdicts(f: dict) -> str:
    """The raw verdict, and the Holm-adjusted one where the finding is in a family."""
    if f.get("verdict_adjusted") is None:
        return MARK[f["verdict"]]
    return f"{MARK[f['verdict']]} (Holm: {f['verdict_adjusted']}, p_adj = {f['p_adjusted']:.2g})"


def _regime(summaries: list[dict]) -> dict[str, dict]:
    """The regime check of each size (`analysis.regime_check`), from the learning-rate summary; empty without one."""
    lr = next((x for x in summaries if x["experiment"] == "lr" and x.get("regime")), None)
    return lr["regime"] if lr else {}


def regime_sizes(summaries: list[dict]) -> dict[str, bool]:
    """Per size, whether it speaks: its Llama baseline (at the chosen rate, every seed) beats the best n-gram
    (`analysis.regime_against`) on validation with the 95% interval over its seeds wholly below zero. One seed has
    no interval, so a size with one seed does not speak. Empty without a regime check."""
    return {size: r["speaks"] for size, r in _regime(summaries).items()}


def regime_label(size: str, r: dict) -> str:
    """What the regime check says of a size, in words: which n-gram orders beat its Llama under each scoring."""
    from .analysis import orders_beating

    w, u = r["against"]["windowed"], r["against"]["unbroken"]
    return (f"{size}: {orders_beating(w['beating'], 'its Llama')} in the transformer's {r['window']}-token windows, "
            f"{orders_beating(u['beating'], 'it')} on the unbroken text: "
            + ("it speaks" if r["speaks"] else "it does not speak (at n-gram level)"))


def _regime_opening(summaries: list[dict]) -> list[str]:
    """The report's first lines where there is a regime check: the rule, and per size which orders beat its Llama."""
    regime = _regime(summaries)
    if not regime:
        return []
    orders = sorted({g["order"] for r in regime.values() for g in r["ngrams"]})
    speak = [z for z, r in regime.items() if r["speaks"]]
    return [f"**Which sizes speak (the regime check):** a size's findings are evidence about the paper only when its Llama "
            f"baseline beats the best of the {orders[0]}- to {orders[-1]}-gram models (modified Kneser-Ney, fit on its training "
            "tokens) on validation, scored as the transformer is (its disjoint windows), with the 95% interval over all its "
            "seeds below zero. " + "; ".join(regime_label(z, r) for z, r in regime.items()) + "."
            + ("" if speak else " **No size speaks: every verdict below is a pipeline check, not evidence about the paper.**"), ""]


def below_regime(f: dict, summary: dict, passing: dict[str, bool]) -> bool:
    """A finding about a size that does not speak: the sizes its claim names, else the scale's base. Not the
    regime findings themselves, and not an experiment without language models (table3)."""
    if not passing or f["claim"].startswith("(regime)") or not summary.get("rows"):
        return False
    sizes = [z for z in summary["scale"]["sizes"] if z in f["claim"]] or [summary["scale"]["base"]]
    return not all(passing.get(z, False) for z in sizes)


def kind(f: dict) -> str:
    """A finding's test (`KINDS`): directional (a sign), equivalence ("close"), non-inferiority ("matches or beats") or a
    count (the energy study); read from summaries written before findings named it, too."""
    if f.get("kind"):
        return f["kind"]
    if f.get("p") is not None:
        return "directional"
    margin = next((k for k in ("non-inferiority", "equivalence") if f"{k} margin" in f.get("evidence", "")), None)
    return margin or "count"


def _counts(fs: list[dict]) -> str:
    """Verdict counts per kind of test (directional with its Holm counts; equivalence; non-inferiority)."""
    parts = []
    for k in KINDS:
        group = [f for f in fs if kind(f) == k]
        if not group:
            continue
        text = f"{k} {len(group)}: " + ", ".join(f"{sum(f['verdict'] == v for f in group)} {v}" for v in MARK)
        holm = [f for f in group if f.get("verdict_adjusted") is not None]
        if holm:
            text += " (Holm: " + ", ".join(f"{sum(f['verdict_adjusted'] == v for f in holm)} {v}" for v in MARK) + ")"
        parts.append(text)
    return "; ".join(parts) or "none"


def _own(summary: dict) -> dict[str, dict]:
    """The findings of an experiment judged again with each CEM variant at its own best rate, by claim."""
    return {f["claim"]: f for f in summary.get("rules", {}).get("own", {}).get("findings", [])}


def _same_runs(summary: dict) -> bool:
    """Whether the second rate rule trains every variant of an experiment at its paper's-rule rate and seeds."""
    key = lambda rows: {r["label"]: (r.get("lr"), tuple(r.get("seeds", ()))) for r in rows}  # noqa: E731
    own = summary.get("rules", {}).get("own")
    return bool(own) and key(own["rows"]) == key(summary["rows"])


def _own_cell(summary: dict, finding: dict) -> str:
    """A finding's verdict under the second rate rule, or why it has none: a control or our own check stays at
    Llama's rate under both rules, what the rule still waits for (a sweep, or the runs at the rates it chose), or an
    experiment the rule does not cover."""
    if g := _own(summary).get(finding["claim"]):
        same = " (the same runs: no variant here has an own rate)" if summary["rules"]["own"].get("no_own_rate") else " (the same runs: every own rate is Llama's)"
        return f"{_verdicts(g)}: {_diff(g)}" + (same if _same_runs(summary) else "")
    if (family := finding.get("family", "paper")) != "paper":
        return f"— ({'a control' if family == 'control' else 'ours'}: at Llama's rate under both rules)"
    if pending := (summary.get("pending") or {}).get("own"):
        return f"waiting for {pending}"
    return "— (no CEM variant of a headline comparison)"


def _opening(summaries: list[dict], short: bool = False) -> list[str]:
    """What the results say about the paper, in plain words with numbers: at the sizes that speak (`regime_sizes`)
    first, each kind of test counted on its own, under the paper's rate rule and, where run, with each CEM variant
    at its own best rate; the findings at sizes that do not speak are pipeline checks, counted apart; then ours."""
    passing = regime_sizes(summaries)
    found = [(s, f) for s in summaries for f in s["findings"] if not f["claim"].startswith("(regime)")]
    speaking = [(s, f) for s, f in found if not below_regime(f, s, passing) and s.get("rows")]
    pipeline = [(s, f) for s, f in found if below_regime(f, s, passing)]
    other = [(s, f) for s, f in found if not s.get("rows")]  # not a language model (Table 3): no regime to pass
    paper = [(s, f) for s, f in speaking if s.get("paper", True) and f.get("family", "paper") == "paper"]
    ours = [(s, f) for s, f in speaking if f.get("family", "paper") != "paper" or not s.get("paper", True)]

    def listing(fs, verdict):
        items = [f"{f['claim']} ({s['experiment']}{'; ' + _diff(f) if f.get('difference') else ''})" for s, f in fs if f["verdict"] == verdict]
        return "; ".join(items) if items else "none"

    scale = summaries[0]["scale"]["name"]
    speak = [z for z, ok in passing.items() if ok]
    lines = []
    where = f" at {', '.join(speak)}" if speak and speak != [scale] else ""  # a scale of one size is named by it
    lines += [
        f"**In plain words:** at the `{scale}` scale{where}, {'with runs short of' if short else 'with every run at'} the paper's budget, "
        f"the paper's findings checked: {_counts([f for _, f in paper])}. Held: the 95% interval of the seed-paired difference "
        "excludes zero with the paper's sign (directional), lies inside the margin (equivalence), or below it (non-inferiority); "
        "not held: the other side; inconclusive: neither.",
        "",
    ]
    lines += [f"- **{verdict.capitalize()}:** {listing(paper, verdict)}." for verdict in MARK]

    def group(heading: str, fs: list) -> list[str]:
        """A heading with its counts, then the findings by verdict."""
        return ["", f"{heading} {_counts([f for _, f in fs])}."] + [f"- **{v.capitalize()}:** {listing(fs, v)}." for v in MARK] if fs else []

    own = [(s, _own(s)[f["claim"]]) for s, f in paper if f["claim"] in _own(s)]
    lines += group("**With each CEM variant at its own best rate** (the second rate rule: a seed-0 sweep on validation loss; the Llamas at theirs):", own)
    lines += group(f"**Controls and ours (beyond the paper){where}, the regime checks apart (they decide which sizes speak, above):**", ours)
    lines += group(f"**Not language models** ({', '.join(dict.fromkeys(s['experiment'] for s, _ in other))}: the regime check does not apply):", other)
    if pipeline:
        lines += ["", f"**Pipeline checks** (findings at sizes that do not speak: they show the pipeline runs, not what the paper "
                      f"claims; {len(pipeline)} findings, listed in their own table below): {_counts([f for _, f in pipeline])}."]
    return lines


def _pair_seeds(summaries: list[dict]) -> dict:
    """The seeds of each recursion pair that trains more than the other variants (`cem_study.seeds`), from
    the summaries that decided them."""
    return {s["experiment"]: p["first"] + p["more"] for s in summaries if (p := s.get("pair_seeds")) and p["more"]}


def _rates(summaries: list[dict], record: dict | None = None) -> list[str]:
    """The rate each size trains at (its Llama baseline's best on validation, the paper's rule) and, once fig3a
    is analysed, full CEM's own best rate at the base size beside it: how far from its optimum full CEM trains
    there (the only CEM variant swept)."""
    sc = summaries[0]["scale"]
    chosen = dict(sc.get("chosen_lrs") or [])
    if not chosen:
        return []
    line = ("**Learning rates:** every run of a size trains at its Llama baseline's best rate on validation (the paper's rule): "
            + ", ".join(f"{size} {lr:g}" for size, lr in chosen.items()) + ".")
    own = {k: lr for s in summaries for k, lr in s["scale"].get("own_lrs") or []}  # each experiment records the sweeps it ran
    own = own if "own" in (sc.get("rate_rules") or ()) else {}  # a scale under the paper's rule alone sweeps no other variant
    if own:
        line += (f" Under the second rule each CEM variant of a headline comparison also trains at its own best rate, chosen by a "
                 f"seed-0 sweep on validation loss from half to twice Llama's rate (grown until bracketed; rates within "
                 f"{sc.get('lr_tie', 0):g} nats of the best tie, and the lowest of them is chosen): "
                 + ", ".join(f"{k} {lr:g}" for k, lr in own.items()) + ".")
    for key, entry in (record or {}).items():  # a decision made again (`cem_study.lr`): what it replaced, and why
        if old := entry.get("superseded"):
            line += f" {key}'s rate was decided again ({entry['lr']:g}; it had been {old['lr']:g}, {old.get('why', 'replaced')})."
    fig3a = next((s for s in summaries if s["experiment"] == "fig3a" and "optima" in s), None)
    base, rate = sc["base"], chosen.get(sc["base"])
    if fig3a and rate is not None:
        best = fig3a["optima"][LR_GROUPS[1]]
        rows = {r["lr"]: r for r in fig3a["rows"] if r["group"] == LR_GROUPS[1]}
        if best["best_grid_lr"] == rate:
            line += f" At {base}, full CEM's own best rate on validation (fig3a) is Llama's rate too."
        elif rate in rows:
            gap = rows[rate]["valid_loss"] - rows[best["best_grid_lr"]]["valid_loss"]
            line += (f" At {base}, full CEM's own best rate on validation is {best['best_grid_lr']:g} (Akima {best['lr']:.2e}; fig3a), "
                     f"and its mean validation loss there is {gap:.3f} nats lower than at Llama's {rate:g}: at this size full CEM trains "
                     f"{'above' if rate > best['best_grid_lr'] else 'below'} its own optimum."
                     + ("" if own else " The other CEM variants are not swept (the paper's rule), so their comparisons with Llama "
                        "here, and the size trend's point at this size, may carry a handicap of that order; fig3a compares full CEM "
                        "and Llama each at its own best rate."))
    return ["", line]


def _runs_of(root: Path, sc: dict, summaries: list[dict]) -> list[dict]:
    """The results of the runs the experiments read (their summaries name them), in the scale's runs folder or
    its tables (`cem_study.records`); every run there for summaries written before they named their runs."""
    runs_dir = root.parent / sc["runs_from"] / "runs" if sc.get("runs_from") else root / "runs"
    named = sorted({slug for s in summaries for slug in s.get("runs", [])})
    runs = [Run(runs_dir / slug) for slug in named] if named else runs_in(runs_dir)
    return [r for r in (run.results() for run in runs) if r is not None]


def _sweep_runs(root: Path, sc: dict, summaries: list[dict], runs: list[dict]) -> int:
    """Add to `runs` (in place) the own-rate sweeps' runs that no experiment reads (each sweep's grid and seeds as
    lr/choices.json records them, and the runs at a rate decided again since, in the scale's runs folder); how many
    were added."""
    from .lr import at_rate, sweep_key

    record, scale = root / "lr" / "choices.json", _scale(sc)
    if not record.exists() or scale is None or not scale.own_rates:
        return 0
    choices, named = read_json(record), {slug for s in summaries for slug in s.get("runs", [])}
    runs_dir = root.parent / sc["runs_from"] / "runs" if sc.get("runs_from") else root / "runs"
    templates = dict.fromkeys(t for i in _suite(sc, summaries) for t in own_templates(EXPERIMENTS[i], scale))
    seeds = {*scale.seeds, *scale.recursion_seeds, *(x for _, more in scale.more_pair_seeds or () for x in more)}
    slugs = {at_rate(t, lr, seed).slug for t in templates if (e := choices.get(sweep_key(t))) for lr in e["grid"] for seed in e["seeds"]}
    slugs |= {at_rate(t, old["lr"], seed).slug for t in templates if (old := choices.get(sweep_key(t), {}).get("superseded"))
              for seed in seeds}  # a rate decided again: the runs at the rate it replaced
    slugs = sorted(slugs - named)
    added = [r for r in (Run(runs_dir / slug).results() for slug in slugs) if r is not None]  # a live folder or its row
    runs += added
    return len(added)


def _provenance(runs: list[dict]) -> str:
    """Where the runs ran: processors with their run counts, torch versions, and the code commits recorded."""
    from cem.provenance import recorded_processors

    procs: dict[str, int] = {}
    for r in runs:
        for p in recorded_processors(r) or ["not recorded"]:
            procs[p] = procs.get(p, 0) + 1
    torches = sorted({s.get("torch") for r in runs for s in r.get("sessions", []) if s.get("torch")})
    commits = sorted({s["commit"][:10] for r in runs for s in r.get("sessions", []) if s.get("commit")})
    recorded = sum(bool(r.get("sessions")) for r in runs)
    text = "Processors: " + ", ".join(f"{p} ({n} run{'s' if n != 1 else ''})" for p, n in sorted(procs.items(), key=lambda x: -x[1])) + "."
    inferred = sum("processor_inferred" in r for r in runs)  # a CPU's family, recorded since 2026-11-28, else inferred
    if inferred:
        text += (f" {inferred} of them predate{'s' if inferred == 1 else ''} the record of a CPU's family, model and stepping: their CPU is inferred from "
                 "bit-exact checks (`processor_inferred`, study/results/cpu128/samebits.py).")
    if recorded:
        text += (f" {recorded} of the {len(runs)} runs record their provenance: torch {', '.join(torches)}; code "
                 f"commit{'s' if len(commits) != 1 else ''} {', '.join(commits) or 'not recorded'}; the others predate it "
                 "(their processor is read from their device).")
    else:
        text += " The runs predate provenance records (commit, torch version): their processor is read from their device."
    return text


def _processors(s: dict) -> str:
    """The processors of an experiment's runs, counted over (variant, seed)."""
    counts: dict[str, int] = {}
    for r in s.get("rows", []):
        for p in r.get("processor_per_seed") or []:
            counts[p or "not recorded"] = counts.get(p or "not recorded", 0) + 1
    return ", ".join(f"{p} ({n} runs)" for p, n in counts.items())


def _diff(f: dict) -> str:
    d = f["difference"]
    if d["n"] == 0:  # every seed's runs ran on different processors
        return "no pair of runs on one processor"
    if d["n"] < 2:
        return f"difference {d['mean']:+.3g}, one seed"
    return f"difference {d['mean']:+.3g} [95% CI {d['lo']:+.3g}, {d['hi']:+.3g}]"


def _gap(g: dict) -> str:
    """A `training_gap` in words: the paired training-loss difference per stretch of steps."""
    return (f"Training loss, {g['a']} minus {g['b']}, paired by seed on the same batches (seeds {g['seeds']}; mean over each stretch "
            "of steps, then over the seeds, [lowest, highest seed]): "
            + "; ".join(f"steps {lo + 1}-{hi} {m:+.4f} [{l:+.4f}, {h:+.4f}]" for lo, hi, m, l, h in zip(g["edges"], g["edges"][1:], g["mean"], g["low"], g["high"]))
            + " nats.")


def _figure_entries(summaries: list[dict], passing: dict[str, bool], below: bool = False) -> list[tuple[str, dict, dict | None]]:
    """The findings of test loss at the sizes that speak (`below`: at those that do not), as `plot_verdicts` draws them:
    (experiment, finding, the same finding at each CEM variant's own rate where that reads other runs, else None)."""
    paired = lambda f: bool(f and (f.get("difference") or {}).get("n"))  # noqa: E731 (no pair of runs on one processor: nothing to draw)
    return [(s["experiment"], f, own if paired(own := None if _same_runs(s) else _own(s).get(f["claim"])) else None)
            for s in summaries for f in s["findings"]
            if f.get("contrast") and paired(f) and below_regime(f, s, passing) == below]


PAPER_ROWS = 12  # the compact figure (the README's): the paper's findings at most


def _verdicts_figure(root: Path, summaries: list[dict], passing: dict[str, bool]) -> list[str]:
    """Draw RESULTS_DIR/verdicts.png (`plot_verdicts`): every finding of test loss at the sizes that speak (where none
    does, at those that do not, the title saying so), with its second-rule interval where that reads other runs, and
    verdicts_paper.png, the paper's findings alone (at most `PAPER_ROWS`, for the README); the report's lines that
    show the first (none without such findings)."""
    from .plots import plot_verdicts

    entries, label = _figure_entries(summaries, passing), ""
    if not entries:  # no size speaks: the figure draws the pipeline checks, titled so
        entries, label = _figure_entries(summaries, passing, below=True), " (pipeline checks: at n-gram level)"
    if not entries:
        return []
    name = summaries[0]["scale"]["name"]
    plot_verdicts(entries, f"{name}: the paired differences behind the verdicts{label}", root / "verdicts.png")
    paper = [e for e in entries if e[1].get("family", "paper") == "paper"][:PAPER_ROWS]
    if paper:
        plot_verdicts(paper, f"{name}: the paper's findings{label}", root / "verdicts_paper.png")
    return ["", "![verdicts](verdicts.png)"]


def _pct(f: dict) -> str:
    """A finding's difference as a perplexity ratio exp(Δ) - 1 with its interval, where it is of test loss (a
    contrast), else in its own units (`_diff`)."""
    d = f.get("difference")
    if not d or not f.get("contrast") or not d["n"]:
        return _diff(f) if d else "—"
    pct = lambda x: f"{math.expm1(x):+.2%}"  # noqa: E731
    return f"{pct(d['mean'])} (one seed)" if d["n"] < 2 else f"{pct(d['mean'])} [{pct(d['lo'])}, {pct(d['hi'])}]"


def _short(f: dict) -> str:
    """The raw verdict, and the Holm-adjusted one where the finding is in a family."""
    return MARK[f["verdict"]] + (f"; Holm: {f['verdict_adjusted']}" if f.get("verdict_adjusted") else "")


def _glance(summaries: list[dict], passing: dict[str, bool]) -> list[str]:
    """The report's first screen: one line per finding at the sizes that speak, the paper's claims first, then the
    controls and ours: the claim, where the paper makes it, the measured difference (oriented one way: `oriented`)
    as a perplexity ratio with its interval, and the verdicts under each rate rule."""
    ranked = lambda fs: sorted(fs, key=lambda x: FAMILIES.index(x[1].get("family", "paper")))  # noqa: E731
    found = ranked((s, f) for s in summaries for f in s["findings"] if not below_regime(f, s, passing))
    below = ranked((s, f) for s in summaries for f in s["findings"] if below_regime(f, s, passing))
    if not found and not below:
        return []
    own_rule = any(_own(s) for s in summaries)

    def own(s: dict, f: dict) -> str:
        if g := _own(s).get(f["claim"]):
            return _short(g) + ("" if _same_runs(s) else f": {_pct(g)}")
        return "waiting" if f.get("family", "paper") == "paper" and (s.get("pending") or {}).get("own") else "—"

    where = lambda s, f: (f"Fig. {s['experiment'][3:]}" if s["experiment"].startswith("fig") else s["experiment"]) if f.get("family", "paper") == "paper" and s.get("paper", True) \
        else f"{'control' if f.get('family') == 'control' else 'ours'} ({s['experiment']})"  # noqa: E731
    head = ["| claim | paper | Δ test perplexity [95% CI] | verdict |" + (" at each CEM variant's own rate |" if own_rule else ""),
            "|---|---|---|---|" + ("---|" if own_rule else "")]
    table = lambda fs: head + [f"| {f['claim']} | {where(s, f)} | {_pct(f)} | {_short(f)} |" + (f" {own(s, f)} |" if own_rule else "")  # noqa: E731
                               for s, f in fs]
    out = table(found) if found else []
    if below:
        out += ["", f"**{_pipeline_heading(summaries)}:** the verdicts stand as measured, but they are not evidence about the paper.",
                ""] + table(below)
    return ["Δ: the seed-paired difference of test loss as a perplexity ratio exp(Δ) − 1, read one way: **negative is CEM "
            "better** where a finding compares CEM with another model, else the side the claim favours better (a "
            "finding of another quantity gives its difference in its own units). Under the second rate rule each CEM "
            "variant trains at its own best rate; \"the same runs\" where that is Llama's. Details, intervals in nats and "
            "the evidence of each finding are below.", ""] + out


def _pipeline_heading(summaries: list[dict]) -> str:
    """The title of the findings at sizes that do not speak: each such size with the orders that beat its Llama."""
    from .analysis import orders_beating

    regime = _regime(summaries)
    sizes = [f"{z}: " + (orders_beating(w["beating"], "its Llama") if w["beating"] else f"its Llama not resolved below the {w['best_order']}-gram")
             for z, r in regime.items() if not r["speaks"] for w in [r["against"]["windowed"]]]
    return f"Pipeline checks: {'this size is' if len(regime) == 1 else 'sizes'} at n-gram level ({'; '.join(sizes)})"


def write_report(results_dir: str | Path, allow_short: bool = False) -> Path:
    """Write RESULTS_DIR/report.md from RESULTS_DIR/*/summary.json; refuses results short of the budget
    (a `ShortOfBudget` error) unless `allow_short` or they are of a scale that never speaks (`pipeline_scale`)."""
    root = Path(results_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"no results directory at {root}")
    summaries = [read_json(root / i / "summary.json") for i in SUITE_ORDER if (root / i / "summary.json").exists()]
    if not summaries:
        raise ValueError(f"{root} holds no experiment results (expected {root}/ID/summary.json from `cem-study experiment`)")
    _check_fresh(root, summaries)
    sc = next((s["scale"] for s in summaries if s["rows"]), summaries[0]["scale"])
    _borrow_own(summaries)
    sizes, uncounted = _family_sizes(summaries, sc)
    _adjust(summaries, sizes)
    short = _short_runs(summaries)
    pipeline = pipeline_scale(summaries)
    if short and not (allow_short or pipeline):
        raise ShortOfBudget(
            f"{len(short)} result(s) in {root} were not trained to the paper's budget (the Chinchilla tokens of the "
            f"Llama baseline), e.g. {short[0]}; they are not findings. Pass --allow-short to write the report anyway "
            "(its first line will say so)."
        )
    lines = []
    if pipeline:
        lines += [f"> **Not the paper's protocol: a pipeline check.** The `{pipeline}` scale trains each run a few steps to show that "
                  "training, the analyses and this report run end to end; its differences are printed without verdicts, p-values "
                  "or power, since at this scale they say nothing about the paper.", ""]
    elif short:
        lines += [f"> **Not the paper's protocol: {len(short)} result(s) below were trained short of the Chinchilla budget "
                  f"(e.g. {short[0]}). Nothing here is a finding.**", ""]
    suite = _suite(sc, summaries)
    missing = [i for i in suite if not (root / i / "summary.json").exists()]
    if missing:
        lines += [f"> **Interim report: {len(missing)} of the {len(suite)} experiments of the scale's suite are not analysed yet "
                  f"({', '.join(missing)}).**", ""]
    waiting = [(s["experiment"], what) for s in summaries for what in (s.get("pending") or {}).values() if what]
    if waiting:
        lines += [f"> **Interim report: {len(waiting)} experiment(s) judged under the paper's rate rule alone**, the second rule (each "
                  "CEM variant at its own best rate) waiting for its runs: " + "; ".join(f"{i}: {what}" for i, what in waiting) + ".", ""]
    behind = [(s["experiment"], s["awaits"]) for s in summaries if s.get("awaits")]
    if behind:
        lines += [f"> **Interim report: {len(behind)} experiment(s) shown as last analysed**, not all the runs they now ask for "
                  "finished yet: " + "; ".join(f"{i}: {what}" for i, what in behind) + ".", ""]
    if (missing or waiting or behind) and not pipeline and any(sizes.values()):
        lines += ["> **The Holm verdicts are provisional.** Each family is fixed by the scale's suite, not by the findings in so far: "
                  + ", ".join(f"{n} {family}" for family, n in sizes.items() if n) + " directional findings under the paper's rate rule, "
                  f"the {sizes['paper']} of the paper's under the second; a finding not measured yet counts as p = 1"
                  + (f", and {', '.join(uncounted)}, whose findings are known only once analysed, not at all" if uncounted else "")
                  + ". They are final once the suite is complete.", ""]
    passing = regime_sizes(summaries)
    lines += ["# CEM experiments: the paper's findings, checked", ""] + _regime_opening(summaries)
    if not pipeline:
        lines += _glance(summaries, passing) + _verdicts_figure(root, summaries, passing)
        lines += ["", "## How the findings were made and judged", ""]
    runs = _runs_of(root, sc, summaries)
    swept = _sweep_runs(root, sc, summaries, runs)
    train_h = sum(r.get("train_wall_time_s", r["wall_time_s"]) for r in runs) / 3600
    wall_h = sum(r["wall_time_s"] for r in runs) / 3600
    lines += [
        f"Scale `{sc['name']}`: corpus `{sc['data']}`, tokenizer `{sc['tokenizer']}`, sizes {', '.join(sc['sizes'])} (base `{sc['base']}`), "
        f"sequences of {sc['seq_len']} tokens, batch {sc['batch_size']}×{sc['grad_accum']}, "
        + (f"{sc['max_steps']} steps per run" if sc.get("max_steps") else "every run trained on the Chinchilla budget of its Llama baseline (20 tokens per Llama parameter) with a 5% warm-up")
        + f"; seeds {sc['seeds']} ({sc['recursion_seeds']} for the recursion experiments"
        + "".join(f"; {seeds} for {exp_id}'s T=1/T=2 pair, its other variants at the recursion seeds" for exp_id, seeds in _pair_seeds(summaries).items())
        + (f"; a recursion experiment's T=1/T=2 pair adds seeds {more} where its first seeds do not resolve half their observed "
           "validation difference (80% power)" if (more := sorted({x for _, m in sc.get("more_pair_seeds") or [] for x in m})) else "") + ").",
        "",
        f"{len(runs)} training runs (shared between experiments, each trained once"
        + (f"; {len(runs) - swept} read by the experiments and {swept} more of the own-rate sweeps, at the rates not chosen" if swept else "")
        + f") took {train_h:.2f} h of training, summed over "
        f"runs ({wall_h:.2f} h with each run's final evaluation on the whole validation and test splits). {_provenance(runs)}",
        "",
        "Differences: of test loss between runs paired by seed (nats per token), with their 95% confidence interval over the "
        "seeds; pipeline checks, not findings." if pipeline else
        "How findings are judged: runs are paired by seed (same seed: same data order and, where Llama and CEM share a parameter's "
        "name and shape, the same initial value). Differences are of test loss (nats per token, log-perplexity), also given in % of "
        "perplexity. A directional finding is **held** only when the 95% confidence interval (Student t) of the mean paired "
        "difference excludes zero with the paper's sign, **not held** when it excludes zero with the opposite sign, **inconclusive** "
        "otherwise; the Holm-adjusted verdict reads the Holm-Bonferroni adjusted p-value at 0.05 the same way, over each family "
        "(the paper's directional findings; the controls; ours" + ("; the recipes' confirmation at twice the trained depth" if sizes[TWICE] else "") + "), each fixed before the data: every directional finding the "
        "scale's suite judges, measured or not (one not measured yet counts as p = 1), the second rate rule's family being the "
        "paper's same claims. A difference measured on one seed has no interval: its sign alone "
        "decides, and its evidence says \"one seed, no interval\". \"Close\" findings are equivalence tests (the whole interval inside "
        "±log(1 + tolerance)) and \"matches or beats\" a non-inferiority test; equivalence and non-inferiority findings are "
        "outside the multiplicity correction (each is judged on its own interval), and say where their "
        "interval also excludes zero (a gap within the margin, or not resolved against it). Each finding "
        "says what its seeds could resolve: the smallest difference a directional test detects with 80% power at the observed "
        "spread, or whether the interval is narrow enough to fit inside an equivalence or non-inferiority margin at all. Runs on "
        "different processors are never paired: such a seed is left out of the difference, and the evidence says so.",
        "",
    ]
    lines += [] if pipeline else _opening(summaries, bool(short))
    record = root / "lr" / "choices.json"
    lines += _rates(summaries, read_json(record) if record.exists() else None)
    if regime := _regime(summaries):
        lines += ["", f"**Regime check (validation, nats per token; intervals: 95% t over the seeds):** " + "; ".join(
            f"{size}: Llama perplexity {math.exp(r['llama_valid_loss']):.3f} (mean of seeds {r['seeds']}); n-grams fit on the same "
            f"{r['ngrams'][0]['train_tokens']:,} tokens, Llama minus each "
            + "; ".join(("in the transformer's " + str(r['window']) + "-token windows" if scoring == "windowed" else "on the unbroken text") + ": "
                        + ", ".join(f"{m['order']}-gram {_ci(m, '+.4f')}{' (best)' if m['order'] == a['best_order'] else ''}" for m in a["minus"])
                        for scoring, a in r["against"].items())
            + (f"; loss at positions {r['context']['short'][0]}-{r['context']['short'][1] - 1} {r['context']['short_loss']:.3f} nats vs "
               f"{r['context']['long_loss']:.3f} in the window's second half" if "context" in r else "")
            for size, r in regime.items())
            + ". A size whose Llama does not beat the best order in the transformer's windows on that interval is at n-gram level, "
            "and one whose loss stops falling after a few positions uses no more context than an n-gram does: its attention "
            "findings say little."]
    if sc.get("limits"):
        lines += ["", f"**What this scale cannot test:** {sc['limits']}."]
    own_rule = any(s.get("rules", {}).get("own") for s in summaries)
    head = "| experiment | finding | test | family | verdict (raw; Holm) |" + (" each CEM variant at its own rate (raw; Holm) |" if own_rule else "") + " evidence |"
    rule = "|---|---|---|---|---|" + ("---|" if own_rule else "") + "---|"

    def table(pick) -> list[str]:
        out = [head, rule]
        for s in summaries:
            for f in s["findings"]:
                if pick(f, s):
                    cell = f" {_own_cell(s, f)} |" if own_rule else ""
                    out.append(f"| {s['experiment']} | {f['claim']} | {kind(f)} | {f.get('family', 'paper')} | {_verdicts(f)} |{cell} {f['evidence']} |")
        return out

    speaks = [z for z, ok in passing.items() if ok]
    if pipeline:
        lines += ["", "## Pipeline checks", "", "| experiment | check |", "|---|---|"]
        lines += [f"| {s['experiment']} | {pipeline_check(f)} |" for s in summaries for f in s["findings"]]
    else:
        lines += ["", f"## Verdicts{' at ' + ', '.join(speaks) if speaks else ''}", ""]
        lines += table(lambda f, s: not below_regime(f, s, passing))
    if not pipeline and any(below_regime(f, s, passing) for s in summaries for f in s["findings"]):
        lines += ["", f"## {_pipeline_heading(summaries)}", "",
                  "These findings are about sizes whose Llama does not beat the best n-gram on its seeds' interval (the regime "
                  "check): they show that the pipeline runs and what it gives there, not whether the paper's claims hold.", ""]
        lines += table(lambda f, s: below_regime(f, s, passing))
    for s in summaries:
        lines += ["", f"## {s['experiment']}: {s['question']}", ""]
        procs = _processors(s)
        if procs:
            lines += [f"Processors: {procs}.", ""]
        if pair := s.get("pair_seeds"):
            lines += [f"Seeds: {pair['text']}.", ""]
        lines += _table(s)
        if own := s.get("rules", {}).get("own"):
            if _same_runs(s):
                lines += ["", f"Under the second rate rule ({own['rule']}) every variant here trains at the rate above: "
                              "its verdicts are read from the same runs."]
            else:
                lines += ["", f"Under the second rate rule ({own['rule']}):", ""]
                lines += _table({**s, "rows": own["rows"]})
        if "optima" in s:
            lines += [""] + [f"- {g}: best grid rate on validation {o.get('best_grid_lr', o['lr']):g}; Akima optimum of the mean validation loss: lr {o['lr']:.2e}, "
                             f"loss {o.get('valid_loss', float('nan')):.4f}" for g, o in s["optima"].items()]
        if s.get("answer"):
            lines += _answer(s["answer"])
        if "curves" in s:
            lines += _curves(s)
        if "choice" in s:
            lines += _choice(s["choice"])
        for g in s.get("training_gap", []):
            lines += ["", _gap(g)]
        if "chosen" in s:
            lines += [""] + [f"- {size}: chosen rate {c['lr']:g} (mean validation loss {c['valid_loss']:.4f}, seeds {c['seeds']})"
                             + ("" if c["bracketed"] else " **at an end of the grid: not bracketed**")
                             + (f"; with runs trained again since, {c['best_now']['lr']:g} is now lowest ({c['best_now']['valid_loss']:.4f}): "
                                "the recorded choice stands, every run of the size trained at it" if "best_now" in c else "")
                             for size, c in s["chosen"].items()]
        if "trend" in s:
            lines += [""] + [f"- {name}: slope {t['slope']['mean']:+.4f} nats per e-fold of parameters [95% CI {t['slope']['lo']:+.4f}, {t['slope']['hi']:+.4f}] "
                             "(tested sizes only)" for name, t in s["trend"].items() if "slope" in t]
        if pipeline:
            lines += ["", *[f"- pipeline check: {pipeline_check(f)}" for f in s["findings"]]]
            lines += [f"- pipeline check, at the CEM variants' own rates: {pipeline_check(g)}" for g in _own(s).values()]
        else:
            lines += ["", *[f"- {'† ' if below_regime(f, s, passing) else ''}{_verdicts(f)}: {f['claim']} ({f['evidence']})" for f in s["findings"]]]
            lines += [f"- at the CEM variants' own rates: {_verdicts(g)}: {g['claim']} ({g['evidence']})" for g in _own(s).values()]
        png = f"{s['experiment']}/{s['experiment']}.png"
        if (root / png).exists():
            lines += ["", f"![{s['experiment']}]({png})"]
    path = root / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
