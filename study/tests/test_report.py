"""`cem-study report` of a scale that never speaks (smoke): written without --allow-short, labelled a pipeline check,
its differences printed without verdicts, p-values or power lines."""

import json
from dataclasses import replace
import math

import pytest

from cem_study.cli import main
from cem_study import write_report
from cem_study.report import pipeline_scale

ROW = {"label": "Llama micro", "parameters": 1e5, "attention_parameters": 2e4, "mlp_parameters": 5e4, "test_perplexity": 30.0,
       "test_perplexity_std": 1.0, "test_bits_per_byte": 4.9, "test_bits_per_byte_std": 0.1, "tokens": 384, "tokens_per_llama_parameter": 0.0}


def _suite(root, findings: bool):
    scale = {"name": "smoke" if not findings else "cpu", "data": "tinyshakespeare", "tokenizer": "byte", "sizes": ["micro"], "base": "micro",
             "seq_len": 32, "batch_size": 4, "grad_accum": 1, "max_steps": 3, "seeds": [0, 1], "recursion_seeds": [0, 1], "findings": findings}
    finding = {"claim": "CEM attention T=2 beats T=1", "verdict": "inconclusive", "family": "paper", "p": 0.4, "sign": 1,
               "difference": {"mean": 0.012, "lo": -0.05, "hi": 0.07, "n": 2},
               "evidence": "p = 0.4; at the observed mean and spread, about 5181 paired seeds would detect it (80% power)"}
    summary = {"experiment": "fig2c", "question": "attention", "scale": scale, "rows": [ROW], "findings": [finding],
               "short_runs": ["Llama micro"]}
    (root / "fig2c").mkdir(parents=True)
    (root / "fig2c" / "summary.json").write_text(json.dumps(summary))
    return root


def test_a_smoke_suite_reports_pipeline_checks_without_verdicts(tmp_path, capsys):
    root = _suite(tmp_path / "res", findings=False)
    assert main(["report", str(root)]) == 0  # no --allow-short: `cem-study experiment --scale smoke` wrote it
    report = (root / "report.md").read_text()
    assert report.startswith("> **Not the paper's protocol: a pipeline check.**") and "## Pipeline checks" in report
    assert "CEM attention T=2 beats T=1: difference +0.012 [95% CI -0.05, +0.07]" in report
    for verdict_word in ("held", "inconclusive", "p = ", "p_adj", "paired seeds would detect", "80% power", "## Verdicts"):
        assert verdict_word not in report, verdict_word
    assert pipeline_scale([json.loads((root / "fig2c" / "summary.json").read_text())]) == "smoke"


def test_a_short_suite_of_a_scale_that_speaks_still_needs_allow_short(tmp_path, capsys):
    root = _suite(tmp_path / "res", findings=True)
    assert main(["report", str(root)]) == 2 and "--allow-short" in capsys.readouterr().err
    report = write_report(root, allow_short=True).read_text()
    assert "## Verdicts" in report and "inconclusive" in report


def test_the_training_gap_pairs_each_step_of_the_same_seed(tmp_path):
    """`training_gap`: per seed, the difference at every logged step both runs have; per stretch, its mean, then
    the mean and range over the seeds; None when a run has no metrics.jsonl."""
    import json
    from dataclasses import replace

    import pytest

    from cem_study import EXPERIMENTS, get_scale
    from cem_study.findings import Context, training_gap

    s = replace(get_scale("smoke"), chosen_lrs=(("micro", 2e-3),))
    variants = EXPERIMENTS["fig2c"].variants(s)
    spec = {v.label: v.spec for v in variants}
    rows = [{"label": v.label, "seeds": [0, 1]} for v in variants]
    a, b = "CEM attention T=2", "CEM attention T=1"
    ctx = Context(s, rows, variants, tmp_path, tmp_path / "fig2c")
    assert training_gap(ctx, a, b) is None  # no runs yet
    for seed, offset in ((0, 0.1), (1, 0.3)):
        for label, loss in ((a, lambda t: 2.0 + offset * (t <= 20)), (b, lambda t: 2.0)):
            run = s.runs(tmp_path) / spec[label].with_seed(seed).slug
            run.mkdir(parents=True)
            steps = range(5, 45, 5) if label == a else range(5, 41, 5)  # a step only one run logged is not paired
            (run / "metrics.jsonl").write_text("".join(json.dumps({"step": t, "loss": loss(t)}) + "\n" for t in steps))
    g = training_gap(ctx, a, b, stretches=2)
    assert g["edges"] == [0, 20, 40] and g["seeds"] == [0, 1]
    assert g["mean"] == pytest.approx([0.2, 0.0]) and g["low"] == pytest.approx([0.1, 0.0]) and g["high"] == pytest.approx([0.3, 0.0])


