"""RunDir: a run directory's layout, its one identity rule, its one naming rule, and loading what a run left behind."""

import hashlib
import json
from pathlib import Path

import pytest

from cem.training import RunDir, load_run_config, run_identity, train
from cem.training.rundir import RUNTIME_KEYS, EvalSettings


def test_layout():
    run = RunDir("runs/x")
    assert run.run_json.name == "run.json" and run.results_json.name == "results.json"
    assert run.tokenizer_dir.name == "tokenizer" and run.ckpt_dir.name == "ckpt" and run.metrics_jsonl.name == "metrics.jsonl"


def test_identity_ignores_runtime_keys_and_compares_only_what_is_given(tmp_path):
    base = load_run_config(None, ["lr=1e-3"])
    run = RunDir(tmp_path)
    assert run.differences(run_identity(base)) == []  # nothing recorded yet
    identity = run_identity(base, tokenizer="byte", corpus={"name": "c"})
    run.write_run(identity, base, 10, tokenizer=type("T", (), {"save": lambda self, d: None})())
    assert not RUNTIME_KEYS & set(json.loads(run.run_json.read_text())["train"])
    assert run.differences(run_identity(load_run_config(None, ["lr=1e-3", "device=cpu", "log_every=3"]))) == []
    assert run.differences(run_identity(load_run_config(None, ["lr=2e-3"]))) == ["training setting lr"]
    assert run.differences(run_identity(base, tokenizer="bpe:300")) == ["tokenizer"]
    (tmp_path / "ckpt").mkdir()  # progress to protect (without one, the record is taken over: see below)
    (tmp_path / "ckpt" / "manifest.json").write_text(json.dumps({"format": 1, "step": 1, "files": {}}))
    with pytest.raises(ValueError, match="pass --resume"):
        run.claim(identity, resume=False)
    run.claim(identity, resume=True)
    with pytest.raises(ValueError, match="different run \\(corpus differs\\)"):
        run.claim(run_identity(base, tokenizer="byte", corpus={"name": "other"}), resume=True)


def test_a_run_that_saved_nothing_does_not_block_the_next(tmp_path):
    base = load_run_config(None, ["lr=1e-3"])
    run = RunDir(tmp_path)
    run.write_run(run_identity(base), base, 10, tokenizer=type("T", (), {"save": lambda self, d: None})())
    run.metrics_jsonl.write_text('{"step": 1, "loss": 5.0}\n')
    assert run.claim(run_identity(base), resume=False) == "new"  # the same run again: its metrics are kept (issue 20)
    assert run.metrics_jsonl.read_text() == '{"step": 1, "loss": 5.0}\n'
    assert run.claim(run_identity(load_run_config(None, ["lr=2e-3"])), resume=False) == "new"  # e.g. failed at start-up
    assert not run.metrics_jsonl.exists()  # another run's metrics go (its run.json is replaced when it starts)


@pytest.mark.parametrize("part", ["ckpt", "ckpt.old", "tokenizer", "tensorboard", "evals"])
def test_a_folder_that_is_no_cem_run_is_never_cleared(tmp_path, part):
    """Issue 20: --out DIR with a DIR/ckpt/ of something else (no run.json) lost it to the first save, and
    --overwrite removed its tokenizer/ and tensorboard/."""
    base = load_run_config(None, [])
    run = RunDir(tmp_path)
    (tmp_path / part).mkdir()
    (tmp_path / part / "precious").write_text("keep")
    for attempt in (run.clear, lambda: run.claim(run_identity(base), resume=False)):
        with pytest.raises(ValueError, match=f"{tmp_path / part} exists but {tmp_path} holds no cem run \\(no run.json\\)"):
            attempt()
    assert (tmp_path / part / "precious").read_text() == "keep"


def test_clear_removes_a_planted_link_not_its_target(tmp_path):
    base = load_run_config(None, [])
    run = RunDir(tmp_path / "r")
    run.write_run(run_identity(base), base, 10, tokenizer=type("T", (), {"save": lambda self, d: None})())
    (tmp_path / "victim").mkdir()
    (tmp_path / "victim" / "precious").write_text("keep")
    run.tensorboard_dir.symlink_to(tmp_path / "victim")
    run.clear()
    assert (tmp_path / "victim" / "precious").read_text() == "keep" and not run.tensorboard_dir.is_symlink()


