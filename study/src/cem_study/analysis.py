"""Analyses that go beyond training runs' final metrics: test-time recursion (a trained model evaluated
at other T, with its FLOPs per token), the energy at each recursion step, the GP regression study, and the
regime check (n-gram baselines, and how much context a trained model uses)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch

from cem.device import pick_device
from cem.io import atomic_write_json
from cem.data import iter_eval_batches, load_tokenizer
from cem.data.tokenshards import token_split
from cem.layers import SUBLAYERS
from cem.layers.steps import DescentLayer, Inference
from cem.model import ModelConfig
from cem.model.flops import forward_flops_per_token
from cem.training import RunDir
from .findings import TWICE, Context, Finding, difference_text, by_seed, row
from .products import Product
from .records import Run
from .stats import Interval, mean_std


def load_run(run_dir: Path, data_dir: str | None = None, device: str = "auto", split: str = "test"):
    """The trained model (on `device`), a split of its corpus (default test) and sequence length, from a run directory."""
    run = RunDir(run_dir)
    model, state = run.load_checkpoint()
    train = state["run"]["train"]
    split = run_split(run, train, split, data_dir)
    return model.to(pick_device(device)).eval(), split, train["seq_len"] or model.config.context


def run_split(run: RunDir, train: dict, split: str, data_dir: str | None = None):
    """A split of a run's corpus in the run's tokenizer (`train`: its training settings), from the run's
    token shards where it has some."""
    return token_split(train["data"], load_tokenizer(run.tokenizer_dir), train["tokenizer"], split,
                       data_dir or train.get("data_dir"), train.get("data_encoding", "utf-8"))


def flops_at(cfg, seq_len: int, attn_steps: float, mlp_steps: float) -> float:
    """Forward FLOPs per token at average recursion depths, as `LM.steps_used` reports them: per sublayer kind, the
    mean steps over all its CEM layers, the blocks `recur_layers` keeps at T = 1 included. The count is affine in
    each layer's T, and every step beyond a layer's first falls on a recursing block: (T̄ − 1) × n_layers extra steps,
    each costing 1/n_recursing of one more step of every recursing block (the energy an adaptive step also computes
    is not counted)."""

    def at(a: int, m: int) -> int:
        return forward_flops_per_token(cfg.at(Inference(attn_steps=a, mlp_steps=m)), seq_len)

    base = at(1, 1)
    share = cfg.n_layers / sum(map(cfg.recurs, range(cfg.n_layers)))  # CEM layers of a kind per recursing one
    return base + share * ((attn_steps - 1) * (at(2, 1) - base) + (mlp_steps - 1) * (at(1, 2) - base))


def counted(run_dir: Path, study: dict) -> dict:
    """A `depth_study` with every CEM row's FLOPs counted from its recorded steps (`flops_at`, the run's config): a
    study computed before `flops_at` counted the blocks `recur_layers` keeps at T = 1 (study/docs/LOG.md, 2026-12-04) reads
    the same as one computed since. Its `fixed_loss_at_flops` stand: the old count was an affine map of this one,
    the same for the curve and the rule, so the interpolation at equal FLOPs is unchanged."""
    cfg, seq_len = run_model_config(run_dir)
    recount = lambda r: {**r, "flops_per_token": flops_at(cfg, seq_len, r["attn_steps_used"], r["mlp_steps_used"])} if "attn_steps_used" in r else r  # noqa: E731
    return {**study, "curve": [recount(r) for r in study["curve"]], "rules": [recount(r) for r in study["rules"]]}


def _reuse(model, times: int) -> None:
    """Plain layer reuse at test time: every sublayer of a (Llama) model applied `times` times."""
    from cem.layers import Reuse

    for block in model.blocks:
        for name in ("attn", "mlp"):
            layer = getattr(block, name)
            inner = layer.layer if isinstance(layer, Reuse) else layer
            setattr(block, name, Reuse(inner, times) if times > 1 else inner)


@torch.no_grad()
def token_losses(model, split, seq_len: int, device, max_batches: int | None = None, batch_size: int = 16,
                 steps: list | None = None) -> torch.Tensor:
    """The next-token loss (nats) of every evaluated token of `split`, in order (float64): the windows of
    `iter_eval_batches`, the first `max_batches` batches of them (None: the whole split). With a list
    `steps`, each position's recursion steps averaged over the CEM layers are appended to it, in the same
    order (from `last_steps_used`, which adaptive or guarded steps set)."""
    model.eval()
    out = []
    for x, y in iter_eval_batches(split.tokens, seq_len, batch_size, max_batches=max_batches):
        out.append(model(x.to(device), y.to(device), reduction="none").flatten().double().cpu())
        if steps is not None:
            used = [m.last_steps_used for m in model.descent_layers()]
            steps.append(torch.stack(used).double().mean(0).flatten().cpu())
    return torch.cat(out)


# the exit rules the test-time study compares with the oracle: (rule, tolerance), evaluated at the deepest T
EXIT_RULES_STUDIED = (("energy", 1e-2), ("energy", 1e-3), ("update", 1e-2), ("update", 1e-3))


def depth_study(
    run_dir: Path,
    steps=range(1, 7),
    data_dir: str | None = None,
    max_batches: int | None = None,
    device: str = "auto",
    rules=EXIT_RULES_STUDIED,
) -> dict:
    """A trained model's test loss at each T of `steps`, per token, and what an exit rule could gain.

    `curve`: per T, the mean test loss (and perplexity, bits per byte) and forward FLOPs per token, every CEM
    layer run at T; a model without CEM layers (Llama) applies each sublayer T times instead (plain reuse).
    `oracle`: per token, the lowest loss over the T of `steps` (a bound no causal rule reaches: it reads the
    target), its mean, and how often each T is the best. `rules` (CEM models): each `(adaptive_rule,
    adaptive_tol)` at most the deepest T, per position: mean loss, average steps used, FLOPs, and the fixed-T
    curve's loss at the same FLOPs (linear between its points) to compare with. Evaluated on the first
    `max_batches` batches of 16 windows (None: the whole test split). A rule's `oracle_rank_correlation` is
    the Spearman correlation, over tokens, of its steps (averaged over the CEM layers) with the oracle's best
    T: how well the rule predicts where more steps stop helping."""
    from scipy.stats import spearmanr

    model, split, seq_len = load_run(run_dir, data_dir, device)
    dev = next(model.parameters()).device
    cem = bool(model.descent_layers())
    cfg = model.config
    per_bpb = split.n_tokens / (split.n_bytes * math.log(2))  # bits per byte = loss · tokens / (bytes · ln 2)

    def measure(adaptive: tuple[str, float] | None = None, used_steps: list | None = None) -> tuple[torch.Tensor, dict]:
        """Per-token losses and the curve row at the model's current T (with an exit rule: at most T)."""
        if cem:
            rule, tol = adaptive or ("energy", None)
            model.set_inference(Inference(adaptive_tol=tol, adaptive_rule=rule))
            model.reset_steps_used()
        losses = token_losses(model, split, seq_len, dev, max_batches, steps=used_steps)
        row = {"test_loss": float(losses.mean()), "test_perplexity": math.exp(min(float(losses.mean()), 700)),
               "test_bits_per_byte": float(losses.mean()) * per_bpb, "tokens": losses.numel()}
        if cem:
            used = model.steps_used()
            a = used["attn"] if used["attn"] is not None else cfg.attn.recursion.steps
            b = used["mlp"] if used["mlp"] is not None else cfg.mlp.recursion.steps
            row.update(attn_steps_used=a, mlp_steps_used=b, flops_per_token=flops_at(cfg, seq_len, a, b))
        return losses, row

    curve, table = [], []
    for t in steps:
        if cem:
            model.set_inference(Inference(steps=t))
        else:
            _reuse(model, t)
        losses, row = measure()
        if not cem:
            row["flops_per_token"] = forward_flops_per_token(cfg.replace(attn_reuse=t, mlp_reuse=t), seq_len)
        curve.append({"eval_steps": t, **row})
        table.append(losses)
    table = torch.stack(table)  # (len(steps), tokens)
    best = table.argmin(0)
    best_steps = torch.tensor(list(steps), dtype=torch.float64)[best]  # each token's oracle T
    oracle = {"test_loss": float(table.min(0).values.mean()),
              "best_steps_share": {str(t): float((best == i).double().mean()) for i, t in enumerate(steps)},
              "mean_best_steps": float(best_steps.mean())}
    out = {"curve": curve, "oracle": oracle, "rules": []}
    if cem:
        model.set_inference(Inference(steps=max(steps)))
        flops, fixed = [r["flops_per_token"] for r in curve], [r["test_loss"] for r in curve]
        best_steps = best_steps.numpy()
        for rule, tol in rules:
            used: list = []
            _, row = measure((rule, tol), used)
            used = torch.cat(used).numpy()
            rho = float(spearmanr(used, best_steps).statistic) if used.std() > 0 and best_steps.std() > 0 else None  # None: no spread
            row.update(rule=rule, tol=tol, eval_steps=max(steps), fixed_loss_at_flops=float(np.interp(row["flops_per_token"], flops, fixed)),
                       oracle_rank_correlation=rho)
            out["rules"].append(row)
        model.set_inference(Inference())
    return out


