"""Launchers of the suite's runs: a device group per job, a run on several processes under torchrun's launcher
(gloo on the CPU) laid out as a run of one, and runs as jobs of submitit's local executor (skipped when
finished, resumed from their checkpoint when interrupted)."""

import json
import os
import re
import time

import pytest

from cem_study import RunSpec, get_scale, run_sweep
from cem_study.launchers import LocalLauncher, ProcessLauncher, device_groups, make_launcher
from cem.training import RunDir


def told(task):
    """What a job's process was told: its devices, pid and the time it ran."""
    start = time.time()
    time.sleep(0.4)
    return task, os.environ.get("CUDA_VISIBLE_DEVICES"), os.getpid(), start, time.time()


def assigned(launcher, n=4):
    out = []
    launcher.run(told, range(n), lambda task, res: out.append(res))
    return out


def assert_own_devices(results, groups):
    """Every task saw one group, every group was used, and no two tasks shared a group at once."""
    assert sorted(r[0] for r in results) == list(range(len(results)))
    assert {r[1] for r in results} == {",".join(g) for g in groups}
    for a in results:
        for b in results:
            if a is not b and a[1] == b[1]:
                assert a[4] <= b[3] or b[4] <= a[3], (a, b)


def test_device_groups():
    assert device_groups("0,1,2,3", nproc=2) == (("0", "1"), ("2", "3"))
    assert device_groups([4, 5]) == (("4",), ("5",))
    with pytest.raises(ValueError, match="multiple"):
        device_groups("0,1,2", nproc=2)
    with pytest.raises(ValueError):
        device_groups("0,,1")
    if not __import__("torch").cuda.is_available():
        assert device_groups(None, nproc=2, jobs=4) is None  # the CPU: nothing to share out


def fake_cuda(monkeypatch, n: int) -> None:
    """A machine of `n` CUDA devices, as torch reports it."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_a_launcher_is_given_only_devices_of_this_machine(monkeypatch):
    """Issue 63: `--devices 'abc;rm -rf'` on a machine without CUDA trained every run on the CPU, exit 0."""
    fake_cuda(monkeypatch, 4)
    assert make_launcher("process", None, "0,1,2,3", 2).jobs == 2  # a job per group unless --jobs says otherwise
    assert make_launcher("process", None, "GPU-8c1d4e2a-77aa-4b1f-9c1e-0123456789ab").jobs == 1
    for bad, said in (("abc;rm -rf", "'abc;rm -rf' is no device id"), ("0, -1", "'-1' is no device id"), ("4", "no CUDA device 4 here")):
        with pytest.raises(ValueError, match=re.escape(said)):
            make_launcher("process", None, bad)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert make_launcher("process", None, "3").devices == (("3",),)
    with pytest.raises(ValueError, match="no CUDA device 0 here"):
        make_launcher("process", None, "0")
    fake_cuda(monkeypatch, 0)
    with pytest.raises(ValueError, match=r"--devices 0,1: this machine has no CUDA device"):
        make_launcher("process", None, "0,1")
    with pytest.raises(ValueError, match="is no device id"):
        make_launcher("process", None, "abc;rm -rf")
    assert make_launcher("process", 2).devices is None  # no --devices: nothing to check
    with pytest.raises(ValueError, match="scheduler"):
        make_launcher("slurm", devices="0,1")
    with pytest.raises(ValueError, match="jobs"):
        make_launcher("process", 0)
    with pytest.raises(ValueError, match="scheduler"):
        make_launcher("process", 2, timeout_min=5)


def test_a_jobs_settings_are_named_by_their_flags_and_checked(monkeypatch):
    """Issue 63: --time-min with the process launcher was named as submitit's `timeout_min`; --time-min -5 ran a job
    that failed with submitit's UncompletedJobError, --cpus-per-run 0 was accepted; --launcher slurm off a cluster was
    submitit's 'Could not detect "srun"' (unexpected) once the first job was submitted."""
    with pytest.raises(ValueError, match="^--time-min, --partition, --slurm-option account: settings of a scheduler's jobs, not of the process launcher$"):
        make_launcher("process", 2, timeout_min=5, slurm_partition="p", slurm_account="a")
    for option, value, said in (("timeout_min", -5, "--time-min must be an integer >= 1, got -5"), ("cpus_per_task", 0, "--cpus-per-run must be an integer >= 1, got 0"),
                                ("gpus_per_node", -1, "--gpus-per-run must be an integer >= 0, got -1")):
        with pytest.raises(ValueError, match=f"^{said}$"):
            make_launcher("local", 1, **{option: value})
    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(ValueError, match="--launcher slurm: this machine is not on a SLURM cluster"):
        make_launcher("slurm", 1)
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}")
    assert make_launcher("slurm", 1, gpus_per_node=0, timeout_min=60).options == {"gpus_per_node": 0, "timeout_min": 60}


