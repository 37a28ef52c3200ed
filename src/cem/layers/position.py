"""Position information of the attention layers: ALiBi slopes and `Positions`, the bias of CEM attention and
of the Llama baseline's ALiBi option; the causal mask, and rotary embeddings (the Llama baseline's default; CEM
attention never uses RoPE, docs/design.md, settled point 5)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

_SLOPES = {  # kind -> m_k from k = 1..K (float64) and K
    "standard": lambda k, n_heads: torch.pow(2.0, -8.0 * k / n_heads),  # Press et al.; docs/design.md, attention
    "app-a": lambda k, n_heads: torch.pow(2.0, -k),  # the example of the paper's App. A
}
ALIBI_SLOPES = tuple(_SLOPES)
POSITIONS = ("rope", "alibi")  # the Llama attention's: rotary embeddings or the ALiBi bias


def alibi_slopes(n_heads: int, device: torch.device | str | None = None, kind: str = "standard") -> Tensor:
    """ALiBi slopes, k = 1..K, in float64: `standard` m_k = 2^(-8k/K) (Press et al.; docs/design.md,
    attention), or `app-a` m_k = 2^(-k), the example of the paper's App. A.

    Layers build them on the fly rather than keep a buffer, so casting a model to bf16 never rounds them.
    """
    if kind not in _SLOPES:
        raise ValueError(f"unknown alibi {kind!r}; expected one of {', '.join(map(repr, ALIBI_SLOPES))}")
    return _SLOPES[kind](torch.arange(1, n_heads + 1, dtype=torch.float64, device=device), n_heads)


_ALIBI_CACHE: dict[tuple, Tensor] = {}
_ROPE_CACHE: dict[tuple, tuple[Tensor, Tensor]] = {}
_CACHE_ENTRIES = 8  # per cache: a handful of (length, dtype, device) combinations


def _remember(store: dict, key: tuple, value):
    if len(store) >= _CACHE_ENTRIES:
        store.pop(next(iter(store)))  # oldest first
    store[key] = value
    return value


@dataclass(frozen=True)
class Positions:
    """The position term b_kij = -m_k (i - j) + s_k [i = j] of an attention layer's logits (docs/design.md,
    attention): ALiBi slopes m_k of `kind` (one of `ALIBI_SLOPES`, see `alibi_slopes`) for `n_heads` heads and
    the learned self bias s_k (the CEM layer's parameter; None for the Llama baseline's ALiBi).

    Query i sits at absolute position q_start + i, key j at position j: biases are built over the true
    positions, so cached decoding sees exactly the bias of the full forward pass.
    """

    kind: str
    n_heads: int
    self_bias: Tensor | None = None

    def slopes(self, device: torch.device | str | None = None) -> Tensor:
        """m_k (K,) in float64, built on the fly (see `alibi_slopes`)."""
        return alibi_slopes(self.n_heads, device, self.kind)

    def bias(self, q_start: int | Tensor, n_q: int, n_k: int, dtype: torch.dtype, device: torch.device | str) -> Tensor:
        """b_kij, and -inf where j > q_start + i (causal). Shape (K, n_q, n_k); s_k keeps its autograd graph."""
        work = torch.float64 if dtype == torch.float64 else torch.float32  # built in fp32 at least, then cast
        i = torch.arange(n_q, device=device) + q_start  # q_start: an int, or a static cache's position tensor
        j = torch.arange(n_k, device=device)
        rel = (i[:, None] - j[None, :]).to(work)  # i - j
        bias = -self.slopes(device).to(work)[:, None, None] * rel
        if self.self_bias is not None:
            bias = bias + self.self_bias.to(work)[:, None, None] * (rel == 0).to(work)
        return bias.masked_fill(rel < 0, float("-inf")).to(dtype)

    def alibi(self, q_start: int | Tensor, n_q: int, n_k: int, dtype: torch.dtype, device: torch.device | str) -> Tensor:
        """`bias` without the self bias, a constant (no autograd graph) of shape (1, K, n_q, n_k): 4-D, so that
        CPU SDPA takes its fused kernel (a 3-D mask sends it to the math path).

        The full forward (q_start = 0) reuses one tensor per (heads, kind, length, dtype, device) instead of
        building it in every layer; under torch.compile it is built in the graph (the compiler fuses it).
        """
        slopes_only = Positions(self.kind, self.n_heads)
        if torch.compiler.is_compiling() or follows_cache(q_start):  # compiled, or cached decoding (a new offset every step)
            return slopes_only.bias(q_start, n_q, n_k, dtype, device).unsqueeze(0)
        key = (self.n_heads, self.kind, n_q, n_k, dtype, str(torch.device(device)))
        bias = _ALIBI_CACHE.get(key)
        if bias is None:
            with torch.inference_mode(False):  # a tensor kept across calls must never be an inference tensor
                bias = _remember(_ALIBI_CACHE, key, slopes_only.bias(0, n_q, n_k, dtype, device).unsqueeze(0))
        return bias


def follows_cache(q_start: int | Tensor) -> bool:
    """Whether queries starting at `q_start` come after cached keys (always, for a static cache's position tensor)."""
    return isinstance(q_start, Tensor) or q_start > 0


def causal_mask(q_start: int | Tensor, n_q: int, n_k: int, device: torch.device) -> Tensor:
    """Boolean mask, True where key j may be seen by query i (j <= q_start + i). Shape (n_q, n_k)."""
    i = torch.arange(n_q, device=device) + q_start
    j = torch.arange(n_k, device=device)
    return j[None, :] <= i[:, None]


def rope_tables(head_dim: int, positions: Tensor, theta: float = 10000.0) -> tuple[Tensor, Tensor]:
    """cos and sin tables of rotary embeddings (Su et al.), shape (len(positions), head_dim / 2), float64."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float64) / head_dim))
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    return angles.cos(), angles.sin()


def rope_cos_sin(head_dim: int, start: int | Tensor, n: int, theta: float, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """`rope_tables` for positions start..start+n-1, cast to the working dtype of `apply_rope` for `dtype`,
    computed once per (width, theta, device, dtype) and length (grown by doubling) and sliced after; built
    in place when compiled or at a static cache's position tensor (the same float64 values)."""
    work = torch.float64 if dtype == torch.float64 else torch.float32
    device = torch.device(device)
    if torch.compiler.is_compiling() or isinstance(start, Tensor):
        cos, sin = rope_tables(head_dim, torch.arange(n, device=device) + start, theta)
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
