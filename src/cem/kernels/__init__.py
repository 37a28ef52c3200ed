"""Fused Triton kernels of the CEM attention core (docs/kernels.md); nothing here depends on `cem.layers`.

`triton_cem_attention` takes the attention core's arguments as tensors (the diagonal's qd and ĥ, the ALiBi slopes
and the self bias); `cem.layers.attention_core` registers it as the backend "triton" and decides which backend
runs where. Imports cleanly without triton:
`HAS_TRITON` is then False and the kernel raises when called.
"""

from .triton_attention import HAS_TRITON, KernelConfig, default_config, triton_cem_attention, uses_interpreter

__all__ = ["HAS_TRITON", "KernelConfig", "default_config", "triton_cem_attention", "uses_interpreter"]