def test_the_second_rate_rule_says_why_a_finding_has_no_verdict_and_when_it_reads_the_same_runs():
    """The verdict table's own-rate cell: a verdict (marked as read from the same runs when every own rate is
    Llama's), a control or our check at Llama's rate under both rules, or what the rule still waits for; the learning-rate
    line gathers the own rates every experiment chose."""
    from cem_study.report import _own_cell, _rates, _same_runs

    diff = {"mean": -0.0016, "lo": -0.0038, "hi": 0.0007, "n": 5}
    paper = {"claim": "T=2 improves on T=1", "verdict": "inconclusive", "family": "paper", "p": 0.13, "difference": diff}
    control = {**paper, "claim": "T=2 improves on T=1 with a learned gain", "family": "control"}
    rows = [{**ROW, "label": "CEM attention T=1", "lr": 2e-3, "seeds": [0, 1]}, {**ROW, "label": "Llama micro", "lr": 2e-3, "seeds": [0, 1]}]
    scale = {"chosen_lrs": [["micro", 2e-3]], "rate_rules": ["paper", "own"], "base": "micro", "lr_tie": 0.005, "own_lrs": []}
    same = {"experiment": "fig2c", "rows": rows, "findings": [paper, control], "scale": {**scale, "own_lrs": [["micro-cem-attn", 2e-3]]},
            "rules": {"own": {"rule": "own", "rows": rows, "findings": [paper]}}}
    assert _same_runs(same) and "the same runs" in _own_cell(same, paper) and "inconclusive" in _own_cell(same, paper)
    assert _own_cell(same, control) == "— (a control: at Llama's rate under both rules)"
    moved = {**same, "rules": {"own": {**same["rules"]["own"], "rows": [{**rows[0], "lr": 4e-3}, rows[1]]}}}
    assert not _same_runs(moved) and "the same runs" not in _own_cell(moved, paper)
    waiting = {"experiment": "fig2a", "rows": rows, "findings": [paper], "scale": scale, "rules": {}, "pending": {"own": "a sweep (2 runs)"}}
    assert _own_cell(waiting, paper) == "waiting for a sweep (2 runs)" and not _same_runs(waiting)
    lr = {"experiment": "lr", "rows": rows, "findings": [], "scale": scale}  # written before any own-rate sweep ran
    (line,) = [x for x in _rates([lr, waiting, same]) if x]
    assert "micro-cem-attn 0.002" in line


