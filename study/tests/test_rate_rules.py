"""The rate rules (the paper's: every variant at its Llama's rate; each CEM variant at its own best rate), the
tie rule of a sweep, the processor a suite trains on, and the cpu128 scale's runs shared with the cpu suite."""

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from cem_study import RunSpec, get_scale, run_experiment
from cem_study.lr import pick, sweep_key
from cem_study.records import RunTable
from cem_study.registry import EXPERIMENTS, RATE_RULES, own_template, own_templates, variants_under
from cem_study.runner import analyse_finished, plan
from cem_study.report import write_report
from cem_study.scales import LearningRateNotChosen
from cem_study.sweep import run_status, run_sweep

REPO = Path(__file__).resolve().parents[2]


def test_ties_within_the_tolerance_go_to_the_lower_rate():
    losses = {1e-3: 1.2028, 2e-3: 1.1994, 4e-3: 1.1985}  # full CEM at cpu128, seed 0 (study/results/cpu-rates)
    assert pick(losses) == 4e-3
    assert pick(losses, 0.001) == 2e-3
    assert pick(losses, 0.005) == 1e-3


def test_own_rate_variants_wait_for_their_sweep_and_then_train_at_its_choice():
    s = replace(get_scale("cpu128"), chosen_lrs=(("cpu128", 2e-3),))
    exp = EXPERIMENTS["fig2c"]
    keys = [sweep_key(t) for t in own_templates(exp, s)]
    assert keys == ["cpu128-cem-attn-attn_precond=diag_lowrank", "cpu128-cem-attn-attn_precond=diag_lowrank-attn_steps=2"]
    with pytest.raises(LearningRateNotChosen, match="attn_steps=2"):
        variants_under(exp, replace(s, own_lrs=((keys[0], 1e-3),)), "own")
    own = {v.label: v for v in variants_under(exp, replace(s, own_lrs=((keys[0], 1e-3), (keys[1], 4e-3))), "own")}
    assert dict(own["CEM attention T=1"].spec.train)["lr"] == 1e-3 and dict(own["CEM attention T=2"].spec.train)["lr"] == 4e-3
    # the controls and the Llamas stay at Llama's rate (2e-3, the training default: no override)
    assert dict(own["CEM attention T=1 learned step"].spec.train) == {} and dict(own["Llama cpu128"].spec.train) == {}
    assert own_template(own["CEM attention T=2"].spec) == own_template(next(v for v in exp.variants(s) if v.label == "CEM attention T=2").spec)
    assert own_templates(exp, get_scale("cpu")) == []  # a scale without the own rule sweeps nothing more
    with pytest.raises(ValueError, match="unknown rate rule 'best'"):
        variants_under(exp, s, "best")
    assert set(RATE_RULES) == {"paper", "own"}


@pytest.mark.slow
def test_both_rate_rules_end_to_end(corpus, tmp_path, monkeypatch):
    """A smoke-sized fig2c under both rules: the own-rate sweeps are seed-0, recorded, and the summary carries the
    paper-family findings again with each CEM variant at its own rate."""
    monkeypatch.setenv("CEM_CACHE_DIR", str(tmp_path / "cache"))
    kw = dict(data=str(corpus), seeds=(0, 1), recursion_seeds=(0, 1), lr_sweep=True, lrs=(1e-3, 2e-3, 4e-3), lr_extend=1,
              lr_sweep_seeds=1, rate_rules=("paper", "own"))
    root = tmp_path / "res"
    summary = run_experiment("fig2c", "smoke", root, **kw)
    record = json.loads((root / "lr" / "choices.json").read_text())
    t1, t2 = "micro-cem-attn-attn_precond=diag_lowrank", "micro-cem-attn-attn_precond=diag_lowrank-attn_steps=2"
    assert record[t1]["seeds"] == [0] and record["micro-llama"]["seeds"] == [0]
    own = summary["rules"]["own"]
    rows = {r["label"]: r for r in own["rows"]}
    assert rows["CEM attention T=1"]["lr"] == record[t1]["lr"] and rows["CEM attention T=2"]["lr"] == record[t2]["lr"]
    assert rows["CEM attention T=1 learned step"]["lr"] == record["micro-llama"]["lr"]
    assert own["findings"] and all(f["family"] == "paper" for f in own["findings"])
    assert {f["claim"] for f in own["findings"]} <= {f["claim"] for f in summary["findings"]}
    # --analyse-only on the finished campaign judges it as the run did, training nothing
    again, waiting = analyse_finished("smoke", root, ids=("fig2c",), **kw)
    assert waiting == {} and again[0]["pending"] == {}
    assert again[0]["findings"] == summary["findings"] and again[0]["rules"] == summary["rules"]


