"""Training checkpoints: model, optimiser, schedule, data position and RNG state, written atomically.

A checkpoint is a directory `ckpt/` holding `model.safetensors` + `config.json` (loadable on its own with
`cem.model.load_pretrained`), `trainer_state.pt`, and `manifest.json` with the format version, the step,
and the size and sha256 of every file. A truncated or corrupted file is detected by the manifest and never
loaded.

The trainer state is read with `torch.load(weights_only=True)`: tensors, numbers, strings and containers
only, so a crafted `trainer_state.pt` cannot run code (the checksums sit next to it and are no defence).

Saving is safe under any sequence of crashes (`save_checkpoint`): the new checkpoint is written whole into
a temporary `.ckpt-*` directory (every file and the directory fsynced, the manifest last), then swapped in
by renames that never remove the only complete checkpoint. `find_checkpoint` takes the complete
checkpoint with the highest step among `ckpt/`, `ckpt.old/` and finished temporary directories, so a
resumed run always finds one when one exists; leftovers are removed once a newer checkpoint is in place.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import resource
import shutil
from pathlib import Path

import numpy as np
import torch

from ..io import atomic_write_json, make_temp_dir, outside_folder, read_json, sha256_file
from ..model import LanguageModel, ModelConfig, load_pretrained, save_weights
from ..records import CHECKPOINT_MANIFEST, TRAINER_STATE, check

MANIFEST = "manifest.json"
FORMAT_VERSION = 1  # of the manifest and trainer state; a checkpoint with a higher one is refused
_TMP_PREFIX = ".ckpt-"
_TRASH_PREFIX = ".trash-ckpt-"


def _op(name: str, fn, *args, **kwargs):
    """Every file-system operation of a save goes through here (tests inject crashes at the k-th call)."""
    return fn(*args, **kwargs)


def _fsync(path: Path) -> None:
    """Flush a file's data, or a directory's entries (its renames), to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rng_state() -> dict:
    """Every RNG stream, as tensors and plain numbers (no numpy objects, so `weights_only` loads it)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "python": random.getstate(),
    }  # fmt: skip
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    if isinstance(n, dict):
        np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    else:  # format 0: numpy's own tuple
        np.random.set_state(n)
    random.setstate(_as_tuples(state["python"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _as_tuples(x):
    """random.getstate() as random.setstate() wants it (tuples all the way down)."""
    return tuple(_as_tuples(v) for v in x) if isinstance(x, (list, tuple)) else x


def save_checkpoint(directory: Path, cfg: ModelConfig, model_state: dict, trainer_state: dict) -> None:
    """Write model weights + trainer state as the checkpoint `directory`, safe under any crash sequence.

    1. everything goes into a fresh `.ckpt-*` directory, each file fsynced, the manifest last, the
       directory fsynced: from then on it is a complete checkpoint `find_checkpoint` can use;
    2. if `directory` exists (always complete: it is only ever made by renaming a complete temp) it becomes
       `directory.old` (a stale `.old` is thrown away first: it is older than `directory`);
    3. the temp directory becomes `directory`;
    4. `.old` and leftover temp directories are thrown away (renamed to `.trash-*`, then deleted, so a
       half-deleted directory never looks like a checkpoint).
    Each rename is followed by an fsync of the parent directory.
    """
    directory = Path(directory)
    parent = directory.parent
    old = directory.with_name(directory.name + ".old")
    _op("mkdir", parent.mkdir, parents=True, exist_ok=True)
    tmp = _op("mkdtemp", make_temp_dir, parent, _TMP_PREFIX)
    try:
        _op("save_weights", save_weights, cfg, model_state, tmp)
        _op("torch.save", torch.save, {**trainer_state, "format": FORMAT_VERSION}, tmp / "trainer_state.pt")
        for p in sorted(tmp.iterdir()):
            _op("fsync", _fsync, p)
        files = {p.name: {"bytes": p.stat().st_size, "sha256": sha256_file(p)} for p in sorted(tmp.iterdir())}
        manifest = {"format": FORMAT_VERSION, "step": int(trainer_state.get("step", 0)), "files": files}
        _op("write_manifest", atomic_write_json, tmp / MANIFEST, manifest)
        _op("fsync", _fsync, tmp)
    except BaseException as e:
        limited = _over_size_limit(tmp) if isinstance(e, Exception) else None
        with contextlib.suppress(OSError):
            _op("rmtree", shutil.rmtree, tmp)
        if limited is not None:
            raise OSError(errno.EFBIG, "file size limit (ulimit -f) reached while writing a checkpoint (the previous checkpoint is kept)", str(directory / limited)) from e
        if isinstance(e, Exception) and _disk_full(parent, e):
            raise OSError(errno.ENOSPC, f"no space left on device while writing a checkpoint in {parent} (the previous checkpoint is kept)") from e
        raise
    if directory.is_dir():
        if old.exists():
            _discard(old)
        _op("rename", os.replace, directory, old)
        _op("fsync", _fsync, parent)
    _op("rename", os.replace, tmp, directory)
    _op("fsync", _fsync, parent)
    clean_stale(parent, directory.name)


def _over_size_limit(folder: Path) -> str | None:
    """The name of a file in `folder` that reached the file size limit (RLIMIT_FSIZE, `ulimit -f`; Python
    ignores SIGXFSZ, so the write fails and torch says only "file write failed"), None if none did."""
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit == resource.RLIM_INFINITY or not folder.is_dir():
        return None
    return next((p.name for p in sorted(folder.iterdir()) if p.is_file() and p.stat().st_size >= limit), None)


def _disk_full(parent: Path, e: Exception) -> bool:
    """Whether a failed write failed for want of space (torch and safetensors do not always say so)."""
    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
        return True
    if "no space" in str(e).lower():
        return True
    try:
        return shutil.disk_usage(parent).free < 16 << 20
    except OSError:
        return False


def _discard(path: Path) -> None:
    """Rename `path` out of the way, then delete it."""
    trash = path.with_name(f"{_TRASH_PREFIX}{path.name}-{os.getpid()}-{os.urandom(4).hex()}")
    _op("rename", os.replace, path, trash)
    _op("rmtree", shutil.rmtree, trash, ignore_errors=True)


def clean_stale(parent: Path, name: str = "ckpt") -> None:
    """Remove `name.old`, leftover temporary checkpoint directories and trash, once `name/` is complete."""
    if not (Path(parent) / name / MANIFEST).is_file():
        return
    for p in sorted(Path(parent).iterdir()):
        if p.name == f"{name}.old" or p.name.startswith((_TMP_PREFIX, f".{_TMP_PREFIX}")):
            _discard(p)
        elif p.name.startswith(_TRASH_PREFIX):
            _op("rmtree", shutil.rmtree, p, ignore_errors=True)


def read_manifest(directory: Path) -> dict:
    """The manifest as {"format", "step", "files"} (format 0: the flat file table of older checkpoints);
    ValueError if it is missing, unreadable or of an unknown format version."""
    directory = Path(directory)
    manifest = directory / MANIFEST
    if not manifest.is_file():
        raise ValueError(f"checkpoint {directory} has no {MANIFEST} (lost or removed: a save always writes it), so its files "
                         "cannot be verified; they are kept: restore it, or pass --overwrite to start the run again")
    data = read_json(manifest)
    if "files" not in data:
        data = {"format": 0, "step": None, "files": data}
    version = data.get("format")
    if not isinstance(version, int) or not 0 <= version <= FORMAT_VERSION:
        raise ValueError(
            f"checkpoint {directory} has format version {version!r}; this cem reads versions up to {FORMAT_VERSION} (a newer cem wrote it?)"
        )
    data.setdefault("step", None)
    check(CHECKPOINT_MANIFEST, data, f"checkpoint {directory} is corrupted: {MANIFEST}")  # a save lists its weights and trainer state
    outside = outside_folder(manifest, data["files"])
    if outside:
        raise ValueError(f"checkpoint {directory} is corrupted: {outside}")
    return data


def checkpoint_problems(directory: Path) -> list[tuple[Path, str | None]]:
    """Every file the checkpoint's manifest lists, with what is wrong with it in words naming the checkpoint
    (None: present, whole and unchanged)."""
    directory = Path(directory)
    checked = []
    for name, meta in read_manifest(directory)["files"].items():
        path = directory / name
        if not path.is_file():
            checked.append((path, f"checkpoint {directory} is incomplete: {name} is missing"))
        elif path.stat().st_size != meta["bytes"] or sha256_file(path) != meta["sha256"]:
            checked.append((path, f"checkpoint {directory} is corrupted: {name} does not match its checksum (truncated or altered)"))
        else:
            checked.append((path, None))
    return checked


def verify_checkpoint(directory: Path) -> None:
    """Raise ValueError unless every file listed in the manifest is present, whole and unchanged."""
    for _, problem in checkpoint_problems(directory):
        if problem:
            raise ValueError(problem)


def checkpoint_step(directory: Path) -> int | None:
    """The step recorded in a checkpoint's manifest (None for a format-0 checkpoint)."""
    return read_manifest(directory)["step"]