def depth_product(scale, variant, rules=EXIT_RULES_STUDIED) -> Product:
    """The test-time experiment's product of a variant's run: `depth_study` at the scale's `eval_steps`
    (a deeper Llama, evaluated as trained: at T=1 only) on its `test_time_batches`, with the exit rules `rules`
    (other rules than EXIT_RULES_STUDIED are named in the file's name)."""
    steps = (1,) if variant.tags.get("kind") == "deeper" else tuple(scale.eval_steps)
    batches = scale.test_time_batches
    name = "depth_study_" + "_".join(map(str, steps)) + f"_{batches or 'all'}"
    kwargs = (("max_batches", batches), ("steps", steps))
    if tuple(rules) != EXIT_RULES_STUDIED:
        name += "_" + "_".join(f"{rule}{tol:g}" for rule, tol in rules)
        kwargs = (("max_batches", batches), ("rules", tuple(rules)), ("steps", steps))
    return Product(depth_study, name + ".json", kwargs)


@torch.no_grad()
def valid_curve(run_dir: Path, steps=(1, 2), data_dir: str | None = None, max_batches: int | None = None, device: str = "auto") -> dict:
    """A trained model's validation loss at each T of `steps` (every CEM layer at T; a Llama applies each
    sublayer T times), on the first `max_batches` batches of 16 validation windows: what a choice among
    models evaluated at several depths reads, so that the test split is read only by the findings."""
    model, split, seq_len = load_run(run_dir, data_dir, device, split="valid")
    dev = next(model.parameters()).device
    cem = bool(model.descent_layers())
    curve = []
    for t in steps:
        if cem:
            model.set_inference(Inference(steps=t))
        else:
            _reuse(model, t)
        curve.append({"eval_steps": t, "valid_loss": float(token_losses(model, split, seq_len, dev, max_batches).mean())})
    return {"curve": curve}


def valid_curve_product(scale, variant) -> Product:
    """`valid_curve` of a variant's run at the scale's `eval_steps` on its `test_time_batches` of validation windows."""
    steps, batches = tuple(scale.eval_steps), scale.test_time_batches
    return Product(valid_curve, "valid_curve_" + "_".join(map(str, steps)) + f"_{batches or 'all'}.json",
                   (("max_batches", batches), ("steps", steps)))


GUARD_STUDIED = 4  # halvings of an energy-raising step in `extra_steps`' guarded evaluation


@torch.no_grad()
def extra_steps(run_dir: Path, base: int, more: int, data_dir: str | None = None, max_batches: int | None = None,
                device: str = "auto", guard: int = GUARD_STUDIED) -> dict:
    """Where evaluating past the trained depth costs: the test loss (nats) with every CEM layer at `base`
    steps (`none` more), then with some of them at `more` steps and the others still at `base`: `all`, the
    `attention` layers, the `mlp` layers, and each layer alone (`layers`, by module name). `guarded`: every
    layer at `base` and at `more` with energy-guarded steps (a step that raises the layer's energy is halved
    up to `guard` times, `cem.layers.steps`), which makes every step a descent step. `finer`: every layer at
    `more` steps with η scaled to the path length Σ_t η_t of `base` steps (η·base/more under a constant
    schedule; unchanged under η/T, whose path length is η at every T): the same path in finer steps. On the
    first `max_batches` batches of 16 test windows (None: the whole split)."""
    from contextlib import ExitStack

    from cem.layers import CEMAttention, CEMMLP

    model, split, seq_len = load_run(run_dir, data_dir, device)
    dev = next(model.parameters()).device
    named = {n: m for n, m in model.named_modules() if isinstance(m, DescentLayer)}
    if not named:
        raise ValueError(f"{run_dir}: extra_steps needs a model with CEM layers")
    model.set_inference(Inference(steps=base))

    def loss(names: list[str], finer: bool = False) -> float:
        """The loss with the layers `names` at `more` steps, the others as they are; `finer`: with η scaled so
        that the `more` steps have the path length (Σ_t η_t) of `base` steps."""
        with ExitStack() as stack:
            for n in names:
                m = named[n]
                eta = m.step_size * m.eta.path_length(base) / m.eta.path_length(more) if finer else None
                stack.enter_context(m.test_time(Inference(steps=more), step_size=eta))
            return float(token_losses(model, split, seq_len, dev, max_batches).mean())

    kinds = {"attention": [n for n, m in named.items() if isinstance(m, CEMAttention)],
             "mlp": [n for n, m in named.items() if isinstance(m, CEMMLP)]}
    out = {"base": base, "more": more, "loss": {"none": loss([]), "all": loss(list(named))}}
    out["loss"].update({kind: loss(names) for kind, names in kinds.items() if names})
    out["layers"] = {n: loss([n]) for n in named}
    with model.test_time(Inference(guard=guard)):
        out["guarded"] = {"guard": guard, "base": loss([]), "more": loss(list(named))}
    out["finer"] = loss(list(named), finer=True)
    return out