def test_a_suite_trains_on_its_processor_only(corpus, tmp_path, monkeypatch):
    """A finished run recorded on another processor is trained again; a machine with another refuses to train."""
    monkeypatch.setenv("CEM_CACHE_DIR", str(tmp_path / "cache"))
    import cem.provenance

    s = get_scale("smoke", data=str(corpus))
    spec = RunSpec.make("micro", "llama")
    run_sweep([spec], s, tmp_path)
    res_path = tmp_path / "runs" / spec.slug / "results.json"
    here = json.loads(res_path.read_text())["sessions"][0]["processor"]
    assert run_status(spec, replace(s, processor=here), tmp_path) == "finished"
    assert run_status(spec, replace(s, processor="Another CPU"), tmp_path) == "again"
    monkeypatch.setattr(cem.provenance, "processor", lambda device=None: "Another CPU")  # as if on another machine
    other = RunSpec.make("micro", "llama", seed=1)
    with pytest.raises(ValueError, match=f"trains on {re.escape(here)} only.*this machine is Another CPU"):
        run_sweep([spec, other], replace(s, processor=here), tmp_path)
    assert not (tmp_path / "runs" / other.slug).exists() and res_path.exists()
    run_sweep([spec], replace(s, processor="Another CPU"), tmp_path)  # the run recorded here is trained again there
    assert [x["processor"] for x in json.loads(res_path.read_text())["sessions"]] == ["Another CPU"]


def test_a_campaign_of_seed_blocks_trains_each_size_and_seed_on_one_processor(corpus, tmp_path, monkeypatch):
    """With `seed_blocks`, a block (size, seed) that another processor has started is left to it: its finished runs are
    never trained again, its other runs are not trained here while the rest are (`BlocksElsewhere` names them), a sweep
    of nothing but such runs is refused (naming the blocks this machine may train), and a block no processor has started
    trains here: the same seed at another size included."""
    monkeypatch.setenv("CEM_CACHE_DIR", str(tmp_path / "cache"))
    import cem.provenance
    from cem_study.sweep import BlocksElsewhere

    s = replace(get_scale("smoke", data=str(corpus)), seed_blocks=True, sizes=("micro", "tiny"))
    first = RunSpec.make("micro", "llama")
    run_sweep([first], s, tmp_path)
    here = json.loads((tmp_path / "runs" / first.slug / "results.json").read_text())["sessions"][0]["processor"]
    assert get_scale("screen64").seed_blocks and get_scale("confirm").seed_blocks and not get_scale("cpu128").seed_blocks
    monkeypatch.setattr(cem.provenance, "processor", lambda device=None: "Another CPU")  # as if on another machine
    elsewhere = replace(s, processor="Another CPU")
    assert run_status(first, elsewhere, tmp_path) == "finished"  # not trained again: its block is the other processor's
    same_block, other_size = RunSpec.make("micro", "cem"), RunSpec.make("tiny", "llama")
    with pytest.raises(ValueError, match=rf"another holds seed 0 at micro on {re.escape(here)}; this machine is Another CPU: "
                                         r"train --seeds 0,1 here \(blocks started here or by none: seed 1 at micro, seeds 0 and 1 at tiny\)"):
        run_sweep([first, same_block], elsewhere, tmp_path)
    assert not (tmp_path / "runs" / same_block.slug).exists()
    with pytest.raises(BlocksElsewhere, match=rf"1 run left to the processors that hold its block \(seed 0 at micro on {re.escape(here)}\)") as e:
        run_sweep([same_block, other_size], elsewhere, tmp_path)  # seed 0 at tiny trains here; seed 0 at micro is left
    assert e.value.runs == [same_block.slug] and not (tmp_path / "runs" / same_block.slug).exists()
    assert json.loads((tmp_path / "runs" / other_size.slug / "results.json").read_text())["sessions"][0]["processor"] == "Another CPU"
    run_sweep([RunSpec.make("micro", "cem", seed=1)], elsewhere, tmp_path)  # a block none has started trains here
    monkeypatch.setattr(cem.provenance, "processor", lambda device=None: "A third CPU")
    with pytest.raises(ValueError, match=r"another holds seed 1 at micro on Another CPU[^;]*; this machine is A third CPU: train --seeds 1 here "
                                         r"\(blocks started here or by none: seed 1 at tiny\)"):
        run_sweep([RunSpec.make("micro", "cem-attn", seed=1)], s, tmp_path)


