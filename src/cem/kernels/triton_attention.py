"""Fused Triton CEM attention: `triton_cem_attention`, an autograd Function over the kernels of
`_triton_kernels.py` (forward with online softmax; backward as a query-side and a key-side kernel).

Same semantics as `cem.layers.attention_core.cem_attention_eager` without `v` (values are the keys), with its
`Diagonal` and `Positions` passed as tensors (qd, hn, slopes m, self bias s):

    logit_kij = (k_j^k · q_i^k + ĥ_j · qd_i^k) / sqrt(d) - m_k (q_start + i - j) + s_k [q_start + i = j]
    o_i^k     = Σ_{j <= q_start + i} softmax_j(logit_kij) k_j^k

CUDA tensors run the compiled kernels; CPU tensors (or TRITON_INTERPRET=1) run the same kernels in
Triton's interpreter, which is how the tests check them on a machine without a GPU. Importing this module
without triton installed works: `HAS_TRITON` is False and `triton_cem_attention` raises.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

try:  # pragma: no cover - exercised by whichever environment runs
    import triton

    HAS_TRITON = True
    TRITON_IMPORT_ERROR: Exception | None = None
except Exception as exc:  # ImportError, or a broken install
    triton = None
    HAS_TRITON = False
    TRITON_IMPORT_ERROR = exc

__all__ = ["HAS_TRITON", "KernelConfig", "KernelLaunch", "default_config", "kq_diag_of", "triton_cem_attention", "uses_interpreter"]

_SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_KERNEL_MODULES: dict[bool, object] = {}


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


@dataclass(frozen=True)
class KernelConfig:
    """Tile sizes. heads_per_program (G, a power of two) heads share one program and so one diagonal
    tile: G >= n_heads gives the diagonal term exactly once per (query block, key block) tile; a smaller
    G bounds the [G, BLOCK_M, d] accumulator (registers) at the cost of recomputing the diagonal tile
    once per head group. allow_tf32 only affects float32 inputs on GPU (default: exact fp32 products)."""

    block_m: int = 16
    block_n: int = 32
    block_dd: int = 64
    heads_per_program: int = 0  # 0: choose from the register budget
    num_warps: int = 4
    num_stages: int = 1
    allow_tf32: bool = False
    diag_scores: bool | None = None  # shared diagonal as a (B, Jq, Jk) score matrix (None: when it fits, see KernelLaunch)


# The shared diagonal's scores ĥ_j·qd_i as one (B, Jq, Jk) matrix product (cuBLAS) that the kernels read as a
# bias tile, and its backward as Σ_heads dS written by the query-side kernel, then dqd = dS ĥ and dĥ = dSᵀ qd:
# no D-wide work or fp32 atomics inside the kernels. Used while the matrices (scores, and dS per head group)
# take at most this many bytes; beyond, the kernels compute the term tile by tile over D (O(L) memory).
DIAG_SCORES_MAX_BYTES = 2**30


def kq_diag_of(qd: Tensor | None) -> str:
    """The kind of key-query diagonal whose term qd = d ∘ u this is, by the names of `cem.layers.KQ_DIAGONALS`:
    "none" (None), "shared" (B, Jq, D) or "per_head" (B, K, Jq, D)."""
    if qd is None:
        return "none"
    return "per_head" if qd.dim() == 4 else "shared"


def uses_interpreter(device: torch.device) -> bool:
    """True where the kernels run in Triton's interpreter: non-CUDA tensors, or TRITON_INTERPRET=1."""
    if not HAS_TRITON:
        return False
    return torch.device(device).type != "cuda" or bool(triton.knobs.runtime.interpret)


_REG_LIMIT = 165  # estimated fp32 registers a thread (see _footprint); spills began near 170-190