def extra_steps_product(scale, variant) -> Product:
    """The test-time experiment's second product of a CEM variant's run: `extra_steps` from its mean trained
    depth m to 2m, on a quarter of the depth study's test batches (at least one)."""
    m = variant.tags.get("mean_depth", variant.tags["steps"])
    batches = scale.test_time_batches and max(1, scale.test_time_batches // 4)
    return Product(extra_steps, f"extra_steps_{round(m)}_{round(2 * m)}_{batches or 'all'}_guard{GUARD_STUDIED}.json",
                   (("base", round(m)), ("guard", GUARD_STUDIED), ("max_batches", batches), ("more", round(2 * m))))


def test_time_products(scale, variant, seed: int | None = None, rules=EXIT_RULES_STUDIED) -> list[Product]:
    """What the test-time study reads from each run's weights: the depth study, and for a CEM model (a
    variant without a Llama `kind`) where its extra steps cost and how far its layers' outputs drift."""
    return [depth_product(scale, variant, rules)] + ([] if variant.tags.get("kind") else [extra_steps_product(scale, variant), DRIFT])


def _cached(path: Path, compute):
    if not path.exists():
        atomic_write_json(path, compute())
    return json.loads(path.read_text())


def _curve_rows(steps, runs: list[list[dict]]) -> list[dict]:
    """Seed means (with 95% intervals) of per-seed test-time curves."""
    out = []
    for i, t in enumerate(steps):
        ppl = [r[i]["test_perplexity"] for r in runs]
        row = {
            "eval_steps": t,
            "flops_per_token": mean_std([r[i]["flops_per_token"] for r in runs])[0],
            "test_perplexity": mean_std(ppl)[0],
            "test_perplexity_ci": Interval.of(ppl).to_dict(),
            "test_perplexity_per_seed": ppl,
            "test_loss_per_seed": [r[i]["test_loss"] for r in runs],
        }
        if "attn_steps_used" in runs[0][i]:
            row["steps_used"] = mean_std([(r[i]["attn_steps_used"] + r[i]["mlp_steps_used"]) / 2 for r in runs])[0]
        out.append(row)
    return out


def _mean_defined(values: list) -> float | None:
    """The mean of the values that are not None (None if there are none)."""
    defined = [v for v in values if v is not None]
    return sum(defined) / len(defined) if defined else None


def _loss_at(curve: list[dict], t: int) -> list[float] | None:
    """Per-seed test loss of a curve at evaluation depth `t` (None: not evaluated there)."""
    return next((r["test_loss_per_seed"] for r in curve if r["eval_steps"] == t), None)


def test_time_curves(c: Context, rules=EXIT_RULES_STUDIED) -> dict:
    """Every model of the experiment evaluated at each T of the scale's `eval_steps` (`depth_study`, on the
    scale's `test_time_batches`): the CEM models with every CEM layer at T, fixed and with each exit rule of
    `rules` at most the deepest T, against the per-token oracle; the Llama controls with plain
    reuse at test time, and a deeper Llama trained as such (evaluated as trained). Per CEM model also where
    its steps from m to 2m cost (`extra_steps`) and how far its layers' outputs drift (`drift`)."""
    curves, adaptive, oracle = {}, {}, {}
    run_dirs = {v.label: [c.scale.runs(c.root) / v.spec.with_seed(s).slug for s in c.scale.seeds_for("recursion")] for v in c.variants}
    for v in c.variants:
        dirs = run_dirs[v.label]
        product = depth_product(c.scale, v, rules)
        vsteps = list(dict(product.kwargs)["steps"])
        runs = [counted(d, product.get(d, c.data_dir, c.device)) for d in dirs]
        for d, r in zip(dirs, runs):  # a study is compared across seeds row by row: same depths, same exit rules
            used = [(x["rule"], x["tol"]) for x in r["rules"]]
            if [x["eval_steps"] for x in r["curve"]] != vsteps or used not in ([], [tuple(x) for x in rules]):
                raise ValueError(f"{product.path(d)} was computed at other depths or exit rules ({[x['eval_steps'] for x in r['curve']]}, "
                                 f"{used}) than this analysis compares ({vsteps}, {list(rules)}); remove it to compute it again")
        curves[v.label] = _curve_rows(vsteps, [r["curve"] for r in runs])
        oracle[v.label] = {"test_loss": mean_std([r["oracle"]["test_loss"] for r in runs])[0],
                           "mean_best_steps": mean_std([r["oracle"]["mean_best_steps"] for r in runs])[0],
                           "fixed_best_loss": mean_std([min(x["test_loss"] for x in r["curve"]) for r in runs])[0]}
        for i, (rule, tol) in enumerate((x["rule"], x["tol"]) for x in runs[0]["rules"]):
            rows = [r["rules"][i] for r in runs]
            row = _curve_rows([max(vsteps)], [[x] for x in rows])[0]
            gain = Interval.of([x["fixed_loss_at_flops"] - x["test_loss"] for x in rows])
            row.update(rule=rule, tol=tol, gain_over_fixed=gain.to_dict(),
                       regret=mean_std([x["test_loss"] - r["oracle"]["test_loss"] for x, r in zip(rows, runs)])[0],
                       oracle_rank_correlation=_mean_defined([x["oracle_rank_correlation"] for x in rows]))
            adaptive[f"{v.label}, {rule} rule, tol {tol:g}"] = [row]
    extra = {}  # where the steps from m to 2m cost: per part of the model, the paired loss increase
    drifts = {}  # how far the layers' outputs move from their inputs as T grows: the median layer, mean over seeds
    for v in c.variants:
        if v.tags.get("kind"):
            continue
        product = extra_steps_product(c.scale, v)
        runs = [product.get(d, c.data_dir, c.device) for d in run_dirs[v.label]]
        cost = {part: Interval.of([r["loss"][part] - r["loss"]["none"] for r in runs]).to_dict() for part in runs[0]["loss"] if part != "none"}
        cost.update({f"layer {name}": Interval.of([r["layers"][name] - r["loss"]["none"] for r in runs]).to_dict() for name in runs[0]["layers"]})
        knobs = {f"guarded at {m}": Interval.of([r["guarded"][k] - r["loss"]["none"] for r in runs]).to_dict() for k, m in (("base", "m"), ("more", "2m"))}
        knobs["finer at 2m"] = Interval.of([r["finer"] - r["loss"]["none"] for r in runs]).to_dict()
        extra[v.label] = {"base": runs[0]["base"], "more": runs[0]["more"], "loss": mean_std([r["loss"]["none"] for r in runs])[0],
                          "cost": cost, "knobs": knobs}
        traces = [DRIFT.get(d, c.data_dir, c.device) for d in run_dirs[v.label]]
        drifts[v.label] = {"steps": traces[0]["steps"], **{key: np.mean([np.median([r[key] for r in t["layers"].values()], axis=0) for t in traces], axis=0).tolist()
                                                              for key in ("drift", "cos_h", "radial")}}
    return {"curves": curves, "adaptive": adaptive, "oracle": oracle, "extra_steps": extra, "drift": drifts}


def twice_depth(v, curve: list[dict], family: str = "ours") -> Finding | None:
    """(ours) Evaluating `v` at twice its mean trained depth m lowers its test loss against at m: per seed, the loss of
    its run at m minus at 2m (`curve`: its test-time curve); None where the curve lacks m or 2m."""
    m = v.tags.get("mean_depth", v.tags["steps"])
    base, more = _loss_at(curve, round(m)), _loss_at(curve, round(2 * m))
    if base is None or more is None:
        return None
    means = {r["eval_steps"]: r["test_perplexity"] for r in curve}
    d = Interval.of([a - b for a, b in zip(base, more)])
    what = "applying each sublayer" if v.tags.get("kind") == "reuse" else "evaluating at"
    return Finding(
        f"(ours) {v.label}: {what} T={round(2 * m)}, twice the mean trained depth, lowers the test loss against T={round(m)}",
        d.verdict(+1),
        f"test loss at T={round(m)} minus at T={round(2 * m)}: {d.text('+.4f', 'nats')}; mean perplexity "
        + ", ".join(f"T={t}: {p:.3f}" for t, p in means.items()) + f"; lowest at T={min(means, key=means.get)}",
        d.to_dict(), family=family, p=d.p, contrast=f"{v.label} at T={round(m)} - at T={round(2 * m)}",
    )


def test_time_study(c: Context, rules=EXIT_RULES_STUDIED) -> tuple[list, dict]:
    """The test-time study (`test_time_curves`). Findings, on seed-paired test-loss differences: per CEM model, whether
    evaluating at twice its mean training depth m lowers the loss against evaluating at m (the test-time compute
    question: `twice_depth`), and how it compares there with the deeper Llama (about the same FLOPs at m = 1: twice
    the layers)."""
    extra = test_time_curves(c, rules)
    curves = extra["curves"]
    findings, answer = [], {"twice": {}, "deeper": {}}  # answer: the question in plain words (`report`)
    deeper = next((v.label for v in c.variants if v.tags.get("kind") == "deeper"), None)
    for v in c.variants:
        if v.tags.get("kind") == "deeper":
            continue
        m = v.tags.get("mean_depth", v.tags["steps"])
        more = _loss_at(curves[v.label], round(2 * m))
        if (twice := twice_depth(v, curves[v.label])) is not None:
            findings.append(twice)
            if v.tags.get("kind") != "reuse":
                answer["twice"][v.label] = {"m": round(m), "2m": round(2 * m), "verdict": twice.verdict, "difference": twice.difference}
        if deeper is not None and more is not None and v.tags.get("kind") != "reuse":
            other = curves[deeper][0]
            d = Interval.of([a - b for a, b in zip(other["test_loss_per_seed"], more)])
            at = next(r for r in curves[v.label] if r["eval_steps"] == round(2 * m))
            findings.append(Finding(
                f"(ours) {v.label} at T={round(2 * m)} beats {deeper}",
                d.verdict(+1),
                f"{deeper} minus {v.label} at T={round(2 * m)}: {d.text('+.4f', 'nats')}; forward FLOPs per token "
                f"{at['flops_per_token'] / 1e6:.2f}M vs {other['flops_per_token'] / 1e6:.2f}M",
                d.to_dict(), family="ours", p=d.p, contrast=f"{deeper} - {v.label} at T={round(2 * m)}",
            ))
            answer["deeper"][v.label] = {"2m": round(2 * m), "verdict": findings[-1].verdict, "difference": d.to_dict(), "than": deeper}
    return findings, {**extra, "answer": answer, "against_random_depth": _against_random_depth(c.variants, curves)}


def _against_random_depth(variants, curves: dict) -> dict:
    """Each other CEM model against plain random depth (group `random depth`) at the model's own m and 2m:
    the loss of random depth minus the model's, paired by seed (positive: the model is better there). A
    table of what each recipe changes, not findings."""
    plain = next((v.label for v in variants if v.tags.get("group") == "random depth"), None)
    out = {}
    for v in variants:
        if plain is None or v.label == plain or v.tags.get("kind"):
            continue
        m = v.tags.get("mean_depth", v.tags["steps"])
        cells = {}
        for name, t in (("m", round(m)), ("2m", round(2 * m))):
            ours, theirs = _loss_at(curves[v.label], t), _loss_at(curves[plain], t)
            if ours is not None and theirs is not None:
                cells[name] = {"T": t, **Interval.of([a - b for a, b in zip(theirs, ours)]).to_dict()}
        if cells:
            out[v.label] = {"than": plain, **cells}
    return out


# the test-time recipes' exit rules (issue 64): the test-time study's, and the second difference of the step size
RECIPE_RULES = EXIT_RULES_STUDIED + (("second-difference", 1e-2), ("second-difference", 1e-3))


def recipes_products(scale, variant, seed: int | None = None) -> list[Product]:
    """What the recipes studies read from each run's weights: the test-time study's products (with RECIPE_RULES),
    and for a CEM model the validation curve its choices read (a Llama control, evaluated as trained, has none)."""
    return test_time_products(scale, variant, seed, RECIPE_RULES) + ([] if variant.tags.get("kind") else [valid_curve_product(scale, variant)])


def valid_means(c: Context) -> dict[str, dict[int, float]]:
    """Each CEM model's mean validation loss over the recursion seeds at each T of its `valid_curve` (by label)."""
    runs, seeds = c.scale.runs(c.root), c.scale.seeds_for("recursion")
    out = {}
    for v in (v for v in c.variants if not v.tags.get("kind")):
        product = valid_curve_product(c.scale, v)
        curves = [product.get(runs / v.spec.with_seed(s).slug, c.data_dir, c.device)["curve"] for s in seeds]
        out[v.label] = {r["eval_steps"]: float(np.mean([cv[i]["valid_loss"] for cv in curves])) for i, r in enumerate(curves[0])}
    return out


def beats_at(c: Context, curves: dict, ours: tuple[str, int], theirs: tuple[str, int], claim: str, note: str = "") -> Finding:
    """(ours) `ours` (a label and the T it is evaluated at) has a lower test loss than `theirs`: theirs minus ours on
    their test-time `curves`, paired by seed (`by_seed`: a seed whose two runs ran on different processors is left out)."""
    (a, ta), (b, tb) = ours, theirs
    at = lambda label, t: {**row(c.rows, label), "test_loss_per_seed": _loss_at(curves[label], t)}  # noqa: E731
    pairs, dropped = by_seed([at(b, tb), at(a, ta)])
    d = Interval.of([x - y for x, y in pairs])
    return Finding(claim, d.verdict(+1), f"{b} at T={tb} minus {a} at T={ta}, test loss: {difference_text(d, dropped)}{note}",
                   d.to_dict(), family="ours", p=d.p, contrast=f"{b} at T={tb} - {a} at T={ta}")


def recipes_study(c: Context) -> tuple[list, dict]:
    """The test-time recipes (issue 64): the test-time study of every model (`test_time_study`, with
    RECIPE_RULES: each recipe's loss at twice its mean trained depth m against at m, on test), and the choices,
    made on validation only (`valid_curve`, fixed before the data): the recipes ranked by their mean validation
    loss at 2m (the depth the question asks about: low there is both a good model and one that more steps do not
    spoil), the first two confirmed at the larger sizes; and the first one at its validation-best T against the
    baseline (the variant tagged `baseline`, fixed T=2, at its trained T) on test, the one finding a choice makes."""
    findings, extra = test_time_study(c, RECIPE_RULES)
    valid = valid_means(c)
    baseline = next(v for v in c.variants if v.tags.get("baseline"))
    recipes = [v for v in c.variants if not v.tags.get("baseline") and not v.tags.get("kind")]
    twice = {v.label: valid[v.label].get(round(2 * v.tags.get("mean_depth", v.tags["steps"]))) for v in recipes}
    ranked = sorted((label for label in twice if twice[label] is not None), key=twice.get)
    choice = {"ranked_on_valid_at_2m": [{"label": label, "valid_loss_at_2m": twice[label]} for label in ranked],
              "confirm": ranked[:2], "valid_curves": {label: [{"eval_steps": t, "valid_loss": x} for t, x in c.items()] for label, c in valid.items()}}
    if ranked:
        best = ranked[0]
        t_best = min(valid[best], key=valid[best].get)
        base_t = baseline.tags["steps"]
        findings.append(beats_at(c, extra["curves"], (best, t_best), (baseline.label, base_t),
                                 f"(ours) the recipe chosen on validation, {best}, at its validation-best T={t_best} beats {baseline.label} at T={base_t}"))
        choice["best"] = {"label": best, "T": t_best, "against": baseline.label, "difference": findings[-1].difference}
    return findings, {**extra, "choice": choice}


def run_model_config(run_dir: Path) -> tuple[ModelConfig, int]:
    """A run's model config and sequence length, as its run.json records them (its live folder, else its row in the
    campaign's tables: `records.Run`)."""
    recorded = Run(run_dir).read_run()
    if recorded is None:
        raise ValueError(f"{run_dir} has no run.json, and no row in {Run(run_dir).table.path} holds it: the run is not trained here")
    cfg = ModelConfig.from_dict(recorded["model"])
    return cfg, recorded["train"].get("seq_len") or cfg.context


def flops_matched(cfg: ModelConfig, steps, budget: int, seq_len: int) -> tuple[int, int] | None:
    """The largest T of `steps` at which `cfg`'s forward FLOPs per token (`forward_flops_per_token`, every recursing CEM
    layer at T) are at most `budget`, with those FLOPs; None where none is."""
    fits = [(t, f) for t in steps if (f := forward_flops_per_token(cfg.at(Inference(steps=t)), seq_len)) <= budget]
    return max(fits) if fits else None


def recipes_confirm_study(c: Context) -> tuple[list, dict]:
    """The confirmation of the screening's two recipes (issue 64), at each size: the test-time curves of every model
    (`test_time_curves`, with RECIPE_RULES); per recipe, its test loss at 2m against at m (`twice_depth`, the Holm
    family TWICE: 2 recipes x the sizes, fixed before the data); the first recipe at its validation-best T against
    fixed T=2 at its trained T, and at the most forward FLOPs per token up to the deeper Llama's (`flops_matched`)
    against that Llama as trained (`beats_at`, paired by seed)."""
    extra = test_time_curves(c, RECIPE_RULES)
    curves, valid = extra["curves"], valid_means(c)
    runs, seed = c.scale.runs(c.root), c.scale.seeds_for("recursion")[0]
    findings, confirm = [], {}
    for size in c.scale.sizes:
        here = [v for v in c.variants if v.spec.size == size]
        baseline = next(v for v in here if v.tags.get("baseline"))
        deeper = next(v for v in here if v.tags.get("kind") == "deeper")
        recipes = sorted((v for v in here if "recipe" in v.tags), key=lambda v: v.tags["recipe"])
        findings += [f for v in recipes if (f := twice_depth(v, curves[v.label], TWICE)) is not None]
        first = recipes[0]
        t_best = min(valid[first.label], key=valid[first.label].get)
        base_t = baseline.tags["steps"]
        findings.append(beats_at(c, curves, (first.label, t_best), (baseline.label, base_t),
                                 f"(ours) {size}: the screening's first recipe, {first.label}, at its validation-best T={t_best} beats {baseline.label} at T={base_t}"))
        llama_cfg, seq_len = run_model_config(runs / deeper.spec.with_seed(seed).slug)
        budget = forward_flops_per_token(llama_cfg, seq_len)
        cem_cfg, _ = run_model_config(runs / first.spec.with_seed(seed).slug)
        steps = [r["eval_steps"] for r in curves[first.label]]
        entry = {"recipes": [v.label for v in recipes], "first": first.label, "valid_best_T": t_best,
                 "valid_curve": [{"eval_steps": t, "valid_loss": x} for t, x in valid[first.label].items()],
                 "deeper": deeper.label, "deeper_flops_per_token": budget}
        if (match := flops_matched(cem_cfg, steps, budget, seq_len)) is not None:
            t, flops = match
            entry.update(matched_T=t, flops_per_token=flops, flops_ratio=flops / budget)
            findings.append(beats_at(
                c, curves, (first.label, t), (deeper.label, 1),
                f"(ours) {size}: the screening's first recipe, {first.label}, at T={t}, the deepest T within the forward FLOPs per token of {deeper.label}, beats it",
                f"; forward FLOPs per token {flops:,} at T={t} vs {budget:,} (ratio {flops / budget:.3f})"))
        confirm[size] = entry
    return findings, {**extra, "confirmation": confirm}


def _layer_inputs(model, ids: torch.Tensor) -> dict[str, tuple[DescentLayer, torch.Tensor]]:
    """Every CEM layer of `model` (by module name) with its true input h in a forward pass of `ids`."""
    inputs: dict[str, torch.Tensor] = {}
    layers = {name: m for name, m in model.named_modules() if isinstance(m, DescentLayer)}
    hooks = [m.register_forward_pre_hook(lambda mod, args, name=name: inputs.__setitem__(name, args[0])) for name, m in layers.items()]
    try:
        model(ids)
    finally:
        for h in hooks:
            h.remove()
    return {name: (layer, inputs[name]) for name, layer in layers.items()}


def _first_windows(run_dir: Path, n_seqs: int, data_dir: str | None, device: str):
    """The trained model and the first `n_seqs` windows of its test split, as ids on the model's device."""
    model, split, seq_len = load_run(run_dir, data_dir, device)
    dev = next(model.parameters()).device
    ids = torch.from_numpy(split.tokens[: n_seqs * seq_len].astype("int64")).view(n_seqs, seq_len).to(dev)
    return model, ids


@torch.no_grad()
def energy_trace(run_dir: Path, max_steps: int = 4, n_seqs: int = 4, data_dir: str | None = None, device: str = "auto") -> list[dict]:
    """For every CEM layer of a trained model: the mean energy over held-out positions at steps t = 0..max_steps,
    each step taken from the layer's true input h (context fixed), as in the forward pass."""
    model, ids = _first_windows(run_dir, n_seqs, data_dir, device)
    rows = []
    for name, (layer, h) in _layer_inputs(model, ids).items():
        trained = layer.steps
        x0, _ = layer.start_point(h, layer.norm(h))
        energies = []
        for t in range(max_steps + 1):
            x = x0
            if t > 0:
                with layer.test_time(Inference(steps=t)):
                    x = layer(h)
            energies.append(layer.energy(layer.norm(x), h).mean().item())
        kind = SUBLAYERS[layer.sublayer].label
        rows.append({"layer": name, "kind": kind, "trained_steps": trained, "energy": energies})
    return rows


DRIFT_STEPS = (1, 2, 4, 8, 16)


@torch.no_grad()
def drift(run_dir: Path, steps: tuple = DRIFT_STEPS, n_seqs: int = 4, data_dir: str | None = None, device: str = "auto") -> dict:
    """How far each CEM layer's output x^(T) moves from its input h as T grows (`cem.layers.steps`, `anchor`):
    per T, the mean over positions of ‖x^(T) − h‖ / ‖h‖ (`drift`) and of cos(x^(T), h) (`cos_h`), and between
    successive T the mean cos(x^(T') − x^(T), x^(T)) (`radial`: 1 when the later steps only lengthen x). From
    each layer's true input in a forward pass at the trained depth, on the first `n_seqs` test windows."""
    model, ids = _first_windows(run_dir, n_seqs, data_dir, device)
    cos = lambda a, b: torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=-1).mean().item()  # noqa: E731
    layers = {}
    for name, (layer, h) in _layer_inputs(model, ids).items():
        outs = []
        for t in steps:
            with layer.test_time(Inference(steps=t)):
                outs.append(layer(h))
        layers[name] = {"drift": [((x - h).norm(dim=-1) / h.norm(dim=-1)).mean().item() for x in outs],
                        "cos_h": [cos(x, h) for x in outs],
                        "radial": [cos(b - a, a) for a, b in zip(outs, outs[1:])]}
    return {"steps": list(steps), "layers": layers}


