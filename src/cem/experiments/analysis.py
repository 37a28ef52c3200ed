"""Analyses that go beyond training runs' final metrics: test-time recursion (a trained model evaluated
at other T, with its FLOPs per token), the energy at each recursion step, and the GP regression study."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..device import pick_device
from ..io import atomic_write_json
from ..data import build_split, load_corpus, load_tokenizer
from ..layers.steps import DescentLayer
from ..model.flops import forward_flops_per_token
from ..training import RunDir
from ..training.evaluate import evaluate
from .stats import Interval, mean_std


def load_run(run_dir: Path, data_dir: str | None = None, device: str = "auto"):
    """The trained model (on `device`), its test split and sequence length, from a run directory."""
    run = RunDir(run_dir)
    model, state = run.load_checkpoint()
    train = state["run"]["train"]
    tokenizer = load_tokenizer(run.tokenizer_dir)
    corpus = load_corpus(train["data"], data_dir or train.get("data_dir"))
    split = build_split(corpus, tokenizer, "test")
    return model.to(pick_device(device)).eval(), split, train["seq_len"] or model.config.context


def test_time_curve(run_dir: Path, steps=range(1, 7), data_dir: str | None = None, max_batches: int | None = None, device: str = "auto") -> list[dict]:
    """Test perplexity and forward FLOPs per token of a trained model with every CEM layer run at T = each of `steps`."""
    model, split, seq_len = load_run(run_dir, data_dir, device)
    dev = next(model.parameters()).device
    rows = []
    for t in steps:
        model.set_steps(t)
        m = evaluate(model, split, seq_len, 16, dev, max_batches)
        flops = forward_flops_per_token(model.current_config(), seq_len)
        rows.append({"eval_steps": t, "test_perplexity": m["perplexity"], "test_bits_per_byte": m["bits_per_byte"], "flops_per_token": flops})
    return rows


def _cached(path: Path, compute):
    if not path.exists():
        atomic_write_json(path, compute())
    return json.loads(path.read_text())


def test_time_study(c) -> tuple[list, dict]:
    """Every model of the experiment evaluated at each T of the scale's `eval_steps`; per model, the
    finding "more test-time steps than trained lower perplexity", on seed-paired differences."""
    from .registry import Finding

    steps = list(c.scale.eval_steps)
    curves, per_seed = {}, {}
    for v in c.variants:
        runs = []
        for s in c.scale.seeds_for("recursion"):
            run_dir = c.root / "runs" / v.spec.with_seed(s).slug
            name = "test_time_" + "_".join(map(str, steps)) + ".json"
            runs.append(_cached(run_dir / name, lambda: test_time_curve(run_dir, steps, c.data_dir, device=c.device)))
        per_seed[v.label] = runs
        curves[v.label] = [
            {
                "eval_steps": t,
                "flops_per_token": runs[0][i]["flops_per_token"],
                "test_perplexity": mean_std([r[i]["test_perplexity"] for r in runs])[0],
                "test_perplexity_ci": Interval.of([r[i]["test_perplexity"] for r in runs]).to_dict(),
                "test_perplexity_per_seed": [r[i]["test_perplexity"] for r in runs],
            }
            for i, t in enumerate(steps)
        ]
    findings = []
    for v in c.variants:
        trained = v.tags["steps"]
        at = {r["eval_steps"]: r["test_perplexity_per_seed"] for r in curves[v.label]}
        means = {t: mean_std(p)[0] for t, p in at.items()}
        best = min(means, key=means.get)
        for more in sorted({trained + 1, max(steps)}):
            if more not in at or more <= trained:
                continue
            d = Interval.of([a - b for a, b in zip(at[trained], at[more])])
            findings.append(Finding(
                f"(ours) {v.label}: evaluating at T={more} instead of the trained T={trained} lowers perplexity",
                d.verdict(+1),
                f"perplexity at T={trained} minus at T={more}: {d.text()}; means " + ", ".join(f"T={t}: {p:.3f}" for t, p in means.items()) + f"; best T={best}",
                d.to_dict(),
            ))
    return findings, {"curves": curves}


@torch.no_grad()
def energy_trace(run_dir: Path, max_steps: int = 4, n_seqs: int = 4, data_dir: str | None = None, device: str = "auto") -> list[dict]:
    """For every CEM layer of a trained model: the mean energy over held-out positions at steps t = 0..max_steps,
    each step taken from the layer's true input h (context fixed), as in the forward pass."""
    model, split, seq_len = load_run(run_dir, data_dir, device)
    dev = next(model.parameters()).device
    ids = torch.from_numpy(split.tokens[: n_seqs * seq_len].astype("int64")).view(n_seqs, seq_len).to(dev)
    inputs: dict[str, torch.Tensor] = {}
    layers = {name: m for name, m in model.named_modules() if isinstance(m, DescentLayer)}
    hooks = [m.register_forward_pre_hook(lambda mod, args, name=name: inputs.__setitem__(name, args[0])) for name, m in layers.items()]
    model(ids)
    for h in hooks:
        h.remove()
    rows = []
    for name, layer in layers.items():
        h, trained = inputs[name], layer.steps
        x0, _ = layer.start_point(h, layer.norm(h))
        energies = []
        for t in range(max_steps + 1):
            x = x0
            if t > 0:
                layer.steps = t
                x = layer(h)
            energies.append(layer.energy(layer.norm(x), h).mean().item())
        layer.steps = trained
        kind = "attention" if ".attn" in name else "mlp"
        rows.append({"layer": name, "kind": kind, "trained_steps": trained, "energy": energies})
    return rows


def energy_study(c) -> tuple[list, dict]:
    """The energy trace of the first seed's model; does each trained step (and each step beyond) descend?"""
    from .registry import Finding

    run_dir = c.root / "runs" / c.variants[0].spec.with_seed(c.scale.seeds[0]).slug
    trace = _cached(run_dir / "energy.json", lambda: energy_trace(run_dir, data_dir=c.data_dir, device=c.device))
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
        ))
    return findings, {"energy": trace}


def gp_study(c) -> tuple[list, dict]:
    """Table 3: the GP regression study at the scale's GP setting; T=8 against T=1, paired by seed."""
    from .gp_regression import run_gp_study, summarize
    from .registry import Finding

    gp_scale = {"smoke": "tiny"}.get(c.scale.name, c.scale.name)
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
            d.to_dict(),
        ))
    return findings, {"gp_rows": summary}
