"""What runs cost (`cem_study.costs`) and `--until`: a deadline read from the command line, and sweeps that
train the runs that fit before it, leave the others unstarted and name them."""

import json
import re
import time
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from cem_study import RunSpec, get_scale, run_sweep
from cem_study.costs import DEADLINE_MARGIN, Costs, Deadline, DeadlineReached
from cem_study.launchers import ProcessLauncher
from cem.training import RunDir

REPO = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 11, 28, 5, 30, tzinfo=timezone.utc)


def test_a_deadline_is_the_next_such_time_or_a_date_and_time():
    assert Deadline.parse("06:20", NOW).at == NOW.replace(hour=6, minute=20).timestamp()
    assert Deadline.parse("5:00", NOW).at == (NOW.replace(hour=5, minute=0) + timedelta(days=1)).timestamp()  # gone today: tomorrow's
    assert Deadline.parse("2026-11-28T07:00+00:00", NOW).at == NOW.replace(hour=7, minute=0).timestamp()
    with pytest.raises(ValueError, match="is past"):
        Deadline.parse("2026-11-28T05:00+00:00", NOW)
    for bad in ("6pm", "25:00", "tomorrow", ""):
        with pytest.raises(ValueError, match="--until .*HH:MM"):
            Deadline.parse(bad, NOW)
    assert DEADLINE_MARGIN > 1
    assert f"stretched by {DEADLINE_MARGIN:g} " in " ".join((REPO / "study" / "docs" / "experiments.md").read_text().split())  # as documented


