"""The recursion of a CEM layer (paper §2.3): the number of steps T, the step size η of each step, and
where the recursion starts.

Step-size schedules (η_t for step t = 0..T-1 of T):
- `constant`: η_t = η (the paper's reading; it fixes η = 1 for T = 1 and says nothing for T > 1);
- `inverse`: η_t = η / T, so the total step length does not grow with T;
- `learned`: η_t = η · g_t with a learned gain per step (init 1); a step beyond the learned ones uses the
  last gain, so a model can be run with more steps than it was trained with.
`learn_step_size=True` multiplies every step by one more learned scalar gain (any schedule).

Start points x^(0):
- `residual`: x^(0) = h, the raw residual stream (docs/design.md; the residual connection is the start of the
  optimisation), so T = 1 is exactly a pre-norm residual sublayer;
- `norm`: x^(0) = RMSNorm(h), Algorithm 1 read literally (`h ← RMSNorm(h); x ← h`): the sublayer's output
  replaces the residual stream by its normalised value plus the steps.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ._checks import check_choice, check_finite, check_positive_int

STEP_SCHEDULES = ("constant", "inverse", "learned")
STARTS = ("residual", "norm")


class StepSize(nn.Module):
    """η_t of step t of T: `step_size` (a plain float, changeable at test time) under a schedule, times a
    learned scalar gain if asked. `learned_steps` is how many per-step gains the `learned` schedule holds."""

    def __init__(self, step_size: float = 1.0, learnable: bool = False, schedule: str = "constant", learned_steps: int = 1) -> None:
        super().__init__()
        check_choice("step_schedule", schedule, STEP_SCHEDULES)
        check_positive_int("learned_steps", learned_steps)
        check_finite("step_size", step_size, 0, low_open=True)
        self.step_size = float(step_size)
        self.schedule = schedule
        self.gain = nn.Parameter(torch.ones(())) if learnable else None
        self.step_gains = nn.Parameter(torch.ones(learned_steps)) if schedule == "learned" else None

    def forward(self, t: int = 0, steps: int = 1) -> float | Tensor:
        """η_t for step t (0-based) of `steps`."""
        eta: float | Tensor = self.step_size / steps if self.schedule == "inverse" else self.step_size
        if self.step_gains is not None:
            eta = eta * self.step_gains[min(t, self.step_gains.numel() - 1)]
        return eta if self.gain is None else eta * self.gain

    def extra_repr(self) -> str:
        return f"step_size={self.step_size}, schedule={self.schedule}, learnable={self.gain is not None}"


class DescentLayer(nn.Module):
    """Base of the CEM layers: `steps` (T) and `step_size` (η) are plain attributes, changeable on a
    built or trained model (the test-time compute knob of §2.3).

    In training, `draw_steps` can set the T of the next forward passes (random-depth training); evaluation
    always uses `steps`.
    """

    def __init__(
        self,
        steps: int,
        step_size: float,
        learn_step_size: bool,
        step_schedule: str = "constant",
        learned_steps: int | None = None,
        start: str = "residual",
    ) -> None:
        super().__init__()
        check_choice("start", start, STARTS)
        self.steps = steps
        self.start = start
        self.eta = StepSize(step_size, learn_step_size, step_schedule, learned_steps or steps)
        self.drawn_steps: int | None = None

    @property
    def steps(self) -> int:
        return self._steps

    @steps.setter
    def steps(self, value: int) -> None:
        check_positive_int("steps", value)
        self._steps = value

    @property
    def step_size(self) -> float:
        return self.eta.step_size

    @step_size.setter
    def step_size(self, value: float) -> None:
        check_finite("step_size", value, 0, low_open=True)
        self.eta.step_size = float(value)

    def depth(self) -> int:
        """The T of this forward pass: a drawn depth while training with random depth, else `steps`."""
        return self.drawn_steps if (self.training and self.drawn_steps is not None) else self.steps

    def start_point(self, h: Tensor, hn: Tensor) -> tuple[Tensor, Tensor | None]:
        """x^(0) and, when it is already known, u^(0) = norm(x^(0)) (with x^(0) = h it is ĥ)."""
        return (h, hn) if self.start == "residual" else (hn, None)

    def descend(self, h: Tensor, hn: Tensor, direction) -> Tensor:
        """x^(0) from `start`, then x^(t+1) = x^(t) + η_t direction(norm(x^(t))) for t < T; returns x^(T)."""
        x, u = self.start_point(h, hn)
        steps = self.depth()
        for t in range(steps):
            if t > 0 or u is None:
                u = self.norm(x)
            x = x + self.eta(t, steps) * direction(u)
        return x
