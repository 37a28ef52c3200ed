"""CEM attention: T gradient steps on the interaction energy (paper eq. 1-5, 12; docs/design.md, attention).

    ε(u | ĥ_{1:i}) = - τ Σ_k log Σ_{j<=i} exp( β_kj·u / τ + b_kij ),   β_kj = (W_Q^kᵀ W_K^k + diag(d_k)) ĥ_j

Each step x <- x + η Σ_k P_k W_Q^kᵀ o^k with o^k = Σ_j softmax_j(logit_kij) k_j^k: queries come from
u = norm(x), keys (= values) from the fixed context ĥ = norm(h), the output projection is W_Qᵀ. The
softmax-weighted keys o^k come from the attention core (`attention_core`, backend `backend`).
"""

from __future__ import annotations

import math
import warnings

import torch
from torch import Tensor, nn

from ..checks import check_choice, check_heads, check_residual, check_same_shape
from .attention_core import Diagonal, cem_attention, cem_attention_energy, cem_logits, check_backend, resolve_backend
from .position import ALIBI_SLOPES, Positions
from .norm import RMSNorm
from .precond import PRECONDITIONERS, make_preconditioner
from .steps import DescentLayer, Recursion
from .kinds import ATTENTION_KINDS, SublayerKind

KQ_DIAGONALS = ("none", "shared", "per_head")
# A decoding cache reads the diagonal term from the keys through W_K^{-1} (computed in float32 or better)
# while cond(W_K) is at most this for the dtype of the cached keys; beyond, it stores ĥ as well (twice the
# bytes). The keys' rounding error reaches the diagonal term amplified by up to cond(W_K): measured on the
# small preset, float32 decoding stays within 1e-5 of float64 up to cond ~3e3 and 2e-4 at 2.5e4; in bf16 the
# error is about cond / 150 times bf16's own (random init has cond 200-2500 at D = 128: ĥ is kept).
KEYS_ONLY_MAX_COND = {torch.float64: 1e6, torch.float32: 1e4, torch.bfloat16: 64.0, torch.float16: 64.0}