def test_the_report_states_each_pair_seeds_decision(tmp_path):
    """An experiment whose recursion pair added seeds (`cem_study.seeds`) says so in its section, and the
    opening names the pair's seeds and the rule; one that kept its first seeds says why, and adds no seeds to the opening."""
    from cem_study.seeds import PairSeeds

    root = _suite(tmp_path / "res", findings=True)
    path = root / "fig2c" / "summary.json"
    summary = json.loads(path.read_text())
    summary["scale"]["more_pair_seeds"] = [["fig2c", [3, 4]]]
    added = PairSeeds("fig2c", (0, 1), (-0.0012, -0.0024), 0.0019, (3, 4))
    path.write_text(json.dumps({**summary, "pair_seeds": {**added.to_dict(), "text": added.text()}}))
    report = write_report(root, allow_short=True).read_text()
    assert "Seeds: the T=1/T=2 pair's validation difference (T=1 - T=2) on seeds [0, 1] is -0.0018 nats" in report
    assert "resolve 0.0019 nats (80% power), more than half the observed difference, so it trains seeds [3, 4] too." in report
    assert "[0, 1, 3, 4] for fig2c's T=1/T=2 pair" in report and "adds seeds [3, 4] where its first seeds do not resolve" in report
    kept = PairSeeds("fig2c", (0, 1), (0.010, 0.011), 0.002, ())
    path.write_text(json.dumps({**summary, "pair_seeds": {**kept.to_dict(), "text": kept.text()}}))
    report = write_report(root, allow_short=True).read_text()
    assert "resolve 0.0020 nats (80% power), at most half the observed difference, so it keeps them." in report
    assert "for fig2c's T=1/T=2 pair" not in report


def test_a_one_seed_row_names_its_seed_instead_of_a_zero_spread(tmp_path):
    root = _suite(tmp_path / "res", findings=False)
    summary = json.loads((root / "fig2c" / "summary.json").read_text())
    summary["rows"] = [{**ROW, "seeds": [0], "test_perplexity_std": 0.0}, {**ROW, "label": "Llama micro (3 seeds)", "seeds": [0, 1, 2]}]
    (root / "fig2c" / "summary.json").write_text(json.dumps(summary))
    assert main(["report", str(root)]) == 0
    report = (root / "report.md").read_text()
    assert "| 30.000 (seed 0) | 4.9000 (seed 0) |" in report and "± 0.000" not in report
    assert "| 30.000 ± 1.000 | 4.9000 ± 0.1000 |" in report


def test_a_finding_with_no_pair_on_one_processor_says_so_in_the_headline():
    """A finding whose every seed's runs ran on different processors has no difference (n = 0, mean nan): the
    headline says why, not "+nan, one seed"."""
    from cem_study.report import _diff

    assert _diff({"difference": {"n": 0, "mean": float("nan")}}) == "no pair of runs on one processor"
    assert _diff({"difference": {"n": 1, "mean": 0.01}}) == "difference +0.01, one seed"
    assert _diff({"difference": {"n": 3, "mean": 0.01, "lo": 0.005, "hi": 0.015}}) == "difference +0.01 [95% CI +0.005, +0.015]"


