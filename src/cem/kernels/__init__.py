"""Fused Triton kernels of the CEM attention core (docs/kernels.md); nothing here depends on `cem.layers`.

`triton_cem_attention` has the signature of `cem.layers.attention_core.cem_attention_eager` without `v`;
which backend runs where is decided in `cem.layers.attention_core`. Imports cleanly without triton:
`HAS_TRITON` is then False and the kernel raises when called.
"""

from .triton_attention import HAS_TRITON, KernelConfig, default_config, triton_cem_attention, uses_interpreter

__all__ = ["HAS_TRITON", "KernelConfig", "default_config", "triton_cem_attention", "uses_interpreter"]