def energy_study(c: Context) -> tuple[list, dict]:
    """The energy trace of the first seed's model; does each trained step (and each step beyond) descend?"""

    run_dir = c.scale.runs(c.root) / c.variants[0].spec.with_seed(c.scale.seeds[0]).slug
    trace = ENERGY.get(run_dir, c.data_dir, c.device)
    findings = []
    for kind in ("attention", "mlp"):
        rs = [r for r in trace if r["kind"] == kind]
        trained = rs[0]["trained_steps"]
        within = [r["energy"][t + 1] < r["energy"][t] for r in rs for t in range(trained)]
        beyond = [r["energy"][t + 1] < r["energy"][t] for r in rs for t in range(trained, len(r["energy"]) - 1)]
        findings.append(Finding(
            f"(ours) {kind}: the trained steps descend the layer's energy",
            "held" if all(within) else ("not held" if not any(within) else "inconclusive"),
            f"{sum(within)}/{len(within)} (layer, step) pairs within the trained T={trained} lower the energy; "
            f"{sum(beyond)}/{len(beyond)} beyond it (one seed)",
            family="ours", kind="count",
        ))
    return findings, {"energy": trace}


def gp_study(c: Context) -> tuple[list, dict]:
    """Table 3: the GP regression study at the scale's GP setting; T=8 against T=1, paired by seed."""
    from .gp_regression import run_gp_study, summarize

    # a few steps per run (the smoke scale, a rehearsal): the tiny GP setting
    gp_scale = "tiny" if c.scale.max_steps is not None else {"micro": "cpu"}.get(c.scale.name, c.scale.name)
    rows = run_gp_study(seeds=c.scale.seeds, scale=gp_scale, out_dir=c.out, progress=True)
    summary = summarize(rows)
    findings = []
    for kernel in dict.fromkeys(r["kernel"] for r in rows):
        ts = sorted({r["steps"] for r in rows if r["kernel"] == kernel})
        first, last = ts[0], ts[-1]
        by = {(r["steps"], r["seed"]): r["rmse"] for r in rows if r["kernel"] == kernel}
        seeds = sorted({s for (_, s) in by})
        d = Interval.of([by[(first, s)] - by[(last, s)] for s in seeds])
        means = ", ".join(f"T={r['steps']}: {r['rmse_mean']:.4f} ± {r['rmse_std']:.4f}" for r in summary if r["kernel"] == kernel)
        findings.append(Finding(
            f"{kernel}: more recursion steps lower the regression error (T={last} vs T={first})",
            d.verdict(+1),
            f"{means}; RMSE at T={first} minus at T={last}: {d.text('+.4f')}",
            d.to_dict(), p=d.p,
        ))
    return findings, {"gp_rows": summary}


