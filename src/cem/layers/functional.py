"""Stateless pieces shared by the attention layers: position biases, RoPE and the CEM attention core.

The CEM attention core computes, for every head k and query position i (DESIGN.md, "Efficient form"):

    logit_kij = ( k_j^k · q_i^k + ĥ_j · (d_k ∘ u_i) ) / τ + b_kij,   b_kij = -m_k (i - j) + s_k [i = j]
    o_i^k     = Σ_{j <= i} softmax_j(logit_kij) v_j^k                 (v = k: values are the keys)

Two implementations with the same signature: `cem_attention_eager` (reads like the equations) and
`cem_attention_sdpa` (PyTorch's fused `scaled_dot_product_attention`, the diagonal term folded into the
dot product by concatenation). `q_start` is the absolute position of the first query, so the same code
serves the full forward (q_start = 0) and cached decoding (q_start = number of cached tokens).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor


ALIBI_SLOPES = ("standard", "app-a")


def alibi_slopes(n_heads: int, device: torch.device | str | None = None, kind: str = "standard") -> Tensor:
    """ALiBi slopes, k = 1..K, in float64: `standard` m_k = 2^(-8k/K) (Press et al.; DESIGN.md, attention
    bias), or `app-a` m_k = 2^(-k), the example of the paper's App. A.

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


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate pairs (x[..., :d/2], x[..., d/2:]) of x (B, K, J, d) by the angles of positions J (in fp32 at least)."""
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    cos, sin = cos.to(work), sin.to(work)
    x1, x2 = x.to(work).chunk(2, dim=-1)
    out = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    return out.to(x.dtype)


def diag_scores(qd: Tensor, hn: Tensor) -> Tensor:
    """ĥ_j · (d_k ∘ u_i) for every head: qd (B, Jq, D) shared or (B, K, Jq, D) per head; hn (B, Jk, D)."""
    if qd.dim() == 3:
        return (qd @ hn.transpose(-1, -2)).unsqueeze(1)  # (B, 1, Jq, Jk): once for all heads
    return qd @ hn.unsqueeze(1).transpose(-1, -2)  # (B, K, Jq, Jk)


def fold_diagonal(q: Tensor, k: Tensor, qd: Tensor | None, hn: Tensor | None) -> tuple[Tensor, Tensor]:
    """[q^k, d_k ∘ u] and [k^k, ĥ] per head, so that one dot product gives k·q + ĥ·(d∘u) (fused paths)."""
    if qd is None:
        return q, k
    n_heads = q.shape[1]
    qd_h = qd.unsqueeze(1).expand(-1, n_heads, -1, -1) if qd.dim() == 3 else qd
    hn_h = hn.unsqueeze(1).expand(-1, n_heads, -1, -1)
    return torch.cat([q, qd_h.to(q.dtype)], dim=-1), torch.cat([k, hn_h.to(k.dtype)], dim=-1)


def cem_attention_eager(
    q: Tensor,
    k: Tensor,
    qd: Tensor | None,
    hn: Tensor | None,
    slopes: Tensor,
    self_bias: Tensor | None,
    q_start: int = 0,
    v: Tensor | None = None,
) -> Tensor:
    """o_i^k = Σ_j softmax_j(logit_kij) v_j^k with v = k unless given (DESIGN.md efficient form).

    q (B, K, Jq, d), k (B, K, Jk, d), qd = d ∘ u (B, Jq, D) or (B, K, Jq, D) or None, hn = ĥ (B, Jk, D),
    v (B, K, Jk, dv) defaults to k. Returns (B, K, Jq, dv).
    """
    p = torch.softmax(cem_logits(q, k, qd, hn, slopes, self_bias, q_start), dim=-1)
    return p @ (k if v is None else v)


def cem_logits(
    q: Tensor, k: Tensor, qd: Tensor | None, hn: Tensor | None, slopes: Tensor, self_bias: Tensor | None, q_start: int = 0
) -> Tensor:
    """logit_kij = (k_j^k · q_i^k + ĥ_j · (d_k ∘ u_i)) / τ + b_kij, shape (B, K, Jq, Jk) (-inf where j > i)."""
    tau = math.sqrt(q.shape[-1])
    scores = q @ k.transpose(-1, -2)
    if qd is not None:
        scores = scores + diag_scores(qd, hn)
    return scores / tau + position_bias(slopes, self_bias, q_start, q.shape[-2], k.shape[-2], q.dtype)


def cem_attention_energy(
    q: Tensor,
    k: Tensor,
    qd: Tensor | None,
    hn: Tensor | None,
    slopes: Tensor,
    self_bias: Tensor | None,
    q_start: int = 0,
    v: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """`cem_attention_eager`'s output and, from the same logits, the interaction energy of every query,
    ε_i = -τ Σ_k logsumexp_j(logit_kij) (eq. 1), shape (B, Jq): the energy costs one logsumexp."""
    logits = cem_logits(q, k, qd, hn, slopes, self_bias, q_start)
    lse = torch.logsumexp(logits, dim=-1, keepdim=True)
    o = torch.exp(logits - lse) @ (k if v is None else v)
    return o, -math.sqrt(q.shape[-1]) * lse.squeeze(-1).sum(dim=1)


def cem_attention_sdpa(
    q: Tensor,
    k: Tensor,
    qd: Tensor | None,
    hn: Tensor | None,
    slopes: Tensor,
    self_bias: Tensor | None,
    q_start: int = 0,
    v: Tensor | None = None,
) -> Tensor:
    """Same as `cem_attention_eager` through `F.scaled_dot_product_attention`.

    The diagonal term is a dot product too: [q^k, d_k ∘ u_i] · [k^k, ĥ_j] = k·q + ĥ·(d∘u), so it is
    folded in by concatenating along the feature axis; the scale stays 1/sqrt(head width).
    """
    tau = math.sqrt(q.shape[-1])
    values = k if v is None else v
    q, k = fold_diagonal(q, k, qd, hn)
    bias = position_bias(slopes, self_bias, q_start, q.shape[-2], k.shape[-2], q.dtype)
    return F.scaled_dot_product_attention(q, k, values, attn_mask=bias, scale=1.0 / tau)