def test_the_command_stops_in_order_when_the_rest_is_another_processors(tmp_path, monkeypatch, capsys):
    """`cem-study experiment` where the runs left are of blocks another processor holds: they are named with their
    processor, no report is written, and the exit status is 0 (what this machine may train has trained)."""
    import cem_study as ex
    from cem_study.cli import main
    from cem_study.sweep import BlocksElsewhere

    def stopped(*a, **kw):
        raise BlocksElsewhere(["cpu128-llama-s0", "cpu128-cem-s0"], "seed 0 at cpu128 on A CPU", "This CPU")

    monkeypatch.setattr(ex, "run_suite", stopped)
    monkeypatch.setattr(ex, "write_report", lambda *a, **kw: pytest.fail("a report was written"))
    assert main(["experiment", "recipes-confirm", "--scale", "smoke", "--results", str(tmp_path / "res")]) == 0
    out = capsys.readouterr().out
    assert "2 runs left to the processors that hold their blocks (seed 0 at cpu128 on A CPU)" in out and "this machine is This CPU" in out


def test_a_rate_decided_on_another_processors_runs_is_decided_again_on_the_suites(corpus, tmp_path, monkeypatch):
    """A sweep's record names the processors of the runs it was decided on. A decision made (in part) on another
    processor's runs compared losses across processors: at a suite with a processor it is made again once those
    runs have trained there, the record keeping the decision it replaces. A record older than its `processors` is
    read from the runs still in the folder (their losses are the recorded ones); one whose runs changed stands."""
    from cem_study.lr import decided_elsewhere, llama, recorded
    from cem.provenance import recorded_processors

    monkeypatch.setenv("CEM_CACHE_DIR", str(tmp_path / "cache"))
    kw = dict(data=str(corpus), seeds=(0,), recursion_seeds=(0,), lr_sweep=True, lrs=(1e-3, 4e-3), lr_extend=0)
    root = tmp_path / "res"
    run_experiment("lr", "smoke", root, **kw)
    record_path = root / "lr" / "choices.json"
    first = json.loads(record_path.read_text())["micro-llama"]
    run = root / "runs" / RunSpec.make("micro", "llama", train={"lr": 4e-3}).slug / "results.json"
    here = recorded_processors(json.loads(run.read_text()))[0]
    assert first["processors"] == [here]
    s = get_scale("smoke", processor=here, **kw)
    assert decided_elsewhere(s, llama("micro"), root, recorded(s, llama("micro"), root)) == []

    # the 4e-3 run as trained on another CPU, and the record as made before it named processors
    res = json.loads(run.read_text())
    for session in res["sessions"]:
        session.update(processor="Another CPU", cpu_id=None)
    run.write_text(json.dumps(res))
    record_path.write_text(json.dumps({"micro-llama": {k: v for k, v in first.items() if k != "processors"}}))
    assert decided_elsewhere(s, llama("micro"), root, recorded(s, llama("micro"), root)) == ["Another CPU"]
    assert decided_elsewhere(replace(s, processor=None), llama("micro"), root, recorded(s, llama("micro"), root)) == []
    assert plan("smoke", root, ("lr",), processor=here, **kw)["experiments"]["lr"]["again"] == 1  # not decided meanwhile
    moved = {**res, "valid_loss": res["valid_loss"] + 1.0}  # the runs are no longer those it was made on
    run.write_text(json.dumps(moved))
    assert decided_elsewhere(s, llama("micro"), root, recorded(s, llama("micro"), root)) == []
    run.write_text(json.dumps(res))

    run_experiment("lr", "smoke", root, processor=here, **kw)  # trains the 4e-3 run here, and decides again
    again = json.loads(record_path.read_text())["micro-llama"]
    assert again["processors"] == [here] and set(again["valid_loss"]) == set(first["valid_loss"])
    assert again["superseded"]["lr"] == first["lr"] and "Another CPU" in again["superseded"]["why"]
    assert recorded_processors(json.loads(run.read_text())) == [here]
    assert again["lr"] == pick({float(k): v for k, v in again["valid_loss"].items()}, s.lr_tie)
    assert f"micro-llama's rate was decided again ({again['lr']:g}; it had been {first['lr']:g}, decided on runs of Another CPU" in write_report(root).read_text()


