"""The language-modelling loss: next-token cross-entropy in nats, computed in float32.

Every caller (the model's `forward(ids, targets)`, the trainer, evaluation, the Hugging Face wrapper and
the benchmarks) goes through `next_token_loss`, so the float32 upcast and the reductions live here once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..data.loader import IGNORE

REDUCTIONS = ("mean", "sum", "none")


def next_token_loss(logits: Tensor, targets: Tensor, reduction: str = "mean", ignore_index: int = IGNORE) -> Tensor:
    """Cross-entropy of `logits` (..., vocab) against `targets` (...), aligned position by position.

    reduction "mean" (over the counted targets), "sum", or "none" (shape of `targets`). Targets equal to
    `ignore_index` are not counted.
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"unknown reduction {reduction!r}; expected one of {REDUCTIONS}")
    if targets.shape != logits.shape[:-1]:
        raise ValueError(f"targets of shape {tuple(targets.shape)} do not match the ids' shape {tuple(logits.shape[:-1])}")
    if targets.is_floating_point() or targets.is_complex() or targets.dtype == torch.bool:
        raise ValueError(f"targets must be integer token ids, got dtype {targets.dtype}")
    targets = targets.long()  # cross_entropy wants int64 (token caches are uint16/uint32)
    losses = F.cross_entropy(
        logits.flatten(0, -2).float(), targets.flatten(), ignore_index=ignore_index, reduction=reduction
    )
    return losses.view(targets.shape) if reduction == "none" else losses


def deep_supervision_loss(losses: Tensor, monotonicity_weight: float = 0.0) -> Tensor:
    """The objective of random deep supervision (LoopUS, arXiv 2605.11011) from the losses L(T_1..T_K) (K,) at
    increasing depths: (1/K) Σ_k L(T_k) + μ Σ_{k<K} max(0, L(T_{k+1}) - L(T_k)), μ = `monotonicity_weight`
    (`cem.model.config.RecursionTraining`)."""
    objective = losses.mean()
    if monotonicity_weight:
        objective = objective + monotonicity_weight * (losses[1:] - losses[:-1]).clamp_min(0).sum()
    return objective