def size_trend(c: Context, gaps: list[tuple[str, str, str]]) -> tuple[list, dict]:
    """Each gap (variant prefix, baseline prefix, name) at every size, paired by seed in test loss, and its
    linear trend in log(total parameters of the Llama baseline), fitted on the size means with the size as the
    unit (weighted least squares, weights 1/se² of each mean, residual scale estimated: an interval with k - 2
    degrees of freedom for k sizes). Inside the tested range only: never extrapolated. Where fig3a was analysed
    at the base size, full CEM's point there is taken at its own best rate (the rate-fair point; the paper's
    rule trains it at Llama's, which handicaps it at a size where the two optima differ) and the fit at the
    paper's rule is kept beside it."""
    findings, trend = [], {}
    for variant, baseline, name in gaps:
        points = [_gap_point(c, f"{variant} {z}", f"{baseline} {z}", z) for z in c.scale.sizes]
        entry = {"points": points, **_means_fit(points)}
        fair = _rate_fair(c, variant, baseline, points)
        if fair is not None:
            entry = {"points": fair, **_means_fit(fair), "paper_rule": entry}
        if "slope" in entry:
            slope = Interval(**entry["slope"])
            pts = entry["points"]
            findings.append(Finding(
                f"(ours) {name}: the gap narrows in CEM's favour as the models grow (slope of the loss gap in log(parameters) < 0)",
                slope.verdict(-1),
                "gap per size (nats): " + "; ".join(_point_text(p) for p in pts)
                + f"; slope on the {len(pts)} size means ({entry['fit']}) {slope.mean:+.4f} nats per e-fold of parameters [95% CI {slope.lo:+.4f}, {slope.hi:+.4f}], "
                f"p = {slope.p:.2g}, within the tested sizes only"
                + (f"; at the paper's rule (full CEM at Llama's rate everywhere) {_slope_text(entry['paper_rule'])}" if "paper_rule" in entry else ""),
                slope.to_dict(), family="ours", p=slope.p, sign=-1,
            ))
        trend[name] = entry
    return findings, {"trend": trend}


