"""Learned lightweight preconditioners P = diag(softplus(sqrt(D) p)) + U Vᵀ + V Uᵀ (paper eq. 12-13, App. C.4)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..checks import check_choice, check_positive_int

PRECONDITIONERS = ("identity", "diag", "diag_lowrank")


class Preconditioner(nn.Module):
    """`n` independent preconditioners P_1..P_n of size D, applied in O(D·R) (never a dense matrix).

    Parameters: `p` (n, D) initialised to 1/sqrt(D) (so sqrt(D) p = 1); for the low-rank kind also
    `u` (n, D, R) ~ N(0, 0.02²) and `v` (n, D, R) = 0, so P starts diagonal and symmetric by construction.
    """

    U_INIT_STD = 0.02

    def __init__(self, n: int, dim: int, rank: int | None = None) -> None:
        super().__init__()
        self.dim = dim
        self.p = nn.Parameter(torch.full((n, dim), 1.0 / math.sqrt(dim)))
        if rank is not None:
            check_positive_int("precond_rank", rank)
            self.u = nn.Parameter(torch.randn(n, dim, rank) * self.U_INIT_STD)
            self.v = nn.Parameter(torch.zeros(n, dim, rank))
        else:
            self.u = self.v = None

    @property
    def rank(self) -> int:
        return 0 if self.u is None else self.u.shape[-1]

    def diagonal(self) -> Tensor:
        """softplus(sqrt(D) p), the strictly positive diagonal, shape (n, D)."""
        return F.softplus(math.sqrt(self.dim) * self.p)

    def forward(self, y: Tensor) -> Tensor:
        """P_k y_k for y of shape (..., n, D)."""
        out = self.diagonal() * y
        if self.u is not None:
            out = out + torch.einsum("...nr,ndr->...nd", torch.einsum("...nd,ndr->...nr", y, self.v), self.u)
            out = out + torch.einsum("...nr,ndr->...nd", torch.einsum("...nd,ndr->...nr", y, self.u), self.v)
        return out

    def dense(self) -> Tensor:
        """The matrices P_k as a dense (n, D, D) tensor, for tests and inspection only."""
        mat = torch.diag_embed(self.diagonal())
        if self.u is not None:
            mat = mat + self.u @ self.v.transpose(-1, -2) + self.v @ self.u.transpose(-1, -2)
        return mat


def make_preconditioner(kind: str, n: int, dim: int, rank: int) -> Preconditioner | None:
    """`None` for identity, else a `Preconditioner` of the given kind."""
    check_choice("precond", kind, PRECONDITIONERS)
    if kind == "identity":
        return None
    return Preconditioner(n, dim, rank if kind == "diag_lowrank" else None)
