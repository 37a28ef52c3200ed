"""The experiment suite: the protocol of every scale, shared runs, paired statistics and verdicts, one
experiment end to end with resume, the report's budget check, test-time and energy analyses."""

import json
import math
import shutil
from dataclasses import replace

import numpy as np
import pytest
import torch

from cem_study import ALL_IDS, EXPERIMENTS, SCALES, SUITE_ORDER, RunSpec, akima_optimum, get_scale, run_experiment, write_report
from cem_study.findings import Finding, adjust, close, gains_more, lower, not_worse
from cem_study.lr import extend
from cem_study.scales import LearningRateNotChosen
from cem_study.runner import _specs
from cem_study.stats import Interval, ci_halfwidth
from cem_study.sweep import run_config
from cem.io import atomic_write_json
from cem.model.params import chinchilla_tokens
from cem.training.budget import Budget


def smoke(corpus, **kw):
    return dict(data=str(corpus), **kw)


def chosen(s, lr=4e-3):
    """The scale as after its learning-rate sweeps (every size at `lr`)."""
    return replace(s, chosen_lrs=tuple((z, lr) for z in s.sizes)) if s.lr_sweep else s


@pytest.fixture
def screened(tmp_path, monkeypatch):
    """The confirmation's recipes as if the screening had chosen them: two it could choose at every size."""
    from cem_study import registry

    screening = tmp_path / "summary.json"
    screening.write_text(json.dumps({"seeds": list(get_scale(registry.SCREENING_SCALE).seeds_for("recursion")), "choice": {"confirm": ["full CEM, T~U{1..3}, gated steps", "full CEM, curriculum T=1→2→4"]}}))
    monkeypatch.setattr(registry, "SCREENING", screening)


def test_every_experiment_is_defined_at_every_scale(screened):
    assert set(ALL_IDS) == set(SUITE_ORDER) == {
        "fig2a", "fig2b", "fig2c", "fig2d", "fig3a", "fig3b", "fig3c", "fig4", "fig4-alibi", "table3",
        "step-size", "positional", "readings", "test-time", "energy", "recipes", "recipes-confirm", "lr", "size-trend",
    }
    for scale in SCALES:
        s = chosen(get_scale(scale))
        for exp in EXPERIMENTS.values():
            if exp.variants is not None:
                variants = exp.variants(s)
                assert variants and len({v.label for v in variants}) == len(variants)


