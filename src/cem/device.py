"""The machine a run uses: device choice, bf16 autocast, the machine's name and its measured peak FLOP/s.

One home for what training, evaluation and the benchmarks all need to know about the hardware.
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform
import re
import time
from pathlib import Path

import torch

from .checks import check_choice

__all__ = ["PARALLEL", "PRECISIONS", "autocast_for", "cpu_id", "cpu_model", "cuda_device_ids", "device_name", "peak_flops", "pick_device"]

PRECISIONS = ("auto", "bf16", "fp32")
PARALLEL = ("ddp", "fsdp")  # how a torchrun run shares the model among its devices (`cem.training.distributed`)


def pick_device(name: str) -> torch.device:
    """"auto" (CUDA when available, else the CPU) or a torch device name; ValueError for an unknown name
    or for CUDA on a machine without it."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise ValueError(f"unknown device {name!r}; expected auto, cpu, cuda, cuda:N or mps") from None
    if device.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"device {name!r}: cem runs on auto, cpu, cuda, cuda:N or mps")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r}: no CUDA device is available (torch.cuda.is_available() is False)")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"device {name!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {name!r}: MPS is not available on this machine")
    return device


_CUDA_ID = re.compile(r"\d+|(?:GPU|MIG)-[0-9A-Za-z/-]+")  # what CUDA_VISIBLE_DEVICES takes: an index, or a device's UUID


def cuda_device_ids(devices, flag: str = "--devices") -> list[str]:
    """CUDA device ids given for CUDA_VISIBLE_DEVICES (a comma-separated string or a sequence), each a device of this
    machine: an index below its device count (or one of its own CUDA_VISIBLE_DEVICES, where that is set), or a
    GPU-/MIG- UUID. ValueError naming `flag` for a malformed id, and for any id on a machine without CUDA (the runs
    would train on the CPU without a word)."""
    ids = [d.strip() for d in devices.split(",")] if isinstance(devices, str) else [str(d).strip() for d in devices]
    bad = next((i for i in ids if not _CUDA_ID.fullmatch(i)), None)
    if not ids or bad is not None:
        raise ValueError(f"{flag} {devices if isinstance(devices, str) else ','.join(ids)!r}: {'no device id' if not ids else f'{bad!r} is no device id'} "
                         "(give CUDA device indices or UUIDs, comma-separated, e.g. 0,1)")
    if not torch.cuda.is_available():
        raise ValueError(f"{flag} {','.join(ids)}: this machine has no CUDA device (torch.cuda.is_available() is False)")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    known = [v.strip() for v in visible.split(",")] if visible else [str(i) for i in range(torch.cuda.device_count())]
    missing = [i for i in ids if i.isdigit() and i not in known]
    if missing:
        raise ValueError(f"{flag} {','.join(ids)}: no CUDA device {missing[0]} here (this machine's: {','.join(known)})")
    return ids


def uses_bf16(precision: str, device: torch.device) -> bool:
    """Whether `precision` means bf16 autocast on `device` ("auto": on a GPU that supports it)."""
    check_choice("precision", precision, PRECISIONS)
    return precision == "bf16" or (precision == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported())


def autocast_for(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """bf16 autocast where `uses_bf16` says so; else nothing."""
    return torch.autocast(device.type, dtype=torch.bfloat16) if uses_bf16(precision, device) else contextlib.nullcontext()


CPUINFO = Path("/proc/cpuinfo")


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo (empty where that file is missing)."""
    out: dict[str, str] = {}
    try:
        for line in CPUINFO.read_text().splitlines():
            if not line.strip():
                break  # the first processor's block ends
            key, _, value = line.partition(":")
            out.setdefault(key.strip().lower(), value.strip())
    except OSError:
        pass
    return out


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo (platform's answer where that file is missing)."""
    return _cpuinfo().get("model name") or platform.processor() or platform.machine() or "unknown CPU"


def cpu_id() -> str | None:
    """The CPU's vendor, family, model and stepping from /proc/cpuinfo ("AuthenticAMD family 23 model 49 stepping 0"):
    what tells two CPUs apart where a virtual machine shows both under one model name (e.g. "AMD EPYC"), and
    they sum floats differently. None where /proc/cpuinfo does not say."""
    info = _cpuinfo()
    if "cpu family" not in info or "model" not in info:
        return None
    return f"{info.get('vendor_id', 'unknown vendor')} family {info['cpu family']} model {info['model']} stepping {info.get('stepping', '?')}"


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU model with the number of threads torch uses."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    n = torch.get_num_threads()
    return f"{cpu_model()} ({n} thread{'s' if n != 1 else ''})"


@functools.lru_cache(maxsize=None)
def peak_flops(device: torch.device, dtype: torch.dtype = torch.bfloat16, n: int = 8192, repeats: int = 20) -> float:
    """The device's measured matmul FLOP/s (the denominator of MFU, never a hard-coded figure): the best of
    `repeats` n×n×n matmuls in `dtype` (bf16 on GPU; fp32 and n <= 1024 on the CPU)."""
    if device.type != "cuda":
        dtype = torch.float32
        n = min(n, 1024)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best