def test_a_sweep_with_a_deadline_trains_what_fits_and_names_what_is_left(corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("CEM_CACHE_DIR", str(tmp_path / "cache"))
    s = get_scale("smoke", data=str(corpus))
    hour, short = RunSpec.make("micro", "llama", seed=1), RunSpec.make("micro", "llama", seed=0)
    monkeypatch.setattr(Costs, "seconds", lambda self, spec: (3600.0 if spec == hour else 1.0, "here"))
    root = tmp_path / "res"
    until = ProcessLauncher(until=Deadline(time.time() + 600))  # ten minutes: the short run fits, the hour-long one not
    with pytest.raises(DeadlineReached, match=re.escape(f"1 run not started, as it would not finish by then ({hour.slug} (about 60 min))")):
        run_sweep([hour, short], s, root, jobs=until)  # the late run first: the sweep goes on to the next
    assert RunDir(s.runs(root) / short.slug).results() is not None
    assert not (s.runs(root) / hour.slug).exists()  # not started at all
    assert run_sweep([short], s, root, jobs=until)[short] is not None  # finished: nothing to start, nothing late
    assert until.until.start_by(s, root, [hour]) == {hour: (until.until.at - DEADLINE_MARGIN * 3600, 3600.0)}
    # a finished run recorded on another processor is cleared only when it starts again: one the deadline leaves
    # unstarted keeps its results (2026-11-28: a lane given --until had cleared three it never started)
    here = RunDir(s.runs(root) / short.slug).results()["sessions"][0]["processor"]
    json_path = s.runs(root) / short.slug / "results.json"
    kept = json.loads(json_path.read_text())
    json_path.write_text(json.dumps({**kept, "sessions": [{**kept["sessions"][0], "processor": "Another CPU", "cpu_id": None}]}))
    monkeypatch.setattr(Costs, "seconds", lambda self, spec: (3600.0, "here"))  # neither fits now
    with pytest.raises(DeadlineReached, match="2 runs not started"):
        run_sweep([hour, short], replace(s, processor=here), root, jobs=until)
    assert json.loads(json_path.read_text())["sessions"][0]["processor"] == "Another CPU"  # not cleared: not started
    monkeypatch.setattr(Costs, "seconds", lambda self, spec: (3600.0 if spec == hour else 1.0, "here"))
    with pytest.raises(DeadlineReached, match="1 run not started"):
        run_sweep([hour, short], replace(s, processor=here), root, jobs=until)
    assert json.loads(json_path.read_text())["sessions"][0]["processor"] == here  # trained again here once it fitted
    # an interrupted run is estimated for the steps it has left (the plan's estimate, `Costs.seconds`)
    monkeypatch.undo()
    monkeypatch.setenv("CEM_CACHE_DIR", str(tmp_path / "cache"))
    from cem_study.sweep import run_config
    from cem.training import train

    train(run_config(hour, s, None), s.runs(root) / hour.slug, progress=False, stop_at=1)
    whole, _ = Costs(s, root).seconds(RunSpec.make("micro", "llama", seed=2))
    left, _ = Costs(s, root).seconds(hour)
    assert left == pytest.approx(whole * (1 - 1 / s.max_steps))


def _fixed(run_dir, data_dir=None, device="auto"):
    return {"computed": True}


def test_a_deadline_holds_a_run_with_the_products_computed_after_its_training(corpus, tmp_path, monkeypatch):
    """A run's products are computed from its weights once it has trained, by the same worker: `--until` counts them
    (2026-12-02: a lane's runs were estimated by training alone and finished 20 minutes past the session's deadline)."""
    from cem_study.products import Product

    monkeypatch.setenv("CEM_CACHE_DIR", str(tmp_path / "cache"))
    s = get_scale("smoke", data=str(corpus))
    spec = RunSpec.make("micro", "llama", seed=0)
    depth, drift = Product(_fixed, "depth.json"), Product(_fixed, "drift.json")
    monkeypatch.setattr(Costs, "seconds", lambda self, x: (60.0, "here"))
    monkeypatch.setattr(Costs, "product_seconds", lambda self, x, name: {"depth.json": 3000.0}.get(name))  # drift: none recorded
    deadline = Deadline(time.time() + 1800)
    assert deadline.start_by(s, tmp_path, [spec], {spec: [depth, drift]}) == {spec: (deadline.at - DEADLINE_MARGIN * 3060, 3060.0)}
    assert deadline.start_by(s, tmp_path, [spec]) == {spec: (deadline.at - DEADLINE_MARGIN * 60, 60.0)}  # training alone
    root = tmp_path / "res"
    with pytest.raises(DeadlineReached, match=re.escape(f"({spec.slug} (about 51 min))")):  # half an hour: training fits, products not
        run_sweep([spec], s, root, jobs=ProcessLauncher(until=deadline), products={spec: [depth, drift]})
    assert not (s.runs(root) / spec.slug).exists()  # not started at all
    run_sweep([spec], s, root, jobs=ProcessLauncher(until=Deadline(time.time() + 7200)), products={spec: [depth, drift]})
    assert depth.get(s.runs(root) / spec.slug) == {"computed": True} and drift.exists(s.runs(root) / spec.slug)


def test_an_own_rate_suite_goes_on_to_its_next_experiment_and_names_every_run_left(tmp_path, monkeypatch):
    """At an own-rate scale (cpu128's), an experiment with runs left for the deadline does not stop the next one,
    whose runs may fit; the suite then stops naming the runs of both."""
    from cem_study import lr, runner

    sc = get_scale("smoke", seeds=(0, 1), recursion_seeds=(0, 1), lr_sweep=True, lrs=(1e-3, 2e-3, 4e-3), lr_extend=1,
                   lr_sweep_seeds=1, rate_rules=("paper", "own"))
    at = replace(sc, chosen_lrs=(("micro", 2e-3),))
    deadline = Deadline(time.time() + 60)
    shared = next(x for x in runner._specs("fig2c", at) if x in runner._specs("fig4", at))  # e.g. the Llama baseline
    late = {runner._specs("fig2c", at)[-1], runner._specs("fig4", at)[-1], shared}
    asked = []

    def fake_run_sweep(specs, scale, root, data_dir=None, jobs=1, products=None, wait=True):
        asked.extend(specs)
        if left := [s for s in specs if s in late]:
            raise DeadlineReached(deadline, [(s.slug, 3600.0) for s in left])
        return {s: {"run": s.slug} for s in specs}

    monkeypatch.setattr(runner, "run_sweep", fake_run_sweep)
    monkeypatch.setattr(lr, "sweep", lambda *a, **kw: lr.SweepState(2e-3, (1e-3, 2e-3, 4e-3), {}))
    with pytest.raises(DeadlineReached) as e:
        runner.train_runs(("fig2c", "fig2d", "fig4"), sc, tmp_path)
    assert {slug for slug, _ in e.value.runs} == {s.slug for s in late}
    assert set(runner._specs("fig2d", at)) <= set(asked)  # fig2d, between the two, was trained
    assert len(e.value.runs) == 3 and "3 runs not started, as they would not finish" in str(e.value)  # the shared run once


def test_the_command_stops_in_order_at_its_deadline(tmp_path, monkeypatch, capsys):
    """`cem-study experiment ... --until`: the launcher carries the deadline; the runs left are named, no report is
    written, and the exit status is 0 (an asked-for stop); a deadline already past is refused before anything runs."""
    import cem_study as ex
    from cem_study.cli import main

    given = []

    def stopped(*a, **kw):
        given.append(a[6])
        raise DeadlineReached(a[6].until, [("cpu128-llama-s1", 2700.0)])

    monkeypatch.setattr(ex, "run_suite", stopped)
    monkeypatch.setattr(ex, "write_report", lambda *a, **kw: pytest.fail("a report was written"))
    later = (datetime.now().astimezone() + timedelta(hours=2)).replace(second=0, microsecond=0)
    base = ["experiment", "fig2c", "--scale", "smoke", "--results", str(tmp_path / "res")]
    assert main([*base, "--until", later.isoformat()]) == 0
    assert given[-1].until == Deadline(later.timestamp())
    out = capsys.readouterr().out
    assert "1 run not started" in out and "cpu128-llama-s1 (about 45 min)" in out and "run the same command again" in out
    assert main([*base, "--until", "2020-01-01T00:00"]) == 2 and len(given) == 1
    assert "--until '2020-01-01T00:00' is past" in capsys.readouterr().err


def test_a_runs_time_is_read_first_from_the_runs_trained_on_this_cpu(tmp_path, monkeypatch):
    """CPUs under one model name differ in speed (a VM's "AMD EPYC": 4.3k against 6.1k tokens/s for one model on
    2026-11-27 and -28): the runs whose every session ran on this CPU (named with its family, recorded or
    inferred) estimate first, the others where this CPU has none of the size."""
    import json

    from cem import device, provenance

    s = get_scale("smoke")
    spec = RunSpec.make("micro", "llama")

    def finished(name: str, wall: float, ids: list, **more) -> None:
        run = s.runs(tmp_path) / name
        run.mkdir(parents=True)
        sessions = [{"processor": "AMD EPYC", "device": "AMD EPYC (1 thread)", "cpu_id": i} for i in ids]
        res = {"wall_time_s": wall, "config": {"train": {"preset": "micro", "arch": "llama"}}, "sessions": sessions, **more}
        (run / "results.json").write_text(json.dumps(res))

    def on(cpu):
        for where in (device, provenance):
            monkeypatch.setattr(where, "cpu_id", lambda: cpu)
        monkeypatch.setattr(provenance, "cpu_model", lambda: "AMD EPYC")

    finished("a", 100.0, ["zen2"])
    finished("b", 300.0, ["zen4"])
    finished("c", 500.0, ["zen2", "zen4"])  # resumed on another CPU: neither's
    finished("d", 700.0, [None], processor_inferred={"processor": "AMD EPYC (zen5)", "by": "a check"})
    committed = tmp_path / "none" / "study" / "results" / "smoke" / "runs"
    on("zen2")
    assert Costs(s, tmp_path, committed).seconds(spec) == (100.0, "here")
    on("zen5")  # a run before the family was recorded, inferred to have trained on this CPU
    assert Costs(s, tmp_path, committed).seconds(spec) == (700.0, "here")
    on("zen3")  # no run on this CPU: all of them
    assert Costs(s, tmp_path, committed).seconds(spec) == (400.0, "here")
    on(None)  # a CPU that does not say: all of them
    assert Costs(s, tmp_path, committed).seconds(spec) == (400.0, "here")


def test_a_gpu_call_is_estimated_from_the_runs_trained_together_there():
    """gpu8's one call on an H200, from the cpu128 runs trained together on one (study/results/h200/cpu): the larger of
    the steps bound (each run's steps at a measured run's seconds per step, times the FLOPs-per-token ratio) and the
    throughput bound (every run's FLOPs at twelve times the measured runs' median FLOP/s); it fits in 8 minutes at
    gpu8's batch of 64, and at cpu128's 16 (four times the steps) its steps bound is over the 9-minute call."""
    from dataclasses import replace

    from cem.model import ModelConfig, model_config
    from cem.model.flops import train_flops_per_token
    from cem_study.costs import COMMITTED, _results_in, wave_seconds
    from cem_study.registry import fig4_alibi_variants
    from cem_study.scales import get_scale

    s = get_scale("gpu8")
    specs = [v.spec.with_seed(k) for v in fig4_alibi_variants(s) for k in s.seeds]
    w = wave_seconds(s, specs, COMMITTED / s.measured_on)
    assert (w["runs"], w["measured"]) == (12, 16) and w["seconds"] == max(w["steps_bound"], w["throughput_bound"]) <= 480
    ref = [r for r in _results_in(COMMITTED / s.measured_on) if r["config"]["train"]["arch"] == "llama-alibi" and not r["config"]["model_overrides"]]
    x1 = specs[0]  # Llama-ALiBi x1, seed 0
    f = train_flops_per_token(model_config("cpu128-l8", "llama-alibi", vocab_size=257))
    assert w["per_run"][x1.slug] == pytest.approx(max(2043 * r["wall_time_s"] / r["steps"] * f / train_flops_per_token(ModelConfig.from_dict(r["model"])) for r in ref))
    assert w["flops"] == pytest.approx(3 * 33_472_000 * sum(train_flops_per_token(model_config("cpu128-l8", v.spec.arch, vocab_size=257, **dict(v.spec.model)))
                                                           for v in fig4_alibi_variants(s)))
    slow = wave_seconds(replace(s, batch_size=16), specs, COMMITTED / s.measured_on)
    assert slow["steps_bound"] > 540 and slow["throughput_bound"] == pytest.approx(w["throughput_bound"])


def test_the_plan_of_a_scale_measured_on_a_gpu_says_its_calls_time(tmp_path):
    """`--plan` at gpu8 adds the estimate of its one call (`wave_seconds`) to the runs it would train."""
    from cem_study.runner import format_plan, plan

    p = plan("gpu8", tmp_path / "res")
    assert p["experiments"]["fig4-alibi"]["train"] == 12 and p["wave"]["runs"] == 12
    assert f"one call on the GPU of h200/cpu/runs, its 12 runs together: about {p['wave']['seconds']:.0f} s" in format_plan(p)
    assert plan("smoke", tmp_path / "smoke")["wave"] is None  # a scale trained on the CPU: no call to estimate


def test_a_run_another_lane_finishes_after_this_lanes_start_by_is_taken_not_called_late(corpus, tmp_path, monkeypatch):
    """Two lanes with one deadline: a run the other lane held, retried here after its start_by had passed, is waited for
    and taken once the other lane finishes it, not named as "not started" (2026-12-02: both lanes' last lines named a
    run the other had finished); a run nobody holds past its start_by is still left unstarted."""
    import shutil
    import threading

    from cem_study import sweep

    monkeypatch.setenv("CEM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(sweep, "LOCK_POLL_S", 0.2)
    s = get_scale("smoke", data=str(corpus))
    held, free = RunSpec.make("micro", "llama", seed=0), RunSpec.make("micro", "llama", seed=1)
    elsewhere = tmp_path / "other"  # the other lane's training of it, copied in while it holds the run
    run_sweep([held], s, elsewhere)
    monkeypatch.setattr(Costs, "seconds", lambda self, spec: (3600.0, "here"))  # past its start_by from the first
    root, holding, taken = tmp_path / "res", threading.Event(), threading.Event()
    run = RunDir(s.runs(root) / held.slug)

    def other_lane():
        with run.lock():
            holding.set()
            taken.wait(60)  # this lane has found it held
            shutil.copytree(s.runs(elsewhere) / held.slug, run.path, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".*"))

    holder = threading.Thread(target=other_lane)
    holder.start()
    holding.wait(30)
    real = sweep._held
    monkeypatch.setattr(sweep, "_held", lambda out: (real(out), taken.set())[0])
    results = run_sweep([held], s, root, jobs=ProcessLauncher(until=Deadline(time.time() + 600)))
    holder.join()
    theirs = RunDir(s.runs(elsewhere) / held.slug).results()
    assert results[held] == theirs and results[held]["wall_time_s"] == theirs["wall_time_s"]  # what it left, not trained here
    with pytest.raises(DeadlineReached, match=re.escape(f"1 run not started, as it would not finish by then ({free.slug}")):
        run_sweep([held, free], s, root, jobs=ProcessLauncher(until=Deadline(time.time() + 600)))
    assert not (s.runs(root) / free.slug).exists()