def test_the_report_draws_the_differences_behind_its_verdicts(tmp_path, monkeypatch):
    """verdicts.png: one row per finding of test loss at a size that speaks, drawn from the helpers' own findings
    (each kind), the second rule's interval beside a finding where it reads other runs; a finding of another
    quantity (no contrast) is not drawn; the report links the figure."""
    import matplotlib.axes

    from cem_study.findings import close, lower, not_worse

    def rows(shift):
        mk = lambda label, base: {"label": label, "seeds": [0, 1, 2], "test_loss_per_seed": [base + 0.01 * s for s in range(3)],  # noqa: E731
                                  "test_perplexity": 3.2}
        return [mk("Llama micro", 1.17), mk("CEM attention T=1", 1.18 + shift), {**mk("CEM attention T=2", 1.175), "test_loss_per_seed": [1.175, 1.186, 1.194]}]

    paper = [lower(rows(0), "CEM attention T=2", "CEM attention T=1", "T=2 improves on T=1").to_dict(),
             close(rows(0), "CEM attention T=1", "Llama micro", "CEM attention is close to Llama", 0.02).to_dict(),
             not_worse(rows(0), "CEM attention T=2", "Llama micro", "CEM T=2 matches or beats Llama", 0.01).to_dict(),
             {"claim": "(ours) attention: the trained steps descend the layer's energy", "verdict": "held", "evidence": "4/4", "family": "ours", "kind": "count"}]
    own = [lower(rows(0.004), "CEM attention T=2", "CEM attention T=1", "T=2 improves on T=1").to_dict()]
    assert [f["kind"] for f in paper] == ["directional", "equivalence", "non-inferiority", "count"]
    assert paper[0]["contrast"] == "CEM attention T=2 - CEM attention T=1" and paper[1]["margin"] == pytest.approx(math.log1p(0.02))
    root = _suite(tmp_path / "res", findings=True)
    path = root / "fig2c" / "summary.json"
    summary = json.loads(path.read_text())
    own_rows = [{**ROW, "label": "CEM attention T=1", "lr": 4e-3}]
    path.write_text(json.dumps({**summary, "findings": paper, "rows": [{**ROW, "label": "CEM attention T=1", "lr": 2e-3}],
                                "rules": {"own": {"rule": "own", "rows": own_rows, "findings": own}}}))
    drawn = []
    real = matplotlib.axes.Axes.errorbar
    monkeypatch.setattr(matplotlib.axes.Axes, "errorbar", lambda self, x, y, **k: drawn.append((x, k.get("mfc"))) or real(self, x, y, **k))
    report = write_report(root, allow_short=True).read_text()
    assert "![verdicts](verdicts.png)" in report and (root / "verdicts.png").stat().st_size > 10_000
    # three findings of test loss, and the first one's second-rule interval (open marker), in verdicts.png and again in
    # verdicts_paper.png (the paper's findings alone: here all three)
    assert len(drawn) == 8 and (root / "verdicts_paper.png").exists()
    assert sum(mfc == "white" for _, mfc in drawn) == 2
    # a second-rule finding with no pair of runs on one processor (n = 0, mean nan) draws nothing and moves no axis
    unpaired = {**own[0], "difference": {"mean": float("nan"), "lo": float("nan"), "hi": float("nan"), "n": 0, "p": float("nan")}}
    path.write_text(json.dumps({**json.loads(path.read_text()), "rules": {"own": {"rule": "own", "rows": own_rows, "findings": [unpaired]}}}))
    drawn.clear()
    write_report(root, allow_short=True)
    assert len(drawn) == 6 and all(math.isfinite(x) for x, _ in drawn)


def test_a_verdict_row_names_its_family_once(tmp_path, monkeypatch):
    """verdicts.png labels a control's or our finding with its family, but not twice where the claim says it."""
    import matplotlib.axes

    from cem_study.findings import close
    from cem_study.plots import plot_verdicts

    mk = lambda label, base: {"label": label, "seeds": [0, 1, 2], "test_loss_per_seed": [base, base + 0.002, base - 0.001],  # noqa: E731
                              "test_perplexity": 3.2}
    rows = [mk("A", 1.17), mk("B", 1.18)]
    ours = close(rows, "A", "B", "(ours) A is close to B", 0.02, family="ours").to_dict()
    control = close(rows, "A", "B", "A is close to B with the same positions", 0.02, family="control").to_dict()
    seen = []
    real = matplotlib.axes.Axes.set_yticks
    monkeypatch.setattr(matplotlib.axes.Axes, "set_yticks", lambda self, ticks, labels=None, **k: seen.extend(labels or []) or real(self, ticks, labels, **k))
    plot_verdicts([("positional", ours, None), ("fig2a", control, None)], "t", tmp_path / "v.png")
    assert seen[0].startswith("positional: (ours) A is close to B") and seen[1].startswith("fig2a (control): A is close")


