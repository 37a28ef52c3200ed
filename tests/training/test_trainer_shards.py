"""Training on prepared token shards (`cem data prepare ... --tokenizer`): the same run as on the corpus
loaded whole, and a bit-exact resume with the sampler's position in the checkpoint."""

import json
import os
import socket
import subprocess
import sys

import pytest

from cem.cli import main
from cem.training import Interrupted, load_run_config, train


def run_cfg(tiny_args, **kw):
    return load_run_config(None, ["context=32"], **{**tiny_args, **kw})


def losses(run_dir):
    return [r["loss"] for r in map(json.loads, open(run_dir / "metrics.jsonl")) if "loss" in r]


@pytest.fixture
def shards(corpus_dir, tmp_path):
    """The test corpus as shards of 1,000 tokens, so that training windows cross shard boundaries."""
    out = tmp_path / "shards"
    assert main(["data", "prepare", str(corpus_dir), "--tokenizer", "byte", "--shard-tokens", "1000", "--workers", "0", "--out", str(out)]) == 0
    assert len(json.loads((out / "manifest.json").read_text())["splits"]["train"]["shards"]) > 10
    return out


def test_shards_train_like_the_whole_corpus_and_resume_exactly(tiny_args, shards, tmp_path):
    whole = run_cfg(tiny_args, max_steps=8, arch="cem-t2")
    sharded = run_cfg(tiny_args, max_steps=8, arch="cem-t2", data=str(shards))
    train(whole, tmp_path / "whole", progress=False)
    train(sharded, tmp_path / "a", progress=False)
    stopped = train(sharded, tmp_path / "b", progress=False, stop_at=3)
    assert isinstance(stopped, Interrupted) and stopped.step == 3
    train(sharded, tmp_path / "b", resume=True, progress=False)
    assert losses(tmp_path / "a") == losses(tmp_path / "b") == losses(tmp_path / "whole")
    results = [json.loads((tmp_path / r / "results.json").read_text()) for r in ("whole", "a", "b")]
    assert results[0]["test_loss"] == results[1]["test_loss"] == results[2]["test_loss"]
    assert results[0]["test_bits_per_byte"] == results[1]["test_bits_per_byte"]


@pytest.mark.parametrize("tokenizer", ["byte", "bpe:300"])
def test_shards_are_found_for_their_corpus_and_tokenizer(tokenizer, tiny_args, corpus_dir, tmp_path, capsys):
    from cem.data.tokenshards import fingerprint, load_shards

    data_dir = tmp_path / "data"
    assert main(["data", "prepare", str(corpus_dir), "--tokenizer", tokenizer, "--shard-tokens", "1000", "--workers", "0",
                 "--data-dir", str(data_dir)]) == 0
    prepared = capsys.readouterr().out.strip()
    assert prepared.startswith(str(data_dir / "shards"))
    manifest, shard_tokenizer, _ = load_shards(prepared)
    run = train(run_cfg(tiny_args, max_steps=2, data_dir=str(data_dir), tokenizer=tokenizer), tmp_path / "r", progress=False)
    identity = json.loads((tmp_path / "r" / "run.json").read_text())
    assert identity["corpus"] == fingerprint(manifest) and identity["tokenizer"] == shard_tokenizer.name
    assert run["steps"] == 2


def test_shards_of_another_tokenizer_are_refused(tiny_args, shards, tmp_path):
    with pytest.raises(ValueError, match="train with --tokenizer byte"):
        train(run_cfg(tiny_args, max_steps=2, data=str(shards), tokenizer="bpe:300"), tmp_path / "r", progress=False)


def test_eval_of_a_run_on_shards_reads_them(tiny_args, shards, tmp_path, capsys):
    train(run_cfg(tiny_args, max_steps=2, data=str(shards), final_eval_tokens=0), tmp_path / "r", progress=False)  # the whole split
    capsys.readouterr()
    assert main(["eval", "--ckpt", str(tmp_path / "r"), "--split", "test", "--json", "--device", "cpu"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["loss"] == pytest.approx(json.loads((tmp_path / "r" / "results.json").read_text())["test_loss"], rel=1e-6)
    from cem.data import load_tokenizer
    from cem.data.tokenshards import load_shards, token_split
    from cem.training import RunDir

    run = RunDir(tmp_path / "r")
    t = run.train_settings()
    split = token_split(t["data"], load_tokenizer(run.tokenizer_dir), t["tokenizer"], "valid", t.get("data_dir"))  # a split of the run's corpus
    assert split.tokens.tolist() == load_shards(shards)[2]["valid"].tokens.tolist()


@pytest.mark.slow
def test_two_processes_on_shards_match_one_on_the_corpus(corpus_dir, shards, tmp_path):
    """torchrun with two CPU processes (gloo, DDP) on the shards: each rank reads its half of every global batch
    through the memory maps, and the loss curve is the one process's on the corpus loaded whole."""
    with socket.socket() as sock:  # a free port for the rendezvous
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "CEM_CACHE_DIR": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    common = ["--preset", "tiny", "--arch", "cem", "--max-steps", "4", "--quiet", "context=32", "log_every=1", "tensorboard=false", "eval_every=0"]
    one = [sys.executable, "-m", "cem", "train", "--data", str(corpus_dir), "--out", str(tmp_path / "one"), "--batch-size", "4", *common]
    subprocess.run(one, env=env, check=True, capture_output=True, timeout=300)
    two = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port), "-m", "cem", "train",
           "--data", str(shards), "--out", str(tmp_path / "two"), "--batch-size", "2", *common]
    proc = subprocess.run(two, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, [line for line in proc.stderr.splitlines() if "rror" in line][:5]
    assert losses(tmp_path / "two") == pytest.approx(losses(tmp_path / "one"), rel=1e-5)
    assert json.loads((tmp_path / "two" / "results.json").read_text())["world_size"] == 2
