"""Tile sizes of the fused CEM attention kernel, timed: forward and forward+backward milliseconds for a grid
of `KernelConfig`s against `default_config`'s heuristic choice (config None), at one training shape.

    python benchmarks/kernel_tiles.py [--device cuda] [--seq 2048] [--batch 8] [--diag shared none]
        [--dtype bf16] [--budget-s 150] [--out FILE.md]

Every candidate is first checked on the same fresh random inputs against a float64 reference written from
the formula (`benchmarks.kernel_check.reference`): output and all gradients, relative error
‖x − ref‖ / ‖ref‖ under the dtype's tolerance (`kernel_check.TOLERANCE`), every element finite. Only then is it timed (median of `--repeats` calls after warm-up; CUDA events).
One config is used for the forward and for the backward kernels (that is what `config=` means), so the
"bwd ms" column (fwd+bwd − fwd) lets the two be chosen apart. The grid is walked in a fixed order, most
likely winners first, and the walk stops at `--budget-s` (compilation dominates): the table says how far
it got. On the CPU the kernel runs in Triton's interpreter (for the smoke test only; its times mean nothing).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make `benchmarks.common` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from benchmarks.common import Report, Table, describe_error, elapsed_ms, fmt, parser, pick_dtype, setup
from benchmarks.kernel_check import TOLERANCE, reference
from cem.kernels import HAS_TRITON, KernelConfig, KernelLaunch, triton_cem_attention  # noqa: F401 (HAS_TRITON: for its test)

# (block_m, block_n, heads_per_program, num_warps, num_stages), walked in this order until the budget is spent.
# First the region measured best on an H100 (bf16, 134M shape, 2026-11-26: G 4, 16-row tiles, 4 warps; see
# docs/benchmarks/kernel_tiles_h100.md), then one head a program with FlashAttention-sized tiles: measured
# 2-140x slower as 3-D (batched, mma.sync) dots, they now run as 2-D dots that Triton lowers to wgmma (`_bdot`),
# untimed; then the rest of the small-tile region.
GRID = [
    (16, 16, 4, 4, 1), (16, 32, 4, 4, 1), (64, 32, 1, 4, 2), (64, 64, 1, 4, 2), (128, 64, 1, 8, 2),
    (64, 64, 1, 8, 2), (128, 32, 1, 4, 2), (64, 64, 1, 4, 3), (128, 64, 1, 4, 2), (64, 128, 1, 8, 2),
    (32, 64, 1, 4, 2), (16, 16, 16, 4, 1), (32, 16, 16, 8, 1), (16, 16, 8, 4, 1), (32, 32, 2, 4, 1),
    (16, 16, 16, 8, 2), (16, 32, 16, 8, 1), (32, 32, 8, 8, 1), (32, 32, 4, 8, 1), (16, 64, 4, 8, 1),
    (16, 16, 2, 4, 1), (64, 64, 2, 8, 2),
]  # fmt: skip
SMOKE_GRID = [(16, 16, 1, 4, 1), (16, 16, 2, 4, 1)]
COLUMNS = ["diag", "config (m, n, G, warps, stages)", "fwd ms", "fwd+bwd ms", "bwd ms", "fwd ×default",
           "bwd ×default", "max rel err", "note"]  # fmt: skip


def make_inputs(diag, B, K, L, d, D, dtype, device, gen):
    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, device=device) * scale).to(dtype).requires_grad_()

    q, k = rand(B, K, L, d), rand(B, K, L, d)
    qd = None if diag == "none" else rand(*((B, L, D) if diag == "shared" else (B, K, L, D)), scale=0.1)
    hn = None if diag == "none" else rand(B, L, D)
    slopes = 2.0 ** -torch.arange(1, K + 1, device=device, dtype=torch.float32)
    sb = torch.randn(K, generator=gen, device=device).requires_grad_()
    return q, k, qd, hn, slopes, sb


def leaves(q, k, qd, hn, slopes, sb):
    return [t for t in (q, k, qd, hn, sb) if t is not None]


def reference_grads(inputs, g):
    """float64 output and gradients of the formula (`kernel_check.reference`)."""
    q, k, qd, hn, slopes, sb = inputs
    ref_in = [t.detach().double().requires_grad_() for t in leaves(*inputs)]
    q2, k2, sb2 = ref_in[0], ref_in[1], ref_in[-1]
    qd2, hn2 = (ref_in[2], ref_in[3]) if qd is not None else (None, None)
    o2 = reference(q2, k2, qd2, hn2, slopes, sb2, 0)
    grads = torch.autograd.grad(o2, ref_in, g.double())
    return [o2.detach(), *grads]


def check(config, inputs, g, ref) -> float:
    """Largest relative error of output and gradients against the float64 reference (NaN when not finite)."""
    ins = leaves(*inputs)
    o = triton_cem_attention(*inputs, config=config)
    grads = torch.autograd.grad(o, ins, g)
    errs = []
    for a, b in zip([o, *grads], ref):
        if not bool(torch.isfinite(a).all()):
            return float("nan")
        errs.append(((a.double() - b).norm() / b.norm()).item())
    return max(errs)


def time_config(config, inputs, g, device, repeats, warmup):
    ins = leaves(*inputs)

    def fwd():
        with torch.no_grad():
            return triton_cem_attention(*inputs, config=config)

    def fwd_bwd():
        o = triton_cem_attention(*inputs, config=config)
        return torch.autograd.grad(o, ins, g)

    out = {}
    for name, fn in (("fwd", fwd), ("fwd_bwd", fwd_bwd)):
        for _ in range(warmup):
            fn()
        out[name] = statistics.median(elapsed_ms(fn, device) for _ in range(repeats))
    return out["fwd"], out["fwd_bwd"]


def describe(config: KernelConfig | None, inputs, backward: bool) -> str:
    """The tiles a launch really uses (the default's choice spelled out)."""
    q, k, qd, hn, _, _ = inputs
    launch = KernelLaunch(q, k, qd, hn, 0, config, backward=backward)
    c = launch.cfg
    mode = "" if qd is None else (" scores" if launch.scores else " tiled")
    return f"({c.block_m}, {c.block_n}, {c.heads_per_program}, {c.num_warps}, {c.num_stages}){mode}"


def main(argv: list[str] | None = None) -> Report:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--seq", type=int, default=None, help="sequence length (default GPU 2048, CPU 32)")
    p.add_argument("--batch", type=int, default=None, help="batch (default GPU 16384 tokens / seq, CPU 1)")
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--diag", nargs="+", default=["shared", "none"], choices=["shared", "per_head", "none"])
    p.add_argument("--dtype", default="auto", help="auto (bf16 on GPU, fp32 on CPU) | fp32 | bf16 | fp16")
    p.add_argument("--budget-s", type=float, default=150.0, help="stop walking the grid after this many seconds")
    args = p.parse_args(argv)
    device = setup(args, repeats=(20, 1), warmup=(3, 0))
    gpu = device.type == "cuda"
    dtype = pick_dtype(args.dtype, device)
    L = args.seq or (2048 if gpu else 32)
    B = args.batch or (max(1, 16384 // L) if gpu else 1)
    K, d = args.heads, args.head_dim
    grid = GRID if gpu else SMOKE_GRID
    gen = torch.Generator(device=device).manual_seed(args.seed)
    start = time.monotonic()
    table = Table(COLUMNS)
    walked = {}
    best = {}
    for diag in args.diag:
        inputs = make_inputs(diag, B, K, L, d, K * d, dtype, device, gen)
        g = torch.randn(B, K, L, d, generator=gen, device=device).to(dtype)
        ref = reference_grads(inputs, g)
        base = None
        n = 0
        for cand in [None, *grid]:
            if cand is not None and time.monotonic() - start > args.budget_s * (args.diag.index(diag) + 1) / len(args.diag):
                break
            config = None if cand is None else KernelConfig(block_m=cand[0], block_n=cand[1], block_dd=64,
                                                           heads_per_program=cand[2], num_warps=cand[3], num_stages=cand[4])
            label = ("default fwd " + describe(None, inputs, False) + ", bwd " + describe(None, inputs, True)) if cand is None \
                else str(cand) + (" (tiled)" if diag != "none" and not KernelLaunch(*inputs[:4], 0, config, backward=True).scores else "")
            try:
                err = check(config, inputs, g, ref)
                ok = err == err and err < TOLERANCE[dtype]
                f, fb = time_config(config, inputs, g, device, args.repeats, args.warmup) if ok else (None, None)
                note = "" if ok else ("non-finite output" if err != err else "over tolerance")
            except Exception as exc:  # noqa: BLE001 - a config that does not compile or run is a note, not a crash
                err, f, fb, note = None, None, None, describe_error(exc)
            n += cand is not None
            bwd = None if f is None else fb - f
            if cand is None:
                base = (f, bwd)
            table.add(diag, label, fmt(f, ".3f"), fmt(fb, ".3f"), fmt(bwd, ".3f"),
                      fmt(None if f is None or not base[0] else f / base[0]), fmt(None if bwd is None or not base[1] else bwd / base[1]),
                      fmt(err, ".1e"), note)  # fmt: skip
            print(" | ".join(table.rows[-1]), file=sys.stderr, flush=True)
            if f is not None:
                for part, t in (("fwd", f), ("bwd", bwd)):
                    if (diag, part) not in best or t < best[diag, part][1]:
                        best[diag, part] = (label, t)
        walked[diag] = f"{n} of {len(grid)}"
    elapsed = time.monotonic() - start
    report = Report(
        "Fused CEM attention kernel: tile sizes",
        device,
        settings={"shape": f"B {B}, heads {K} of {d}, D {K * d}, L {L}", "dtype": str(dtype).replace("torch.", ""),
                  "repeats": args.repeats, "warm-up": args.warmup, "grid walked": ", ".join(f"{k} {v}" for k, v in walked.items()),
                  "wall": f"{elapsed:.0f} s"},  # fmt: skip
        tables=[("", table)],
        notes=[
            "config None (first row per diag) is `default_config`'s choice, spelled out as (m, n, G, warps, stages) for "
            "the forward and the backward kernels; \"scores\": the shared diagonal read as a (B, L, L) bias matrix.",
            "fwd ms: median of forward calls (no grad); fwd+bwd ms: forward and the gradients of every input; bwd = the difference.",
            "max rel err: largest ‖x − ref‖/‖ref‖ over the output and gradients against float64 on the same inputs; a config "
            "over its dtype's tolerance (benchmarks/kernel_check.py) is not timed.",
            "best: " + "; ".join(f"{k[0]} {k[1]} {v[0]} {v[1]:.3f} ms" for k, v in best.items()),
        ],
    )
    report.emit(args.out)
    return report


if __name__ == "__main__":
    main()
