"""RMSNorm, the normalisation `ĥ = norm(h)` of every sublayer (docs/design.md, Notation)."""

from __future__ import annotations

from torch import nn


class RMSNorm(nn.RMSNorm):
    """`x / rms(x) * g` with a learned gain `g` (PyTorch's fused RMSNorm, eps 1e-6 as in Llama)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__(dim, eps=eps)
