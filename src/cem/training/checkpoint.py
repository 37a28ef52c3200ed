"""Training checkpoints: model, optimiser, schedule, data position and RNG state, written atomically.

A checkpoint is a directory `ckpt/` holding `model.safetensors` + `config.json` (loadable on its own with
`cem.model.load_pretrained`), `trainer_state.pt`, and `manifest.json` with the size and sha256 of every
file. It is written to a temporary directory and swapped in with renames, so a crash mid-write leaves the
previous checkpoint whole; a truncated or corrupted file is detected by the manifest and never loaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from ..io import atomic_write_json
from ..model import LanguageModel, ModelConfig, load_pretrained, save_weights

MANIFEST = "manifest.json"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(directory: Path, cfg: ModelConfig, model_state: dict, trainer_state: dict) -> None:
    """Write model weights + trainer state to `directory` atomically (temp dir, manifest, rename swap)."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".ckpt-", dir=directory.parent))
    try:
        save_weights(cfg, model_state, tmp)
        torch.save(trainer_state, tmp / "trainer_state.pt")
        files = {p.name: {"bytes": p.stat().st_size, "sha256": _sha256(p)} for p in sorted(tmp.iterdir())}
        atomic_write_json(tmp / MANIFEST, files)
        old = directory.with_name(directory.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        if directory.exists():
            os.replace(directory, old)
        os.replace(tmp, directory)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def verify_checkpoint(directory: Path) -> None:
    """Raise ValueError unless every file listed in the manifest is present, whole and unchanged."""
    directory = Path(directory)
    manifest = directory / MANIFEST
    if not manifest.is_file():
        raise ValueError(f"checkpoint {directory} is incomplete: no {MANIFEST} (an interrupted write?)")
    try:
        files = json.loads(manifest.read_text())
    except json.JSONDecodeError:
        raise ValueError(f"checkpoint {directory} is corrupted: unreadable {MANIFEST}") from None
    for name, meta in files.items():
        path = directory / name
        if not path.is_file():
            raise ValueError(f"checkpoint {directory} is incomplete: {name} is missing")
        if path.stat().st_size != meta["bytes"] or _sha256(path) != meta["sha256"]:
            raise ValueError(f"checkpoint {directory} is corrupted: {name} does not match its checksum (truncated or altered)")


def find_checkpoint(run_dir: Path) -> Path | None:
    """The run's checkpoint directory, or its previous one if a swap was interrupted; None if there is none."""
    for name in ("ckpt", "ckpt.old"):
        path = Path(run_dir) / name
        if (path / MANIFEST).is_file():
            return path
    return None


def load_checkpoint(directory: Path, map_location: str | torch.device = "cpu") -> tuple[LanguageModel, dict]:
    """The verified model and trainer state of a checkpoint."""
    verify_checkpoint(directory)
    model = load_pretrained(directory, map_location=map_location)
    state = torch.load(Path(directory) / "trainer_state.pt", map_location="cpu", weights_only=False)
    return model, state
