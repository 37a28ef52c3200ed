"""`CEMRegressor` (embedding, one recursive CEM MLP, readout), its parameters and its FLOPs."""

from __future__ import annotations


from torch import Tensor, nn

from cem.layers import CEMMLP, PRECONDITIONERS, Recursion
from .config import GPConfig


# ---------------------------------------------------------------------------------------------- model


class CEMRegressor(nn.Module):
    """x -> embed -> CEMMLP (T weight-tied descent steps, residual inside) -> linear readout -> ŷ.

    `embed="identity"` skips the embedding (then `dim` must equal `input_dim`): the latent state is the
    input itself, the other reading of the paper's truncated "latent state dimension is set equal to ...".
    """

    def __init__(
        self,
        input_dim: int,
        dim: int,
        hidden_dim: int,
        *,
        steps: int = 1,
        step_size: float = 1.0,
        precond: str = "identity",
        precond_rank: int = 16,
        energy: str = "gated",
        embed: str = "linear",
    ) -> None:
        super().__init__()
        if embed not in ("linear", "identity"):
            raise ValueError(f"unknown embed {embed!r}; expected 'linear' or 'identity'")
        if embed == "identity" and dim != input_dim:
            raise ValueError(f"embed='identity' needs dim == input_dim, got {dim} != {input_dim}")
        self.input_dim = input_dim
        self.embed = nn.Linear(input_dim, dim) if embed == "linear" else nn.Identity()
        recursion = Recursion(steps, step_size)
        self.cem = CEMMLP(dim, hidden_dim, recursion=recursion, precond=precond, precond_rank=precond_rank, energy=energy)
        self.readout = nn.Linear(dim, 1)

    @property
    def steps(self) -> int:
        return self.cem.steps

    @steps.setter
    def steps(self, value: int) -> None:
        self.cem.steps = value

    def forward(self, x: Tensor) -> Tensor:
        """(N, input_dim) -> (N,): each point is a sequence of length one, shape (N, 1, D) for the CEM layer."""
        h = self.embed(x).unsqueeze(1)
        return self.readout(self.cem(h)).squeeze(-1).squeeze(-1)

    @classmethod
    def from_config(cls, cfg: GPConfig, steps: int) -> "CEMRegressor":
        return cls(
            cfg.input_dim,
            cfg.dim,
            cfg.hidden_dim,
            steps=steps,
            step_size=cfg.step_size,
            precond=cfg.precond,
            precond_rank=cfg.precond_rank,
            energy=cfg.energy,
            embed=cfg.embed,
        )


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def regressor_flops(
    input_dim: int,
    dim: int,
    hidden_dim: int,
    steps: int,
    *,
    precond: str = "identity",
    precond_rank: int = 16,
    embed: str = "linear",
) -> int:
    """Forward matmul FLOPs per example (2 per multiply-add; norms, activations, biases not counted):

        embedding 2·d_in·D  +  gate 2·D·m (once)  +  T·(up 2·D·m + its transpose 2·D·m [+ low-rank P 8·D·R])
        +  readout 2·D

    This is what `torch.utils.flop_counter.FlopCounterMode` counts on the same forward pass.
    """
    per_step = 4 * dim * hidden_dim + PRECONDITIONERS[precond].matmul_flops(dim, precond_rank)
    emb = 2 * input_dim * dim if embed == "linear" else 0
    return emb + 2 * dim * hidden_dim + steps * per_step + 2 * dim


def config_flops(cfg: GPConfig, steps: int) -> int:
    return regressor_flops(
        cfg.input_dim,
        cfg.dim,
        cfg.hidden_dim,
        steps,
        precond=cfg.precond,
        precond_rank=cfg.precond_rank,
        embed=cfg.embed,
    )
