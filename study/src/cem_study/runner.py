"""`run_experiment(ID, scale)` and `run_suite(scale)`: train what the experiments need (finished runs are
skipped, interrupted ones resume), then analyse, judge the findings and plot; everything lands in
RESULTS/ID/ (summary.json, ID.png) and the runs in RESULTS/runs/ (finished ones also in its tables, `records`)."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from cem.checks import check_positive_int
from cem.device import cpu_model
from cem.io import atomic_write_json, read_json
from cem.training import RunDir
from . import lr, seeds
from .findings import Context
from .launchers import Launcher, ProcessLauncher
from .costs import COMMITTED, Costs, DeadlineReached, wave_seconds
from .products import missing
from .records import Run
from .registry import ALL_IDS, EXPERIMENTS, RATE_RULES, SUITE_ORDER, RecipesNotAtSize, RecipesNotChosen, own_templates, variants_under
from .scales import LearningRateNotChosen, Scale, get_scale
from .sweep import RunSpec, block_processors, blocks_elsewhere, processor_here, run_sweep, summarize


def machine() -> str:
    """The GPU's name, or the CPU's model name and core count."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return f"{cpu_model()}, {os.cpu_count()} cores"


def _check_id(exp_id: str) -> None:
    if exp_id not in ALL_IDS:
        raise ValueError(f"unknown experiment {exp_id!r}; expected one of {', '.join(ALL_IDS)}, or all")


def waiting(ids, scale: Scale) -> dict[str, str]:
    """The experiments of `ids` whose variants cannot be built yet or at this scale, with why: one waits for another
    experiment's choice (`RecipesNotChosen`: the confirmation, for the screening's recipes), or that choice names a model
    a size of the scale cannot build (`RecipesNotAtSize`). A rate not chosen yet is chosen as the runs train (`train_runs`)."""
    out = {}
    for i in ids:
        try:
            _runs(i, scale)
        except RecipesNotChosen as e:
            out[i] = f"it waits for another experiment's choice: {e}"
        except RecipesNotAtSize as e:
            out[i] = f"this scale cannot build its models: {e}"
        except LearningRateNotChosen:
            pass
    return out


def _runs(exp_id: str, scale: Scale, rule: str = "paper") -> list:
    """(variant, seed) of every run an experiment needs under a rate rule (`RATE_RULES`)."""
    exp = EXPERIMENTS[exp_id]
    return [(v, s) for v in variants_under(exp, scale, rule) for s in (v.seeds or scale.seeds_for(exp.seeds))]


def _specs(exp_id: str, scale: Scale, rules: tuple[str, ...] = ("paper",)) -> list:
    return list(dict.fromkeys(v.spec.with_seed(s) for rule in rules for v, s in _runs(exp_id, scale, rule)))


def _own_templates(ids, scale: Scale) -> list:
    """The own-rate sweeps of the experiments `ids` (`registry.own_templates`), each once."""
    return list(dict.fromkeys(t for i in ids for t in own_templates(EXPERIMENTS[i], scale)))


def _products(ids, scale: Scale) -> dict:
    """What the experiments `ids` read from each run's weights (`cem_study.products`), by spec."""
    out: dict = {}
    for i in ids:
        if EXPERIMENTS[i].products is not None:
            for v, s in _runs(i, scale):
                spec = v.spec.with_seed(s)
                out[spec] = tuple(dict.fromkeys(out.get(spec, ()) + tuple(EXPERIMENTS[i].products(scale, v, s))))
    return out


def run_experiment(exp_id: str, scale: str = "cpu", results_dir: str | Path | None = None, data_dir: str | None = None,
                   jobs: int = 1, device: str = "auto", **scale_overrides) -> dict:
    """Run one experiment and write RESULTS/ID/summary.json and RESULTS/ID/ID.png; returns the summary."""
    _check_id(exp_id)
    return run_suite(scale, results_dir, data_dir, jobs, (exp_id,), device, **scale_overrides)[0]


