"""Training end to end on CPU: results, exact resume, bad input, divergence, checkpoints."""

import json
import statistics

import pytest
import torch

from cem.training import Interrupted, TrainingError, find_checkpoint, load_checkpoint, load_run_config, train, verify_checkpoint
from cem.training.metrics import drop_duplicate_csv, metrics_csv, read_metrics


def run_cfg(tiny_args, **kw):
    return load_run_config(None, kw.pop("overrides", ["context=32"]), **{**tiny_args, **kw})


def losses(run_dir):
    return [r["loss"] for r in map(json.loads, open(run_dir / "metrics.jsonl")) if "loss" in r]


def untimed(records):
    """Metrics records without the measured speeds, which differ between two runs of the same steps."""
    return [{k: v for k, v in r.items() if k not in ("tokens_per_s", "mfu")} for r in records]


def test_train_writes_results(tiny_args, tmp_path):
    res = train(run_cfg(tiny_args, max_steps=6, arch="cem"), tmp_path / "run", progress=False)
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    for key in ("test_loss", "test_perplexity", "test_bits_per_byte", "parameters", "tokens_seen", "wall_time_s"):
        assert key in saved
    assert saved["tokens_seen"] == 6 * 4 * 32
    assert res["test_loss"] < 5.0  # below uniform over 257 byte symbols (5.55)
    assert (tmp_path / "run" / "tokenizer").is_dir() and (tmp_path / "run" / "metrics.jsonl").is_file()
    assert not (tmp_path / "run" / "metrics.csv").exists()  # one metrics file (a table: `metrics_csv`)


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
    # the resumed run's metrics file continues where the stopped one ended: every record once, as in one go
    assert untimed(read_metrics(tmp_path / "a")) == untimed(read_metrics(tmp_path / "b"))
    a = json.loads((tmp_path / "a" / "results.json").read_text())
    b = json.loads((tmp_path / "b" / "results.json").read_text())
    assert a["test_loss"] == b["test_loss"]
    # provenance: one session for the run trained at once, two (with the step each began at) for the resumed one
    assert [s["from_step"] for s in a["sessions"]] == [0] and [s["from_step"] for s in b["sessions"]] == [0, 3]
    assert b["provenance"]["torch"] == torch.__version__ and b["provenance"]["processor"] == b["sessions"][1]["processor"]


def test_a_run_from_before_the_one_metrics_file_resumes_with_both(tiny_args, tmp_path):
    """A run folder that an older cem started holds metrics.csv beside metrics.jsonl: resumed, it keeps
    appending to both, so that the table still holds the jsonl's rows and `drop_duplicate_csv` can remove it."""
    cfg = run_cfg(tiny_args, max_steps=6)
    train(cfg, tmp_path / "r", progress=False, stop_at=3)
    csv_path = tmp_path / "r" / "metrics.csv"
    csv_path.write_text(metrics_csv(read_metrics(tmp_path / "r")), newline="")  # what the older logger wrote
    train(cfg, tmp_path / "r", resume=True, progress=False)
    assert [r["step"] for r in read_metrics(tmp_path / "r") if "loss" in r] == [1, 2, 3, 4, 5, 6]
    with open(csv_path, newline="") as f:
        assert f.read() == metrics_csv(read_metrics(tmp_path / "r"))
    assert drop_duplicate_csv(tmp_path) == [csv_path] and not csv_path.exists()


@pytest.mark.slow
def test_depth_recipes_train_and_resume_exactly(tiny_args, tmp_path):
    """The test-time compute recipes (heavy-tailed random depths, truncated backpropagation, the fixed-point
    penalty, the geometric schedule) train, resume bit-exact, and step checkpointing does not change them."""
    recipe = ["context=32", "attn_steps=2", "mlp_steps=2", "train_depth=layer", "train_depth_dist=poisson-lognormal",
              "train_depth_max=6", "train_depth_mean=3", "backprop_steps=2", "fixed_point_weight=0.1", "step_schedule=geometric"]
    cfg = run_cfg(tiny_args, max_steps=6, arch="cem", grad_accum=2, overrides=recipe)
    train(cfg, tmp_path / "a", progress=False)
    train(cfg, tmp_path / "b", progress=False, stop_at=3)
    train(cfg, tmp_path / "b", resume=True, progress=False)
    assert losses(tmp_path / "a") == losses(tmp_path / "b")
    train(run_cfg(tiny_args, max_steps=6, arch="cem", grad_accum=2, overrides=recipe + ["activation_checkpointing=step"]),
          tmp_path / "c", progress=False)
    assert losses(tmp_path / "c") == losses(tmp_path / "a")


