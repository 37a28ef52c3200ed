"""The CPU decode kernel of CEM attention's query side (`cpu_decode.cpp`), for bf16 on processors with AVX512-BF16.

A cached decoding step with a key-query diagonal reads the context ĥ (B, N, D) once with the K·J queries moved to
ĥ's space (`cem.layers.attention_core.cem_query_side`). In PyTorch that is two GEMMs of skinny shapes, ĥ (N×D) by the queries
(D×K·J) and the probabilities (K·J×N) by ĥ, each reading ĥ from memory, at 31-41 GMAC/s through oneDNN on an AMD
EPYC core without AMX (docs/benchmarks/decode.md). The kernel reads ĥ once in blocks of rows (an online softmax),
with bf16 dot products accumulated in float32 (`vdpbf16ps`), the ALiBi bias, the self bias and the causal mask
computed in place, and threads splitting the rows (merged as in flash-decoding):

    out_q = Σ_j softmax_j(ĥ_j · q_q + b_qj) ĥ_j,   b_kij = -m_k (q_start + i - j) + s_k [q_start + i = j] (-inf past i)

The same maths as the two-GEMM form (logits, bias and softmax in float32, the probabilities rounded to bf16 for the
value product), more accurate in one place: its logits stay in float32 (the GEMM rounds them to bf16).

Two more for the per-head products of a step of few tokens (`attention_core.per_head` and the query side's W_K^k products), each head's
rows of a weight read once instead of a block-diagonal GEMM with K times the multiply-adds: `rows_dot` (y = W^k x^k
per head) and `rows_axpy` (y = Σ_r x^k_r W^k_r per head).

Whether they run is decided once per process (`decode_kernels`): a CPU with avx512f, avx512bw and avx512_bf16, a C++
compiler (built on first use with `torch.utils.cpp_extension`, cached by torch in its extensions folder), a
self-check against the float64 reference, and not switched off by CEM_CPU_DECODE_KERNEL=0 (or false, no, off). Otherwise None, and
the caller keeps the PyTorch form.
"""

from __future__ import annotations

import functools
import sys
import warnings
from pathlib import Path
from typing import Callable, NamedTuple

import torch
from torch import Tensor

from ..checks import env_flag

__all__ = ["ENV_SWITCH", "DecodeKernels", "cpu_has_avx512_bf16", "decode_kernels", "reference_decode_attention"]

ENV_SWITCH = "CEM_CPU_DECODE_KERNEL"  # a false boolean (0, false, no, off) keeps the PyTorch form
SOURCE = Path(__file__).with_name("cpu_decode.cpp")
FLAGS = ["-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512bf16", "-mfma"]
CPU_FLAGS = ("avx512f", "avx512bw", "avx512_bf16")


def cpu_has_avx512_bf16() -> bool:
    """Whether this CPU reports avx512f, avx512bw and avx512_bf16 (Linux /proc/cpuinfo; False elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return all(f in flags for f in CPU_FLAGS)


def reference_decode_attention(hn: Tensor, q: Tensor, slopes: Tensor, self_bias: Tensor, q_start: int) -> Tensor:
    """What the kernel computes, in float64: hn (B, N, D), q (B, K·J, D) -> (B, K·J, D) (for the self-check and tests)."""
    heads, n = slopes.shape[0], hn.shape[1]
    per_head = q.shape[1] // heads
    pos = torch.arange(per_head, dtype=torch.float64) + q_start
    rel = pos[:, None] - torch.arange(n, dtype=torch.float64)[None, :]  # (J, N)
    bias = -slopes.double()[:, None, None] * rel + self_bias.double()[:, None, None] * (rel == 0)
    bias = bias.masked_fill(rel < 0, float("-inf")).reshape(heads * per_head, n)
    logits = q.double() @ hn.double().transpose(1, 2) + bias
    return torch.softmax(logits, dim=-1) @ hn.double()


class DecodeKernels(NamedTuple):
    """The operators of `cpu_decode.cpp` (torch.ops.cem_cpu_decode: the profiler records them with their shapes), bf16
    in and out, float32 sums; no backward (inference only)."""

    attention: Callable[[Tensor, Tensor, Tensor, Tensor, int], Tensor]  # (hn, q, slopes, self_bias, q_start) -> out
    rows_dot: Callable[[Tensor, Tensor], Tensor]  # x (N, G, D), w (R, D) -> y[n, g, r] = w[g·R/G + r] · x[n, g]
    rows_axpy: Callable[[Tensor, Tensor], Tensor]  # x (N, G, R/G), w (R, D) -> y[n, g] = Σ_r x[n, g, r] w[g·R/G + r]


def _build() -> DecodeKernels:
    from torch.utils.cpp_extension import _get_build_directory, load

    if not any(Path(_get_build_directory("cem_cpu_decode", verbose=False)).glob("*.so")):  # a first build takes seconds: say why
        print("cem: building the CPU decode kernels (once on this machine, about 30 s)", file=sys.stderr, flush=True)
    load(name="cem_cpu_decode", sources=[str(SOURCE)], extra_cflags=FLAGS, is_python_module=False, verbose=False)
    ops = torch.ops.cem_cpu_decode
    return DecodeKernels(ops.decode_attention, ops.rows_dot, ops.rows_axpy)


def _self_check(kernels: DecodeKernels) -> bool:
    """Each kernel against float64 on a small case with every path (tails, padding, a causal block)."""
    g = torch.Generator().manual_seed(0)
    hn = torch.randn(2, 203, 96, generator=g).to(torch.bfloat16)
    q = (torch.randn(2, 3 * 2, 96, generator=g) * 0.3).to(torch.bfloat16)
    slopes, self_bias = torch.tensor([0.5, 0.05, 0.0]), torch.tensor([0.3, -0.2, 1.0])
    w = torch.randn(2 * 37, 96, generator=g).to(torch.bfloat16)
    x, xr = torch.randn(5, 2, 96, generator=g).to(torch.bfloat16), torch.randn(5, 2, 37, generator=g).to(torch.bfloat16)
    pairs = [
        (kernels.attention(hn, q, slopes, self_bias, 201), reference_decode_attention(hn, q, slopes, self_bias, 201)),
        (kernels.rows_dot(x, w), torch.einsum("ngd,grd->ngr", x.double(), w.double().view(2, 37, 96))),
        (kernels.rows_axpy(xr, w), torch.einsum("ngr,grd->ngd", xr.double(), w.double().view(2, 37, 96))),
    ]
    return all(bool((got.double() - want).abs().max() <= 0.02 * want.abs().max()) for got, want in pairs)


@functools.cache
def decode_kernels() -> DecodeKernels | None:
    """The kernels, or None where they cannot run here (see the module doc); decided once per process."""
    if not env_flag(ENV_SWITCH, True) or not cpu_has_avx512_bf16():
        return None
    try:
        kernels = _build()
        ok = _self_check(kernels)
    except Exception as exc:  # noqa: BLE001 - no compiler, a failed build: the PyTorch forms run
        warnings.warn(f"CEM's CPU decode kernels are unavailable ({type(exc).__name__}: {exc}); decoding uses PyTorch's GEMMs", stacklevel=2)
        return None
    if not ok:
        warnings.warn("CEM's CPU decode kernels failed their self-check; decoding uses PyTorch's GEMMs", stacklevel=2)
        return None
    return kernels