def _gap_point(c: Context, a_label: str, b_label: str, size: str, **extra) -> dict:
    a, b = row(c.rows, a_label), row(c.rows, b_label)
    d = Interval.of(d_values(a, b))
    return {"size": size, "parameters": b["parameters"], "log_parameters": math.log(b["parameters"]), **d.to_dict(), **extra}


def _point_text(p: dict) -> str:
    """A size's gap: its mean and 95% interval over seeds (one seed: no interval)."""
    spread = f"[{p['lo']:+.4f}, {p['hi']:+.4f}]" if p["n"] > 1 else f"({p['n']} seed, no interval)"
    return f"{p['size']}{' (own rate)' if p.get('own_rate') else ''} {p['mean']:+.4f} {spread}"


def _means_fit(points: list[dict]) -> dict:
    """The slope of the gap means in log(parameters), weighted by 1/se² (equal weights where a mean has no
    interval), with the residual scale estimated (statsmodels WLS); {} with fewer than 3 sizes."""
    import statsmodels.api as sm

    if len([p for p in points if p["n"] > 0]) < 3 or any(p["n"] == 0 for p in points):
        return {"unfitted": "fewer than three sizes with a gap on one processor"}
    x = np.array([p["log_parameters"] for p in points])
    y = np.array([p["mean"] for p in points])
    se = np.array([(p["hi"] - p["mean"]) / _t975(p["n"]) if p["n"] > 1 else math.nan for p in points])
    weighted = bool(np.all(np.isfinite(se) & (se > 0)))
    fit = sm.WLS(y, sm.add_constant(x), weights=1 / se**2 if weighted else np.ones_like(y)).fit()
    lo, hi = fit.conf_int(0.05)[1]
    return {"slope": Interval(float(fit.params[1]), float(lo), float(hi), len(points), float(fit.pvalues[1])).to_dict(),
            "intercept": float(fit.params[0]), "fit": "weights 1/se²" if weighted else "equal weights: a size has one seed"}


