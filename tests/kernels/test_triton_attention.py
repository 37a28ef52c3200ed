"""The fused Triton CEM attention kernel, alone and through the attention core's backend choice, against
`cem_attention_eager`.

On CPU the kernels run in Triton's interpreter (see conftest.py); where CUDA is available the same cases
also run compiled on the GPU. Inputs are fresh random tensors (never zeros), with a random nonzero self
bias, and an upstream gradient that is random too, so every gradient path is exercised.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from cem.layers import attention_core as core
from cem.layers.attention_core import Diagonal, auto_backend, cem_attention, cem_attention_eager, resolve_backend
from cem.layers.position import Positions

triton = pytest.importorskip("triton", reason="triton is not installed (pip install triton); kernel tests need it")

from cem.kernels import HAS_TRITON, KernelConfig, triton_cem_attention  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def make_inputs(B, K, Jq, Jk, d, D, diag, dtype=torch.float32, device="cpu", seed=0, self_bias=True):
    """Random inputs of the attention core (q, k, Diagonal or None, Positions); diag in {"shared", "per_head", None} (the kernel's `kq_diag_of` names; None: "none")."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype).requires_grad_(True)

    q = rnd(B, K, Jq, d)
    k = rnd(B, K, Jk, d)
    diagonal = None
    if diag is not None:
        diagonal = Diagonal(rnd(*((B, Jq, D) if diag == "shared" else (B, K, Jq, D)), scale=0.5), rnd(B, Jk, D, scale=0.5))
    sb = (torch.randn(K, generator=g) + 0.5).to(device).requires_grad_(True) if self_bias else None
    return q, k, diagonal, Positions("standard", K, sb)


def kernel(q, k, diag, positions, q_start=0, **kw):
    """`triton_cem_attention` with the core's arguments unpacked into its tensors."""
    qd, hn = (None, None) if diag is None else diag
    return triton_cem_attention(q, k, qd, hn, positions.slopes(q.device), positions.self_bias, q_start, **kw)


def tensors(inputs):
    """q, k, qd, hn, self_bias (None where absent)."""
    q, k, diag, positions = inputs
    return (q, k, *(diag or (None, None)), positions.self_bias)


def run(fn, inputs, q_start, upstream_seed=123, **kw):
    out = fn(*inputs, q_start, **kw)
    g = torch.Generator().manual_seed(upstream_seed)
    dout = torch.randn(out.shape, generator=g).to(device=out.device, dtype=out.dtype)
    grads = torch.autograd.grad(out, [t for t in tensors(inputs) if t is not None], dout)
    return out, grads


def names_of(inputs):
    return [n for n, t in zip(NAMES, tensors(inputs)) if t is not None]


def as_fp32_leaves(inputs):
    """The same values in float32, as fresh leaves (reference for the bfloat16 runs)."""
    q, k, qd, hn, sb = (t.detach().float().requires_grad_(t.requires_grad) if t is not None else None for t in tensors(inputs))
    return q, k, None if qd is None else Diagonal(qd, hn), Positions(inputs[3].kind, inputs[3].n_heads, sb)


def rel_err(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-6)).item()


NAMES = ["q", "k", "qd", "hn", "self_bias"]