def test_curriculum_resumes_mid_curriculum(tiny_args, tmp_path, monkeypatch):
    """train_depth=curriculum: the trainer gives the model its step of the run's total, so each step trains at
    the curriculum's T (2 steps of (1, 2): 1, 2), and a run stopped at step 1 resumes at T = 2 (its
    bit-exact resume: `test_issue_64_recipes_train_and_resume_exactly`)."""
    from cem.model import LanguageModel

    depths = []
    draw = LanguageModel.draw_depths
    monkeypatch.setattr(LanguageModel, "draw_depths", lambda self: depths.append(draw(self)[0]) or [depths[-1]])
    cfg = run_cfg(tiny_args, max_steps=2, arch="cem", overrides=["context=32", "train_depth=curriculum", "train_depth_curriculum=1,2"])
    train(cfg, tmp_path / "b", progress=False, stop_at=1)
    assert depths == [1]
    train(cfg, tmp_path / "b", resume=True, progress=False)
    assert depths == [1, 2]


@pytest.mark.slow
def test_issue_64_recipes_train_and_resume_exactly(tiny_args, tmp_path):
    """The recipes of issue 64 (the step gate, random deep supervision with the monotonicity term, recursion in
    the middle blocks only, the depth curriculum resumed in its middle fraction) and the heavy-tailed depth with
    full backpropagation: each trains (the loss falls) and resumes bit-exact."""
    recipes = {
        "supervised": ["n_layers=3", "recur_layers=middle", "step_gate=true", "train_depth=model", "train_depth_max=3",
                       "supervise_depths=2", "monotonicity_weight=0.5"],
        "curriculum": ["train_depth=curriculum", "train_depth_curriculum=1,2,3", "step_gate=true"],
        "heavy-tailed": ["train_depth=model", "train_depth_dist=poisson-lognormal", "train_depth_max=6", "train_depth_mean=3",
                         "backprop_steps=0"],
    }
    for name, recipe in recipes.items():
        cfg = run_cfg(tiny_args, max_steps=6, arch="cem", overrides=["context=32", *recipe])
        train(cfg, tmp_path / f"{name}-a", progress=False)
        train(cfg, tmp_path / f"{name}-b", progress=False, stop_at=3)
        train(cfg, tmp_path / f"{name}-b", resume=True, progress=False)
        run = losses(tmp_path / f"{name}-a")
        assert run == losses(tmp_path / f"{name}-b") and run[-1] < run[0], name


def test_activation_checkpointing_trains_the_same_run(tiny_args, tmp_path):
    """The `activation_checkpointing` setting changes memory, not the run: the same losses step for step
    (recomputation repeats the same float operations), and a run may resume with another mode."""
    plain = run_cfg(tiny_args, max_steps=4, arch="cem-t2")
    train(plain, tmp_path / "none", progress=False)
    for mode in ("layer", "step"):
        train(run_cfg(tiny_args, max_steps=4, arch="cem-t2", activation_checkpointing=mode), tmp_path / mode, progress=False)
        assert losses(tmp_path / mode) == losses(tmp_path / "none")
    stopped = run_cfg(tiny_args, max_steps=4, arch="cem-t2", activation_checkpointing="step")
    train(stopped, tmp_path / "switch", progress=False, stop_at=2)
    train(plain, tmp_path / "switch", resume=True, progress=False)
    assert losses(tmp_path / "switch") == losses(tmp_path / "none")


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