@pytest.mark.slow
@pytest.mark.parametrize("scale", ["cpu", "gpu", "paper"])
def test_reported_scales_train_every_run_to_the_chinchilla_budget_with_the_paper_warmup(scale, screened):
    s = chosen(get_scale(scale))
    assert s.findings and s.max_steps is None and s.tokens == "chinchilla"
    assert len(s.seeds) >= (1 if scale == "paper" else 3) and len(s.recursion_seeds) >= (1 if scale == "paper" else 5)
    specs = list(dict.fromkeys(x for i in SUITE_ORDER for x in _specs(i, s)))
    for spec in specs[:: max(1, len(specs) // 25)]:
        run = run_config(spec, s, None)
        assert run.train.warmup_frac == 0.05 and run.train.max_steps is None
        vocab = 256 if s.tokenizer == "byte" else 8192
        cfg = run.model(vocab)
        tokens = Budget.of(run.train, cfg, run.train.seq_len, 1).trained_tokens
        assert tokens >= chinchilla_tokens(spec.size, vocab, cfg.context)


def test_recursion_experiments_use_five_seeds_at_cpu_scale():
    s = get_scale("cpu")
    for exp_id in ("fig2c", "fig2d", "fig3c", "fig4", "step-size", "test-time"):
        assert EXPERIMENTS[exp_id].seeds == "recursion" and len(s.seeds_for("recursion")) == 5


@pytest.mark.parametrize("exp_id, sublayer", [("fig3c", "mlp"), ("fig4", "attn")])
def test_recursion_is_also_set_against_the_cem_sublayer_applied_twice(exp_id, sublayer):
    """fig3c / fig4 carry the CEM sublayer applied twice as a block (plain reuse of the same weights), and a control
    finding reads recursion's loss change against its: (T2 - T1) - (x2 - T1) = T2 - x2, paired by seed (negative:
    recursion better, the side the claim favours)."""
    from cem_study.findings import Context

    s = chosen(get_scale("cpu"))
    variants = {v.label: v for v in EXPERIMENTS[exp_id].variants(s)}
    name = {"mlp": "CEM MLP", "attn": "CEM attention"}[sublayer]
    twice, one = variants[f"{name} x2"].spec, variants[f"{name} T=1"].spec
    assert twice.arch == one.arch and dict(twice.model) == {**dict(one.model), f"{sublayer}_reuse": 2}
    loss = {label: (1.0, 1.1, 1.2) for label in variants}
    loss[f"{name} T=2"] = (0.99, 1.09, 1.19)  # recursion gains 0.01 on every seed, reuse of the CEM sublayer 0.03
    loss[f"{name} x2"] = (0.97, 1.07, 1.17)
    findings, _ = EXPERIMENTS[exp_id].analyze(Context(s, rows(**loss), list(variants.values()), None, None))
    (f,) = [f for f in findings if "same CEM sublayer applied twice" in f.claim]
    assert f.family == "control" and f.verdict == "not held" and f.difference["mean"] == pytest.approx(+0.02)
    assert f.contrast == f"({name} T=2 - {name} T=1) - ({name} x2 - {name} T=1)" and f.sign == -1


def test_shared_runs_are_one_run_and_slugs_are_stable():
    a = RunSpec.make("tiny", "cem-attn", attn_steps=2, attn_precond="diag")
    assert a.slug == RunSpec.make("tiny", "cem-attn", attn_precond="diag", attn_steps=2).slug
    assert a.slug != RunSpec.make("tiny", "cem-attn", attn_steps=2, attn_precond="diag_lowrank").slug
    assert a.slug != a.with_seed(1).slug
    assert RunSpec.make("tiny", "cem-attn", attn_steps=1, kq_diag="shared") == RunSpec.make("tiny", "cem-attn")
    assert RunSpec.make("tiny", "llama", train={"lr": 2e-3}) == RunSpec.make("tiny", "llama")
    assert RunSpec.make("tiny", "llama", train={"lr": 1e-3}).slug != RunSpec.make("tiny", "llama").slug
    s = chosen(get_scale("cpu"))  # step-size shares its T=1 and T=2 constant-η runs with fig2c / fig2d
    assert len(set(_specs("step-size", s)) & set(_specs("fig2c", s))) == 2 * 5
    assert all(dict(x.train)["lr"] == 4e-3 for x in _specs("fig2c", s))  # every variant at Llama's chosen rate


def test_akima_optimum_finds_the_minimum():
    lrs = [5e-4, 1e-3, 2e-3, 4e-3, 8e-3]
    lr, p = akima_optimum(lrs, [(x - 2**-8.3) ** 2 * 1e5 + 10 for x in lrs])
    assert 2e-3 < lr < 4.5e-3 and p >= 10 - 1e-9


def test_interval_is_the_t_interval():
    values = [1.0, 2.0, 4.0]
    # mean 7/3, sample sd 1.5275, t_{0.975, 2} = 4.3027
    assert ci_halfwidth(values) == pytest.approx(4.302653 * 1.527525 / 3**0.5, rel=1e-5)
    assert Interval.of(values).se == pytest.approx(1.527525 / 3**0.5, rel=1e-5)  # recovered from the half-width
    assert math.isnan(Interval.of([0.3]).se)
    assert Interval.of([0.5, 0.6, 0.7]).verdict(+1) == "held"
    assert Interval.of([0.5, 0.6, 0.7]).verdict(-1) == "not held"
    assert Interval.of([-1.0, 0.6, 0.7]).verdict(+1) == "inconclusive"
    assert Interval.of([0.01, 0.02, 0.015]).within(0.05) == "held"
    assert Interval.of([0.10, 0.11, 0.12]).within(0.05) == "not held"
    assert Interval.of([0.3]).verdict(+1) == "held"  # one seed: the sign alone
    assert Interval.of([0.5, 0.6, 0.7]).text("+.1f", "nats") == "+0.6 [95% CI +0.4, +0.8] nats, 3 paired seeds"
    assert Interval.of([0.3]).text("+.1f", "nats") == "+0.3 nats (one seed, no interval)"


def test_a_finding_gives_the_smallest_difference_its_seeds_resolve_not_a_post_hoc_seed_count():
    """Paired differences of sd 0.02 over 3 seeds: a two-sided 5% t-test has 80% power at |Δ| ≥ 0.0653 nats
    (statsmodels: an effect size of 3.26); the evidence gives that, not how many seeds the observed mean would need (with 2
    degrees of freedom its spread is known only to 0.52x-6.3x)."""
    f = lower(rows(a=(1.0, 1.0, 1.0), b=(0.99, 1.01, 1.03)), "a", "b", "a<b")
    assert f.verdict == "inconclusive" and "these seeds resolve |Δ| ≥ 0.0653 nats (80% power)" in f.evidence
    assert "paired seeds would detect" not in f.evidence and "against the claim" not in f.evidence


def rows(**loss):
    return [{"label": k, "test_perplexity": math.exp(sum(v) / len(v)), "test_loss_per_seed": list(v)} for k, v in loss.items()]


def test_paired_verdicts():
    # a seed-shared offset is noise for unpaired means but cancels in paired differences
    r = rows(a=(1.0, 1.2, 1.4), b=(1.02, 1.22, 1.43))
    assert lower(r, "a", "b", "a<b").verdict == "held"
    assert lower(r, "b", "a", "b<a").verdict == "not held"
    assert lower(rows(a=(1.0, 1.1, 0.9), b=(1.05, 1.0, 1.0)), "a", "b", "a<b").verdict == "inconclusive"
    # equivalence in perplexity: ±5% is ±log(1.05) = ±0.0488 nats of loss
    assert close(rows(a=(1.0, 1.01, 1.02), b=(1.01, 1.01, 1.01)), "a", "b", "a~b", 0.05).verdict == "held"
    assert close(rows(a=(1.2, 1.21, 1.22), b=(1.0, 1.01, 1.0)), "a", "b", "a~b", 0.05).verdict == "not held"
    assert not_worse(rows(a=(1.0, 1.01, 1.02), b=(1.01, 1.02, 1.03)), "a", "b", "a<=b", 0.01).verdict == "held"
    assert not_worse(rows(a=(1.2, 1.21, 1.22), b=(1.0, 1.01, 1.0)), "a", "b", "a<=b", 0.01).verdict == "not held"
    # a verdict on a margin says where its interval also excludes zero: held within 5%, or unresolved, and still a gap
    near = close(rows(a=(1.011, 1.021, 1.031), b=(1.0, 1.01, 1.02)), "a", "b", "a~b", 0.05)
    assert near.verdict == "held" and "the interval excludes zero: a is measurably worse than b" in near.evidence
    behind = not_worse(rows(a=(1.006, 1.022, 1.009), b=(1.0, 1.01, 1.0)), "a", "b", "a<=b", 0.01)
    assert behind.verdict == "inconclusive" and "a is measurably worse than b" in behind.evidence
    assert "measurably" not in close(rows(a=(1.0, 1.02, 1.01), b=(1.01, 1.01, 1.01)), "a", "b", "a~b", 0.05).evidence
    g = rows(r1=(1.0, 1.1, 1.2), r2=(1.0, 1.1, 1.2), c1=(1.0, 1.1, 1.2), c2=(0.9, 1.01, 1.1))
    assert gains_more(g, ("r1", "r2"), ("c1", "c2"), "x").verdict == "held"
    assert gains_more(g, ("c1", "c2"), ("r1", "r2"), "x").verdict == "not held"


def test_runs_pair_by_seed_not_by_position():
    """A variant with more seeds than its comparison (five for a recursion pair, three for a control) pairs on the
    seeds both have, whatever their order; a seed whose two runs ran on different processors is left out."""
    from cem_study.findings import by_seed, paired

    a = {"label": "a", "test_perplexity": 3.0, "seeds": [0, 1, 2, 3, 4], "test_loss_per_seed": [1.0, 1.1, 1.2, 9.0, 9.0]}
    b = {"label": "b", "test_perplexity": 3.1, "seeds": [2, 0, 1], "test_loss_per_seed": [1.25, 1.05, 1.15]}
    assert by_seed([a, b]) == ([(1.0, 1.05), (1.1, 1.15), (1.2, 1.25)], 0)
    d = paired([a, b], "a", "b")
    assert d.n == 3 and d.mean == pytest.approx(-0.05)
    a["processor_per_seed"] = ["X", "X", "Y", "X", "X"]
    b["processor_per_seed"] = ["X", "X", "X"]  # seed 2: a on Y, b on X
    assert by_seed([a, b]) == ([(1.0, 1.05), (1.1, 1.15)], 1)
    assert "1 seed left out: its runs ran on different processors" in lower([a, b], "a", "b", "a<b").evidence


def test_holm_adjustment_by_family():
    """Holm over each family: the smallest p times m, then (m-1), ..., made monotone, capped at 1."""
    fs = [Finding(f"c{i}", "held", "", {"mean": m, "lo": 0, "hi": 0, "n": 3}, fam, p)
          for i, (fam, p, m) in enumerate([("paper", 0.01, 1.0), ("paper", 0.04, 1.0), ("paper", 0.03, -1.0), ("ours", 0.04, 1.0), ("paper", None, 1.0)])]
    adjust(fs)
    assert [f.p_adjusted for f in fs[:3]] == pytest.approx([0.03, 0.06, 0.06])
    assert [f.verdict_adjusted for f in fs[:3]] == ["held", "inconclusive", "inconclusive"]
    assert fs[3].p_adjusted == pytest.approx(0.04) and fs[3].verdict_adjusted == "held"  # its own family of one
    assert fs[4].p_adjusted is None  # no p-value (an equivalence claim): not in a family
    fs = [Finding("x", "not held", "", {"mean": -1.0, "lo": 0, "hi": 0, "n": 3}, "paper", 0.001)]
    adjust(fs)
    assert fs[0].verdict_adjusted == "not held"


def test_learning_rate_grid_grows_until_the_optimum_is_bracketed():
    first = (1e-3, 2e-3, 4e-3)
    assert extend(first, 2e-3, first, 3) is None
    assert extend(first, 4e-3, first, 3) == (1e-3, 2e-3, 4e-3, 8e-3)
    assert extend(first, 1e-3, first, 3) == (5e-4, 1e-3, 2e-3, 4e-3)
    assert extend((1e-3, 2e-3, 4e-3, 8e-3), 8e-3, first, 1) is None  # the limit: reported as not bracketed
    s = replace(get_scale("cpu"), chosen_lrs=(("cpu64", 4e-3),))
    assert s.grid("cpu64", "llama") == s.lrs and s.grid("cpu96", "llama") == (2e-3, 4e-3, 8e-3)
    with pytest.raises(LearningRateNotChosen, match="cpu96"):
        s.train_for("cpu96")


def test_learning_rate_protocol_end_to_end(corpus, tmp_path, monkeypatch):
    """A sweeping scale: Llama's sweep (chosen on validation, grown until bracketed) runs first, then the
    variants train at the chosen rate; the test split chooses nothing."""
    monkeypatch.setenv("CEM_CACHE_DIR", str(tmp_path / "cache"))
    kw = smoke(corpus, seeds=(0,), recursion_seeds=(0,), lr_sweep=True, lrs=(1e-3, 4e-3), lr_extend=1)
    summary = run_experiment("fig2b", "smoke", tmp_path / "res", **kw)
    lr_rows = run_experiment("lr", "smoke", tmp_path / "res", **kw)
    chosen_lr = lr_rows["chosen"]["micro"]["lr"]
    sweep = {r["lr"]: r["valid_loss"] for r in lr_rows["rows"]}
    assert chosen_lr == min(sweep, key=sweep.get)
    assert len(sweep) in (2, 3)  # grown by one factor of 2 where the best rate was at an end
    assert {r["lr"] for r in summary["rows"]} == {chosen_lr}


def test_a_recorded_learning_rate_choice_stands_when_a_sweep_run_changes(corpus, tmp_path, monkeypatch):
    """A sweep's decision is recorded when it finishes; a sweep run trained again later (whose validation loss
    moves by noise) does not re-decide it, and the summary says which rate is now lowest."""
    monkeypatch.setenv("CEM_CACHE_DIR", str(tmp_path / "cache"))
    kw = smoke(corpus, seeds=(0,), recursion_seeds=(0,), lr_sweep=True, lrs=(1e-3, 4e-3), lr_extend=1)
    root = tmp_path / "res"
    first = run_experiment("lr", "smoke", root, **kw)
    pick = first["chosen"]["micro"]["lr"]
    record = json.loads((root / "lr" / "choices.json").read_text())["micro-llama"]
    assert record["lr"] == pick and record["seeds"] == [0] and set(record["grid"]) == {r["lr"] for r in first["rows"]}
    other = next(r["lr"] for r in first["rows"] if r["lr"] != pick)
    path = root / "runs" / RunSpec.make("micro", "llama", train={"lr": other}).with_seed(0).slug / "results.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "valid_loss": 1e-6}))  # as if trained again, now the best
    again = run_experiment("lr", "smoke", root, **kw)
    assert again["chosen"]["micro"]["lr"] == pick and again["chosen"]["micro"]["best_now"]["lr"] == other
    (root / "lr" / "choices.json").write_text('{"micro-llama": {"lr": "fast"}}')
    with pytest.raises(ValueError, match="choices.json is corrupted: its entry micro-llama is not a recorded sweep"):
        run_experiment("lr", "smoke", root, **kw)


@pytest.mark.slow
def test_fig3a_brackets_the_current_best_rate_when_a_run_trained_again_moves_it(corpus, tmp_path, monkeypatch):
    """fig3a reads the whole curve: where a sweep run trained again has moved Llama's best rate (on the current
    results) to an end of its grid, the grid grows until that best is bracketed again and the new rate joins
    fig3a; the recorded choice, which every run of the size trained at, stands."""
    from cem_study import plan

    monkeypatch.setenv("CEM_CACHE_DIR", str(tmp_path / "cache"))
    kw = smoke(corpus, seeds=(0,), recursion_seeds=(0,), lr_sweep=True, lrs=(1e-3, 4e-3), lr_extend=1)
    root = tmp_path / "res"
    run_experiment("fig3a", "smoke", root, **kw)
    record = json.loads((root / "lr" / "choices.json").read_text())["micro-llama"]
    end, new = (max(record["grid"]), 8e-3) if 8e-3 not in record["grid"] else (min(record["grid"]), 5e-4)
    assert new not in record["grid"]  # the decision grew the grid on one side at most
    path = root / "runs" / RunSpec.make("micro", "llama", train={"lr": end}).with_seed(0).slug / "results.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "valid_loss": 1e-6}))  # as if trained again, now the best
    assert plan("smoke", root, ("fig3a",), **kw)["experiments"]["fig3a"]["train"] == 1
    summary = run_experiment("fig3a", "smoke", root, **kw)
    again = json.loads((root / "lr" / "choices.json").read_text())["micro-llama"]
    assert again["lr"] == record["lr"] and sorted(again["grid"]) == sorted(record["grid"] + [new])
    assert new in {r["lr"] for r in summary["rows"] if r["group"] == "Llama"}
    assert [list(x) for x in summary["scale"]["chosen_lrs"]] == [["micro", record["lr"]]]
    assert plan("smoke", root, ("fig3a",), **kw)["experiments"]["fig3a"]["train"] == 0  # bracketed (or at the limit)


def test_plan_says_what_would_be_trained_without_training(corpus, tmp_path, monkeypatch, capsys):
    """`cem-study experiment ... --plan`: the runs per experiment by status and the hours left, nothing trained; at
    a sweeping scale whose base sweep is undecided, only the sweep's runs can be named."""
    from cem_study.cli import main
    from cem_study import plan

    monkeypatch.setenv("CEM_CACHE_DIR", str(tmp_path / "cache"))
    root = tmp_path / "res"
    before = plan("smoke", root, ("fig2c",), **smoke(corpus))
    assert before["experiments"]["fig2c"] == {"finished": 0, "train": 12, "evaluate": 0, "again": 0, "elsewhere": 0}
    # no finished run to time them by, here or committed: the FLOP model at a stated rate; nothing written
    ((basis, n),) = before["bases"].items()
    assert n == 12 and basis.startswith("the FLOP model at an assumed") and before["core_hours"] > 0 and not root.exists()
    run_experiment("fig2c", "smoke", root, **smoke(corpus))
    after = plan("smoke", root, ("fig2c", "test-time"), **smoke(corpus))
    # fig2c's Llama runs are test-time's Llama-reuse runs, whose depth study is computed from their checkpoints
    assert after["experiments"]["fig2c"] == {"finished": 10, "train": 0, "evaluate": 2, "again": 0, "elsewhere": 0}
    assert after["experiments"]["test-time"]["train"] > 0 and set(after["bases"]) == {"here"} and after["core_hours"] > 0
    from cem_study import costs, runner

    from cem_study.records import RunTable

    monkeypatch.setattr(costs, "COMMITTED", tmp_path / "study" / "results")  # these runs' tables, as if committed beside the code
    done = RunTable(root / "runs")
    assert len(done.add()) == 12  # fig2c's finished runs, into the tables (`python -m cem_study.records add`)
    committed = done.copy(done.rows(), tmp_path / "study" / "results" / "smoke" / "runs")
    assert len(committed.rows()) == 12 and not committed.runs.exists()  # the tables only, no run folder
    fresh = plan("smoke", tmp_path / "fresh", ("fig2c", "test-time"), **smoke(corpus))
    assert fresh["bases"] == {"the committed runs in study/results/smoke/runs.jsonl": fresh["total"]["train"]}
    # the committed runs twice as slow
    committed.set_results({slug: {**row["results"], "wall_time_s": 2 * row["results"]["wall_time_s"]} for slug, row in committed.rows().items()})
    slower = plan("smoke", tmp_path / "fresh", ("fig2c", "test-time"), **smoke(corpus))
    assert slower["core_hours"] == pytest.approx(2 * fresh["core_hours"])  # the estimate is read from them (no timing here)
    monkeypatch.undo()
    monkeypatch.setenv("CEM_CACHE_DIR", str(tmp_path / "cache"))
    assert after["eval_core_hours"] == 0 and after["eval_unestimated"] > 0  # no product computed yet: no time to go by
    runs = sorted(p.name for p in (root / "runs").iterdir())
    capsys.readouterr()
    assert main(["experiment", "fig2c,test-time", "--scale", "smoke", "--results", str(root), "--plan"]) == 0
    out = capsys.readouterr().out
    assert "nothing is trained" in out and "fig2c" in out and "core-hours" in out and "Evaluations left" in out
    assert sorted(p.name for p in (root / "runs").iterdir()) == runs
    # a product's time is recorded when it is computed, and estimates the same product of the runs still to go
    from cem_study.products import recorded_times
    from cem_study.runner import _products

    llama = next(x for x in _specs("fig2c", get_scale("smoke", **smoke(corpus))) if x.arch == "llama" and x.seed == 0)
    (product,) = _products(("test-time",), get_scale("smoke", **smoke(corpus)))[llama]
    product.get(root / "runs" / llama.slug, str(corpus))
    assert set(recorded_times(root / "runs" / llama.slug)) == {product.name}
    timed = plan("smoke", root, ("fig2c", "test-time"), **smoke(corpus))
    assert timed["eval_core_hours"] > 0 and timed["eval_unestimated"] < after["eval_unestimated"]
    (root / "runs" / llama.slug / "evals" / "times.json").write_text('{"a": "slow", "b": [1]')
    assert recorded_times(root / "runs" / llama.slug) == {}  # an unreadable record only loses the estimate
    sweeping = plan("smoke", tmp_path / "other", ("fig2a",), **smoke(corpus, lr_sweep=True, lrs=(1e-3, 4e-3)))
    # an undecided sweep: its runs, and the runs at its rate counted at a provisional one (the middle of its grid)
    assert sweeping["undecided"] == {"micro-llama": 4} and sweeping["provisional"] == ["micro-llama"]
    assert sweeping["experiments"]["fig2a"]["train"] > 0 and sweeping["total"]["train"] > 4
    assert "provisional rate" in runner.format_plan(sweeping)


def test_the_plan_says_a_rate_not_chosen_yet_and_what_its_total_counts():
    """On a fresh folder a size's rate is provisional (its Llama sweep undecided): the plan does not call it chosen,
    and its last row says it counts the experiments asked for and their sweeps, not the whole suite."""
    p = {"scale": "cpu128", "results": "r", "chosen_lrs": {"cpu128": 2e-3, "cpu96": 8e-3}, "provisional_lrs": ["cpu128"],
         "own_lrs": {}, "undecided": {"cpu128-llama": 3}, "provisional": ["cpu128-llama"], "seeds_undecided": {},
         "experiments": {"fig2a": {"finished": 0, "train": 11, "evaluate": 0, "again": 0}},
         "total": {"finished": 0, "train": 13, "evaluate": 0, "again": 0}, "unit": "core-hours", "core_hours": 8.4,
         "bases": {}, "eval_core_hours": 0.0, "eval_unestimated": 0}
    from cem_study.runner import format_plan

    text = format_plan(p)
    assert "learning rates chosen: cpu96 0.008" in text and "chosen: cpu128" not in text
    assert "learning rates not chosen yet (their Llama sweeps are undecided; counted at the provisional rate): cpu128 0.002" in text
    total = next(x for x in text.splitlines() if x.startswith("in all"))
    assert "13" in total and "rate sweeps they wait on" in total and "all (once)" not in text


@pytest.mark.slow
def test_fig2c_end_to_end_with_resume_and_the_budget_check(corpus, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CEM_CACHE_DIR", str(tmp_path / "cache"))
    summary = run_experiment("fig2c", "smoke", tmp_path / "res", **smoke(corpus))
    labels = [r["label"] for r in summary["rows"]]
    assert labels == ["Llama micro", "Llama ALiBi micro", "CEM attention T=1", "CEM attention T=2", "CEM attention T=1 learned step",
                      "CEM attention T=2 learned step"]
    assert all(r["seeds"] == [0, 1] and len(r["test_perplexity_per_seed"]) == 2 for r in summary["rows"])
    assert len(summary["findings"]) == 5 and all(f["difference"]["n"] == 2 for f in summary["findings"])
    assert [f["family"] for f in summary["findings"]] == ["paper", "control", "control", "paper", "control"]
    assert [(g["a"], g["b"]) for g in summary["training_gap"]] == [("CEM attention T=2", "CEM attention T=1"),
                                                                   ("CEM attention T=2 learned step", "CEM attention T=1 learned step")]
    assert all(len(g["mean"]) == 6 for g in summary["training_gap"])
    assert summary["short_runs"] == labels  # 3 steps: short of the budget
    assert (tmp_path / "res" / "fig2c" / "fig2c.png").stat().st_size > 1000
    assert len(list((tmp_path / "res" / "runs").iterdir())) == 12
    capsys.readouterr()
    again = run_experiment("fig2c", "smoke", tmp_path / "res", **smoke(corpus))  # everything finished: no training
    assert "0 to train" in capsys.readouterr().err
    assert again["rows"] == summary["rows"]
    with pytest.raises(ValueError, match="trained with other settings"):
        run_experiment("fig2c", "smoke", tmp_path / "res", **smoke(corpus, max_steps=4))
    report = write_report(tmp_path / "res").read_text()  # the smoke scale: a pipeline check, written without allow_short
    assert report.startswith("> **Not the paper's protocol: a pipeline check") and not any(m in report for m in "✅❌➖")
    assert f"> **Interim report: {len(SUITE_ORDER) - 1} of the {len(SUITE_ORDER)} experiments of the scale's suite are not analysed yet" in report
    assert "## fig2c" in report and "![fig2c](fig2c/fig2c.png)" in report and "Llama micro" in report and "95% CI" in report


@pytest.mark.slow
def test_test_time_and_energy(corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("CEM_CACHE_DIR", str(tmp_path / "cache"))
    scale = smoke(corpus, seeds=(0,), recursion_seeds=(0, 1))
    tt = run_experiment("test-time", "smoke", tmp_path / "res", **scale)
    cem = ["full CEM trained T=1", "full CEM trained T=2", "full CEM trained T~U{1..3}", "full CEM, T~PLN(3), backprop through 2",
           "full CEM, T~U{1..3}, fixed-point penalty", "full CEM, T~U{1..3}, η_t = 2^-t",
           "full CEM, T~PLN(3), backprop through 2, η_t = 2^-t, fixed-point penalty", "full CEM, T~U{1..3}, η_t = 1/T",
           "full CEM, T~U{1..3}, anchored (λ = 1)"]
    assert set(tt["curves"]) == {*cem, "Llama, plain reuse at test time", "Llama with 4 layers"}
    for label, curve in tt["curves"].items():
        if label == "Llama with 4 layers":  # evaluated as trained
            assert [r["eval_steps"] for r in curve] == [1]
            continue
        assert [r["eval_steps"] for r in curve] == [1, 2, 3]
        assert curve[0]["flops_per_token"] < curve[1]["flops_per_token"] < curve[2]["flops_per_token"]
        o = tt["oracle"][label]  # the per-token oracle is at least as good as the best fixed T
        assert o["test_loss"] <= o["fixed_best_loss"] + 1e-12 and 1 <= o["mean_best_steps"] <= 3
    rules = ("energy rule, tol 0.01", "energy rule, tol 0.001", "update rule, tol 0.01", "update rule, tol 0.001")
    assert set(tt["adaptive"]) == {f"{m}, {r}" for m in cem for r in rules}
    for label, (point,) in tt["adaptive"].items():  # adaptive: at most the deepest T, at most its FLOPs
        model = label.split(", energy rule")[0].split(", update rule")[0]
        fixed = tt["curves"][model][-1]
        assert point["eval_steps"] == 3 and 1 <= point["steps_used"] <= 3 + 1e-9
        assert point["flops_per_token"] <= fixed["flops_per_token"] + 1e-6
        assert point["regret"] >= -1e-12 and point["gain_over_fixed"]["n"] == 2
        rho = point["oracle_rank_correlation"]
        assert rho is None or -1 <= rho <= 1  # None where every position took the same steps
    # eval T = 1, 2, 3: T=1 models (CEM T=1, Llama reuse) are evaluated at 2m = 2; the CEM T=1 one also
    # against the deeper Llama; models of mean depth 2 or 3 would need T = 4 or 6
    claims = [f["claim"] for f in tt["findings"]]
    assert len(claims) == 3 and all(c.startswith("(ours) ") for c in claims)
    assert any("full CEM trained T=1 at T=2 beats Llama with 4 layers" in c for c in claims)
    assert all(f["family"] == "ours" and f["p"] is not None for f in tt["findings"])
    # the answer in plain words: the CEM T=1 model at 2m (Llama reuse is not a CEM model), and against the deeper Llama
    twice, vs = tt["answer"]["twice"], tt["answer"]["deeper"]
    assert set(twice) == set(vs) == {"full CEM trained T=1"} and (twice["full CEM trained T=1"]["m"], twice["full CEM trained T=1"]["2m"]) == (1, 2)
    assert twice["full CEM trained T=1"]["verdict"] == next(f["verdict"] for f in tt["findings"] if "twice the mean trained depth" in f["claim"] and "CEM" in f["claim"])
    assert (tmp_path / "res" / "test-time" / "test-time.png").exists()
    # each run's depth study was computed as it finished, so the analysis needs no checkpoint now
    runs = [tmp_path / "res" / "runs" / spec.slug for spec in _specs("test-time", get_scale("smoke", **scale))]
    assert all(len(list((d / "evals").glob("depth_study_*.json"))) == 1 for d in runs)
    extra = {d for d in runs if list((d / "evals").glob("extra_steps_*.json"))}  # CEM models only
    assert extra and all("llama" not in d.name for d in extra) and all("llama" in d.name for d in set(runs) - extra)
    assert set(tt["extra_steps"]) == set(cem)
    e = tt["extra_steps"]["full CEM trained T=1"]
    assert (e["base"], e["more"]) == (1, 2)
    assert set(e["cost"]) == {"all", "attention", "mlp", "layer blocks.0.attn", "layer blocks.0.mlp", "layer blocks.1.attn", "layer blocks.1.mlp"}
    assert all(c["n"] == 2 for c in [*e["cost"].values(), *e["knobs"].values()]) and len(e["knobs"]) == 3
    assert set(tt["drift"]) == set(cem) and all(len(d["drift"]) == len(d["cos_h"]) == len(d["radial"]) + 1 == 5 for d in tt["drift"].values())
    plain, anchored = (tt["drift"][k]["drift"] for k in ("full CEM trained T~U{1..3}", "full CEM, T~U{1..3}, anchored (λ = 1)"))
    assert plain[-1] > 4 * plain[0] and anchored[-1] < 2 * anchored[0]  # T = 16 against T = 1: the anchor stops the drift
    against = tt["against_random_depth"]  # every other CEM model against plain random depth, at its m and 2m
    assert set(against) == set(cem) - {"full CEM trained T~U{1..3}"} and against["full CEM trained T=1"]["m"]["T"] == 1
    per_seed = lambda label, t: next(r["test_loss_per_seed"] for r in tt["curves"][label] if r["eval_steps"] == t)  # noqa: E731
    expected = [a - b for a, b in zip(per_seed("full CEM trained T~U{1..3}", 2), per_seed("full CEM trained T=1", 2))]
    assert against["full CEM trained T=1"]["2m"]["mean"] == pytest.approx(sum(expected) / 2)
    assert "2m" not in against["full CEM trained T=2"]  # T = 4 is not among the smoke scale's depths
    report = write_report(tmp_path / "res", allow_short=True).read_text()
    assert "| along x, last doubling |" in report and "minus the model's at the same T" in report
    for d in runs:
        shutil.rmtree(d / "ckpt")
    assert run_experiment("test-time", "smoke", tmp_path / "res", **scale)["curves"] == tt["curves"]
    study = next((runs[1] / "evals").glob("depth_study_*.json"))  # a study made with other exit rules is refused
    stale = json.loads(study.read_text())
    study.write_text(json.dumps({**stale, "rules": stale["rules"][:1]}))
    with pytest.raises(ValueError, match="was computed at other depths or exit rules"):
        run_experiment("test-time", "smoke", tmp_path / "res", **scale)
    study.write_text(json.dumps(stale))
    report = write_report(tmp_path / "res", allow_short=True).read_text()
    assert "oracle: lowest loss per token" in report and "gain over fixed T at equal FLOPs" in report
    assert "| full CEM trained T=2 | 2 → 4 |" in report and "only 1.mlp" in report and "energy-guarded steps at m" in report
    assert "**In plain words:** of 1 CEM model, these have a lower test loss at twice their mean trained depth" in report
    assert "full CEM trained T=1 (T=1 → 2: " in report and "Against Llama with 4 layers" in report
    en = run_experiment("energy", "smoke", tmp_path / "res", **scale)  # its run trained again: its checkpoint went above
    layers = en["energy"]
    assert len(layers) == 2 * 2  # micro: 2 blocks x (attention, MLP)
    assert all(len(r["energy"]) == 5 and r["trained_steps"] == 2 for r in layers)
    assert (tmp_path / "res" / "energy" / "energy.png").exists()


@pytest.mark.slow
def test_extra_steps_matches_the_depth_study(corpus, tmp_path):
    """`extra_steps` from T to T is free, and all layers at `more` is the depth study's loss at that T."""
    from cem_study.analysis import depth_study, extra_steps

    scale = smoke(corpus, seeds=(0,), recursion_seeds=(0,))
    spec = next(s for s in _specs("test-time", get_scale("smoke", **scale)) if s.arch == "cem")
    run_experiment("test-time", "smoke", tmp_path / "res", **scale)
    run = tmp_path / "res" / "runs" / spec.slug
    same = extra_steps(run, 2, 2, max_batches=2, device="cpu")
    assert set(same["loss"]) == {"none", "all", "attention", "mlp"} and len(same["layers"]) == 4
    assert all(v == same["loss"]["none"] for v in [*same["loss"].values(), *same["layers"].values()])
    study = depth_study(run, steps=(1, 3), max_batches=2, device="cpu", rules=())
    more = extra_steps(run, 1, 3, max_batches=2, device="cpu")
    assert more["loss"]["none"] == pytest.approx(study["curve"][0]["test_loss"], abs=1e-9)
    assert more["loss"]["all"] == pytest.approx(study["curve"][1]["test_loss"], abs=1e-9)
    assert more["loss"]["attention"] != more["loss"]["mlp"]  # each part alone is its own evaluation
    assert more["guarded"]["guard"] == 4 and all(math.isfinite(v) for v in more["guarded"].values())
    unguarded = extra_steps(run, 1, 3, max_batches=2, device="cpu", guard=0)  # a guard of 0 halvings is the plain step
    assert unguarded["guarded"] == {"guard": 0, "base": more["loss"]["none"], "more": more["loss"]["all"]}
    same_path = extra_steps(run, 2, 2, max_batches=2, device="cpu")  # finer steps from T to T: the same steps
    assert same_path["finer"] == same_path["loss"]["none"] and more["finer"] not in (more["loss"]["none"], more["loss"]["all"])
    inverse = next(s for s in _specs("test-time", get_scale("smoke", **scale)) if dict(s.model).get("step_schedule") == "inverse")
    flow = extra_steps(tmp_path / "res" / "runs" / inverse.slug, 1, 3, max_batches=2, device="cpu")
    assert flow["finer"] == flow["loss"]["all"]  # under η/T, 3 steps already have the path length of 1: η is kept


def test_unknown_experiment():
    with pytest.raises(ValueError, match="unknown experiment 'fig9'"):
        run_experiment("fig9")


def test_size_trend_recovers_a_linear_gap_in_log_parameters(tmp_path):
    """The gap of each size, paired by seed, and its least-squares slope in log(parameters)."""
    from cem_study.analysis import size_trend
    from cem_study.findings import Context

    sizes, params, slope = ("a", "b", "c"), (1e5, 2e5, 4e5), -0.02
    rows = []
    for size, n in zip(sizes, params):
        noise = [0.001, -0.002, 0.001]
        gap = [slope * math.log(n) + 0.3 + e for e in noise]
        base = [1.5, 1.6, 1.55]
        rows.append({"label": f"Llama {size}", "parameters": int(n), "test_loss_per_seed": base})
        rows.append({"label": f"CEM {size}", "parameters": int(n * 0.8), "test_loss_per_seed": [b + g for b, g in zip(base, gap)]})
    ctx = Context(replace(get_scale("smoke"), sizes=sizes), rows, [], tmp_path, tmp_path)
    (finding,), extra = size_trend(ctx, [("CEM", "Llama", "CEM vs Llama")])
    fit = extra["trend"]["CEM vs Llama"]["slope"]
    assert fit["mean"] == pytest.approx(slope, abs=2e-3) and fit["lo"] < slope < fit["hi"]
    assert finding.verdict == "held" and finding.family == "ours" and finding.sign == -1
    assert [p["size"] for p in extra["trend"]["CEM vs Llama"]["points"]] == list(sizes)
    assert "weights 1/se²" in finding.evidence and "nan" not in finding.evidence
    # a size with one seed has no interval: its point says so, and the fit falls back to equal weights
    for r in rows[2:4]:
        r["test_loss_per_seed"] = r["test_loss_per_seed"][:1]
    (finding,), _ = size_trend(Context(ctx.scale, rows, [], tmp_path, tmp_path), [("CEM", "Llama", "CEM vs Llama")])
    assert "b " in finding.evidence and "(1 seed, no interval)" in finding.evidence and "nan" not in finding.evidence
    assert "(equal weights: a size has one seed)" in finding.evidence


def test_regime_check_compares_llama_with_an_ngram_on_the_same_tokens(corpus, tmp_path, monkeypatch):
    """The regime check fits n-grams of orders 5-8 on the size's budget of training tokens, scored in the Llama's
    windows too, and judges Llama's validation loss against the best, per seed; a Llama far below the n-grams is
    held, far above not held."""
    from cem_study.analysis import regime_check
    from cem_study.findings import Context

    from cem_study import analysis
    from cem_study.sweep import RunSpec, Variant

    monkeypatch.setenv("CEM_CACHE_DIR", str(tmp_path / "cache"))
    s = replace(get_scale("smoke", data=str(corpus)), sizes=("good", "bad"))
    variants = [Variant(f"Llama {g}", RunSpec.make("micro", "llama", train={"lr": 1e-3, "seq_len": 64 if g == "good" else 32}), {}) for g in ("good", "bad")]
    # the context-use part reads each run's product (no weights needed): loss falls with context for "good" only
    for v in variants:
        for seed in (0, 1, 2):
            long = 1.5 if v.label == "Llama good" else 2.1 + 0.01 * seed
            atomic_write_json(analysis.CONTEXT_USE.path(tmp_path / "runs" / v.spec.with_seed(seed).slug),
                              {"short": [8, 16], "short_loss": 2.0, "long_loss": long})
    rows = [{"label": "Llama good", "group": "good", "lr": 1e-3, "budget_tokens": 5000, "tokens": 5000, "valid_loss": 0.01, "valid_loss_per_seed": [0.01, 0.011, 0.012], "seeds": [0, 1, 2]},
            {"label": "Llama bad", "group": "bad", "lr": 1e-3, "budget_tokens": 10**9, "tokens": 10**9, "valid_loss": 5.0, "valid_loss_per_seed": [5.0, 5.1, 5.2], "seeds": [0, 1, 2]}]
    chosen = {"good": {"lr": 1e-3}, "bad": {"lr": 1e-3}}
    findings, extra = regime_check(Context(s, rows, variants, tmp_path, tmp_path), chosen)
    assert [f.verdict for f in findings] == ["held", "held", "not held", "not held"]
    assert extra["regime"]["good"]["context"]["gain"]["mean"] == pytest.approx(-0.5)
    assert [g["order"] for g in extra["regime"]["good"]["ngrams"]] == [5, 6, 7, 8]
    assert extra["regime"]["good"]["ngrams"][0]["train_tokens"] == 5000
    assert [g["window"] for g in extra["regime"]["good"]["ngrams"] + extra["regime"]["bad"]["ngrams"]] == [64] * 4 + [32] * 4  # the Llama's context
    assert all(0 < g["valid_loss_windowed"] < 10 for g in extra["regime"]["good"]["ngrams"])
    assert (extra["regime"]["good"]["speaks"], extra["regime"]["bad"]["speaks"]) == (True, False)
    assert extra["regime"]["bad"]["ngrams"][0]["train_tokens"] < 10**9  # at most the whole train split
    assert 0 < extra["regime"]["bad"]["ngrams"][1]["valid_loss"] < 5.0


@pytest.mark.slow
def test_a_failed_run_stops_a_parallel_sweep(corpus, tmp_path, monkeypatch):
    """With --jobs > 1, a run that fails (or is interrupted) stops the sweep: the runs not started yet are
    cancelled instead of being trained one after another while the command is being stopped."""
    from cem_study.sweep import run_sweep

    monkeypatch.setenv("CEM_CACHE_DIR", str(tmp_path / "cache"))
    s = get_scale("smoke", data=str(corpus))
    bad = [RunSpec.make("micro", "llama", seed=i, train={"batch_size": 100_000}) for i in (0, 1)]
    good = [RunSpec.make("micro", "llama", seed=i) for i in range(10)]
    with pytest.raises(ValueError, match="batch_size"):
        run_sweep(bad + good, s, tmp_path / "res", jobs=2)
    # at most the runs the two workers had started before the failure was seen; without the stop event the runs
    # already queued to the workers ran too (up to 6 were seen), without cancelling all 10 would
    assert sum((tmp_path / "res" / "runs" / g.slug / "results.json").exists() for g in good) <= 2


def test_position_losses_average_to_the_evaluated_loss(corpus):
    """The loss by position (the context-use check) is the plain evaluation's loss, split by position: on a
    split of whole windows, its mean over positions equals `evaluate`'s loss."""
    from cem.data import TokenSplit
    from cem_study.analysis import position_losses
    from cem.model import LanguageModel, ModelConfig
    from cem.training.evaluate import evaluate

    torch.manual_seed(0)
    model = LanguageModel(ModelConfig(vocab_size=50, dim=32, n_layers=2, n_heads=2, context=32), init_seed=1).eval()
    tokens = np.random.default_rng(0).integers(0, 50, 16 * 5 + 1).astype(np.uint16)
    by_position = position_losses(model, tokens, 16, batch_size=2, device="cpu")
    full = evaluate(model, TokenSplit("valid", tokens, len(tokens)), 16, 2, torch.device("cpu"))
    assert len(by_position) == 16 and sum(by_position) / 16 == pytest.approx(full["loss"], rel=1e-6)
    assert by_position[0] != pytest.approx(by_position[-1])  # a loss per position, not one number repeated


def _ngrams(unbroken, windowed, tokens=5000, window=32):
    """Synthetic n-gram records of orders 5-8, as `ngram_baseline` writes them, with these validation losses."""
    return [{"order": o, "train_tokens": tokens, "window": window, "valid_loss": u, "valid_loss_windowed": w}
            for o, u, w in zip((5, 6, 7, 8), unbroken, windowed)]


def test_a_size_speaks_only_below_the_best_order_in_the_transformers_windows():
    """`regime_against`: Llama between the 6- and the 8-gram (windowed) does not speak, the 7- and 8-gram beating it;
    below all four it speaks; the windowed scoring decides (below the best windowed, above the best unbroken: speaks)."""
    from cem_study.analysis import regime_against

    ngrams = _ngrams((1.30, 1.20, 1.15, 1.10), (1.32, 1.22, 1.17, 1.12))
    between = regime_against([1.185, 1.19, 1.195], ngrams)
    assert between["windowed"]["best_order"] == 8 and between["windowed"]["beating"] == [7, 8]
    assert between["windowed"]["beating_on_interval"] == [7, 8] and not between["windowed"]["speaks"]
    assert between["windowed"]["minus_best"]["mean"] == pytest.approx(1.19 - 1.12)
    below = regime_against([1.00, 1.01, 1.02], ngrams)
    assert below["windowed"]["speaks"] and below["unbroken"]["speaks"] and below["windowed"]["beating"] == []
    fair = regime_against([1.109, 1.11, 1.111], ngrams)  # below the windowed 8-gram, above the unbroken one
    assert fair["windowed"]["speaks"] and not fair["unbroken"]["speaks"] and fair["unbroken"]["beating"] == [8]
    assert not regime_against([1.0], ngrams)["windowed"]["speaks"]  # one seed: no interval, does not speak


def test_regime_check_reads_its_cached_fits_and_names_the_best_order(corpus, tmp_path, monkeypatch):
    """From cached fits (no fit: `ngram_baseline` would fail) the regime finding names the best order, both scorings
    and the orders that beat Llama; a cache scored in other windows is fit again."""
    from cem_study import analysis, ngram
    from cem_study.findings import Context
    from cem_study.sweep import RunSpec, Variant

    monkeypatch.setenv("CEM_CACHE_DIR", str(tmp_path / "cache"))
    s = replace(get_scale("smoke", data=str(corpus)), sizes=("a",))
    v = Variant("Llama a", RunSpec.make("micro", "llama", train={"lr": 1e-3, "seq_len": 32}), {})
    for seed in (0, 1, 2):
        atomic_write_json(analysis.CONTEXT_USE.path(tmp_path / "runs" / v.spec.with_seed(seed).slug), {"short": [8, 16], "short_loss": 2.0, "long_loss": 1.5})
    rows = [{"label": "Llama a", "group": "a", "lr": 1e-3, "budget_tokens": 5000, "tokens": 5000, "valid_loss": 1.19, "valid_loss_per_seed": [1.185, 1.19, 1.195], "seeds": [0, 1, 2]}]
    fits = _ngrams((1.30, 1.20, 1.15, 1.10), (1.32, 1.22, 1.17, 1.12))
    atomic_write_json(analysis.ngram_cache(tmp_path, "a"), {"fits": fits})

    def no_fit(*args, **kwargs):
        raise AssertionError("fit although cached")

    monkeypatch.setattr(ngram, "ngram_baseline", no_fit)
    (finding, _), extra = analysis.regime_check(Context(s, rows, [v], tmp_path, tmp_path), {"a": {"lr": 1e-3}})
    assert finding.verdict == "not held" and extra["regime"]["a"]["speaks"] is False
    assert "the best of the 5- to 8-gram models, the 8-gram," in finding.claim and "32-token windows" in finding.claim
    assert "windowed: 5-gram" in finding.evidence and "unbroken: 5-gram" in finding.evidence
    assert "Llama - the best, the 8-gram: +0.0700" in finding.evidence and "Llama - the best, the 8-gram: +0.0900" in finding.evidence
    assert "the 7- and 8-gram beat Llama" in finding.evidence
    atomic_write_json(analysis.ngram_cache(tmp_path, "a"), {"fits": [{**fits[0], "window": 64}, *fits[1:]]})  # scored in other windows
    with pytest.raises(AssertionError, match="fit although cached"):
        analysis.regime_check(Context(s, rows, [v], tmp_path, tmp_path), {"a": {"lr": 1e-3}})


def test_report_leads_with_the_sizes_that_speak():
    """A size speaks only when its Llama beats the 5-gram with the interval over all its seeds below zero (one
    seed has no interval: it does not speak). A finding about a size that does not (named in its claim, else the
    scale's base size) is a pipeline check, counted apart; the opening counts each kind of test on its own, and
    the second rate rule's verdicts beside the paper's."""
    from cem_study.report import _opening, below_regime, regime_sizes

    scale = {"name": "cpu", "sizes": ["cpu64", "cpu96", "cpu128"], "base": "cpu64"}
    from cem_study.analysis import regime_against
    from cem_study.report import _glance, _pipeline_heading, _regime_opening

    ngrams = _ngrams((1.30, 1.20, 1.15, 1.10), (1.32, 1.22, 1.17, 1.12))
    lr = {"experiment": "lr", "scale": scale, "findings": [], "rows": [{}],
          "regime": {size: {"ngrams": ngrams, "window": 256, "against": (a := regime_against(llama, ngrams)), "speaks": a["windowed"]["speaks"]}
                     for size, llama in (("cpu64", [1.25, 1.26, 1.27]), ("cpu96", [1.0]), ("cpu128", [1.0, 1.01, 1.02]))}}
    small = {"claim": "CEM attention close to Llama at cpu64", "verdict": "held", "family": "paper", "p": None, "evidence": "equivalence margin ±2% ppl"}
    large = {"claim": "CEM attention close to Llama at cpu128", "verdict": "not held", "family": "paper", "p": None, "evidence": "equivalence margin ±2% ppl"}
    beats = {"claim": "T=2 beats Llama at cpu128", "verdict": "held", "family": "paper", "p": 0.01, "verdict_adjusted": "held"}
    base = {"claim": "recursion T=2 beats T=1", "verdict": "held", "family": "paper", "p": 0.01}
    own = {"claim": "T=2 beats Llama at cpu128", "verdict": "inconclusive", "family": "paper", "p": 0.2,
           "difference": {"mean": 0.01, "lo": -0.01, "hi": 0.03, "n": 3}}
    fig = {"experiment": "fig2a", "scale": scale, "rows": [{}], "findings": [small, large, beats, base],
           "rules": {"own": {"findings": [own]}}}
    passing = regime_sizes([lr, fig])
    assert passing == {"cpu64": False, "cpu96": False, "cpu128": True}
    assert [below_regime(f, fig, passing) for f in (small, large, beats, base)] == [True, False, False, True]
    assert below_regime(small, {**fig, "rows": []}, passing) is False  # not a language model (table3): no regime
    text = "\n".join(_opening([lr, fig]))
    first = "\n".join(_regime_opening([lr, fig]))
    assert "best of the 5- to 8-gram models" in first
    assert "cpu64: the 6-, 7- and 8-gram beat its Llama in the transformer's 256-token windows, the 6-, 7- and 8-gram beat it on " \
           "the unbroken text: it does not speak (at n-gram level)" in first
    assert "cpu96: no n-gram beats its Llama" in first and "cpu128: no n-gram beats its Llama" in first and "it speaks" in first
    assert _pipeline_heading([lr, fig]) == ("Pipeline checks: sizes at n-gram level (cpu64: the 6-, 7- and 8-gram beat its Llama; "
                                            "cpu96: its Llama not resolved below the 8-gram)")
    glance = "\n".join(_glance([lr, {**fig, "rules": {}}], passing))  # the first screen keeps every verdict, those below the regime labelled
    labelled = glance.index("**Pipeline checks: sizes at n-gram level (cpu64: the 6-, 7- and 8-gram beat its Llama")
    assert glance.index("| CEM attention close to Llama at cpu64 |") > labelled > glance.index("| T=2 beats Llama at cpu128 |")
    assert "at the `cpu` scale at cpu128" in text
    assert "directional 1: 1 held, 0 not held, 0 inconclusive (Holm: 1 held, 0 not held, 0 inconclusive); equivalence 1: 0 held, 1 not held" in text
    assert "With each CEM variant at its own best rate" in text and "directional 1: 0 held, 0 not held, 1 inconclusive" in text
    assert "**Pipeline checks**" in text and "2 findings" in text
    assert below_regime(small, fig, {}) is False  # no regime check (micro, smoke): nothing is set apart


def _sweep_in_a_process(corpus, tmp_path):
    """A parallel sweep (2 workers, two long runs) in its own process, SIGTERM handled as `cem-study experiment` does
    (a KeyboardInterrupt), once both runs are training: the process, the workers' pids and the run directories."""
    import os
    import subprocess
    import sys
    import time

    code = (
        "import signal, sys\nfrom dataclasses import replace\nfrom pathlib import Path\n"
        "from cem.cli import _raise_terminated\nsignal.signal(signal.SIGTERM, _raise_terminated)\n"
        "from cem_study import RunSpec, get_scale\nfrom cem_study.sweep import run_sweep\n"
        f"s = replace(get_scale('smoke', data={str(corpus)!r}), max_steps=10**6, eval_steps=())\n"
        "run_sweep([RunSpec.make('micro', 'llama', seed=i) for i in (0, 1)], s, Path(sys.argv[1]), jobs=2)\n"
    )
    env = {**os.environ, "CEM_CACHE_DIR": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "res")], env=env, stderr=subprocess.PIPE, text=True)
    runs = [tmp_path / "res" / "runs" / RunSpec.make("micro", "llama", seed=i).slug for i in (0, 1)]
    deadline = time.time() + 120
    while not all((r / "metrics.jsonl").exists() for r in runs):
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read() if proc.poll() is not None else "runs did not start"
        time.sleep(0.5)
    children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    workers = [int(p) for p in children if "spawn_main" in open(f"/proc/{p}/cmdline").read().replace("\0", " ")]
    assert len(workers) == 2, children
    return proc, workers, runs


def _gone(pids, seconds):
    import os
    import time

    deadline = time.time() + seconds
    while time.time() < deadline:
        alive = []
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().split(") ")[1][0] != "Z":
                        alive.append(pid)
            except FileNotFoundError:
                pass
        if not alive:
            return True
        time.sleep(0.5)
    return False


def test_an_interrupted_run_resumes_before_the_others_start(corpus, tmp_path, monkeypatch):
    """A sweep hands its launcher the interrupted runs (with a checkpoint) first, then the finished runs it trains
    again, then the runs not started: a checkpoint holds work that a change of machine would lose."""
    from cem_study.launchers import Launcher
    from cem_study.sweep import run_sweep
    from cem.training import RunDir

    class Recording(Launcher):
        def run(self, fn, tasks, done):
            order.extend(task[0] for task in tasks)

    order = []
    s = get_scale("smoke", data=str(corpus))
    fresh, again, interrupted = (RunSpec.make("micro", "llama", seed=i) for i in range(3))
    (tmp_path / "runs" / again.slug).mkdir(parents=True)
    atomic_write_json(tmp_path / "runs" / again.slug / "results.json", {"sessions": [{"processor": "Another CPU"}]})
    monkeypatch.setattr(RunDir, "checkpoint", lambda self: self.path if self.path.name == interrupted.slug else None)
    monkeypatch.setattr("cem_study.sweep._check_finished", lambda *a, **k: None)
    monkeypatch.setattr("cem.provenance.processor", lambda device=None: "This CPU")
    run_sweep([fresh, again, interrupted], replace(s, processor="This CPU"), tmp_path, jobs=Recording())
    assert order == [interrupted, again, fresh]


@pytest.mark.slow
@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="pgrep, /proc and PR_SET_PDEATHSIG are Linux's")
def test_a_stopped_sweep_stops_its_running_runs_with_checkpoints(corpus, tmp_path):
    """SIGTERM to a parallel sweep's process (what `kill` or a scheduler sends): the running runs save their
    checkpoints and stop, and the process exits, instead of waiting for them to finish (hours at the cpu
    scale); the next run of the command resumes them."""
    import signal

    proc, workers, runs = _sweep_in_a_process(corpus, tmp_path)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    assert proc.returncode == 1  # the sweep stopped its workers, waited for their checkpoints, and raised
    assert "Terminated" in proc.stderr.read()
    assert _gone(workers, 30)
    assert all((r / "ckpt").is_dir() and not (r / "results.json").exists() for r in runs)


@pytest.mark.slow
@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="pgrep, /proc and PR_SET_PDEATHSIG are Linux's")
def test_a_killed_sweep_takes_its_workers_with_it(corpus, tmp_path):
    """SIGKILL to the sweep's process: its workers get SIGTERM from the kernel (PR_SET_PDEATHSIG), save their
    checkpoints and exit, instead of training on as orphans that hold their run directories' locks (seen
    on 2026-11-24: the restarted suite stopped at 'run directory ... in use by another process')."""
    import signal

    proc, workers, runs = _sweep_in_a_process(corpus, tmp_path)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert _gone(workers, 60)
    assert all((r / "ckpt").is_dir() for r in runs)


