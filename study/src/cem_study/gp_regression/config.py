"""The study's settings: `GPConfig`, the named scales (`GP_SCALES`) and the kernels."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, replace



KERNELS = ("rbf", "nonstationary")
GP_SCALES = ("tiny", "cpu", "gpu", "paper")


@dataclass(frozen=True)
class GPConfig:
    """Everything that defines one cell of the study except (kernel, T, seed)."""

    # data
    input_dim: int = 10
    n_train: int = 1024
    n_test: int = 512
    n_val: int = 0  # > 0: extra points of the same draw for early stopping (best checkpoint on validation RMSE)
    noise_std: float = 0.1
    lengthscale: float | None = None  # None: 0.5 * sqrt(input_dim)
    ns_alpha: float = 0.75  # Gibbs kernel: log ℓ(x) = log ℓ0 + α x_1
    # model
    dim: int = 32
    hidden_dim: int = 128
    step_size: float = 1.0
    precond: str = "identity"
    precond_rank: int = 16
    energy: str = "gated"
    embed: str = "linear"  # "linear" (R^10 -> R^D) or "identity" (D = input_dim, no embedding)
    # training
    train_steps: int = 2000
    batch_size: int = 128  # 0 or >= n_train: full batch
    lr: float = 3e-3
    warmup: float = 0.05  # fraction of train_steps with linear warm-up, then cosine to min_lr_ratio * lr
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0
    weight_decay: float = 0.0  # AdamW-style decoupled weight decay (0: plain Adam)
    eval_every: int = 100  # validation interval when n_val > 0
    device: str = "cpu"  # "auto": CUDA when available

    @property
    def ell(self) -> float:
        return 0.5 * math.sqrt(self.input_dim) if self.lengthscale is None else float(self.lengthscale)

    def fingerprint(self) -> str:
        """Short hash of every field but `device`: rows are only reused when this matches."""
        fields = {k: v for k, v in asdict(self).items() if k != "device"}
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]


_SCALE_CONFIGS = {
    # CI: about a second per cell.
    "tiny": GPConfig(
        n_train=256, n_test=128, n_val=0, dim=16, hidden_dim=32, train_steps=150, batch_size=64, lr=1e-2, eval_every=50
    ),
    # The whole default study (2 kernels x 4 T x 3 seeds) in ~10 minutes on 2 shared CPU cores.
    "cpu": GPConfig(
        n_train=4096, n_test=1024, n_val=1024, dim=32, hidden_dim=128, train_steps=3000, batch_size=128, lr=3e-3
    ),
    # Larger data, models and training for users with a GPU (CUDA when available).
    "gpu": GPConfig(
        n_train=8192,
        n_test=2048,
        n_val=2048,
        dim=64,
        hidden_dim=256,
        train_steps=10_000,
        batch_size=256,
        lr=2e-3,
        eval_every=250,
        device="auto",
    ),
    "paper": GPConfig(
        n_train=16384,
        n_test=4096,
        n_val=4096,
        dim=128,
        hidden_dim=512,
        train_steps=20_000,
        batch_size=512,
        lr=1e-3,
        eval_every=500,
        device="auto",
    ),
}


def scale_config(scale: str | GPConfig, **overrides) -> GPConfig:
    """The `GPConfig` of a named scale (or a given config), with fields replaced by `overrides`."""
    if isinstance(scale, GPConfig):
        cfg = scale
    elif scale in _SCALE_CONFIGS:
        cfg = _SCALE_CONFIGS[scale]
    else:
        raise ValueError(f"unknown scale {scale!r}; expected one of {', '.join(map(repr, GP_SCALES))} or a GPConfig")
    return replace(cfg, **overrides) if overrides else cfg


def _check_kernel(kernel: str) -> None:
    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}; expected one of {', '.join(map(repr, KERNELS))}")