def _footprint(g, m, n, dh, dd, elem, diag, scores, backward):
    """Rough count of fp32 registers a program holds (summed over its threads) for one iteration, for the
    diagonal kind `diag` ("none", "shared", "per_head"), the shared one read as score tiles if `scores`.

    Calibrated against ptxas' register/spill report for sm_90 (docs/kernels.md): accumulators and score
    tiles in fp32, operand tiles weighted by `elem` (0.5 for 16-bit, 2.5 for fp32 (ieee dots run on FMA units and hold more)).
    """
    in_tiles = diag != "none" and not scores  # the term computed tile by tile over D
    diag_tile = 0
    if scores:  # a [BLOCK_M, BLOCK_N] tile of the score matrix
        diag_tile = m * n * (1 + elem)
    elif diag == "shared":
        diag_tile = m * n + elem * (m + n) * dd
    elif diag == "per_head":
        diag_tile = g * m * n + elem * (g * m + n) * dd
    fwd = g * m * dh + 2 * g * m * n + elem * (g * m * dh + g * n * dh) + diag_tile
    if not backward:
        return fwd
    contrib_q = m * n if scores else {"none": 0, "per_head": g * m * dd, "shared": m * dd}[diag]
    dq = g * m * dh + 4 * g * m * n + elem * (2 * g * m * dh + g * n * dh) + diag_tile + contrib_q
    dk = g * n * dh + 4 * g * m * n + elem * (g * n * dh + 2 * g * m * dh) + diag_tile + (n * dd if in_tiles else 0)
    return max(dq, dk)


def default_config(
    n_heads: int,
    head_dim: int,
    model_dim: int,
    dtype: torch.dtype,
    device: torch.device,
    backward: bool = False,
    diag: str = "shared",
    scores: bool = False,
) -> KernelConfig:
    """Tiles of one launch: measured on an H100 for 16-bit scores/no-diagonal kernels, a heuristic elsewhere.

    diag is the key-query diagonal's kind, "shared", "per_head" or "none" (`kq_diag_of`); `scores`: the shared
    one read as a score matrix. GPU, 16-bit, scores or no diagonal, head width <= 64: the tiles measured best
    (docs/benchmarks/kernel_tiles_h100.md). Other GPU cases (untimed): the most heads per program (G), then the largest tiles and
    the fewest warps whose estimated register footprint (`_footprint`) stays under `_REG_LIMIT` a thread,
    so the whole head set shares one diagonal tile whenever that fits. Checked to compile for sm_90
    without spills for the shapes in docs/kernels.md. Interpreter: small
    tiles, so that the tests cross several ragged blocks.
    """
    return _config(n_heads, head_dim, model_dim, dtype, uses_interpreter(device), backward, diag, scores)


@functools.lru_cache(maxsize=256)
def _config(n_heads, head_dim, model_dim, dtype, interpret, backward, diag, scores) -> KernelConfig:
    """`default_config`, decided once per shape and kind (it ran on every launch: a Python walk over tiles)."""
    block_dh = max(16, _next_pow2(head_dim))
    block_dd = min(64, max(16, _next_pow2(max(model_dim, 1))))
    kp = _next_pow2(n_heads)
    if interpret:
        return KernelConfig(block_m=16, block_n=16, block_dd=min(32, block_dd), heads_per_program=kp)
    elem = 2.5 if dtype == torch.float32 else 0.5
    if dtype != torch.float32 and (scores or diag == "none") and block_dh <= 64:
        # measured (H100, bf16, 12 heads of 64, L 2048; docs/benchmarks/kernel_tiles_h100.md): four heads a
        # program, 16-row tiles and 4 warps beat the register-budget choice below by 1.9x forward, 1.6x backward
        return KernelConfig(block_m=16, block_n=32 if backward else 16, block_dd=block_dd,
                            heads_per_program=min(4, kp), num_warps=4, num_stages=1)
    g = kp
    while True:
        for m, n in ((64, 64), (64, 32), (32, 64), (32, 32), (32, 16), (16, 32), (16, 16)):
            for dd in sorted({block_dd, min(block_dd, 32)}, reverse=True):
                for warps in (4, 8):
                    if _footprint(g, m, n, block_dh, dd, elem, diag, scores, backward) <= _REG_LIMIT * 32 * warps:
                        return KernelConfig(block_m=m, block_n=n, block_dd=dd, heads_per_program=g,
                                            num_warps=warps, num_stages=1)
        if g == 1:
            return KernelConfig(block_m=16, block_n=16, block_dd=16, heads_per_program=1, num_warps=8)
        g //= 2