def train_runs(ids, sc: Scale, root: Path, data_dir: str | None = None, jobs: int | Launcher = 1) -> tuple[Scale, dict]:
    """Train every run the experiments `ids` need (`jobs`: as `run_sweep`'s); returns the scale (with its chosen learning rates) and
    the results by spec. At a scale that sweeps learning rates (`cem_study.lr`) it goes size by size,
    the base first: a size's Llama sweep, then that size's runs in the order of `ids` (fig3a's CEM sweep is
    extended, where its optimum is not bracketed yet, after the base size's other runs; so is Llama's, where a run
    trained again since its decision has moved its best rate to an end of the grid: `lr.sweep`'s `rebracket`).
    At a scale with the own-rate rule it goes experiment by experiment: its runs at the size's Llama rate,
    then each own-rate variant's seed-0 sweep, then that variant's runs at the rate chosen; an experiment whose runs
    another sweep over the same results holds (a second lane) is put off until the other experiments are done, and
    one that left runs for the launcher's deadline (`DeadlineReached`) until the end, where they are named."""
    if not sc.lr_sweep:
        results = run_sweep([s for i in ids for s in _specs(i, sc)], sc, root, data_dir, jobs, _products(ids, sc))
        if (more := seeds.decided(sc, ids, root)) != sc:  # a recursion pair's added seeds (`cem_study.seeds`)
            sc = more
            results.update(run_sweep([s for i in ids for s in _specs(i, sc)], sc, root, data_dir, jobs, _products(ids, sc)))
        return sc, results
    results: dict = {}
    order = [sc.base] + [z for z in sc.sizes if z != sc.base]
    for n, size in enumerate(order):
        sc = lr.choose(sc, lr.llama(size), root, data_dir, jobs)
        done = replace(sc, sizes=tuple(z for z in sc.sizes if z in order[: n + 1]))
        print(f"== training the runs of {', '.join(ids)} at size {size} ({sc.name} scale)", file=sys.stderr, flush=True)
        if sc.own_rates:  # experiment by experiment (`_experiment_runs`): first each without waiting for a run another
            left, late = list(ids), []  # sweep over the same results holds (a second lane), then those put off, waiting
            for wait in (False, True):
                put_off = []
                for i in left:
                    try:
                        done, res, finished = _experiment_runs(i, ids, done, root, data_dir, jobs, wait)
                    except DeadlineReached as e:  # its runs that fit have trained; the next experiment's may fit too
                        late.append(e)
                        continue
                    results.update({s: r for s, r in res.items() if r is not None})
                    put_off += [] if finished else [i]
                if put_off and not wait:
                    print(f"== back to {', '.join(put_off)}: put off while another sweep held their runs", file=sys.stderr, flush=True)
                left = put_off
            if late:
                raise DeadlineReached(late[0].deadline, list(dict.fromkeys(run for e in late for run in e.runs)))  # a run two experiments share, once
            sc = replace(sc, own_lrs=done.own_lrs, lr_grids=done.lr_grids, pair_seeds=done.pair_seeds)
            continue
        specs = [s for i in ids for s in _specs(i, done)]
        results.update(run_sweep(specs, done, root, data_dir, jobs, _products(ids, done)))
        if size == sc.base and "fig3a" in ids and not sc.own_rates:  # fig3a reads both curves: each bracketed on the current results
            for arch in ("cem-t2", "llama"):
                sc = lr.choose(sc, RunSpec.make(size, arch), root, data_dir, jobs, rebracket=True)
    sc = seeds.decided(sc, ids, root)  # a recursion pair's added seeds, where not trained above (`cem_study.seeds`)
    specs = [s for i in ids for s in _specs(i, sc, sc.rate_rules)]
    results.update(run_sweep(specs, sc, root, data_dir, jobs, _products(ids, sc)))  # only reads results, or trains those seeds
    return sc, results


def _experiment_runs(exp_id: str, ids, sc: Scale, root: Path, data_dir: str | None, jobs, wait: bool) -> tuple[Scale, dict, bool]:
    """One experiment's runs at an own-rate scale: its runs at the size's Llama rate (with the seeds its T=1/T=2
    pair adds once its first seeds are in: `cem_study.seeds`), its variants' own-rate sweeps, and its runs at
    the rates they chose; returns the scale with those rates and seeds, the results, and whether all finished
    (without `wait`, runs another sweep holds are left to it: `run_sweep`)."""
    results = run_sweep(_specs(exp_id, sc), sc, root, data_dir, jobs, _products(ids, sc), wait=wait)
    if (more := seeds.decided(sc, (exp_id,), root)) != sc:
        sc = more
        results.update(run_sweep(_specs(exp_id, sc), sc, root, data_dir, jobs, _products(ids, sc), wait=wait))
    decided = True
    for template in own_templates(EXPERIMENTS[exp_id], sc):
        state = lr.sweep(sc, template, root, data_dir, jobs, wait=wait)
        decided = decided and state.best is not None
        sc = lr.with_choice(sc, template, state) if state.best is not None else sc
    if decided:
        results.update(run_sweep(_specs(exp_id, sc, ("own",)), sc, root, data_dir, jobs, _products(ids, sc), wait=wait))
    return sc, results, decided and all(r is not None for r in results.values())


