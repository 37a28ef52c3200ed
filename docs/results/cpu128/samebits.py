"""Does this machine compute what the machines of the committed runs computed? Trains the first 50 steps of each
named committed run again, with this checkout's code (whose bits parity.sh ties to the lanes'), and compares the
logged losses and gradient norms to the bit. A VM names several CPUs "AMD EPYC" (docs/LOG.md, 2026-11-28): run it
when a session starts on a new machine, and say in the stop note which runs' arithmetic it shares.

    python docs/results/cpu128/samebits.py RUN [RUN ...]     # run folders in docs/results/cpu/runs, e.g. cpu128-llama-fd4535-s0

Prints one line per run (same to the bit, or the first step that differs); exit status 1 if any differs. About a
minute per run on one thread.
"""

import json
import sys
import tempfile
from pathlib import Path

import torch

from cem.device import cpu_id
from cem.experiments import get_scale
from cem.experiments.sweep import RunSpec, run_config
from cem.training import train

RUNS = Path(__file__).resolve().parents[1] / "cpu" / "runs"
STEPS = 50


def main(slugs: list[str], data_dir: str = "/work/shared/data") -> int:
    torch.set_num_threads(1)  # as the lanes train
    scale, differs = get_scale("cpu128"), 0
    print(f"this machine: {cpu_id()}, torch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()})")
    for slug in slugs:
        res = json.loads((RUNS / slug / "results.json").read_text())
        t = res["config"]["train"]
        spec = RunSpec.make(t["preset"], t["arch"], seed=t["seed"], train={"lr": t["lr"]}, **(res["config"].get("model_overrides") or {}))
        if spec.slug != slug:
            raise SystemExit(f"{slug}: not a cpu128 campaign run (its settings make {spec.slug})")
        with tempfile.TemporaryDirectory() as out:
            train(run_config(spec, scale, data_dir), out, progress=False, stop_at=STEPS)
            mine = [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines()]
        theirs = {r["step"]: r for r in map(json.loads, (RUNS / slug / "metrics.jsonl").read_text().splitlines())}
        first = next((r["step"] for r in mine if "loss" in r and (r["loss"], r["grad_norm"]) != (theirs[r["step"]]["loss"], theirs[r["step"]]["grad_norm"])), None)
        where = ", ".join(dict.fromkeys(f"{s.get('commit', '?')[:7]} on {s.get('cpu_id') or s.get('processor')}" for s in res.get("sessions") or [{}]))
        print(f"{slug} ({where}): " + ("the same to the bit" if first is None else f"differs from step {first}"))
        differs += first is not None
    return 1 if differs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
