"""The divergence guard: stops a run whose loss or weight norm blows up, before any checkpoint holds the
blown-up state, and never a healthy noisy one (issue 20)."""

from __future__ import annotations

import math
import statistics
from collections import deque

RECENT = 10  # the loss is judged by the median of this many latest steps, so that one noisy batch stops nothing


class DivergenceGuard:
    """Stops a run whose loss explodes, or whose loss, gradient norm or weights are not finite.

    What signals divergence is a loss that stays far above where it was: the median of the latest
    `RECENT` losses beyond `factor` times the median of the earlier ones in the last `window` (judged once
    `warmup` and 2 x `RECENT` values are known), or any loss beyond `factor` times the loss of a uniform prediction, ln(vocab). Single-step
    spikes of the loss or of the gradient norm are noise in small-batch runs (updates are clipped anyway)
    and stop nothing. The weight norm after each update is judged too, against `factor` times its running
    median (before the warm-up: its value at the start), so a step that blows the weights up is caught
    before any checkpoint holds them, even when the loss saturates. `factor` 0 turns the finite checks off
    (non-finite values still stop the run)."""

    def __init__(self, factor: float, warmup: int, vocab_size: int, window: int = 100) -> None:
        self.factor, self.warmup = factor, warmup
        self.uniform = math.log(vocab_size)
        self.losses: deque[float] = deque(maxlen=window)
        self.grad_norms: deque[float] = deque(maxlen=window)  # recorded for the logs and checkpoints, not judged
        self.weight_norms: deque[float] = deque(maxlen=window)
        self.start_weight_norm: float | None = None

    def loss_bound(self) -> tuple[float, str]:
        """The largest acceptable loss of any one batch (a validation batch before a checkpoint too) and
        what it is derived from: `factor` times the loss of a uniform guess."""
        return self.factor * self.uniform, f"diverge_factor={self.factor:g} x the loss of a uniform guess ln({math.exp(self.uniform):.0f})={self.uniform:.3g}"

    def problem(self, loss: float, grad_norm: float) -> str | None:
        """Why (loss, grad_norm) of the next step means divergence, or None."""
        if not math.isfinite(loss) or not math.isfinite(grad_norm):
            return f"loss {loss} / gradient norm {grad_norm} is not finite"
        if not self.factor:
            return None
        bound, why = self.loss_bound()
        if loss > bound:
            return f"loss {loss:.4g} exceeds {why}"
        if len(self.losses) >= max(self.warmup, 2 * RECENT):
            *earlier, = self.losses
            latest = [*earlier[1 - RECENT:], loss]
            med, recent = statistics.median(earlier[: 1 - RECENT]), statistics.median(latest)
            if recent > self.factor * med:
                return (f"the median loss of the last {RECENT} steps, {recent:.4g}, exceeds diverge_factor={self.factor:g} x "
                        f"the median of the {len(earlier) + 1 - RECENT} steps before, {med:.4g}")
        return None

    def add(self, loss: float, grad_norm: float) -> None:
        self.losses.append(loss)
        self.grad_norms.append(grad_norm)

    def weight_problem(self, norm: float) -> str | None:
        """Why the weight norm after an update means divergence, or None (then it is recorded)."""
        if self.start_weight_norm is None:
            self.start_weight_norm = norm
        if not math.isfinite(norm):
            return "the weights are no longer finite"
        if self.factor:
            if len(self.weight_norms) >= max(self.warmup, 1):
                ref, what = statistics.median(self.weight_norms), "its running median"
            else:
                ref, what = self.start_weight_norm, "its value at the start"
            if norm > self.factor * ref:
                return f"the weight norm {norm:.4g} exceeds diverge_factor={self.factor:g} x {what} {ref:.4g}"
        self.weight_norms.append(norm)
        return None

    def state_dict(self) -> dict:
        return {"losses": list(self.losses), "grad_norms": list(self.grad_norms), "weight_norms": list(self.weight_norms),
                "start_weight_norm": self.start_weight_norm}  # fmt: skip

    def load_state_dict(self, state: dict) -> None:
        self.losses.extend(state.get("losses", []))
        self.grad_norms.extend(state.get("grad_norms", []))
        self.weight_norms.extend(state.get("weight_norms", []))
        self.start_weight_norm = state.get("start_weight_norm")
