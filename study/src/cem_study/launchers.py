"""Where a sweep's runs train: one home for launchers, chosen by kind (`LAUNCHERS`).

- `process` (the default): in this process, or with several jobs in a pool of worker processes of this
  machine;
- `local`, `slurm`: each run a job of submitit's local or SLURM executor (`pip install -e
  '.[cluster]'` in the cem clone), requeued by submitit when the scheduler times it out or preempts it.

Every launcher runs at most `jobs` runs at once and gives each its own devices where it has device groups
(`device_groups`: CUDA_VISIBLE_DEVICES in the job's own process, set before CUDA starts; under SLURM the
scheduler assigns them), and with `nproc_per_run` > 1 trains each run on that many processes under
torch.distributed's elastic launcher (`torchrun`, what `torchrun --standalone` runs). What to train is the
sweep's decision (finished runs are skipped, interrupted ones resume from their checkpoint, and a run folder
is held by a lock, `RunDir.lock`), so a launcher only runs what it is given.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path

from cem.checks import check_nonnegative_int, check_positive_int
from cem.processes import die_with_parent

_STOP = None  # in a worker of a pool: the pool's stop event (`_init_worker`)
_PARENT = None  # and the pid of the process that started it
VISIBLE = "CUDA_VISIBLE_DEVICES"


def _init_worker(stop, parent: int) -> None:
    """A worker of a pool: keep the stop event, and on Linux ask for SIGTERM when the sweep's process dies
    (even by SIGKILL), so that a run does not train on, orphaned, holding its run directory's lock: the
    trainer saves a checkpoint at the end of its step and stops."""
    global _STOP, _PARENT
    _STOP, _PARENT = stop, parent
    die_with_parent(parent, signal.SIGTERM)


def stopping() -> bool:
    """Whether the pool this process works for is stopping (no new run starts)."""
    return _STOP is not None and _STOP.is_set()


def orphaned() -> bool:
    """Whether this pool worker's sweep is gone (nobody waits for its result)."""
    return _PARENT is not None and os.getppid() != _PARENT


def _call(fn, task, env: dict):
    """`fn(task)` in a job's own process, with `env` set first (a None value unsets the variable)."""
    for key, value in env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    return fn(task)


def device_groups(devices=None, nproc: int = 1, jobs: int = 1) -> tuple[tuple[str, ...], ...] | None:
    """The device groups jobs are given in turn: `devices` (ids: a comma-separated string or a sequence), else,
    where several jobs or processes per run are asked for on a machine with CUDA devices, its visible devices;
    cut into groups of `nproc` (one device per process). None: no devices assigned (the CPU, or one job)."""
    if devices is None:
        import torch

        if (jobs == 1 and nproc == 1) or not torch.cuda.is_available():
            return None
        visible = os.environ.get(VISIBLE)
        devices = visible.split(",") if visible else range(torch.cuda.device_count())
    ids = [d.strip() for d in devices.split(",")] if isinstance(devices, str) else [str(d) for d in devices]
    if not ids or "" in ids or len(ids) % nproc:
        raise ValueError(f"devices {','.join(ids)!r}: give device ids, a multiple of --nproc-per-run ({nproc}) of them")
    return tuple(tuple(ids[i : i + nproc]) for i in range(0, len(ids), nproc))


def torchrun(nproc: int, fn, *args):
    """`fn(*args)` on `nproc` processes of this machine under torch.distributed's elastic launcher (the API of
    `torchrun --standalone --nproc-per-node`; each process finds RANK, WORLD_SIZE and the rendezvous in its
    environment); returns rank 0's result. A signal to this process stops them (SignalException)."""
    import uuid

    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=str(uuid.uuid4()), rdzv_backend="c10d",
                          rdzv_endpoint="localhost:0", max_restarts=0, start_method="spawn")
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}  # the launcher sets its own and leaves them
    try:
        return elastic_launch(config, fn)(*args)[0]
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)