def _kernels(interpret: bool):
    """The kernel module, decorated for the interpreter or for compilation (loaded once each)."""
    mod = _KERNEL_MODULES.get(interpret)
    if mod is None:
        name = f"cem.kernels._triton_kernels_{'interpreted' if interpret else 'compiled'}"
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("_triton_kernels.py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        with triton.knobs.runtime.scope():
            triton.knobs.runtime.interpret = interpret
            spec.loader.exec_module(mod)
        _KERNEL_MODULES[interpret] = mod
    return mod


def _qd_strides(qd: Tensor | None) -> tuple[int, int, int, int]:
    """(batch, head, row, feature) strides of qd; head stride 0 when shared or absent."""
    if qd is None:
        return (0, 0, 0, 0)
    if qd.dim() == 3:
        return (qd.stride(0), 0, qd.stride(1), qd.stride(2))
    return tuple(qd.stride())


class KernelLaunch:
    """Everything the three kernels share: shapes, flags, tile sizes, grid."""

    def __init__(self, q, k, qd, hn, q_start, config: KernelConfig | None, backward: bool = False):
        B, K, Jq, d = q.shape
        self.B, self.K, self.Jq, self.d = B, K, Jq, d
        self.Jk = k.shape[2]
        self.D = hn.shape[-1] if qd is not None else 0
        self.q_start = int(q_start)
        self.interpret = uses_interpreter(q.device)
        diag = kq_diag_of(qd)
        wanted = None if config is None else config.diag_scores
        cfg, self.scores = config, False
        if diag == "shared" and wanted is not False:
            scores_cfg = config or default_config(K, d, self.D, q.dtype, q.device, backward=backward, diag=diag, scores=True)
            groups = -(-K // min(scores_cfg.heads_per_program or _next_pow2(K), _next_pow2(K)))
            # the score matrix, and in the backward Σ_heads dS per head group
            need = B * Jq * self.Jk * q.element_size() * (1 + (groups if backward else 0))
            if wanted or need <= DIAG_SCORES_MAX_BYTES:
                cfg, self.scores = scores_cfg, True
        cfg = cfg or default_config(K, d, self.D, q.dtype, q.device, backward=backward, diag=diag)
        g = cfg.heads_per_program or _next_pow2(K)
        if g & (g - 1):
            raise ValueError(f"heads_per_program must be a power of two, got {g}")
        self.G = min(g, _next_pow2(K))
        self.n_groups = -(-K // self.G)
        self.cfg = cfg
        self.consts = dict(
            G=self.G,
            BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n,
            BLOCK_DH=max(16, _next_pow2(d)),
            BLOCK_DD=cfg.block_dd,
            HAS_DIAG=diag != "none" and not self.scores,
            HAS_BIAS=self.scores,
            PER_HEAD=diag == "per_head",
            PREC="tf32" if (cfg.allow_tf32 or q.dtype != torch.float32) else "ieee",
            UPCAST=self.interpret,
        )
        self.launch_opts = {} if self.interpret else dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        self.scale = 1.0 / math.sqrt(d)
        self.scale2 = self.scale * 1.4426950408889634

    def grid_q(self):
        return (triton.cdiv(self.Jq, self.cfg.block_m), self.B * self.n_groups)

    def grid_k(self):
        return (triton.cdiv(self.Jk, self.cfg.block_n), self.B * self.n_groups)

    def sizes(self):
        return (self.K, self.Jq, self.Jk, self.d, self.D, self.q_start)

    def diag_scores(self, qd, hn):
        """(scores, their (batch, row, col) strides): ĥ_j·qd_i as one batched matrix product in the input dtype
        (float32 accumulation); (None, zero strides) outside the scores mode, where the kernels never read them."""
        if not self.scores:
            return None, (0, 0, 0)
        scores = torch.bmm(qd, hn.transpose(1, 2))
        return scores, scores.stride()


def _config_key(config: KernelConfig | None) -> list[int] | None:
    """A KernelConfig as the integers a custom op can take (None stays None; diag_scores None is -1)."""
    if config is None:
        return None
    c = config
    scores = -1 if c.diag_scores is None else int(c.diag_scores)
    return [c.block_m, c.block_n, c.block_dd, c.heads_per_program, c.num_warps, c.num_stages, int(c.allow_tf32), scores]


def _config_of(key: list[int] | None) -> KernelConfig | None:
    if key is None:
        return None
    m, n, dd, g, warps, stages, tf32, scores = key
    return KernelConfig(m, n, dd, g, warps, stages, bool(tf32), None if scores < 0 else bool(scores))


def _fwd_impl(
    q: Tensor, k: Tensor, qd: Tensor | None, hn: Tensor | None, slopes: Tensor, self_bias: Tensor | None, q_start: int,
    config: list[int] | None,
) -> tuple[Tensor, Tensor]:
    """(o, lse): the attention output and each query's log-sum-exp of its logits in base 2 (float32, as
    the kernels keep it), for the backward."""
    L = KernelLaunch(q, k, qd, hn, q_start, _config_of(config))
    mod = _kernels(L.interpret)
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((L.B, L.K, L.Jq), dtype=torch.float32, device=q.device)
    qd_arg = qd if qd is not None else q  # dummy pointer, never read (HAS_DIAG=False)
    hn_arg = hn if qd is not None else q
    sb_arg = self_bias if self_bias is not None else slopes
    scores, scores_strides = L.diag_scores(qd, hn)
    mod.cem_fwd_kernel[L.grid_q()](
        q, k, qd_arg, hn_arg, slopes, sb_arg, o, lse,
        *q.stride(), *k.stride(), *_qd_strides(qd),
        *(hn.stride() if qd is not None else (0, 0, 0)),
        scores if scores is not None else q, *scores_strides,
        *o.stride(), *lse.stride(),
        *L.sizes(), L.scale2,
        HAS_SB=self_bias is not None, **L.consts, **L.launch_opts,
    )
    return o, lse  # the scores are recomputed in the backward (one matrix product): O(L) memory between passes


def _bwd_impl(
    do: Tensor, q: Tensor, k: Tensor, qd: Tensor | None, hn: Tensor | None, slopes: Tensor, self_bias: Tensor | None,
    o: Tensor, lse: Tensor, q_start: int, config: list[int] | None, need_qd: bool, need_hn: bool, need_sb: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dqd, dĥ, d self bias); a gradient not asked for (need_*) is an empty tensor."""
    L = KernelLaunch(q, k, qd, hn, q_start, _config_of(config), backward=True)
    mod = _kernels(L.interpret)
    do = do.to(q.dtype)
    delta = (do.float() * o.float()).sum(-1)  # Δ_i = dO_i · O_i, (B, K, Jq), fp32
    dq = torch.empty_like(q)
    dk = torch.empty_like(k)
    has_diag = qd is not None
    in_kernel = has_diag and not L.scores  # dqd, dĥ accumulated by the kernels (fp32 atomics)
    dqd = torch.zeros(qd.shape, dtype=torch.float32, device=q.device) if in_kernel else None
    dhn = torch.zeros(hn.shape, dtype=torch.float32, device=q.device) if in_kernel else None
    scores, scores_strides = L.diag_scores(qd, hn)
    # Σ_heads dS per head group; tiles the causal loop skips stay zero
    ds = torch.zeros((L.B, L.n_groups, L.Jq, L.Jk), dtype=q.dtype, device=q.device) if L.scores else None
    dsb = torch.zeros(L.K, dtype=torch.float32, device=q.device)
    qd_arg = qd if has_diag else q
    hn_arg = hn if has_diag else q
    sb_arg = self_bias if self_bias is not None else slopes
    hn_strides = hn.stride() if has_diag else (0, 0, 0)
    common = (q, k, qd_arg, hn_arg, slopes, sb_arg, do, lse, delta)
    strides = (*q.stride(), *k.stride(), *_qd_strides(qd), *hn_strides, scores if scores is not None else q,
               *scores_strides, *do.stride(), *lse.stride())
    assert delta.stride() == lse.stride()
    mod.cem_bwd_dq_kernel[L.grid_q()](
        *common, dq, dqd if in_kernel else dsb, dsb,
        *strides, *dq.stride(), *_qd_strides(dqd),
        ds if ds is not None else dsb, *(ds.stride() if ds is not None else (0, 0, 0, 0)),
        *L.sizes(), L.scale2, L.scale,
        HAS_SB=self_bias is not None, **L.consts, **L.launch_opts,
    )
    mod.cem_bwd_dk_kernel[L.grid_k()](
        *common, dk, dhn if in_kernel else dsb,
        *strides, *dk.stride(), *(dhn.stride() if in_kernel else (0, 0, 0)),
        *L.sizes(), L.scale2, L.scale,
        HAS_SB=self_bias is not None, **L.consts, **L.launch_opts,
    )
    if L.scores:  # the diagonal's gradients from Σ_heads dS: two batched matrix products
        del scores
        ds = (ds.sum(1, dtype=torch.float32).to(q.dtype) if L.n_groups > 1 else ds[:, 0]) * L.scale
        dqd = torch.bmm(ds, hn) if need_qd else None
        dhn = torch.bmm(ds.transpose(1, 2), qd) if need_hn else None
    dqd_out = dqd.to(qd.dtype) if has_diag and need_qd else q.new_empty(0)  # outputs may not alias: one empty each
    dhn_out = dhn.to(hn.dtype) if has_diag and need_hn else q.new_empty(0)
    dsb_out = dsb.to(self_bias.dtype) if self_bias is not None and need_sb else q.new_empty(0)
    return dq, dk, dqd_out, dhn_out, dsb_out


# The forward and backward are also custom operators (torch.library), the form torch.compile sees: it keeps each
# as one opaque node instead of tracing the kernel launches (which broke the graph at the kernel-module lookup
# and, under the interpreter, failed), and autograd reaches the backward through `register_autograd`. Eager calls
# skip the operator wrappers (`_TritonAttention`): each costs tens of microseconds of Python a call (pytorch#139500).
_attention_fwd = torch.library.custom_op("cem::triton_attention_fwd", _fwd_impl, mutates_args=())
_attention_bwd = torch.library.custom_op("cem::triton_attention_bwd", _bwd_impl, mutates_args=())


@_attention_fwd.register_fake
def _(q, k, qd, hn, slopes, self_bias, q_start, config):
    return q.new_empty(q.shape), q.new_empty(q.shape[:3], dtype=torch.float32)  # contiguous, as the real outputs


@_attention_bwd.register_fake
def _(do, q, k, qd, hn, slopes, self_bias, o, lse, q_start, config, need_qd, need_hn, need_sb):
    return (torch.empty_like(q), torch.empty_like(k), qd.new_empty(qd.shape) if need_qd else q.new_empty(0),
            hn.new_empty(hn.shape) if need_hn else q.new_empty(0), self_bias.new_empty(self_bias.shape) if need_sb else q.new_empty(0))


def _setup_context(ctx, inputs, output) -> None:
    q, k, qd, hn, slopes, self_bias, q_start, config = inputs
    o, lse = output
    ctx.save_for_backward(q, k, qd, hn, slopes, self_bias, o, lse)
    ctx.q_start, ctx.config = q_start, config


def _grads(ctx, do, backward=_attention_bwd):
    """The inputs' gradients from what `_setup_context` saved, through `backward` (the operator or its implementation)."""
    q, k, qd, hn, slopes, self_bias, o, lse = ctx.saved_tensors
    need = ctx.needs_input_grad
    need_qd, need_hn, need_sb = qd is not None and need[2], qd is not None and need[3], self_bias is not None and need[5]
    dq, dk, dqd, dhn, dsb = backward(do, q, k, qd, hn, slopes, self_bias, o, lse, ctx.q_start, ctx.config, need_qd, need_hn, need_sb)
    return dq, dk, dqd if need_qd else None, dhn if need_hn else None, None, dsb if need_sb else None, None, None


_attention_fwd.register_autograd(lambda ctx, do, _dlse: _grads(ctx, do), setup_context=_setup_context)


class _TritonAttention(torch.autograd.Function):
    """The operators' implementations under plain autograd, for eager calls (no custom-operator wrappers)."""

    @staticmethod
    def forward(ctx, q, k, qd, hn, slopes, self_bias, q_start, config):
        o, lse = _fwd_impl(q, k, qd, hn, slopes, self_bias, q_start, config)
        _setup_context(ctx, (q, k, qd, hn, slopes, self_bias, q_start, config), (o, lse))
        return o

    @staticmethod
    def backward(ctx, do):
        return _grads(ctx, do, _bwd_impl)


def triton_cem_attention(
    q: Tensor,
    k: Tensor,
    qd: Tensor | None,
    hn: Tensor | None,
    slopes: Tensor,
    self_bias: Tensor | None,
    q_start: int = 0,
    *,
    config: KernelConfig | None = None,
) -> Tensor:
    """Fused CEM attention (values are the keys); `cem.layers.attention_core.cem_attention_triton` calls it.

    q (B, K, Jq, d), k (B, K, Jk, d), qd (B, Jq, D) shared, (B, K, Jq, D) per head, or None; hn (B, Jk, D);
    slopes (K,) (no gradient), self_bias (K,) or None. Gradients flow to q, k, qd, hn and self_bias.
    """
    if not HAS_TRITON:
        raise RuntimeError(f"triton is not available ({TRITON_IMPORT_ERROR!r}); use backend='sdpa' or 'eager'")
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(f"q and k must be (B, K, J, d), got {tuple(q.shape)} and {tuple(k.shape)}")
    B, K, Jq, d = q.shape
    if k.shape[0] != B or k.shape[1] != K or k.shape[3] != d:
        raise ValueError(f"k {tuple(k.shape)} does not match q {tuple(q.shape)}")
    if q.dtype not in _SUPPORTED_DTYPES or k.dtype != q.dtype:
        raise TypeError(f"q and k must share a float dtype among {_SUPPORTED_DTYPES}, got {q.dtype}, {k.dtype}")
    Jk = k.shape[2]
    if qd is not None:
        if hn is None or hn.dim() != 3 or hn.shape[0] != B or hn.shape[1] != Jk:
            raise ValueError(f"hn must be (B, Jk, D) = ({B}, {Jk}, D), got {None if hn is None else tuple(hn.shape)}")
        D = hn.shape[2]
        if qd.shape not in ((B, Jq, D), (B, K, Jq, D)):
            raise ValueError(f"qd must be ({B}, {Jq}, {D}) or ({B}, {K}, {Jq}, {D}), got {tuple(qd.shape)}")
        qd = qd.to(q.dtype)
        hn = hn.to(q.dtype)
    else:
        hn = None
    if Jq == 0:
        return q.new_zeros(q.shape)
    if Jk < 1:
        raise ValueError("at least one key is needed")
    if q_start < 0:
        raise ValueError(f"q_start must be >= 0, got {q_start}")
    slopes = slopes.detach().to(device=q.device, dtype=torch.float32).contiguous()
    if slopes.shape != (K,):
        raise ValueError(f"slopes must be ({K},), got {tuple(slopes.shape)}")
    if self_bias is not None and self_bias.shape != (K,):
        raise ValueError(f"self_bias must be ({K},), got {tuple(self_bias.shape)}")
    if self_bias is not None and self_bias.stride(0) != 1:
        self_bias = self_bias.contiguous()
    args = (q, k, qd, hn, slopes, self_bias, int(q_start), _config_key(config))
    return _attention_fwd(*args)[0] if torch.compiler.is_compiling() else _TritonAttention.apply(*args)