class CEMAttention(DescentLayer):
    """Weight-tied attention as `steps` descent steps on the interaction energy (Alg. 1, MHA subroutine).

    `w_k` gives keys and values, `w_q` queries and (transposed) the output projection; head k owns rows
    k*d:(k+1)*d of both. `kq_diag` is the diagonal d_k of A_k (initialised to 0), `self_bias` s_k the learned
    self-attention offset of the ALiBi bias, `precond` the per-head preconditioners P_k (None = identity).
    `exact_gradient=True` keeps the value-side diagonal term Σ_k d_k ∘ Σ_j p_kij ĥ_j that Algorithm 1 drops.
    `alibi` picks the slopes m_k (`standard` 2^(-8k/K), or `app-a` 2^(-k) as App. A's example); `recursion`
    holds T, η, the schedule and the start point (`cem.layers.steps.Recursion`).
    """

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
        super().__init__(recursion)
        check_heads(dim, n_heads)
        check_choice("kq_diag", kq_diag, KQ_DIAGONALS)
        check_choice("alibi", alibi, ALIBI_SLOPES)
        check_backend(backend)
        self.dim, self.n_heads, self.head_dim = dim, n_heads, dim // n_heads
        self.alibi = alibi
        self.exact_gradient = exact_gradient
        self.backend = backend
        self.norm = RMSNorm(dim, eps)
        self.w_q = nn.Linear(dim, dim, bias=False)
        self.w_k = nn.Linear(dim, dim, bias=False)
        diag_shape = {"none": None, "shared": (dim,), "per_head": (n_heads, dim)}[kq_diag]
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

    def _diagonal(self, u: Tensor, hn: Tensor | None, key_solve: Tensor | None = None) -> Diagonal | None:
        """The diagonal term's factors d ∘ u ((B, J, D) shared, (B, K, J, D) per head) and ĥ, None without a
        diagonal. With `key_solve` = W_K^{-1}, `hn` holds the keys and d ∘ u becomes W_K^{-T}(d ∘ u), since
        ĥ_j·a = k_j·(W_K^{-T} a)."""
        if self.kq_diag is None:
            return None
        qd = u * self.kq_diag if self.kq_diag.dim() == 1 else u.unsqueeze(1) * self.kq_diag[None, :, None, :]
        if key_solve is not None:
            qd = (qd.to(key_solve.dtype) @ key_solve).to(u.dtype)
        return Diagonal(qd, hn)

    def _attend(self, q: Tensor, k: Tensor, diag: Diagonal | None, q_start: int, v: Tensor | None) -> Tensor:
        return cem_attention(q, k, diag, self.positions, q_start, v, backend=self.backend)

    def resolved_backend(self, device: torch.device | str) -> str:
        """The backend this layer's attention core runs on `device` ("auto" decided; see `attention_core`)."""
        return resolve_backend(self.backend, device, values=self._value_diag)

    @property
    def _value_diag(self) -> bool:
        """Whether the core also carries ĥ as values, for the exact gradient's value-side diagonal term."""
        return self.exact_gradient and self.kq_diag is not None

    def output_weight(self) -> Tensor | None:
        """[P_1 W_Q^1ᵀ … P_K W_Q^Kᵀ]ᵀ (D, D), so that Σ_k P_k W_Q^kᵀ o^k = concat_k(o^k) @ it: the
        preconditioner folded into the tied output weight once per forward (P_k is symmetric, so row r of
        head k is P_k W_Q^k[r]). None without a preconditioner, or where the exact gradient's value-side
        diagonal term needs the per-head form."""
        if self.precond is None or self._value_diag:
            return None
        w = self.w_q.weight.view(self.n_heads, self.head_dim, self.dim).transpose(0, 1)  # (d, K, D)
        return self.precond(w).transpose(0, 1).reshape(self.dim, self.dim)

    def direction(
        self,
        u: Tensor,
        k: Tensor,
        hn: Tensor | None,
        q_start: int = 0,
        w_out: Tensor | None = None,
        key_solve: Tensor | None = None,
        with_energy: bool = False,
    ):
        """The descent direction Σ_k P_k (W_Q^kᵀ o^k [+ d_k ∘ Σ_j p_kij ĥ_j]) = -P ∇_u ε at u (B, J, D);
        `with_energy=True` returns (direction, ε(u)) with ε (B, J) from the same logits (eager form).

        `w_out` is `output_weight()` when the forward has folded the preconditioner already; with
        `key_solve` = W_K^{-1}, `hn` holds the keys (B, Jk, D) instead of ĥ (the keys-only cache)."""
        q = self._heads(self.w_q(u))
        value_diag = self._value_diag
        diag = self._diagonal(u, hn, key_solve)
        v = torch.cat([k, hn.unsqueeze(1).expand(-1, self.n_heads, -1, -1)], dim=-1) if value_diag else None
        energy = None
        if with_energy:
            o, energy = cem_attention_energy(q, k, diag, self.positions, q_start, v)
        else:
            o = self._attend(q, k, diag, q_start, v)
        y = self._project(o, value_diag, w_out, key_solve)
        return (y, energy) if with_energy else y

    def _project(self, o: Tensor, value_diag: bool, w_out: Tensor | None, key_solve: Tensor | None) -> Tensor:
        """Σ_k P_k (W_Q^kᵀ o^k [+ d_k ∘ o_ĥ^k]) from the attention outputs o (B, K, J, d [+ D])."""
        o, o_hn = (o[..., : self.head_dim], o[..., self.head_dim :]) if value_diag else (o, None)
        if not value_diag:
            if w_out is None:
                w_out = self.output_weight()
            return o.transpose(1, 2).flatten(2) @ (self.w_q.weight if w_out is None else w_out)  # one matmul
        if key_solve is not None:  # Σ_j p ĥ_j = W_K^{-1} Σ_j p k_j
            o_hn = (o_hn.to(key_solve.dtype) @ key_solve.transpose(0, 1)).to(o.dtype)
        w = self.w_q.weight.view(self.n_heads, self.head_dim, self.dim)
        y = torch.einsum("bkjd,kdD->bjkD", o, w)  # per-head W_Q^kᵀ o^k, (B, J, K, D)
        diag = self.kq_diag if self.kq_diag.dim() == 2 else self.kq_diag.expand(self.n_heads, -1)
        y = y + diag * o_hn.transpose(1, 2)
        if self.precond is not None:
            y = self.precond(y)
        return y.sum(dim=2)

    def key_solve(self, cache) -> Tensor | None:
        """W_K^{-1} (D, D, float32 or better) when `cache` (a `CacheSlot`) reads the diagonal term from the
        keys, else None. Decided when the slot is first used: keys only while cond(W_K) <= KEYS_ONLY_MAX_COND
        of the weight's dtype, else ĥ is cached too, with a one-line notice."""
        if cache is None or self.kq_diag is None:
            return None
        if "key_solve" not in cache.state:
            w = self.w_k.weight.detach()
            cond = torch.linalg.cond(w.double()).item()
            solve = None
            limit = KEYS_ONLY_MAX_COND.get(w.dtype, 0.0)
            if cond <= limit:
                work = torch.float64 if w.dtype == torch.float64 else torch.float32
                solve = torch.linalg.inv(w.double()).to(work)
            else:
                warnings.warn(f"cond(W_K) = {cond:.3g} > {limit:g} ({w.dtype}): this cache stores ĥ besides the keys", stacklevel=3)
            cache.state["key_solve"] = solve
        return cache.state["key_solve"]

    def context(self, h: Tensor, cache=None) -> tuple[Tensor, Tensor | None, Tensor, int]:
        """Normalised input ĥ, keys k = W_K ĥ (B, K, J, d) and context ĥ (only if a diagonal needs it).

        With a cache (one `CacheSlot`) the new keys are appended and the whole context is returned, with the absolute position of the first new token. With a keys-only
        cache (`key_solve`) the returned context is the keys (B, L, D) in place of ĥ.
        """
        hn = self.norm(h)
        k = self._heads(self.w_k(hn))
        ctx = hn if self.kq_diag is not None else None
        if cache is None:
            return hn, k, ctx, 0
        q_start = cache.length
        store_hn = ctx is not None and self.key_solve(cache) is None
        stored = cache.update(k=k, **({"hn": ctx} if store_hn else {}))  # keys by head: contiguous for the core
        keys = stored["k"]
        if ctx is not None:  # ĥ, or the keys side by side (B, L, D) for the keys-only diagonal term
            ctx = stored["hn"] if store_hn else keys.transpose(1, 2).flatten(2)
        return hn, keys, ctx, q_start

    def forward(self, h: Tensor, cache=None) -> Tensor:
        """x^(0) = h (or ĥ), x^(t+1) = x^(t) + η_t direction(norm(x^(t))); returns x^(T) (B, J, D).
        The preconditioner is folded into the output weight once for all steps (`output_weight`)."""
        check_residual(h, self.dim, "CEMAttention", self.norm.weight.dtype)
        hn, k, ctx, q_start = self.context(h, cache)
        w_out, solve = self.output_weight(), self.key_solve(cache)
        return self.descend(h, hn, lambda u, with_energy=False: self.direction(u, k, ctx, q_start, w_out, solve, with_energy))

    def energy(self, u: Tensor, h: Tensor) -> Tensor:
        """ε(u_i | ĥ_{1:i}) for every position i, shape (B, J): the energy the forward pass descends."""
        check_residual(u, self.dim, "CEMAttention.energy")
        check_residual(h, self.dim, "CEMAttention.energy")
        check_same_shape(u, h, "CEMAttention.energy")
        hn = self.norm(h)
        logits = cem_logits(self._heads(self.w_q(u)), self._heads(self.w_k(hn)), self._diagonal(u, hn), self.positions)
        return -math.sqrt(self.head_dim) * torch.logsumexp(logits, dim=-1).sum(dim=1)

    def extra_repr(self) -> str:
        diag = "none" if self.kq_diag is None else ("shared" if self.kq_diag.dim() == 1 else "per_head")
        precond = "identity" if self.precond is None else f"rank {self.precond.rank}"
        return (
            f"dim={self.dim}, n_heads={self.n_heads}, steps={self.steps}, step_size={self.step_size}, "
            f"kq_diag={diag}, precond={precond}, exact_gradient={self.exact_gradient}, start={self.start}, alibi={self.alibi}"
        )