def find_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint to resume from: of `ckpt/`, `ckpt.old/` (a swap was interrupted) and finished
    temporary `.ckpt-*` directories (a crash before the swap), the one with a manifest and the highest
    step (`ckpt/` on a tie, and `ckpt/` when it has lost its manifest and nothing else is complete: it
    is never discarded unverified); None if there is none. Its files are verified when it is loaded."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return None
    candidates = [run_dir / "ckpt", run_dir / "ckpt.old"]
    candidates += sorted(p for p in run_dir.iterdir() if p.name.startswith(_TMP_PREFIX) and p.is_dir())
    best, best_step = None, None
    for path in candidates:
        if not (path / MANIFEST).is_file():
            if path.name == "ckpt" and path.is_dir():  # only a complete save is ever renamed to ckpt/: say so when it is loaded
                best, best_step = path, -1
            continue
        try:
            step = read_manifest(path)["step"]
        except ValueError:
            if path.name == "ckpt":  # the main checkpoint is damaged: say so when it is loaded
                step = -1
            else:
                continue
        step = -1 if step is None else step
        if best is None or step > best_step:
            best, best_step = path, step
    return best


def load_trainer_state(directory: Path) -> dict:
    """The trainer state of a checkpoint, unpickled with `weights_only=True` (no code can run)."""
    path = Path(directory) / "trainer_state.pt"
    legacy = [np.ndarray, np.dtype, np.dtypes.UInt32DType]  # format 0 stored numpy's RNG state as an array
    legacy.append(getattr(np, "_core", np.core).multiarray._reconstruct)
    try:
        with torch.serialization.safe_globals(legacy):
            state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ValueError(f"checkpoint {directory} is incomplete: trainer_state.pt is missing") from None
    except Exception as e:  # noqa: BLE001 - the unpickler raises UnpicklingError, RuntimeError, ...
        lines = [line.strip() for line in str(e).splitlines() if line.strip()] or [type(e).__name__]
        first = next((line.split(" was not")[0] for line in lines if line.startswith("WeightsUnpickler error")), lines[0])  # e.g. "Unsupported global: GLOBAL io.open"
        raise ValueError(f"refusing to load {path}: not a plain trainer state (only tensors, numbers and containers are read): {first}") from None
    if not isinstance(state, dict) or "step" not in state:
        raise ValueError(f"refusing to load {path}: not a cem trainer state")
    version = state.get("format", 0)
    if isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION:
        raise ValueError(f"{path} has format version {version!r}; this cem reads versions up to {FORMAT_VERSION}")
    return check(TRAINER_STATE, state, f"refusing to load {path}")


RESUME_KEYS = ("tokens_seen", "elapsed", "optimizer", "scheduler", "sampler", "rng")  # what a resume reads besides the step
PER_PROCESS_KEYS = ("sampler", "rng")  # lists of one state per training process


def load_checkpoint(directory: Path, map_location: str | torch.device = "cpu") -> tuple[LanguageModel, dict]:
    """The verified model and trainer state of a checkpoint; a ValueError naming what a trainer state lacks
    (`RESUME_KEYS`, a process's entry of `PER_PROCESS_KEYS`)."""
    verify_checkpoint(directory)
    model = load_pretrained(directory, map_location=map_location)
    state = load_trainer_state(directory)
    lacking = [k for k in RESUME_KEYS if k not in state or (k in PER_PROCESS_KEYS and not (isinstance(state[k], list) and state[k]))]
    if lacking:
        raise ValueError(f"checkpoint {directory} is corrupted: its trainer_state.pt holds no {', '.join(lacking)} state, "
                         "which resuming needs (remove the checkpoint to train from step 0)")
    return model, state
