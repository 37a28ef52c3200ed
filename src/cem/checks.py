"""Argument and input validation shared by every part of cem: clear ValueErrors that name the setting instead of deep torch errors."""

from __future__ import annotations

import math
import os

import torch
from torch import Tensor


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    """Raise ValueError unless `value` is one of `choices`."""
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; expected one of {', '.join(map(repr, choices))}")


BOOLEANS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


def parse_bool(name: str, raw: str) -> bool:
    """A boolean written as 0/1, true/false, yes/no or on/off (any case, spaces around); ValueError naming `name` else."""
    value = BOOLEANS.get(str(raw).strip().lower())
    if value is None:
        raise ValueError(f"{name} must be one of {'/'.join(BOOLEANS)} (a boolean), got {raw!r}")
    return value


def env_flag(name: str, default: bool) -> bool:
    """The boolean environment variable `name` (`parse_bool`), `default` where it is unset."""
    raw = os.environ.get(name)
    return default if raw is None else parse_bool(f"${name}", raw)


def check_positive_int(name: str, value: int, high: int | None = None) -> None:
    """Raise ValueError unless `value` is an integer >= 1 (and <= `high` when given)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if high is not None and value > high:
        raise ValueError(f"{name} must be at most {high:,} (a bound on what a config may ask for), got {value:,}")


def check_finite(name: str, value, low: float | None = None, high: float | None = None, *, low_open: bool = False, high_open: bool = False) -> None:
    """Raise ValueError unless `value` is a finite real number in the given range (closed unless `*_open`)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if low is not None and (value < low or (low_open and value == low)):
        raise ValueError(f"{name} must be {'>' if low_open else '>='} {low:g}, got {value!r}")
    if high is not None and (value > high or (high_open and value == high)):
        raise ValueError(f"{name} must be {'<' if high_open else '<='} {high:g}, got {value!r}")


def check_heads(dim: int, n_heads: int) -> None:
    """Raise ValueError unless `n_heads` divides `dim`."""
    check_positive_int("dim", dim)
    check_positive_int("n_heads", n_heads)
    if dim % n_heads:
        raise ValueError(f"dim ({dim}) must be divisible by n_heads ({n_heads})")


def check_residual(h: Tensor, dim: int, what: str, dtype: torch.dtype | None = None) -> None:
    """Raise ValueError unless `h` is a floating tensor of shape (batch, seq, dim) and, outside autocast,
    of the layer's parameter `dtype` (the layers do not cast: a float64 input to a float32 layer is an
    error naming both dtypes; cast the layer with `.to(dtype)` or the input, or run under autocast)."""
    if h.dim() != 3:
        raise ValueError(f"{what} expects input of shape (batch, seq, {dim}), got rank {h.dim()} shape {tuple(h.shape)}")
    if h.shape[-1] != dim:
        raise ValueError(f"{what} expects input width {dim}, got shape {tuple(h.shape)}")
    if not h.is_floating_point():
        raise ValueError(f"{what} expects a floating-point input, got dtype {h.dtype}")
    if dtype is not None and h.dtype != dtype and not torch.is_autocast_enabled(h.device.type):
        raise ValueError(f"{what} expects input of its parameters' dtype {dtype}, got {h.dtype}; cast one to the other (or use torch.autocast)")


def check_same_shape(u: Tensor, h: Tensor, what: str) -> None:
    """Raise ValueError unless the state `u` and the residual `h` have the same shape."""
    if u.shape != h.shape:
        raise ValueError(f"{what} expects u and h of the same shape, got {tuple(u.shape)} and {tuple(h.shape)}")


def check_tolerance(name: str, value: float | None) -> None:
    """Raise ValueError unless `value` is None (off) or a finite number >= 0."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
        raise ValueError(f"{name} must be None (off) or a finite number >= 0, got {value!r}")


def check_nonnegative_int(name: str, value: int, high: int | None = None) -> None:
    """Raise ValueError unless `value` is an integer >= 0 (and <= `high` when given)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    if high is not None and value > high:
        raise ValueError(f"{name} must be at most {high:,} (a bound on what a config may ask for), got {value:,}")
