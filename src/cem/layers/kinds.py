"""The sublayer kinds a model config names (`attn=`, `mlp=`). Each kind registers, next to its class, how a
config builds one application of it and what that application costs; `cem.model.lm` builds and
`cem.model.flops` counts by looking the kind up here, never by comparing names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torch import nn


@dataclass(frozen=True)
class SublayerKind:
    """`module`: the layer class; `build(cfg)`: that layer for a `cem.model.ModelConfig`; `flops(cfg, seq_len)`:
    its forward matmul FLOPs for one token at full context `seq_len` (one application: reuse multiplies it)."""

    module: type[nn.Module]
    build: Callable[..., nn.Module]
    flops: Callable[..., int]


ATTENTION_KINDS: dict[str, SublayerKind] = {}
MLP_KINDS: dict[str, SublayerKind] = {}