@pytest.mark.parametrize("name", [".lock", "metrics.jsonl", "metrics.csv", "tokenizer", "tensorboard"])
def test_nothing_is_written_through_a_planted_link(tmp_path, name):
    """Issue 20: a shared run folder's .lock linked to a victim file had the victim truncated and the pid
    written there; the metrics files and tokenizer/ were followed too."""
    from cem.data import get_tokenizer
    from cem.training.metrics import MetricsLogger

    base = load_run_config(None, [])
    run = RunDir(tmp_path / "r")
    run.path.mkdir()
    victim = tmp_path / "victim"
    victim.mkdir() if name in ("tokenizer", "tensorboard") else victim.write_text("keep")
    (run.path / name).symlink_to(victim)
    with pytest.raises(ValueError, match=f"{run.path / name} is a symbolic link; refusing to write through it"):
        if name == ".lock":
            with run.lock():
                pass
        elif name == "tokenizer":
            run.write_run(run_identity(base), base, 10, get_tokenizer("byte"))
        else:
            logger = MetricsLogger(run.path, tensorboard=name == "tensorboard")
            logger.log(1, loss=1.0)
    assert (list(victim.iterdir()) == []) if victim.is_dir() else victim.read_text() == "keep"


def test_an_extended_run_loses_its_results_and_the_evaluations_of_its_final_weights(tmp_path):
    run = RunDir(tmp_path)
    run.write_results({"steps": 10})
    run.evals_dir.mkdir()
    (run.evals_dir / "energy.json").write_text("{}")
    run.start_extension()
    assert run.results() is None and not run.evals_dir.exists()


def test_export_refuses_the_run_itself(tmp_path):
    run = RunDir(tmp_path / "r")
    assert run.holds(tmp_path / "r" / "ckpt") == run.ckpt_dir
    assert run.holds(tmp_path / "r" / "ckpt" / "sub") == run.ckpt_dir
    assert run.holds(tmp_path / "r") == run.path
    assert run.holds(tmp_path / "r" / "hf") is None and run.holds(tmp_path / "other") is None


def test_lock_names_the_holder_and_is_released(tmp_path):
    from cem.training.rundir import RunLockedError
    import os

    run = RunDir(tmp_path / "r")
    with run.lock():
        with pytest.raises(RunLockedError, match=f"in use by another process \\(pid {os.getpid()}"):
            with RunDir(tmp_path / "r").lock():
                pass
    with run.lock():  # released on exit
        pass


def test_a_setting_missing_from_an_old_record_counts_as_its_default(tmp_path):
    base = load_run_config(None, [])
    identity = run_identity(base)
    del identity["train"]["grad_clip"]  # as if written before grad_clip existed
    (tmp_path / "run.json").write_text(json.dumps(identity))
    assert RunDir(tmp_path).differences(run_identity(base)) == []
    assert RunDir(tmp_path).differences(run_identity(load_run_config(None, ["grad_clip=0.5"]))) == ["training setting grad_clip"]


def test_a_model_setting_missing_from_an_old_record_counts_as_its_default(tmp_path):
    """A run recorded before a ModelConfig field existed (e.g. `fixed_point_weight`) still resumes under
    the new code; asking for a non-default value of that field is another run."""
    from cem.model import model_config

    cfg = model_config("micro", "cem", vocab_size=32)
    identity = {**run_identity(load_run_config(None, []), cfg), "model": cfg.flat_dict()}  # a flat record, as older runs wrote
    for name in ("fixed_point_weight", "adaptive_rule", "step_decay"):
        del identity["model"][name]
    (tmp_path / "run.json").write_text(json.dumps(identity))
    assert RunDir(tmp_path).differences(run_identity(load_run_config(None, []), cfg)) == []
    assert RunDir(tmp_path).differences(run_identity(load_run_config(None, []), cfg.replace(fixed_point_weight=0.1))) == ["model"]
    assert RunDir(tmp_path).differences(run_identity(load_run_config(None, []), cfg.replace(dim=64))) == ["model"]


def test_corrupted_record_is_a_clear_error(tmp_path):
    (tmp_path / "run.json").write_text("{")
    with pytest.raises(ValueError, match="corrupted"):
        RunDir(tmp_path).claim(run_identity(load_run_config(None, [])), resume=True)


