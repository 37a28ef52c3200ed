"""Kernels of the CEM attention core (docs/kernels.md); nothing here depends on `cem.layers`.

Both take the attention core's arguments as tensors (the diagonal's qd and ĥ, the position terms): the fused
Triton kernel `triton_cem_attention` (ALiBi slopes and self bias) and the CPU path `cpu_cem_attention` (the
cached ALiBi bias and self bias; PyTorch's fused CPU flash kernel without a diagonal).
`cem.layers.attention_core` registers them as the backends "triton" and "fast" and decides which backend runs
where. Imports cleanly without triton: `HAS_TRITON` is then False and the Triton kernel raises when called.
"""

from .cpu_attention import QUERY_BLOCK, cpu_cem_attention
from .triton_attention import DIAG_SCORES_MAX_BYTES, HAS_TRITON, KernelConfig, default_config, kq_diag_of, triton_cem_attention, uses_interpreter

__all__ = [
    "DIAG_SCORES_MAX_BYTES",
    "HAS_TRITON",
    "QUERY_BLOCK",
    "KernelConfig",
    "cpu_cem_attention",
    "default_config",
    "kq_diag_of",
    "triton_cem_attention",
    "uses_interpreter",
]
