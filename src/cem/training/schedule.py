"""The learning-rate schedule of the paper (Table 2): linear warm-up over 5% of the steps, then cosine
decay to 0.1 × peak."""

from __future__ import annotations

import math

import torch


def lr_factor(step: int, total: int, warmup_frac: float = 0.05, final_frac: float = 0.1) -> float:
    """Multiplier of the peak learning rate at optimiser step `step` (0-based) of `total`."""
    warmup = max(1, round(warmup_frac * total))
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return final_frac + (1 - final_frac) * 0.5 * (1 + math.cos(math.pi * progress))


def cosine_schedule(optimizer: torch.optim.Optimizer, total: int, warmup_frac: float, final_frac: float):
    """A LambdaLR with `lr_factor` (its state is saved in checkpoints)."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, total, warmup_frac, final_frac))
