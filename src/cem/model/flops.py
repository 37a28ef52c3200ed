"""Analytic matmul FLOPs per token (forward), counting the recursion: each CEM step recomputes queries,
the attention and the tied output projection, while keys (attention) and the gate (MLP) are computed once,
and so is the preconditioner folded into the output weights (its cost spread over the sequence's tokens).
Each sublayer kind counts its own next to its class (`SublayerKind.flops`); this module adds them up."""

from __future__ import annotations

from ..layers import ATTENTION_KINDS, MLP_KINDS
from .config import ModelConfig


def attention_flops(cfg: ModelConfig, seq_len: int) -> int:
    """Forward FLOPs of one attention sublayer for one token at full context `seq_len` (scores + values):
    its kind's count (`cem.layers.ATTENTION_KINDS`), times the plain reuse."""
    return cfg.attn.reuse * ATTENTION_KINDS[cfg.attn.kind].flops(cfg.shape, cfg.attn, seq_len)


def mlp_flops(cfg: ModelConfig, seq_len: int | None = None) -> int:
    """Forward FLOPs of one MLP sublayer for one token (of a sequence of `seq_len`, default the context):
    its kind's count (`cem.layers.MLP_KINDS`), times the plain reuse."""
    return cfg.mlp.reuse * MLP_KINDS[cfg.mlp.kind].flops(cfg.shape, cfg.mlp, seq_len or cfg.context)


def forward_flops_per_token(cfg: ModelConfig, seq_len: int | None = None) -> int:
    """Forward matmul FLOPs per token (the attention term at full context, as in PaLM's MFU convention); a block
    that does not recurse (`recur_layers`) is counted at T = 1 (`ModelConfig.layer_config`)."""
    J = seq_len or cfg.context
    per_block: dict[bool, int] = {}  # by whether the block recurses: its config is one of two
    for i in range(cfg.n_layers):
        if cfg.recurs(i) not in per_block:
            block = cfg.layer_config(i)
            per_block[cfg.recurs(i)] = attention_flops(block, J) + mlp_flops(block, J)
    return sum(per_block[cfg.recurs(i)] for i in range(cfg.n_layers)) + 2 * cfg.dim * cfg.vocab_size


def train_flops_per_token(cfg: ModelConfig, seq_len: int | None = None) -> int:
    """Forward + backward ≈ 3 × forward."""
    return 3 * forward_flops_per_token(cfg, seq_len)
