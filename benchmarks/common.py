"""Helpers shared by the benchmark scripts: device choice, interleaved (round-robin) timing with medians,
peak memory, ratios, and the Markdown report with its header (device, torch version, date).

Timing: on CUDA each call is bracketed by CUDA events after a synchronize; on the CPU by the process's
CPU time (`time.process_time`) with one torch thread by default, so that other processes on a shared
machine do not count (`--timer wall` and `--threads N` for a dedicated one). Candidates are timed
round-robin (one call of each per round, the order rotated every round) so that a noisy machine slows all
of them alike; the report gives medians and, per candidate, the paired ratios to a reference within each
round (median, min and max: `paired`). A candidate that raises (out of memory, an unsupported shape, ...)
is dropped with its error noted; the others go on.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from cem.device import cpu_model, device_name, pick_device  # noqa: F401 (cpu_model: re-exported)

REPO = Path(__file__).resolve().parent.parent
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


# ----------------------------------------------------------------------------------------------- device


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    """"auto": bf16 on CUDA, fp32 on the CPU."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    return {v: k for k, v in DTYPES.items()}.get(dtype, str(dtype).removeprefix("torch."))


def git_commit() -> str | None:
    """Short commit of the repository (with "+dirty" for local changes), None outside a git checkout."""
    try:
        run = lambda *a: subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True, timeout=10)  # noqa: E731
        head = run("rev-parse", "--short", "HEAD")
        if head.returncode:
            return None
        dirty = run("status", "--porcelain", "--untracked-files=no").stdout.strip()
        return head.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------------------------- timing


@dataclass
class Candidate:
    """One thing to time: `run` (timed) and an optional untimed `reset` before each run (e.g. drop grads)."""

    run: Callable[[], object]
    reset: Callable[[], None] | None = None


@dataclass
class Timing:
    """The per-call times (ms) of one candidate, one per round, or the error that stopped it."""

    times: list[float] = field(default_factory=list)
    error: str | None = None

    @property
    def median(self) -> float | None:
        return None if self.error or not self.times else statistics.median(self.times)


def paired(t: Timing | None, ref: Timing | None, invert: bool = False) -> tuple[float, float, float] | None:
    """Median, min and max over rounds of t's time / ref's time in the same round (ref / t with `invert`,
    a throughput ratio); None when either failed."""
    if t is None or ref is None or t.median is None or ref.median is None:
        return None
    ratios = [(b / a if invert else a / b) for a, b in zip(t.times, ref.times)]
    return statistics.median(ratios), min(ratios), max(ratios)


def fmt_paired(r: tuple[float, float, float] | None) -> str:
    """"1.02 [0.97-1.08]": the median paired ratio and its range."""
    return "-" if r is None else f"{r[0]:.2f} [{r[1]:.2f}-{r[2]:.2f}]"


def describe_error(exc: BaseException) -> str:
    """A short, table-friendly description of why a candidate failed."""
    if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower():
        return "out of memory"
    first = (str(exc).strip().splitlines() or [""])[0]
    text = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    text = text.replace("|", "/")
    return text if len(text) <= 120 else text[:117] + "..."


CPU_TIMER = {"cpu": time.process_time, "wall": time.perf_counter}
_cpu_clock: Callable[[], float] = time.process_time


def set_cpu_timer(name: str) -> None:
    """"cpu" (default: process CPU time, for shared machines) or "wall" (perf_counter) for CPU runs."""
    global _cpu_clock
    _cpu_clock = CPU_TIMER[name]


