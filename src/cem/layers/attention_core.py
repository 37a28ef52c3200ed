"""The CEM attention core, in one place: the logits, the implementations of the same maths, and the
choice between them (docs/design.md, attention, "What the layer computes").

For every head k and query position i (query i sits at absolute position q_start + i):

    logit_kij = ( k_j^k · q_i^k + ĥ_j · (d_k ∘ u_i) ) / τ + b_kij,   b_kij = -m_k (i - j) + s_k [i = j]
    o_i^k     = Σ_{j <= i} softmax_j(logit_kij) v_j^k                 (v = k: values are the keys)

Every implementation that reads the keys takes `(q, k, diag, positions, q_start=0, v=None)`: `diag` the
diagonal term's factors (`Diagonal`: d ∘ u and ĥ, or None), `positions` the layer's `Positions` (ALiBi slopes
m_k and self bias s_k). They are the entries of `IMPLEMENTATIONS`, each a `Backend` saying what it supports:

- "eager": `cem_attention_eager`, reads like the equations; its logits are `cem_logits`, which
  `CEMAttention.energy` and `cem_attention_energy` use too;
- "sdpa": PyTorch's fused `scaled_dot_product_attention`, the diagonal term folded into the dot
  product by concatenating [q, d∘u] and [k, ĥ] (`fold_diagonal`);
- "flex": the FlexAttention baseline: ALiBi, the self bias and the causal mask as a `score_mod`, the
  diagonal folded in like sdpa; `torch.compile`d on CUDA, forward-only on CPU (PyTorch has no CPU
  backward for it);
- "triton": the fused kernel of `cem.kernels` (values tied to keys: with `v` it falls back to sdpa);
- "cpu": the CPU path of `cem.kernels` (`cpu_cem_attention`): 1/τ applied to q and d∘u before the
  matmuls, the ALiBi bias a cached constant (`Positions.alibi`) the scores are accumulated onto, the self
  bias added on the diagonal only, causal query blocks; without a diagonal, PyTorch's fused CPU flash kernel.
  Its old name "fast" is still accepted, with a warning (`RENAMED`).

The query side, the form a cached decoding step with a diagonal runs, reads the context ĥ in place of the keys:
head k's logit is k_j^k·q^k + ĥ_j·(d_k∘u) = ĥ_j·(W_K^kᵀ q^k + d_k∘u), so the K·J queries moved to ĥ's space
attend as one head of width D over ĥ (values ĥ), and o^k = W_K^k Σ_j p_kj ĥ_j. Exact in any dtype (no
W_K^{-1}); K times the multiply-adds of the per-head form, the same bytes read. Its implementations take
`(q, w_k, diag, positions, q_start=0)` (W_K in place of the keys) and return (o, Σ_j p_kj ĥ_j); they are the
entries of `IMPLEMENTATIONS` that read "context", and `cem_query_side` runs the first of `QUERY_SIDE` meant for
the device and dtype: "query_side_cpu" (bf16 on the CPU: the decode kernel of `cem.kernels` where it runs, else
two GEMMs and a float32 softmax), else "query_side" (SDPA over ĥ).

"auto" runs the first of `AUTO` meant for the device that takes the values asked for and passes its
self-check there: "triton" on CUDA once the kernel has passed `triton_self_check`, "cpu" on CPU, else "sdpa".
`check_backend` rejects an unknown name (ModelConfig and CEMAttention call it at build time);
`resolve_backend` turns a requested name into the one that runs, decided once per device and cached.
The kernels are reached from here only (`cem_attention_triton`, `cem_attention_cpu` and the query side unpack
`Diagonal` and `Positions` into their tensors); every call of PyTorch's SDPA goes through `cem.layers.sdpa`.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch
from torch import Tensor

from ..kernels import HAS_TRITON, QUERY_BLOCK, DecodeKernels, cpu_cem_attention, triton_cem_attention
from ..kernels import decode_kernels as _decode_kernels
from ..checks import check_choice
from .position import Positions, follows_cache
from .sdpa import sdpa

__all__ = [
    "AUTO",
    "BACKENDS",
    "IMPLEMENTATIONS",
    "QUERY_SIDE",
    "RENAMED",
    "Backend",
    "Diagonal",
    "auto_backend",
    "cem_attention",
    "cem_attention_eager",
    "cem_attention_energy",
    "cem_attention_cpu",
    "cem_attention_flex",
    "cem_attention_sdpa",
    "cem_attention_triton",
    "cem_logits",
    "cem_query_side",
    "check_backend",
    "diag_scores",
    "fold_diagonal",
    "kernel_slopes",
    "decode_kernels",
    "per_head",
    "precondition",
    "query_side_energy",
    "resolve_backend",
    "softmax_values",
    "triton_self_check",
]


# ----------------------------------------------------------------------------------------------- the maths


class Diagonal(NamedTuple):
    """The factors of the diagonal term ĥ_j · (d_k ∘ u_i): qd = d ∘ u, (B, Jq, D) shared by the heads or
    (B, K, Jq, D) per head, and hn = ĥ (B, Jk, D)."""

    qd: Tensor
    hn: Tensor


def diag_scores(diag: Diagonal) -> Tensor:
    """ĥ_j · (d_k ∘ u_i) for every head: (B, 1, Jq, Jk) once for all heads when shared, else (B, K, Jq, Jk)."""
    qd, hn = diag
    if qd.dim() == 3:
        return (qd @ hn.transpose(-1, -2)).unsqueeze(1)
    return qd @ hn.unsqueeze(1).transpose(-1, -2)


def fold_diagonal(q: Tensor, k: Tensor, diag: Diagonal | None) -> tuple[Tensor, Tensor]:
    """[q^k, d_k ∘ u] and [k^k, ĥ] per head, so that one dot product gives k·q + ĥ·(d∘u) (fused paths)."""
    if diag is None:
        return q, k
    qd, hn = diag
    n_heads = q.shape[1]
    qd_h = qd.unsqueeze(1).expand(-1, n_heads, -1, -1) if qd.dim() == 3 else qd
    hn_h = hn.unsqueeze(1).expand(-1, n_heads, -1, -1)
    return torch.cat([q, qd_h.to(q.dtype)], dim=-1), torch.cat([k, hn_h.to(k.dtype)], dim=-1)


def cem_logits(q: Tensor, k: Tensor, diag: Diagonal | None, positions: Positions, q_start: int = 0) -> Tensor:
    """logit_kij (B, K, Jq, Jk), -inf where j > q_start + i; q (B, K, Jq, d), k (B, K, Jk, d)."""
    tau = math.sqrt(q.shape[-1])
    scores = q @ k.transpose(-1, -2)
    if diag is not None:
        scores = scores + diag_scores(diag)
    return scores / tau + positions.bias(q_start, q.shape[-2], k.shape[-2], q.dtype, q.device)


def cem_attention_eager(
    q: Tensor, k: Tensor, diag: Diagonal | None, positions: Positions, q_start: int = 0, v: Tensor | None = None
) -> Tensor:
    """o_i^k = Σ_j softmax_j(logit_kij) v_j^k with v = k unless given; v (B, K, Jk, dv). Returns (B, K, Jq, dv)."""
    p = torch.softmax(cem_logits(q, k, diag, positions, q_start), dim=-1)
    return p @ (k if v is None else v)


def cem_attention_energy(
    q: Tensor, k: Tensor, diag: Diagonal | None, positions: Positions, q_start: int = 0, v: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """`cem_attention_eager`'s output and, from the same logits, the interaction energy of every query,
    ε_i = -τ Σ_k logsumexp_j(logit_kij) (eq. 1), shape (B, Jq): the energy costs one logsumexp."""
    o, lse = softmax_values(cem_logits(q, k, diag, positions, q_start), k if v is None else v)
    return o, -math.sqrt(q.shape[-1]) * lse.sum(dim=1)


def softmax_values(logits: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
    """softmax(logits) @ values and the logits' log-sum-exp over the keys (B, K, Jq): the energy's share."""
    lse = torch.logsumexp(logits, dim=-1, keepdim=True)
    return torch.exp(logits - lse) @ values, lse.squeeze(-1)


def cem_attention_sdpa(
    q: Tensor, k: Tensor, diag: Diagonal | None, positions: Positions, q_start: int = 0, v: Tensor | None = None
) -> Tensor:
    """Same as `cem_attention_eager` through `F.scaled_dot_product_attention`.

    The diagonal term is a dot product too: [q^k, d_k ∘ u_i] · [k^k, ĥ_j] = k·q + ĥ·(d∘u), so it is
    folded in by concatenating along the feature axis; the scale stays 1/sqrt(head width).
    """
    tau = math.sqrt(q.shape[-1])
    values = k if v is None else v
    q, k = fold_diagonal(q, k, diag)
    bias = positions.bias(q_start, q.shape[-2], k.shape[-2], q.dtype, q.device).unsqueeze(0)  # 4-D: fused kernels
    return sdpa(q, k, values, bias, scale=1.0 / tau, decoding=follows_cache(q_start))


def cem_attention_cpu(
    q: Tensor,
    k: Tensor,
    diag: Diagonal | None,
    positions: Positions,
    q_start: int = 0,
    v: Tensor | None = None,
    block: int = QUERY_BLOCK,
) -> Tensor:
    """Same as `cem_attention_eager` through the CPU path of `cem.kernels` (causal query blocks of `block` rows
    over the cached ALiBi bias; without a diagonal, PyTorch's fused CPU flash kernel); exact in float64."""
    qd, hn = (None, None) if diag is None else diag
    base = positions.alibi(q_start, q.shape[-2], k.shape[-2], q.dtype, q.device)
    return cpu_cem_attention(q, k, qd, hn, base, positions.self_bias, q_start, v, block)


_compiled_flex: Callable | None = None


def _flex_fn(device: torch.device) -> Callable:
    from torch.nn.attention.flex_attention import flex_attention

    if device.type != "cuda":
        return flex_attention
    global _compiled_flex
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    return _compiled_flex


def cem_attention_flex(
    q: Tensor, k: Tensor, diag: Diagonal | None, positions: Positions, q_start: int = 0, v: Tensor | None = None
) -> Tensor:
    """Same as `cem_attention_eager` through FlexAttention (the baseline the Triton kernel must beat)."""
    from torch.nn.attention.flex_attention import create_block_mask

    d = q.shape[-1]
    values = k if v is None else v
    q, k = fold_diagonal(q, k, diag)
    device = q.device
    # tensors, not Python ints, so a compiled graph is not specialised on q_start
    offset = torch.tensor(int(q_start), device=device)
    m = positions.slopes(device).to(torch.float32)
    self_bias = positions.self_bias
    s = self_bias.to(device=device, dtype=torch.float32) if self_bias is not None else torch.zeros_like(m)

    def score_mod(score, b, h, q_idx, kv_idx):
        rel = q_idx + offset - kv_idx
        score = score - m[h] * rel + torch.where(rel == 0, s[h], torch.zeros_like(s[h]))
        return torch.where(rel >= 0, score, -float("inf"))

    if device.type != "cuda" and not torch.is_grad_enabled():
        # PyTorch's CPU FlexAttention refuses inputs that require grad, even under no_grad
        q, k, values, s = q.detach(), k.detach(), values.detach(), s.detach()
    n_q, n_k = q.shape[-2], k.shape[-2]
    block_mask = None
    if device.type == "cuda":

        def causal(b, h, q_idx, kv_idx):
            return kv_idx <= q_idx + offset

        block_mask = create_block_mask(causal, None, None, n_q, n_k, device=device)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
        return _flex_fn(device)(q, k, values, score_mod=score_mod, block_mask=block_mask, scale=1.0 / math.sqrt(d))


def cem_attention_triton(
    q: Tensor, k: Tensor, diag: Diagonal | None, positions: Positions, q_start: int = 0, v: Tensor | None = None
) -> Tensor:
    """Same as `cem_attention_eager` through the fused kernel of `cem.kernels`, which ties the values to the keys."""
    if v is not None:
        raise ValueError("the triton CEM kernel ties values to keys; use another backend for separate values")
    qd, hn = (None, None) if diag is None else diag
    return triton_cem_attention(q, k, qd, hn, kernel_slopes(positions, q.device), positions.self_bias, q_start)


_KERNEL_SLOPES: dict[tuple, Tensor] = {}  # (kind, heads, device) -> m_k in float32


def kernel_slopes(positions: Positions, device: torch.device) -> Tensor:
    """m_k (K,) in float32 on `device`, as the kernel reads them: built once per (kind, heads, device), not in
    every call (on a GPU that was four small kernels a call); built in place under torch.compile."""
    if torch.compiler.is_compiling():
        return positions.slopes(device).to(torch.float32)
    key = (positions.kind, positions.n_heads, str(device))
    slopes = _KERNEL_SLOPES.get(key)
    if slopes is None:
        with torch.inference_mode(False):  # kept across calls: never an inference tensor
            slopes = _KERNEL_SLOPES[key] = positions.slopes(device).to(torch.float32)
    return slopes


# ------------------------------------------------------------------------- the query side (cached decoding)


def _blocked(rows: Tensor, head_dim: int) -> bool:
    """Whether per-head products of these (B, K, J, ...) rows run as one GEMM with K times the multiply-adds:
    for fewer rows than the head width where "query_side_cpu" is meant for (bf16 on the CPU), where a bmm of one
    row per head is slow (1-2 ms a call)."""
    return IMPLEMENTATIONS["query_side_cpu"].meant_for(rows.device, rows.dtype) and rows.shape[0] * rows.shape[2] < head_dim


def per_head(x: Tensor, weight: Tensor) -> Tensor:
    """Σ_r x^k_r weight[k·d + r] for every head k: x (B, K, J, d), weight (K·d, D) -> (B, K, J, D); `_blocked`:
    the block-diagonal [δ_kk' x^k] (B, K, J, K·d) times the weight."""
    b, n_heads, j, head_dim = x.shape
    blocked = _blocked(x, head_dim)
    kernels = decode_kernels(x, weight) if blocked else None
    if kernels is not None:  # each head's rows of the weight read once (the decode kernels of `cem.kernels`)
        return kernels.rows_axpy(x.transpose(1, 2).reshape(b * j, n_heads, head_dim), weight).view(b, j, n_heads, -1).transpose(1, 2)
    if blocked:
        eye = torch.eye(n_heads, dtype=x.dtype, device=x.device)[:, None, :, None]  # (K, 1, K, 1)
        return (eye * x.unsqueeze(3)).flatten(3) @ weight
    return torch.einsum("bkjd,kdD->bkjD", x, weight.view(n_heads, head_dim, -1))


def _heads_out(out: Tensor, w_k: Tensor) -> tuple[Tensor, Tensor]:
    """(o^k = W_K^k Σ_j p_kj ĥ_j (B, K, J, d), Σ_j p_kj ĥ_j (B, K, J, D)) from out = Σ_j p_kj ĥ_j."""
    b, n_heads, j, dim = out.shape
    head_dim = w_k.shape[0] // n_heads
    blocked = _blocked(out, head_dim)
    kernels = decode_kernels(out, w_k) if blocked else None
    if kernels is not None:  # o^k = W_K^k Σ_j p_kj ĥ_j, each head's rows of W_K read once
        o = kernels.rows_dot(out.transpose(1, 2).reshape(b * j, n_heads, dim), w_k)
        return o.view(b, j, n_heads, head_dim).transpose(1, 2), out
    if blocked:  # the diagonal blocks of (Σ_j p_kj ĥ_j) W_Kᵀ: o^k = W_K^k Σ_j p_kj ĥ_j
        return (out @ w_k.T).view(b, n_heads, j, n_heads, head_dim).diagonal(dim1=1, dim2=3).permute(0, 3, 1, 2), out
    return torch.einsum("bkjD,kdD->bkjd", out, w_k.view(n_heads, head_dim, dim)), out


def _moved_queries(q: Tensor, w_k: Tensor, diag: Diagonal) -> Tensor:
    """The queries in ĥ's space, W_K^kᵀ q^k + d_k ∘ u for every head: (B, K, J, D)."""
    qd = diag.qd
    return per_head(q, w_k) + (qd.unsqueeze(1) if qd.dim() == 3 else qd)


def cem_attention_query_side(q: Tensor, w_k: Tensor, diag: Diagonal, positions: Positions, q_start: int = 0) -> tuple[Tensor, Tensor]:
    """The attention core read from the context ĥ = diag.hn (B, Jk, D) alone, in one pass for every head (see
    the module doc) through SDPA: q (B, K, J, d), w_k W_K (K·d, D) -> (o (B, K, J, d), Σ_j p_kj ĥ_j (B, K, J, D))."""
    b, n_heads, j, head_dim = q.shape
    hn = diag.hn
    query = _moved_queries(q, w_k, diag).reshape(b, 1, n_heads * j, hn.shape[-1])
    bias = positions.bias(q_start, j, hn.shape[-2], q.dtype, q.device).reshape(1, 1, n_heads * j, -1)  # (K, J, Jk) as rows
    ctx = hn.unsqueeze(1)
    out = sdpa(query, ctx, ctx, bias, scale=1.0 / math.sqrt(head_dim), decoding=follows_cache(q_start))
    return _heads_out(out.view(b, n_heads, j, -1), w_k)


def cem_attention_query_side_cpu(q: Tensor, w_k: Tensor, diag: Diagonal, positions: Positions, q_start: int = 0) -> tuple[Tensor, Tensor]:
    """`cem_attention_query_side` for bf16 on the CPU: the fused decode kernel of `cem.kernels` where it runs (ĥ
    read once, the bias built in place), else two GEMMs and a float32 softmax (logits and bias in float32): 3.5 ms
    a layer at 8k keys on one AMD EPYC thread, SDPA's flash kernel at this head width (D) 5.5 ms; in float32 SDPA is
    faster, hence the entry's dtypes."""
    b, n_heads, j, head_dim = q.shape
    hn = diag.hn
    kernels = decode_kernels(q, hn, w_k, q_start=q_start)
    scaled = _moved_queries(q, w_k, diag).reshape(b, n_heads * j, hn.shape[-1]) * (1.0 / math.sqrt(head_dim))  # 1/τ on the K·J queries
    if kernels is not None:
        out = kernels.attention(hn, scaled, positions.slopes(q.device).float(), positions.self_bias.float(), q_start)
    else:  # logits as (B, Jk, K·J): ĥ the untransposed operand (a transposed one copies the whole cache)
        wide = torch.promote_types(q.dtype, torch.float32)  # logits and bias in float32 (or wider)
        bias = positions.bias(q_start, j, hn.shape[-2], wide, q.device).reshape(1, n_heads * j, -1)
        logits = torch.add(bias, torch.bmm(hn, scaled.transpose(1, 2)).transpose(1, 2))  # one pass: float32 (B, K·J, Jk)
        out = torch.bmm(torch.softmax(logits, dim=-1).to(hn.dtype), hn)
    return _heads_out(out.view(b, n_heads, j, -1), w_k)


def query_side_energy(q: Tensor, w_k: Tensor, diag: Diagonal, positions: Positions, q_start: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """`cem_attention_query_side`'s outputs and, from the same logits, ε_i = -τ Σ_k logsumexp_j(logit_kij) (B, J)."""
    b, n_heads, j, head_dim = q.shape
    hn = diag.hn
    query = _moved_queries(q, w_k, diag).reshape(b, 1, n_heads * j, hn.shape[-1])
    bias = positions.bias(q_start, j, hn.shape[-2], q.dtype, q.device).reshape(1, 1, n_heads * j, -1)
    ctx = hn.unsqueeze(1)
    out, lse = softmax_values(query @ ctx.transpose(-1, -2) / math.sqrt(head_dim) + bias, ctx)
    energy = -math.sqrt(head_dim) * lse.view(b, n_heads, j).sum(dim=1)
    return (*_heads_out(out.view(b, n_heads, j, -1), w_k), energy)


def precondition(y: Tensor, precond) -> Tensor:
    """P_k y_k for every position's head outputs y (B, J, K, D) with the `Preconditioner` `precond`, or for few
    positions where `_blocked` the decode kernels: U_k (V_kᵀ y) + V_k (U_kᵀ y) as one product with each head's 2R
    rows [V_kᵀ; U_kᵀ] and one back with [U_kᵀ; V_kᵀ] (a bf16 `bmm` of one row per head is slow there)."""
    b, j, k, dim = y.shape
    p = precond
    kernels = decode_kernels(y, p.p) if p.u is not None and _blocked(y.transpose(1, 2), dim // k) else None
    if kernels is None:
        return p(y)
    rows = torch.cat([p.v, p.u], dim=-1).transpose(1, 2).reshape(-1, dim)  # (K·2R, D)
    back = torch.cat([p.u, p.v], dim=-1).transpose(1, 2).reshape(-1, dim)
    flat = y.reshape(b * j, k, dim)
    return (p.diagonal() * flat + kernels.rows_axpy(kernels.rows_dot(flat, rows), back)).view(b, j, k, dim)


# ----------------------------------------------------------------------------------------------- the choice


_TRITON_OK: dict[str, bool] = {}  # device -> the self-check's verdict
_RESOLVED: dict[tuple, str] = {}  # (requested, device, separate values) -> backend run


def triton_self_check(device: torch.device | str) -> bool:
    """Whether the Triton kernel matches the eager path on `device` (output and every gradient, fresh random
    inputs, float32); run once per device before "auto" trusts the kernel, cached. Inside torch.compile it
    cannot run: the verdict of an earlier eager call, else trusted (the trainer resolves eagerly first)."""
    key = str(torch.device(device))
    if torch.compiler.is_compiling():
        return _TRITON_OK.get(key, True)
    if key not in _TRITON_OK:
        # the check is its own computation: the caller's inference mode, no_grad or autocast (under which the
        # eager reference would run in bf16 and the kernel in float32) must not reach it
        with torch.inference_mode(False), torch.enable_grad(), torch.autocast(torch.device(device).type, enabled=False):
            g = torch.Generator(device=device).manual_seed(0)
            B, K, J, d = 2, 3, 37, 16

            def rand(*shape):
                return torch.randn(*shape, generator=g, device=device).requires_grad_(True)

            q, k, qd, hn = rand(B, K, J, d), rand(B, K, J, d), rand(B, J, K * d), rand(B, J, K * d)
            positions = Positions("standard", K, rand(K))
            outs = []
            for fn in (cem_attention_triton, cem_attention_eager):
                o = fn(q, k, Diagonal(qd, hn), positions)
                outs.append([o, *torch.autograd.grad(o.square().sum(), [q, k, qd, hn, positions.self_bias])])
        _TRITON_OK[key] = all(torch.allclose(a, b, rtol=1e-3, atol=1e-3) for a, b in zip(*outs))
        if not _TRITON_OK[key]:
            warnings.warn(f"the Triton CEM kernel disagrees with the eager path on {key}; 'auto' uses sdpa there", stacklevel=2)
    return _TRITON_OK[key]


def _triton_missing() -> str | None:
    return None if HAS_TRITON else "triton is not installed (pip install triton)"


@dataclass(frozen=True)
class Backend:
    """One implementation of the core and what it supports (every one takes all three diagonal kinds)."""

    run: Callable  # reads "keys": (q, k, diag, positions, q_start=0, v=None) -> o (B, K, Jq, dv); "context": see below
    values: bool = True  # takes values other than the keys (the exact gradient's value-side diagonal)
    devices: tuple[str, ...] | None = None  # device types it is meant for (None: any); elsewhere only when asked by name
    dtypes: tuple[torch.dtype, ...] | None = None  # dtypes it is meant for (None: any)
    backward_on: tuple[str, ...] | None = None  # device types where it has a backward (None: any)
    missing: Callable[[], str | None] = lambda: None  # what it lacks to run at all (None: nothing)
    self_check: Callable[[torch.device], bool] | None = None  # must pass on a device before "auto" picks it
    reads: str = "keys"  # "keys" k (B, K, Jk, d), or "context": the query side, (q, w_k, diag, positions, q_start=0) -> (o, Σ_j p_kj ĥ_j)

    def meant_for(self, device: torch.device | str, dtype: torch.dtype | None = None) -> bool:
        """Whether this backend is meant for `device` (and `dtype`, when given)."""
        return (self.devices is None or torch.device(device).type in self.devices) and (
            dtype is None or self.dtypes is None or dtype in self.dtypes
        )

    def why_not(self, device: torch.device | str, dtype: torch.dtype | None = None) -> str | None:
        """Why this backend is not meant for `device` (and `dtype`, when given) or cannot run (None: it is, and can)."""
        if not self.meant_for(device):
            return f"needs {' or '.join(t.upper() for t in self.devices)}"
        if not self.meant_for(device, dtype):
            return f"needs {' or '.join(str(t).removeprefix('torch.') for t in self.dtypes)}"
        return self.missing()

    def has_backward(self, device: torch.device | str) -> bool:
        return self.backward_on is None or torch.device(device).type in self.backward_on


IMPLEMENTATIONS: dict[str, Backend] = {
    "eager": Backend(cem_attention_eager),
    "sdpa": Backend(cem_attention_sdpa),
    "flex": Backend(cem_attention_flex, backward_on=("cuda",)),
    "triton": Backend(cem_attention_triton, values=False, devices=("cuda",), missing=_triton_missing, self_check=triton_self_check),
    "cpu": Backend(cem_attention_cpu, devices=("cpu",)),
    "query_side": Backend(cem_attention_query_side, reads="context"),
    "query_side_cpu": Backend(cem_attention_query_side_cpu, devices=("cpu",), dtypes=(torch.bfloat16,), reads="context"),
}
BACKENDS = ("auto", *(name for name, impl in IMPLEMENTATIONS.items() if impl.reads == "keys"))  # what a layer may ask for
AUTO = ("triton", "cpu", "sdpa")  # "auto" runs the first of these that suits the device (sdpa suits all)
QUERY_SIDE = ("query_side_cpu", "query_side")  # the query side runs the first of these meant for the device and dtype
FALLBACK = "sdpa"  # what runs when the backend asked for cannot take separate values
RENAMED = {"fast": "cpu"}  # old backend names still accepted (with a warning) -> their names now


def check_backend(backend: str, name: str = "attention backend") -> str:
    """`backend`'s name now if it is one of `BACKENDS` or a `RENAMED` one (with a FutureWarning), else a
    ValueError naming them (called at build time)."""
    if backend in RENAMED:
        warnings.warn(f"{name} {backend!r} is now called {RENAMED[backend]!r}; the old name will go", FutureWarning, stacklevel=2)
        return RENAMED[backend]
    check_choice(name, backend, BACKENDS)
    return backend


def _suits(impl: Backend, device: torch.device, values: bool, dtype: torch.dtype | None = None) -> bool:
    """Whether "auto" may run `impl` on `device`: meant for it (and `dtype`), taking the values asked for, self-checked."""
    return (
        impl.meant_for(device, dtype) and impl.missing() is None and (impl.values or not values)
        and (impl.self_check is None or impl.self_check(device))
    )  # fmt: skip


def auto_backend(device: torch.device | str, values: bool = False) -> str:
    """The backend that "auto" runs on `device` (see the module doc), given whether separate values are passed."""
    device = torch.device(device)
    return next(name for name in AUTO if _suits(IMPLEMENTATIONS[name], device, values))


def _decide(backend: str, device: torch.device | str, values: bool) -> str:
    if backend == "auto":
        return auto_backend(device, values)
    impl = IMPLEMENTATIONS[backend]
    if values and not impl.values:
        warnings.warn(f"the {backend} CEM kernel ties values to keys; v given, falling back to {FALLBACK}", stacklevel=4)
        return FALLBACK
    if impl.missing() is not None:
        raise RuntimeError(f"backend={backend!r} requested but {impl.missing()}")
    return backend


def resolve_backend(backend: str, device: torch.device | str, values: bool = False) -> str:
    """The backend actually run for a requested one on `device` ("auto" decided, triton with separate
    `values` falling back to sdpa), decided once per device and kind of input, then cached."""
    backend = check_backend(RENAMED.get(backend, backend))  # an old name: the layer's check has warned once
    key = (backend, str(torch.device(device)), bool(values))
    chosen = _RESOLVED.get(key)
    if chosen is None:
        chosen = _decide(backend, device, bool(values))
        if not torch.compiler.is_compiling():  # decided without the self-check: do not keep it
            _RESOLVED[key] = chosen
    return chosen


def decode_kernels(*tensors: Tensor, q_start: int | Tensor = 0) -> DecodeKernels | None:
    """The CPU decode kernels (`cem.kernels.decode_kernels`) for an inference step over `tensors`, or None for the
    PyTorch forms: bf16 tensors on a CPU where the kernels build and pass their self-check (decided once per
    process there), widths (last dims) multiples of 32, eager only (not under torch.compile, not a static cache's
    position tensor), no gradient."""
    if (
        any(t.device.type != "cpu" or t.dtype != torch.bfloat16 or t.shape[-1] % 32 for t in tensors) or isinstance(q_start, Tensor)
        or torch.compiler.is_compiling() or (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))
    ):  # fmt: skip
        return None
    return _decode_kernels()


def cem_attention(
    q: Tensor,
    k: Tensor,
    diag: Diagonal | None,
    positions: Positions,
    q_start: int = 0,
    v: Tensor | None = None,
    backend: str = "auto",
) -> Tensor:
    """The CEM attention core through `backend` (see the module doc); the same maths for all of them."""
    chosen = resolve_backend(backend, q.device, values=v is not None)
    return IMPLEMENTATIONS[chosen].run(q, k, diag, positions, q_start, v)


def cem_query_side(q: Tensor, w_k: Tensor, diag: Diagonal, positions: Positions, q_start: int = 0, with_energy: bool = False):
    """The query side (see the module doc) through the first of `QUERY_SIDE` meant for q's device and dtype, or
    with `with_energy` in its eager form: (o (B, K, J, d), Σ_j p_kj ĥ_j (B, K, J, D), ε (B, J) or None)."""
    if with_energy:
        return query_side_energy(q, w_k, diag, positions, q_start)
    name = next(name for name in QUERY_SIDE if _suits(IMPLEMENTATIONS[name], q.device, False, q.dtype))
    return (*IMPLEMENTATIONS[name].run(q, w_k, diag, positions, q_start), None)