def cem_attention_flops(cfg, seq_len: int) -> int:
    """Per token at full context `seq_len` (J): the keys W_K ĥ once (2D²), then per step W_Q u and W_Qᵀ o
    (2 · 2D²), scores and values (2 · 2JD), the key-query diagonal (2JD shared, 2JDK per head) and the exact
    gradient's value-side term (2JDK). P is folded into W_Qᵀ once per forward (D rows, spread over the J
    tokens), or, in the value-side term's per-head form, applied to the K head outputs in every step."""
    D, J, K = cfg.dim, seq_len, cfg.n_heads
    diag = {"none": 0, "shared": 2 * J * D, "per_head": 2 * J * D * K}[cfg.kq_diag]
    value_diag = 2 * J * D * K if (cfg.exact_gradient and diag) else 0
    p = PRECONDITIONERS[cfg.attn_precond]
    if value_diag:
        precond, fold = K * p.flops(D, cfg.attn_precond_rank), 0
    else:
        precond, fold = 0, p.folded_flops(D, D, cfg.attn_precond_rank, J)
    per_step = 2 * D * D + 2 * 2 * J * D + diag + value_diag + 2 * D * D + precond  # W_Q u, qk, pk, W_Qᵀ o, P
    return 2 * D * D + fold + cfg.attn_steps * per_step


def build_cem_attention(cfg) -> CEMAttention:
    """The CEM attention of a model config (eq. 12 with the config's attention recursion)."""
    return CEMAttention(cfg.dim, cfg.n_heads, recursion=cfg.recursion("attn"), kq_diag=cfg.kq_diag, precond=cfg.attn_precond,
                        precond_rank=cfg.attn_precond_rank, exact_gradient=cfg.exact_gradient, alibi=cfg.alibi,
                        backend=cfg.attn_backend, eps=cfg.norm_eps)


ATTENTION_KINDS["cem"] = SublayerKind(CEMAttention, build=build_cem_attention, flops=cem_attention_flops)
