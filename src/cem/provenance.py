"""What produced a run: the code (its git commit, and whether the checkout had uncommitted changes), the
torch and Python versions, and the processor (its model name, and its family, model and stepping with the vector
kernels torch uses on it). Every training session of a run records one (a resumed run
has several), so that a report never pairs runs trained on different processors or devices.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
from functools import lru_cache
from pathlib import Path

import torch

from . import __version__
from .device import cpu_id, cpu_model, device_name

__all__ = ["code_version", "processor", "provenance", "recorded_processors", "session_processor"]

GIT_TIMEOUT_S = 10.0


@lru_cache(maxsize=None)
def code_version(where: str | None = None) -> dict:
    """The git commit of the checkout `cem` is imported from (`dirty`: it had uncommitted changes under
    src/), or only the package version where it is not a git checkout (an installed wheel)."""
    src = Path(where or Path(__file__).resolve().parent)
    out = {"version": __version__, "commit": None, "dirty": None}
    try:
        commit = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=GIT_TIMEOUT_S)
        if commit.returncode != 0:
            return out
        dirty = subprocess.run(["git", "-C", str(src), "status", "--porcelain", "--untracked-files=no", "--", "."],
                               capture_output=True, text=True, timeout=GIT_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return out
    out["commit"] = commit.stdout.strip() or None
    out["dirty"] = bool(dirty.stdout.strip()) if dirty.returncode == 0 else None
    return out


def processor(device: torch.device | None = None) -> str:
    """What runs are paired on: the GPU's name on CUDA; on the CPU its model name, with its vendor, family, model
    and stepping where /proc/cpuinfo gives them ("AMD EPYC (AuthenticAMD family 25 model 17 stepping 1)"): one model
    name covers CPUs that sum floats differently (docs/LOG.md, 2026-11-28). Not the thread count: runs on one
    processor with different thread counts are comparable up to the order of float sums, which `threads` records."""
    if device is not None and device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return _qualified(cpu_model(), cpu_id())


def _qualified(model: str, cpu: str | None) -> str:
    """A CPU's model name with its family, model and stepping (`cpu_id`) where known."""
    return f"{model} ({cpu})" if cpu and not model.endswith(f"({cpu})") else model


def provenance(device: torch.device | None = None) -> dict:
    """This process's provenance: code version, torch, Python, processor, threads, host OS."""
    device = device or torch.device("cpu")
    return {
        **code_version(),
        "torch": str(torch.__version__),  # a plain str (TorchVersion would not load with weights_only)
        "python": platform.python_version(),
        "processor": processor(device),
        "cpu_id": cpu_id(),  # one model name can hide several CPUs (a VM's "AMD EPYC"): this tells them apart
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),  # the vector kernels torch dispatches to (AVX2, AVX512)
        "device": device_name(device),
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(terse=True),
    }


def recorded_processors(results: dict) -> list[str]:
    """The processors a finished run (its results.json) was trained on, as `processor` names them: each session's,
    or, for a run that predates provenance, the one its `device` names ("AMD EPYC (1 thread)" -> "AMD EPYC").
    Sessions that predate the CPU's family record (`cpu_id`, 2026-11-28) take the one the run's
    `processor_inferred` gives, with how it was inferred (a same-bits check of its first steps), where it has one."""
    inferred = (results.get("processor_inferred") or {}).get("processor")
    found = [session_processor(s, inferred) for s in results.get("sessions") or [] if isinstance(s, dict) and s.get("processor")]
    if found:
        return list(dict.fromkeys(found))
    device = results.get("device")
    if not isinstance(device, str) or not device:
        return []
    return [inferred or re.sub(r" \(\d+ threads?\)$", "", device)]


def session_processor(s: dict, inferred: str | None = None) -> str:
    """One training session's processor: as recorded, qualified by the CPU's family where the session trained on
    the CPU (its `device` counts threads) and recorded it, else the run's inferred processor if any."""
    on_cpu = re.search(r" \(\d+ threads?\)$", s.get("device") or "") is not None
    if on_cpu and s.get("cpu_id"):
        return _qualified(s["processor"], s["cpu_id"])
    return inferred if on_cpu and inferred and not s.get("cpu_id") else s["processor"]
