"""Synthetic data: GP kernels (RBF, Gibbs), joint draws of train/validation/test functions, and the
GP posterior mean with the true kernel as the RMSE floor."""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch
from torch import Tensor

from .config import GPConfig, _check_kernel


# -------------------------------------------------------------------------------------------- kernels


def _sqdist(a: Tensor, b: Tensor) -> Tensor:
    """|a_i - b_j|², shape (len(a), len(b)), built in place (large draws run close to memory limits)."""
    d2 = a @ b.T
    d2.mul_(-2).add_((a * a).sum(-1)[:, None]).add_((b * b).sum(-1)[None, :])
    return d2.clamp_min_(0)


def rbf_kernel(a: Tensor, b: Tensor, lengthscale: float, variance: float = 1.0) -> Tensor:
    """k(x, x') = σ² exp(-|x - x'|² / 2ℓ²), shape (len(a), len(b))."""
    return _sqdist(a, b).mul_(-1 / (2 * lengthscale**2)).exp_().mul_(variance)


def gibbs_lengthscale(x: Tensor, lengthscale: float, alpha: float) -> Tensor:
    """ℓ(x) = ℓ0 exp(α x_1): the lengthscale grows along the first input coordinate."""
    return lengthscale * torch.exp(alpha * x[:, 0])


def gibbs_kernel(a: Tensor, b: Tensor, lengthscale: float, alpha: float, variance: float = 1.0) -> Tensor:
    """Gibbs (1997) non-stationary kernel with an isotropic input-dependent lengthscale ℓ(x):

        k(x, x') = σ² (2 ℓ(x) ℓ(x') / (ℓ(x)² + ℓ(x')²))^(d/2) exp(-|x - x'|² / (ℓ(x)² + ℓ(x')²))

    positive semi-definite for any positive ℓ(·) (Gibbs 1997; Paciorek & Schervish 2004), k(x, x) = σ²:
    the marginal variance is constant, only the correlation length varies with x.
    """
    la = gibbs_lengthscale(a, lengthscale, alpha)[:, None]
    lb = gibbs_lengthscale(b, lengthscale, alpha)[None, :]
    s = la**2 + lb**2
    k = (la * lb).mul_(2).div_(s).pow_(a.shape[-1] / 2)
    return k.mul_(_sqdist(a, b).div_(s).neg_().exp_()).mul_(variance)


def kernel_matrix(kernel: str, a: Tensor, b: Tensor, cfg: GPConfig) -> Tensor:
    """The covariance between the inputs `a` and `b` under the named kernel of the study."""
    _check_kernel(kernel)
    if kernel == "rbf":
        return rbf_kernel(a, b, cfg.ell)
    return gibbs_kernel(a, b, cfg.ell, cfg.ns_alpha)


def stable_cholesky(k: Tensor, jitter: float = 1e-8, max_tries: int = 8) -> Tensor:
    """Lower Cholesky factor of `k + δ I`, δ = jitter·mean(diag) grown ×10 until it succeeds."""
    scale = k.diagonal().mean().item()
    eye = torch.eye(k.shape[0], dtype=k.dtype, device=k.device)
    for i in range(max_tries):
        chol, info = torch.linalg.cholesky_ex(k + jitter * 10**i * scale * eye)
        if int(info) == 0:
            return chol
    raise RuntimeError(f"Cholesky failed even with jitter {jitter * 10 ** (max_tries - 1) * scale:g}")


# ----------------------------------------------------------------------------------------------- data


@dataclass
class GPData:
    """One draw: inputs, noisy targets y = f + ε and the noiseless f, train and test (float64)."""

    kernel: str
    seed: int
    x_train: Tensor
    y_train: Tensor
    f_train: Tensor
    x_test: Tensor
    y_test: Tensor
    f_test: Tensor
    x_val: Tensor | None = None
    y_val: Tensor | None = None


def data_seed(kernel: str, seed: int) -> int:
    """The generator seed of the (kernel, seed) draw: stable across runs and independent of kernel order."""
    _check_kernel(kernel)
    return (int(seed) * 1_000_003 + zlib.crc32(kernel.encode())) % 2**63


def sample_gp(
    kernel: str,
    x: Tensor,
    cfg: GPConfig,
    n_draws: int = 1,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    """`n_draws` joint draws of f ~ GP(0, k) at the inputs x (float64, CPU), shape (n_draws, len(x)):
    f = L z with L the Cholesky factor of K(x, x) + jitter, z ~ N(0, I) from `generator` (CPU)."""
    device = torch.device("cpu") if device is None else torch.device(device)
    z = torch.randn(len(x), n_draws, generator=generator, dtype=torch.float64)
    xd = x.to(device, torch.float64)
    chol = stable_cholesky(kernel_matrix(kernel, xd, xd, cfg))
    return (chol @ z.to(device)).T.cpu()


def sample_gp_dataset(kernel: str, seed: int, cfg: GPConfig, device: torch.device | str | None = None) -> GPData:
    """x ~ U[-1,1]^d, f ~ GP(0, k) jointly on train+test(+val) points, y = f + N(0, noise²); all float64.

    Random numbers come from a CPU generator seeded by `data_seed(kernel, seed)`, so the draw does not
    depend on the device the Cholesky runs on (up to round-off).
    """
    gen = torch.Generator().manual_seed(data_seed(kernel, seed))
    n = cfg.n_train + cfg.n_test + cfg.n_val
    x = torch.rand(n, cfg.input_dim, generator=gen, dtype=torch.float64) * 2 - 1
    f = sample_gp(kernel, x, cfg, generator=gen, device=device)[0]
    y = f + torch.randn(n, generator=gen, dtype=torch.float64) * cfg.noise_std
    tr, te, va = slice(0, cfg.n_train), slice(cfg.n_train, cfg.n_train + cfg.n_test), slice(cfg.n_train + cfg.n_test, n)
    val = (x[va], y[va]) if cfg.n_val > 0 else (None, None)
    return GPData(kernel, seed, x[tr], y[tr], f[tr], x[te], y[te], f[te], *val)


def gp_oracle_rmse(data: GPData, cfg: GPConfig, device: torch.device | str | None = None) -> float:
    """Test RMSE (against the noisy y_test) of the GP posterior mean with the true kernel and noise: the
    Bayes-optimal predictor under squared loss, a reference floor for the learned regressors."""
    device = torch.device("cpu") if device is None else torch.device(device)
    xtr, xte = data.x_train.to(device), data.x_test.to(device)
    ktr = kernel_matrix(data.kernel, xtr, xtr, cfg)
    ktr = ktr + cfg.noise_std**2 * torch.eye(len(xtr), dtype=ktr.dtype, device=device)
    chol = stable_cholesky(ktr, jitter=1e-10)
    alpha = torch.cholesky_solve(data.y_train.to(device)[:, None], chol)
    mean = (kernel_matrix(data.kernel, xte, xtr, cfg) @ alpha).squeeze(-1).cpu()
    return float(torch.sqrt(((mean - data.y_test) ** 2).mean()))