# (B, K, Jq, Jk, d, D, diag, q_start)
SHAPES = [
    pytest.param(2, 3, 37, 37, 24, 72, "shared", 0, id="ragged37-shared"),
    pytest.param(2, 3, 37, 37, 24, 72, "per_head", 0, id="ragged37-perhead"),
    pytest.param(2, 3, 37, 37, 24, 72, None, 0, id="ragged37-nodiag"),
    pytest.param(1, 4, 33, 33, 16, 64, "shared", 0, id="pow2heads-shared"),
    pytest.param(1, 1, 19, 19, 8, 8, "per_head", 0, id="onehead-d8"),
    pytest.param(1, 3, 1, 41, 24, 72, "shared", 40, id="decode-Jq1-shared"),
    pytest.param(1, 3, 1, 41, 24, 72, "per_head", 40, id="decode-Jq1-perhead"),
    pytest.param(2, 3, 5, 45, 24, 72, "shared", 40, id="decode-Jq5-shared"),
    pytest.param(2, 3, 5, 45, 24, 72, "per_head", 40, id="decode-Jq5-perhead"),
    pytest.param(1, 3, 5, 21, 24, 72, None, 16, id="decode-Jq5-nodiag"),
    pytest.param(1, 2, 20, 37, 16, 32, "shared", 0, id="extra-keys-beyond-queries"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("B,K,Jq,Jk,d,D,diag,q_start", SHAPES)
def test_float32_matches_eager(device, B, K, Jq, Jk, d, D, diag, q_start):
    inputs = make_inputs(B, K, Jq, Jk, d, D, diag, device=device, seed=Jq * 7 + Jk)
    out, grads = run(kernel, inputs, q_start)
    ref, ref_grads = run(cem_attention_eager, inputs, q_start)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    for name, g, rg in zip(names_of(inputs), grads, ref_grads):
        assert torch.isfinite(g).all(), name
        assert rg.abs().max() > 0, name  # the reference gradient is not trivially zero
        torch.testing.assert_close(g, rg, atol=2e-4, rtol=2e-4, msg=lambda m, n=name: f"grad {n}: {m}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "B,K,Jq,Jk,d,D,diag,q_start",
    [
        pytest.param(2, 3, 37, 37, 24, 72, "shared", 0, id="ragged37-shared"),
        pytest.param(2, 3, 37, 37, 24, 72, "per_head", 0, id="ragged37-perhead"),
        pytest.param(1, 3, 37, 37, 24, 72, None, 0, id="ragged37-nodiag"),
        pytest.param(2, 3, 5, 45, 24, 72, "per_head", 40, id="decode-Jq5-perhead"),
    ],
)
def test_bfloat16_close_to_reference(device, B, K, Jq, Jk, d, D, diag, q_start):
    inputs = make_inputs(B, K, Jq, Jk, d, D, diag, dtype=torch.bfloat16, device=device, seed=5)
    out, grads = run(kernel, inputs, q_start)
    assert out.dtype == torch.bfloat16
    # against the exact maths on the same bf16 values (fp32 reference) ...
    ref32, ref32_grads = run(cem_attention_eager, as_fp32_leaves(inputs), q_start)
    assert rel_err(out, ref32) < 2e-2
    for name, g, rg in zip(names_of(inputs), grads, ref32_grads):
        assert g.dtype == torch.bfloat16 or name == "self_bias"
        assert torch.isfinite(g.float()).all(), name
        assert rel_err(g, rg) < 3e-2, name
    # ... and no worse than loosely against the eager bf16 path itself (which rounds its logits to bf16)
    ref16, ref16_grads = run(cem_attention_eager, inputs, q_start)
    assert rel_err(out, ref16) < 3e-2
    for name, g, rg in zip(names_of(inputs), grads, ref16_grads):
        assert rel_err(g, rg) < 5e-2, name


@pytest.mark.parametrize(
    "config",
    [
        pytest.param(KernelConfig(block_m=16, block_n=16, block_dd=16, heads_per_program=1), id="one-head-per-program"),
        pytest.param(KernelConfig(block_m=16, block_n=32, block_dd=32, heads_per_program=2), id="head-groups-of-2"),
        pytest.param(KernelConfig(block_m=32, block_n=16, block_dd=64, heads_per_program=4), id="bigger-query-block"),
        pytest.param(KernelConfig(block_m=64, block_n=64, block_dd=64), id="single-tile"),
    ],
)
@pytest.mark.slow
@pytest.mark.parametrize("diag", ["shared", "shared-in-kernel", "per_head"])
def test_tilings_and_head_groups(config, diag):
    """Head groups (diagonal tile recomputed per group, qd/ĥ gradients from several programs) and tile
    sizes other than the default all give the same result. The shared diagonal runs both ways: as a score
    matrix (its Σ_heads dS summed over head groups outside the kernels) and tile by tile over D inside them."""
    import dataclasses

    if diag == "shared-in-kernel":
        config, diag = dataclasses.replace(config, diag_scores=False), "shared"
    else:
        config = dataclasses.replace(config, diag_scores=True)
    inputs = make_inputs(2, 3, 29, 29, 24, 72, diag, seed=11)
    out, grads = run(kernel, inputs, 0, config=config)
    ref, ref_grads = run(cem_attention_eager, inputs, 0)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    for name, g, rg in zip(names_of(inputs), grads, ref_grads):
        torch.testing.assert_close(g, rg, atol=2e-4, rtol=2e-4, msg=lambda m, n=name: f"grad {n}: {m}")


def test_no_self_bias_and_partial_requires_grad():
    q, k, (qd, hn), positions = make_inputs(1, 3, 23, 23, 24, 72, "shared", seed=3, self_bias=False)
    diag = Diagonal(qd, hn.detach())  # no gradient wanted for ĥ
    out = kernel(q, k, diag, positions)
    ref = cem_attention_eager(q, k, diag, positions)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    dout = torch.randn_like(out)
    g = torch.autograd.grad(out, (q, k, qd), dout)
    rg = torch.autograd.grad(ref, (q, k, qd), dout)
    for a, b in zip(g, rg):
        torch.testing.assert_close(a, b, atol=2e-4, rtol=2e-4)


def test_non_contiguous_inputs():
    """q, k as produced by a (B, J, K, d) -> (B, K, J, d) transpose; qd as a slice of a wider tensor."""
    B, K, J, d, D = 2, 3, 21, 24, 72
    g = torch.Generator().manual_seed(9)
    q = torch.randn(B, J, K, d, generator=g).transpose(1, 2).requires_grad_(True)
    k = torch.randn(B, J, K, d, generator=g).transpose(1, 2).requires_grad_(True)
    qd_wide = torch.randn(B, J, 2 * D, generator=g)
    qd = qd_wide[..., :D].requires_grad_(True)
    hn = torch.randn(B, J, D, generator=g).requires_grad_(True)
    sb = torch.randn(K, generator=g).requires_grad_(True)
    assert not q.is_contiguous() and not qd.is_contiguous()
    inputs = (q, k, Diagonal(qd, hn), Positions("standard", K, sb))
    out, grads = run(kernel, inputs, 0)
    ref, ref_grads = run(cem_attention_eager, inputs, 0)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, atol=2e-4, rtol=2e-4)


def test_decode_matches_full_forward():
    """Cached decoding: the last rows of the full pass equal a q_start > 0 call on the same keys."""
    q, k, qd, hn, sb = (t.detach() for t in tensors(make_inputs(1, 3, 30, 30, 24, 72, "per_head", seed=21)))
    positions = Positions("standard", 3, sb)
    full = kernel(q, k, Diagonal(qd, hn), positions, 0)
    step = kernel(q[:, :, 26:], k, Diagonal(qd[:, :, 26:], hn), positions, 26)
    torch.testing.assert_close(step, full[:, :, 26:], atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- the backend choice (cem.layers.attention_core)


def test_auto_backend_choice(monkeypatch):
    monkeypatch.setattr(core, "_RESOLVED", {})
    assert auto_backend("cpu") == "cpu"  # the CPU path, for every diagonal kind
    assert auto_backend("cpu", values=True) == "cpu"
    monkeypatch.setitem(core._TRITON_OK, "cuda", True)  # as if the CUDA self-check had passed
    assert auto_backend("cuda") == ("triton" if HAS_TRITON else "sdpa")
    monkeypatch.setitem(core._TRITON_OK, "cuda", False)  # ... or failed
    assert auto_backend("cuda") == "sdpa"
    assert auto_backend("cuda", values=True) == "sdpa"
    with pytest.warns(UserWarning, match="falling back to sdpa"):
        assert resolve_backend("triton", "cuda", values=True) == "sdpa"
    with pytest.raises(ValueError, match="unknown attention backend"):
        resolve_backend("cuda-graph", "cpu")


@pytest.mark.parametrize("backend", ["sdpa", "triton", "auto", "eager"])
@pytest.mark.parametrize("diag,q_start,Jq", [("shared", 0, 37), ("per_head", 40, 5), (None, 40, 1)])
def test_dispatcher_matches_eager_with_grads(backend, diag, q_start, Jq):
    inputs = make_inputs(1, 3, Jq, q_start + Jq, 24, 72, diag, seed=2)
    out, grads = run(cem_attention, inputs, q_start, backend=backend)
    ref, ref_grads = run(cem_attention_eager, inputs, q_start)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("diag,q_start,Jq", [("shared", 0, 37), ("per_head", 40, 5), (None, 0, 37), ("shared", 40, 1)])
def test_flex_forward_matches_eager(dtype, diag, q_start, Jq):
    """FlexAttention on CPU: forward only (PyTorch has no CPU backward for it), unfused eager path."""
    inputs = make_inputs(2, 3, Jq, q_start + Jq, 24, 72, diag, dtype=dtype, seed=4)
    with torch.no_grad():
        out = cem_attention(*inputs, q_start, backend="flex")
        ref = cem_attention_eager(*as_fp32_leaves(inputs), q_start)
    assert out.dtype == dtype
    if dtype == torch.float32:
        torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    else:
        assert rel_err(out, ref) < 2e-2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlexAttention has no backward on CPU; needs CUDA")
def test_flex_grads_match_eager_cuda():
    inputs = make_inputs(2, 3, 37, 37, 24, 72, "shared", device="cuda", seed=6)
    out, grads = run(cem_attention, inputs, 0, backend="flex")
    ref, ref_grads = run(cem_attention_eager, inputs, 0)
    torch.testing.assert_close(out, ref, atol=1e-3, rtol=1e-3)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, atol=2e-3, rtol=2e-3)


@pytest.mark.slow
def test_imports_without_triton():
    """With triton unimportable, cem.kernels still imports, auto picks sdpa, and triton raises clearly."""
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import torch\n"
        "import cem.kernels as ck\n"
        "from cem.layers import attention_core as core\n"
        "from cem.layers.position import Positions\n"
        "assert not ck.HAS_TRITON\n"
        "assert core.auto_backend('cuda') == 'sdpa'\n"
        "q = torch.randn(1, 2, 5, 8); k = torch.randn(1, 2, 5, 8)\n"
        "o = core.cem_attention(q, k, None, Positions('standard', 2, torch.ones(2)))\n"
        "assert o.shape == q.shape\n"
        "try:\n"
        "    core.cem_attention(q, k, None, Positions('standard', 2), backend='triton')\n"
        "except RuntimeError as e:\n"
        "    assert 'triton' in str(e)\n"
        "else:\n"
        "    raise AssertionError('expected RuntimeError')\n"
        "print('ok')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-2000:]


@pytest.mark.slow
def test_kernels_compile_for_sm90():
    """No GPU needed: the default-tile kernels lower all the way to sm_90 machine code (catches what the
    interpreter does not check: layouts of the 3-D dots, reshapes/permutes, constexpr typing), run in a
    subprocess without TRITON_INTERPRET (set, it makes triton's own library uncompilable). The float
    arguments are typed fp64, as torch.compile's inductor passes them: on the first GPU run that made the
    loop-carried softmax statistics fp64 and the compiled CEM model failed to build."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, "-m", "cem.kernels.compile_check", "--heads", "3", "--head-dim", "24",
           "--diag", "shared", "per_head", "--scalar", "fp64"]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    if res.returncode != 0 and ("no ptxas" in res.stderr or "No module named 'triton.backends.nvidia'" in res.stderr):
        pytest.skip("this triton build cannot compile for NVIDIA targets")
    assert res.returncode == 0, res.stderr[-3000:]
    lines = [line for line in res.stdout.splitlines() if "registers=" in line]
    assert len(lines) == 9, res.stdout


@pytest.mark.slow
def test_one_head_a_program_lowers_to_wgmma_for_sm90():
    """With G = 1 the per-head products are 2-D dots (`_bdot`), which Triton lowers to Hopper's wgmma; its
    3-D (batched) dots become mma.sync, which the H100 measurement found slow at large tiles. No GPU needed."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = (
        "import warnings; warnings.filterwarnings('ignore')\n"
        "from cem.kernels.compile_check import compile_kernel\n"
        "from cem.kernels.triton_attention import KernelConfig\n"
        "for g in (1, 4):\n"
        "    cfg = KernelConfig(block_m=64, block_n=32, block_dd=64, heads_per_program=g, num_warps=4, num_stages=2)\n"
        "    for k in ('cem_fwd_kernel', 'cem_bwd_dq_kernel', 'cem_bwd_dk_kernel'):\n"
        "        print(g, k, 'wgmma' in compile_kernel(k, 'bf16', 'shared', cfg, 64, scores=True).asm['ptx'])\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    if res.returncode != 0 and ("no ptxas" in res.stderr or "No module named 'triton.backends.nvidia'" in res.stderr):
        pytest.skip("this triton build cannot compile for NVIDIA targets")
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stdout.split("\n")
    assert [line.split()[2] for line in lines if line.startswith("1 ")] == ["True"] * 3, res.stdout
    assert [line.split()[2] for line in lines if line.startswith("4 ")] == ["False"] * 3, res.stdout


def test_default_tiles_are_the_measured_ones_for_16_bit_and_the_heuristic_elsewhere(monkeypatch):
    """The H100 measurement (docs/benchmarks/kernel_tiles_h100.md) sets the 16-bit tiles of the scores and
    no-diagonal kernels at head width <= 64; fp32, the per-head diagonal and wider heads keep the register
    heuristic, whose choice must differ (a change to either rule shows here)."""
    from cem.kernels import triton_attention
    from cem.kernels import default_config

    monkeypatch.setattr(triton_attention, "uses_interpreter", lambda device: False)  # the compiled path's tiles
    cuda = torch.device("cuda")
    for dtype in (torch.bfloat16, torch.float16):
        for diag, scores in (("shared", True), ("none", False)):
            fwd = default_config(12, 64, 768, dtype, cuda, backward=False, diag=diag, scores=scores)
            bwd = default_config(12, 64, 768, dtype, cuda, backward=True, diag=diag, scores=scores)
            assert (fwd.block_m, fwd.block_n, fwd.heads_per_program, fwd.num_warps, fwd.num_stages) == (16, 16, 4, 4, 1)
            assert (bwd.block_m, bwd.block_n, bwd.heads_per_program, bwd.num_warps, bwd.num_stages) == (16, 32, 4, 4, 1)
        assert default_config(2, 64, 128, dtype, cuda, scores=True).heads_per_program == 2  # G never above the heads
    for args in ((12, 64, 768, torch.float32, "shared", True), (12, 64, 768, torch.bfloat16, "per_head", False),
                 (8, 128, 1024, torch.bfloat16, "shared", True)):
        K, d, D, dtype, diag, scores = args
        c = default_config(K, d, D, dtype, cuda, diag=diag, scores=scores)
        assert (c.heads_per_program, c.num_warps) != (4, 4) or c.block_n != 16, args


def test_triton_self_check(monkeypatch):
    """The self-check that gates "auto" passes for the real kernel and catches a broken one."""
    monkeypatch.setattr(core, "_TRITON_OK", {})
    assert core.triton_self_check("cpu")

    def broken(q, k, qd, hn, slopes, self_bias, q_start=0):
        return triton_cem_attention(q, k, qd, hn, slopes, self_bias, q_start) * 1.01

    monkeypatch.setattr(core, "_TRITON_OK", {})
    monkeypatch.setattr(core, "triton_cem_attention", broken)
    with pytest.warns(UserWarning, match="disagrees with the eager path"):
        assert not core.triton_self_check("cpu")


@pytest.mark.parametrize("context", ["inference_mode", "no_grad", "autocast"])
def test_triton_self_check_inside_callers_context(monkeypatch, context):
    """"auto" runs the self-check on first use, inside whatever the caller runs under: decoding under
    inference_mode (the check's tensors were inference tensors: "cannot be saved for backward"), no_grad, or
    bf16 autocast (the eager reference ran in bf16, the kernel in float32: "Float did not match BFloat16").
    Both broke `auto` on the first GPU run; the check is its own float32 computation with gradients."""
    monkeypatch.setattr(core, "_TRITON_OK", {})
    ctx = {"inference_mode": torch.inference_mode(), "no_grad": torch.no_grad(), "autocast": torch.autocast("cpu", dtype=torch.bfloat16)}[context]
    with ctx:
        assert core.triton_self_check("cpu")


def test_shared_diagonal_scores_only_while_they_fit(monkeypatch):
    """The shared diagonal is read as a (B, Jq, Jk) score matrix only while it (and Σ_heads dS in the
    backward) fits DIAG_SCORES_MAX_BYTES; beyond it the kernels compute it over D (O(L) memory), and both
    give the eager result."""
    from cem.kernels import triton_attention as ta

    inputs = make_inputs(1, 2, 20, 20, 16, 32, "shared", seed=5)
    q, k, diag, _ = inputs
    assert ta.KernelLaunch(q, k, diag.qd, diag.hn, 0, None, backward=True).scores
    monkeypatch.setattr(ta, "DIAG_SCORES_MAX_BYTES", 20 * 20 * 4)  # the scores fit, Σ dS per group does not
    assert ta.KernelLaunch(q, k, diag.qd, diag.hn, 0, None).scores
    assert not ta.KernelLaunch(q, k, diag.qd, diag.hn, 0, None, backward=True).scores
    out, grads = run(kernel, inputs, 0)  # forward with scores, backward over D
    ref, ref_grads = run(cem_attention_eager, inputs, 0)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    for g, rg in zip(grads, ref_grads):
        torch.testing.assert_close(g, rg, atol=2e-4, rtol=2e-4)


@pytest.mark.slow
@pytest.mark.parametrize("diag", ["shared", "per_head", None])
def test_custom_operators_pass_opcheck(diag):
    """The kernels are two torch.library custom operators (forward, backward) with fake (meta) kernels and
    autograd: `torch.library.opcheck` checks their schemas, fake kernels and autograd registration."""
    from cem.kernels import triton_attention as ta

    q, k, diagonal, positions = make_inputs(1, 2, 5, 7, 8, 6, diag)
    qd, hn = (None, None) if diagonal is None else diagonal
    args = (q, k, qd, hn, positions.slopes(q.device), positions.self_bias, 2, None)
    torch.library.opcheck(ta._attention_fwd, args)
    o, lse = ta._attention_fwd(*args)
    do = torch.randn_like(o)
    plain = [t.detach() if t is not None else None for t in (q, k, qd, hn)]
    torch.library.opcheck(ta._attention_bwd, (do, *plain, args[4], positions.self_bias.detach(), o.detach(), lse.detach(), 2,
                                              ta._config_key(KernelConfig(block_m=16, block_n=16)), qd is not None, qd is not None, True))


@pytest.mark.slow
def test_a_compiled_model_is_one_graph_and_equals_eager():
    """torch.compile of a CEM model on the triton backend traces it as one graph (the kernels are opaque
    custom operators; the kernel-module lookup used to break the graph) and gives the eager loss and
    gradients (here through the interpreter on the CPU)."""
    from cem.model import LanguageModel, model_config

    torch._dynamo.reset()
    cfg = model_config("micro", "cem", vocab_size=32, attn_backend="triton", kq_diag="shared", context=32)
    model = LanguageModel(cfg, init_seed=0)
    with torch.no_grad():  # a nonzero diagonal (it starts at 0), so its term and gradient are exercised
        for block in model.blocks:
            block.attn.kq_diag.normal_(0, 0.3, generator=torch.Generator().manual_seed(1))
    ids = torch.randint(0, 32, (2, 16), generator=torch.Generator().manual_seed(0))
    explained = torch._dynamo.explain(model)(ids, ids)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    compiled = torch.compile(model)
    loss = compiled(ids, ids)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    eager = model(ids, ids)
    eager.backward()
    torch.testing.assert_close(loss, eager, rtol=1e-5, atol=1e-6)
    for a, p in zip(grads, model.parameters()):
        torch.testing.assert_close(a, p.grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("diag", ["shared", None])
def test_eager_calls_skip_the_operator_wrappers(diag):
    """Eager calls run the operators' implementations under a plain autograd Function (the custom-operator
    wrappers cost tens of microseconds of Python a call on a GPU step); torch.compile sees the operators. Both
    run the same code: the same output and gradients, bit for bit; the eager path never dispatches `cem::`."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from cem.kernels import triton_attention as ta

    class Names(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.add(func.namespace)
            return func(*args, **(kwargs or {}))

    q, k, diagonal, positions = make_inputs(1, 2, 9, 9, 8, 6, diag)
    qd, hn = (None, None) if diagonal is None else diagonal
    inputs = [t for t in (q, k, qd, hn, positions.self_bias) if t is not None]
    args = (q, k, qd, hn, core.kernel_slopes(positions, q.device), positions.self_bias, 0, None)
    seen: set = set()
    with Names():
        eager = ta._TritonAttention.apply(*args)
        eager_grads = torch.autograd.grad(eager.square().sum(), inputs)
    op = ta._attention_fwd(*args)[0]
    assert "cem" not in seen and "aten" in seen
    assert torch.equal(eager, op)
    assert all(torch.equal(a, b) for a, b in zip(eager_grads, torch.autograd.grad(op.square().sum(), inputs)))


def test_per_call_constants_are_cached():
    """The kernel's slopes (float32, on the device) and tile choice are decided once, not in every call."""
    from cem.kernels import triton_attention as ta

    positions = Positions("standard", 3)
    slopes = core.kernel_slopes(positions, torch.device("cpu"))
    assert slopes is core.kernel_slopes(Positions("standard", 3), torch.device("cpu"))
    assert torch.equal(slopes, positions.slopes().float()) and slopes.dtype == torch.float32
    before = ta._config.cache_info().hits
    ta.default_config(3, 8, 24, torch.float32, torch.device("cpu"))
    ta.default_config(3, 8, 24, torch.float32, torch.device("cpu"))
    assert ta._config.cache_info().hits > before
