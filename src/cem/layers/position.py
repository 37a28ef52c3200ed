"""Position information of the attention layers: ALiBi slopes and biases (CEM attention and the Llama
baseline's ALiBi option), the causal mask, and rotary embeddings (the Llama baseline's default; CEM
attention never uses RoPE, docs/design.md, settled point 5)."""

from __future__ import annotations

import torch
from torch import Tensor

ALIBI_SLOPES = ("standard", "app-a")


def alibi_slopes(n_heads: int, device: torch.device | str | None = None, kind: str = "standard") -> Tensor:
    """ALiBi slopes, k = 1..K, in float64: `standard` m_k = 2^(-8k/K) (Press et al.; docs/design.md,
    attention), or `app-a` m_k = 2^(-k), the example of the paper's App. A.

    Layers build them on the fly rather than keep a buffer, so casting a model to bf16 never rounds them.
    """
    k = torch.arange(1, n_heads + 1, dtype=torch.float64, device=device)
    if kind == "standard":
        return torch.pow(2.0, -8.0 * k / n_heads)
    if kind == "app-a":
        return torch.pow(2.0, -k)
    raise ValueError(f"unknown alibi {kind!r}; expected one of {', '.join(map(repr, ALIBI_SLOPES))}")


def position_bias(
    slopes: Tensor, self_bias: Tensor | None, q_start: int, n_q: int, n_k: int, dtype: torch.dtype
) -> Tensor:
    """b_kij = -m_k (i - j) + s_k [i = j], and -inf where j > i (causal). Shape (K, n_q, n_k).

    Query i sits at absolute position q_start + i, key j at position j: built over the true positions,
    so cached decoding sees exactly the bias of the full forward pass.
    """
    device = slopes.device
    work = torch.float64 if dtype == torch.float64 else torch.float32  # built in fp32 at least, then cast
    i = torch.arange(q_start, q_start + n_q, device=device)
    j = torch.arange(n_k, device=device)
    rel = (i[:, None] - j[None, :]).to(work)  # i - j
    bias = -slopes.to(work)[:, None, None] * rel
    if self_bias is not None:
        bias = bias + self_bias.to(work)[:, None, None] * (rel == 0).to(work)
    return bias.masked_fill(rel < 0, float("-inf")).to(dtype)


_ALIBI_CACHE: dict[tuple, Tensor] = {}
_ROPE_CACHE: dict[tuple, tuple[Tensor, Tensor]] = {}
_CACHE_ENTRIES = 8  # per cache: a handful of (length, dtype, device) combinations


def _remember(store: dict, key: tuple, value):
    if len(store) >= _CACHE_ENTRIES:
        store.pop(next(iter(store)))  # oldest first
    store[key] = value
    return value


def alibi_bias(n_heads: int, kind: str, q_start: int, n_q: int, n_k: int, dtype: torch.dtype, device: torch.device | str) -> Tensor:
    """`position_bias` of the `kind` slopes without the self bias, a constant (no autograd graph) of shape
    (1, K, n_q, n_k): 4-D, so that CPU SDPA takes its fused kernel (a 3-D mask sends it to the math path).

    The full forward (q_start = 0) reuses one tensor per (heads, slopes, length, dtype, device) instead of
    building it in every layer; under torch.compile it is built in the graph (the compiler fuses it).
    """
    slopes = alibi_slopes(n_heads, device, kind)
    if torch.compiler.is_compiling() or q_start != 0:  # compiled, or cached decoding (a new offset every step)
        return position_bias(slopes, None, q_start, n_q, n_k, dtype).unsqueeze(0)
    key = (n_heads, kind, n_q, n_k, dtype, str(torch.device(device)))
    bias = _ALIBI_CACHE.get(key)
    if bias is None:
        with torch.inference_mode(False):  # a tensor kept across calls must never be an inference tensor
            slopes = alibi_slopes(n_heads, device, kind)
            bias = _remember(_ALIBI_CACHE, key, position_bias(slopes, None, 0, n_q, n_k, dtype).unsqueeze(0))
    return bias


def causal_mask(q_start: int, n_q: int, n_k: int, device: torch.device) -> Tensor:
    """Boolean mask, True where key j may be seen by query i (j <= q_start + i). Shape (n_q, n_k)."""
    i = torch.arange(q_start, q_start + n_q, device=device)
    j = torch.arange(n_k, device=device)
    return j[None, :] <= i[:, None]


def rope_tables(head_dim: int, positions: Tensor, theta: float = 10000.0) -> tuple[Tensor, Tensor]:
    """cos and sin tables of rotary embeddings (Su et al.), shape (len(positions), head_dim / 2), float64."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float64) / head_dim))
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    return angles.cos(), angles.sin()


def rope_cos_sin(head_dim: int, start: int, n: int, theta: float, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """`rope_tables` for positions start..start+n-1, cast to the working dtype of `apply_rope` for `dtype`,
    computed once per (width, theta, device, dtype) and length (grown by doubling) and sliced after."""
    work = torch.float64 if dtype == torch.float64 else torch.float32
    device = torch.device(device)
    if torch.compiler.is_compiling():
        cos, sin = rope_tables(head_dim, torch.arange(start, start + n, device=device), theta)
        return cos.to(work), sin.to(work)
    key = (head_dim, float(theta), str(device), work)
    tables = _ROPE_CACHE.get(key)
    if tables is None or tables[0].shape[0] < start + n:
        length = max(start + n, 2 * tables[0].shape[0] if tables is not None else 0)
        with torch.inference_mode(False):  # kept across calls: never an inference tensor
            cos, sin = rope_tables(head_dim, torch.arange(length, device=device), theta)
            tables = _remember(_ROPE_CACHE, key, (cos.to(work), sin.to(work)))
    return tables[0][start : start + n], tables[1][start : start + n]


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate pairs (x[..., :d/2], x[..., d/2:]) of x (B, K, J, d) by the angles of positions J (in fp32 at least)."""
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    cos, sin = cos.to(work), sin.to(work)
    x1, x2 = x.to(work).chunk(2, dim=-1)
    out = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    return out.to(x.dtype)
