"""Training memory: peak memory of one training step against the recursion depth T and the activation
checkpointing mode (none | layer | step), with the step-time cost of each mode.

    python benchmarks/train_memory.py [--device auto|cpu|cuda] [--out FILE.md] [--preset 134M] [--seq 2048]
        [--batch 1] [--depths 1 2 3 4] [--modes none layer step] [--arch cem-t2] [--precision auto|bf16|fp32]

Each cell is a model of `--arch` at `--preset` with attn_steps = mlp_steps = T, trained one AdamW step on a
random batch of `--batch` × `--seq` tokens after one untimed step (which creates the optimizer state).

- On CUDA the memory is the caching allocator's count (`torch.cuda.memory_allocated`): **static** =
  allocated before the forward pass (parameters and AdamW state; gradients are set to None between steps),
  **activations** = allocated after the forward pass (the loss computed, nothing freed yet) minus static:
  what autograd keeps for the backward pass; **peak** = `max_memory_allocated` over the whole step
  (forward, backward, optimizer step) after `reset_peak_memory_stats`.
- On the CPU each cell runs in a fresh process with glibc's mmap threshold fixed at 64 KiB
  (`MALLOC_MMAP_THRESHOLD_`), so every tensor of note is its own mapping and is returned to the system when
  freed: the resident set (VmRSS) then follows live tensor memory. static = VmRSS before the forward pass,
  activations = VmRSS after it minus static, peak = the high-water mark VmHWM over the step (reset by
  writing 5 to /proc/self/clear_refs before it). CPU figures include the interpreter and libraries (a few
  hundred MiB, in static).

Step ms is the median of `--repeats` timed steps (CUDA events on a GPU; wall clock on the CPU), ×none the
ratio to the same T without checkpointing. Memory is deterministic; the time is not (report the machine).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make `benchmarks.common` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from benchmarks.common import Report, Table, fmt, free_memory, parser, setup
from cem.device import PRECISIONS, autocast_for, uses_bf16
from cem.model import LanguageModel, model_config
from cem.model.lm import CHECKPOINTING

MiB = 2**20
COLUMNS = ["T", "checkpointing", "params M", "static MiB", "activations MiB", "act. ×(T=1, none)", "peak MiB", "step ms", "time ×none", "note"]


def _status_kib(field: str) -> int:
    """A VmRSS / VmHWM line of /proc/self/status, in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


