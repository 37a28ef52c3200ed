"""Learned lightweight preconditioners P = diag(softplus(sqrt(D) p)) + U Vᵀ + V Uᵀ (paper eq. 12-13, App. C.4)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..checks import check_choice, check_positive_int

class Preconditioner(nn.Module):
    """`n` independent preconditioners P_1..P_n of size D, applied in O(D·R) (never a dense matrix).

    Parameters: `p` (n, D) initialised to 1/sqrt(D) (so sqrt(D) p = 1); for the low-rank kind also
    `u` (n, D, R) ~ N(0, 0.02²) and `v` (n, D, R) = 0, so P starts diagonal and symmetric by construction.
    """

    U_INIT_STD = 0.02

    def __init__(self, n: int, dim: int, rank: int | None = None) -> None:
        super().__init__()
        self.dim = dim
        self.p = nn.Parameter(torch.empty(n, dim))
        if rank is not None:
            check_positive_int("precond_rank", rank)
            self.u = nn.Parameter(torch.empty(n, dim, rank))
            self.v = nn.Parameter(torch.empty(n, dim, rank))
        else:
            self.u = self.v = None
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """The initial values (the class doc); U is drawn from torch's global generator."""
        self.p.fill_(1.0 / math.sqrt(self.dim))
        if self.u is not None:
            self.u.copy_(torch.randn(self.u.shape) * self.U_INIT_STD)
            self.v.zero_()

    @property
    def rank(self) -> int:
        return 0 if self.u is None else self.u.shape[-1]

    def diagonal(self) -> Tensor:
        """softplus(sqrt(D) p), the strictly positive diagonal, shape (n, D)."""
        return F.softplus(math.sqrt(self.dim) * self.p)

    def forward(self, y: Tensor) -> Tensor:
        """P_k y_k for y of shape (..., n, D); with n = 1 also y of shape (..., D)."""
        if self.p.shape[0] == 1:
            return self.leading(y)
        return self.leading(y.movedim(-2, 0)).movedim(0, -2)

    def leading(self, y: Tensor) -> Tensor:
        """P_k y[k] for y of shape (n, ..., D), the preconditioners along the first axis; with n = 1 also y of shape
        (..., D). A y of shape (n, rows, D) is the batched products' layout, taken as it is (no view operators)."""
        n = self.p.shape[0]
        diag = self.diagonal()
        out = (diag if n == 1 else diag.view(n, *[1] * (y.dim() - 2), self.dim)) * y
        if self.u is not None:
            # U (Vᵀ y) + V (Uᵀ y) as the batched products einsum would run (the same bmm calls, so the same bits),
            # without its reshuffling of views on every call
            laid_out = y.dim() == 3 and y.shape[0] == n
            rows = y if laid_out else y.reshape(n, -1, self.dim)
            for a, b in ((self.v, self.u), (self.u, self.v)):
                term = torch.bmm(torch.bmm(rows, a), b.transpose(1, 2))  # (n, rows, D)
                out = out + (term if laid_out else term.view(y.shape))
        return out

    def dense(self) -> Tensor:
        """The matrices P_k as a dense (n, D, D) tensor, for tests and inspection only."""
        mat = torch.diag_embed(self.diagonal())
        if self.u is not None:
            mat = mat + self.u @ self.v.transpose(-1, -2) + self.v @ self.u.transpose(-1, -2)
        return mat


@dataclass(frozen=True)
class PreconditionerKind:
    """A kind of P: with the diagonal term or not (identity), with the low-rank term U Vᵀ + V Uᵀ or not;
    and what applying it costs."""

    diagonal: bool
    low_rank: bool

    def matmul_flops(self, dim: int, rank: int) -> int:
        """Matmul FLOPs of P y for one vector y of size D: U (Vᵀ y) and V (Uᵀ y), four D×R products."""
        return 8 * dim * rank if self.low_rank else 0

    def flops(self, dim: int, rank: int) -> int:
        """FLOPs of P y for one vector y, the diagonal's 2·D (a multiply-add per entry, as the model's count) included."""
        return (2 * dim if self.diagonal else 0) + self.matmul_flops(dim, rank)

    def folded_flops(self, rows: int, dim: int, rank: int, tokens: int) -> int:
        """FLOPs per token of P folded into a weight of `rows` rows once per forward pass of `tokens` tokens."""
        return rows * self.flops(dim, rank) // tokens


PRECONDITIONERS: dict[str, PreconditionerKind] = {
    "identity": PreconditionerKind(diagonal=False, low_rank=False),
    "diag": PreconditionerKind(diagonal=True, low_rank=False),
    "diag_lowrank": PreconditionerKind(diagonal=True, low_rank=True),
}


def make_preconditioner(kind: str, n: int, dim: int, rank: int) -> Preconditioner | None:
    """`None` for identity, else a `Preconditioner` of the given kind."""
    check_choice("precond", kind, tuple(PRECONDITIONERS))
    spec = PRECONDITIONERS[kind]
    if not spec.diagonal:
        return None
    return Preconditioner(n, dim, rank if spec.low_rank else None)