def test_loads_what_a_run_left(tiny_args, tmp_path):
    cfg = load_run_config(None, ["context=32"], **tiny_args, max_steps=2)
    results = train(cfg, tmp_path / "r", progress=False)
    run = RunDir(tmp_path / "r")
    assert run.results()["test_loss"] == results["test_loss"]
    assert run.checkpoint() == run.ckpt_dir
    assert run.load_tokenizer().vocab_size == run.load_model().config.vocab_size
    model, state = run.load_checkpoint()
    assert state["step"] == 2 and run.train_settings()["max_steps"] == 2
    own = run.eval_settings(model.config.context)  # the run set no seq_len: the model's context
    assert own == EvalSettings(tiny_args["data"], None, "utf-8", 32, 4, "auto", tiny_args["tokenizer"])
    assert run.eval_settings(99, data="other", data_dir="d", seq_len=8, batch_size=2) == EvalSettings("other", "d", "utf-8", 8, 2, "auto")
    assert RunDir(tmp_path).eval_settings(99) == EvalSettings("shakespeare", None, "utf-8", 99, 8, "auto")  # nothing recorded
    assert RunDir(tmp_path / "missing").results() is None
    with pytest.raises(FileNotFoundError, match="no run or model directory"):
        RunDir(tmp_path / "missing").load_model()


def test_run_name():
    from cem.training.rundir import run_name

    assert run_name(["a", "b"], ((("k", 1),), (("m", "x/y z"),)), ["s0"]) == "a-b-k=1-m=x_y_z-s0"
    assert run_name(["a"], ((("k", "v" * 20),),), cut=6) == "a-k=vv-" + hashlib.sha1(repr(((("k", "v" * 20),),)).encode()).hexdigest()[:6]


def test_tensorboard_notice_is_said_once_and_never_under_quiet(tmp_path, capsys, monkeypatch):
    """Without TensorBoard the log says so once; `--quiet` (no progress) says nothing."""
    import builtins

    from cem.training.metrics import MetricsLogger

    real_import = builtins.__import__

    def no_tensorboard(name, *args, **kwargs):
        if name.startswith("torch.utils.tensorboard"):
            raise ImportError("No module named 'tensorboard'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tensorboard)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    MetricsLogger(tmp_path / "a", tensorboard=True).close()
    assert capsys.readouterr().err.count("TensorBoard is not installed") == 1
    MetricsLogger(tmp_path / "b", tensorboard=True, notices=False).close()
    assert "TensorBoard" not in capsys.readouterr().err


FLAT_RUNS = sorted((Path(__file__).resolve().parents[1] / "flat_runs").glob("*/run.json"))
# `cem train`'s folder for each (`default_run_dir`), as the code before the nested config named them
DEFAULT_DIRS = {
    "cpu128-cem-attn-alibi=app-a-05c0a6-s0": "runs/cem-attn-cpu128-wikitext-2-s0-seq_len=256-tokens=chinchilla-alibi=app-a",
    "cpu128-cem-mlp-fd4535-s0": "runs/cem-mlp-cpu128-wikitext-2-s0-seq_len=256-tokens=chinchilla",
    "cpu128-llama-alibi-alibi=app-a-05c0a6-s0": "runs/llama-alibi-cpu128-wikitext-2-s0-seq_len=256-tokens=chinchilla-alibi=app-a",
    "cpu128-llama-attn_reuse=2-1a59cd-s0": "runs/llama-cpu128-wikitext-2-s0-seq_len=256-tokens=chinchilla-attn_reuse=2",
    "cpu96-cem-t2-fd4535-s0": "runs/cem-t2-cpu96-wikitext-2-s0-seq_len=256-tokens=chinchilla",
}


def test_flat_records_keep_their_folder_names_and_identity():
    """Run records from before the nested config (the study's run.json files, flat model keys; one of each kind
    it trained, in tests/flat_runs): the same folder name from their flat overrides, and the identity this cem
    gives their settings (a nested model config) is the recorded one; one model setting changed is another run."""
    from cem.model import ModelConfig
    from cem.training.config import RunConfig
    from cem.training.rundir import default_run_dir

    assert sorted(p.parent.name for p in FLAT_RUNS) == sorted(DEFAULT_DIRS)
    for path in FLAT_RUNS:
        recorded = json.loads(path.read_text())
        run = RunConfig.from_dict(recorded["config"], str(path))
        model = run.model(recorded["model"]["vocab_size"])
        assert str(default_run_dir(run)) == DEFAULT_DIRS[path.parent.name]
        assert ModelConfig.from_dict(recorded["model"]) == model
        assert ("position" in model.to_dict()["attn"]) == (model.attn.kind == "llama")  # CEM attention: always ALiBi
        assert RunDir(path.parent).differences(run_identity(run, model)) == [], path
        assert RunDir(path.parent).differences(run_identity(run, model.replace(n_layers=model.n_layers + 1))) == ["model"]
