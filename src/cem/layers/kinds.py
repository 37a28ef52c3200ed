"""The sublayers of a block and the kinds a model config names for each (`attn=`, `mlp=`).

A block has two sublayers, the keys of `SUBLAYERS`: "attn" and "mlp". That name is how a layer says which one
it is (its class's `sublayer`) and how a model config names its settings (`attn`, `attn_steps`, `mlp_reuse`, ...).
Each kind registers, next to its class, how it is built from its sublayer's typed config (`AttentionConfig`,
`MLPConfig`, the parts `attn` and `mlp` of a `cem.model.ModelConfig`) and what one application costs; `cem.model.lm` builds,
`cem.model.flops` counts and `cem.model.memory` plans by looking the kind up here, never by comparing names."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Callable

from torch import nn

from ..checks import check_choice
from .attention_core import BACKENDS, check_backend
from .position import ALIBI_SLOPES, POSITIONS
from .precond import PRECONDITIONERS
from .steps import Recursion


ATTENTION_KINDS: dict[str, "SublayerKind"] = {}
MLP_KINDS: dict[str, "SublayerKind"] = {}


def _check_choices(config) -> None:
    """Each setting of `config` that names a kind is one of its `CHOICES` (registries, read when checked)."""
    for name, choices in type(config).CHOICES.items():
        check_choice(name, getattr(config, name), tuple(choices))


def _check_settings(config, kinds: dict) -> None:
    """A setting the sublayer's kind does not read keeps its default (it would do nothing)."""
    used = kinds[config.kind].settings(config)
    for f in fields(config):
        if f.name != "kind" and f.name not in used and getattr(config, f.name) != f.default:
            raise ValueError(f"{f.name}={getattr(config, f.name)!r} does nothing in {config.kind} {config.LABEL} (it reads "
                             f"{', '.join(used) or 'no setting'}); leave it out")


@dataclass(frozen=True)
class Shape:
    """The widths a sublayer is built with: D, K heads, the MLP's hidden width m and the RMSNorm epsilon."""

    dim: int
    n_heads: int
    hidden_dim: int
    eps: float


@dataclass(frozen=True)
class AttentionConfig:
    """The attention sublayer of a model: its `kind` (`ATTENTION_KINDS`) and the settings that kind reads
    (`SublayerKind.settings`; the others keep their defaults): Llama's positions, CEM's recursion, key-query
    diagonal, preconditioner P_k, exact gradient and attention-core backend (eq. 12; `cem.layers.CEMAttention`)."""

    kind: str = "llama"
    """the attention sublayer: llama (softmax attention) or cem (T descent steps on the interaction energy, eq. 12)"""
    position: str = "rope"
    """Llama attention's positions: rope or alibi (CEM attention always uses ALiBi)"""
    alibi: str = "standard"
    """the ALiBi slopes m_k: standard 2^(-8k/K) or app-a 2^(-k) (the paper's App. A example)"""
    recursion: Recursion = Recursion()
    """CEM attention's recursion: T, η, the schedule, the start point (`cem.layers.Recursion`)"""
    kq_diag: str = "shared"
    """the diagonal d_k of A_k = W_Q^kᵀ W_K^k + diag(d_k): none, shared by the heads, or per_head"""
    precond: str = "identity"
    """the preconditioner P_k per head: identity, diag or diag_lowrank (App. C.4)"""
    precond_rank: int = 4
    """the rank of the diag_lowrank preconditioner"""
    exact_gradient: bool = False
    """keep the value-side diagonal term that Algorithm 1 drops (the exact energy gradient)"""
    backend: str = "auto"
    """the attention core's implementation (auto: decided once per device; docs/kernels.md)"""
    reuse: int = 1
    """apply the sublayer this many times with the same weights (plain layer reuse, Llama's control for recursion)"""

    LABEL = "attention"
    CHOICES = {"kind": ATTENTION_KINDS, "position": POSITIONS, "alibi": ALIBI_SLOPES, "precond": PRECONDITIONERS, "backend": BACKENDS}

    def __post_init__(self) -> None:
        object.__setattr__(self, "backend", check_backend(self.backend, "attn_backend"))  # an old name becomes its name now
        _check_choices(self)
        _check_settings(self, ATTENTION_KINDS)


@dataclass(frozen=True)
class MLPConfig:
    """The MLP sublayer of a model: its `kind` (`MLP_KINDS`) and the settings that kind reads (the others keep
    their defaults): its width, CEM's recursion, preconditioner P and energy (eq. 13, App. B; `cem.layers.CEMMLP`)."""

    kind: str = "llama"
    """the MLP sublayer: llama (SwiGLU) or cem (T descent steps on the element-wise energy, eq. 13)"""
    recursion: Recursion = Recursion()
    """CEM MLP's recursion: T, η, the schedule, the start point (`cem.layers.Recursion`)"""
    precond: str = "identity"
    """the preconditioner P: identity, diag or diag_lowrank (App. C.4)"""
    precond_rank: int = 16
    """the rank of the diag_lowrank preconditioner"""
    energy: str = "gated"
    """the element-wise energy: gated (eq. 13) or convex (App. B)"""
    width_mult: float = 1.0
    """the hidden width m times this, rounded up to a multiple of 8 (1.5 gives the parameter-matched CEM MLP)"""
    reuse: int = 1
    """apply the sublayer this many times with the same weights (plain layer reuse, Llama's control for recursion)"""

    LABEL = "MLP"
    CHOICES = {"kind": MLP_KINDS, "precond": PRECONDITIONERS}  # `energy`: cem_mlp adds MLP_ENERGIES

    def __post_init__(self) -> None:
        _check_choices(self)
        _check_settings(self, MLP_KINDS)


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
    """`module`: the layer class; `build(shape, c)`: that layer for the widths `shape` and its sublayer's config
    `c` (`AttentionConfig` or `MLPConfig`); `flops(shape, c, seq_len)`: its forward matmul FLOPs for one token
    at full context `seq_len` (one application: reuse multiplies it); `settings(c)`: the fields of `c` it reads;
    `kernel`: its fused GPU kernel, None where it has none."""

    module: type[nn.Module]
    build: Callable[..., nn.Module]
    flops: Callable[..., int]
    settings: Callable[..., tuple[str, ...]]
    kernel: KernelPath | None = None




@dataclass(frozen=True)
class Sublayer:
    """One of a block's two sublayers: its `label` in tables and files ("attention", "mlp") and the `kinds` a
    config may name for it."""

    label: str
    kinds: dict[str, SublayerKind]


SUBLAYERS: dict[str, Sublayer] = {"attn": Sublayer("attention", ATTENTION_KINDS), "mlp": Sublayer("mlp", MLP_KINDS)}
