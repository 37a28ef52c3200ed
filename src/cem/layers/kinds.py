"""The sublayers of a block and the kinds a model config names for each (`attn=`, `mlp=`).

A block has two sublayers, the keys of `SUBLAYERS`: "attn" and "mlp". That name is how a layer says which one
it is (its class's `sublayer`) and how a model config names its settings (`attn`, `attn_steps`, `mlp_reuse`, ...).
Each kind registers, next to its class, how it is built from its sublayer's typed config (`AttentionConfig`,
`MLPConfig`, which `cem.model.ModelConfig` hands out) and what one application costs; `cem.model.lm` builds,
`cem.model.flops` counts and `cem.model.memory` plans by looking the kind up here, never by comparing names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torch import nn

from .steps import Recursion


@dataclass(frozen=True)
class AttentionConfig:
    """What an attention sublayer is built from: width D, K heads and the RMSNorm `eps`; the positions (Llama:
    `position` RoPE or ALiBi; the ALiBi slopes `alibi`); CEM's recursion, key-query diagonal, preconditioner P_k
    (kind and rank), exact gradient and attention-core backend (eq. 12; `cem.layers.CEMAttention`)."""

    dim: int
    n_heads: int
    eps: float
    position: str
    alibi: str
    recursion: Recursion
    kq_diag: str
    precond: str
    precond_rank: int
    exact_gradient: bool
    backend: str


@dataclass(frozen=True)
class MLPConfig:
    """What an MLP sublayer is built from: width D, hidden width m and the RMSNorm `eps`; CEM's recursion,
    preconditioner P (kind and rank) and energy (eq. 13, App. B; `cem.layers.CEMMLP`)."""

    dim: int
    hidden_dim: int
    eps: float
    recursion: Recursion
    precond: str
    precond_rank: int
    energy: str


@dataclass(frozen=True)
class KernelPath:
    """The fused kernel a GPU training run of an attention kind runs: its attention-core `backend`, whether
    it can run here (`available()`: then the memory planner counts what it saves, in its interpreter on the
    CPU), and the short-lived bytes it allocates at the peak of a training step, `scratch(c, batch, seq, elem)`
    for `batch` sequences of `seq` tokens whose activations take `elem` bytes a number."""

    backend: str
    available: Callable[[], bool]
    scratch: Callable[[AttentionConfig, int, int, int], int]


@dataclass(frozen=True)
class SublayerKind:
    """`module`: the layer class; `build(c)`: that layer for its sublayer's config (`AttentionConfig` or
    `MLPConfig`); `flops(c, seq_len)`: its forward matmul FLOPs for one token at full context `seq_len` (one
    application: reuse multiplies it); `kernel`: its fused GPU kernel, None where it has none."""

    module: type[nn.Module]
    build: Callable[..., nn.Module]
    flops: Callable[..., int]
    kernel: KernelPath | None = None


ATTENTION_KINDS: dict[str, SublayerKind] = {}
MLP_KINDS: dict[str, SublayerKind] = {}


@dataclass(frozen=True)
class Sublayer:
    """One of a block's two sublayers: its `label` in tables and files ("attention", "mlp") and the `kinds` a
    config may name for it."""

    label: str
    kinds: dict[str, SublayerKind]


SUBLAYERS: dict[str, Sublayer] = {"attn": Sublayer("attention", ATTENTION_KINDS), "mlp": Sublayer("mlp", MLP_KINDS)}
