"""Checkpoints under attack and under crashes: a crafted trainer state runs no code, and no sequence of
crashes (injected before every file-system operation of a save, twice in a row) loses the run."""

import json
import os
import pickle
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from cem.model import LanguageModel, model_config
from cem.training import RunDir, checkpoint, find_checkpoint, load_checkpoint, load_run_config, save_checkpoint, train, verify_checkpoint
from cem.io import sha256_file as _sha256
from cem.training.checkpoint import MANIFEST, load_trainer_state
from cem.training.rundir import RunLockedError


class Crash(BaseException):
    """A simulated kill -9: raised before an operation, and before every one after it (the process is gone)."""


class Injector:
    """Stands in for `checkpoint._op`: runs operations, records their names, crashes at call `k` (1-based)."""

    def __init__(self, k: int | None = None, when=None) -> None:
        self.k, self.when, self.calls, self.dead = k, when, [], False

    def __call__(self, name, fn, *args, **kwargs):
        self.calls.append(name)
        if self.dead or len(self.calls) == self.k or (self.when is not None and self.when(self.calls)):
            self.dead = True
            raise Crash(name)
        return fn(*args, **kwargs)


@pytest.fixture(scope="module")
def tiny_model():
    cfg = model_config("tiny", "llama", vocab_size=16, dim=8, n_heads=2, hidden_dim=16, n_layers=1, context=8)
    return cfg, LanguageModel(cfg).state_dict()


def save(run_dir, tiny_model, step):
    cfg, state = tiny_model
    save_checkpoint(run_dir / "ckpt", cfg, state, {"step": step, "numbers": torch.arange(step)})


def saved_step(run_dir):
    found = find_checkpoint(run_dir)
    if found is None:
        return None
    verify_checkpoint(found)
    return load_trainer_state(found)["step"]


def crashing(monkeypatch, injector, fn):
    monkeypatch.setattr(checkpoint, "_op", injector)
    try:
        fn()
    except Crash:
        pass
    finally:
        monkeypatch.setattr(checkpoint, "_op", lambda name, f, *a, **kw: f(*a, **kw))


def ops_of_a_save(tmp_path, tiny_model, monkeypatch):
    counter = Injector()
    save(tmp_path / "count", tiny_model, 1)
    crashing(monkeypatch, counter, lambda: save(tmp_path / "count", tiny_model, 2))
    return len(counter.calls)


@pytest.mark.slow
def test_two_crashes_in_a_row_at_every_step_of_a_save_lose_nothing(tmp_path, tiny_model, monkeypatch):
    monkeypatch.setattr(os, "fsync", lambda fd: None)  # still called (and counted as operations), but no disk wait
    if Path("/dev/shm").is_dir() and os.access("/dev/shm", os.W_OK):
        tmp_path = Path(tempfile.mkdtemp(dir="/dev/shm"))
        request_cleanup = tmp_path
    else:
        request_cleanup = None
    try:
        _two_crashes(tmp_path, tiny_model, monkeypatch)
    finally:
        if request_cleanup is not None:
            shutil.rmtree(request_cleanup, ignore_errors=True)


def _two_crashes(tmp_path, tiny_model, monkeypatch):
    n = ops_of_a_save(tmp_path, tiny_model, monkeypatch)
    assert n >= 15  # mkdtemp, weights, state, fsyncs, manifest, renames, cleanup
    sequences = 0
    for k1 in range(1, n + 2):
        for k2 in range(1, n + 2):
            run = tmp_path / f"r{k1}-{k2}"
            save(run, tiny_model, 1)
            crashing(monkeypatch, Injector(k1), lambda: save(run, tiny_model, 2))
            first = saved_step(run)
            assert first in (1, 2), (k1, k2)  # a complete checkpoint is always found
            crashing(monkeypatch, Injector(k2), lambda: save(run, tiny_model, first + 1))
            second = saved_step(run)
            assert second in (first, first + 1), (k1, k2)  # never older than what the resumed run started from
            save(run, tiny_model, second + 1)
            assert find_checkpoint(run) == run / "ckpt" and saved_step(run) == second + 1
            assert sorted(p.name for p in run.iterdir()) == ["ckpt"], (k1, k2)  # leftovers cleaned
            sequences += 1
    assert sequences == (n + 1) ** 2


def test_a_crash_in_the_first_save_never_leaves_a_half_checkpoint(tmp_path, tiny_model, monkeypatch):
    for k in range(1, 20):
        run = tmp_path / f"r{k}"
        crashing(monkeypatch, Injector(k), lambda: save(run, tiny_model, 1))
        assert saved_step(run) in (None, 1)  # a finished temp directory counts: its manifest comes last


