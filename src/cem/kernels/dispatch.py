"""Backend choice for the CEM attention core: eager, sdpa, flex, triton, or auto.

    cem_attention(q, k, qd, hn, slopes, self_bias, q_start=0, v=None, backend="auto")

"auto" picks "triton" for CUDA tensors when triton imports and v is None, else "sdpa";
`auto_backend(device, v=None)` says which one that is without running anything. An explicit "triton"
with v given (the kernel ties values to keys) falls back to "sdpa" with a warning.

"flex" is the FlexAttention baseline: ALiBi, the self bias and the causal mask as a `score_mod`, the
diagonal term folded into the dot product by concatenating [q, qd] and [k, ĥ] like the sdpa path. On CUDA
it runs `torch.compile(flex_attention)` (with a causal block mask); on CPU PyTorch only has the unfused
eager implementation and no backward ("FlexAttention does not support backward on CPU"), so on CPU it
is forward-only.
"""

from __future__ import annotations

import math
import warnings
from typing import Callable

import torch
from torch import Tensor

from cem.layers.functional import cem_attention_eager, cem_attention_sdpa, fold_diagonal

from .cem_attention import HAS_TRITON, triton_cem_attention

BACKENDS = ("auto", "eager", "sdpa", "flex", "triton")

__all__ = ["BACKENDS", "auto_backend", "cem_attention", "cem_attention_flex", "resolve_backend", "triton_self_check"]


_TRITON_OK: dict[str, bool] = {}


def triton_self_check(device: torch.device | str) -> bool:
    """Whether the Triton kernel matches the eager path on `device` (output and every gradient, fresh random
    inputs, float32); run once per device before "auto" trusts the kernel, cached."""
    key = str(torch.device(device))
    if key not in _TRITON_OK:
        g = torch.Generator(device=device).manual_seed(0)
        B, K, J, d = 2, 3, 37, 16

        def rand(*shape):
            return torch.randn(*shape, generator=g, device=device).requires_grad_(True)

        args = [rand(B, K, J, d), rand(B, K, J, d), rand(B, J, K * d), rand(B, J, K * d)]
        slopes, self_bias = torch.linspace(0.5, 0.05, K, device=device), rand(K)
        with torch.enable_grad():
            outs = []
            for fn in (triton_cem_attention, cem_attention_eager):
                o = fn(*args, slopes, self_bias)
                grads = torch.autograd.grad(o.square().sum(), [*args, self_bias])
                outs.append([o, *grads])
        _TRITON_OK[key] = all(torch.allclose(a, b, rtol=1e-3, atol=1e-3) for a, b in zip(*outs))
        if not _TRITON_OK[key]:
            warnings.warn(f"the Triton CEM kernel disagrees with the eager path on {key}; 'auto' uses sdpa there", stacklevel=2)
    return _TRITON_OK[key]


def auto_backend(device: torch.device | str, v: Tensor | None = None, shared_diag: bool = False) -> str:
    """The backend that backend="auto" runs for tensors on `device`: "triton" on CUDA when triton imports and
    the kernel passed its self-check there (inside torch.compile the check is not run: call this once
    eagerly first, as the trainer does); elsewhere "sdpa", except "eager" on CPU with a shared key-query
    diagonal, where SDPA's concatenation repeats the diagonal term per head (2.5-8x slower, measured in
    docs/benchmarks/attention_cpu.md) while the eager path computes it once for all heads."""
    device = torch.device(device)
    if device.type == "cuda" and HAS_TRITON and v is None:
        if torch.compiler.is_compiling():
            return "triton" if _TRITON_OK.get(str(device), True) else "sdpa"
        return "triton" if triton_self_check(device) else "sdpa"
    if device.type == "cpu" and shared_diag:
        return "eager"
    return "sdpa"


def resolve_backend(backend: str, device: torch.device | str, v: Tensor | None = None, shared_diag: bool = False) -> str:
    """The backend actually run for a requested one (auto resolved, triton-with-v falls back)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}; expected one of {BACKENDS}")
    if backend == "auto":
        return auto_backend(device, v, shared_diag)
    if backend == "triton" and v is not None:
        warnings.warn("the triton CEM kernel ties values to keys; v given, falling back to sdpa", stacklevel=3)
        return "sdpa"
    if backend == "triton" and not HAS_TRITON:
        raise RuntimeError("backend='triton' requested but triton is not installed (pip install triton)")
    return backend


_compiled_flex: Callable | None = None


def _flex_fn(device: torch.device) -> Callable:
    from torch.nn.attention.flex_attention import flex_attention

    if device.type != "cuda":
        return flex_attention
    global _compiled_flex
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    return _compiled_flex


def cem_attention_flex(
    q: Tensor,
    k: Tensor,
    qd: Tensor | None,
    hn: Tensor | None,
    slopes: Tensor,
    self_bias: Tensor | None,
    q_start: int = 0,
    v: Tensor | None = None,
) -> Tensor:
    """Same as `cem_attention_eager` through FlexAttention (the baseline the Triton kernel must beat)."""
    from torch.nn.attention.flex_attention import create_block_mask

    d = q.shape[-1]
    values = k if v is None else v
    q, k = fold_diagonal(q, k, qd, hn)
    device = q.device
    # tensors, not Python ints, so a compiled graph is not specialised on q_start
    offset = torch.tensor(int(q_start), device=device)
    m = slopes.detach().to(device=device, dtype=torch.float32)
    s = self_bias.to(device=device, dtype=torch.float32) if self_bias is not None else torch.zeros_like(m)

    def score_mod(score, b, h, q_idx, kv_idx):
        rel = q_idx + offset - kv_idx
        score = score - m[h] * rel + torch.where(rel == 0, s[h], torch.zeros_like(s[h]))
        return torch.where(rel >= 0, score, -float("inf"))

    if device.type != "cuda" and not torch.is_grad_enabled():
        # PyTorch's CPU FlexAttention refuses inputs that require grad, even under no_grad
        q, k, values, s = q.detach(), k.detach(), values.detach(), s.detach()
    n_q, n_k = q.shape[-2], k.shape[-2]
    block_mask = None
    if device.type == "cuda":

        def causal(b, h, q_idx, kv_idx):
            return kv_idx <= q_idx + offset

        block_mask = create_block_mask(causal, None, None, n_q, n_k, device=device)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
        return _flex_fn(device)(q, k, values, score_mod=score_mod, block_mask=block_mask, scale=1.0 / math.sqrt(d))


def cem_attention(
    q: Tensor,
    k: Tensor,
    qd: Tensor | None,
    hn: Tensor | None,
    slopes: Tensor,
    self_bias: Tensor | None,
    q_start: int = 0,
    v: Tensor | None = None,
    backend: str = "auto",
) -> Tensor:
    """CEM attention core through the chosen backend (see module doc); same maths for all of them."""
    chosen = resolve_backend(backend, q.device, v, shared_diag=qd is not None and qd.dim() == 3)
    if chosen == "triton":
        return triton_cem_attention(q, k, qd, hn, slopes, self_bias, q_start)
    if chosen == "flex":
        return cem_attention_flex(q, k, qd, hn, slopes, self_bias, q_start, v)
    if chosen == "eager":
        return cem_attention_eager(q, k, qd, hn, slopes, self_bias, q_start, v)
    return cem_attention_sdpa(q, k, qd, hn, slopes, self_bias, q_start, v)
