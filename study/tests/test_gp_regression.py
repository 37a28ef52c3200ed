"""Table 3 (GP regression): GP samples, kernels, FLOPs count, the tiny study end to end with resume."""

import json
import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from cem_study import gp_regression as gp

CFG = gp.scale_config("tiny")


@pytest.fixture(autouse=True)
def _one_thread():
    """The matmuls here are tiny: one intra-op thread is faster, and far faster on a busy shared CPU."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_gp_samples_have_the_kernel_covariance():
    """Empirical covariance of many joint draws at a few points equals K (std error ~ sqrt(2/n) ~ 0.01)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(5, 10, generator=gen, dtype=torch.float64) * 2 - 1
    x[1] = x[0] + 0.2  # a close pair, strongly correlated
    for kernel in gp.KERNELS:
        f = gp.sample_gp(kernel, x, CFG, n_draws=20_000, generator=gen)
        emp = f.T @ f / len(f)  # zero-mean process
        k = gp.kernel_matrix(kernel, x, x, CFG)
        assert k[0, 1] > 0.5
        torch.testing.assert_close(emp, k, atol=0.05, rtol=0)
        assert f.mean(0).abs().max() < 0.05


def test_dataset_is_seeded_and_noisy():
    a = gp.sample_gp_dataset("rbf", 3, CFG)
    b = gp.sample_gp_dataset("rbf", 3, CFG)
    c = gp.sample_gp_dataset("nonstationary", 3, CFG)
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_test, b.y_test)
    assert not torch.equal(a.y_train, c.y_train)
    assert a.x_train.shape == (CFG.n_train, 10) and a.y_test.shape == (CFG.n_test,)
    assert a.x_train.abs().max() <= 1
    noise = torch.cat([a.y_train - a.f_train, a.y_test - a.f_test])
    assert abs(noise.std().item() - CFG.noise_std) < 0.02
    v = gp.sample_gp_dataset("rbf", 0, gp.scale_config("tiny", n_val=64))
    assert v.x_val.shape == (64, 10) and v.y_val.shape == (64,)


def test_nonstationary_kernel_is_psd_and_nonstationary():
    gen = torch.Generator().manual_seed(1)
    x = torch.rand(300, 10, generator=gen, dtype=torch.float64) * 2 - 1
    k = gp.kernel_matrix("nonstationary", x, x, CFG)
    torch.testing.assert_close(k, k.T)
    assert torch.linalg.eigvalsh(k).min() > -1e-9
    torch.testing.assert_close(k.diagonal(), torch.ones(300, dtype=torch.float64))  # constant variance
    # the same displacement gives a different correlation in different places: not stationary ...
    delta = torch.full((1, 10), 0.25, dtype=torch.float64)
    base = torch.zeros(1, 10, dtype=torch.float64)
    left, right = base.clone(), base.clone()
    left[0, 0], right[0, 0] = -0.8, 0.8
    kl = gp.kernel_matrix("nonstationary", left, left + delta, CFG).item()
    kr = gp.kernel_matrix("nonstationary", right, right + delta, CFG).item()
    assert kr > kl + 0.2  # longer lengthscale for large x_1: smoother, more correlated
    # ... while the RBF kernel is
    rl = gp.kernel_matrix("rbf", left, left + delta, CFG).item()
    rr = gp.kernel_matrix("rbf", right, right + delta, CFG).item()
    assert rl == pytest.approx(rr, rel=1e-12)


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"precond": "diag"},
        {"precond": "diag_lowrank", "precond_rank": 3},
        {"embed": "identity", "dim": 10},
    ],
)
@pytest.mark.parametrize("steps", [1, 3, 8])
def test_flops_match_flop_counter(kw, steps):
    cfg = gp.scale_config("tiny", **kw)
    model = gp.CEMRegressor.from_config(cfg, steps)
    batch = 7
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(torch.randn(batch, 10))
    assert counter.get_total_flops() == batch * gp.config_flops(cfg, steps)


def test_params_identical_across_steps_and_init_shared():
    models = []
    for t in (1, 2, 4, 8):
        torch.manual_seed(0)
        models.append(gp.CEMRegressor.from_config(CFG, t))
    n = gp.count_params(models[0])
    assert n == 10 * CFG.dim + CFG.dim + 2 * CFG.dim * CFG.hidden_dim + CFG.dim + CFG.dim + 1
    for m in models[1:]:
        assert gp.count_params(m) == n
        for p, q in zip(models[0].parameters(), m.parameters()):
            assert torch.equal(p, q)


