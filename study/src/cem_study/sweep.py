"""Runs of a sweep: a spec per (size, architecture, settings, seed), one directory each, skipped when
finished (in its folder or its campaign's tables: `cem_study.records`) and resumed when interrupted;
several seeds reduced to mean ± std."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import launchers
from cem.provenance import recorded_processors, session_processor
from cem.training.rundir import RunDir, RunLockedError, run_identity, run_name
from .records import Run, RunTable
from .scales import Scale
from .stats import mean_std


@dataclass(frozen=True)
class RunSpec:
    """One training run: a size preset, an architecture, model/training overrides and a seed."""

    size: str
    arch: str
    model: tuple = ()  # sorted (key, value) pairs of model overrides
    train: tuple = ()  # sorted (key, value) pairs of training overrides (e.g. lr)
    seed: int = 0

    @classmethod
    def make(cls, size: str, arch: str, seed: int = 0, train: dict | None = None, **model) -> "RunSpec":
        """A spec with the overrides that differ from the preset, the architecture and the training
        defaults: the same run asked for by two experiments (say `attn_steps=1` spelled out) is one run."""
        from cem.model import model_config
        from cem.training.config import TrainConfig

        base = model_config(size, arch).flat_dict()
        model = {k: v for k, v in model.items() if base.get(k, object()) != v}
        defaults = TrainConfig()
        train = {k: v for k, v in (train or {}).items() if getattr(defaults, k, object()) != v}
        return cls(size, arch, tuple(sorted(model.items())), tuple(sorted(train.items())), seed)

    @property
    def slug(self) -> str:
        """A readable directory name, unique per spec (`run_name`: cut at 80 characters, with a digest)."""
        return run_name([self.size, self.arch], (self.model, self.train), [f"s{self.seed}"], cut=80)

    def with_seed(self, seed: int) -> "RunSpec":
        return RunSpec(self.size, self.arch, self.model, self.train, seed)


@dataclass
class Variant:
    """A labelled spec of an experiment (the seed is added by the sweep)."""

    label: str
    spec: RunSpec
    tags: dict = field(default_factory=dict)
    seeds: tuple[int, ...] | None = None  # its own seeds (a learning-rate sweep), else the experiment's
    own_rate: bool = False  # a CEM variant of a headline comparison: also trained at its own best rate where the scale asks (`RATE_RULES`)
    paired: bool = False  # one of a recursion experiment's T=1/T=2 pair, which may train more seeds (`cem_study.seeds`)


def run_config(spec: RunSpec, scale: Scale, data_dir: str | None, nproc: int = 1):
    """The `RunConfig` of a spec at a scale, for each of `nproc` processes (the same global batch: `split_batch`)."""
    from cem.training import load_run_config

    train = {**scale.train_settings(), "preset": spec.size, "arch": spec.arch, "seed": spec.seed, **dict(spec.train)}
    if data_dir is not None:
        train["data_dir"] = data_dir
    if nproc > 1:
        train.update(split_batch(train["batch_size"], train["grad_accum"], nproc))
    return load_run_config(None, {**{f"train.{k}": v for k, v in train.items()}, **{f"model.{k}": v for k, v in spec.model}})


def split_batch(batch_size: int, grad_accum: int, nproc: int) -> dict:
    """The per-process settings of a run on `nproc` processes with the global batch of one: its micro-batches
    shared out where they divide, else each micro-batch."""
    if grad_accum % nproc == 0:
        return {"grad_accum": grad_accum // nproc}
    if batch_size % nproc == 0:
        return {"batch_size": batch_size // nproc}
    raise ValueError(f"a run of {grad_accum} micro-batches of {batch_size} sequences cannot be shared by {nproc} processes")


def recorded_nproc(run: RunDir, spec: RunSpec, scale: Scale, data_dir: str | None) -> int:
    """The processes a recorded run trained on (its results' world size), or, unfinished, trains on: the scale's
    global batch over the recorded per-process one (1 where nothing is recorded, or it does not divide)."""
    res = run.results()
    if res is not None:
        return res.get("world_size", 1)
    t = run_config(spec, scale, data_dir).train
    rec = (run.read_run() or {}).get("train", {})
    whole, each = t.batch_size * t.grad_accum, rec.get("batch_size", t.batch_size) * rec.get("grad_accum", t.grad_accum)
    k = whole // each if each and whole % each == 0 else 1
    return k if t.grad_accum % k == 0 or t.batch_size % k == 0 else 1


LOCK_POLL_S = 30.0  # how often a sweep looks again at a run that another sweep over the same results holds
HELD = "held"  # what `_run_one` returns, without waiting, for a run another sweep holds
LATE = "late"  # and for a run it did not start: it would not finish by the sweep's deadline (`start_by`)


def _run_one(args) -> dict | str | None:
    spec, scale, data_dir, root, threads, nproc, products, wait, start_by, again = args
    if launchers.stopping():
        return None  # the sweep is stopping: a run already handed to this worker's queue does not start
    out = scale.runs(root) / spec.slug
    late = lambda: start_by is not None and time.time() > start_by  # noqa: E731
    # past its start: not started here, unless another sweep finished it meanwhile or is at it (it started the run
    # within its own deadline: waited for below, as without one)
    if late() and run_status(spec, scale, Path(root), products) != "finished" and not _held(out):
        return LATE
    if again and not late():  # cleared only now that it starts: a run a deadline leaves unstarted keeps its earlier results
        with contextlib.suppress(RunLockedError), RunDir(scale.runs(root) / spec.slug).lock():  # locked: another sweep is at it
            if run_status(spec, scale, Path(root), products) == "again":  # not trained here by another sweep meanwhile
                RunTable(scale.runs(root)).drop([spec.slug])  # its earlier row stays in git history
                RunDir(scale.runs(root) / spec.slug).clear()
    import torch

    from cem.training import Interrupted
    from .products import missing

    if threads:
        torch.set_num_threads(threads)
    waiting = False
    while True:
        try:
            res = Run(out).results()
            if res is None and scale.processor:
                _start_over_if_elsewhere(RunDir(out), scale.processor)
            if res is None:
                if late() and not _held(out):  # left unfinished by the sweep that held it: it would not finish in time
                    return LATE
                res = _train(spec, scale, data_dir, out, nproc, threads)
                if isinstance(res, Interrupted):
                    if launchers.orphaned():  # the sweep is gone: nobody waits for this worker
                        os._exit(143)
                    raise SystemExit(f"interrupted while training {spec.slug}; run the same command again to resume")
            if missing(products, out):  # while the weights are here (`cem_study.products`), held like training
                with RunDir(out).lock():
                    for product in products:
                        product.get(out, data_dir)
            return res
        except RunLockedError as e:  # another sweep over the same results is at it: later, or wait and take what it left
            if not wait or not waiting:
                print(f"  {spec.slug}: {e}; {'waiting for it' if wait else 'put off until the other runs are done'}", file=sys.stderr, flush=True)
            if not wait:
                return HELD
            waiting = True
            if launchers.stopping():
                return None  # (past the deadline it waits on: the other sweep started the run within its own)
            time.sleep(LOCK_POLL_S)


def _held(out: Path) -> bool:
    """Whether another sweep holds the run at `out` (its lock is taken)."""
    if not out.exists():
        return False
    try:
        with RunDir(out).lock():
            return False
    except RunLockedError:
        return True


def _train(spec: RunSpec, scale: Scale, data_dir: str | None, out: Path, nproc: int, threads: int):
    """Train a run (resume what a previous sweep started; a fresh run starts without --resume's notice), on
    `nproc` processes under torchrun's launcher where more than one; its results or `Interrupted`."""
    from cem.training import Interrupted, train

    run, resume = run_config(spec, scale, data_dir, nproc), RunDir(out).read_run() is not None
    if nproc == 1:
        return train(run, out, resume=resume, progress=False)
    from torch.distributed.elastic.multiprocessing.api import SignalException

    try:
        return launchers.torchrun(nproc, _train_rank, run, str(out), resume, max(1, (threads or os.cpu_count() or 1) // nproc))
    except SignalException as e:  # its processes got the signal too, saved their checkpoint and stopped
        return Interrupted(0, int(e.sigval), RunDir(out).ckpt_dir)


def _train_rank(run, out: str, resume: bool, threads: int):
    """One process of a run under torchrun (`_train`)."""
    import torch

    from cem.training import train

    torch.set_num_threads(threads)
    return train(run, out, resume=resume, progress=False)


def _start_over_if_elsewhere(run: RunDir, processor: str) -> None:
    """An unfinished run whose checkpoint was trained (in part) on another processor starts again here: a
    run is trained on one processor (`Scale.processor`)."""
    from cem.training.checkpoint import load_trainer_state

    ckpt = run.checkpoint()
    if ckpt is None:
        return
    others = {session_processor(s) for s in load_trainer_state(ckpt).get("sessions", []) if isinstance(s, dict) and s.get("processor")} - {processor}
    if others:
        print(f"  {run.path.name}: its checkpoint was trained on {', '.join(sorted(others))}; starting it again on {processor}",
              file=sys.stderr, flush=True)
        with run.lock():
            run.clear()


def run_status(spec: RunSpec, scale: Scale, root: Path, products=()) -> str:
    """What a sweep does with a run: "finished" (nothing), "train" (unfinished: train it, or resume),
    "evaluate" (finished, lacking one of its `products`: computed from its checkpoint) or "again" (finished,
    lacking a product, and its checkpoint is gone; or, where the scale names a `processor`, trained on
    another: trained again)."""
    from .products import missing

    run = Run(scale.runs(root) / spec.slug)
    res = run.results()
    if res is None:
        return "train"
    if scale.processor and not scale.seed_blocks and other_processor(res, scale.processor):
        return "again"  # (in a campaign of seed blocks, another processor's seed is refused: `run_sweep`)
    if not missing(products, run.path):
        return "finished"
    return "evaluate" if run.checkpoint() is not None else "again"


def block_processors(scale: Scale, root: Path) -> dict[tuple[str, int], list[str]]:
    """Per block (size, seed), the processors that the finished runs of the scale's runs folder of that size and seed
    trained on: where each block trains (`Scale.seed_blocks`)."""
    from .records import runs_in

    out: dict[tuple[str, int], list[str]] = {}
    for run in runs_in(scale.runs(root)):
        res = run.results()
        if res is not None:
            train = res["config"]["train"]
            procs = out.setdefault((train["preset"], int(train["seed"])), [])
            procs += [p for p in recorded_processors(res) if p not in procs]
    return out


def _block(spec: RunSpec) -> tuple[str, int]:
    return spec.size, spec.seed


def _blocks_text(blocks) -> str:
    """Blocks (size, seed) in words, a size at a time in the order given: "seed 1 at cpu96, seeds 0 and 2 at cpu128"."""
    by_size: dict[str, list[int]] = {}
    for size, seed in blocks:
        by_size.setdefault(size, []).append(seed)

    def seeds(v: list[int]) -> str:
        return f"seed {v[0]}" if len(v) == 1 else f"seeds {', '.join(map(str, v[:-1]))} and {v[-1]}"

    return ", ".join(f"{seeds(sorted(v))} at {z}" for z, v in by_size.items())


class BlocksElsewhere(Exception):
    """A campaign of seed blocks (`Scale.seed_blocks`) trained every run this processor may train; `runs` (slugs) are
    of blocks another processor holds, left to it."""

    def __init__(self, runs: list[str], held: str, here: str) -> None:
        self.runs = runs
        super().__init__(f"{len(runs)} run{'s' if len(runs) != 1 else ''} left to the processors that hold {'their blocks' if len(runs) != 1 else 'its block'} "
                         f"({held}): each (size, seed) block of this campaign trains on one processor, and this machine is "
                         f"{here}; run the same command there to go on")


def blocks_elsewhere(todo: list[RunSpec], owners: dict[tuple[str, int], list[str]], here: str) -> tuple[list[RunSpec], str]:
    """The runs of `todo` whose block (size, seed) a processor other than `here` holds (`owners`: `block_processors`),
    and those blocks with their processors in words."""
    foreign = [s for s in todo if any(p != here for p in owners.get(_block(s), []))]
    return foreign, "; ".join(f"{_blocks_text([b])} on {', '.join(owners[b])}" for b in dict.fromkeys(map(_block, foreign)))


def processor_here(spec: RunSpec, scale: Scale, data_dir: str | None = None) -> str:
    """The processor `spec` would train on from this machine (the GPU's name on CUDA), as its results will record it."""
    from cem.device import pick_device
    from cem.provenance import processor

    return processor(pick_device(run_config(spec, scale, data_dir).train.device))


def _check_block(todo: list[RunSpec], scale: Scale, root: Path, here: str) -> tuple[list[RunSpec], str]:
    """The runs of `todo` whose block (size, seed) another processor holds (`Scale.seed_blocks`), to be left to it,
    and those blocks with their processors in words; refuses, naming the blocks this machine may train, where that
    is every run of `todo`."""
    owners = block_processors(scale, root)
    foreign, held = blocks_elsewhere(todo, owners, here)
    if foreign and len(foreign) == len(todo):
        free = [(z, k) for z in scale.sizes for k in scale.seeds_for("recursion") if all(p == here for p in owners.get((z, k), []))]
        raise ValueError(f"each (size, seed) block of this campaign trains on one processor, and another holds {held}; this "
                         f"machine is {here}: train " + (f"--seeds {','.join(map(str, sorted({k for _, k in free})))} here (blocks "
                                                         f"started here or by none: {_blocks_text(free)})" if free else
                                                         "nothing here (every block is started elsewhere)"))
    return foreign, held


def other_processor(res: dict, processor: str) -> str | None:
    """The processor a finished run was trained on (any of its sessions) where it is not `processor`."""
    others = [p for p in recorded_processors(res) if p != processor]
    return others[0] if others else None


def run_sweep(specs: list[RunSpec], scale: Scale, root: Path, data_dir: str | None = None, jobs: int | launchers.Launcher = 1,
              products: dict | None = None, wait: bool = True) -> dict[RunSpec, dict | None]:
    """Train every spec not finished yet under `root/runs/`, and compute each spec's `products` (what its
    experiments' analyses read from its weights, `cem_study.products`) as soon as it has finished;
    returns the results of all of them. A finished run that lacks a product is evaluated from its
    checkpoint, or trained again where the checkpoint is gone (a run trained on another machine). `jobs`:
    runs at once on this machine, or where and how the runs train (`cem_study.launchers`). A run another
    sweep over the same results holds is put off until the others are done, then waited for; without `wait`,
    it is left to that sweep (its result None: the caller comes back to it). A launcher with a deadline (`until`)
    starts no training that would not finish by then (`cem_study.costs.Deadline`): the others go on, and then
    the sweep raises `DeadlineReached` naming the runs left. In a campaign of seed blocks (`Scale.seed_blocks`) the
    runs of a block another processor holds are left to it likewise, and `BlocksElsewhere` names them."""
    from .products import missing

    launcher = jobs if isinstance(jobs, launchers.Launcher) else launchers.ProcessLauncher(jobs)
    products = products or {}
    unique = list(dict.fromkeys(specs))
    for s in unique:
        _check_finished(s, scale, root, data_dir, launcher.nproc_per_run)
    runs = {s: Run(scale.runs(root) / s.slug) for s in unique}
    status = {s: run_status(s, scale, root, products.get(s, ())) for s in unique}
    fresh = [s for s in unique if status[s] == "train"]
    evaluate = [s for s in unique if status[s] in ("evaluate", "again")]
    again = [s for s in unique if status[s] == "again"]
    elsewhere: list[RunSpec] = []  # in a campaign of seed blocks, runs of blocks another processor holds: left to it
    if (scale.processor or scale.seed_blocks) and (fresh or again):
        machine = processor_here((fresh or again)[0], scale, data_dir)
        if scale.processor and machine != scale.processor:
            raise ValueError(f"this suite trains on {scale.processor} only (its runs are paired by seed, and another processor "
                             f"sums floats in another order); this machine is {machine}: run it where the other runs ran")
        if scale.seed_blocks:
            elsewhere, held = _check_block(fresh + again, scale, Path(root), machine)
            if elsewhere:
                print(f"{len(elsewhere)} run{'s' if len(elsewhere) != 1 else ''} not trained here: left to the processors that hold "
                      f"their blocks ({held})", file=sys.stderr, flush=True)
            fresh, evaluate, again = ([s for s in x if s not in elsewhere] for x in (fresh, evaluate, again))
    for s in again:
        other = other_processor(runs[s].results(), scale.processor) if scale.processor and not scale.seed_blocks else None
        if other:
            why = f"it was trained on {other}, and this suite trains on {scale.processor} only"
        else:
            why = f"{', '.join(p.name for p in missing(products[s], runs[s].path))} must be computed from its weights and its checkpoint is gone"
        print(f"training {s.slug} again: {why} (its earlier results stay in git history)", file=sys.stderr, flush=True)
    # an interrupted run resumes first (its checkpoint holds work that a change of machine would lose), then what
    # lacks its products (a result cleared to train again is missing meanwhile), then the runs not started
    resume = [s for s in fresh if runs[s].checkpoint() is not None]
    todo = resume + evaluate + [s for s in fresh if s not in resume]
    print(f"{len(unique)} runs, {len(unique) - len(todo) - len(elsewhere)} already finished, {len(fresh) + len(again)} to train"
          + (f" ({len(again)} again)" if again else "") + (f", {len(evaluate) - len(again)} to evaluate" if len(evaluate) > len(again) else ""),
          file=sys.stderr, flush=True)
    deadline = launcher.until  # a run it trains is held to it with its products; evaluating a finished run's is not
    starts = deadline.start_by(scale, root, [s for s in todo if status[s] != "evaluate"], products) if deadline is not None else {}
    args = [(s, scale, data_dir, str(root), launcher.threads(), launcher.nproc_per_run, products.get(s, ()), False,
             starts[s][0] if s in starts else None, s in again) for s in todo]
    progress, late = _Progress(len(todo)), []

    def done(a, res) -> tuple | None:
        """The run again, to wait for, if another sweep held it; else its progress line."""
        if res == LATE:
            late.append(a[0])
            return None
        if isinstance(res, str):
            return (*a[:-3], True, *a[-2:]) if wait else None
        progress.done(a[0], res, trained=a[0] not in evaluate or a[0] in again)
        return None

    launcher.run(_run_one, args, done)
    if late:
        raise deadline.missed([(s.slug, starts[s][1]) for s in late])
    if elsewhere:
        raise BlocksElsewhere([s.slug for s in elsewhere], held, machine)
    return {s: runs[s].results() for s in unique}


class _Progress:
    """One line per finished run: its test perplexity and tokens per parameter (or that it was evaluated),
    runs left, and an ETA."""

    def __init__(self, total: int) -> None:
        self.total, self.finished, self.started = total, 0, time.perf_counter()

    def done(self, spec: RunSpec, res: dict, trained: bool = True) -> None:
        self.finished += 1
        elapsed = time.perf_counter() - self.started
        eta = elapsed / self.finished * (self.total - self.finished)
        what = (f"test ppl {res['test_perplexity']:.3f}, {res['tokens_seen']:,} tokens in {res['wall_time_s']:.0f} s" if trained
                else "evaluated from its checkpoint")
        print(f"  [{self.finished}/{self.total}] {spec.slug}: {what}; elapsed {elapsed / 60:.1f} min, ETA {eta / 60:.1f} min",
              file=sys.stderr, flush=True)


def _check_finished(spec: RunSpec, scale: Scale, root: Path, data_dir: str | None, nproc: int = 1) -> None:
    """A finished run is reused only if it is the same run (`run_identity`: this scale's settings, on any number
    of processes with the same global batch); an interrupted one resumes on the processes it started on."""
    run = Run(scale.runs(root) / spec.slug)
    recorded, finished = recorded_nproc(run, spec, scale, data_dir), run.results() is not None
    diff = run.differences(run_identity(run_config(spec, scale, data_dir, recorded))) if finished else []
    if diff:
        raise ValueError(f"{run.where()} was trained with other settings ({', '.join(diff)} differ); use another --results directory")
    if recorded != nproc and run.checkpoint() is not None and not finished:
        raise ValueError(f"{run.path} was started on {recorded} processes per run; resume it with --nproc-per-run {recorded}")


def budget_tokens(res: dict) -> int:
    """The Chinchilla budget of a finished run's Llama baseline (20 tokens per parameter)."""
    from cem.model.params import chinchilla_tokens

    return chinchilla_tokens(res["config"]["train"]["preset"], res["model"]["vocab_size"], res["model"]["context"])


def _default_lr() -> float:
    from cem.training.config import TrainConfig

    return TrainConfig().lr


def summarize(variants: list[Variant], results: dict[RunSpec, dict], seeds: tuple[int, ...]) -> list[dict]:
    """One row per variant: the per-seed test metrics (for paired statistics), their mean ± std, the
    parameters, the tokens seen and the Chinchilla budget of the variant's Llama baseline."""
    rows = []
    for v in variants:
        own = v.seeds or seeds
        runs = [results[v.spec.with_seed(s)] for s in own]
        row = {"label": v.label, "size": v.spec.size, "arch": v.spec.arch, **v.tags, "seeds": list(own), "lr": dict(v.spec.train).get("lr", _default_lr())}
        for key in ("test_perplexity", "test_bits_per_byte", "test_loss", "valid_loss", "valid_perplexity"):
            row[key + "_per_seed"] = [r[key] for r in runs]
            row[key], row[key + "_std"] = mean_std(row[key + "_per_seed"])
        row["processor_per_seed"] = [(recorded_processors(r) or [None])[0] if len(recorded_processors(r)) <= 1 else "several" for r in runs]
        row["parameters"] = runs[0]["parameters"]["total"]
        row["attention_parameters"] = runs[0]["parameters"]["attention"]
        row["mlp_parameters"] = runs[0]["parameters"]["mlp"]
        row["tokens"] = min(r["tokens_seen"] for r in runs)
        row["budget_tokens"] = budget_tokens(runs[0])
        row["tokens_per_llama_parameter"] = 20 * row["tokens"] / row["budget_tokens"]
        row["wall_time_s"] = mean_std([r["wall_time_s"] for r in runs])[0]
        rows.append(row)
    return rows