def test_report_sets_full_cems_own_best_rate_beside_the_rate_it_trained_at():
    """The report names each size's rate and, once fig3a is in, how much lower full CEM's validation loss is
    at its own best rate than at Llama's (the rate every base-size variant trains at)."""
    from cem_study.report import _rates
    from cem_study.registry import LR_GROUPS

    scale = {"name": "cpu", "base": "cpu64", "chosen_lrs": [["cpu64", 0.008], ["cpu128", 0.002]]}
    assert _rates([{"experiment": "fig2c", "scale": scale}])[1].endswith("cpu64 0.008, cpu128 0.002.")
    rows = [{"group": LR_GROUPS[1], "lr": lr, "valid_loss": loss} for lr, loss in ((0.002, 1.50), (0.004, 1.45), (0.008, 1.62))]
    fig3a = {"experiment": "fig3a", "scale": scale, "rows": rows,
             "optima": {LR_GROUPS[1]: {"best_grid_lr": 0.004, "lr": 0.0041}}}
    text = _rates([fig3a])[1]
    assert "full CEM's own best rate on validation is 0.004" in text and "0.170 nats lower than at Llama's 0.008" in text
    assert "full CEM trains above its own optimum" in text
    # under the paper's rule alone, fig3a's own sweep (recorded in own_lrs) does not make the other variants swept
    fig3a["scale"] = {**scale, "rate_rules": ["paper"], "own_lrs": [["cpu64-cem-t2", 0.004]]}
    text = _rates([fig3a])[1]
    assert "The other CEM variants are not swept" in text and "Under the second rule" not in text
    fig3a["scale"] = {**scale, "rate_rules": ["paper", "own"], "own_lrs": [["cpu64-cem-t2", 0.004]]}
    text = _rates([fig3a])[1]
    assert "The other CEM variants are not swept" not in text and "Under the second rule" in text and "cpu64-cem-t2 0.004" in text
    fig3a["scale"] = scale
    fig3a["optima"][LR_GROUPS[1]]["best_grid_lr"] = 0.008
    assert "is Llama's rate too" in _rates([fig3a])[1]
    assert _rates([{"experiment": "fig2c", "scale": {"base": "micro"}}]) == []  # a scale without a sweep