def test_a_rate_decided_with_another_tie_is_decided_again_on_the_same_runs(corpus, tmp_path, monkeypatch):
    """A recorded decision made with another tie than the scale's (cpu128's went from 0.005 to 0.002 nats) is made
    again on the same runs, over its whole recorded grid, with nothing trained; the record keeps the decision it
    replaces and says why, and so does the report. A record older than its tie was made with none: it stands at a
    scale without one."""
    from cem_study.lr import llama, sweep

    monkeypatch.setenv("CEM_CACHE_DIR", str(tmp_path / "cache"))
    kw = dict(data=str(corpus), seeds=(0,), recursion_seeds=(0,), lr_sweep=True, lrs=(1e-4, 3e-3), lr_extend=0)
    root = tmp_path / "res"
    run_experiment("lr", "smoke", root, **kw)
    record_path, s = root / "lr" / "choices.json", get_scale("smoke", **kw)
    first = json.loads(record_path.read_text())["micro-llama"]
    losses = {float(k): v for k, v in first["valid_loss"].items()}
    assert first["lr"] == 3e-3 and first["tie"] == s.lr_tie == 0.0 and losses[1e-4] > losses[3e-3]  # the short run's best
    runs = {p.name: p.stat().st_mtime_ns for p in (root / "runs").iterdir()}

    wide = losses[1e-4] - losses[3e-3] + 0.01  # a tie wide enough to have chosen the lower rate
    record_path.write_text(json.dumps({"micro-llama": {**first, "lr": 1e-4, "tie": wide}}))
    assert sweep(s, llama("micro"), root, dry=True).best == 3e-3  # a dry look decides again, writes nothing
    assert json.loads(record_path.read_text())["micro-llama"]["lr"] == 1e-4
    run_experiment("lr", "smoke", root, **kw)
    again = json.loads(record_path.read_text())["micro-llama"]
    assert again["lr"] == 3e-3 and again["tie"] == 0.0 and again["grid"] == first["grid"]
    assert again["superseded"]["lr"] == 1e-4 and again["superseded"]["why"] == f"decided with ties within {wide:g} nats; the scale's tie is now 0"
    assert {p.name: p.stat().st_mtime_ns for p in (root / "runs").iterdir()} == runs  # nothing trained
    assert f"micro-llama's rate was decided again (0.003; it had been 0.0001, decided with ties within {wide:g} nats" in write_report(root).read_text()

    history = {"lr": 1e-4, "why": "decided on runs of Another CPU, not of this one only"}  # the same rate again: no new entry
    record_path.write_text(json.dumps({"micro-llama": {**first, "tie": wide, "superseded": history}}))
    run_experiment("lr", "smoke", root, **kw)
    assert json.loads(record_path.read_text())["micro-llama"]["superseded"] == history

    record_path.write_text(json.dumps({"micro-llama": {k: v for k, v in {**first, "lr": 1e-4}.items() if k != "tie"}}))
    assert sweep(s, llama("micro"), root, dry=True).best == 1e-4  # made before ties were recorded: with none, as now


