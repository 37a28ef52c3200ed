"""Triton kernels of the fused CEM attention (forward, and the two backward passes).

Do not import this file directly: `cem.kernels.triton_attention` loads it twice under two module names,
once compiled (`triton.jit`, CUDA tensors) and once for Triton's interpreter (CPU tensors), so that
which one runs depends on the tensors' device, not on whether TRITON_INTERPRET was set before the first
import. See docs/kernels.md for the design.

Notation inside the kernels: G heads of one head group are handled by one program (G a power of two,
padded heads masked), BLOCK_M query rows, BLOCK_N keys, BLOCK_DH >= head width d (masked), BLOCK_DD a
chunk of the model width D of the diagonal term. All logits are kept in base 2 (`s2 = logit * log2(e)`),
the stored log-sum-exp `lse2` too.
"""

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _sum(x, axis: tl.constexpr):
    """tl.sum without going through triton.language.standard's jit function, so that the interpreter
    runs these kernels even when triton was first imported without TRITON_INTERPRET (see module doc)."""
    return tl.reduce(x, axis, tl.standard._sum_combine)


@triton.jit
def _max(x, axis: tl.constexpr):
    return tl.reduce(x, axis, tl.standard._elementwise_max)


@triton.jit
def _dot(a, b, PREC: tl.constexpr, UPCAST: tl.constexpr):
    """tl.dot with fp32 accumulation. UPCAST (interpreter only): Triton 3.9's interpreter multiplies the
    raw uint16 storage of bfloat16 operands, so they are upcast first; bf16 x bf16 with fp32 accumulation
    is exactly an fp32 product of the bf16 values, so this emulates the GPU up to summation order."""
    if UPCAST:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, input_precision=PREC)


@triton.jit
def _bdot(a, b, G: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr):
    """Per-head product of [G, R, C] by [G, C, S] tiles. With one head a program (G = 1) the head axis is
    dropped and the product is a 2-D dot, which Triton can lower to Hopper's wgmma; its 3-D (batched) dot
    is lowered to mma.sync."""
    if G == 1:
        r = _dot(tl.reshape(a, [a.shape[1], a.shape[2]]), tl.reshape(b, [b.shape[1], b.shape[2]]), PREC, UPCAST)
        return tl.reshape(r, [1, a.shape[1], b.shape[2]])
    else:
        return _dot(a, b, PREC, UPCAST)


@triton.jit
def _load_heads(ptr, s_h, s_r, s_c, heads, rows, cols, K, n_rows, n_cols):
    """Tile [G, R, C] of a (.., K, rows, cols) tensor at (heads, rows, cols), zero outside."""
    p = ptr + heads[:, None, None] * s_h + rows[None, :, None] * s_r + cols[None, None, :] * s_c
    m = (heads[:, None, None] < K) & (rows[None, :, None] < n_rows) & (cols[None, None, :] < n_cols)
    return tl.load(p, mask=m, other=0.0)


@triton.jit
def _diag_scores(qd_ptr, hn_ptr, heads, offs_m, offs_n, K, Jq, Jk, D,
                 s_qd_h, s_qd_m, s_qd_d, s_hn_n, s_hn_d,
                 G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DD: tl.constexpr,
                 PER_HEAD: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr):
    """ĥ_j · qd_i for one (query block, key block) tile, reduced over D in chunks of BLOCK_DD.

    Shared qd: ONE [BLOCK_M, BLOCK_N] product serves every head (returned as [1, M, N], broadcast).
    Per-head qd: the heads are folded into the rows, [G*BLOCK_M, Dc] @ [Dc, BLOCK_N], so the ĥ chunk is
    loaded once and reused by all heads; returned as [G, M, N]. qd_ptr / hn_ptr already point at batch b.
    """
    offs_dd = tl.arange(0, BLOCK_DD)
    if PER_HEAD:
        acc = tl.full([G * BLOCK_M, BLOCK_N], 0.0, dtype=tl.float32)
    else:
        acc = tl.full([BLOCK_M, BLOCK_N], 0.0, dtype=tl.float32)
    for d0 in range(0, D, BLOCK_DD):
        dd = d0 + offs_dd
        hn = tl.load(hn_ptr + offs_n[:, None] * s_hn_n + dd[None, :] * s_hn_d,
                     mask=(offs_n[:, None] < Jk) & (dd[None, :] < D), other=0.0)
        if PER_HEAD:
            qd = _load_heads(qd_ptr, s_qd_h, s_qd_m, s_qd_d, heads, offs_m, dd, K, Jq, D)
            acc += _dot(tl.reshape(qd, [G * BLOCK_M, BLOCK_DD]), tl.trans(hn), PREC, UPCAST)
        else:
            qd = tl.load(qd_ptr + offs_m[:, None] * s_qd_m + dd[None, :] * s_qd_d,
                         mask=(offs_m[:, None] < Jq) & (dd[None, :] < D), other=0.0)
            acc += _dot(qd, tl.trans(hn), PREC, UPCAST)
    if PER_HEAD:
        res = tl.reshape(acc, [G, BLOCK_M, BLOCK_N])
    else:
        res = tl.expand_dims(acc, 0)
    return res