def test_regressor_learns_rbf_draw():
    """A short training run beats both the mean predictor (nRMSE 1) and a linear fit by a clear margin."""
    cfg = gp.scale_config(
        "tiny", n_train=1024, n_test=256, train_steps=400, batch_size=128, hidden_dim=64, lr=1e-2
    )
    data = gp.sample_gp_dataset("rbf", 0, cfg)
    row = gp.run_cell("rbf", 2, 0, cfg, data)
    ones = torch.ones(cfg.n_train, 1, dtype=torch.float64)
    w = torch.linalg.lstsq(torch.cat([data.x_train, ones], 1), data.y_train[:, None]).solution
    lin = torch.cat([data.x_test, ones[: cfg.n_test]], 1) @ w
    lin_nrmse = ((lin.squeeze(1) - data.y_test).pow(2).mean().sqrt() / data.y_test.std(correction=0)).item()
    assert row["nrmse"] < 0.5
    assert row["nrmse"] < 0.75 * lin_nrmse
    assert row["rmse"] > gp.gp_oracle_rmse(data, cfg) * 0.9  # cannot beat the Bayes predictor by much


def test_run_cell_is_deterministic_with_early_stopping():
    cfg = gp.scale_config("tiny", n_val=64, train_steps=60, eval_every=20)
    a = gp.run_cell("nonstationary", 2, 1, cfg)
    b = gp.run_cell("nonstationary", 2, 1, cfg)
    assert a["rmse"] == b["rmse"] and a["best_step"] == b["best_step"]
    assert a["best_step"] in (20, 40, 60) and math.isfinite(a["val_rmse"])


@pytest.mark.slow
def test_tiny_study_end_to_end_with_resume(tmp_path, monkeypatch):
    calls = []
    real = gp.run_cell

    def counting(*args, **kw):
        calls.append(args[:3])
        return real(*args, **kw)

    monkeypatch.setattr(gp.study, "run_cell", counting)  # the study calls its own module's run_cell
    kw = dict(kernels=("rbf", "nonstationary"), seeds=(0,), scale="tiny", out_dir=tmp_path, progress=False)
    first = gp.run_gp_study(steps=(1,), **kw)
    assert len(first) == 2 and len(calls) == 2
    rows = gp.run_gp_study(steps=(1, 2), **kw)  # resumes: only the T=2 cells are new
    assert len(rows) == 4 and len(calls) == 4 and {c[1] for c in calls[2:]} == {2}
    again = gp.run_gp_study(steps=(1, 2), **kw)  # everything done: no new work
    assert len(calls) == 4 and again == rows
    for name in ("rows.jsonl", "summary.json", "table3.md", "table3.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert len((tmp_path / "rows.jsonl").read_text().splitlines()) == 4
    for r in rows:
        assert math.isfinite(r["rmse"]) and r["nrmse"] > 0 and r["gp_oracle_rmse"] > 0
    by = {(r["kernel"], r["steps"]): r for r in rows}
    for k in ("rbf", "nonstationary"):
        assert by[(k, 1)]["params"] == by[(k, 2)]["params"]
        assert by[(k, 2)]["flops"] - by[(k, 1)]["flops"] == 4 * CFG.dim * CFG.hidden_dim
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["meta"]["scale"] == "tiny" and len(summary["summary"]) == 4
    assert "| rbf | 2 |" in (tmp_path / "table3.md").read_text()
    # a different configuration does not reuse the rows
    gp.run_gp_study(steps=(1,), kernels=("rbf",), seeds=(0,), scale="tiny", out_dir=tmp_path, progress=False, lr=5e-3)
    assert len(calls) == 5


def test_summarize_and_format():
    rows = [
        {"kernel": "rbf", "steps": t, "seed": s, "rmse": r, "nrmse": r, "rmse_f": r, "train_rmse": r, "wall_s": 1.0,
         "gp_oracle_rmse": 0.1, "params": 5, "flops": 100 * t}
        for t, s, r in [(1, 0, 0.2), (1, 1, 0.4), (2, 0, 0.1), (2, 1, 0.4)]
    ]
    s = gp.summarize(rows)
    assert [(x["kernel"], x["steps"]) for x in s] == [("rbf", 1), ("rbf", 2)]
    assert s[0]["rmse_mean"] == pytest.approx(0.3) and s[0]["rmse_std"] == pytest.approx(math.sqrt(0.02))
    assert s[1]["rel_t1_mean"] == pytest.approx(-0.25) and s[0]["rel_t1_mean"] == 0
    table = gp.format_table(s)
    assert "0.3000 ± 0.1414" in table and "-25.0%" in table


def test_bad_arguments():
    with pytest.raises(ValueError, match="scale"):
        gp.scale_config("huge")
    with pytest.raises(ValueError, match="kernel"):
        gp.kernel_matrix("matern", torch.zeros(1, 10), torch.zeros(1, 10), CFG)
    with pytest.raises(ValueError, match="embed"):
        gp.CEMRegressor(10, 16, 8, embed="identity")