def test_the_processor_check_asks_the_device_the_runs_train_on(corpus, tmp_path, monkeypatch):
    """On a GPU machine a suite's processor is the GPU's name (what its runs record), not the host CPU's."""
    import cem.provenance

    asked = []
    monkeypatch.setattr(cem.provenance, "processor", lambda device=None: asked.append(device) or "NVIDIA H200")
    s = get_scale("smoke", data=str(corpus), processor="Another GPU")
    with pytest.raises(ValueError, match="trains on Another GPU only.*this machine is NVIDIA H200"):
        run_sweep([RunSpec.make("micro", "llama")], s, tmp_path)
    assert asked and all(d is not None for d in asked)  # the training device was named


def test_the_cpu128_scale_reuses_the_committed_cpu_runs(tmp_path):
    """The cpu128 scale shares the cpu suite's runs folder; its committed runs are found, not trained again."""
    s = get_scale("cpu128")
    root = REPO / "study" / "results" / "cpu128"
    assert s.runs(root) == REPO / "study" / "results" / "cpu" / "runs"
    # fig2a's runs at 2e-3, Llama's rate there (the training default, so with the sweep left out the runs are the
    # same runs), found: 9 at seeds 0-2, and the RoPE Llama's and CEM attention's seeds 3-4 (`Scale.rope_seeds`; CEM
    # attention's are fig4's T=1 pair's runs); left to train: CEM attention's own-rate sweep, its seed 0 at 1e-3 and
    # 4e-3 (the campaign before that sweep: its runs and choice, which add runs as the campaign goes, are left out)
    root = _campaign_of(tmp_path, ("cpu128-llama", "cpu128-cem-attn"))
    assert plan("cpu128", root, ("fig2a",), lr_sweep=False)["experiments"]["fig2a"] == {"finished": 13, "train": 2, "evaluate": 0, "again": 0, "elsewhere": 0}



# the cpu128 campaign's processor, as its lanes train on it
CAMPAIGN_CPU = re.search(r"PROC=\$\{PROC:-(.+)\}", (REPO / "study/results/cpu128/lanes.sh").read_text()).group(1)


def _campaign_of(tmp_path: Path, prefixes: tuple[str, ...]) -> Path:
    """A cpu128 results folder in `tmp_path` holding the committed Llama rate choice (no own-rate sweep's: the
    campaign before them, however far it has gone since) and, in the tables of its runs folder, the committed cpu128
    runs whose names start with `prefixes`, at Llama's rate (no own-rate sweep's run)."""
    root = tmp_path / "cpu128"
    (root / "lr").mkdir(parents=True)
    choices = json.loads((REPO / "study/results/cpu128/lr/choices.json").read_text())
    (root / "lr" / "choices.json").write_text(json.dumps({"cpu128-llama": choices["cpu128-llama"]}))
    committed = RunTable(REPO / "study/results/cpu/runs")
    committed.copy([s for s in committed.rows() if s.startswith(prefixes) and "-lr=" not in s.replace("cpu128-llama-lr=", "")],
                   tmp_path / "cpu" / "runs")
    return root