def test_the_verdicts_plot_draws_a_one_seed_difference_without_an_interval(tmp_path):
    """A pipeline check measured on one seed has a mean and no interval (lo, hi NaN): drawn as a point, the axis
    from the finite ends (the rehearsal's plot of pipeline checks failed: "Axis limits cannot be NaN or Inf")."""
    from cem_study.plots import plot_verdicts

    nan = float("nan")
    one = {"claim": "T=2 improves on T=1", "verdict": "not held", "kind": "directional", "family": "paper", "sign": -1,
           "contrast": "T=2 - T=1", "difference": {"mean": 0.027, "lo": nan, "hi": nan, "n": 1, "p": nan}}
    plot_verdicts([("fig4", one, None)], "one seed", tmp_path / "v.png")
    assert (tmp_path / "v.png").stat().st_size > 5_000


def test_each_kind_of_finding_holds_in_its_own_region():
    from cem_study.findings import Finding
    from cem_study.plots import held_region
    from cem_study.report import kind

    assert held_region({"kind": "directional", "sign": 1}) == (0.0, math.inf)
    assert held_region({"kind": "directional", "sign": -1}) == (-math.inf, 0.0)
    assert held_region({"kind": "equivalence", "margin": 0.02}) == (-0.02, 0.02)
    assert held_region({"kind": "non-inferiority", "margin": 0.01}) == (-math.inf, 0.01)
    with pytest.raises(ValueError, match="unknown kind of finding 'bayesian'"):
        Finding("x", "held", "y", kind="bayesian")
    # summaries written before findings named their kind: the energy study's count is not an equivalence test
    assert kind({"claim": "energy", "verdict": "held", "evidence": "4/4"}) == "count"
    assert kind({"evidence": "non-inferiority margin +1% ppl", "difference": {"n": 3}}) == "non-inferiority"
    assert kind({"evidence": "equivalence margin ±2% ppl", "difference": {"n": 3}}) == "equivalence"


def test_the_report_names_each_cpu_with_its_family_recorded_or_inferred():
    from cem_study.report import _provenance

    zen2 = {"processor": "AMD EPYC", "device": "AMD EPYC (1 thread)", "cpu_id": "AuthenticAMD family 23 model 49 stepping 0",
            "torch": "2.13.0+cpu", "commit": "a" * 40}
    zen4 = "AMD EPYC (AuthenticAMD family 25 model 17 stepping 1)"
    runs = [{"sessions": [zen2]}, {"sessions": [zen2, {**zen2, "cpu_id": "AuthenticAMD family 25 model 17 stepping 1"}]},
            {"sessions": [{"processor": "AMD EPYC", "device": "AMD EPYC (1 thread)", "torch": "2.13.0+cpu", "commit": "b" * 40}]},
            {"device": "AMD EPYC (1 thread)", "processor_inferred": {"processor": zen4, "by": "a check"}}]
    text = _provenance(runs)
    assert (f"Processors: AMD EPYC (AuthenticAMD family 23 model 49 stepping 0) (2 runs), {zen4} (2 runs), AMD EPYC (1 run). "
            "1 of them predates the record") in text
    assert "predate the record" not in _provenance(runs[:3])


def test_every_difference_reads_one_way():
    """Every finding of test loss the cpu128 suite plans (`registry.planned`) reads its Δ one way: CEM minus the other
    model where one side only is CEM, else the side the claim favours minus the other (negative: that side better);
    recursion against reuse is the change of loss of recursion minus that of reuse."""
    from cem_study import EXPERIMENTS, get_scale
    from cem_study.registry import planned

    s = replace(get_scale("cpu128"), chosen_lrs=(("cpu128", 2e-3),))
    seen = 0
    for exp_id in s.suite:
        exp = EXPERIMENTS[exp_id]
        arch = {v.label: v.spec.arch for v in exp.variants(s)} if exp.variants else {}
        for f in planned(exp, s) or []:
            if not f.contrast:
                continue
            seen += 1
            if f.contrast.startswith("("):  # a difference of loss changes: recursion's first, the claim's side
                assert f.sign == -1 and f.kind == "directional", f.claim
                continue
            a, b = f.contrast.split(" - ")
            if arch[a].startswith("cem") != arch[b].startswith("cem"):
                assert arch[a].startswith("cem"), f.claim
            elif f.kind == "directional":
                assert f.sign == -1, f.claim  # the side the claim favours first
    assert seen >= 20