def test_fig4s_alibi_quartet_checks_its_llama_against_the_ngrams_first(corpus, tmp_path, monkeypatch):
    """fig4-alibi: the regime check of Llama-ALiBi x1 (from cached fits, in its windows) leads, then fig4's recursion
    claim and its position-matched reuse control, as fig4 words them; a smoke scale (no findings) has no regime check."""
    from cem_study import analysis, ngram
    from cem_study.findings import Context
    from cem_study.registry import EXPERIMENTS, FIG4_ALIBI, fig4_findings

    monkeypatch.setenv("CEM_CACHE_DIR", str(tmp_path / "cache"))
    s = get_scale("gpu8", data=str(corpus))
    variants = EXPERIMENTS["fig4-alibi"].variants(s)
    losses = {"Llama ALiBi attention x1": [1.185, 1.19, 1.195], "Llama ALiBi attention x2": [1.18, 1.185, 1.19],
              "CEM attention T=1": [1.20, 1.21, 1.22], "CEM attention T=2": [1.17, 1.18, 1.19]}
    rows = [{"label": label, "lr": 2e-3, "budget_tokens": 33_472_000, "tokens": 33_472_512, "valid_loss": sum(x) / 3, "valid_loss_per_seed": x,
             "test_loss_per_seed": x, "test_perplexity": math.exp(sum(x) / 3), "seeds": [0, 1, 2], "processor_per_seed": [None] * 3}
            for label, x in losses.items()]
    n_train = len(ngram._splits(s.data, s.tokenizer, None)[0]["train"])
    atomic_write_json(analysis.ngram_cache(tmp_path, "cpu128-l8"), {"fits": _ngrams((1.30, 1.20, 1.15, 1.10), (1.32, 1.22, 1.17, 1.12), tokens=n_train, window=256)})
    monkeypatch.setattr(ngram, "ngram_baseline", lambda *a, **k: pytest.fail("fit although cached"))
    findings, extra = EXPERIMENTS["fig4-alibi"].analyze(Context(s, rows, variants, tmp_path, tmp_path))
    regime, *claims = findings
    assert regime.claim.startswith("(regime) cpu128-l8: the Llama-ALiBi baseline beats the best of the 5- to 8-gram models, the 8-gram")
    assert regime.verdict == "not held" and "the 7- and 8-gram beat Llama-ALiBi" in regime.evidence and extra["regime"]["cpu128-l8"]["speaks"] is False
    whole = [f.claim for f in fig4_findings(Context(s, rows + [dict(r, label=l) for r, l in zip(rows, ("Llama attention x1", "Llama attention x2",
                                                                                                     "CEM attention T=1 learned step", "CEM attention x2"))], [], tmp_path, tmp_path))[0]]
    assert [f.claim for f in claims] == [whole[0], whole[-1]] and [v.label for v in variants] == list(FIG4_ALIBI)
    smoke, _ = EXPERIMENTS["fig4-alibi"].analyze(Context(replace(s, findings=False), rows, variants, tmp_path, tmp_path))
    assert [f.claim for f in smoke] == [f.claim for f in claims]