@dataclass
class Launcher:
    """Runs tasks, at most `jobs` at once, handing each the next free device group (`devices`); with `until`, a
    sweep starts no run on it that would not finish by then (`cem_study.costs.Deadline`)."""

    assigns_devices = True  # False: a scheduler assigns them

    jobs: int = 1
    nproc_per_run: int = 1  # processes per run (torchrun)
    devices: tuple[tuple[str, ...], ...] | None = None  # device groups (`device_groups`)
    until: object = None  # a `cem_study.costs.Deadline`, or None

    def __post_init__(self) -> None:
        check_positive_int("jobs", self.jobs)
        check_positive_int("nproc_per_run", self.nproc_per_run)

    def run(self, fn, tasks, done) -> None:
        """`fn(task)` for every task; `done(task, result)`, as each finishes, returns a task to run later or None."""
        queue, pending = list(tasks), {}
        free = [self.devices[i % len(self.devices)] if self.devices else None for i in range(self.jobs)]
        self.open(len(queue))
        try:
            while queue or pending:
                while queue and free:
                    task, slot = queue.pop(0), free.pop(0)
                    pending[self.submit(fn, task, slot)] = (task, slot)
                for job in self.finished(list(pending)):
                    task, slot = pending.pop(job)
                    free.append(slot)
                    again = done(task, job.result())
                    if again is not None:
                        queue.append(again)
        except BaseException as exc:  # a run failed, or this process was stopped (Ctrl-C, SIGTERM)
            self.stop(list(pending), interrupted=not isinstance(exc, Exception))
            raise
        finally:
            self.close()

    def threads(self) -> int:
        """Threads per run (0: torch's default)."""
        return max(1, (os.cpu_count() or 1) // self.jobs) if self.jobs > 1 else 0

    def open(self, n: int) -> None:
        """Before `n` tasks."""

    def submit(self, fn, task, slot):
        raise NotImplementedError

    def finished(self, jobs: list) -> list:
        raise NotImplementedError

    def stop(self, jobs: list, interrupted: bool) -> None:
        """A task failed (no new one starts) or, `interrupted`, this process was stopped."""

    def close(self) -> None:
        """After the tasks."""


@dataclass
class ProcessLauncher(Launcher):
    """This process, or a pool of `jobs` spawned workers of this machine; with device groups, every run in a
    fresh worker that sees only its group."""

    def open(self, n: int) -> None:
        self._pool = None
        if (self.jobs > 1 and n > 1) or self.devices:
            context = get_context("spawn")
            self._stop = context.Event()
            self._pool = ProcessPoolExecutor(self.jobs, mp_context=context, initializer=_init_worker, initargs=(self._stop, os.getpid()),
                                             max_tasks_per_child=1 if self.devices else None)

    def submit(self, fn, task, slot):
        if self._pool is None:
            future = Future()
            future.set_result(fn(task))
            return future
        return self._pool.submit(_call, fn, task, {VISIBLE: ",".join(slot)} if slot else {})

    def finished(self, jobs: list) -> list:
        return list(wait_futures(jobs, return_when=FIRST_COMPLETED)[0])

    def stop(self, jobs: list, interrupted: bool) -> None:
        if self._pool is None:
            return
        self._stop.set()  # no new run starts, not even one already queued to a worker
        if interrupted:  # the running runs checkpoint and stop too, not finish
            _stop_workers(self._pool)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """SIGTERM to the pool's workers: each running run saves its checkpoint at the end of its step and
    returns (the trainer's handler only sets a flag, so a second signal, e.g. a Ctrl-C that reached the
    whole process group too, is harmless)."""
    for proc in list(getattr(pool, "_processes", {}).values()):
        with contextlib.suppress(ProcessLookupError, OSError):
            if proc.is_alive():
                os.kill(proc.pid, signal.SIGTERM)


class _Requeued:
    """A run as a submitit job, requeued (up to submitit's limit) when the scheduler times it out or preempts
    it: the requeued job resumes the run from its last checkpoint."""

    def __call__(self, fn, task, env: dict):
        return _call(fn, task, env)

    def checkpoint(self, *args):
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(self, *args)


@dataclass
class SubmititLauncher(Launcher):
    """Each run a job of a submitit executor (`cluster`); `options` are its parameters (submitit's
    `update_parameters`: timeout_min, cpus_per_task, gpus_per_node, slurm_partition, ...)."""

    cluster = ""
    folder: str | Path = ".submitit"  # submitit's job files and logs
    options: dict = field(default_factory=dict)
    poll_s: float = 1.0  # how often the jobs' states are read

    def open(self, n: int) -> None:
        try:
            import submitit
        except ImportError:
            raise ValueError(f"the {self.cluster} launcher needs submitit: pip install -e '.[cluster]' in the cem clone") from None
        self._executor = submitit.AutoExecutor(folder=str(self.folder), cluster=self.cluster)
        self._executor.update_parameters(**{**self.defaults(), **self.options})

    def defaults(self) -> dict:
        """Executor parameters unless `options` say otherwise: one task on one node, 24 hours."""
        return {"name": "cem", "nodes": 1, "tasks_per_node": 1, "timeout_min": 24 * 60}

    def env(self, slot) -> dict:
        """What a job's process sees of the devices."""
        return {}

    def submit(self, fn, task, slot):
        return self._executor.submit(_Requeued(), fn, task, self.env(slot))

    def finished(self, jobs: list) -> list:
        while not (done := [j for j in jobs if j.done()]):
            time.sleep(self.poll_s)
        return done

    def stop(self, jobs: list, interrupted: bool) -> None:
        """Stopped: the running jobs are cancelled (each saves its checkpoint); after a failure they go on."""
        if interrupted:
            for job in jobs:
                with contextlib.suppress(Exception):
                    job.cancel(check=False)


@dataclass
class LocalLauncher(SubmititLauncher):
    """submitit's local executor: jobs on this machine, each given its device group."""

    cluster = "local"

    def env(self, slot) -> dict:
        return {VISIBLE: ",".join(slot) if slot else os.environ.get(VISIBLE)}  # the executor hides every GPU otherwise


@dataclass
class SlurmLauncher(SubmititLauncher):
    """submitit's SLURM executor: jobs in the queue, at most `jobs` at once; SLURM assigns their devices."""

    cluster = "slurm"
    assigns_devices = False
    poll_s: float = 30.0

    def __post_init__(self) -> None:
        if shutil.which("srun") is None:  # what submitit looks for, when the first job is submitted ('Could not detect "srun"')
            raise ValueError("--launcher slurm: this machine is not on a SLURM cluster (no srun on PATH); run on the cluster's "
                             "login node, or use --launcher local or process")
        super().__post_init__()

    def defaults(self) -> dict:
        return {**super().defaults(), "gpus_per_node": self.nproc_per_run}  # a CPU cluster: gpus_per_node=0 in `options`

    def threads(self) -> int:
        return 0  # the job's own CPUs


def slurm_options(pairs) -> dict:
    """`KEY=VALUE` settings as submitit's SLURM parameters (`slurm_KEY`)."""
    bad = [p for p in pairs if "=" not in p or not p.split("=", 1)[0]]
    if bad:
        raise ValueError(f"--slurm-option {bad[0]!r}: give KEY=VALUE, e.g. account=ABC")
    return {f"slurm_{k}": v for k, v in (p.split("=", 1) for p in pairs)}


LAUNCHERS = {"process": ProcessLauncher, "local": LocalLauncher, "slurm": SlurmLauncher}
# submitit's parameters that `cem-study experiment` sets, by its flag, and the least each may be (a job's minutes, CPUs, GPUs)
OPTION_FLAGS = {"slurm_partition": ("--partition", None), "timeout_min": ("--time-min", 1), "cpus_per_task": ("--cpus-per-run", 1),
                "gpus_per_node": ("--gpus-per-run", 0)}


def _flag(option: str) -> str:
    """The flag that sets the submitit parameter `option` (`--slurm-option KEY=...` for `slurm_KEY`)."""
    return OPTION_FLAGS[option][0] if option in OPTION_FLAGS else f"--slurm-option {option.removeprefix('slurm_')}"


def make_launcher(kind: str = "process", jobs: int | None = None, devices=None, nproc_per_run: int = 1, folder=None, until=None,
                  **options) -> Launcher:
    """A launcher of `kind` (`LAUNCHERS`): `jobs` runs at once (default: one per device group where devices are
    given, else 1), each on `nproc_per_run` processes, none started that would not finish by `until` (a
    `Deadline`); a submitit launcher's job files in `folder`, and `options` its executor's parameters."""
    if kind not in LAUNCHERS:
        raise ValueError(f"unknown launcher {kind!r}; expected one of {', '.join(LAUNCHERS)}")
    cls = LAUNCHERS[kind]
    check_positive_int("--nproc-per-run", nproc_per_run)
    if not cls.assigns_devices and devices is not None:
        raise ValueError(f"--devices: the {kind} scheduler assigns each job's devices")
    submitit = issubclass(cls, SubmititLauncher)
    if options and not submitit:
        raise ValueError(f"{', '.join(map(_flag, options))}: settings of a scheduler's jobs, not of the {kind} launcher")
    for option, value in options.items():
        low = OPTION_FLAGS.get(option, (None, None))[1]
        if low is not None:
            (check_positive_int if low else check_nonnegative_int)(_flag(option), value)
    if devices is not None:
        from cem.device import cuda_device_ids

        devices = cuda_device_ids(devices)
    groups = device_groups(devices, nproc_per_run, jobs or 1) if cls.assigns_devices else None
    if jobs is None:
        jobs = len(groups) if devices is not None else 1
    return cls(jobs, nproc_per_run, groups, until, **({"folder": folder or ".submitit", "options": options} if submitit else {}))