@triton.jit
def _logits2(q, kt, qd_ptr, hn_ptr, heads, offs_m, offs_n, slopes2, sb2,
             K, Jq, Jk, D, q_start, scale2,
             s_qd_h, s_qd_m, s_qd_d, s_hn_n, s_hn_d, bias_ptr, s_bias_m, s_bias_n,
             G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DD: tl.constexpr,
             HAS_DIAG: tl.constexpr, PER_HEAD: tl.constexpr, HAS_SB: tl.constexpr, HAS_BIAS: tl.constexpr,
             PREC: tl.constexpr, UPCAST: tl.constexpr):
    """Base-2 logits [G, M, N] of one tile, -inf where masked (causal, or key beyond Jk).

    s2 = log2(e) * [ (k_j·q_i + ĥ_j·qd_i) / sqrt(d) - m_k (i_abs - j) + s_k [i_abs = j] ].
    Also returns rel = i_abs - j ([M, N]) for the self-bias gradient.
    """
    s = _bdot(q, tl.permute(kt, (0, 2, 1)), G, PREC, UPCAST)
    if HAS_DIAG:
        s += _diag_scores(qd_ptr, hn_ptr, heads, offs_m, offs_n, K, Jq, Jk, D,
                          s_qd_h, s_qd_m, s_qd_d, s_hn_n, s_hn_d,
                          G, BLOCK_M, BLOCK_N, BLOCK_DD, PER_HEAD, PREC, UPCAST)
    if HAS_BIAS:  # the shared diagonal's scores ĥ_j·qd_i, computed outside as one matrix product
        bias = tl.load(bias_ptr + offs_m[:, None] * s_bias_m + offs_n[None, :] * s_bias_n,
                       mask=(offs_m[:, None] < Jq) & (offs_n[None, :] < Jk), other=0.0)
        s += tl.expand_dims(bias.to(tl.float32), 0)
    rel = (q_start + offs_m)[:, None] - offs_n[None, :]
    s = s * scale2 - slopes2[:, None, None] * rel.to(tl.float32)[None, :, :]
    if HAS_SB:
        s += tl.where((rel == 0)[None, :, :], sb2[:, None, None], 0.0)
    valid = (rel >= 0) & (offs_n[None, :] < Jk)
    s = tl.where(valid[None, :, :], s, float("-inf"))
    return s, rel


