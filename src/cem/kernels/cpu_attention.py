"""The CPU path of the CEM attention core: `cpu_cem_attention`, causal query blocks over a cached bias, and
without a diagonal PyTorch's fused CPU flash kernel with a backward of its own (`FusedKeyAttention`).

Same semantics as `cem.layers.attention_core.cem_attention_eager` (exact in float64), with its `Diagonal`
passed as tensors (qd = d ∘ u, hn = ĥ) and its `Positions` as the ALiBi bias (causal mask included) and
the self bias s:

    logit_kij = (k_j^k · q_i^k + ĥ_j · qd_i^k) / τ + alibi_kij + s_k [q_start + i = j]
    o_i^k     = Σ_{j <= q_start + i} softmax_j(logit_kij) v_j^k             (v = k unless given)

`cem.layers.attention_core` registers it as the backend "cpu" ("auto" on the CPU).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["FUSED_DTYPES", "QUERY_BLOCK", "AddSelfBias", "FusedKeyAttention", "cpu_cem_attention"]

QUERY_BLOCK = 64  # rows per causal query block
FUSED_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)  # the CPU flash kernel's dtypes


class FusedKeyAttention(torch.autograd.Function):
    """softmax(q kᵀ / τ + b) k through PyTorch's fused CPU flash kernel (values are the keys), with the
    kernel's own backward: the key gradient is the sum of its key and value gradients, and the self bias
    s_k gets ∂/∂s_k = Σ_{b,i} p_kii (g_i · k_i - g_i · o_i) from the kernel's log-sum-exp."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, self_bias: Tensor, base: Tensor, q_start: int, scale: float):
        n_q = q.shape[-2]
        bias = base.clone()
        bias[0].diagonal(offset=q_start, dim1=-2, dim2=-1).add_(self_bias.to(bias.dtype)[:, None])
        causal = q_start == 0 and n_q == k.shape[-2]
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, k, 0.0, causal, attn_mask=bias, scale=scale)
        ctx.save_for_backward(q, k, out, lse, bias)
        ctx.q_start, ctx.scale, ctx.causal = q_start, scale, causal
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        q, k, out, lse, bias = ctx.saved_tensors
        grad = grad.contiguous()
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad, q, k, k, out, lse, 0.0, ctx.causal, attn_mask=bias, scale=ctx.scale
        )
        n_q = q.shape[-2]
        own = k[:, :, ctx.q_start : ctx.q_start + n_q]
        logit = (q * own).sum(-1) * ctx.scale + bias[0].diagonal(offset=ctx.q_start, dim1=-2, dim2=-1)
        p_self = torch.exp(logit - lse)  # (B, K, Jq)
        d_self = (p_self * (grad * (own - out)).sum(-1)).sum(dim=(0, 2))
        return dq, dk + dv, d_self, None, None, None


class AddSelfBias(torch.autograd.Function):
    """scores[:, k, i, offset + i] += s_k in place; the gradient of s is the sum of the diagonal's, without the
    copies autograd makes around an in-place operator on a view (the whole gradient cloned, the diagonal copied
    out and back)."""

    @staticmethod
    def forward(ctx, scores: Tensor, self_bias: Tensor, offset: int):
        scores.diagonal(offset=offset, dim1=-2, dim2=-1).add_(self_bias.to(scores.dtype)[:, None])
        ctx.mark_dirty(scores)
        ctx.offset = offset
        return scores

    @staticmethod
    def backward(ctx, grad: Tensor):
        own = grad.diagonal(offset=ctx.offset, dim1=-2, dim2=-1).contiguous()  # contiguous as autograd's copy: the same bits
        return grad, own.sum(dim=(0, 2)), None


def _fused_ok(q: Tensor, qd: Tensor | None, v: Tensor | None) -> bool:
    return (
        qd is None and v is None and q.device.type == "cpu" and q.dtype in FUSED_DTYPES
        and not torch.compiler.is_compiling()
    )  # fmt: skip


def cpu_cem_attention(
    q: Tensor,
    k: Tensor,
    qd: Tensor | None,
    hn: Tensor | None,
    base: Tensor,
    self_bias: Tensor | None,
    q_start: int = 0,
    v: Tensor | None = None,
    block: int = QUERY_BLOCK,
) -> Tensor:
    """o (B, K, Jq, dv) of the module doc, with less work than the eager path: q (B, K, Jq, d), k (B, K, Jk, d),
    qd (B, Jq, D) shared or (B, K, Jq, D) per head or None, hn (B, Jk, D), base the ALiBi bias with the causal
    mask (1, K, Jq, Jk), a constant, self_bias s (K,) or None, v (B, K, Jk, dv) or None:

    - q/τ and qd/τ are formed before the matmuls (O(J·D) instead of a J×J division);
    - the scores are accumulated onto `base`, and the self bias is added on the diagonal only (its gradient is
      the diagonal's sum);
    - queries go in causal blocks of `block` rows: a block reads keys up to its last query only;
    - without a diagonal (and without separate values), the fused CPU flash kernel (`FusedKeyAttention`).
    """
    scale = 1.0 / math.sqrt(q.shape[-1])
    n_q, n_k = q.shape[-2], k.shape[-2]
    if _fused_ok(q, qd, v):
        sb = self_bias if self_bias is not None else torch.zeros(q.shape[1], dtype=q.dtype, device=q.device)
        return FusedKeyAttention.apply(q, k, sb, base, q_start, scale)
    values = k if v is None else v
    qs = q * scale
    qds = None if qd is None else qd * scale
    outs = []
    for a in range(0, n_q, block):
        b = min(n_q, a + block)
        last = min(n_k, q_start + b)  # keys this block can see
        kt = _part(k, 2, 0, last).transpose(-1, -2)
        scores = _batched(_part(qs, 2, a, b), kt) + _part(_part(base, 2, a, b), 3, 0, last)  # not `+=`: on a view, autograd copies
        if qds is not None:
            hnt = _part(hn, 1, 0, last).transpose(-1, -2).to(qds.dtype)
            term = torch.bmm(_part(qds, 1, a, b), hnt) if qds.dim() == 3 else _part(qds, 2, a, b) @ hnt.unsqueeze(1)
            scores += term.unsqueeze(1) if qds.dim() == 3 else term
        if self_bias is not None and torch.compiler.is_compiling():  # a graph has no per-operator cost: traced as before (the same bits)
            scores.diagonal(offset=q_start + a, dim1=-2, dim2=-1).add_(self_bias.to(scores.dtype)[:, None])
        elif self_bias is not None:
            scores = AddSelfBias.apply(scores, self_bias, q_start + a)
        outs.append(_batched(torch.softmax(scores, dim=-1), _part(values, 2, 0, last)))
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-2)


def _batched(a: Tensor, b: Tensor) -> Tensor:
    """a @ b for 4-D a, b of the same batch dims: the one bmm `@` runs, on the same operands (so the same bits),
    with fewer view operators around it."""
    (B, K, n, m), p = a.shape, b.shape[-1]
    return torch.bmm(a.reshape(B * K, n, m), b.reshape(B * K, m, p)).view(B, K, n, p)


def _part(t: Tensor, dim: int, start: int, stop: int) -> Tensor:
    """t[start:stop] along `dim`; t itself when that is all of it (a full slice still costs an operator a call)."""
    return t if start == 0 and stop == t.shape[dim] else t.narrow(dim, start, stop - start)
