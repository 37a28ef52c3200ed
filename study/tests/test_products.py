"""Run products (`cem_study.products`): computed by the sweep as soon as a run finishes, read by the
analyses without the weights; a finished run that lacks one is evaluated from its checkpoint, or trained
again where the checkpoint is gone (checkpoints are not committed: a later session may be on another machine)."""

import json
import shutil

import pytest

from cem_study import RunSpec, get_scale
from cem_study.analysis import CONTEXT_USE, context_use
from cem_study.products import MissingWeights
from cem_study.sweep import run_sweep
from cem.training import RunDir


def _setup(corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("CEM_CACHE_DIR", str(tmp_path / "cache"))
    return get_scale("smoke", data=str(corpus)), tmp_path / "res"


@pytest.mark.slow
def test_products_are_computed_as_runs_finish_and_read_without_the_weights(corpus, tmp_path, monkeypatch, capsys):
    scale, root = _setup(corpus, tmp_path, monkeypatch)
    specs = [RunSpec.make("micro", "llama", seed=i) for i in (0, 1)]
    run_sweep(specs, scale, root, jobs=2, products={s: (CONTEXT_USE,) for s in specs})  # in the workers
    for s in specs:
        run = RunDir(root / "runs" / s.slug)
        stored = json.loads(CONTEXT_USE.path(run.path).read_text())
        assert CONTEXT_USE.path(run.path).parent == run.evals_dir
        assert stored == json.loads(json.dumps(context_use(run.path)))  # what the weights give
        shutil.rmtree(run.ckpt_dir)
        assert CONTEXT_USE.get(run.path) == stored  # read: the weights are no longer needed
    capsys.readouterr()
    run_sweep(specs, scale, root, products={s: (CONTEXT_USE,) for s in specs})
    assert "2 runs, 2 already finished, 0 to train\n" in capsys.readouterr().err


def test_a_finished_run_without_its_product_is_evaluated_or_trained_again(corpus, tmp_path, monkeypatch, capsys):
    scale, root = _setup(corpus, tmp_path, monkeypatch)
    spec = RunSpec.make("micro", "llama", seed=0)
    run = RunDir(root / "runs" / spec.slug)
    run_sweep([spec], scale, root)  # an experiment that reads nothing from the weights
    results = run.results_json.read_bytes()
    capsys.readouterr()
    run_sweep([spec], scale, root, products={spec: (CONTEXT_USE,)})  # one that does: from the checkpoint
    err = capsys.readouterr().err
    assert "1 already finished" not in err and "0 to train, 1 to evaluate" in err and "evaluated from its checkpoint" in err
    assert CONTEXT_USE.exists(run.path) and run.results_json.read_bytes() == results  # not trained again
    # the product and the checkpoint gone (a run finished on another machine, its results committed)
    shutil.rmtree(run.evals_dir)
    shutil.rmtree(run.ckpt_dir)
    with pytest.raises(MissingWeights, match=f"{run.path} has no checkpoint to compute it from"):
        CONTEXT_USE.get(run.path)
    run_sweep([spec], scale, root, products={spec: (CONTEXT_USE,)})
    err = capsys.readouterr().err
    assert f"training {spec.slug} again: context_use.json must be computed from its weights" in err
    assert "1 to train (1 again)" in err
    assert CONTEXT_USE.exists(run.path) and run.checkpoint() is not None and run.results() is not None


def test_a_product_is_never_written_through_a_planted_link(corpus, tmp_path, monkeypatch):
    scale, root = _setup(corpus, tmp_path, monkeypatch)
    spec = RunSpec.make("micro", "llama", seed=0)
    run = RunDir(root / "runs" / spec.slug)
    run_sweep([spec], scale, root)
    (tmp_path / "victim").mkdir()
    run.evals_dir.symlink_to(tmp_path / "victim")
    with pytest.raises(ValueError, match="is a symbolic link; refusing to write through it"):
        CONTEXT_USE.get(run.path)
    assert list((tmp_path / "victim").iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize("jobs", [1, 2])
def test_a_run_another_sweep_holds_is_put_off_then_waited_for(corpus, tmp_path, monkeypatch, capfd, jobs):
    """Two sweeps over the same results (two terminals, or two lanes of a suite) that both need a run: the
    second trains its other runs first, then waits for the first to release that one and takes what it
    left, instead of failing on the lock."""
    import threading
    import time

    from cem_study import sweep

    scale, root = _setup(corpus, tmp_path, monkeypatch)
    monkeypatch.setattr(sweep, "LOCK_POLL_S", 0.2)
    held, free = RunSpec.make("micro", "llama", seed=0), RunSpec.make("micro", "llama", seed=1)
    run = RunDir(root / "runs" / held.slug)
    holding = threading.Event()

    def other_sweep():  # holds its run until this sweep has finished the other one (at most 10 minutes: a loaded machine)
        with run.lock():
            holding.set()
            deadline = time.time() + 600
            while not RunDir(root / "runs" / free.slug).results_json.exists() and time.time() < deadline:
                time.sleep(0.2)

    holder = threading.Thread(target=other_sweep)
    holder.start()
    holding.wait(30)
    results = run_sweep([held, free], scale, root, jobs=jobs, products={s: (CONTEXT_USE,) for s in (held, free)})
    holder.join()
    err = capfd.readouterr().err  # the workers' lines too
    assert f"{held.slug}: run directory {run.path} is in use by another process" in err
    assert err.index(f"[1/2] {free.slug}") < err.index(f"[2/2] {held.slug}")  # the free run did not wait
    assert all(results[s] is not None and CONTEXT_USE.exists(root / "runs" / s.slug) for s in (held, free))


def test_without_wait_a_run_another_sweep_holds_is_left_to_it(corpus, tmp_path, monkeypatch, capfd):
    """`run_sweep(..., wait=False)`: a run another lane holds comes back as None at once (the caller goes on to other
    work and comes back to it), not waited for."""
    scale, root = _setup(corpus, tmp_path, monkeypatch)
    held = RunSpec.make("micro", "llama", seed=0)
    with RunDir(root / "runs" / held.slug).lock():  # as the other lane does while it trains the run
        results = run_sweep([held], scale, root, wait=False)
    assert results == {held: None}
    assert f"{held.slug}: run directory" in capfd.readouterr().err
    assert run_sweep([held], scale, root, wait=False)[held] is not None  # free again: trained


def test_a_product_another_sweep_is_computing_is_not_computed_twice(corpus, tmp_path, monkeypatch, capfd):
    """Two lanes that both need a finished run's product: the one that finds the run held waits, then reads
    what the other wrote, instead of evaluating the same weights again."""
    import threading
    import time

    from cem_study import sweep
    from cem.io import atomic_write_json

    scale, root = _setup(corpus, tmp_path, monkeypatch)
    monkeypatch.setattr(sweep, "LOCK_POLL_S", 0.2)
    spec = RunSpec.make("micro", "llama", seed=0)
    run = RunDir(root / "runs" / spec.slug)
    run_sweep([spec], scale, root)  # finished, no product yet
    holding = threading.Event()
    written = {"short": [8, 16], "short_loss": 1.0, "long_loss": 0.5, "by": "the other lane"}

    def other_lane():  # holds the run while it "computes" the product
        with run.lock():
            holding.set()
            time.sleep(1.0)
            CONTEXT_USE.path(run.path).parent.mkdir(exist_ok=True)
            atomic_write_json(CONTEXT_USE.path(run.path), written)

    holder = threading.Thread(target=other_lane)
    holder.start()
    holding.wait(30)
    run_sweep([spec], scale, root, products={spec: (CONTEXT_USE,)})
    holder.join()
    assert "waiting for it" in capfd.readouterr().err
    assert json.loads(CONTEXT_USE.path(run.path).read_text()) == written  # read, not computed again