def _family_suite(root, pending_fig2b: bool):
    """fig2c analysed under both rules, fig3b (no own-rate variant) and fig2b (its own rule waiting, or not) at a scale
    whose suite also holds fig3c, not analysed yet."""
    from cem_study import get_scale

    scale = replace(get_scale("cpu128"), chosen_lrs=(("cpu128", 2e-3),), suite=("fig2c", "fig3b", "fig2b", "fig3c")).to_dict()
    mk = lambda claim, p, mean=-0.01: {"claim": claim, "verdict": "held", "family": "paper", "p": p, "sign": -1, "kind": "directional",  # noqa: E731
                                        "difference": {"mean": mean, "lo": mean - 0.005, "hi": mean + 0.005, "n": 3, "p": p},
                                        "evidence": "e", "contrast": "CEM attention T=2 - CEM attention T=1"}
    rows = [{**ROW, "label": "CEM attention T=1", "lr": 2e-3, "seeds": [0, 1, 2]}]
    own = {"rule": "own", "rows": rows, "findings": [mk("c T=2 improves", 0.001)]}
    for exp_id, findings, rules, pending in (
            ("fig2c", [mk("c T=2 improves", 0.001)], {"own": own}, {}),
            ("fig3b", [mk("a diagonal is needed", 0.002),  # and a finding measured on one seed by design: no p-value, no family member
                       {**mk("one seed", float("nan")), "difference": {"mean": -0.01, "lo": -0.01, "hi": -0.01, "n": 1, "p": float("nan")}}], {}, {}),
            ("fig2b", [mk("CEM MLP worse", 0.003)], {} if pending_fig2b else {"own": {**own, "findings": [mk("CEM MLP worse", 0.003)]}},
             {"own": "the own-rate sweep of cpu128-cem-mlp-matched (2 runs to train)"} if pending_fig2b else {})):
        (root / exp_id).mkdir(parents=True)
        (root / exp_id / "summary.json").write_text(json.dumps({"experiment": exp_id, "question": exp_id, "scale": scale, "rows": rows,
                                                                "findings": findings, "rules": rules, "pending": pending}))
    return root


def test_holm_families_are_the_suites_and_the_second_rule_judges_the_same_claims(tmp_path):
    """The paper's family at this suite has 1 (fig2c) + 1 (fig3b; its one-seed finding has no p-value to correct) + 1 (fig2b)
    directional findings in so far and the
    2 of fig3c, not analysed (its registry's): 5, each one not measured counting as p = 1; the second rule's family is
    the same 5, fig3b judged there on its paper-rule runs, fig2b's waiting finding and fig3c's counted unmeasured; the
    report says the Holm verdicts are provisional."""
    from cem_study.findings import Finding, adjust

    fs = [Finding("a", "held", "", {"mean": 1.0, "lo": 0, "hi": 0, "n": 3}, "paper", 0.01)]
    adjust(fs, {"paper": 3})
    assert fs[0].p_adjusted == pytest.approx(0.03)  # a family of three, two of its members not measured yet
    report = write_report(_family_suite(tmp_path / "res", pending_fig2b=True)).read_text()
    assert "(Holm: held, p_adj = 0.005)" in report  # fig2c's 0.001 times the 5 claims (3 measured), not times 3
    assert "5 paper, 2 control directional findings under the paper's rate rule, the 5 of the paper's under the second" in report
    own_line = next(x for x in report.splitlines() if x.startswith("| fig2c | c T=2 improves"))
    assert own_line.count("p_adj = 0.005") == 2  # the second rule: the same family of 5 (fig3b on the same runs; fig2b waiting)
    fig3b = next(x for x in report.splitlines() if x.startswith("| fig3b |"))
    assert "(the same runs: no variant here has an own rate)" in fig3b and fig3b.count("p_adj = 0.008") == 2
    assert "The Holm verdicts are provisional" in report