@pytest.mark.slow
def test_a_noisy_small_batch_run_is_not_stopped(tiny_args, tmp_path):
    """Issue 20: the default recipe at batch 2 has gradient-norm spikes above 10x their running median at a
    falling loss (here at step 171); the guard judged them divergence. It must finish, and the run must
    really hold such a spike (else this test tests nothing)."""
    cfg = run_cfg({**tiny_args, "data": "python-stdlib"}, preset="micro", batch_size=2, max_steps=700,
                  overrides=["context=32", "compile=false", "save_every=50"])
    assert train(cfg, tmp_path / "r", progress=False)["steps"] == 700
    records = [json.loads(line) for line in open(tmp_path / "r" / "metrics.jsonl")]
    norms = [r["grad_norm"] for r in records if "grad_norm" in r]
    assert any(g > 10 * statistics.median(norms[max(0, i - 100):i]) for i, g in enumerate(norms) if i >= 20)


def test_a_run_killed_before_its_first_checkpoint_keeps_its_metrics(tiny_args, tmp_path, monkeypatch):
    """Issue 20: the rerun of a run that never saved a checkpoint truncated what it had logged; the rerun
    appends to it."""
    cfg = run_cfg(tiny_args, max_steps=4, overrides=["context=32", "save_every=100"])

    def killed(s):
        raise KeyboardInterrupt

    monkeypatch.setattr("cem.training.trainer._checkpoint", killed)  # killed in its final save
    with pytest.raises(KeyboardInterrupt):
        train(cfg, tmp_path / "r", progress=False)
    first = (tmp_path / "r" / "metrics.jsonl").read_text()
    assert len(losses(tmp_path / "r")) == 4 and find_checkpoint(tmp_path / "r") is None
    monkeypatch.undo()
    train(cfg, tmp_path / "r", progress=False)
    assert (tmp_path / "r" / "metrics.jsonl").read_text().startswith(first)
    assert losses(tmp_path / "r")[:4] == losses(tmp_path / "r")[4:8]


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


@pytest.mark.parametrize("arch", ["llama", "cem", "cem-t2"])
def test_a_few_bf16_autocast_steps_train_like_fp32(tiny_args, tmp_path, arch):
    """precision=bf16 (autocast) on the CPU trains each architecture: finite losses that follow the float32
    run of the same seed and data closely (the full comparison, 400 steps x 3 seeds, is
    docs/benchmarks/bf16_training_cpu.md)."""
    runs = {p: train(run_cfg(tiny_args, max_steps=6, arch=arch, overrides=["context=32", f"precision={p}"]), tmp_path / p, progress=False)
            for p in ("fp32", "bf16")}  # fmt: skip
    fp32, bf16 = losses(tmp_path / "fp32"), losses(tmp_path / "bf16")
    assert len(bf16) == 6 and all(l == l and abs(l) < 1e3 for l in bf16)
    assert max(abs(a - b) for a, b in zip(fp32, bf16)) < 0.05
    assert abs(runs["bf16"]["test_loss"] - runs["fp32"]["test_loss"]) < 0.05


@pytest.mark.slow
def test_each_run_compiles_afresh_in_a_process_that_trained_others(tiny_args, tmp_path, monkeypatch):
    """A lane trains run after run in one process: a cpu128 lane reached dynamo's recompile limit (8) at its
    fourth run, past which a new architecture's forward runs eagerly without a word. Each run now compiles its
    own graphs, and its session records that it was compiled."""
    from torch._dynamo.testing import CompileCounter

    counter, compile_ = CompileCounter(), torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kw: compile_(model, backend=counter))
    compiled = []
    with torch._dynamo.config.patch(recompile_limit=1):
        for i, arch in enumerate(("llama", "cem")):
            train(run_cfg(tiny_args, max_steps=2, arch=arch, overrides=["context=32", "compile=true"]), tmp_path / arch, progress=False)
            compiled.append(counter.frame_count)
            assert json.loads((tmp_path / arch / "results.json").read_text())["sessions"][0]["compiled"] is True
    assert compiled[0] > 0 and compiled[1] > compiled[0]  # the second model compiled too, under a limit of one graph
