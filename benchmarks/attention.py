"""Attention layer benchmark: CEM attention (T = 1, 2; kq_diag none / shared; every available backend)
against Llama attention through SDPA (FlashAttention on a GPU), forward and forward+backward time and
peak memory, with ratios to Llama at the same sequence length.

    python benchmarks/attention.py [--device auto|cpu|cuda] [--out FILE.md] [--seqs 512 1024 ...]
        [--dim 768] [--heads 12] [--batch B] [--dtype auto|fp32|bf16|fp16] [--backends eager sdpa flex triton cpu]
        [--cem-steps 1 2] [--kq-diag none shared] [--repeats N] [--warmup N] [--threads N]

Each layer is the whole sublayer (norm, projections, attention core, residual) on a (batch, seq, dim)
input. "fwd" is an inference forward (no_grad); "fwd+bwd" a forward with autograd plus the backward of a
fixed output gradient (weights and input gradients). Peak memory is CUDA memory the fwd+bwd call allocates
above what was allocated before it.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

if __package__ in (None, ""):  # run as a file: make `benchmarks.common` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
from torch import nn

from benchmarks.common import (
    Candidate,
    Report,
    Table,
    dtype_name,
    fmt,
    free_memory,
    interleaved,
    parser,
    peak_memory_mib,
    pick_dtype,
    ratio,
    setup,
)
from cem.layers import CEMAttention, LlamaAttention, Recursion
from cem.layers.attention_core import BACKENDS, IMPLEMENTATIONS

ALL_BACKENDS = tuple(name for name in BACKENDS if name != "auto")  # what a layer may ask for by name
GPU_SEQS = (512, 1024, 2048, 4096, 8192)
CPU_SEQS = (256, 512, 1024)
GPU_TOKENS = 16384  # default GPU batch: batch × seq = 16k tokens
CPU_BATCH = 2
COLUMNS = [
    "variant", "backend", "seq", "batch", "fwd ms", "fwd+bwd ms", "peak MiB",
    "fwd ×Llama", "fwd+bwd ×Llama", "mem ×Llama", "note",
]  # fmt: skip


@dataclass
class Spec:
    """One row: a layer to build and how to call it."""

    variant: str
    backend: str
    build: Callable[[], nn.Module]
    context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    no_backward: str | None = None  # why fwd+bwd is not run
    skip: str | None = None  # why nothing is run


def available_backends(device: torch.device) -> list[str]:
    """The backends meant for `device` (the registry's `Backend.why_not`)."""
    return [name for name in ALL_BACKENDS if IMPLEMENTATIONS[name].why_not(device) is None]


def flash_context():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(SDPBackend.FLASH_ATTENTION)


def llama_spec(args, device: torch.device, dtype: torch.dtype) -> Spec:
    """Llama attention (RoPE) through SDPA; on a GPU in half precision FlashAttention is forced, falling
    back to SDPA's own choice when flash refuses the shape (the backend column says which ran)."""
    build = lambda: LlamaAttention(args.dim, args.heads, position="rope")  # noqa: E731
    if device.type == "cuda" and dtype in (torch.bfloat16, torch.float16):
        try:  # probe once on a small input
            layer = build().to(device, dtype)
            x = torch.randn(1, 128, args.dim, device=device, dtype=dtype, requires_grad=True)
            with flash_context():
                layer(x).sum().backward()
            return Spec("Llama", "sdpa-flash", build, flash_context)
        except Exception:  # noqa: BLE001
            pass
    return Spec("Llama", "sdpa", build)


def specs(args, device: torch.device, dtype: torch.dtype) -> list[Spec]:
    """Llama first, then CEM for every (steps, kq_diag, backend) asked."""
    out = [llama_spec(args, device, dtype)]
    for steps in args.cem_steps:
        for diag in args.kq_diag:
            for backend in args.backends:
                build = lambda s=steps, d=diag, b=backend: CEMAttention(args.dim, args.heads, recursion=Recursion(steps=s), kq_diag=d, backend=b)  # noqa: E731
                spec = Spec(f"CEM T={steps} kq={diag}", backend, build)
                impl = IMPLEMENTATIONS[backend]
                spec.skip = impl.why_not(device)
                if spec.skip is None and not impl.has_backward(device):
                    spec.no_backward = f"{device.type.upper()} {backend} is forward-only"
                out.append(spec)
    return out


def bench_seq(args, device, dtype, seq: int, batch: int, all_specs: list[Spec]) -> list[dict]:
    """Time every spec at one sequence length (fwd and fwd+bwd candidates interleaved together)."""
    x = torch.randn(batch, seq, args.dim, device=device, dtype=dtype)
    xg = x.clone().requires_grad_(True)
    gy = torch.randn_like(x)
    cands: dict[str, Candidate] = {}
    rows = []
    for i, spec in enumerate(all_specs):
        row = {"spec": spec, "fwd": None, "bwd": None, "mem": None, "note": spec.skip or ""}
        rows.append(row)
        if spec.skip:
            continue
        try:
            torch.manual_seed(args.seed)
            layer = spec.build().to(device, dtype)
        except Exception as exc:  # noqa: BLE001
            row["note"] = f"build failed: {exc}"
            continue

        def fwd(layer=layer, spec=spec):
            with torch.no_grad(), spec.context():
                return layer(x)

        def fwd_bwd(layer=layer, spec=spec):
            with spec.context():
                layer(xg).backward(gy)

        def reset(layer=layer):
            layer.zero_grad(set_to_none=True)
            xg.grad = None

        cands[f"{i}/fwd"] = Candidate(fwd)
        if spec.no_backward:
            row["note"] = spec.no_backward
        else:
            cands[f"{i}/bwd"] = Candidate(fwd_bwd, reset)
    timings = interleaved(cands, device, repeats=args.repeats, warmup=args.warmup)
    for i, row in enumerate(rows):
        errors = []
        for kind in ("fwd", "bwd"):
            t = timings.get(f"{i}/{kind}")
            if t is None:
                continue
            row[kind] = t.median
            if t.error:
                errors.append(f"{'fwd+bwd' if kind == 'bwd' else 'fwd'}: {t.error}")
        # peak memory of fwd+bwd (the training step's), or of the forward where there is no backward
        kind = "bwd" if row["bwd"] is not None else "fwd"
        if row[kind] is not None:
            try:
                row["mem"] = peak_memory_mib(cands[f"{i}/{kind}"], device)
                if kind == "fwd" and row["mem"] is not None:
                    errors.append("peak MiB of fwd")
            except Exception as exc:  # noqa: BLE001
                errors.append(f"memory: {exc}")
                free_memory(device)
        row["note"] = "; ".join(filter(None, [row["note"], *errors]))
    del cands, x, xg, gy
    free_memory(device)
    return rows


def main(argv: list[str] | None = None) -> Report:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--seqs", type=int, nargs="+", default=None, help=f"sequence lengths (GPU {GPU_SEQS}, CPU {CPU_SEQS})")
    p.add_argument("--dim", type=int, default=768, help="model width (default 768)")
    p.add_argument("--heads", type=int, default=12, help="attention heads (default 12)")
    p.add_argument("--batch", type=int, default=None, help=f"batch (default GPU: {GPU_TOKENS} tokens / seq; CPU: {CPU_BATCH})")
    p.add_argument("--dtype", default="auto", choices=["auto", "fp32", "bf16", "fp16"], help="auto: bf16 on GPU, fp32 on CPU")
    p.add_argument("--backends", nargs="+", default=None, choices=ALL_BACKENDS, help="CEM backends (default: all available)")
    p.add_argument("--cem-steps", type=int, nargs="+", default=[1, 2], help="CEM descent steps T (default 1 2)")
    p.add_argument("--kq-diag", nargs="+", default=["none", "shared"], choices=["none", "shared", "per_head"], help="CEM key-query diagonals (default none shared)")
    args = p.parse_args(argv)
    device = setup(args, repeats=(20, 5), warmup=(3, 1))
    dtype = pick_dtype(args.dtype, device)
    gpu = device.type == "cuda"
    if args.seqs is None:
        args.seqs = list(GPU_SEQS if gpu else CPU_SEQS)
    if args.backends is None:
        args.backends = available_backends(device)
    if gpu:  # flex compiles per shape: allow more recompiles than dynamo's default before it gives up
        import torch._dynamo

        cfg = torch._dynamo.config
        limit = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
        setattr(cfg, limit, max(getattr(cfg, limit), 64))
        if hasattr(cfg, "accumulated_recompile_limit"):
            cfg.accumulated_recompile_limit = max(cfg.accumulated_recompile_limit, 1024)

    all_specs = specs(args, device, dtype)
    table = Table(COLUMNS)
    for seq in args.seqs:
        batch = args.batch or (max(1, GPU_TOKENS // seq) if gpu else CPU_BATCH)
        print(f"seq {seq}, batch {batch}", file=sys.stderr)
        rows = bench_seq(args, device, dtype, seq, batch, all_specs)
        base = rows[0]  # Llama
        for row in rows:
            spec = row["spec"]
            table.add(
                spec.variant, spec.backend, seq, batch,
                fmt(row["fwd"]), fmt(row["bwd"]), fmt(row["mem"], ".1f"),
                ratio(row["fwd"], base["fwd"]), ratio(row["bwd"], base["bwd"]), ratio(row["mem"], base["mem"]),
                row["note"],
            )  # fmt: skip

    report = Report(
        "Attention layer: CEM vs Llama (SDPA)",
        device,
        settings={
            "dim": args.dim, "heads": args.heads, "dtype": dtype_name(dtype),
            "batch": args.batch or (f"{GPU_TOKENS} tokens / seq" if gpu else CPU_BATCH),
            "repeats": args.repeats, "warm-up": args.warmup,
        },  # fmt: skip
        tables=[("", table)],
        notes=[
            "Times are medians over repeats, all candidates of one sequence length timed round-robin; ratios are of medians, "
            "to Llama at the same sequence length (> 1: slower / more memory than Llama).",
            "fwd: inference forward (no_grad); fwd+bwd: forward with autograd and backward of a fixed output gradient.",
            "peak MiB: CUDA memory the fwd+bwd call allocates above what was allocated before it (- on CPU).",
        ],
    )
    report.emit(args.out)
    return report


if __name__ == "__main__":
    main()