def _t975(n: int) -> float:
    from scipy import stats

    return float(stats.t.ppf(0.975, n - 1))


def _slope_text(entry: dict) -> str:
    if "slope" not in entry:
        return f"not fitted ({entry.get('unfitted', 'fewer than three sizes')})"
    s = entry["slope"]
    return f"slope {s['mean']:+.4f} [95% CI {s['lo']:+.4f}, {s['hi']:+.4f}], p = {s['p']:.2g}"


def _rate_fair(c: Context, variant: str, baseline: str, points: list[dict]) -> list[dict] | None:
    """The full-CEM points with the base size's taken at full CEM's own best rate from fig3a's summary in the
    same results folder (its best grid rate on validation, every seed), or None where there is none."""
    path = c.root / "fig3a" / "summary.json"
    if variant != "full CEM" or not path.exists():
        return None
    fig3a = json.loads(path.read_text())
    best = fig3a.get("optima", {}).get("CEM (T=2, diag+low-rank)")
    if best is None:
        return None
    base = c.scale.base
    cem = next(r for r in fig3a["rows"] if r["label"] == best["best_label"])
    llama = row(c.rows, f"{baseline} {base}")
    if cem["seeds"] != llama["seeds"]:
        return None
    local = Context(c.scale, [cem, llama], [], c.root, c.out)
    fair = _gap_point(local, cem["label"], llama["label"], base, own_rate=True, lr=cem["lr"])
    return [fair if p["size"] == base else p for p in points]


def d_values(a: dict, b: dict) -> list[float]:
    """Per-seed test-loss differences a - b (paired by seed; a seed whose runs ran on two processors is left out)."""
    return [x - y for x, y in by_seed([a, b])[0]]


REGIME_ORDERS = (5, 6, 7, 8)  # the n-grams a size's Llama must beat (the best of them) before it can speak to attention claims
# each scoring's key suffix in `ngram_baseline`'s record; the first decides: the transformer's own disjoint windows
REGIME_SCORINGS = {"windowed": "_windowed", "unbroken": ""}
SHORT_CONTEXT = (8, 16)  # positions whose loss stands for "a few tokens of context" in the context-use check


@torch.no_grad()
def position_losses(model, tokens, seq_len: int, batch_size: int = 16, device: str = "auto") -> list[float]:
    """Mean next-token loss at each position 0..seq_len-1 of the split's full windows (the windows of
    `evaluate`, whose mean over all positions it equals): how the loss falls as a model sees more context."""
    device = pick_device(device)
    total, n = torch.zeros(seq_len, dtype=torch.float64), 0
    for x, y in iter_eval_batches(tokens, seq_len, batch_size):
        if x.shape[1] < seq_len:  # the final partial window: not every position is present
            break
        total += model(x.to(device), y.to(device), reduction="none").double().sum(0).cpu()
        n += x.shape[0]
    if n == 0:
        raise ValueError(f"the split has {len(tokens)} tokens, fewer than one window of {seq_len + 1}")
    return (total / n).tolist()


