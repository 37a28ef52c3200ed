"""Independent float64 references for the tests: the energies written from DESIGN.md, not from the layers.

Nothing here calls a layer's forward or energy; it only reads the layers' parameters.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy.special import spence


def randomize(module, scale=0.3, seed=0):
    """Fresh random values for every parameter (never the zeros of the init: key-query diagonal, self
    bias, V of the preconditioner), in place; norm gains near 1, preconditioner p near its init."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=p.dtype)
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * noise)
            elif name.endswith("precond.p"):
                p.add_(0.05 * noise)
            else:
                p.copy_(scale * noise)
    return module


def rms_norm(x, gain, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * gain


def precond_dense(pre, k):
    """P_k = diag(softplus(sqrt(D) p_k)) + U_k V_kᵀ + V_k U_kᵀ as a dense matrix (paper eq. 12, App. C.4)."""
    dim = pre.p.shape[-1]
    mat = torch.diag(torch.log1p(torch.exp(math.sqrt(dim) * pre.p[k])))
    if pre.u is not None:
        mat = mat + pre.u[k] @ pre.v[k].T + pre.v[k] @ pre.u[k].T
    return mat


def alibi_slope(layer, k):
    """m_k of head k (0-based): 2^(-8(k+1)/K) (standard ALiBi) or 2^(-(k+1)) (the paper's App. A example)."""
    if getattr(layer, "alibi", "standard") == "app-a":
        return 2.0 ** (-(k + 1))
    return 2.0 ** (-8.0 * (k + 1) / layer.n_heads)


def attention_head_energies(layer, u, h):
    """ε_k(u_i | ĥ_{1:i}) = -τ log Σ_{j<=i} exp(β_kj·u_i/τ + b_kij) per head k: shape (K, B, J)."""
    n_heads, dim = layer.n_heads, layer.dim
    d = dim // n_heads
    tau = math.sqrt(d)
    hn = rms_norm(h, layer.norm.weight, layer.norm.eps)
    J = h.shape[1]
    i = torch.arange(J, dtype=torch.float64)[:, None]
    j = torch.arange(J, dtype=torch.float64)[None, :]
    out = []
    for k in range(n_heads):
        wq = layer.w_q.weight[k * d : (k + 1) * d]
        wk = layer.w_k.weight[k * d : (k + 1) * d]
        A = wq.T @ wk
        if layer.kq_diag is not None:
            diag = layer.kq_diag if layer.kq_diag.dim() == 1 else layer.kq_diag[k]
            A = A + torch.diag(diag)
        beta = hn @ A.T  # β_j = A ĥ_j, (B, J, D)
        slope = alibi_slope(layer, k)
        bias = -slope * (i - j) + layer.self_bias[k] * (i == j)
        logits = u @ beta.transpose(-1, -2) / tau + bias
        logits = logits.masked_fill(j > i, float("-inf"))
        out.append(-tau * torch.logsumexp(logits, dim=-1))
    return torch.stack(out)


def attention_update_formula(layer, h):
    """DESIGN.md's default step at x = h: η Σ_k P_k W_Q^kᵀ Σ_j softmax_j(logit_kij) k_j^k (no value diagonal)."""
    n_heads, dim = layer.n_heads, layer.dim
    d = dim // n_heads
    hn = rms_norm(h, layer.norm.weight, layer.norm.eps)
    J = h.shape[1]
    upd = torch.zeros_like(h)
    for b in range(h.shape[0]):
        for i in range(J):
            for k in range(n_heads):
                wq = layer.w_q.weight[k * d : (k + 1) * d]
                wk = layer.w_k.weight[k * d : (k + 1) * d]
                q = wq @ hn[b, i]
                diag = 0 if layer.kq_diag is None else (layer.kq_diag if layer.kq_diag.dim() == 1 else layer.kq_diag[k])
                slope = alibi_slope(layer, k)
                logits = torch.stack(
                    [
                        ((wk @ hn[b, j]) @ q + hn[b, j] @ (diag * hn[b, i])) / math.sqrt(d)
                        - slope * (i - j)
                        + layer.self_bias[k] * (i == j)
                        for j in range(i + 1)
                    ]
                )
                p = torch.softmax(logits, 0)
                o = sum(p[j] * (wk @ hn[b, j]) for j in range(i + 1))
                y = wq.T @ o
                if layer.precond is not None:
                    y = precond_dense(layer.precond, k) @ y
                upd[b, i] += layer.step_size * y
    return upd


def silu_integral(z, nodes=48):
    """φ(z) = ∫_0^z t σ(t) dt by Gauss-Legendre with 48 nodes."""
    x, w = np.polynomial.legendre.leggauss(nodes)
    x = torch.as_tensor(x, dtype=z.dtype)
    w = torch.as_tensor(w, dtype=z.dtype)
    t = z.unsqueeze(-1) * (x + 1) / 2
    return z / 2 * (w * t * torch.sigmoid(t)).sum(-1)


def silu_integral_closed_form(z: np.ndarray) -> np.ndarray:
    """φ(z) = z softplus(z) + Li2(-e^z) + π²/12, with Li2(x) = spence(1 - x) (scipy)."""
    return z * np.logaddexp(0, z) + spence(1 + np.exp(z)) + np.pi**2 / 12


def mlp_energy(layer, u, h):
    """ξ(u_i | ĥ_i) = -γ_i·φ(V u_i) (convex variant: -|γ_i|·φ(sign(γ_i) V u_i)), shape (B, J)."""
    hn = rms_norm(h, layer.norm.weight, layer.norm.eps)
    gamma = hn @ layer.w_gate.weight.T
    z = u @ layer.w_up.weight.T
    if layer.convex:
        return -(gamma.abs() * silu_integral(torch.sign(gamma) * z)).sum(-1)
    return -(gamma * silu_integral(z)).sum(-1)
