"""torchrun with two CPU processes (gloo) gives the loss curve of one process with the same global batch."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest


def cli(*args, env):
    return [*args, "--data", env["CORPUS"], "--preset", "tiny", "--arch", "cem", "--max-steps", "4", "--quiet",
            "context=32", "log_every=1", "tensorboard=false", "eval_every=0"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def losses(run_dir):
    return [r["loss"] for r in map(json.loads, open(run_dir / "metrics.jsonl")) if "loss" in r]


@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_processes_match_one(corpus_dir, tmp_path, parallel):
    env = {**os.environ, "CEM_CACHE_DIR": str(tmp_path / "cache"), "CORPUS": str(corpus_dir), "OMP_NUM_THREADS": "1"}
    one = [sys.executable, "-m", "cem", "train", "--out", str(tmp_path / "one"), "--batch-size", "4"]
    subprocess.run(cli(*one, env=env), env=env, check=True, capture_output=True, timeout=300)
    two = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           "-m", "cem", "train", "--out", str(tmp_path / "two"), "--batch-size", "2", f"parallel={parallel}"]
    proc = subprocess.run(cli(*two, env=env), env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, [l for l in proc.stderr.splitlines() if "error" in l][:5]
    assert losses(tmp_path / "two") == pytest.approx(losses(tmp_path / "one"), rel=1e-5)
    one_res = json.loads((tmp_path / "one" / "results.json").read_text())
    two_res = json.loads((tmp_path / "two" / "results.json").read_text())
    assert two_res["world_size"] == 2 and two_res["tokens_seen"] == one_res["tokens_seen"]
    assert two_res["test_loss"] == pytest.approx(one_res["test_loss"], rel=1e-5)


@pytest.mark.slow
def test_sigint_saves_checkpoint_and_exits_cleanly(corpus_dir, tmp_path):
    env = {**os.environ, "CEM_CACHE_DIR": str(tmp_path / "cache"), "CORPUS": str(corpus_dir)}
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "cem", "train", "--data", str(corpus_dir), "--preset", "tiny", "--max-steps", "100000",
           "--out", str(out), "context=32", "log_every=1", "tensorboard=false", "eval_every=0"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (out / "metrics.jsonl").exists() or (out / "metrics.jsonl").stat().st_size == 0:
        assert time.time() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() is not None else "timeout"
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGINT
    assert "Traceback" not in err and "checkpoint saved" in err, err[-2000:]
    assert (out / "ckpt" / "manifest.json").is_file()


@pytest.mark.slow
def test_ctrl_c_with_the_output_piped_to_a_reader_that_is_gone_still_saves(corpus_dir, tmp_path):
    """`cem train ... 2>&1 | tee log`, then Ctrl-C: the signal reaches tee too, which exits, and the next
    progress write hit a dead pipe (BrokenPipeError) before the checkpoint was saved: the run was lost. Here
    the reader closes the pipe first, then SIGINT: the checkpoint is saved all the same."""
    env = {**os.environ, "CEM_CACHE_DIR": str(tmp_path / "cache")}
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "cem", "train", "--data", str(corpus_dir), "--preset", "tiny", "--max-steps", "100000",
           "--out", str(out), "context=32", "log_every=1", "tensorboard=false", "eval_every=0"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.time() + 120
    while not (out / "metrics.jsonl").exists() or (out / "metrics.jsonl").stat().st_size == 0:
        assert time.time() < deadline and proc.poll() is None, "the run did not start"
        time.sleep(0.2)
    proc.stdout.close()  # the pipe's reader is gone (tee killed by the same Ctrl-C)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=120)
    assert (out / "ckpt" / "manifest.json").is_file(), f"no checkpoint (exit {proc.returncode})"
    assert proc.returncode == 128 + signal.SIGINT


@pytest.mark.slow
@pytest.mark.parametrize("parallel,mode", [("ddp", "step"), ("fsdp", "layer")])
def test_activation_checkpointing_under_torchrun_matches_one_process(corpus_dir, tmp_path, parallel, mode):
    """Activation checkpointing composed with DDP / FSDP2 (two gloo processes): the same losses as one process
    without checkpointing (issue 19, item 1)."""
    env = {**os.environ, "CEM_CACHE_DIR": str(tmp_path / "cache"), "CORPUS": str(corpus_dir), "OMP_NUM_THREADS": "1"}
    one = [sys.executable, "-m", "cem", "train", "--out", str(tmp_path / "one"), "--batch-size", "4", "--arch", "cem-t2"]
    subprocess.run([*cli(*one, env=env), "--arch", "cem-t2"], env=env, check=True, capture_output=True, timeout=300)
    two = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           "-m", "cem", "train", "--out", str(tmp_path / "two"), "--batch-size", "2", f"parallel={parallel}",
           "--activation-checkpointing", mode]
    proc = subprocess.run([*cli(*two, env=env), "--arch", "cem-t2"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, [l for l in proc.stderr.splitlines() if "rror" in l][:5]
    assert losses(tmp_path / "two") == pytest.approx(losses(tmp_path / "one"), rel=1e-5)