@pytest.mark.slow
def test_analyse_only_judges_what_has_finished(tmp_path):
    """`--analyse-only` on the committed cpu128 campaign: fig3a, whose runs at Llama's rate have all finished, is
    judged under the paper's rule while its own-rate sweep waits (the summary and the report say for what); fig2d,
    whose runs have not, is not analysed. Nothing is trained or written outside the results folder."""
    # the committed cpu128 runs of the Llamas and of full CEM at Llama's rate, none of the CEM MLP's; seeds 0-2 (the
    # RoPE seeds left out, so that the test does not follow their runs as they land)
    root = _campaign_of(tmp_path, ("cpu128-llama", "cpu128-cem-t2"))
    tables = {p: p.read_bytes() for p in (tmp_path / "cpu").glob("*.jsonl")}
    summaries, waiting = analyse_finished("cpu128", root, ids=("fig3a", "fig2d"), rope_seeds=())
    assert [s["experiment"] for s in summaries] == ["fig3a"] and set(waiting) == {"fig2d"}
    assert "runs to train" in waiting["fig2d"]
    (fig3a,) = summaries
    assert fig3a["rules"] == {} and fig3a["pending"]["own"].startswith("the own-rate sweep of cpu128-cem-t2 (")
    assert {f["claim"] for f in fig3a["findings"]} >= {"full CEM (T=2, preconditioners) matches or beats Llama"}
    assert all(r["seeds"] == [0, 1, 2] for r in fig3a["rows"])
    report = write_report(root).read_text()
    assert "judged under the paper's rate rule alone" in report and "fig3a: the own-rate sweep of" in report
    from cem_study.report import _own_cell  # the verdict table's second-rule cell (where one is drawn) says for what

    claim = next(f for f in fig3a["findings"] if f["claim"] == "full CEM (T=2, preconditioners) matches or beats Llama")
    assert _own_cell(fig3a, claim).startswith("waiting for the own-rate sweep of cpu128-cem-t2 (")
    assert {p: p.read_bytes() for p in (tmp_path / "cpu").glob("*.jsonl")} == tables and not (tmp_path / "cpu" / "runs").exists()


@pytest.mark.slow
def test_an_experiment_waiting_on_two_own_rate_sweeps_names_both(tmp_path):
    """fig2d with its runs at Llama's rate in and neither CEM MLP sweep decided: its summary and the report name
    both sweeps it waits for, not only the first."""
    root = _campaign_of(tmp_path, ("cpu128-llama", "cpu128-cem-mlp"))
    (fig2d,), waiting = analyse_finished("cpu128", root, ids=("fig2d",))
    assert waiting == {} and fig2d["rules"] == {}
    t1, t2 = "cpu128-cem-mlp-mlp_precond=diag_lowrank", "cpu128-cem-mlp-mlp_precond=diag_lowrank-mlp_steps=2"
    assert fig2d["pending"]["own"].startswith(f"the own-rate sweeps of {t1} (") and f" and {t2} (" in fig2d["pending"]["own"]
    assert f"fig2d: the own-rate sweeps of {t1} (" in write_report(root).read_text()


@pytest.mark.slow
def test_a_plan_names_only_decided_own_rates_as_chosen():
    """`--plan` counts an undecided sweep's runs at a provisional rate but never prints that rate as chosen."""
    from cem_study.runner import format_plan

    p = plan("cpu128", REPO / "study" / "results" / "cpu128", ("fig2c", "fig2d"), processor=CAMPAIGN_CPU)
    chosen = next((line for line in format_plan(p).splitlines() if line.startswith("own rates chosen")), "")
    assert all(f"{key} " not in chosen for key in p["provisional"])
    assert all(f"{key} " in chosen for key in p["own_lrs"] if key not in p["provisional"])


