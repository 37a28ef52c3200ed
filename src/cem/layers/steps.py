"""The step size η of a CEM layer's descent steps (paper §2.3): a float, optionally times a learned gain."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ._checks import check_positive_int


class StepSize(nn.Module):
    """η = step_size (a plain float, changeable at test time) × g, with g a learned scalar (init 1) if asked."""

    def __init__(self, step_size: float = 1.0, learnable: bool = False) -> None:
        super().__init__()
        self.step_size = float(step_size)
        self.gain = nn.Parameter(torch.ones(())) if learnable else None

    def forward(self) -> float | Tensor:
        return self.step_size if self.gain is None else self.step_size * self.gain

    def extra_repr(self) -> str:
        return f"step_size={self.step_size}, learnable={self.gain is not None}"


class DescentLayer(nn.Module):
    """Base of the CEM layers: `steps` (T) and `step_size` (η) are plain attributes, changeable on a
    built or trained model (the test-time compute knob of §2.3)."""

    def __init__(self, steps: int, step_size: float, learn_step_size: bool) -> None:
        super().__init__()
        self.steps = steps
        self.step = StepSize(step_size, learn_step_size)

    @property
    def steps(self) -> int:
        return self._steps

    @steps.setter
    def steps(self, value: int) -> None:
        check_positive_int("steps", value)
        self._steps = value

    @property
    def step_size(self) -> float:
        return self.step.step_size

    @step_size.setter
    def step_size(self, value: float) -> None:
        self.step.step_size = float(value)
