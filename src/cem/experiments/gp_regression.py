"""Table 3: within-layer recursion on synthetic Gaussian-process regression (10 input dimensions).

The paper reports "model size, compute, and RMSE (mean ± std) on synthetic data sampled from Gaussian
processes with 10 input dimensions" for recursive CEM MLPs with T ∈ {1, 2, 4, 8}, on an RBF and a
non-stationary kernel, but leaves the protocol open. This module fixes one (docs/experiments/table3.md):

* Data. x ~ Uniform[-1, 1]^10; f ~ GP(0, k) drawn jointly on the train, test (and validation) inputs
  (float64 Cholesky with jitter); y = f + ε, ε ~ N(0, 0.1²). One function per (kernel, seed); the same
  draw and the same initialisation for every T (a paired comparison).
* Kernels. "rbf": k = exp(-|x - x'|² / 2ℓ²) with ℓ = 0.5·sqrt(10) (ℓ ∝ sqrt(d): two inputs at the mean
  squared distance 2d/3 have correlation exp(-4/3) ≈ 0.26 in any dimension). "nonstationary": the Gibbs
  kernel with an input-dependent lengthscale ℓ(x) = ℓ0·exp(α x₁), ℓ0 = 0.5·sqrt(10), α = 0.75 (ℓ from 0.75
  to 3.3: wiggly on one side of the cube, almost linear on the other), unit variance everywhere.
* Model. `CEMRegressor`: linear embedding R^10 -> R^D, one `CEMMLP(D, m, steps=T)` (weights shared across
  the T steps: the recursion), linear readout R^D -> R; each point is a length-1 sequence.
* Training. Adam, a fixed number of steps, identical hyperparameters across T; standardised targets;
  with validation points (`n_val > 0`, the "cpu"/"gpu"/"paper" scales) the best-validation checkpoint.
* Metric. Test RMSE in units of y (and divided by std(y_test)), mean ± std over seeds; parameters
  (identical across T) and forward matmul FLOPs per example (`regressor_flops`); the GP posterior mean
  with the true kernel (`gp_oracle_rmse`) as the floor.

On a busy or small CPU call `torch.set_num_threads(1)` first: the matmuls are small and one intra-op
thread is faster.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
import zlib
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..layers import CEMMLP

KERNELS = ("rbf", "nonstationary")
SCALES = ("tiny", "cpu", "gpu", "paper")


# --------------------------------------------------------------------------------------------- config


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
        raise ValueError(f"unknown scale {scale!r}; expected one of {', '.join(map(repr, SCALES))} or a GPConfig")
    return replace(cfg, **overrides) if overrides else cfg


def _device(cfg: GPConfig) -> torch.device:
    if cfg.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(cfg.device)


def _check_kernel(kernel: str) -> None:
    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}; expected one of {', '.join(map(repr, KERNELS))}")


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


# ---------------------------------------------------------------------------------------------- model


class CEMRegressor(nn.Module):
    """x -> embed -> CEMMLP (T weight-tied descent steps, residual inside) -> linear readout -> ŷ.

    `embed="identity"` skips the embedding (then `dim` must equal `input_dim`): the latent state is the
    input itself, the other reading of the paper's truncated "latent state dimension is set equal to ...".
    """

    def __init__(
        self,
        input_dim: int,
        dim: int,
        hidden_dim: int,
        *,
        steps: int = 1,
        step_size: float = 1.0,
        precond: str = "identity",
        precond_rank: int = 16,
        energy: str = "gated",
        embed: str = "linear",
    ) -> None:
        super().__init__()
        if embed not in ("linear", "identity"):
            raise ValueError(f"unknown embed {embed!r}; expected 'linear' or 'identity'")
        if embed == "identity" and dim != input_dim:
            raise ValueError(f"embed='identity' needs dim == input_dim, got {dim} != {input_dim}")
        self.input_dim = input_dim
        self.embed = nn.Linear(input_dim, dim) if embed == "linear" else nn.Identity()
        self.cem = CEMMLP(
            dim, hidden_dim, steps=steps, step_size=step_size, precond=precond, precond_rank=precond_rank, energy=energy
        )
        self.readout = nn.Linear(dim, 1)

    @property
    def steps(self) -> int:
        return self.cem.steps

    @steps.setter
    def steps(self, value: int) -> None:
        self.cem.steps = value

    def forward(self, x: Tensor) -> Tensor:
        """(N, input_dim) -> (N,): each point is a sequence of length one, shape (N, 1, D) for the CEM layer."""
        h = self.embed(x).unsqueeze(1)
        return self.readout(self.cem(h)).squeeze(-1).squeeze(-1)

    @classmethod
    def from_config(cls, cfg: GPConfig, steps: int) -> "CEMRegressor":
        return cls(
            cfg.input_dim,
            cfg.dim,
            cfg.hidden_dim,
            steps=steps,
            step_size=cfg.step_size,
            precond=cfg.precond,
            precond_rank=cfg.precond_rank,
            energy=cfg.energy,
            embed=cfg.embed,
        )


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def regressor_flops(
    input_dim: int,
    dim: int,
    hidden_dim: int,
    steps: int,
    *,
    precond: str = "identity",
    precond_rank: int = 16,
    embed: str = "linear",
) -> int:
    """Forward matmul FLOPs per example (2 per multiply-add; norms, activations, biases not counted):

        embedding 2·d_in·D  +  gate 2·D·m (once)  +  T·(up 2·D·m + its transpose 2·D·m [+ low-rank P 8·D·R])
        +  readout 2·D

    This is what `torch.utils.flop_counter.FlopCounterMode` counts on the same forward pass.
    """
    per_step = 4 * dim * hidden_dim + (8 * dim * precond_rank if precond == "diag_lowrank" else 0)
    emb = 2 * input_dim * dim if embed == "linear" else 0
    return emb + 2 * dim * hidden_dim + steps * per_step + 2 * dim


def config_flops(cfg: GPConfig, steps: int) -> int:
    return regressor_flops(
        cfg.input_dim,
        cfg.dim,
        cfg.hidden_dim,
        steps,
        precond=cfg.precond,
        precond_rank=cfg.precond_rank,
        embed=cfg.embed,
    )


# ------------------------------------------------------------------------------------------- training


def _lr_factor(step: int, cfg: GPConfig) -> float:
    warm = max(1, int(round(cfg.warmup * cfg.train_steps)))
    if step < warm:
        return (step + 1) / warm
    progress = (step - warm) / max(1, cfg.train_steps - warm)
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def train_regressor(model: CEMRegressor, data: GPData, cfg: GPConfig, seed: int) -> dict:
    """Adam(W) on the MSE of standardised targets for `cfg.train_steps` steps; returns the metrics.

    Without validation points the reported model is the last iterate. With `data.x_val` (cfg.n_val > 0)
    it is the checkpoint with the lowest validation RMSE, checked every `cfg.eval_every` steps and at the
    end (early stopping on held-out points of the same draw; the test set is never used for selection).
    """
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    y_mean, y_std = data.y_train.mean(), data.y_train.std()
    xtr = data.x_train.to(device, dtype)
    ytr = ((data.y_train - y_mean) / y_std).to(device, dtype)
    n = len(xtr)
    bs = n if cfg.batch_size <= 0 or cfg.batch_size >= n else cfg.batch_size
    gen = torch.Generator().manual_seed(int(seed) + 7919)  # minibatch order; the same for every T
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _lr_factor(s, cfg))
    perm, pos = torch.randperm(n, generator=gen), 0
    use_val = data.x_val is not None and len(data.x_val) > 0
    best = (math.inf, cfg.train_steps, None)  # (val rmse, step, state)

    def check(step: int) -> None:
        nonlocal best
        pred = predict(model, data.x_val, y_mean, y_std)
        val = float(torch.sqrt(((pred - data.y_val) ** 2).mean()))
        if val < best[0]:
            best = (val, step, {k: v.detach().clone() for k, v in model.state_dict().items()})
        model.train()

    model.train()
    for step in range(cfg.train_steps):
        if use_val and step > 0 and step % max(1, cfg.eval_every) == 0:
            check(step)
        if bs == n:
            xb, yb = xtr, ytr
        else:
            if pos + bs > n:
                perm, pos = torch.randperm(n, generator=gen), 0
            idx = perm[pos : pos + bs].to(device)
            pos += bs
            xb, yb = xtr[idx], ytr[idx]
        loss = F.mse_loss(model(xb), yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        sched.step()
    if not use_val:
        return {**evaluate_regressor(model, data, y_mean, y_std), "best_step": cfg.train_steps}
    check(cfg.train_steps)
    if best[2] is not None:
        model.load_state_dict(best[2])
    return {**evaluate_regressor(model, data, y_mean, y_std), "best_step": best[1], "val_rmse": best[0]}


@torch.no_grad()
def predict(model: CEMRegressor, x: Tensor, y_mean: Tensor, y_std: Tensor, batch: int = 8192) -> Tensor:
    """Predictions in units of y (float64, CPU)."""
    model.eval()
    p = next(model.parameters())
    out = [model(x[i : i + batch].to(p.device, p.dtype)).double().cpu() for i in range(0, len(x), batch)]
    return torch.cat(out) * y_std + y_mean


def evaluate_regressor(model: CEMRegressor, data: GPData, y_mean: Tensor, y_std: Tensor) -> dict:
    """Test RMSE against y (noisy) and f (noiseless), nRMSE = RMSE / std(y_test), train RMSE."""
    pred_te = predict(model, data.x_test, y_mean, y_std)
    pred_tr = predict(model, data.x_train, y_mean, y_std)
    rmse = float(torch.sqrt(((pred_te - data.y_test) ** 2).mean()))
    return {
        "rmse": rmse,
        "nrmse": rmse / float(data.y_test.std(correction=0)),
        "rmse_f": float(torch.sqrt(((pred_te - data.f_test) ** 2).mean())),
        "train_rmse": float(torch.sqrt(((pred_tr - data.y_train) ** 2).mean())),
        "y_test_std": float(data.y_test.std(correction=0)),
    }


def run_cell(kernel: str, steps: int, seed: int, cfg: GPConfig, data: GPData | None = None) -> dict:
    """Train and evaluate one (kernel, T, seed) cell; returns its row. Model init depends on the seed only
    (identical for every T), data on (kernel, seed)."""
    device = _device(cfg)
    if data is None:
        data = sample_gp_dataset(kernel, seed, cfg, device)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        model = CEMRegressor.from_config(cfg, steps).to(device)
        t0 = time.perf_counter()
        metrics = train_regressor(model, data, cfg, seed)
        if device.type == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    if not all(math.isfinite(metrics[k]) for k in ("rmse", "train_rmse")):
        metrics["diverged"] = True
    return {
        "kernel": kernel,
        "steps": int(steps),
        "seed": int(seed),
        **metrics,
        "params": count_params(model),
        "flops": config_flops(cfg, steps),
        "wall_s": wall,
        "device": str(device),
        "config_id": cfg.fingerprint(),
    }


# ---------------------------------------------------------------------------------------------- study


def _load_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut by an interrupted write
                continue
    return rows


def run_gp_study(
    kernels=KERNELS,
    steps=(1, 2, 4, 8),
    seeds=(0, 1, 2),
    scale: str | GPConfig = "cpu",
    out_dir: str | os.PathLike | None = None,
    progress: bool = True,
    **overrides,
) -> list[dict]:
    """Run every (kernel, T, seed) cell; returns the rows (one per cell, in kernel, seed, T order).

    `scale` is "tiny" | "cpu" | "gpu" | "paper" or a `GPConfig`; `overrides` replace config fields. With
    `out_dir`, each finished row is appended to out_dir/rows.jsonl at once, cells already there with the
    same config fingerprint are not rerun (an interrupted run resumes), and summary.json, table3.md and
    table3.png are (re)written at the end.
    """
    cfg = scale_config(scale, **overrides)
    for k in kernels:
        _check_kernel(k)
    steps = [int(t) for t in steps]
    seeds = [int(s) for s in seeds]
    fid = cfg.fingerprint()
    out = Path(out_dir) if out_dir is not None else None
    done: dict[tuple, dict] = {}
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        for r in _load_rows(out / "rows.jsonl"):
            if r.get("config_id") == fid:
                done[(r["kernel"], r["steps"], r["seed"])] = r
    device = _device(cfg)
    scale_name = scale if isinstance(scale, str) else "custom"
    rows = []
    total, i = len(kernels) * len(steps) * len(seeds), 0
    for kernel in kernels:
        for seed in seeds:
            todo = [t for t in steps if (kernel, t, seed) not in done]
            data = oracle = None
            if todo:
                data = sample_gp_dataset(kernel, seed, cfg, device)
                oracle = gp_oracle_rmse(data, cfg, device)
            for t in steps:
                i += 1
                key = (kernel, t, seed)
                if key in done:
                    rows.append(done[key])
                    continue
                row = run_cell(kernel, t, seed, cfg, data)
                row["gp_oracle_rmse"] = oracle
                row["scale"] = scale_name
                rows.append(row)
                if out is not None:
                    with open(out / "rows.jsonl", "a") as fh:
                        fh.write(json.dumps(row) + "\n")
                if progress:
                    print(
                        f"[table3 {i}/{total}] {kernel} T={t} seed={seed}: rmse {row['rmse']:.4f} "
                        f"(nrmse {row['nrmse']:.3f}, oracle {oracle:.4f}) {row['wall_s']:.1f}s",
                        file=sys.stderr,
                        flush=True,
                    )
    if out is not None:
        summary = summarize(rows)
        meta = {"scale": scale_name, "config": asdict(cfg), "config_id": fid}
        (out / "summary.json").write_text(json.dumps({"meta": meta, "summary": summary}, indent=2) + "\n")
        (out / "table3.md").write_text(format_table(summary, cfg) + "\n")
        plot_table3(summary, out / "table3.png")
    return rows


def _mean_std(values: list[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return mean, std


def summarize(rows: list[dict]) -> list[dict]:
    """Mean ± std (sample std, ddof 1; 0 for a single seed) over seeds per (kernel, T).

    `rel_t1` is the paired change against T=1 on the same seeds (same data, same init): the mean ± std of
    rmse_T / rmse_1 - 1, when T=1 is among the rows.
    """
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["kernel"], r["steps"]), []).append(r)
    base = {(r["kernel"], r["seed"]): r["rmse"] for r in rows if r["steps"] == 1}
    order = {k: i for i, k in enumerate(KERNELS)}
    out = []
    for (kernel, t), rs in sorted(groups.items(), key=lambda kv: (order.get(kv[0][0], 99), kv[0][0], kv[0][1])):
        s = {"kernel": kernel, "steps": t, "n_seeds": len(rs), "seeds": sorted(r["seed"] for r in rs)}
        for key in ("rmse", "nrmse", "rmse_f", "train_rmse", "wall_s", "gp_oracle_rmse"):
            vals = [r[key] for r in rs if r.get(key) is not None]
            if vals:
                s[f"{key}_mean"], s[f"{key}_std"] = _mean_std(vals)
        rel = [r["rmse"] / base[(kernel, r["seed"])] - 1 for r in rs if (kernel, r["seed"]) in base]
        if rel:
            s["rel_t1_mean"], s["rel_t1_std"] = _mean_std(rel)
        s["params"] = rs[0]["params"]
        s["flops"] = rs[0]["flops"]
        out.append(s)
    return out


def _fmt_flops(n: float) -> str:
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= div:
            return f"{n / div:.3g}{unit}"
    return str(int(n))


def format_table(summary: list[dict], cfg: GPConfig | None = None) -> str:
    """Markdown table of the summary (the paper's Table 3 layout plus the paired change against T=1)."""
    lines = []
    if cfg is not None:
        lines += [
            f"GP regression, d={cfg.input_dim}, {cfg.n_train} train / {cfg.n_val} validation / {cfg.n_test} test "
            f"points, noise std {cfg.noise_std}, ℓ0={cfg.ell:.3g}, Gibbs α={cfg.ns_alpha}; CEM MLP D={cfg.dim}, "
            f"m={cfg.hidden_dim}, η={cfg.step_size}, precond={cfg.precond}; Adam lr {cfg.lr} (cosine), weight decay "
            f"{cfg.weight_decay}, {cfg.train_steps} steps, batch {cfg.batch_size or 'full'}"
            + (f", best validation checkpoint (every {cfg.eval_every} steps)." if cfg.n_val > 0 else ", last iterate."),
            "",
        ]
    lines += [
        "| kernel | T | params | FLOPs/example | test RMSE | test nRMSE | vs T=1 (paired) | train RMSE "
        "| GP oracle RMSE | wall s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for s in summary:
        if s["steps"] == 1:
            rel = "(ref)"
        elif "rel_t1_mean" in s:
            rel = f"{100 * s['rel_t1_mean']:+.1f}% ± {100 * s['rel_t1_std']:.1f}%"
        else:
            rel = "-"
        oracle = f"{s['gp_oracle_rmse_mean']:.4f}" if "gp_oracle_rmse_mean" in s else "-"
        lines.append(
            f"| {s['kernel']} | {s['steps']} | {s['params']:,} | {_fmt_flops(s['flops'])} "
            f"| {s['rmse_mean']:.4f} ± {s['rmse_std']:.4f} | {s['nrmse_mean']:.3f} ± {s['nrmse_std']:.3f} "
            f"| {rel} | {s['train_rmse_mean']:.4f} | {oracle} | {s['wall_s_mean']:.1f} |"
        )
    n = sorted({s["n_seeds"] for s in summary})
    lines += [
        "",
        f"Mean ± sample std over {'/'.join(map(str, n))} seeds. RMSE against the noisy test targets, in units of y; "
        "nRMSE = RMSE / std(y_test). 'vs T=1': paired relative change of RMSE on the same data and init. "
        "GP oracle: posterior mean with the true kernel and noise.",
    ]
    return "\n".join(lines)


def plot_table3(summary: list[dict], path: str | os.PathLike) -> None:
    """Test RMSE vs T (log2 axis) with ±std error bars, one line per kernel; dashed: the GP oracle."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    kernels = list(dict.fromkeys(s["kernel"] for s in summary))
    for i, k in enumerate(kernels):
        ss = sorted((s for s in summary if s["kernel"] == k), key=lambda s: s["steps"])
        ts = [s["steps"] for s in ss]
        color = f"C{i}"
        ax.errorbar(
            ts,
            [s["rmse_mean"] for s in ss],
            yerr=[s["rmse_std"] for s in ss],
            marker="o",
            capsize=3,
            color=color,
            label=k,
        )
        oracle = [s["gp_oracle_rmse_mean"] for s in ss if "gp_oracle_rmse_mean" in s]
        if oracle:
            ax.axhline(sum(oracle) / len(oracle), color=color, ls="--", lw=0.8, label=f"{k} GP oracle")
    ax.set_xscale("log", base=2)
    all_t = sorted({s["steps"] for s in summary})
    ax.set_xticks(all_t)
    ax.set_xticklabels([str(t) for t in all_t])
    ax.set_xlabel("recursion steps T")
    ax.set_ylabel("test RMSE")
    ax.set_title("Table 3: recursive CEM MLP on GP regression (d=10)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
