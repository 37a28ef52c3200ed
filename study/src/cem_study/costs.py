"""What runs cost: the training time a run still needs and the time a run product takes, estimated from the
runs already finished (`Costs`), for `cem-study experiment --plan` and for `--until` (`Deadline`: no run starts that
would not finish by then)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cached_property
from pathlib import Path

from cem.training.rundir import RunDir
from .records import RunTable, runs_in
from .scales import Scale
from .sweep import run_config

GPU_SCALES = ("gpu", "paper")  # scales whose runs train on GPUs: their plan counts GPU-hours
H100_BF16_FLOPS = 760e12  # the bf16 matmul peak measured on an H100 (docs/benchmarks/gpu_h100.md: 758-768 TFLOP/s)
ASSUMED_MFU = 0.15  # the share of it a run is assumed to reach where no run was measured: CEM's eager 15-17% there (Llama 26%)
ASSUMED_CORE_FLOPS = 10e9  # FLOP/s of one CPU core where no run was measured: below every committed cpu run (14-64 GFLOP/s)
COMMITTED = Path(__file__).resolve().parents[3] / "study" / "results"  # the results committed beside the code: the checkout's study/results (study/src/cem_study/../../..)


def _results_in(runs: Path) -> list[dict]:
    return [r for r in (run.results() for run in runs_in(runs)) if r is not None]


def _run_flops(res: dict, gpu: bool) -> float | None:
    """Training FLOP/s of a finished run (the FLOP model's count) per thread, or per GPU at a GPU scale."""
    from cem.model import ModelConfig
    from cem.model.flops import train_flops_per_token

    try:
        per_token = train_flops_per_token(ModelConfig.from_dict(res["model"]))
        units = res.get("world_size", 1) if gpu else (res.get("sessions") or [{}])[0].get("threads", 1)
        return res["tokens_seen"] * per_token / (res["wall_time_s"] * units)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None


@dataclass
class Costs:
    """The cost model of a scale's runs in a results folder. A run's training seconds rest on the first source
    with a finished run of its size: the finished runs here, else those committed in study/results for the scale;
    where neither has one, on its budget's training FLOPs at `rate` (their median FLOP/s, else an assumption)."""

    scale: Scale
    root: Path
    committed: Path = field(default=None)  # the runs folder whose tables beside the code hold this scale's runs (default: study/results)

    def __post_init__(self) -> None:
        if self.committed is None:  # a scale trained on a lent GPU: the runs trained together there (its `measured_on`)
            self.committed = COMMITTED / (self.scale.measured_on or f"{self.scale.runs_from or self.scale.name}/runs")

    @property
    def runs(self) -> Path:
        return self.scale.runs(self.root)

    @property
    def gpu(self) -> bool:
        return self.scale.name in GPU_SCALES or self.scale.measured_on is not None

    @cached_property
    def finished(self) -> list[tuple[dict, dict]]:
        """(results, recorded product times) of every finished run here."""
        from .products import recorded_times

        return [(r, recorded_times(run.path)) for r, run in ((run.results(), run) for run in runs_in(self.runs)) if r is not None]

    @cached_property
    def sources(self) -> dict[str, list[dict]]:
        """Finished runs' results by the name a plan gives them: here, then committed."""
        return {"here": [r for r, _ in self.finished],
                f"the committed runs in {RunTable(self.committed).path.relative_to(self.committed.parents[3])}": _results_in(self.committed)}

    @cached_property
    def rate(self) -> tuple[float, str]:
        """The training FLOP/s of one core (one GPU at a GPU scale) and what it rests on: the median over the
        finished runs here, else over the committed runs, else an assumption."""
        here, committed = self.sources.values()
        rates, where = [r for r in (_run_flops(res, self.gpu) for res in here) if r], "the finished runs here"
        if not rates:
            table = RunTable(self.committed).path
            shown = table.relative_to(COMMITTED.parents[1]) if table.is_relative_to(COMMITTED.parents[1]) else table
            rates, where = [r for r in (_run_flops(res, self.gpu) for res in committed) if r], f"the committed runs in {shown}"
        if rates:
            return statistics.median(rates), f"{statistics.median(rates) / 1e9:,.0f} GFLOP/s per {'GPU' if self.gpu else 'core'}, measured on {where} ({len(rates)})"
        if self.gpu:
            return H100_BF16_FLOPS * ASSUMED_MFU, f"an assumed {ASSUMED_MFU:.0%} MFU of an H100's measured {H100_BF16_FLOPS / 1e12:.0f} TFLOP/s (bf16)"
        return ASSUMED_CORE_FLOPS, f"an assumed {ASSUMED_CORE_FLOPS / 1e9:.0f} GFLOP/s per core (conservative: the committed cpu runs measured 14-64)"

    def seconds(self, spec) -> tuple[float, str | None]:
        """Training seconds left for a run, and the name of the source they rest on: the median wall time of that
        source's runs of its size, architecture and model settings (any seed or rate), else of those of its size
        scaled by training FLOPs per token (the budget is the size's), else (None: no finished run of its size)
        its budget's training FLOPs at `rate`; times the share of its steps not yet checkpointed. Within a source,
        the runs trained on this CPU (named with its family: `cem.provenance.processor`, recorded or inferred) are read
        first: CPUs under one model name differ in speed."""
        from cem.device import cpu_id
        from cem.model import model_config
        from cem.provenance import processor, recorded_processors
        from cem.model.flops import train_flops_per_token
        from cem.training.budget import Budget
        from cem.training.checkpoint import read_manifest

        def flops(arch: str, model: dict) -> int:
            return train_flops_per_token(model_config(spec.size, arch, **model))

        def times(runs: list[dict]) -> tuple[list[float], list[float]]:
            """Wall times of the runs of the spec's settings, and of its size scaled to its FLOPs."""
            same, scaled = [], []
            for res in runs:
                if "wall_time_s" not in res or res.get("config", {}).get("train", {}).get("preset") != spec.size:
                    continue
                arch, model = res["config"]["train"]["arch"], res["config"].get("model_overrides") or {}
                if arch == spec.arch and model == dict(spec.model):
                    same.append(res["wall_time_s"])
                scaled.append(res["wall_time_s"] * flops(spec.arch, dict(spec.model)) / flops(arch, model))
            return same, scaled

        mine = processor() if cpu_id() else None  # a CPU that does not say its family: its model name tells too little
        by, same, scaled = None, [], []
        for by, finished in self.sources.items():
            this_cpu = [r for r in finished if mine and recorded_processors(r) == [mine]]
            for runs in (this_cpu, finished):
                same, scaled = times(runs)
                if scaled:
                    break
            if scaled:
                break
        if scaled:
            seconds = statistics.median(same or scaled)
        else:
            run = run_config(spec, self.scale, None)
            cfg = run.model()
            seconds = Budget.of(run.train, cfg, run.train.seq_len or cfg.context).tokens * train_flops_per_token(cfg) / self.rate[0]
        run = RunDir(self.runs / spec.slug)
        ckpt, recorded = run.checkpoint(), run.read_run()
        if ckpt is not None and recorded and recorded.get("total_steps"):
            seconds *= max(0.0, 1 - read_manifest(ckpt)["step"] / recorded["total_steps"])
        return seconds, by if scaled else None

    def product_seconds(self, spec, name: str) -> float | None:
        """Seconds a product will take: the median of its recorded times (`products.recorded_times`) on finished
        runs of the spec's size, architecture and model settings, else of its size. None: none recorded."""
        same, size = [], []
        for res, times in self.finished:
            train = res.get("config", {}).get("train", {})
            if name not in times or train.get("preset") != spec.size:
                continue
            size.append(times[name])
            if train.get("arch") == spec.arch and (res["config"].get("model_overrides") or {}) == dict(spec.model):
                same.append(times[name])
        return statistics.median(same or size) if size else None


DEADLINE_MARGIN = 1.2  # a run's estimate is stretched by this: 9 in 10 committed cpu runs took at most 1.2x their model's median


@dataclass(frozen=True)
class Deadline:
    """`--until`: the time (seconds since the epoch) by which every run started should have finished. A run
    starts only while `now + margin * its estimated seconds` (`Costs.seconds` to train, `Costs.product_seconds` for
    its products) is before it, so a sweep whose
    machine goes away then (a session's end, a reservation's) loses no run half-trained."""

    at: float
    margin: float = DEADLINE_MARGIN

    @classmethod
    def parse(cls, text: str, now: datetime | None = None) -> "Deadline":
        """`HH:MM` (the next such local time) or an ISO date and time (`2026-11-28T06:20`, local unless it names a zone)."""
        now = now or datetime.now().astimezone()
        try:
            if len(text) <= 5 and ":" in text:
                hour, minute = (int(x) for x in text.split(":"))
                at = now.replace(hour=hour, minute=minute, second=0, microsecond=0)
                at += timedelta(days=1) if at <= now else timedelta()
            else:
                at = datetime.fromisoformat(text)
                at = at.astimezone() if at.tzinfo is None else at
        except ValueError:
            raise ValueError(f"--until {text!r}: give a time as HH:MM (the next such time) or an ISO date and time, e.g. 2026-11-28T06:20") from None
        if at <= now:
            raise ValueError(f"--until {text!r} is past ({at:%Y-%m-%d %H:%M}); give a later time")
        return cls(at.timestamp())

    def start_by(self, scale: Scale, root: Path, specs, products: dict | None = None) -> dict:
        """(the latest time it may start, its estimated seconds) of each run, from the scale's `Costs` in `root`: its
        training and then its products (`products`: by spec, those computed from its weights once it has trained;
        one with no recorded time counts nothing)."""
        costs = Costs(scale, root)

        def seconds(spec) -> float:
            after = (costs.product_seconds(spec, p.name) for p in (products or {}).get(spec, ()))
            return costs.seconds(spec)[0] + sum(t for t in after if t is not None)

        return {s: (self.at - self.margin * t, t) for s, t in ((s, seconds(s)) for s in specs)}

    def missed(self, runs: list[tuple[str, float]]) -> "DeadlineReached":
        """What a sweep raises after its runs that fitted: the runs left, by name, with their estimated seconds."""
        return DeadlineReached(self, runs)

    def text(self) -> str:
        return datetime.fromtimestamp(self.at).astimezone().strftime("%Y-%m-%d %H:%M %Z")


class DeadlineReached(Exception):
    """Runs were left unstarted because they would not have finished by the `Deadline`; `runs` names each
    with its estimated seconds."""

    def __init__(self, deadline: Deadline, runs: list[tuple[str, float]]) -> None:
        self.deadline, self.runs = deadline, runs
        listed = ", ".join(f"{slug} (about {s / 60:.0f} min)" for slug, s in runs[:3]) + (f" and {len(runs) - 3} more" if len(runs) > 3 else "")
        super().__init__(f"stopped for --until {deadline.text()}: {len(runs)} run{'s' if len(runs) != 1 else ''} not started, as "
                         f"{'they' if len(runs) != 1 else 'it'} would not finish by then ({listed}); run the same command again to go on")


def wave_seconds(scale: Scale, specs, measured: Path) -> dict:
    """Wall seconds of training `specs` together on one GPU, a process each (one call on a lent GPU), from runs measured
    together on that GPU (the finished runs of the runs folder `measured`, of other sizes), under two bounds; the
    estimate is the larger. Bound by steps (a small run's kernel launches): each spec's steps times a measured run's
    wall seconds per step (the same architecture and settings, else the same architecture; the slowest), scaled by
    training FLOPs per token as a count of its kernels. Bound by throughput: the training FLOPs of them all at the
    FLOP/s the measured runs reached together (as many processes as `specs`, each at their median). Both rest on wall
    times, compilation and the final evaluation included."""
    from cem.model import ModelConfig
    from cem.model.flops import train_flops_per_token
    from cem.training.budget import Budget

    ref = [r for r in _results_in(measured) if r.get("steps") and r.get("wall_time_s")]
    if not ref:
        raise ValueError(f"no finished run in {measured} to estimate a call from")

    def flops(res: dict) -> int:
        return train_flops_per_token(ModelConfig.from_dict(res["model"]))

    per_run, total = {}, 0.0
    for spec in specs:
        run = run_config(spec, scale, None)
        cfg = run.model()
        budget = Budget.of(run.train, cfg, run.train.seq_len or cfg.context)
        f = train_flops_per_token(cfg)
        total += budget.tokens * f
        arch = [r for r in ref if r["config"]["train"]["arch"] == spec.arch]
        same = [r for r in arch if (r["config"].get("model_overrides") or {}) == dict(spec.model)]
        like = same or arch or ref
        per_run[spec.slug] = max(budget.steps * r["wall_time_s"] / r["steps"] * f / flops(r) for r in like)
    rate = len(specs) * statistics.median(_run_flops(r, gpu=True) for r in ref)
    slowest = max(per_run, key=per_run.get)
    return {"runs": len(per_run), "steps_bound": per_run[slowest], "slowest": slowest, "per_run": per_run,
            "throughput_bound": total / rate, "flops": total, "flop_rate": rate, "measured": len(ref),
            "seconds": max(per_run[slowest], total / rate)}
