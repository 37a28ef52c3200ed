"""Kernels of the CEM attention core (docs/kernels.md); nothing here depends on `cem.layers`. Import from here:
the modules behind this face are its own.

They take the attention core's arguments as tensors (the diagonal's qd and ĥ, the position terms): the fused
Triton kernel `triton_cem_attention` (ALiBi slopes and self bias), the CPU path `cpu_cem_attention` (the
cached ALiBi bias and self bias; PyTorch's fused CPU flash kernel without a diagonal), and the CPU decode
kernels of the query side (`decode_kernels()`: bf16 on AVX512-BF16, built on first use and self-checked, or None).
`cem.layers.attention_core` registers them as the backends "triton", "cpu" and "query_side_cpu" and decides
which backend runs where. Imports cleanly without triton: `HAS_TRITON` is then False and the Triton kernel
raises when called.
"""

from .cpu_attention import QUERY_BLOCK, cpu_cem_attention
from .cpu_decode import ENV_SWITCH, DecodeKernels, cpu_has_avx512_bf16, decode_kernels, reference_decode_attention
from .triton_attention import (
    DIAG_SCORES_MAX_BYTES, HAS_TRITON, KernelConfig, KernelLaunch, default_config, kq_diag_of, triton_cem_attention, uses_interpreter,
)  # fmt: skip

__all__ = [
    "DIAG_SCORES_MAX_BYTES",
    "ENV_SWITCH",
    "HAS_TRITON",
    "QUERY_BLOCK",
    "DecodeKernels",
    "KernelConfig",
    "KernelLaunch",
    "cpu_cem_attention",
    "cpu_has_avx512_bf16",
    "decode_kernels",
    "default_config",
    "kq_diag_of",
    "reference_decode_attention",
    "triton_cem_attention",
    "uses_interpreter",
]