def context_use(run_dir: Path, data_dir: str | None = None, device: str = "auto") -> dict:
    """Validation loss by position of a trained run: at positions SHORT_CONTEXT (a few tokens seen) and in
    the second half of the window. A model whose loss stops falling after a few positions uses no more
    context than an n-gram model does (the in-context learning score of Olsson et al. 2022, per window)."""
    run = RunDir(run_dir)
    model, state = run.load_checkpoint()
    train = state["run"]["train"]
    split = run_split(run, train, "valid", data_dir)
    seq_len = train["seq_len"] or model.config.context
    losses = position_losses(model.to(pick_device(device)).eval(), split.tokens, seq_len, device=device)
    a, b = SHORT_CONTEXT
    return {"seq_len": seq_len, "short": [a, b], "short_loss": sum(losses[a:b]) / (b - a),
            "long_loss": sum(losses[seq_len // 2:]) / (seq_len - seq_len // 2), "by_position": losses}


ENERGY = Product(energy_trace, "energy.json")  # of the energy experiment's first seed
DRIFT = Product(drift, "drift_" + "_".join(map(str, DRIFT_STEPS)) + ".json")  # of every CEM model of the test-time experiment
CONTEXT_USE = Product(context_use, "context_use.json")  # of the Llama runs at each size's chosen rate


def regime_against(llama: list[float], ngrams: list[dict], split: str = "valid") -> dict:
    """Llama minus each n-gram on `split` per seed (95% t intervals over the seeds), under each scoring
    (`REGIME_SCORINGS`): the best order (lowest validation loss), the orders that beat Llama (mean above zero, and
    with the interval above zero), and whether Llama speaks there: its interval against the best order below zero."""
    out = {}
    for scoring, suffix in REGIME_SCORINGS.items():
        minus = {g["order"]: Interval.of([x - g[f"{split}_loss{suffix}"] for x in llama]) for g in ngrams}
        best = min(ngrams, key=lambda g: g[f"valid_loss{suffix}"])["order"]
        out[scoring] = {"best_order": best, "minus_best": minus[best].to_dict(),
                        "minus": [{"order": o, **d.to_dict()} for o, d in minus.items()],
                        "beating": [o for o, d in minus.items() if d.mean > 0],
                        "beating_on_interval": [o for o, d in minus.items() if d.n > 1 and d.lo > 0],
                        "speaks": minus[best].n > 1 and minus[best].verdict(-1) == "held"}  # one seed has no interval
    return out


def orders_text(orders: list[int]) -> str:
    """Orders as words: "the 7- and 8-gram", "no n-gram"."""
    if not orders:
        return "no n-gram"
    names = [f"{o}-" for o in orders[:-1]] + [f"{orders[-1]}-gram"]
    return "the " + (names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1])


def orders_beating(orders: list[int], whom: str = "Llama") -> str:
    """Which orders beat `whom`, in words: "the 7- and 8-gram beat Llama", "no n-gram beats Llama"."""
    return f"{orders_text(orders)} beat{'s' if len(orders) <= 1 else ''} {whom}"


def regime_ngrams(c: Context, size: str, row: dict, spec) -> tuple[list[dict], int, int]:
    """The n-grams of `REGIME_ORDERS` a size's baseline (summary row `row`, trained as `spec`) is checked against: fit
    on min(its budget, the train split) training tokens (at a scale cut to `max_steps`, a rehearsal's, the tokens its
    runs saw) and scored in its windows; the fits cached in one file, `ngram_cache` (one not fit or scored as this
    check needs is fit again). Returns (the fits, tokens, window)."""
    from .ngram import _splits, ngram_baseline

    splits, vocab = _splits(c.scale.data, c.scale.tokenizer, c.data_dir)
    tokens = min(row["budget_tokens"] if c.scale.max_steps is None else row["tokens"], len(splits["train"]))
    window = dict(spec.train).get("seq_len") or c.scale.seq_len  # the context the baseline is trained and scored at

    def fit(order: int) -> dict:
        part = {"train": splits["train"][:tokens], "valid": splits["valid"], "test": splits["test"]}
        return ngram_baseline(part, vocab, order, window=window)

    path = ngram_cache(c.out, size)
    fits = {g["order"]: g for g in (json.loads(path.read_text())["fits"] if path.exists() else [])}
    for order in REGIME_ORDERS:
        g = fits.get(order)
        if g is None or g.get("window") != window or g.get("train_tokens") != tokens:  # not fit or scored as this check needs
            fits[order] = fit(order)
            atomic_write_json(path, {"fits": [fits[o] for o in sorted(fits)]})
    return [fits[o] for o in REGIME_ORDERS], tokens, window


def ngram_cache(out: Path, size: str) -> Path:
    """The file holding a size's n-gram fits of the regime check, every order: OUT/ngram-SIZE.json, {"fits": [...]}."""
    return Path(out) / f"ngram-{size}.json"


def regime_finding(size: str, who: str, row: dict, ngrams: list[dict], tokens: int, window: int) -> tuple[Finding, dict]:
    """(regime) `who` of `size` (summary row `row`, every seed) beats the best n-gram on validation in the transformer's
    windows, on the interval over its seeds (`regime_against`; the unbroken text is stated beside it), and that comparison."""
    against = regime_against(row["valid_loss_per_seed"], ngrams)
    windowed, unbroken = against["windowed"], against["unbroken"]
    d = Interval(**windowed["minus_best"])
    lo, hi = REGIME_ORDERS[0], REGIME_ORDERS[-1]
    scored = lambda scoring: (  # noqa: E731
        f"{scoring}: " + ", ".join(f"{g['order']}-gram {math.exp(g['valid_loss' + REGIME_SCORINGS[scoring]]):.3f}" for g in ngrams)
        + f"; {who} - the best, the {against[scoring]['best_order']}-gram: "
        + Interval(**against[scoring]["minus_best"]).text("+.4f", "nats", "seeds")
        + f"; {orders_beating(against[scoring]['beating'], who)}"
        + (f" ({orders_text(against[scoring]['beating_on_interval'])} on the interval)" if against[scoring]["beating"] else ""))
    finding = Finding(
        f"(regime) {size}: the {who} baseline beats the best of the {lo}- to {hi}-gram models, the {windowed['best_order']}-gram, "
        f"fit on the same {tokens:,} training tokens and scored in the transformer's {window}-token windows",
        d.verdict(-1) if d.n > 1 else "inconclusive",  # a size speaks only when the interval over its seeds excludes zero
        f"validation perplexity: {who} {math.exp(row['valid_loss']):.3f} (lr {row['lr']:g}, seeds {row['seeds']}); "
        f"{scored('windowed')}; {scored('unbroken')} (on the unbroken text {who} "
        + ("also beats the best" if unbroken["speaks"] else "does not beat the best on the interval") + ")",  # a deterministic n-gram: nothing paired
        d.to_dict(), family="ours", p=d.p, sign=-1,
    )
    return finding, against


def regime_check(c: Context, chosen: dict) -> tuple[list, dict]:
    """Is each size's Llama baseline (at its chosen rate, every seed) better than the best count-based n-gram of
    `REGIME_ORDERS` fit on the same number of training tokens (`regime_ngrams`, `regime_finding`)? Judged on
    validation loss in the transformer's disjoint windows (the fair comparison); a size that is not is at n-gram level
    and its attention findings say little. Also: does it use more than a few tokens of context (`context_use`)?"""
    findings, out = [], {}
    for size, pick in chosen.items():
        best = next(r for r in c.rows if r["group"] == size and r["lr"] == pick["lr"])
        spec = next(v.spec for v in c.variants if v.label == best["label"])
        ngrams, tokens, window = regime_ngrams(c, size, best, spec)
        every = next((r for r in c.rows if r.get("regime") and r["size"] == size), best)  # the Llama at the chosen rate, every seed
        finding, against = regime_finding(size, "Llama", {**every, "lr": pick["lr"]}, ngrams, tokens, window)
        d = Interval(**against["windowed"]["minus_best"])
        dirs = [c.scale.runs(c.root) / spec.with_seed(s).slug for s in best["seeds"]]
        uses = [CONTEXT_USE.get(d, c.data_dir, c.device) for d in dirs]
        gain = Interval.of([u["long_loss"] - u["short_loss"] for u in uses])
        out[size] = {"llama_valid_loss": every["valid_loss"], "seeds": every["seeds"], "window": window, "ngrams": ngrams,
                     "against": against, "speaks": against["windowed"]["speaks"], "difference": d.to_dict(),
                     "context": {"short": uses[0]["short"], "short_loss": sum(u["short_loss"] for u in uses) / len(uses),
                                 "long_loss": sum(u["long_loss"] for u in uses) / len(uses), "gain": gain.to_dict()}}
        findings.append(finding)
        a, b = SHORT_CONTEXT
        findings.append(Finding(
            f"(regime) {size}: the Llama baseline uses more than {b} tokens of context (validation loss lower in the second half "
            f"of its window than at positions {a}-{b - 1})",
            gain.verdict(-1),
            f"loss at positions {a}-{b - 1} {out[size]['context']['short_loss']:.4f}, in the second half "
            f"{out[size]['context']['long_loss']:.4f}; difference {gain.text('+.4f', 'nats')}",
            gain.to_dict(), family="ours", p=gain.p, sign=-1,
        ))
    return findings, {"regime": out}