def test_an_experiment_whose_run_another_lane_holds_is_put_off_until_the_others_are_done(tmp_path, monkeypatch, capsys):
    """Two lanes over the same results: a lane that finds one of an experiment's runs held by the other goes on
    to its next experiments, and comes back to that one at the end, waiting for the run then."""
    from cem_study import lr, runner

    sc = get_scale("smoke", seeds=(0, 1), recursion_seeds=(0, 1), lr_sweep=True, lrs=(1e-3, 2e-3, 4e-3), lr_extend=1,
                   lr_sweep_seeds=1, rate_rules=("paper", "own"))
    at = replace(sc, chosen_lrs=(("micro", 2e-3),))
    held = next(s for s in runner._specs("fig2c", at) if s not in runner._specs("fig2d", at))  # a run of fig2c only
    calls = []

    def fake_run_sweep(specs, scale, root, data_dir=None, jobs=1, products=None, wait=True):
        calls.append(([s.slug for s in specs], wait))
        return {s: None if (s == held and not wait) else {"run": s.slug} for s in specs}

    def fake_sweep(scale, template, root, data_dir=None, jobs=1, dry=False, rebracket=False, wait=True):
        return lr.SweepState(2e-3, (1e-3, 2e-3, 4e-3), {})

    monkeypatch.setattr(runner, "run_sweep", fake_run_sweep)
    monkeypatch.setattr(lr, "sweep", fake_sweep)
    _, results = runner.train_runs(("fig2c", "fig2d"), sc, tmp_path)
    waits = [(held.slug in slugs, wait) for slugs, wait in calls]
    first_fig2d = next(n for n, (slugs, _) in enumerate(calls) if any("mlp" in x for x in slugs))
    back = next(n for n, (has, wait) in enumerate(waits) if has and wait)
    assert waits[0] == (True, False) and first_fig2d < back  # fig2d was trained before fig2c's held run was waited for
    assert all(not wait for _, wait in calls[:back])  # nothing waited before then
    assert not any(any("mlp" in x for x in slugs) for slugs, _ in calls[back:-1])  # fig2d, finished, is not asked again
    assert "== back to fig2c: put off while another sweep held their runs" in capsys.readouterr().err
    assert results[held] == {"run": held.slug}


def test_a_recursion_pair_can_train_more_seeds_than_its_controls():
    """cpu128's fig2c and fig2d as decided (`cem_study.seeds`): their T=1/T=2 pairs train five seeds (under
    both rate rules) while the controls and the Llamas keep three; fig4, undecided, trains three (the RoPE Llama's
    seeds left out: the next test)."""
    from cem_study import plots, runner

    s = replace(get_scale("cpu128"), chosen_lrs=(("cpu128", 2e-3),), pair_seeds=(("fig2c", (0, 1, 2, 3, 4)), ("fig2d", (0, 1, 2, 3, 4))), rope_seeds=())
    pair = ("CEM attention T=1", "CEM attention T=2")
    for rule, at in (("paper", s), ("own", replace(s, own_lrs=tuple((sweep_key(t), 2e-3) for t in own_templates(EXPERIMENTS["fig2c"], s))))):
        seeds: dict = {}
        for v, seed in runner._runs("fig2c", at, rule):
            seeds.setdefault(v.label, []).append(seed)
        assert all(seeds[label] == [0, 1, 2, 3, 4] for label in pair)
        assert all(got == [0, 1, 2] for label, got in seeds.items() if label not in pair) and len(seeds) == 6
    fig2d = {}
    for v, seed in runner._runs("fig2d", s):
        fig2d.setdefault(v.label, []).append(seed)
    assert fig2d.pop("CEM MLP T=1") == fig2d.pop("CEM MLP T=2") == [0, 1, 2, 3, 4] and all(got == [0, 1, 2] for got in fig2d.values())
    assert {seed for _, seed in runner._runs("fig4", s)} == {0, 1, 2}
    for exp_id, pair in (("fig4", ("CEM attention T=1", "CEM attention T=2")), ("fig3c", ("CEM MLP T=1", "CEM MLP T=2"))):
        more = {}  # the same rule, where it would apply: the pair alone trains five
        for v, seed in runner._runs(exp_id, replace(s, pair_seeds=((exp_id, (0, 1, 2, 3, 4)),))):
            more.setdefault(v.label, []).append(seed)
        assert all((got == [0, 1, 2, 3, 4]) == (label in pair) for label, got in more.items())
    rows = [{"seeds": [0, 1, 2]}, {"seeds": [0, 1, 2, 3, 4]}]
    assert "over each variant's (3/5) seeds" in plots._caption({"seeds": [0, 1, 2], "rows": rows})
    assert "over 3 seeds" in plots._caption({"seeds": [0, 1, 2], "rows": rows[:1]})


