"""Does this machine compute what the machines of the committed runs computed? Trains the first 50 steps of each
named committed run again, with this checkout's code (whose bits parity.sh ties to the lanes'), and compares the
logged losses and gradient norms to the bit. A VM names several CPUs "AMD EPYC" (docs/LOG.md, 2026-11-28): run it
when a session starts on a new machine, and say in the stop note which runs' arithmetic it shares.

    python study/results/cpu128/samebits.py RUN [RUN ...]     # runs of study/results/cpu (runs.jsonl), e.g. cpu128-llama-fd4535-s0
    python study/results/cpu128/samebits.py --infer           # write what the checks so far infer into the runs' results

Prints one line per run (same to the bit, or the first step that differs); exit status 1 if any differs. About a
minute per run on one thread; a run whose first session predates the record of compilation (666f30a) and differs is
tried eagerly too (until then a lane past dynamo's recompile limit trained its later runs eagerly). Each outcome is kept in samebits.json beside this script, under this machine's
processor (`cem.provenance.processor`). `--infer` gives each run whose sessions predate the CPU's family record
(2026-11-28) the processor of its sessions' code commits, where runs first trained at each of those commits were found
the same to the bit on one processor and none different (a lane trains from a fixed commit, made and used in one
session on one machine): `processor_inferred` in its results (its row in runs.jsonl, and its folder's results.json where one holds it), which `cem.provenance.recorded_processors` reads.
"""

import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

from cem.device import cpu_id
from cem_study import get_scale
from cem_study.records import Run, RunTable, runs_in
from cem_study.sweep import RunSpec, run_config
from cem.io import atomic_write_text
from cem.provenance import processor
from cem.training import train

RUNS = Path(__file__).resolve().parents[1] / "cpu" / "runs"  # its runs: live folders there, finished ones in ../cpu/runs.jsonl
CHECKS = Path(__file__).resolve().with_name("samebits.json")  # {processor: {"same": [run, ...], "differs": [run, ...]}}
STEPS = 50


def main(slugs: list[str], data_dir: str = "/work/shared/data") -> int:
    torch.set_num_threads(1)  # as the lanes train
    scale, differs = get_scale("cpu128"), 0
    print(f"this machine: {cpu_id()}, torch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()})")
    for slug in slugs:
        run = Run(RUNS / slug)
        res = run.results()
        if res is None:
            raise SystemExit(f"{slug}: no finished run of that name in {RUNS} or {run.table.path}")
        t = res["config"]["train"]
        spec = RunSpec.make(t["preset"], t["arch"], seed=t["seed"], train={"lr": t["lr"]}, **(res["config"].get("model_overrides") or {}))
        if spec.slug != slug:
            raise SystemExit(f"{slug}: not a cpu128 campaign run (its settings make {spec.slug})")
        theirs = {r["step"]: r for r in run.metrics()}
        first, how = _first_difference(run_config(spec, scale, data_dir), theirs), ""
        if first is not None and "compiled" not in ((res.get("sessions") or [{}])[0]):
            # its first session predates the record of compilation: before 666f30a a lane past dynamo's recompile limit
            # trained its later runs eagerly, without a word (docs/LOG.md), and eager sums in another order
            cfg = run_config(spec, scale, data_dir)
            if _first_difference(replace(cfg, train=replace(cfg.train, compile=False)), theirs) is None:
                first, how = None, ", trained eagerly"
        where = ", ".join(dict.fromkeys(f"{s.get('commit', '?')[:7]} on {s.get('cpu_id') or s.get('processor')}" for s in res.get("sessions") or [{}]))
        print(f"{slug} ({where}): " + (f"the same to the bit{how}" if first is None else f"differs from step {first}"))
        differs += first is not None
        _keep(slug, first is None)
    return 1 if differs else 0


def _first_difference(cfg, theirs: dict) -> int | None:
    """The first of `STEPS` steps whose loss or gradient norm, trained here from `cfg`, differs from `theirs` (None: none)."""
    with tempfile.TemporaryDirectory() as out:
        train(cfg, out, progress=False, stop_at=STEPS)
        mine = [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    return next((r["step"] for r in mine if "loss" in r and (r["loss"], r["grad_norm"]) != (theirs[r["step"]]["loss"], theirs[r["step"]]["grad_norm"])), None)


def _keep(slug: str, same: bool) -> None:
    """Adds one outcome to samebits.json under this machine's processor."""
    checks = json.loads(CHECKS.read_text()) if CHECKS.exists() else {}
    mine = checks.setdefault(processor(), {"same": [], "differs": []})
    for key in ("same", "differs"):
        mine[key] = sorted(set(mine[key]) - {slug} | ({slug} if same == (key == "same") else set()))
    atomic_write_text(CHECKS, json.dumps(checks, indent=1, sort_keys=True) + "\n")


def _commits(res: dict) -> list[str]:
    """The code commits of a run's sessions ("" for a run that predates provenance records)."""
    return [s.get("commit") or "" for s in res.get("sessions") or [{}]]


def infer() -> int:
    """Writes `processor_inferred` into each run whose sessions predate `cpu_id` and whose every session's commit is
    vouched for by the checks: runs first trained at that commit were the same to the bit on one processor only."""
    checks = json.loads(CHECKS.read_text())
    runs = {r.slug: res for r in runs_in(RUNS) if r.slug.startswith("cpu128-") and (res := r.results()) is not None}
    vouch: dict[str, set] = {}  # commit -> the processors on which a run first trained at it was the same to the bit
    refuted: dict[str, set] = {}
    for proc, outcome in checks.items():
        for key, into in (("same", vouch), ("differs", refuted)):
            for slug in outcome[key]:
                into.setdefault(_commits(runs[slug])[0], set()).add(proc)
    written = {}
    for slug, res in runs.items():
        if any(s.get("cpu_id") for s in res.get("sessions") or []) or "processor_inferred" in res:
            continue
        mine = [proc for proc, outcome in checks.items() if slug in outcome["same"]]
        if len(mine) == 1 and len(set(_commits(res))) == 1:  # this run itself, trained in one session
            proc, how = mine[0], "this run's first 50 steps were reproduced to the bit"
        else:
            procs = {frozenset(vouch.get(c, ())) for c in _commits(res)}
            if len(procs) != 1 or len(one := next(iter(procs))) != 1:
                continue  # a commit no check vouches for, or commits vouched for on different processors
            proc = next(iter(one))
            if any(proc in refuted.get(c, ()) for c in _commits(res)):
                continue  # a run first trained at one of its commits was not reproduced there: the commit does not vouch
            how = (f"runs first trained at its sessions' commits ({', '.join(c[:7] or 'none recorded' for c in dict.fromkeys(_commits(res)))}) "
                   "had their first 50 steps reproduced to the bit")
        res["processor_inferred"] = {"processor": proc, "by": f"{how} on it (study/results/cpu128/samebits.py)"}
        written[slug] = res
    RunTable(RUNS).set_results(written)
    print(f"{len(written)} runs given the processor their checks infer")
    return 0


if __name__ == "__main__":
    sys.exit(infer() if sys.argv[1:] == ["--infer"] else main(sys.argv[1:]))