def plan(scale: str = "cpu", results_dir: str | Path | None = None, ids=None, **scale_overrides) -> dict:
    """What `run_suite` would train and evaluate, without doing either (`cem-study experiment ... --plan`): the
    learning-rate decisions so far (an undecided sweep's runs are named at a provisional rate, the middle of its
    grid: `provisional`), each experiment's runs by `run_status` (with every experiment's products, and the runs of
    the own-rate sweeps it waits on), and the hours of training left (`Costs.seconds`: core-hours, GPU-hours at
    a GPU scale; runs of a size with no finished run here from the runs committed in study/results, else from the
    FLOP model: `bases` counts the runs estimated from each)."""
    from .sweep import run_status

    sc = get_scale(scale, **scale_overrides)
    ids = tuple(ids or sc.suite or SUITE_ORDER)
    for i in ids:
        _check_id(i)
    root = Path(results_dir or f"results/{scale}")
    undecided, status, provisional, sweeping = {}, {}, [], {}

    def choice(template) -> None:
        """`sc` with the sweep of `template` decided, or provisionally (its runs to train counted)."""
        nonlocal sc
        state = lr.sweep(sc, template, root, dry=True)
        sweeping[template] = list(state.pending)
        if state.best is None:
            undecided[lr.sweep_key(template)] = len(state.pending)
            provisional.append(lr.sweep_key(template))
            status.update({spec: run_status(spec, sc, root) for spec in state.pending})  # "again": another processor's
            state = replace(state, best=sorted(state.grid)[len(state.grid) // 2])
        sc = lr.with_choice(sc, template, state)

    if sc.lr_sweep:
        for size in [sc.base] + [z for z in sc.sizes if z != sc.base]:
            choice(lr.llama(size))  # every other size's grid is centred on the base size's rate
        if "fig3a" in ids and lr.sweep_key(lr.llama(sc.base)) not in provisional and not sc.own_rates:
            for arch in ("cem-t2", "llama"):
                state = lr.sweep(sc, RunSpec.make(sc.base, arch), root, dry=True, rebracket=True)
                if state.best is None:
                    undecided[f"{sc.base}-{arch}"] = len(state.pending)
                else:  # a grid grown to bracket the current best: its new runs are fig3a's, counted below
                    sc = lr.with_choice(sc, RunSpec.make(sc.base, arch), state)
    rules = ("paper", "own") if sc.own_rates else ("paper",)
    waits = waiting(ids, sc)  # an experiment waiting for another's choice, or one this scale cannot build: its runs are not known
    ids = tuple(i for i in ids if i not in waits)
    for template in _own_templates(ids, sc) if sc.own_rates else ():
        choice(template)
    sc = seeds.decided(sc, ids, root)  # the recursion pairs' seeds, where their first runs are in
    members, products = {}, _products(ids, sc)
    for i in ids:  # an experiment's runs, and those of the own-rate sweeps it waits on
        own = _own_templates((i,), sc) if sc.own_rates else ()
        members[i] = list(dict.fromkeys(_specs(i, sc, rules) + [x for t in own for x in sweeping.get(t, ())]))
        for spec in members[i]:
            status.setdefault(spec, run_status(spec, sc, root, products.get(spec, ())))
    held = ""  # in a campaign of seed blocks, the runs to train of blocks another processor holds are left to it (`run_sweep`)
    if sc.seed_blocks and (todo := [x for x, v in status.items() if v in ("train", "again")]):
        foreign, held = blocks_elsewhere(todo, block_processors(sc, root), sc.processor or processor_here(todo[0], sc))
        status.update(dict.fromkeys(foreign, "elsewhere"))
    kinds = ("finished", "train", "evaluate", "again", "elsewhere")
    experiments = {i: {k: sum(status[x] == k for x in specs) for k in kinds} for i, specs in members.items()}
    total = {k: sum(v == k for v in status.values()) for k in kinds}
    costs = Costs(sc, root)
    hours, bases = 0.0, {}
    for spec in (x for x, v in status.items() if v in ("train", "again")):
        seconds, by = costs.seconds(spec)
        hours += seconds / 3600
        by = by or f"the FLOP model at {costs.rate[1]}"
        bases[by] = bases.get(by, 0) + 1
    eval_hours, eval_unestimated = 0.0, 0
    for spec in (x for x, v in status.items() if v not in ("finished", "elsewhere")):
        for product in missing(products.get(spec, ()), sc.runs(root) / spec.slug):
            seconds = costs.product_seconds(spec, product.name)
            if seconds is None:
                eval_unestimated += 1
            else:
                eval_hours += seconds / 3600
    train = [x for x, v in status.items() if v in ("train", "again")]
    wave = wave_seconds(sc, train, COMMITTED / sc.measured_on) if sc.measured_on and train else None
    return {"scale": sc.name, "results": str(root), "chosen_lrs": dict(sc.chosen_lrs), "own_lrs": dict(sc.own_lrs), "wave": wave, "measured_on": sc.measured_on,
            "pair_seeds": dict(sc.pair_seeds), "seeds_undecided": {i: list(sc.more_pair_seeds_of(i)) for i in seeds.undecided(sc, ids, root)},
            "provisional_lrs": [z for z in dict(sc.chosen_lrs) if lr.sweep_key(lr.llama(z)) in provisional],
            "undecided": undecided, "provisional": provisional, "experiments": experiments, "waiting": waits, "total": total, "elsewhere": held,
            "unit": "GPU-hours" if costs.gpu else "core-hours", "core_hours": hours, "bases": bases,
            "eval_core_hours": eval_hours, "eval_unestimated": eval_unestimated}


def format_plan(p: dict) -> str:
    """A plan (`plan`) as a few lines: the learning rates, a table of the runs per experiment, the totals."""
    lines = [f"plan at the {p['scale']} scale in {p['results']} (nothing is trained or evaluated by --plan)"]
    if p["chosen_lrs"]:  # a size whose Llama sweep is undecided has a provisional rate, not a chosen one
        later = set(p.get("provisional_lrs") or ())
        chosen = {z: lr for z, lr in p["chosen_lrs"].items() if z not in later}
        if chosen:
            lines.append("learning rates chosen: " + ", ".join(f"{z} {lr:g}" for z, lr in chosen.items()))
        if later:
            lines.append("learning rates not chosen yet (their Llama sweeps are undecided; counted at the provisional rate): "
                         + ", ".join(f"{z} {lr:g}" for z, lr in p["chosen_lrs"].items() if z in later))
    if own := {k: lr for k, lr in (p.get("own_lrs") or {}).items() if k not in p["provisional"]}:  # a provisional rate is not a choice
        lines.append("own rates chosen: " + ", ".join(f"{k} {lr:g}" for k, lr in own.items()))
    for exp_id, more in (p.get("seeds_undecided") or {}).items():
        lines.append(f"{exp_id}: its T=1/T=2 pair may add seeds {more} once its first seeds are in (counted without them)")
    for exp_id, why in (p.get("waiting") or {}).items():
        lines.append(f"{exp_id}: not counted, {why}")
    for key, n in p["undecided"].items():
        later = key in p["provisional"]
        lines.append(f"sweep {key} undecided: {n} of its runs to train first" + ("; the runs at its rate are counted at a provisional rate "
                                                                                "(the middle of its grid; a grid extended later adds runs)" if later else ""))
    cols = ("finished", "train", "evaluate", "again") + (("elsewhere",) if p["total"].get("elsewhere") else ())
    lines.append(f"{'experiment':<12}" + "".join(f"{c:>10}" for c in ("finished", "to train", "evaluate", "again", "elsewhere")[:len(cols)]))
    for exp_id, counts in p["experiments"].items():
        lines.append(f"{exp_id:<12}" + "".join(f"{counts[c]:>10}" for c in cols))
    if p["total"]:
        lines.append(f"{'in all':<12}" + "".join(f"{p['total'][c]:>10}" for c in cols)
                     + "   (the experiments above and the rate sweeps they wait on, a run they share counted once)")
    lines.append(f"training left: about {p['core_hours']:.1f} {p['unit']} (one {'GPU' if p['unit'] == 'GPU-hours' else 'thread'} per run: "
                 "divide by --jobs), from the wall times of finished runs of the same size, scaled by training FLOPs where the architecture differs"
                 + "".join(f"; {n} runs of sizes with no finished run here from {by}" for by, n in p["bases"].items() if by != "here")
                 + (" (an estimate)" if set(p["bases"]) - {"here"} else "")
                 + f". Evaluations left (run products): about {p['eval_core_hours']:.1f} core-hours, from their recorded times"
                 + (f"; {p['eval_unestimated']} with no recorded time of that product at that size are not counted" if p["eval_unestimated"] else "")
                 + ". 'again': finished runs trained again, as they ran on another processor than --processor, or an analysis "
                 "needs their weights and their checkpoint is gone; 'evaluate': that analysis is computed from their checkpoint."
                 + (f" 'elsewhere': runs of (size, seed) blocks another processor holds ({p['elsewhere']}), left to it and not counted "
                    "in the hours: each block of this campaign trains on one processor" if p["total"].get("elsewhere") else ""))
    if w := p.get("wave"):
        lines.append(f"one call on the GPU of {p['measured_on']}, its {w['runs']} runs together: about {w['seconds']:.0f} s of training "
                     f"(bound by steps {w['steps_bound']:.0f} s, the slowest {w['slowest']}; bound by throughput {w['throughput_bound']:.0f} s, "
                     f"{w['flops']:.2e} FLOPs at {w['flop_rate'] / 1e12:.1f} TFLOP/s), from the {w['measured']} runs measured there together")
    return "\n".join(lines)


def _analyse(exp_id: str, sc: Scale, root: Path, results: dict, data_dir: str | None, device: str, pending: dict | None = None) -> dict:
    exp = EXPERIMENTS[exp_id]
    out = root / exp_id
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    variants = exp.variants(sc) if exp.variants else []
    rows = summarize(variants, results, sc.seeds_for(exp.seeds)) if variants else []
    findings, extra = exp.analyze(Context(sc, rows, variants, root, out, data_dir, device))
    rules = {}
    if sc.own_rates and not (pending or {}).get("own") and any(v.own_rate for v in variants):  # the headline findings again, each CEM variant at its own rate
        own = variants_under(exp, sc, "own")
        own_rows = summarize(own, results, sc.seeds_for(exp.seeds))
        own_findings, _ = exp.analyze(Context(sc, own_rows, own, root, out, data_dir, device))
        rules["own"] = {"rule": RATE_RULES["own"], "rows": own_rows,
                        "findings": [f.to_dict() for f in own_findings if f.family == "paper"]}
    summary = {
        "experiment": exp_id,
        "question": exp.question,
        "paper": exp.paper,
        "scale": sc.to_dict(),
        "seeds": list(sc.seeds_for(exp.seeds)),
        "rows": rows,
        "findings": [f.to_dict() for f in findings],
        "rate_rule": RATE_RULES["paper"],
        "rules": rules,
        "pending": pending or {},  # a rate rule whose runs have not all finished (`analyse_finished`): what it waits for
        "pair_seeds": {**d.to_dict(), "text": d.text()} if (d := seeds.decide(sc, exp_id, root)) else None,  # `cem_study.seeds`
        **extra,
        "short_runs": [r["label"] for r in rows if r["tokens"] < r["budget_tokens"]],
        "machine": machine(),
        "analysis_time_s": time.perf_counter() - started,
        "train_time_s": sum(r["wall_time_s"] for r in results.values()),
        "runs": sorted(spec.slug for spec in results),  # the runs (the scale's runs folder or its tables) this experiment read
    }
    exp.plot(summary, f"{exp_id}: {exp.question} ({sc.name} scale, {sc.data})", out / f"{exp_id}.png")
    atomic_write_json(out / "summary.json", summary)
    return summary


def run_suite(
    scale: str = "cpu",
    results_dir: str | Path | None = None,
    data_dir: str | None = None,
    jobs: int = 1,
    ids=None,
    device: str = "auto",
    launcher: Launcher | None = None,
    analyse: bool = True,
    **scale_overrides,
) -> list[dict]:
    """Several experiments at a scale (default: the scale's suite): every run they need is trained first in
    one pool (shared runs once, the recursion experiments first; `train_runs`), then (unless not `analyse`:
    nothing is then returned) each is analysed (of the suite,
    those that wait for another experiment's choice are left out and named: `waiting`). The runs
    train on `launcher` (`cem_study.launchers`; default: `jobs` at once on this machine); a launcher with a
    deadline (`until`) raises `DeadlineReached` after the runs that fit, and nothing is analysed."""
    check_positive_int("jobs", jobs)
    sc = get_scale(scale, **scale_overrides)
    every = not ids
    ids = tuple(ids or sc.suite or SUITE_ORDER)
    for i in ids:
        _check_id(i)
    root = Path(results_dir or f"results/{scale}")
    if every:  # an experiment of the suite that waits for another's choice (or this scale cannot build) is left out; one named is not
        for i, why in (held := waiting(ids, sc)).items():
            print(f"== {i} not run: {why}", file=sys.stderr, flush=True)
        ids = tuple(i for i in ids if i not in held)
        if not ids:
            return []
    print(f"== training the runs of {', '.join(ids)} ({sc.name} scale)", file=sys.stderr, flush=True)
    sc, results = train_runs(ids, sc, root, data_dir, launcher or ProcessLauncher(jobs))
    if not analyse:
        return []
    summaries = []
    for exp_id in ids:
        print(f"== {exp_id}", file=sys.stderr, flush=True)
        needed = {s: results[s] for s in _specs(exp_id, sc, sc.rate_rules)}
        summaries.append(_analyse(exp_id, sc, root, needed, data_dir, device))
    return summaries


def analyse_finished(scale: str = "cpu", results_dir: str | Path | None = None, data_dir: str | None = None, ids=None,
                     device: str = "auto", **scale_overrides) -> tuple[list[dict], dict[str, str]]:
    """`cem-study experiment ... --analyse-only`: the findings a campaign already allows, training and evaluating
    nothing. Each experiment whose runs under the paper's rule have all finished is analysed as `run_suite`
    would; where its own-rate rule still waits for a sweep or runs, it is judged under the paper's rule alone
    and its summary names what the other rule waits for (`pending`). Returns the summaries and, for each
    experiment not analysed, why (what it waits for)."""
    from .sweep import run_status

    sc = get_scale(scale, **scale_overrides)
    ids = tuple(ids or sc.suite or SUITE_ORDER)
    for i in ids:
        _check_id(i)
    root = Path(results_dir or f"results/{scale}")
    if sc.lr_sweep:  # every size's Llama rate must be decided: it is every variant's rate under the paper's rule
        for size in [sc.base] + [z for z in sc.sizes if z != sc.base]:
            state = lr.sweep(sc, lr.llama(size), root, dry=True)
            if state.best is None:
                return [], dict.fromkeys(ids, f"waiting for the Llama rate sweep at {size} ({_n_runs(len(state.pending))} to train)")
            sc = lr.with_choice(sc, lr.llama(size), state)
            if size == sc.base and "fig3a" in ids and not sc.own_rates:  # fig3a's curves as `train_runs` leaves them
                for arch in ("cem-t2", "llama"):
                    state = lr.sweep(sc, RunSpec.make(size, arch), root, dry=True, rebracket=True)
                    sc = lr.with_choice(sc, RunSpec.make(size, arch), state) if state.best is not None else sc
    sc = seeds.decided(sc, ids, root)  # the recursion pairs' seeds, where their first runs are in
    held = waiting(ids, sc)
    ids = tuple(i for i in ids if i not in held)
    products = _products(ids, sc)

    def unfinished(specs: list, at: Scale) -> list:
        return [s for s in specs if run_status(s, at, root, products.get(s, ())) != "finished"]

    summaries, waits = [], dict(held)
    for i in ids:
        paper = _specs(i, sc)
        if todo := unfinished(paper, sc):
            awaits = f"{len(todo)} of its {_n_runs(len(paper))} to train or evaluate"
            waits[i] = f"waiting for {awaits}"
            if (last := root / i / "summary.json").exists():  # its last analysis stands, and its report says what it lacks
                atomic_write_json(last, {**read_json(last), "awaits": awaits})
            continue
        at, sweeps = sc, []
        for template in own_templates(EXPERIMENTS[i], sc):
            state = lr.sweep(at, template, root, dry=True)
            if state.best is None:
                sweeps.append(f"{lr.sweep_key(template)} ({_n_runs(len(state.pending))} to train)")
            else:
                at = lr.with_choice(at, template, state)
        pending = f"the own-rate sweep{'s' if len(sweeps) > 1 else ''} of {' and '.join(sweeps)}" if sweeps else None
        if sc.own_rates and pending is None and (todo := unfinished(_specs(i, at, ("own",)), at)):
            pending = f"{_n_runs(len(todo))} at the CEM variants' own rates to train"
        results = {s: Run(at.runs(root) / s.slug).results() for s in _specs(i, at, ("paper",) if pending else at.rate_rules)}
        print(f"== {i}" + (f" (own-rate rule waiting for {pending})" if pending else ""), file=sys.stderr, flush=True)
        summaries.append(_analyse(i, at, root, results, data_dir, device, {"own": pending} if pending else None))
    return summaries, waits


def _n_runs(n: int) -> str:
    return f"{n} run{'' if n == 1 else 's'}"
