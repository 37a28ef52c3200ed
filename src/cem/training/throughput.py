"""The throughput meter of the training loop: tokens per second and model FLOP utilisation."""

from __future__ import annotations

import time


class Throughput:
    """Tokens per second since the last report, and the model FLOP utilisation when the peak is known."""

    def __init__(self, flops_per_token: int, peak: float | None) -> None:
        self.flops_per_token, self.peak = flops_per_token, peak
        self.start, self.tokens = time.perf_counter(), 0

    def add(self, tokens: int) -> None:
        self.tokens += tokens

    def report(self, world_size: int) -> dict:
        now = time.perf_counter()
        tok_s = self.tokens / max(now - self.start, 1e-9)
        self.start, self.tokens = now, 0
        out = {"tokens_per_s": tok_s}
        if self.peak:
            out["mfu"] = tok_s * self.flops_per_token / (self.peak * world_size)
        return out