@triton.jit
def cem_fwd_kernel(
    q_ptr, k_ptr, qd_ptr, hn_ptr, slopes_ptr, sb_ptr, o_ptr, lse_ptr,
    s_q_b, s_q_h, s_q_m, s_q_d,
    s_k_b, s_k_h, s_k_n, s_k_d,
    s_qd_b, s_qd_h, s_qd_m, s_qd_d,
    s_hn_b, s_hn_n, s_hn_d,
    bias_ptr, s_bias_b, s_bias_m, s_bias_n,
    s_o_b, s_o_h, s_o_m, s_o_d,
    s_l_b, s_l_h, s_l_m,
    K, Jq, Jk, d, D, q_start, scale2,
    G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_DH: tl.constexpr, BLOCK_DD: tl.constexpr,
    HAS_DIAG: tl.constexpr, PER_HEAD: tl.constexpr, HAS_SB: tl.constexpr, HAS_BIAS: tl.constexpr,
    PREC: tl.constexpr, UPCAST: tl.constexpr,
):
    """One program: batch b, head group, BLOCK_M queries; loops over the causal key blocks.

    Online softmax (FlashAttention-2) on a [G, BLOCK_M, BLOCK_DH] accumulator. Each key tile is loaded
    once and used as key (score) and as value (output); the diagonal term once per tile for all heads.
    """
    # float scalars as float32: torch.compile's inductor passes Python floats as fp64, which turned the
    # loop-carried softmax statistics into fp64 and failed to compile
    scale2 = tl.cast(scale2, tl.float32)
    pid_m = tl.program_id(0)
    pid_bg = tl.program_id(1)
    n_groups = (K + G - 1) // G
    b = pid_bg // n_groups
    heads = (pid_bg % n_groups) * G + tl.arange(0, G)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_dh = tl.arange(0, BLOCK_DH)
    h_ok = heads < K

    q_ptr += b * s_q_b
    k_ptr += b * s_k_b
    qd_ptr += b * s_qd_b
    hn_ptr += b * s_hn_b
    bias_ptr += b * s_bias_b

    q = _load_heads(q_ptr, s_q_h, s_q_m, s_q_d, heads, offs_m, offs_dh, K, Jq, d)
    slopes2 = tl.load(slopes_ptr + heads, mask=h_ok, other=0.0).to(tl.float32) * LOG2E
    if HAS_SB:
        sb2 = tl.load(sb_ptr + heads, mask=h_ok, other=0.0).to(tl.float32) * LOG2E
    else:
        sb2 = slopes2

    m_i = tl.full([G, BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.full([G, BLOCK_M], 0.0, dtype=tl.float32)
    acc = tl.full([G, BLOCK_M, BLOCK_DH], 0.0, dtype=tl.float32)

    hi = tl.minimum(Jk, q_start + (pid_m + 1) * BLOCK_M)  # last key any row of the block may see, +1
    for n0 in range(0, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        kt = _load_heads(k_ptr, s_k_h, s_k_n, s_k_d, heads, offs_n, offs_dh, K, Jk, d)  # keys = values
        s2, rel = _logits2(q, kt, qd_ptr, hn_ptr, heads, offs_m, offs_n, slopes2, sb2,
                           K, Jq, Jk, D, q_start, scale2,
                           s_qd_h, s_qd_m, s_qd_d, s_hn_n, s_hn_d, bias_ptr, s_bias_m, s_bias_n,
                           G, BLOCK_M, BLOCK_N, BLOCK_DD, HAS_DIAG, PER_HEAD, HAS_SB, HAS_BIAS, PREC, UPCAST)
        # key 0 is visible to every row, so m_new is finite from the first block on
        m_new = tl.maximum(m_i, _max(s2, 2))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s2 - m_new[:, :, None])
        l_i = l_i * alpha + _sum(p, 2)
        acc = acc * alpha[:, :, None] + _bdot(p.to(kt.dtype), kt, G, PREC, UPCAST)
        m_i = m_new

    acc = acc / l_i[:, :, None]
    o_p = (o_ptr + b * s_o_b + heads[:, None, None] * s_o_h + offs_m[None, :, None] * s_o_m
           + offs_dh[None, None, :] * s_o_d)
    o_mask = h_ok[:, None, None] & (offs_m[None, :, None] < Jq) & (offs_dh[None, None, :] < d)
    tl.store(o_p, acc.to(o_ptr.dtype.element_ty), mask=o_mask)
    l_p = lse_ptr + b * s_l_b + heads[:, None] * s_l_h + offs_m[None, :] * s_l_m
    tl.store(l_p, m_i + tl.log2(l_i), mask=h_ok[:, None] & (offs_m[None, :] < Jq))


@triton.jit
def cem_bwd_dq_kernel(
    q_ptr, k_ptr, qd_ptr, hn_ptr, slopes_ptr, sb_ptr, do_ptr, lse_ptr, delta_ptr,
    dq_ptr, dqd_ptr, dsb_ptr,
    s_q_b, s_q_h, s_q_m, s_q_d,
    s_k_b, s_k_h, s_k_n, s_k_d,
    s_qd_b, s_qd_h, s_qd_m, s_qd_d,
    s_hn_b, s_hn_n, s_hn_d,
    bias_ptr, s_bias_b, s_bias_m, s_bias_n,
    s_do_b, s_do_h, s_do_m, s_do_d,
    s_l_b, s_l_h, s_l_m,
    s_dq_b, s_dq_h, s_dq_m, s_dq_d,
    s_dqd_b, s_dqd_h, s_dqd_m, s_dqd_d,
    ds_ptr, s_ds_b, s_ds_g, s_ds_m, s_ds_n,
    K, Jq, Jk, d, D, q_start, scale2, scale,
    G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_DH: tl.constexpr, BLOCK_DD: tl.constexpr,
    HAS_DIAG: tl.constexpr, PER_HEAD: tl.constexpr, HAS_SB: tl.constexpr, HAS_BIAS: tl.constexpr,
    PREC: tl.constexpr, UPCAST: tl.constexpr,
):
    """Query-side backward: dq (registers), dqd (fp32 atomics, D-wide) and d self_bias (atomics).

    Same grid and key loop as the forward; P is recomputed from the stored lse, dS = P (dP - Δ) with
    dP = dO · k (values are keys, so the same k tile gives dP and dq).
    """
    # float scalars as float32: torch.compile's inductor passes Python floats as fp64, which turned the
    # loop-carried softmax statistics into fp64 and failed to compile
    scale2 = tl.cast(scale2, tl.float32)
    scale = tl.cast(scale, tl.float32)
    pid_m = tl.program_id(0)
    pid_bg = tl.program_id(1)
    n_groups = (K + G - 1) // G
    b = pid_bg // n_groups
    heads = (pid_bg % n_groups) * G + tl.arange(0, G)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_dh = tl.arange(0, BLOCK_DH)
    offs_dd = tl.arange(0, BLOCK_DD)
    h_ok = heads < K
    row_ok = h_ok[:, None] & (offs_m[None, :] < Jq)

    q_ptr += b * s_q_b
    k_ptr += b * s_k_b
    qd_ptr += b * s_qd_b
    hn_ptr += b * s_hn_b
    bias_ptr += b * s_bias_b
    do_ptr += b * s_do_b
    dqd_ptr += b * s_dqd_b

    q = _load_heads(q_ptr, s_q_h, s_q_m, s_q_d, heads, offs_m, offs_dh, K, Jq, d)
    do = _load_heads(do_ptr, s_do_h, s_do_m, s_do_d, heads, offs_m, offs_dh, K, Jq, d)
    l_off = b * s_l_b + heads[:, None] * s_l_h + offs_m[None, :] * s_l_m
    lse2 = tl.load(lse_ptr + l_off, mask=row_ok, other=float("inf"))  # padded rows: P = 0
    delta = tl.load(delta_ptr + l_off, mask=row_ok, other=0.0)
    slopes2 = tl.load(slopes_ptr + heads, mask=h_ok, other=0.0).to(tl.float32) * LOG2E
    if HAS_SB:
        sb2 = tl.load(sb_ptr + heads, mask=h_ok, other=0.0).to(tl.float32) * LOG2E
    else:
        sb2 = slopes2

    dq = tl.full([G, BLOCK_M, BLOCK_DH], 0.0, dtype=tl.float32)
    dsb = tl.full([G], 0.0, dtype=tl.float32)
    hi = tl.minimum(Jk, q_start + (pid_m + 1) * BLOCK_M)
    for n0 in range(0, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        kt = _load_heads(k_ptr, s_k_h, s_k_n, s_k_d, heads, offs_n, offs_dh, K, Jk, d)
        s2, rel = _logits2(q, kt, qd_ptr, hn_ptr, heads, offs_m, offs_n, slopes2, sb2,
                           K, Jq, Jk, D, q_start, scale2,
                           s_qd_h, s_qd_m, s_qd_d, s_hn_n, s_hn_d, bias_ptr, s_bias_m, s_bias_n,
                           G, BLOCK_M, BLOCK_N, BLOCK_DD, HAS_DIAG, PER_HEAD, HAS_SB, HAS_BIAS, PREC, UPCAST)
        p = tl.exp2(s2 - lse2[:, :, None])
        dp = _bdot(do, tl.permute(kt, (0, 2, 1)), G, PREC, UPCAST)
        ds = p * (dp - delta[:, :, None])  # d loss / d logit
        dq += _bdot(ds.to(kt.dtype), kt, G, PREC, UPCAST)
        if HAS_SB:
            dsb += _sum(_sum(tl.where((rel == 0)[None, :, :], ds, 0.0), 2), 1)
        if HAS_DIAG:
            if PER_HEAD:
                ds_rows = tl.reshape(ds, [G * BLOCK_M, BLOCK_N])
            else:
                ds_rows = _sum(ds, 0)  # all heads share qd: sum dS over heads once
            for d0 in range(0, D, BLOCK_DD):
                dd = d0 + offs_dd
                hn = tl.load(hn_ptr + offs_n[:, None] * s_hn_n + dd[None, :] * s_hn_d,
                             mask=(offs_n[:, None] < Jk) & (dd[None, :] < D), other=0.0)
                contrib = _dot(ds_rows.to(hn.dtype), hn, PREC, UPCAST) * scale
                if PER_HEAD:
                    contrib3 = tl.reshape(contrib, [G, BLOCK_M, BLOCK_DD])
                    dqd_p = (dqd_ptr + heads[:, None, None] * s_dqd_h + offs_m[None, :, None] * s_dqd_m
                             + dd[None, None, :] * s_dqd_d)
                    msk = row_ok[:, :, None] & (dd[None, None, :] < D)
                    tl.atomic_add(dqd_p, contrib3, mask=msk, sem="relaxed")
                else:
                    dqd_p = dqd_ptr + offs_m[:, None] * s_dqd_m + dd[None, :] * s_dqd_d
                    msk = (offs_m[:, None] < Jq) & (dd[None, :] < D)
                    tl.atomic_add(dqd_p, contrib, mask=msk, sem="relaxed")
        if HAS_BIAS:  # shared diagonal as a score matrix: Σ_heads dS of the tile out; dqd, dĥ are matmuls outside
            ds_p = (ds_ptr + b * s_ds_b + (pid_bg % n_groups) * s_ds_g + offs_m[:, None] * s_ds_m
                    + offs_n[None, :] * s_ds_n)
            tl.store(ds_p, _sum(ds, 0).to(ds_ptr.dtype.element_ty), mask=(offs_m[:, None] < Jq) & (offs_n[None, :] < Jk))

    dq = dq * scale
    dq_p = (dq_ptr + b * s_dq_b + heads[:, None, None] * s_dq_h + offs_m[None, :, None] * s_dq_m
            + offs_dh[None, None, :] * s_dq_d)
    tl.store(dq_p, dq.to(dq_ptr.dtype.element_ty), mask=row_ok[:, :, None] & (offs_dh[None, None, :] < d))
    if HAS_SB:
        tl.atomic_add(dsb_ptr + heads, dsb, mask=h_ok, sem="relaxed")


@triton.jit
def cem_bwd_dk_kernel(
    q_ptr, k_ptr, qd_ptr, hn_ptr, slopes_ptr, sb_ptr, do_ptr, lse_ptr, delta_ptr,
    dk_ptr, dhn_ptr,
    s_q_b, s_q_h, s_q_m, s_q_d,
    s_k_b, s_k_h, s_k_n, s_k_d,
    s_qd_b, s_qd_h, s_qd_m, s_qd_d,
    s_hn_b, s_hn_n, s_hn_d,
    bias_ptr, s_bias_b, s_bias_m, s_bias_n,
    s_do_b, s_do_h, s_do_m, s_do_d,
    s_l_b, s_l_h, s_l_m,
    s_dk_b, s_dk_h, s_dk_n, s_dk_d,
    s_dhn_b, s_dhn_n, s_dhn_d,
    K, Jq, Jk, d, D, q_start, scale2, scale,
    G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_DH: tl.constexpr, BLOCK_DD: tl.constexpr,
    HAS_DIAG: tl.constexpr, PER_HEAD: tl.constexpr, HAS_SB: tl.constexpr, HAS_BIAS: tl.constexpr,
    PREC: tl.constexpr, UPCAST: tl.constexpr,
):
    """Key-side backward: one program per (batch, head group, BLOCK_N keys), looping over the query
    blocks that can see them. The k tile is loaded once and kept: dk gets both its key part
    (scale · dSᵀ q) and its value part (Pᵀ dO) in one [G, BLOCK_N, BLOCK_DH] accumulator. dĥ (D wide)
    is accumulated with fp32 atomics, dS summed over heads first when qd is shared.
    """
    # float scalars as float32: torch.compile's inductor passes Python floats as fp64, which turned the
    # loop-carried softmax statistics into fp64 and failed to compile
    scale2 = tl.cast(scale2, tl.float32)
    scale = tl.cast(scale, tl.float32)
    pid_n = tl.program_id(0)
    pid_bg = tl.program_id(1)
    n_groups = (K + G - 1) // G
    b = pid_bg // n_groups
    heads = (pid_bg % n_groups) * G + tl.arange(0, G)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_dh = tl.arange(0, BLOCK_DH)
    offs_dd = tl.arange(0, BLOCK_DD)
    h_ok = heads < K

    q_ptr += b * s_q_b
    k_ptr += b * s_k_b
    qd_ptr += b * s_qd_b
    hn_ptr += b * s_hn_b
    bias_ptr += b * s_bias_b
    do_ptr += b * s_do_b
    dhn_ptr += b * s_dhn_b

    kt = _load_heads(k_ptr, s_k_h, s_k_n, s_k_d, heads, offs_n, offs_dh, K, Jk, d)
    slopes2 = tl.load(slopes_ptr + heads, mask=h_ok, other=0.0).to(tl.float32) * LOG2E
    if HAS_SB:
        sb2 = tl.load(sb_ptr + heads, mask=h_ok, other=0.0).to(tl.float32) * LOG2E
    else:
        sb2 = slopes2

    dk = tl.full([G, BLOCK_N, BLOCK_DH], 0.0, dtype=tl.float32)
    # first query (relative) that sees key pid_n * BLOCK_N, rounded down to a block
    lo = tl.maximum(pid_n * BLOCK_N - q_start, 0) // BLOCK_M * BLOCK_M
    for m0 in range(lo, Jq, BLOCK_M):
        offs_m = m0 + tl.arange(0, BLOCK_M)
        row_ok = h_ok[:, None] & (offs_m[None, :] < Jq)
        q = _load_heads(q_ptr, s_q_h, s_q_m, s_q_d, heads, offs_m, offs_dh, K, Jq, d)
        do = _load_heads(do_ptr, s_do_h, s_do_m, s_do_d, heads, offs_m, offs_dh, K, Jq, d)
        l_off = b * s_l_b + heads[:, None] * s_l_h + offs_m[None, :] * s_l_m
        lse2 = tl.load(lse_ptr + l_off, mask=row_ok, other=float("inf"))
        delta = tl.load(delta_ptr + l_off, mask=row_ok, other=0.0)
        s2, rel = _logits2(q, kt, qd_ptr, hn_ptr, heads, offs_m, offs_n, slopes2, sb2,
                           K, Jq, Jk, D, q_start, scale2,
                           s_qd_h, s_qd_m, s_qd_d, s_hn_n, s_hn_d, bias_ptr, s_bias_m, s_bias_n,
                           G, BLOCK_M, BLOCK_N, BLOCK_DD, HAS_DIAG, PER_HEAD, HAS_SB, HAS_BIAS, PREC, UPCAST)
        p = tl.exp2(s2 - lse2[:, :, None])
        dp = _bdot(do, tl.permute(kt, (0, 2, 1)), G, PREC, UPCAST)
        ds = p * (dp - delta[:, :, None])
        dk += _bdot(tl.permute(p.to(do.dtype), (0, 2, 1)), do, G, PREC, UPCAST)  # as value
        dk += _bdot(tl.permute((ds * scale).to(q.dtype), (0, 2, 1)), q, G, PREC, UPCAST)  # as key
        if HAS_DIAG:
            if PER_HEAD:
                ds_cols = tl.trans(tl.reshape(ds, [G * BLOCK_M, BLOCK_N]))  # [N, G*M]
            else:
                ds_cols = tl.trans(_sum(ds, 0))  # [N, M]
            for d0 in range(0, D, BLOCK_DD):
                dd = d0 + offs_dd
                if PER_HEAD:
                    qd = _load_heads(qd_ptr, s_qd_h, s_qd_m, s_qd_d, heads, offs_m, dd, K, Jq, D)
                    qd = tl.reshape(qd, [G * BLOCK_M, BLOCK_DD])
                else:
                    qd = tl.load(qd_ptr + offs_m[:, None] * s_qd_m + dd[None, :] * s_qd_d,
                                 mask=(offs_m[:, None] < Jq) & (dd[None, :] < D), other=0.0)
                contrib = _dot(ds_cols.to(qd.dtype), qd, PREC, UPCAST) * scale
                dhn_p = dhn_ptr + offs_n[:, None] * s_dhn_n + dd[None, :] * s_dhn_d
                tl.atomic_add(dhn_p, contrib, mask=(offs_n[:, None] < Jk) & (dd[None, :] < D), sem="relaxed")

    dk_p = (dk_ptr + b * s_dk_b + heads[:, None, None] * s_dk_h + offs_n[None, :, None] * s_dk_n
            + offs_dh[None, None, :] * s_dk_d)
    dk_mask = h_ok[:, None, None] & (offs_n[None, :, None] < Jk) & (offs_dh[None, None, :] < d)
    tl.store(dk_p, dk.to(dk_ptr.dtype.element_ty), mask=dk_mask)