@pytest.mark.parametrize("second", ["mkdtemp", "save_weights", "write_manifest", "rename", "last"])
def test_training_survives_a_double_crash_and_resumes_exactly(tiny_args, tmp_path, monkeypatch, capsys, second):
    """The issue's sequence: a crash between the two renames of a save, then a crash in the resumed run's
    next save. The third session resumes from a checkpoint (never step 0) and ends bit-exact."""
    cfg = load_run_config(None, ["context=32", "save_every=1"], **tiny_args, max_steps=6)
    clean = train(cfg, tmp_path / "clean", progress=False)
    run = tmp_path / "r"

    def between_renames_of_save(calls, save_no=3):
        return calls.count("mkdtemp") == save_no and calls[-1] == "rename" and calls[calls.index("mkdtemp", _nth(calls, "mkdtemp", save_no)):].count("rename") == 2

    crashing(monkeypatch, Injector(when=between_renames_of_save), lambda: train(cfg, run, progress=False))
    assert (run / "ckpt.old").is_dir() and not (run / "ckpt").exists()
    capsys.readouterr()

    def in_next_save(calls):
        if second == "last":
            return calls.count("mkdtemp") == 1 and len(calls) > 1 and calls[-1] == "fsync" and calls[-2] == "rename"
        return calls.count("mkdtemp") == 1 and calls[-1] == second

    crashing(monkeypatch, Injector(when=in_next_save), lambda: train(cfg, run, resume=True, progress=True))
    assert "resumed from" in capsys.readouterr().err
    assert saved_step(run) >= 2
    result = train(cfg, run, resume=True, progress=True)
    err = capsys.readouterr().err
    assert "resumed from" in err and "at step 0/" not in err and "no checkpoint" not in err
    assert result["test_loss"] == clean["test_loss"]
    assert sorted(p.name for p in run.iterdir() if p.name.startswith((".ckpt", ".trash", "ckpt"))) == ["ckpt"]


def _nth(items, value, n):
    """Index of the n-th occurrence (1-based) of value."""
    idx = -1
    for _ in range(n):
        idx = items.index(value, idx + 1)
    return idx


class _Evil:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_crafted_trainer_state_runs_no_code(tiny_args, tmp_path):
    cfg = load_run_config(None, ["context=32"], **tiny_args, max_steps=3)
    train(cfg, tmp_path / "r", progress=False, stop_at=1)
    ckpt = tmp_path / "r" / "ckpt"
    marker = tmp_path / "pwned"
    state_file = ckpt / "trainer_state.pt"
    torch.save({"step": 1, "payload": _Evil(marker)}, state_file)
    manifest = json.loads((ckpt / MANIFEST).read_text())  # the attacker fixes the checksums too
    manifest["files"]["trainer_state.pt"] = {"bytes": state_file.stat().st_size, "sha256": _sha256(state_file)}
    (ckpt / MANIFEST).write_text(json.dumps(manifest))
    verify_checkpoint(ckpt)
    with pytest.raises(ValueError, match="refusing to load .*trainer_state.pt"):
        train(cfg, tmp_path / "r", resume=True, progress=False)
    (tmp_path / "r" / "run.json").unlink()  # train_settings then reads the checkpoint
    with pytest.raises(ValueError, match="refusing to load"):
        RunDir(tmp_path / "r").train_settings()
    assert not marker.exists()
    with pytest.raises(pickle.UnpicklingError):  # the same file does run code with a plain unpickler
        torch.load(state_file, weights_only=True)
    torch.load(state_file, weights_only=False)
    assert marker.exists()


def test_unknown_format_version_is_refused(tiny_args, tmp_path):
    cfg = load_run_config(None, ["context=32"], **tiny_args, max_steps=3)
    train(cfg, tmp_path / "r", progress=False, stop_at=1)
    manifest_path = tmp_path / "r" / "ckpt" / MANIFEST
    manifest = json.loads(manifest_path.read_text())
    manifest_path.write_text(json.dumps({**manifest, "format": 99}))
    with pytest.raises(ValueError, match="format version 99"):
        load_checkpoint(tmp_path / "r" / "ckpt")


def test_a_checkpoint_that_lost_its_manifest_is_kept_and_named(tiny_args, tmp_path):
    """Issue 20: a ckpt/ without manifest.json was ignored, the run started at step 0, and its first save
    deleted the old weights. Now it is the run's checkpoint, refused when loaded, and never replaced."""
    cfg = load_run_config(None, ["context=32"], **tiny_args, max_steps=3)
    train(cfg, tmp_path / "r", progress=False, stop_at=1)
    (tmp_path / "r" / "ckpt" / MANIFEST).unlink()
    weights = (tmp_path / "r" / "ckpt" / "model.safetensors").read_bytes()
    assert find_checkpoint(tmp_path / "r") == tmp_path / "r" / "ckpt"
    with pytest.raises(ValueError, match="pass --resume"):
        train(cfg, tmp_path / "r", progress=False)
    with pytest.raises(ValueError, match="has no manifest.json .* they are kept"):
        train(cfg, tmp_path / "r", resume=True, progress=False)
    assert (tmp_path / "r" / "ckpt" / "model.safetensors").read_bytes() == weights


def test_a_live_run_folder_is_locked(tiny_args, tmp_path):
    cfg = load_run_config(None, ["context=32"], **tiny_args, max_steps=2)
    with RunDir(tmp_path / "r").lock():
        with pytest.raises(RunLockedError, match="in use by another process"):
            train(cfg, tmp_path / "r", progress=False)
    assert train(cfg, tmp_path / "r", progress=False)["steps"] == 2  # released
