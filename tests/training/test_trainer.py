"""Training end to end on CPU: results, exact resume, bad input, divergence, checkpoints."""

import json

import pytest
import torch

from cem.cli import main
from cem.training import Interrupted, TrainingError, find_checkpoint, load_checkpoint, load_run_config, train, verify_checkpoint


def run_cfg(tiny_args, **kw):
    return load_run_config(None, kw.pop("overrides", ["context=32"]), **{**tiny_args, **kw})


def losses(run_dir):
    return [r["loss"] for r in map(json.loads, open(run_dir / "metrics.jsonl")) if "loss" in r]


def test_train_writes_results(tiny_args, tmp_path):
    res = train(run_cfg(tiny_args, max_steps=6, arch="cem"), tmp_path / "run", progress=False)
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    for key in ("test_loss", "test_perplexity", "test_bits_per_byte", "parameters", "tokens_seen", "wall_time_s"):
        assert key in saved
    assert saved["tokens_seen"] == 6 * 4 * 32
    assert res["test_loss"] < 5.0  # below uniform over 257 byte symbols (5.55)
    assert (tmp_path / "run" / "tokenizer").is_dir() and (tmp_path / "run" / "metrics.csv").is_file()


@pytest.mark.parametrize("arch", ["llama", "cem-t2"])
def test_resume_is_exact(tiny_args, tmp_path, arch):
    cfg = run_cfg(tiny_args, max_steps=8, arch=arch, grad_accum=2)
    train(cfg, tmp_path / "a", progress=False)
    stopped = train(cfg, tmp_path / "b", progress=False, stop_at=3)
    assert isinstance(stopped, Interrupted) and stopped.step == 3
    with pytest.raises(ValueError, match="pass --resume"):
        train(cfg, tmp_path / "b", progress=False)
    train(cfg, tmp_path / "b", resume=True, progress=False)
    assert losses(tmp_path / "a") == losses(tmp_path / "b")
    a = json.loads((tmp_path / "a" / "results.json").read_text())
    b = json.loads((tmp_path / "b" / "results.json").read_text())
    assert a["test_loss"] == b["test_loss"]


def test_resume_with_different_model_is_refused(tiny_args, tmp_path):
    train(run_cfg(tiny_args, max_steps=2), tmp_path / "r", progress=False, stop_at=1)
    with pytest.raises(ValueError, match="different run \\(model differs\\)"):
        train(run_cfg(tiny_args, max_steps=2, overrides=["context=32", "attn_steps=2"]), tmp_path / "r", resume=True, progress=False)
    with pytest.raises(ValueError, match="tokenizer differs"):
        train(run_cfg(tiny_args, max_steps=2, tokenizer="bpe:300"), tmp_path / "r", resume=True, progress=False)


@pytest.mark.parametrize("lr", [1e6, 1e3, 30.0])
def test_divergence_stops_and_keeps_last_checkpoint(tiny_args, tmp_path, lr):
    """Finite blow-ups too (lr 1e3 gave a loss of 558,693 and weights of 3.7e9 before the guard): the run
    stops, says so, and no checkpoint ever holds the blown-up weights, nor is any called good."""
    cfg = run_cfg(tiny_args, max_steps=40, lr=lr, overrides=["context=32", "save_every=1", "warmup_frac=0"])
    with pytest.raises(TrainingError, match="diverged") as err:
        train(cfg, tmp_path / "r", progress=False)
    assert "good" not in str(err.value)
    ckpt = find_checkpoint(tmp_path / "r")
    if ckpt is None:
        assert "no checkpoint had been written yet" in str(err.value)
        return
    verify_checkpoint(ckpt)
    assert f"{ckpt} (step " in str(err.value)
    model, _ = load_checkpoint(ckpt)
    assert max(p.abs().max().item() for p in model.parameters()) < 100


def test_healthy_run_resumes_with_its_guard(tiny_args, tmp_path):
    cfg = run_cfg(tiny_args, max_steps=6, overrides=["context=32", "diverge_warmup=2"])
    train(cfg, tmp_path / "r", progress=False, stop_at=3)
    _, state = load_checkpoint(find_checkpoint(tmp_path / "r"))
    assert len(state["guard"]["losses"]) == 3
    assert train(cfg, tmp_path / "r", resume=True, progress=False)["steps"] == 6


def test_corrupted_checkpoint_is_detected(tiny_args, tmp_path):
    train(run_cfg(tiny_args, max_steps=3), tmp_path / "r", progress=False, stop_at=2)
    weights = tmp_path / "r" / "ckpt" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(ValueError, match="corrupted: model.safetensors"):
        train(run_cfg(tiny_args, max_steps=3), tmp_path / "r", resume=True, progress=False)


def test_short_corpus_error(tiny_args, tmp_path):
    d = tmp_path / "short"
    d.mkdir()
    for s in ("train", "valid", "test"):
        (d / f"{s}.txt").write_text("tiny")
    with pytest.raises(ValueError, match="fewer than one sequence"):
        train(run_cfg({**tiny_args, "data": str(d)}, max_steps=2), tmp_path / "r", progress=False)


def test_cli_errors_are_one_line(tiny_args, tmp_path, capsys):
    assert main(["train", "--data", "no-such-corpus", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cem train: error:") and "Traceback" not in err and err.count("\n") == 1
    assert main(["train", "--preset", "nope", "--data", tiny_args["data"], "--out", str(tmp_path / "x")]) == 2
    assert "unknown preset 'nope'" in capsys.readouterr().err
    assert main(["train", "--data", tiny_args["data"], "--out", str(tmp_path / "x"), "bogus=1"]) == 2
    assert "unknown config key 'bogus'" in capsys.readouterr().err
    assert main(["eval", "--ckpt", str(tmp_path / "missing")]) == 2
    assert "no run or model directory" in capsys.readouterr().err


def test_cli_train_eval_generate(tiny_args, tmp_path, capsys):
    out = str(tmp_path / "run")
    args = ["train", "--data", tiny_args["data"], "--preset", "tiny", "--arch", "cem", "--max-steps", "4", "--batch-size", "4",
            "--out", out, "--quiet", "context=32", "tensorboard=false", "final_eval_tokens=0"]
    assert main(args) == 0
    final = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert main(["eval", "--ckpt", out, "--split", "test", "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["loss"] == pytest.approx(final["test_loss"], rel=1e-6)
    assert metrics["bits_per_byte"] == pytest.approx(final["test_bits_per_byte"], rel=1e-6)
    assert main(["generate", "--ckpt", out, "--prompt", "the ", "--max-new-tokens", "10", "--steps", "2"]) == 0
    assert capsys.readouterr().out.startswith("the ")
    assert main(["generate", "--ckpt", out, "--prompt", "the ", "--max-new-tokens", "5", "--steps", "4", "--adaptive-tol", "1e-3", "--guard", "2"]) == 0
    assert capsys.readouterr().out.startswith("the ")
    assert main(["generate", "--ckpt", out, "--max-new-tokens", "2", "--adaptive-tol", "-1"]) == 2
    assert "adaptive_tol" in capsys.readouterr().err
    assert main(["info", "--preset", "134M", "--arch", "cem"]) == 0
    assert "| attention | 28.312M | 14.165M | 0.500 |" in capsys.readouterr().out
