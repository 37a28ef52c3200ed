"""Plain layer reuse: one sublayer applied n times with its residual (the control of paper Fig. 3c, 4)."""

from __future__ import annotations

from torch import Tensor, nn

from ..checks import check_positive_int


class Reuse(nn.Module):
    """h <- layer(h), `times` times, with the same weights. Each application keeps its own cache slot."""

    def __init__(self, layer: nn.Module, times: int = 2) -> None:
        super().__init__()
        self.layer = layer
        self.times = times

    @property
    def times(self) -> int:
        return self._times

    @times.setter
    def times(self, value: int) -> None:
        check_positive_int("times", value)
        self._times = value

    def forward(self, h: Tensor, cache=None) -> Tensor:
        for r in range(self.times):
            h = self.layer(h, cache=None if cache is None else cache.child(r))
        return h
