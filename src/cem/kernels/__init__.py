"""Fused kernels for CEM attention and the backend dispatcher (docs/kernels.md).

Imports cleanly without triton: `HAS_TRITON` is then False and "auto" resolves to "sdpa".
"""

from .cem_attention import HAS_TRITON, KernelConfig, default_config, triton_cem_attention, uses_interpreter
from .dispatch import BACKENDS, auto_backend, cem_attention, cem_attention_flex, resolve_backend, triton_self_check

__all__ = [
    "BACKENDS",
    "HAS_TRITON",
    "KernelConfig",
    "auto_backend",
    "cem_attention",
    "cem_attention_flex",
    "default_config",
    "resolve_backend",
    "triton_cem_attention",
    "triton_self_check",
    "uses_interpreter",
]
