"""The device's measured peak matmul throughput, the denominator of MFU (never a hard-coded figure)."""

from __future__ import annotations

import functools
import time

import torch


@functools.lru_cache(maxsize=None)
def peak_flops(device: torch.device, dtype: torch.dtype = torch.bfloat16, n: int = 8192, repeats: int = 20) -> float:
    """FLOP/s of the best of `repeats` n×n×n matmuls in `dtype` on `device` (bf16 on GPU)."""
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
