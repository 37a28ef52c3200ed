"""bf16 autocast against float32 in training: the same runs (architecture, seed, data order, initial weights)
trained once in each precision; the final test loss per run and, per architecture, the paired difference
bf16 − fp32 with its 95% t interval over the seeds.

    python benchmarks/bf16_training.py [--out FILE.md] [--runs DIR] [--preset tiny] [--archs llama cem cem-t2]
        [--seeds 0 1 2] [--steps 400] [--data wikitext-2] [--data-dir DIR] [--device cpu]

Each run is `cem train` with precision=fp32 or precision=bf16 (autocast; on the CPU, the CPU's autocast) and
compile off, written under `--runs` (default runs/bf16); finished runs are reused, so the script resumes.
Each run's test loss is evaluated in its own precision, as a user of that precision would see it. A
difference is "within noise" when its interval holds 0; the interval's width is what 3 seeds can resolve.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make `benchmarks.common` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import statistics

import torch

from benchmarks.common import Report, Table, fmt

PRECISIONS = ("fp32", "bf16")
COLUMNS = ["arch", "seeds", "fp32 test loss", "bf16 test loss", "bf16 − fp32 (nats)", "95% CI", "per seed", "verdict"]


def run_one(args, arch: str, seed: int, precision: str) -> dict:
    """Train (or reuse) one run; its results.json."""
    from cem.cli import main as cem

    out = Path(args.runs) / f"{args.preset}-{arch}-{precision}-s{seed}"
    results = out / "results.json"
    if not results.is_file():
        argv = ["train", "--preset", args.preset, "--arch", arch, "--data", args.data, "--seed", str(seed), "--max-steps", str(args.steps),
                "--out", str(out), "--quiet", f"precision={precision}", "compile=false", "tensorboard=false"]  # fmt: skip
        if args.data_dir:
            argv += ["--data-dir", args.data_dir]
        if args.device:
            argv += ["--device", args.device]
        if out.exists():
            argv.append("--resume")
        code = cem(argv)
        if code != 0:
            raise SystemExit(f"run {out} failed (exit {code})")
    return json.loads(results.read_text())


def interval(diffs: list[float]) -> tuple[float, float, float]:
    """Mean and 95% t interval of paired differences."""
    from scipy import stats

    m = statistics.fmean(diffs)
    if len(diffs) < 2:
        return m, float("nan"), float("nan")
    half = stats.t.ppf(0.975, len(diffs) - 1) * statistics.stdev(diffs) / len(diffs) ** 0.5
    return m, m - half, m + half


def main(argv: list[str] | None = None) -> Report:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None, help="also write the report to this Markdown file")
    p.add_argument("--runs", default="runs/bf16", help="where the runs are written (default runs/bf16)")
    p.add_argument("--preset", default="tiny")
    p.add_argument("--archs", nargs="+", default=["llama", "cem", "cem-t2"])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--data", default="wikitext-2")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--device", default=None, help="cpu, cuda, ... (default: cem train's auto)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)

    table = Table(COLUMNS)
    for arch in args.archs:
        loss = {(s, prec): run_one(args, arch, s, prec) for s in args.seeds for prec in PRECISIONS}
        diffs = [loss[(s, "bf16")]["test_loss"] - loss[(s, "fp32")]["test_loss"] for s in args.seeds]
        m, lo, hi = interval(diffs)
        verdict = "within noise" if lo <= 0 <= hi else ("bf16 worse" if lo > 0 else "bf16 better")
        table.add(
            arch, len(args.seeds), fmt(statistics.fmean(loss[(s, "fp32")]["test_loss"] for s in args.seeds), ".4f"),
            fmt(statistics.fmean(loss[(s, "bf16")]["test_loss"] for s in args.seeds), ".4f"), f"{m:+.4f}", f"[{lo:+.4f}, {hi:+.4f}]",
            " / ".join(f"{d:+.4f}" for d in diffs), verdict,
        )  # fmt: skip
    report = Report(
        "bf16 autocast against float32 in training",
        torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu")),
        settings={"preset": args.preset, "data": args.data, "steps": args.steps, "seeds": " ".join(map(str, args.seeds)), "compile": "off"},
        tables=[("", table)],
        notes=[
            "Each pair of runs shares the architecture, seed, initial weights and data order; only `precision` differs "
            "(bf16: autocast, weights and optimizer in float32). Test loss in nats per token, each run evaluated in its own precision.",
            "95% CI: Student t interval of the mean paired difference over the seeds; 'within noise' when it holds 0.",
        ],
    )
    report.emit(args.out)
    return report


if __name__ == "__main__":
    main()
