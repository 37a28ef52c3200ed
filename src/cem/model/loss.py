"""The language-modelling loss: next-token cross-entropy in nats, computed in float32.

Every caller (the model's `forward(ids, targets)`, the trainer, evaluation, the Hugging Face wrapper and
the benchmarks) goes through `next_token_loss`, so the float32 upcast and the reductions live here once.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

REDUCTIONS = ("mean", "sum", "none")


def next_token_loss(logits: Tensor, targets: Tensor, reduction: str = "mean", ignore_index: int = -100) -> Tensor:
    """Cross-entropy of `logits` (..., vocab) against `targets` (...), aligned position by position.

    reduction "mean" (over the counted targets), "sum", or "none" (shape of `targets`). Targets equal to
    `ignore_index` are not counted.
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"unknown reduction {reduction!r}; expected one of {REDUCTIONS}")
    losses = F.cross_entropy(
        logits.flatten(0, -2).float(), targets.flatten(), ignore_index=ignore_index, reduction=reduction
    )
    return losses.view(targets.shape) if reduction == "none" else losses