class Meter:
    """Current and peak memory of this process on `device` in bytes (see the module docstring)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def now(self) -> int:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return torch.cuda.memory_allocated(self.device)
        return _status_kib("VmRSS") * 1024

    def reset_peak(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            Path("/proc/self/clear_refs").write_text("5")

    def peak(self) -> int:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return torch.cuda.max_memory_allocated(self.device)
        return _status_kib("VmHWM") * 1024


def measure(cell: dict, device: torch.device) -> dict:
    """One cell: build the model, one untimed step, then one measured step and `repeats` timed ones."""
    cfg = model_config(cell["preset"], cell["arch"], attn_steps=cell["T"], mlp_steps=cell["T"], context=max(cell["seq"], 1))
    torch.manual_seed(cell["seed"])
    model = LanguageModel(cfg).to(device).train()
    model.set_activation_checkpointing(cell["mode"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    autocast = autocast_for(cell["precision"], device)
    g = torch.Generator().manual_seed(cell["seed"])
    ids = torch.randint(0, cfg.vocab_size, (cell["batch"], cell["seq"] + 1), generator=g).to(device)
    x, y = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    meter = Meter(device)

    def step(record: dict | None = None) -> None:
        if record is not None:
            record["static"] = meter.now()
            meter.reset_peak()
        with autocast:
            loss = model(x, y)
        if record is not None:
            record["activations"] = meter.now() - record["static"]
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if record is not None:
            record["peak"] = meter.peak()

    step()  # creates the AdamW state
    record: dict = {"params": sum(p.numel() for p in model.parameters())}
    step(record)
    times = []
    for _ in range(cell["repeats"]):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(device)
            start.record()
            step()
            end.record()
            torch.cuda.synchronize(device)
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            step()
            times.append(1e3 * (time.perf_counter() - t0))
    record["step_ms"] = statistics.median(times)
    return record


def run_cell(cell: dict, device: torch.device) -> dict:
    """`measure` in this process on CUDA; on the CPU in a fresh process (see the module docstring)."""
    if device.type == "cuda":
        try:
            return measure(cell, device)
        finally:
            free_memory(device)
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", PYTHONPATH=os.pathsep.join(filter(None, [str(Path(__file__).resolve().parent.parent), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.train_memory", "--cell", json.dumps(cell)],
        env=env, capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent,
    )  # fmt: skip
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"cell process failed ({proc.returncode}): {tail}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> Report | None:
    p = parser(__doc__.split("\n\n")[0], ("--repeats",), "timed training steps per cell (median reported)")
    p.add_argument("--preset", default="134M", help="model size preset (default 134M)")
    p.add_argument("--arch", default="cem-t2", help="architecture; T sets attn_steps = mlp_steps (default cem-t2)")
    p.add_argument("--seq", type=int, default=2048, help="sequence length (default 2048)")
    p.add_argument("--batch", type=int, default=1, help="sequences per step (default 1)")
    p.add_argument("--depths", type=int, nargs="+", default=[1, 2, 3, 4], help="recursion depths T (default 1 2 3 4)")
    p.add_argument("--modes", nargs="+", default=list(CHECKPOINTING), choices=list(CHECKPOINTING), help="checkpointing modes")
    p.add_argument("--precision", default="auto", choices=PRECISIONS, help="auto: bf16 autocast on a GPU that supports it")
    p.add_argument("--cell", default=None, help=argparse_hidden())
    args = p.parse_args(argv)
    if args.cell:  # a CPU cell in its own process: print the record as JSON
        torch.set_num_threads(int(os.environ.get("CEM_BENCH_THREADS", "1")))
        cell = json.loads(args.cell)
        print(json.dumps(measure(cell, torch.device("cpu"))))
        return None
    device = setup(args, repeats=(10, 2), warmup=(1, 1))
    if device.type == "cpu":
        os.environ["CEM_BENCH_THREADS"] = str(torch.get_num_threads())
    bf16 = uses_bf16(args.precision, device)
    table = Table(COLUMNS)
    base_act = None
    for T in args.depths:
        none_ms = None
        for mode in args.modes:
            cell = dict(preset=args.preset, arch=args.arch, T=T, mode=mode, seq=args.seq, batch=args.batch,
                        precision=args.precision, seed=args.seed, repeats=args.repeats)  # fmt: skip
            print(f"T={T} {mode}", file=sys.stderr, flush=True)
            try:
                r = run_cell(cell, device)
            except Exception as exc:  # noqa: BLE001 - out of memory or a failed cell: noted, the rest goes on
                table.add(T, mode, "-", "-", "-", "-", "-", "-", "-", str(exc).splitlines()[0][:120])
                free_memory(device)
                continue
            if base_act is None and T == min(args.depths) and mode == "none":
                base_act = r["activations"]
            if mode == "none":
                none_ms = r["step_ms"]
            table.add(
                T, mode, fmt(r["params"] / 1e6, ".4g"), fmt(r["static"] / MiB, ",.0f"), fmt(r["activations"] / MiB, ",.0f"),
                fmt(r["activations"] / base_act if base_act else None), fmt(r["peak"] / MiB, ",.0f"), fmt(r["step_ms"], ",.1f"),
                fmt(r["step_ms"] / none_ms if none_ms else None), "",
            )  # fmt: skip
    report = Report(
        "Training memory against T and activation checkpointing",
        device,
        settings={
            "preset": args.preset, "arch": args.arch, "seq": args.seq, "batch": args.batch,
            "precision": "bf16 autocast" if bf16 else "fp32", "optimizer": "AdamW" + (" (fused)" if device.type == "cuda" else ""),
            "timed steps": args.repeats, "threads": torch.get_num_threads() if device.type == "cpu" else "-",
        },  # fmt: skip
        tables=[("", table)],
        notes=[
            "static: memory before the forward pass (parameters and AdamW state; "
            + ("the CUDA allocator's count)" if device.type == "cuda" else "the process's resident set, interpreter and libraries included)"),
            "activations: memory after the forward pass minus static (what autograd keeps for the backward pass); "
            "act. ×(T=1, none): against the first depth without checkpointing.",
            "peak: the high-water mark over the whole step (forward, backward, AdamW step), "
            + ("torch.cuda.max_memory_allocated." if device.type == "cuda" else "VmHWM of the cell's own process."),
            "step ms: median of the timed steps" + (" (CUDA events)" if device.type == "cuda" else " (wall clock)")
            + "; time ×none: against the same T without checkpointing.",
        ],
    )
    report.emit(args.out)
    return report


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
