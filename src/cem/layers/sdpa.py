"""PyTorch's scaled dot-product attention, every call of it in cem (the attention core's "sdpa" backend, CEM's
query-side decoding, Llama attention): `sdpa`, which keeps cached decoding off cuDNN attention."""

from __future__ import annotations

from contextlib import nullcontext

import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

__all__ = ["DECODE_SDPA_BACKENDS", "sdpa"]

# SDPA's kernels for cached decoding: every kernel but cuDNN attention, which builds a new execution plan for
# each new key length, i.e. at every decoding step (first GPU run, docs/benchmarks/gpu_h100.md: 5.3 ms a call,
# 79% of a Llama decode step on an H100)
DECODE_SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def sdpa(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None, *, is_causal: bool = False,
         scale: float | None = None, decoding: bool = False) -> Tensor:
    """`F.scaled_dot_product_attention`; `decoding` (queries after cached keys) keeps it off cuDNN attention
    (`DECODE_SDPA_BACKENDS`)."""
    with sdpa_kernel(DECODE_SDPA_BACKENDS) if decoding else nullcontext():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale)
