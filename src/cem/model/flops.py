"""Analytic matmul FLOPs per token (forward), counting the recursion: each CEM step recomputes queries,
the attention and the tied output projection, while keys (attention) and the gate (MLP) are computed once,
and so is the preconditioner folded into the output weights (its cost spread over the sequence's tokens)."""

from __future__ import annotations

from ..layers import PRECONDITIONERS
from .config import ModelConfig


def attention_flops(cfg: ModelConfig, seq_len: int) -> int:
    """Forward FLOPs of one attention sublayer for one token at full context `seq_len` (scores + values)."""
    D, J, K = cfg.dim, seq_len, cfg.n_heads
    if cfg.attn == "llama":
        return cfg.attn_reuse * (4 * 2 * D * D + 2 * 2 * J * D)
    diag = {"none": 0, "shared": 2 * J * D, "per_head": 2 * J * D * K}[cfg.kq_diag]
    value_diag = 2 * J * D * K if (cfg.exact_gradient and diag) else 0
    p = PRECONDITIONERS[cfg.attn_precond]
    if value_diag:  # per-head form: P_k applied to every token's K head outputs in every step
        precond, fold = K * p.flops(D, cfg.attn_precond_rank), 0
    else:  # P folded into W_Qᵀ once per forward (D rows), spread over the J tokens
        precond, fold = 0, p.folded_flops(D, D, cfg.attn_precond_rank, J)
    per_step = 2 * D * D + 2 * 2 * J * D + diag + value_diag + 2 * D * D + precond  # W_Q u, qk, pk, W_Qᵀ o, P
    return cfg.attn_reuse * (2 * D * D + fold + cfg.attn_steps * per_step)  # keys once


def mlp_flops(cfg: ModelConfig, seq_len: int | None = None) -> int:
    """Forward FLOPs of one MLP sublayer for one token (of a sequence of `seq_len`, default the context)."""
    seq_len = seq_len or cfg.context
    D, m = cfg.dim, cfg.mlp_hidden
    if cfg.mlp == "llama":
        return cfg.mlp_reuse * 3 * 2 * D * m
    # P folded into the down projection V once per forward (m rows), spread over the tokens
    fold = PRECONDITIONERS[cfg.mlp_precond].folded_flops(m, D, cfg.mlp_precond_rank, seq_len)
    # (a sequence of at least m tokens, as in LM training; CEMMLP applies P per token when it has fewer)
    return cfg.mlp_reuse * (2 * D * m + fold + cfg.mlp_steps * 2 * 2 * D * m)  # gate once


def forward_flops_per_token(cfg: ModelConfig, seq_len: int | None = None) -> int:
    """Forward matmul FLOPs per token (the attention term at full context, as in PaLM's MFU convention)."""
    J = seq_len or cfg.context
    return cfg.n_layers * (attention_flops(cfg, J) + mlp_flops(cfg, J)) + 2 * cfg.dim * cfg.vocab_size


def train_flops_per_token(cfg: ModelConfig, seq_len: int | None = None) -> int:
    """Forward + backward ≈ 3 × forward."""
    return 3 * forward_flops_per_token(cfg, seq_len)