def test_the_first_screen_is_a_table_and_the_figure(tmp_path):
    """The report opens (after its interim notes) with one line per finding: the claim, the paper's figure, Δ as a
    perplexity ratio with its interval, the verdicts; then the forest plot; the details follow."""
    report = write_report(_family_suite(tmp_path / "res", pending_fig2b=True)).read_text()
    body = report[report.index("# CEM experiments"):]
    first = body[:body.index("## How the findings were made and judged")]
    assert "| claim | paper | Δ test perplexity [95% CI] | verdict | at each CEM variant's own rate |" in first
    assert "| c T=2 improves | Fig. 2c | -1.00% [-1.49%, -0.50%] | ✅ held; Holm: held |" in first
    assert "| CEM MLP worse | Fig. 2b | -1.00% [-1.49%, -0.50%] | ✅ held; Holm: held | waiting |" in first
    assert "![verdicts](verdicts.png)" in first and "negative is CEM better" in first
    assert (tmp_path / "res" / "verdicts_paper.png").stat().st_size > 10_000


def test_a_summary_behind_the_runs_its_experiment_now_asks_for_says_so(tmp_path):
    """A summary that `--analyse-only` left standing while runs its experiment now asks for train (`awaits`): the
    report shows it as last analysed and names what it waits for, and its Holm verdicts are provisional."""
    root = _family_suite(tmp_path / "res", pending_fig2b=False)
    path = root / "fig2c" / "summary.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "awaits": "2 of its 32 runs to train or evaluate"}))
    report = write_report(root).read_text()
    assert "> **Interim report: 1 experiment(s) shown as last analysed**, not all the runs they now ask for finished yet: " \
           "fig2c: 2 of its 32 runs to train or evaluate." in report
    assert "The Holm verdicts are provisional" in report


def test_a_summary_waiting_for_a_sweep_already_decided_is_refused(tmp_path, capsys):
    """fig2b's summary, analysed before its plain CEM MLP's sweep landed, still waits for it: `cem report` refuses
    to call the sweep waiting and says to analyse fig2b again; a sweep another key only begins with does not count."""
    root = _family_suite(tmp_path / "res", pending_fig2b=True)
    path = root / "fig2b" / "summary.json"
    summary = json.loads(path.read_text())
    (root / "lr").mkdir()
    (root / "lr" / "choices.json").write_text(json.dumps({"cpu128-cem-mlp": {"lr": 2e-3, "grid": [1e-3, 2e-3, 4e-3], "seeds": [0]}}))
    assert "cpu128-cem-mlp-matched (2 runs" in summary["pending"]["own"]
    write_report(root)  # waiting for the wider one's sweep only: not decided
    summary["pending"]["own"] = "the own-rate sweeps of cpu128-cem-mlp (2 runs to train) and cpu128-cem-mlp-matched (2 runs to train)"
    path.write_text(json.dumps(summary))
    assert main(["report", str(root)]) == 2
    assert "waits for the own-rate sweep of cpu128-cem-mlp, which" in capsys.readouterr().err


@pytest.mark.parametrize("campaign", ["cpu", "cpu128", "micro", "h200/cpu128"])
def test_each_committed_report_regenerates_byte_for_byte(campaign, tmp_path):
    """`cem-study report study/results/CAMPAIGN` on a copy of the committed results writes the committed report.md again,
    byte for byte (issue 60): the summaries and the run tables hold everything a report says."""
    import shutil
    from pathlib import Path

    results = Path(__file__).resolve().parents[2] / "study" / "results"
    shutil.copytree(results, tmp_path / "results")
    assert main(["report", str(tmp_path / "results" / campaign)]) == 0
    assert (tmp_path / "results" / campaign / "report.md").read_bytes() == (results / campaign / "report.md").read_bytes()