class Recorded(ProcessLauncher):
    """The pool's hand-out of device groups, in this process: what each task would be told."""

    def submit(self, fn, task, slot):
        from concurrent.futures import Future

        future = Future()
        future.set_result((task, ",".join(slot), os.getpid(), task // self.jobs, task // self.jobs + 0.5))
        return future


def test_device_groups_are_handed_out_in_turn_and_taken_back():
    groups = device_groups("0,1,2,3,4,5", nproc=2)
    results = sorted(assigned(Recorded(jobs=3, devices=groups), 9))
    assert_own_devices(results, groups)
    assert [r[1] for r in results[:3]] == ["0,1", "2,3", "4,5"]
    shared = sorted(assigned(Recorded(jobs=4, devices=groups), 4))  # more jobs than groups: groups shared in turn
    assert [r[1] for r in shared] == ["0,1", "2,3", "4,5", "0,1"]


@pytest.mark.slow
def test_each_job_of_a_pool_sees_only_its_device_group():
    groups = device_groups("0,1,2,3", nproc=2)
    results = assigned(ProcessLauncher(jobs=2, devices=groups))
    assert_own_devices(results, groups)
    assert len({r[2] for r in results}) == 4 and os.getpid() not in {r[2] for r in results}  # a fresh process per run
    assert os.environ.get("CUDA_VISIBLE_DEVICES") != "0,1"  # this process's devices are its own


@pytest.mark.slow
def test_each_local_submitit_job_sees_only_its_device_group(tmp_path, monkeypatch):
    pytest.importorskip("submitit")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]))
    groups = device_groups("0,1", nproc=1)
    results = assigned(LocalLauncher(jobs=2, devices=groups, folder=tmp_path / "jobs", poll_s=0.2))
    assert_own_devices(results, groups)


def _layout(run):
    return sorted(str(p.relative_to(run)) for p in run.rglob("*") if p.name != ".lock")


@pytest.mark.slow
def test_a_run_on_two_processes_is_laid_out_as_a_run_on_one(corpus, tmp_path, monkeypatch):
    """--nproc-per-run 2: torchrun's launcher, gloo on the CPU, half the micro-batch each; the same files and
    result fields as one process, the same tokens and loss, and a later sweep on one process reuses it."""
    from cem_study.runner import plan

    monkeypatch.setenv("CEM_CACHE_DIR", str(tmp_path / "cache"))
    s = get_scale("smoke", data=str(corpus))
    spec = RunSpec.make("micro", "llama")
    one, two = tmp_path / "one", tmp_path / "two"
    run_sweep([spec], s, one)
    run_sweep([spec], s, two, jobs=ProcessLauncher(nproc_per_run=2))
    a, b = (RunDir(r / "runs" / spec.slug) for r in (one, two))
    assert _layout(b.path) == _layout(a.path)
    ra, rb = a.results(), b.results()
    assert set(rb) == set(ra) and rb["world_size"] == 2 and ra["world_size"] == 1
    assert rb["tokens_seen"] == ra["tokens_seen"] and rb["test_loss"] == pytest.approx(ra["test_loss"], rel=1e-4)
    assert json.loads(b.run_json.read_text())["train"]["batch_size"] == s.batch_size // 2
    assert run_sweep([spec], s, two)[spec]["world_size"] == 2  # finished: reused by a sweep on one process
    assert plan("smoke", two, ("fig2c",), data=str(corpus))["total"]["finished"] >= 1