def elapsed_ms(fn: Callable[[], object], device: torch.device) -> float:
    """Milliseconds one call of `fn` takes (CUDA events on a GPU, the CPU timer of `set_cpu_timer` on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn()
        end.record()
        end.synchronize()
        del out
        return start.elapsed_time(end)
    start_s = _cpu_clock()
    out = fn()
    elapsed = _cpu_clock() - start_s
    del out
    return elapsed * 1e3


def interleaved(
    candidates: dict[str, Candidate | Callable[[], object]],
    device: torch.device,
    *,
    repeats: int,
    warmup: int,
    progress: bool = True,
) -> dict[str, Timing]:
    """Time every candidate `warmup` + `repeats` times, round-robin: each repeat runs each live candidate
    once, starting one further along every repeat. Failures are recorded and the candidate dropped."""
    cands = {k: c if isinstance(c, Candidate) else Candidate(c) for k, c in candidates.items()}
    results = {name: Timing() for name in cands}
    alive = list(cands)

    def one(name: str, record: bool) -> None:
        cand = cands[name]
        try:
            if cand.reset is not None:
                cand.reset()
            ms = elapsed_ms(cand.run, device)
        except Exception as exc:  # noqa: BLE001 - any failure (OOM, unsupported shape) skips this candidate
            results[name].error = describe_error(exc)
            results[name].times.clear()
            alive.remove(name)
            if progress:
                print(f"  [skip] {name}: {results[name].error}", file=sys.stderr)
            free_memory(device)
            return
        if record:
            results[name].times.append(ms)

    for _ in range(warmup):
        for name in list(alive):
            one(name, record=False)
    for r in range(repeats):
        order = alive[r % len(alive):] + alive[: r % len(alive)] if alive else []
        for name in order:
            if name in alive:
                one(name, record=True)
    return results


def peak_memory_mib(cand: Candidate, device: torch.device) -> float | None:
    """Peak CUDA memory one call allocates above what was allocated before it (MiB); None on the CPU.

    Measured with `torch.cuda.max_memory_allocated` after `reset_peak_memory_stats`, minus the memory
    already allocated when the call starts (weights, inputs and the other candidates' state), so that
    candidates held side by side do not count each other's tensors."""
    if device.type != "cuda":
        return None
    if cand.reset is not None:
        cand.reset()
    gc.collect()
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    out = cand.run()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    del out
    if cand.reset is not None:
        cand.reset()
    return peak / 2**20


# ----------------------------------------------------------------------------------------------- tables


def fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def ratio(x: float | None, base: float | None) -> str:
    """x / base to two decimals ("-" when either is missing)."""
    if x is None or base is None or base == 0:
        return "-"
    return f"{x / base:.2f}"


@dataclass
class Table:
    """Columns and rows of strings, written as a Markdown table."""

    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)

    def add(self, *cells: object) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"row has {len(cells)} cells for {len(self.columns)} columns")
        self.rows.append([str(c) for c in cells])

    def column(self, name: str) -> list[str]:
        i = self.columns.index(name)
        return [row[i] for row in self.rows]

    def records(self) -> list[dict[str, str]]:
        return [dict(zip(self.columns, row)) for row in self.rows]

    def markdown(self) -> str:
        right = [any(c[:1].isdigit() for c in self.column(name)) for name in self.columns]
        lines = ["| " + " | ".join(self.columns) + " |"]
        lines.append("|" + "|".join("---:" if r else "---" for r in right) + "|")
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        return "\n".join(lines)


@dataclass
class Report:
    """A titled benchmark result: header (device, torch, date, commit), settings, tables and notes."""

    title: str
    device: torch.device
    settings: dict[str, object] = field(default_factory=dict)
    tables: list[tuple[str, Table]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    date: str = field(default_factory=lambda: datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"))

    @property
    def table(self) -> Table:
        """The first (usually the only) table."""
        return self.tables[0][1]

    def header(self) -> str:
        commit = git_commit()
        parts = [f"device: {device_name(self.device)}", f"torch {torch.__version__}", self.date]
        if commit:
            parts.append(f"commit {commit}")
        return " · ".join(parts)

    def markdown(self) -> str:
        out = [f"# {self.title}", "", self.header(), ""]
        if self.settings:
            out += ["Settings: " + ", ".join(f"{k} {v}" for k, v in self.settings.items()) + ".", ""]
        for subtitle, table in self.tables:
            if subtitle:
                out += [f"## {subtitle}", ""]
            out += [table.markdown(), ""]
        if self.notes:
            out += [f"- {n}" for n in self.notes] + [""]
        return "\n".join(out)

    def emit(self, out: str | Path | None) -> str:
        """Print the report, and write it to `out` (Markdown) when given; returns the text."""
        text = self.markdown()
        print(text)
        if out:
            path = Path(out)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}", file=sys.stderr)
        return text


# ----------------------------------------------------------------------------------------------- CLI


def parser(
    description: str,
    repeats_flags: tuple[str, ...] = ("--repeats",),
    repeats_help: str = "timed repeats per candidate (median reported)",
) -> argparse.ArgumentParser:
    """An argument parser with the flags every benchmark has: --device, --out, --repeats (or the script's
    name for it), --warmup, --threads, --seed (repeats and warm-up default per device in each script)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--device", default="auto", help="auto (default: CUDA when available) | cpu | cuda")
    p.add_argument("--out", default=None, help="also write the report to this Markdown file")
    p.add_argument(*repeats_flags, dest="repeats", type=int, default=None, help=repeats_help)
    p.add_argument("--warmup", type=int, default=None, help="untimed warm-up calls per candidate")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default on the CPU: 1, for shared machines)")
    p.add_argument("--timer", default="cpu", choices=sorted(CPU_TIMER), help="CPU timing: process CPU time (default) or wall clock")
    p.add_argument("--seed", type=int, default=0, help="seed of weights and inputs (default 0)")
    return p


def setup(args: argparse.Namespace, repeats: tuple[int, int], warmup: tuple[int, int]) -> torch.device:
    """Device, threads and seed from the common flags; fills repeats / warmup with the (GPU, CPU) defaults."""
    try:
        device = pick_device(args.device)
    except ValueError as e:
        raise SystemExit(f"--device: {e}") from None
    if args.threads or device.type == "cpu":
        torch.set_num_threads(args.threads or 1)
    set_cpu_timer(getattr(args, "timer", "cpu"))
    torch.manual_seed(args.seed)
    on_gpu = device.type == "cuda"
    if args.repeats is None:
        args.repeats = repeats[0] if on_gpu else repeats[1]
    if args.warmup is None:
        args.warmup = warmup[0] if on_gpu else warmup[1]
    if args.repeats < 1 or args.warmup < 0:
        raise SystemExit("--repeats must be >= 1 and --warmup >= 0")
    return device
