"""Argument and input validation shared by the layers: clear ValueErrors instead of deep torch errors."""

from __future__ import annotations

from torch import Tensor


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    """Raise ValueError unless `value` is one of `choices`."""
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; expected one of {', '.join(map(repr, choices))}")


def check_positive_int(name: str, value: int) -> None:
    """Raise ValueError unless `value` is an integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def check_heads(dim: int, n_heads: int) -> None:
    """Raise ValueError unless `n_heads` divides `dim`."""
    check_positive_int("dim", dim)
    check_positive_int("n_heads", n_heads)
    if dim % n_heads:
        raise ValueError(f"dim ({dim}) must be divisible by n_heads ({n_heads})")


def check_residual(h: Tensor, dim: int, what: str) -> None:
    """Raise ValueError unless `h` is a floating tensor of shape (batch, seq, dim)."""
    if h.dim() != 3:
        raise ValueError(f"{what} expects input of shape (batch, seq, {dim}), got rank {h.dim()} shape {tuple(h.shape)}")
    if h.shape[-1] != dim:
        raise ValueError(f"{what} expects input width {dim}, got shape {tuple(h.shape)}")
    if not h.is_floating_point():
        raise ValueError(f"{what} expects a floating-point input, got dtype {h.dtype}")


def check_tolerance(name: str, value: float | None) -> None:
    """Raise ValueError unless `value` is None (off) or a finite number >= 0."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
        raise ValueError(f"{name} must be None (off) or a finite number >= 0, got {value!r}")


def check_nonnegative_int(name: str, value: int) -> None:
    """Raise ValueError unless `value` is an integer >= 0."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
