import pytest

from cem.training import apply_overrides, load_run_config, lr_factor


def test_overrides_and_types(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("train:\n  lr: 0.001\nmodel:\n  attn_steps: 2\nbatch_size: 3\n")
    run = load_run_config(cfg_file, ["kq_diag=per_head", "model.mlp_steps=3", "compile=true", "max_steps=1e3"], arch="cem")
    assert run.train.lr == 0.001 and run.train.batch_size == 3 and run.train.compile is True and run.train.max_steps == 1000
    assert run.model_overrides == {"attn_steps": 2, "kq_diag": "per_head", "mlp_steps": 3}
    cfg = run.model(vocab_size=300)
    assert cfg.attn_steps == 2 and cfg.mlp_steps == 3 and cfg.vocab_size == 300 and cfg.attn == "cem"


@pytest.mark.parametrize(
    "items,match",
    [
        ({"lrr": "1"}, "unknown config key 'lrr'"),
        ({"lr": "fast"}, "bad value for lr: 'fast' is not a float"),
        ({"attn_steps": "two"}, "bad value for attn_steps"),
        ({"compile": "maybe"}, "bad value for compile"),
        ({"optim.lr": "1"}, "unknown config key"),
    ],
)
def test_bad_overrides(items, match):
    from cem.training import RunConfig

    with pytest.raises(ValueError, match=match):
        apply_overrides(RunConfig(), items)


def test_bad_model_override_is_caught_when_building():
    run = load_run_config(None, ["kq_diag=full"])
    with pytest.raises(ValueError, match="unknown kq_diag 'full'"):
        run.model(100)


def test_schedule():
    total = 1000
    assert lr_factor(0, total) == pytest.approx(1 / 50)
    assert lr_factor(49, total) == pytest.approx(1.0)
    assert lr_factor(999, total) == pytest.approx(0.1, abs=1e-4)
    mid = lr_factor(50 + 475, total)
    assert mid == pytest.approx(0.55, abs=1e-3)
    assert all(lr_factor(s, total) >= lr_factor(s + 1, total) for s in range(50, 999))


def test_token_budgets():
    from cem.training.trainer import total_steps

    run = load_run_config(None, ["batch_size=4", "grad_accum=2"], preset="tiny", arch="cem-t2", tokens="chinchilla")
    cfg = run.model(vocab_size=257)
    # 20 tokens per parameter of the matching Llama baseline (not of the smaller CEM model)
    from cem.model import LanguageModel, model_config, parameter_breakdown

    llama = parameter_breakdown(LanguageModel(model_config("tiny", "llama", vocab_size=257)))["total"]
    tokens_per_step = 4 * 2 * 128
    assert total_steps(run, cfg, 128, 1) == -(-20 * llama // tokens_per_step)
    assert total_steps(run, cfg, 128, 2) == -(-20 * llama // (2 * tokens_per_step))
    run = load_run_config(None, ["tokens=1e5", "batch_size=4"], preset="tiny")
    assert total_steps(run, run.model(257), 100, 1) == 250
    with pytest.raises(ValueError, match="tokens must be a number or 'chinchilla'"):
        total_steps(load_run_config(None, ["tokens=lots"]), cfg, 128, 1)
    with pytest.raises(ValueError, match="no training budget"):
        total_steps(load_run_config(None, []), cfg, 128, 1)
