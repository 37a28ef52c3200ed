"""The Llama baselines: pre-norm multi-head attention (RoPE or ALiBi) and the SwiGLU gated MLP."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from ..checks import check_choice, check_heads, check_positive_int, check_residual
from .position import ALIBI_SLOPES, POSITIONS, Positions, apply_rope, causal_mask, follows_cache, rope_cos_sin
from .kinds import ATTENTION_KINDS, MLP_KINDS, AttentionConfig, MLPConfig, Shape, SublayerKind
from .norm import RMSNorm
from .sdpa import sdpa


class LlamaAttention(nn.Module):
    """h + W_O MHA(norm(h)) with separate W_Q, W_K, W_V, W_O (paper eq. before (1)); RoPE or ALiBi."""

    sublayer = "attn"

    def __init__(
        self, dim: int, n_heads: int, position: str = "rope", *, rope_theta: float = 10000.0, alibi: str = "standard", eps: float = 1e-6
    ) -> None:
        super().__init__()
        check_heads(dim, n_heads)
        check_choice("position", position, POSITIONS)
        check_choice("alibi", alibi, ALIBI_SLOPES)
        self.alibi = alibi  # ALiBi slopes, used with position="alibi" (see `alibi_slopes`)
        if position == "rope" and (dim // n_heads) % 2:
            raise ValueError(f"RoPE needs an even head width, got {dim // n_heads} (dim {dim}, n_heads {n_heads})")
        self.dim, self.n_heads, self.head_dim = dim, n_heads, dim // n_heads
        self.position, self.rope_theta = position, rope_theta
        self.norm = RMSNorm(dim, eps)
        self.w_q = nn.Linear(dim, dim, bias=False)
        self.w_k = nn.Linear(dim, dim, bias=False)
        self.w_v = nn.Linear(dim, dim, bias=False)
        self.w_o = nn.Linear(dim, dim, bias=False)

    def _heads(self, x: Tensor) -> Tensor:
        b, j, _ = x.shape
        return x.view(b, j, self.n_heads, self.head_dim).transpose(1, 2)

    def forward(self, h: Tensor, cache=None) -> Tensor:
        """h + W_O concat_k softmax(q k^T / sqrt(d) + bias) v, causal; keys and values cached if asked."""
        check_residual(h, self.dim, "LlamaAttention", self.norm.weight.dtype)
        hn = self.norm(h)
        q, k, v = self._heads(self.w_q(hn)), self._heads(self.w_k(hn)), self._heads(self.w_v(hn))
        start = 0 if cache is None else cache.start  # an int, or a static cache's position tensor
        if self.position == "rope":
            cos, sin = rope_cos_sin(self.head_dim, start, h.shape[1], self.rope_theta, h.device, q.dtype)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:
            stored = cache.update(k=k, v=v)
            k, v = stored["k"], stored["v"]
        n_q, n_k = q.shape[-2], k.shape[-2]
        if self.position == "alibi":
            mask = Positions(self.alibi, self.n_heads).alibi(start, n_q, n_k, q.dtype, h.device)
        elif not follows_cache(start):
            mask = None  # full causal forward: the fused is_causal path
        elif isinstance(start, int) and n_q == 1:
            mask = None  # one query after its cached keys sees them all: no mask, so CUDA runs the flash kernel
        else:  # a chunk after cached keys, or a static cache (all max_len keys, those past the position masked):
            mask = causal_mask(start, n_q, n_k, h.device)  # a boolean mask: on CUDA the memory-efficient kernel, never math
        o = sdpa(q, k, v, mask, is_causal=mask is None and not follows_cache(start), decoding=follows_cache(start))
        return h + self.w_o(o.transpose(1, 2).flatten(2))


def llama_attention_flops(s: Shape, c: AttentionConfig, seq_len: int) -> int:
    """W_Q, W_K, W_V, W_O (4 · 2D²) and the scores and values over `seq_len` keys (2 · 2JD), per token."""
    return 4 * 2 * s.dim * s.dim + 2 * 2 * seq_len * s.dim


ATTENTION_KINDS["llama"] = SublayerKind(
    LlamaAttention,
    build=lambda s, c: LlamaAttention(s.dim, s.n_heads, c.position, alibi=c.alibi, eps=s.eps),
    flops=llama_attention_flops,
    settings=lambda c: ("position", "reuse", *(("alibi",) if c.position == "alibi" else ())),
)


class GatedMLP(nn.Module):
    """h + W_d (W_g ĥ ∘ SiLU(W_u ĥ)), the SwiGLU MLP in the paper's notation (eq. 6; W_g linear, W_u in SiLU).

    In Hugging Face Llama naming, `w_up` here is `gate_proj` (the branch through the activation) and
    `w_gate` is `up_proj`.
    """

    sublayer = "mlp"

    def __init__(self, dim: int, hidden_dim: int, *, eps: float = 1e-6) -> None:
        super().__init__()
        check_positive_int("dim", dim)
        check_positive_int("hidden_dim", hidden_dim)
        self.dim, self.hidden_dim = dim, hidden_dim
        self.norm = RMSNorm(dim, eps)
        self.w_gate = nn.Linear(dim, hidden_dim, bias=False)
        self.w_up = nn.Linear(dim, hidden_dim, bias=False)
        self.w_down = nn.Linear(hidden_dim, dim, bias=False)

    def forward(self, h: Tensor, cache=None) -> Tensor:
        check_residual(h, self.dim, "GatedMLP", self.norm.weight.dtype)
        hn = self.norm(h)
        return h + self.w_down(self.w_gate(hn) * F.silu(self.w_up(hn)))


def gated_mlp_flops(s: Shape, c: MLPConfig, seq_len: int) -> int:
    """W_g, W_u and W_d (3 · 2Dm) per token, whatever `seq_len`."""
    return 3 * 2 * s.dim * s.hidden_dim


MLP_KINDS["llama"] = SublayerKind(
    GatedMLP,
    build=lambda s, c: GatedMLP(s.dim, s.hidden_dim, eps=s.eps),
    flops=gated_mlp_flops,
    settings=lambda c: ("width_mult", "reuse"),
)