@pytest.mark.slow
def test_local_submitit_jobs_resume_and_skip_finished_runs(corpus, tmp_path, monkeypatch, capfd):
    """--launcher local: each run a submitit job; an interrupted run resumes from its checkpoint, a finished
    one is not submitted again."""
    pytest.importorskip("submitit")
    from cem_study.sweep import run_config
    from cem.training import train

    monkeypatch.setenv("CEM_CACHE_DIR", str(tmp_path / "cache"))
    s = get_scale("smoke", data=str(corpus))
    specs = [RunSpec.make("micro", "llama", seed=i) for i in (0, 1)]
    root, jobs = tmp_path / "res", tmp_path / "jobs"
    started = s.runs(root) / specs[0].slug
    train(run_config(specs[0], s, None), started, progress=False, stop_at=1)  # interrupted after step 1
    assert RunDir(started).results() is None and RunDir(started).checkpoint() is not None
    launcher = make_launcher("local", 2, folder=jobs)
    launcher.poll_s = 0.2
    results = run_sweep(specs, s, root, jobs=launcher)
    assert all(results[x]["steps"] == s.max_steps for x in specs)
    assert [x["from_step"] for x in results[specs[0]]["sessions"]] == [0, 1]  # resumed, not started again
    submitted = len(list(jobs.glob("*_submitted.pkl")))
    assert submitted == 2
    run_sweep(specs, s, root, jobs=launcher)
    assert len(list(jobs.glob("*_submitted.pkl"))) == submitted  # finished: nothing submitted
    assert "2 runs, 2 already finished" in capfd.readouterr().err


def test_the_documented_commands_build_their_launchers(tmp_path, monkeypatch, capsys):
    """study/docs/experiments.md's commands: a job per device group (DDP runs of 2), and SLURM jobs with their settings;
    settings that do not apply are refused before anything runs."""
    fake_cuda(monkeypatch, 8)
    import cem_study as ex
    from cem_study.cli import main
    from cem_study.launchers import SlurmLauncher

    given = []
    monkeypatch.setattr(ex, "run_suite", lambda *a, **kw: given.append(a[6]) or [])
    monkeypatch.setattr(ex, "write_report", lambda *a, **kw: "report.md")
    monkeypatch.setattr("cem_study.launchers.shutil.which", lambda name: f"/usr/bin/{name}")  # as on a cluster's login node
    base = ["experiment", "all", "--scale", "paper", "--results", str(tmp_path / "res")]
    assert main([*base, "--devices", "0,1,2,3,4,5,6,7", "--nproc-per-run", "2"]) == 0
    assert given[-1] == ProcessLauncher(jobs=4, nproc_per_run=2, devices=(("0", "1"), ("2", "3"), ("4", "5"), ("6", "7")))
    assert main([*base, "--launcher", "slurm", "--partition", "gpu", "--jobs", "32", "--time-min", "720", "--slurm-option", "account=abc"]) == 0
    slurm = given[-1]
    assert isinstance(slurm, SlurmLauncher) and slurm.jobs == 32 and slurm.folder == tmp_path / "res" / ".submitit"
    assert slurm.options == {"slurm_partition": "gpu", "timeout_min": 720, "slurm_account": "abc"}
    assert {**slurm.defaults(), **slurm.options}["gpus_per_node"] == 1
    capsys.readouterr()
    assert main([*base, "--partition", "gpu"]) != 0 and main([*base, "--launcher", "slurm", "--devices", "0"]) != 0
    assert main([*base, "--launcher", "slurm", "--slurm-option", "account"]) != 0 and len(given) == 2
    assert capsys.readouterr().err.count("cem-study experiment: error") == 3
