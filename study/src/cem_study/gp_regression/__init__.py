"""Table 3: within-layer recursion on synthetic Gaussian-process regression (10 input dimensions).

The paper reports "model size, compute, and RMSE (mean ± std) on synthetic data sampled from Gaussian
processes with 10 input dimensions" for recursive CEM MLPs with T ∈ {1, 2, 4, 8}, on an RBF and a
non-stationary kernel, but leaves the protocol open. This package fixes one (docs/experiments/table3.md):

* Data. x ~ Uniform[-1, 1]^10; f ~ GP(0, k) drawn jointly on the train, test (and validation) inputs
  (float64 Cholesky with jitter); y = f + ε, ε ~ N(0, 0.1²). One function per (kernel, seed); the same
  draw and the same initialisation for every T (a paired comparison).
* Kernels. "rbf": k = exp(-|x - x'|² / 2ℓ²) with ℓ = 0.5·sqrt(10) (ℓ ∝ sqrt(d): two inputs at the mean
  squared distance 2d/3 have correlation exp(-4/3) ≈ 0.26 in any dimension). "nonstationary": the Gibbs
  kernel with an input-dependent lengthscale ℓ(x) = ℓ0·exp(α x₁), ℓ0 = 0.5·sqrt(10), α = 0.75 (ℓ from 0.75
  to 3.3: wiggly on one side of the cube, almost linear on the other), unit variance everywhere.
* Model. `CEMRegressor`: linear embedding R^10 -> R^D, one `CEMMLP(D, m, recursion=Recursion(steps=T))` (weights shared across
  the T steps: the recursion), linear readout R^D -> R; each point is a length-1 sequence.
* Training. Adam, a fixed number of steps, identical hyperparameters across T; standardised targets;
  with validation points (`n_val > 0`, the "cpu"/"gpu"/"paper" scales) the best-validation checkpoint.
* Metric. Test RMSE in units of y (and divided by std(y_test)), mean ± std over seeds; parameters
  (identical across T) and forward matmul FLOPs per example (`regressor_flops`); the GP posterior mean
  with the true kernel (`gp_oracle_rmse`) as the floor.

On a busy or small CPU call `torch.set_num_threads(1)` first: the matmuls are small and one intra-op
thread is faster.

Modules, one job each: `config` (GPConfig, the scales), `data` (kernels, draws, the GP oracle), `model`
(CEMRegressor, parameters, FLOPs), `training` (fit, predict, metrics), `study` (one cell, the whole
study), `summary` (over seeds, the table), `plots` (the figure).
"""

from .config import GP_SCALES, KERNELS, GPConfig, scale_config
from .data import GPData, data_seed, gibbs_kernel, gibbs_lengthscale, gp_oracle_rmse, kernel_matrix, rbf_kernel, sample_gp, sample_gp_dataset, stable_cholesky
from .model import CEMRegressor, config_flops, count_params, regressor_flops
from .plots import plot_table3
from .study import run_cell, run_gp_study
from .summary import format_table, summarize
from .training import evaluate_regressor, predict, train_regressor

__all__ = [
    "CEMRegressor",
    "GPConfig",
    "GPData",
    "GP_SCALES",
    "KERNELS",
    "config_flops",
    "count_params",
    "data_seed",
    "evaluate_regressor",
    "format_table",
    "gibbs_kernel",
    "gibbs_lengthscale",
    "gp_oracle_rmse",
    "kernel_matrix",
    "plot_table3",
    "predict",
    "rbf_kernel",
    "regressor_flops",
    "run_cell",
    "run_gp_study",
    "sample_gp",
    "sample_gp_dataset",
    "scale_config",
    "stable_cholesky",
    "summarize",
    "train_regressor",
]
