"""Training one regressor (Adam, the project's warm-up + cosine schedule, best-validation checkpoint),
prediction and test metrics."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from cem.training.schedule import lr_factor
from .config import GPConfig
from .data import GPData
from .model import CEMRegressor


# ------------------------------------------------------------------------------------------- training


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
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, cfg.train_steps, cfg.warmup, cfg.min_lr_ratio))
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