def test_the_rope_llama_and_what_is_compared_with_it_train_the_rope_seeds():
    """cpu128's `rope_seeds`: in every experiment the RoPE Llama trains seeds 0-4, and so does each variant a finding
    compares with it (fig2a's CEM attention, fig2c's and fig2d's T=2, fig3a's full CEM, fig4's plain reuse x2);
    the position-matched controls and the rest keep 0-2 (a recursion pair's T=1 its pair's seeds)."""
    from cem_study import runner

    s = replace(get_scale("cpu128"), chosen_lrs=(("cpu128", 2e-3),), pair_seeds=())
    five = {"fig2a": {"Llama cpu128", "CEM attention cpu128"}, "fig2b": {"Llama cpu128"}, "fig3b": {"Llama cpu128"},
            "fig2c": {"Llama cpu128", "CEM attention T=2"}, "fig2d": {"Llama cpu128", "CEM MLP T=2"},
            "fig3a": {"Llama cpu128", "full CEM"}, "fig4": {"Llama attention x1", "Llama attention x2"},
            "lr": {"Llama cpu128 (chosen rate, every seed)"}}
    for exp_id, labels in five.items():
        seeds: dict = {}
        for v, seed in runner._runs(exp_id, s):
            seeds.setdefault(v.label, []).append(seed)
        assert {label for label, got in seeds.items() if got == [0, 1, 2, 3, 4]} == labels, exp_id
        assert all(got in ([0, 1, 2], [0]) for label, got in seeds.items() if label not in labels), exp_id
    assert get_scale("cpu").rope_seeds == ()  # the cpu suite's sizes keep their seeds


def test_two_lanes_deciding_two_sweeps_at_once_both_land_in_the_record(tmp_path, monkeypatch):
    """The rate record is read and written under its folder's lock: concurrent writers of different sweeps lose
    nothing; a lock that is never released ends in a clear error, not a hang."""
    import threading

    from cem_study import lr
    from cem.io import LockedError, lock_folder

    def lane(n: int) -> None:
        for i in range(15):
            lr._write_record(tmp_path, f"sweep-{n}-{i}", {"lr": 1e-3 * (n + 1)})

    threads = [threading.Thread(target=lane, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    record = json.loads((tmp_path / "lr" / "choices.json").read_text())
    assert len(record) == 90 and record["sweep-5-14"] == {"lr": pytest.approx(6e-3)}
    monkeypatch.setattr(lr, "RECORD_LOCK_TRIES", 3)
    with lock_folder(tmp_path / "lr", "held"), pytest.raises(LockedError, match="stayed locked for a minute"):
        lr._write_record(tmp_path, "late", {"lr": 1e-3})


@pytest.mark.slow
def test_a_plan_counts_an_own_rate_sweep_as_runs_of_the_experiment_waiting_on_it(tmp_path):
    """`--plan`, before anything ran: fig2a's row counts its own-rate sweep's runs (it waits on them); of the runs
    to train, only the Llama sweep's two other rates are not fig2a's (the `lr` experiment's)."""
    kw = dict(lr_sweep=True, lrs=(1e-3, 2e-3, 4e-3), lr_sweep_seeds=1, rate_rules=("paper", "own"))
    p = plan("smoke", tmp_path / "res", ("fig2a",), **kw)
    assert p["undecided"] == {"micro-llama": 3, "micro-cem-attn": 3}
    assert p["total"]["train"] - p["experiments"]["fig2a"]["train"] == 2
    both = plan("smoke", tmp_path / "res", ("lr", "fig2a"), **kw)
    assert both["total"]["train"] == p["total"]["train"]  # the lr experiment adds no run: its sweep was counted
