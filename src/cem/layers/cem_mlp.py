"""CEM MLP: T gradient steps on the element-wise energy (paper eq. 6-11, 13; docs/design.md, gated MLP).

    ξ(u | ĥ_i) = - γ_i · φ(V u),   γ_i = W ĥ_i,   φ(z) = ∫_0^z SiLU
    x <- x + η P V^T (γ_i ∘ SiLU(V u)),   u = norm(x)

The convex variant of App. B uses ξ = -|γ| · φ(sign(γ) ∘ V u), whose step is η P Vᵀ(γ ∘ SiLU(sign(γ) ∘ V u)).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..checks import check_choice, check_positive_int, check_residual, check_same_shape
from .kinds import MLP_KINDS, MLPConfig, Shape, SublayerKind
from .norm import RMSNorm
from .precond import PRECONDITIONERS, make_preconditioner
from .steps import DescentLayer, Recursion

MLP_ENERGIES = ("gated", "convex")


# Li2(x) = Σ_n B_n w^(n+1) / (n+1)! with w = -ln(1 - x) (Bernoulli numbers, B_1 = -1/2): the coefficients of
# w^1, w^2, w^3, w^5, ..., w^17; for x in [-1, 0), |w| <= ln 2 and the next term is below 1e-16
_LI2_SERIES = (1.0, -0.25, 1 / 36, -1 / 3600, 1 / 211680, -1 / 10886400, 1 / 526901760, -691 / 16999766784000,
               1 / 1120863744000, -3617 / 181400588328960000)
# φ's Taylor series at 0, z²/4 + Σ_n (4^n - 1) B_2n z^(2n+1) / (2n+1)!: the coefficients of z^3, z^5, ..., z^19,
# used for |z| < 1/2, where the closed form cancels (its terms are about π²/12, φ about z²/4)
_PHI_TAYLOR = (1 / 12, -1 / 240, 1 / 3360, -17 / 725760, 31 / 15966720, -691 / 4151347200, 5461 / 373621248000,
               -929569 / 711374856192000, 3202291 / 27032244535296000)


def _horner(x2: Tensor, coefficients) -> Tensor:
    """Σ_k c_k x2^k."""
    out = torch.zeros_like(x2)
    for c in reversed(coefficients):
        out = out * x2 + c
    return out


def silu_integral(z: Tensor) -> Tensor:
    """φ(z) = ∫_0^z SiLU(t) dt in closed form: φ(z) = z·softplus(z) + Li2(-e^z) + π²/12 for z <= 0, and
    φ(z) = z²/2 - φ(-z) for z > 0 (SiLU(t) - SiLU(-t) = t), with Li2 by its Bernoulli series; by φ's Taylor
    series near 0. Float64-exact; in float32 as accurate as its quadrature was, at a tenth of the cost."""
    terms = None if z.dtype == torch.float64 else 4  # other dtypes: the next terms are under 1e-8 relative
    a = -z.abs()
    s = F.softplus(a)  # ln(1 + e^a) in (0, ln 2]: w = -s
    s2 = s * s
    li2 = -s - s2 / 4 - s * s2 * _horner(s2, _LI2_SERIES[2:][:terms])  # Σ c_k w^(2k+1) = -s^3 Σ c_k s^(2k-2)
    phi = a * s + li2 + math.pi**2 / 12
    z2 = z * z
    near = z2 / 4 + z * z2 * _horner(z2, _PHI_TAYLOR[:terms])
    return torch.where(z.abs() < 0.5, near, torch.where(z > 0, z2 / 2 - phi, phi))


def sign_ste(g: Tensor) -> Tensor:
    """sign(g) in the forward pass; straight-through (hardtanh) gradient in the backward pass (App. B)."""
    soft = F.hardtanh(g)
    return torch.sign(g).detach() + soft - soft.detach()


class CEMMLP(DescentLayer):
    """Weight-tied gated MLP as `steps` descent steps on the element-wise energy (Alg. 1, MLP subroutine).

    `w_gate` is W (the gate γ = W ĥ, computed once from the input), `w_up` is V (up projection; its
    transpose is the down projection), `precond` P_mlp (None = identity). `energy="convex"` selects the
    convex energy of App. B (sign through a straight-through estimator). `recursion` holds T, η, the
    schedule and the start point (`cem.layers.steps.Recursion`).
    """

    sublayer = "mlp"

    def __init__(
        self,
        dim: int,
        hidden_dim: int,
        *,
        recursion: Recursion = Recursion(),
        precond: str = "identity",
        precond_rank: int = 16,
        energy: str = "gated",
        eps: float = 1e-6,
    ) -> None:
        """A CEM MLP sublayer mapping the residual stream h (B, J, dim) to h' (B, J, dim).

        dim, hidden_dim: model width D and hidden width H of the gate W and the tied up/down projection V.
        recursion: T (`steps`), η (`step_size`), the step schedule and the start point x^(0).
        precond: "identity", "diag" or "diag_lowrank" preconditioner P_mlp (rank `precond_rank`).
        energy: "gated" (the paper's element-wise energy, eq. 13) or "convex" (App. B).
        eps: the RMSNorm epsilon.
        """
        super().__init__(recursion, dim)
        check_positive_int("dim", dim)
        check_positive_int("hidden_dim", hidden_dim)
        check_choice("energy", energy, MLP_ENERGIES)
        self.dim, self.hidden_dim, self.convex = dim, hidden_dim, energy == "convex"
        self.norm = RMSNorm(dim, eps)
        self.w_gate = nn.Linear(dim, hidden_dim, bias=False)
        self.w_up = nn.Linear(dim, hidden_dim, bias=False)
        self.precond = make_preconditioner(precond, 1, dim, precond_rank)

    def output_weight(self) -> Tensor:
        """V P (m, D): the preconditioner folded into the tied down projection once per forward, so that
        P Vᵀ g = g @ (V P) (P is symmetric: row r is P V[r]); V itself without a preconditioner."""
        if self.precond is None:
            return self.w_up.weight
        return self.precond(self.w_up.weight.unsqueeze(-2)).squeeze(-2)

    def direction(self, u: Tensor, gamma: Tensor, w_out: Tensor | None = None, with_energy: bool = False):
        """P Vᵀ(γ ∘ SiLU(V u)) = -P ∇_u ξ (convex: SiLU(sign(γ) ∘ V u)), shape (B, J, D); with `w_out` =
        `output_weight()` the preconditioner is already folded into the down projection.
        `with_energy=True` returns (direction, ξ(u)) with ξ (B, J) from the same V u (eq. 7)."""
        z = self.w_up(u)
        if self.convex:
            z = sign_ste(gamma) * z
        g = gamma * F.silu(z)
        if w_out is not None:
            y = g @ w_out
        else:
            y = g @ self.w_up.weight  # Vᵀ(...): the down projection is the tied Vᵀ
            y = y if self.precond is None else self.precond(y.unsqueeze(-2)).squeeze(-2)
        return (y, self._energy(z, gamma)) if with_energy else y

    def _energy(self, z: Tensor, gamma: Tensor) -> Tensor:
        """ξ = -γ · φ(z), or -|γ| · φ(z) for the convex energy, where z is V u (convex: sign(γ) ∘ V u)."""
        return -((gamma.abs() if self.convex else gamma) * silu_integral(z)).sum(-1)

    def forward(self, h: Tensor, cache=None) -> Tensor:
        """x^(0) = h (or ĥ), x^(t+1) = x^(t) + η_t direction(norm(x^(t))); returns x^(T). `cache` is unused.
        The preconditioner is folded into the down projection once for all steps (`output_weight`) when there
        are at least as many tokens as hidden rows (else applying it per token is cheaper)."""
        check_residual(h, self.dim, "CEMMLP", self.norm.weight.dtype)
        hn = self.norm(h)
        gamma = self.w_gate(hn)
        fold = self.precond is not None and h.shape[:-1].numel() >= self.hidden_dim
        w_out = self.output_weight() if fold else None
        return self.descend(h, hn, lambda u, with_energy=False: self.direction(u, gamma, w_out, with_energy))

    def energy(self, u: Tensor, h: Tensor) -> Tensor:
        """ξ(u_i | ĥ_i) for every position, shape (B, J): the energy the forward pass descends.

        u (B, J, D) is the normalised point the energy is evaluated at (e.g. `self.norm(x)` for a step's x^(t));
        h (B, J, D) is the raw residual stream the layer was called with, normalised here for the gate
        γ = W norm(h), as in the forward pass (eq. 13)."""
        check_residual(u, self.dim, "CEMMLP.energy")
        check_residual(h, self.dim, "CEMMLP.energy")
        check_same_shape(u, h, "CEMMLP.energy")
        gamma = self.w_gate(self.norm(h))
        z = self.w_up(u)
        return self._energy(torch.sign(gamma) * z if self.convex else z, gamma)

    def extra_repr(self) -> str:
        precond = "identity" if self.precond is None else f"rank {self.precond.rank}"
        return (
            f"dim={self.dim}, hidden_dim={self.hidden_dim}, steps={self.steps}, step_size={self.step_size}, "
            f"precond={precond}, energy={'convex' if self.convex else 'gated'}, start={self.recursion.start}"
        )


def cem_mlp_flops(s: Shape, c: MLPConfig, seq_len: int) -> int:
    """Per token: the gate W ĥ once (2Dm), then per step V u and Vᵀ g (2 · 2Dm); P folded into the down
    projection V once per forward (m rows), spread over the `seq_len` tokens (a sequence of at least m
    tokens, as in LM training; `CEMMLP` applies P per token when it has fewer)."""
    D, m = s.dim, s.hidden_dim
    fold = PRECONDITIONERS[c.precond].folded_flops(m, D, c.precond_rank, seq_len)
    return 2 * D * m + fold + c.recursion.steps * 2 * 2 * D * m


def build_cem_mlp(s: Shape, c: MLPConfig) -> CEMMLP:
    """The CEM MLP of an MLP config (eq. 13 with its recursion)."""
    return CEMMLP(s.dim, s.hidden_dim, recursion=c.recursion, precond=c.precond, precond_rank=c.precond_rank,
                  energy=c.energy, eps=s.eps)


MLP_KINDS["cem"] = SublayerKind(CEMMLP, build=build_cem_mlp, flops=cem_mlp_flops, settings=lambda c: tuple(f for f in MLPConfig.__dataclass_fields__ if f != "kind"))
MLPConfig.CHOICES["energy"] = MLP_ENERGIES
