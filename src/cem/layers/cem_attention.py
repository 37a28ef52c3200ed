"""CEM attention: T gradient steps on the interaction energy (paper eq. 1-5, 12; docs/design.md, attention).

    ε(u | ĥ_{1:i}) = - τ Σ_k log Σ_{j<=i} exp( β_kj·u / τ + b_kij ),   β_kj = (W_Q^kᵀ W_K^k + diag(d_k)) ĥ_j

Each step x <- x + η Σ_k P_k W_Q^kᵀ o^k with o^k = Σ_j softmax_j(logit_kij) k_j^k: queries come from
u = norm(x), keys (= values) from the fixed context ĥ = norm(h), the output projection is W_Qᵀ. The
softmax-weighted keys o^k come from the attention core (`attention_core`, backend `backend`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..checks import check_choice, check_heads, check_residual, check_same_shape
from ..kernels import DIAG_SCORES_MAX_BYTES
from .attention_core import (
    IMPLEMENTATIONS, Diagonal, cem_attention, cem_attention_energy, cem_logits, cem_query_side, check_backend, per_head, precondition,
    resolve_backend,
)  # fmt: skip
from .position import ALIBI_SLOPES, Positions
from .norm import RMSNorm
from .precond import PRECONDITIONERS, make_preconditioner
from .steps import DescentLayer, Recursion
from .kinds import ATTENTION_KINDS, AttentionConfig, KernelPath, Shape, SublayerKind


@dataclass(frozen=True)
class KQDiagonalKind:
    """A kind of the diagonal d_k of A_k = W_Q^kᵀ W_K^k + diag(d_k) (eq. 3): none, one d shared by the heads, or
    one per head; its parameter's shape, its FLOPs, and the fused kernel's scratch for it."""

    present: bool
    per_head: bool

    def shape(self, dim: int, n_heads: int) -> tuple[int, ...] | None:
        """The shape of d: (D,) shared, (K, D) per head, None without a diagonal."""
        if not self.present:
            return None
        return (n_heads, dim) if self.per_head else (dim,)

    def flops(self, seq_len: int, dim: int, n_heads: int) -> int:
        """Matmul FLOPs per token and step of ĥ_j·(d_k∘u) over `seq_len` keys: 2JD shared, 2JDK per head."""
        if not self.present:
            return 0
        return 2 * seq_len * dim * (n_heads if self.per_head else 1)

    def kernel_scratch(self, batch: int, seq: int, elem: int) -> int:
        """Bytes the fused kernel allocates for the term at a training step's peak: the shared diagonal's scores
        as one (B, L, L) matrix and the backward's Σ_heads dS (`cem.kernels`), 2·B·L²·elem, while they fit
        `DIAG_SCORES_MAX_BYTES`; 0 beyond, and per head or without a diagonal (the kernel works tile by tile)."""
        if not self.present or self.per_head:
            return 0
        scores = 2 * batch * seq * seq * elem
        return scores if scores <= DIAG_SCORES_MAX_BYTES else 0


KQ_DIAGONALS: dict[str, KQDiagonalKind] = {
    "none": KQDiagonalKind(present=False, per_head=False),
    "shared": KQDiagonalKind(present=True, per_head=False),
    "per_head": KQDiagonalKind(present=True, per_head=True),
}
# With a key-query diagonal the decoding cache holds ĥ only (as many numbers per token as the keys): k = W_K ĥ
# is exact from it in any dtype, while ĥ read back from rounded keys through W_K^{-1} is off by up to
# cond(W_K) (1e4-3e4 at 134M) times the dtype's rounding. A step of few new tokens reads the cache once
# through queries moved to ĥ's space (`attention_core.cem_query_side`); a long chunk recomputes its keys from ĥ.


class CEMAttention(DescentLayer):
    """Weight-tied attention as `steps` descent steps on the interaction energy (Alg. 1, MHA subroutine).

    `w_k` gives keys and values, `w_q` queries and (transposed) the output projection; head k owns rows
    k*d:(k+1)*d of both. `kq_diag` is the diagonal d_k of A_k (initialised to 0), `self_bias` s_k the learned
    self-attention offset of the ALiBi bias, `precond` the per-head preconditioners P_k (None = identity).
    `exact_gradient=True` keeps the value-side diagonal term Σ_k d_k ∘ Σ_j p_kij ĥ_j that Algorithm 1 drops.
    `alibi` picks the slopes m_k (`standard` 2^(-8k/K), or `app-a` 2^(-k) as App. A's example); `recursion`
    holds T, η, the schedule and the start point (`cem.layers.steps.Recursion`).
    """

    sublayer = "attn"

    def __init__(
        self,
        dim: int,
        n_heads: int,
        *,
        recursion: Recursion = Recursion(),
        kq_diag: str = "shared",
        precond: str = "identity",
        precond_rank: int = 4,
        exact_gradient: bool = False,
        alibi: str = "standard",
        backend: str = "auto",
        eps: float = 1e-6,
    ) -> None:
        """A CEM attention sublayer mapping the residual stream h (B, J, dim) to h' (B, J, dim).

        dim, n_heads: model width D and number of heads K (D divisible by K; head width d = D / K).
        recursion: T (`steps`), η (`step_size`), the step schedule and the start point x^(0).
        kq_diag: the diagonal of the key-query matrix A_k = W_Q^kᵀ W_K^k + diag(d_k): "shared" (one d for all
            heads, the paper's recommendation), "per_head", or "none" (no diagonal; the cache then holds keys only).
        precond: "identity", "diag" or "diag_lowrank" preconditioner P_k per head (rank `precond_rank`).
        exact_gradient: keep the value-side diagonal term that Algorithm 1 drops (the exact energy gradient).
        alibi: ALiBi slopes, "standard" (2^(-8k/K)) or "app-a" (2^(-k), the paper's App. A example).
        backend: attention implementation, "auto" (decided once per device: the Triton kernel on CUDA, the
            fused CPU path on the CPU), "eager", "sdpa", "flex", "triton" or "cpu" (docs/kernels.md).
        eps: the RMSNorm epsilon.
        """
        super().__init__(recursion, dim)
        check_heads(dim, n_heads)
        check_choice("kq_diag", kq_diag, tuple(KQ_DIAGONALS))
        check_choice("alibi", alibi, ALIBI_SLOPES)
        check_backend(backend)
        self.dim, self.n_heads, self.head_dim = dim, n_heads, dim // n_heads
        self.alibi = alibi
        self.kq_kind = kq_diag  # its name in `KQ_DIAGONALS`; `self.kq_diag` is the parameter d
        self.exact_gradient = exact_gradient
        self.backend = backend
        self.norm = RMSNorm(dim, eps)
        self.w_q = nn.Linear(dim, dim, bias=False)
        self.w_k = nn.Linear(dim, dim, bias=False)
        diag_shape = KQ_DIAGONALS[kq_diag].shape(dim, n_heads)
        self.kq_diag = None if diag_shape is None else nn.Parameter(torch.empty(diag_shape))
        self.self_bias = nn.Parameter(torch.empty(n_heads))
        self.reset_parameters()
        self.precond = make_preconditioner(precond, n_heads, dim, precond_rank)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """This layer's own tensors start at 0 (its submodules initialise theirs)."""
        for own in (self.kq_diag, self.self_bias):
            if own is not None:
                own.zero_()

    def _heads(self, x: Tensor) -> Tensor:
        """(B, J, D) -> (B, K, J, d)."""
        b, j, _ = x.shape
        return x.view(b, j, self.n_heads, self.head_dim).transpose(1, 2)

    @property
    def positions(self) -> Positions:
        """b_kij = -m_k (i - j) + s_k [i = j] of this layer: its ALiBi slopes and its self bias s_k. Read at
        each use, not kept: loading into a meta-built model (transformers) or sharding (FSDP2) replaces the
        parameter object, which a kept reference would miss."""
        return Positions(self.alibi, self.n_heads, self.self_bias)

    def _diagonal(self, u: Tensor, hn: Tensor | None) -> Diagonal | None:
        """The diagonal term's factors d ∘ u ((B, J, D) shared, (B, K, J, D) per head) and ĥ, None without a
        diagonal."""
        if self.kq_diag is None:
            return None
        qd = u * self.kq_diag if self.kq_diag.dim() == 1 else u.unsqueeze(1) * self.kq_diag[None, :, None, :]
        return Diagonal(qd, hn)

    def _attend(self, q: Tensor, k: Tensor, diag: Diagonal | None, q_start: int | Tensor, v: Tensor | None) -> Tensor:
        backend = "sdpa" if isinstance(q_start, Tensor) else self.backend  # a static cache's position: the bias-masked SDPA form
        return cem_attention(q, k, diag, self.positions, q_start, v, backend=backend)

    def resolved_backend(self, device: torch.device | str) -> str:
        """The backend this layer's attention core runs on `device` ("auto" decided; see `attention_core`)."""
        return resolve_backend(self.backend, device, values=self._value_diag)

    @property
    def _value_diag(self) -> bool:
        """Whether the core also carries ĥ as values, for the exact gradient's value-side diagonal term."""
        return self.exact_gradient and self.kq_diag is not None

    def folds(self, tokens: int) -> bool:
        """Whether a forward of `tokens` positions folds the preconditioner into the output weight: folding
        costs about D² (2r+1) multiply-adds once, applying P_k to each position's K head outputs J·K·D (2r+1),
        so it pays from J >= d = D / K tokens (a training batch folds; a decoding step of one token does not)."""
        return self.precond is not None and tokens >= self.head_dim

    def output_weight(self) -> Tensor | None:
        """[P_1 W_Q^1ᵀ … P_K W_Q^Kᵀ]ᵀ (D, D), so that Σ_k P_k W_Q^kᵀ o^k = concat_k(o^k) @ it: the
        preconditioner folded into the tied output weight once per forward (P_k is symmetric, so row r of
        head k is P_k W_Q^k[r]). None without a preconditioner, or where the exact gradient's value-side
        diagonal term needs the per-head form."""
        if self.precond is None or self._value_diag:
            return None
        w = self.w_q.weight.view(self.n_heads, self.head_dim, self.dim)  # head k's rows W_Q^k, (K, d, D)
        return self.precond.leading(w).view(self.dim, self.dim)

    def direction(
        self,
        u: Tensor,
        k: Tensor | None,
        hn: Tensor | None,
        q_start: int = 0,
        w_out: Tensor | None = None,
        with_energy: bool = False,
    ):
        """The descent direction Σ_k P_k (W_Q^kᵀ o^k [+ d_k ∘ Σ_j p_kij ĥ_j]) = -P ∇_u ε at u (B, J, D);
        `with_energy=True` returns (direction, ε(u)) with ε (B, J) from the same logits (eager form).

        `w_out` is `output_weight()` when the forward has folded the preconditioner already; `k` None (a
        cached step of few tokens, see `context`) reads the context ĥ (B, Jk, D) through the attention core's query side."""
        q = self._heads(self.w_q(u))
        value_diag = self._value_diag
        energy = o_hn = None
        if k is None:
            o, o_hn, energy = cem_query_side(q, self.w_k.weight, self._diagonal(u, hn), self.positions, q_start, with_energy)
            o_hn = o_hn if value_diag else None
        else:
            diag = self._diagonal(u, hn)
            v = torch.cat([k, hn.unsqueeze(1).expand(-1, self.n_heads, -1, -1)], dim=-1) if value_diag else None
            if with_energy:
                o, energy = cem_attention_energy(q, k, diag, self.positions, q_start, v)
            else:
                o = self._attend(q, k, diag, q_start, v)
            if value_diag:
                o, o_hn = o[..., : self.head_dim], o[..., self.head_dim :]
        y = self._project(o, o_hn, w_out)
        return (y, energy) if with_energy else y

    def _project(self, o: Tensor, o_hn: Tensor | None, w_out: Tensor | None) -> Tensor:
        """Σ_k P_k (W_Q^kᵀ o^k [+ d_k ∘ o_ĥ^k]) from the attention outputs o (B, K, J, d) and, for the exact
        gradient's value-side term, o_ĥ = Σ_j p_kj ĥ_j (B, K, J, D): one matmul with the folded `w_out` (or
        W_Q without a preconditioner), else per head with P_k applied to each position."""
        if o_hn is None and (w_out is not None or self.precond is None):
            b, _, j, _ = o.shape  # one matmul, as `@` would fold it (with one view operator fewer)
            return torch.mm(o.transpose(1, 2).reshape(b * j, self.dim), self.w_q.weight if w_out is None else w_out).view(b, j, self.dim)
        y = per_head(o, self.w_q.weight).transpose(1, 2)  # per-head W_Q^kᵀ o^k, (B, J, K, D)
        if o_hn is not None:
            diag = self.kq_diag if self.kq_diag.dim() == 2 else self.kq_diag.expand(self.n_heads, -1)
            y = y + diag * o_hn.transpose(1, 2)
        if self.precond is not None:
            y = precondition(y, self.precond)
        return y.sum(dim=2)

    def reads_query_side(self, n_new: int) -> bool:
        """Whether a cached step of `n_new` tokens reads ĥ through the core's query side (its extra (K-1)·n_new·D
        multiply-adds per cached token cost less than recomputing the keys, D² per cached token)."""
        return 2 * n_new * (self.n_heads - 1) <= self.dim

    def context(self, h: Tensor, cache=None) -> tuple[Tensor, Tensor | None, Tensor | None, int]:
        """Normalised input ĥ, keys k = W_K ĥ (B, K, J, d), context ĥ (only if a diagonal needs it) and the
        absolute position of the first new token.

        With a cache (one `CacheSlot`) the new tokens are appended and the whole context is returned. Without
        a diagonal the cache holds the keys (they are the values); with one it holds ĥ (as many numbers), and
        the keys are recomputed from it, or, for a step of few tokens (`reads_query_side`), are None: the
        step reads ĥ once through the attention core's query side (`cem_query_side`)."""
        hn = self.norm(h)
        if cache is None:
            return hn, self._heads(self.w_k(hn)), (hn if self.kq_diag is not None else None), 0
        q_start = cache.start  # an int, or a static cache's position tensor
        if self.kq_diag is None:
            return hn, cache.update(k=self._heads(self.w_k(hn)))["k"], None, q_start  # keys by head: contiguous
        ctx = cache.update(hn=hn)["hn"]
        keys = None if self.reads_query_side(h.shape[1]) else self._heads(self.w_k(ctx))
        return hn, keys, ctx, q_start

    def forward(self, h: Tensor, cache=None) -> Tensor:
        """x^(0) = h (or ĥ), x^(t+1) = x^(t) + η_t direction(norm(x^(t))); returns x^(T) (B, J, D).
        The preconditioner is folded into the output weight once for all steps (`output_weight`)."""
        check_residual(h, self.dim, "CEMAttention", self.norm.weight.dtype)
        hn, k, ctx, q_start = self.context(h, cache)
        w_out = self.output_weight() if self.folds(h.shape[:-1].numel()) else None
        return self.descend(h, hn, lambda u, with_energy=False: self.direction(u, k, ctx, q_start, w_out, with_energy))

    def energy(self, u: Tensor, h: Tensor) -> Tensor:
        """ε(u_i | ĥ_{1:i}) for every position i, shape (B, J): the energy the forward pass descends.

        u (B, J, D) is the point the energy is evaluated at: the normalised query point, e.g. `self.norm(x)`
        for a step's x^(t) (the forward pass starts from u^(0) = norm(h)). h (B, J, D) is the raw residual
        stream the layer was called with: the context, normalised here (ĥ = norm(h)) as in the forward pass.
        The step x^(t+1) = x^(t) - η P ∇_u ε moves down this energy (eq. 12)."""
        check_residual(u, self.dim, "CEMAttention.energy")
        check_residual(h, self.dim, "CEMAttention.energy")
        check_same_shape(u, h, "CEMAttention.energy")
        hn = self.norm(h)
        logits = cem_logits(self._heads(self.w_q(u)), self._heads(self.w_k(hn)), self._diagonal(u, hn), self.positions)
        return -math.sqrt(self.head_dim) * torch.logsumexp(logits, dim=-1).sum(dim=1)

    def extra_repr(self) -> str:
        precond = "identity" if self.precond is None else f"rank {self.precond.rank}"
        return (
            f"dim={self.dim}, n_heads={self.n_heads}, steps={self.steps}, step_size={self.step_size}, "
            f"kq_diag={self.kq_kind}, precond={precond}, exact_gradient={self.exact_gradient}, start={self.recursion.start}, alibi={self.alibi}"
        )


def cem_attention_flops(s: Shape, c: AttentionConfig, seq_len: int) -> int:
    """Per token at full context `seq_len` (J): the keys W_K ĥ once (2D²), then per step W_Q u and W_Qᵀ o
    (2 · 2D²), scores and values (2 · 2JD), the key-query diagonal (`KQDiagonalKind.flops`) and the exact
    gradient's value-side term (2JDK). P is folded into W_Qᵀ once per forward (D rows, spread over the J
    tokens), or, in the value-side term's per-head form, applied to the K head outputs in every step."""
    D, J, K = s.dim, seq_len, s.n_heads
    diag = KQ_DIAGONALS[c.kq_diag].flops(J, D, K)
    value_diag = 2 * J * D * K if (c.exact_gradient and diag) else 0
    p = PRECONDITIONERS[c.precond]
    if value_diag:
        precond, fold = K * p.flops(D, c.precond_rank), 0
    else:
        precond, fold = 0, p.folded_flops(D, D, c.precond_rank, J)
    per_step = 2 * D * D + 2 * 2 * J * D + diag + value_diag + 2 * D * D + precond  # W_Q u, qk, pk, W_Qᵀ o, P
    return 2 * D * D + fold + c.recursion.steps * per_step


def build_cem_attention(s: Shape, c: AttentionConfig) -> CEMAttention:
    """The CEM attention of an attention config (eq. 12 with its recursion)."""
    return CEMAttention(s.dim, s.n_heads, recursion=c.recursion, kq_diag=c.kq_diag, precond=c.precond, precond_rank=c.precond_rank,
                        exact_gradient=c.exact_gradient, alibi=c.alibi, backend=c.backend, eps=s.eps)


# What a GPU training run of CEM attention runs ("auto" on CUDA): the fused Triton kernel of `cem.kernels`
TRITON_KERNEL = KernelPath(
    backend="triton",
    available=lambda: IMPLEMENTATIONS["triton"].missing() is None,
    scratch=lambda c, batch, seq, elem: KQ_DIAGONALS[c.kq_diag].kernel_scratch(batch, seq, elem),
)
CEM_ATTENTION_SETTINGS = ("alibi", "recursion", "kq_diag", "precond", "precond_rank", "exact_gradient", "backend", "reuse")  # not `position`: always ALiBi
ATTENTION_KINDS["cem"] = SublayerKind(CEMAttention, build=build_cem_attention, flops=cem_attention_flops, settings=lambda c: CEM_ATTENTION_SETTINGS,
                                      kernel=TRITON_KERNEL)
AttentionConfig.CHOICES["kq_diag"] = KQ_DIAGONALS
