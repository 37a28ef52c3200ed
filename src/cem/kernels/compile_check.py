"""Compile the CEM kernels ahead of time for an NVIDIA target, without a GPU, and report resources.

    python -m cem.kernels.compile_check --heads 12 --head-dim 64 --model-dim 768 [--arch 90] [--dtype bf16]

For each kernel (forward, backward dq, backward dk) and key-query diagonal (shared, tile by tile and read as
a score matrix; per_head; none) it builds
the `default_config` tiles with `triton.compile(..., target=GPUTarget("cuda", arch, 32))` and runs the
ptxas bundled with triton (`-v`) on the PTX for registers and spill bytes. This checks that the kernels
build for the GPU and how heavy they are; it says nothing about speed (docs/kernels.md).
Run it with TRITON_INTERPRET unset: when it is set at triton's import, triton's own library functions are
decorated for the interpreter and nothing can be compiled in that process.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
import warnings
from pathlib import Path

import torch


def _ptxas(arch: int) -> Path:
    import triton

    bindir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    for name in (("ptxas-blackwell", "ptxas") if arch >= 90 else ("ptxas",)):
        if (bindir / name).exists():
            return bindir / name
    raise FileNotFoundError(f"no ptxas under {bindir}")


def compile_kernel(name: str, dtype: str, diag: str, cfg, head_dim: int, arch: int = 90, scalar: str = "fp32", *, scores: bool = False):
    """triton.compile one kernel with the given KernelConfig; returns the CompiledKernel. diag: the key-query
    diagonal's kind, "shared", "per_head" or "none"; scores: the shared one read as a score matrix; scalar: the
    type of the float arguments (torch.compile's inductor passes Python floats as fp64)."""
    import triton
    from triton.backends.compiler import GPUTarget

    from .triton_attention import _kernels, _next_pow2

    kernel = getattr(_kernels(False), name)
    ptr = {"bf16": "*bf16", "fp16": "*fp16", "fp32": "*fp32"}[dtype]
    consts = dict(
        G=cfg.heads_per_program, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        BLOCK_DH=max(16, _next_pow2(head_dim)), BLOCK_DD=cfg.block_dd,
        HAS_DIAG=diag != "none" and not scores, PER_HEAD=diag == "per_head", HAS_SB=True, HAS_BIAS=scores,
        PREC="ieee" if dtype == "fp32" and not cfg.allow_tf32 else "tf32", UPCAST=False,
    )
    fp32_ptrs = {"slopes_ptr", "sb_ptr", "lse_ptr", "delta_ptr", "dqd_ptr", "dhn_ptr", "dsb_ptr"}
    sig = {}
    for arg in kernel.arg_names:
        if arg in consts:
            sig[arg] = "constexpr"
        elif arg.endswith("_ptr"):
            sig[arg] = "*fp32" if arg in fp32_ptrs else ptr
        elif arg in ("scale", "scale2"):
            sig[arg] = scalar
        else:
            sig[arg] = "i32"
    src = triton.compiler.ASTSource(fn=kernel, signature=sig, constexprs=consts)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32),
                          options=dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages))


def resources(compiled, arch: int = 90) -> tuple[int, int]:
    """(registers a thread, spill-store bytes) from ptxas -v on the kernel's PTX."""
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(compiled.asm["ptx"])
    gpu = f"sm_{arch}a" if arch == 90 else f"sm_{arch}"
    out = subprocess.run([str(_ptxas(arch)), "-v", f"--gpu-name={gpu}", f.name, "-o", "/dev/null"],
                         capture_output=True, text=True)
    Path(f.name).unlink(missing_ok=True)
    text = out.stdout + out.stderr
    regs = re.findall(r"Used (\d+) registers", text)
    spills = re.findall(r"(\d+) bytes spill stores", text)
    if not regs:
        raise RuntimeError(f"ptxas failed: {text[-1000:]}")
    return int(regs[0]), int(spills[0]) if spills else 0


def main(argv=None) -> None:
    from .triton_attention import default_config

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--model-dim", type=int, default=None, help="D (default heads * head-dim)")
    p.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    p.add_argument("--arch", type=int, default=90)
    p.add_argument("--diag", nargs="+", choices=["shared", "per_head", "none"], default=["shared", "per_head", "none"],
                   help="key-query diagonals (shared: tile by tile and as a score matrix)")
    p.add_argument("--scalar", choices=["fp32", "fp64"], default="fp32",
                   help="type of the float arguments (fp64: as torch.compile's inductor passes them)")
    a = p.parse_args(argv)
    D = a.model_dim or a.heads * a.head_dim
    tdtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[a.dtype]
    warnings.filterwarnings("ignore")
    for name in ("cem_fwd_kernel", "cem_bwd_dq_kernel", "cem_bwd_dk_kernel"):
        for diag, scores in [(x, s) for x in a.diag for s in ((False, True) if x == "shared" else (False,))]:
            cfg = default_config(a.heads, a.head_dim, D, tdtype, torch.device("cuda"),
                                 backward=name != "cem_fwd_kernel", diag=diag, scores=scores)
            c = compile_kernel(name, a.dtype, diag, cfg, a.head_dim, a.arch, a.scalar, scores=scores)
            regs, spill = resources(c, a.arch)
            form = f"{diag}{' scores' if scores else ''}"
            print(f"{name:18s} diag={form:13s} G={cfg.heads_per_program:<2d} M={cfg.block_m:<2d} N={cfg.block_n:<2d} "
                  f"DD={cfg.block_dd:<2d} warps={cfg.num_warps}: registers={regs} spill={spill}B "
                  f"shared={c.metadata.shared}B", flush=True)


if __name__ == "__main__":
    main()
