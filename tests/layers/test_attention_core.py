"""The attention core's backend registry and choice: validated at build time, resolved once per device, and
the same maths on every backend."""

import pytest
import torch

from cem.layers import CEMAttention
from cem.layers import attention_core as core
from cem.layers.attention_core import Diagonal
from cem.layers.position import Positions
from cem.model import model_config


def test_unknown_backend_is_a_build_time_error():
    with pytest.raises(ValueError, match="unknown attn_backend 'trtion'.*'auto', 'eager', 'sdpa', 'flex', 'triton'"):
        model_config("tiny", "cem", attn_backend="trtion")
    with pytest.raises(ValueError, match="unknown attention backend 'trtion'.*'triton'"):
        CEMAttention(16, 2, backend="trtion")
    with pytest.raises(ValueError, match="unknown attention backend"):
        core.resolve_backend("cuda-graph", "cpu")


def test_resolution_on_cpu_and_its_cache(monkeypatch):
    monkeypatch.setattr(core, "_RESOLVED", {})
    assert CEMAttention(16, 2, kq_diag="shared").resolved_backend("cpu") == "fast"
    assert CEMAttention(16, 2, kq_diag="per_head").resolved_backend("cpu") == "fast"
    assert CEMAttention(16, 2, kq_diag="none", backend="flex").resolved_backend("cpu") == "flex"
    assert core._RESOLVED[("auto", "cpu", False)] == "fast"
    calls = []
    monkeypatch.setattr(core, "_decide", lambda *a: calls.append(a) or "sdpa")
    core.resolve_backend("auto", "cpu")
    assert calls == []  # decided once, then read from the cache


@pytest.mark.parametrize("backend", ["eager", "sdpa", "auto", "fast"])
@pytest.mark.parametrize("diag", ["shared", "head", None])
def test_backends_agree(backend, diag):
    g = torch.Generator().manual_seed(0)
    B, K, J, d, D = 2, 3, 9, 4, 12
    q, k = torch.randn(B, K, J, d, generator=g), torch.randn(B, K, J, d, generator=g)
    qd = {"shared": torch.randn(B, J, D, generator=g), "head": torch.randn(B, K, J, D, generator=g), None: None}[diag]
    hn = torch.randn(B, J, D, generator=g)
    diag = None if qd is None else Diagonal(qd, hn)
    positions = Positions("standard", K, torch.randn(K, generator=g))
    ref = torch.softmax(core.cem_logits(q, k, diag, positions), dim=-1) @ k
    out = core.cem_attention(q, k, diag, positions, backend=backend)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_the_registry_holds_every_backend_and_what_it_supports(monkeypatch):
    """The names, "auto"'s choices and the fallbacks are what they were before the registry held triton."""
    assert core.BACKENDS == ("auto", "eager", "sdpa", "flex", "triton", "fast")
    assert [n for n, b in core.IMPLEMENTATIONS.items() if not b.values] == ["triton"]
    assert [n for n, b in core.IMPLEMENTATIONS.items() if not b.has_backward("cpu")] == ["flex"]
    assert all(b.has_backward("cuda") for b in core.IMPLEMENTATIONS.values())
    monkeypatch.setattr(core, "HAS_TRITON", True)
    monkeypatch.setitem(core._TRITON_OK, "cuda", True)  # as if the CUDA self-check had passed
    assert [n for n, b in core.IMPLEMENTATIONS.items() if b.why_not("cpu") is None] == ["eager", "sdpa", "flex", "fast"]
    assert [n for n, b in core.IMPLEMENTATIONS.items() if b.why_not("cuda") is None] == ["eager", "sdpa", "flex", "triton"]
    assert core.IMPLEMENTATIONS["triton"].why_not("cpu") == "needs CUDA"
    choices = {(dev, values): core.auto_backend(dev, values) for dev in ("cpu", "cuda", "mps") for values in (False, True)}
    assert choices == {("cpu", False): "fast", ("cpu", True): "fast", ("cuda", False): "triton",
                       ("cuda", True): "sdpa", ("mps", False): "sdpa", ("mps", True): "sdpa"}  # fmt: skip
    monkeypatch.setitem(core._TRITON_OK, "cuda", False)  # the self-check failed
    assert core.auto_backend("cuda") == "sdpa"
    monkeypatch.setattr(core, "HAS_TRITON", False)
    monkeypatch.setitem(core._TRITON_OK, "cuda", True)
    assert core.auto_backend("cuda") == "sdpa"
    assert core.IMPLEMENTATIONS["triton"].why_not("cuda") == "triton is not installed (pip install triton)"
    with pytest.raises(RuntimeError, match="backend='triton' requested but triton is not installed"):
        core._decide("triton", "cuda", False)


def _fresh(g, *shape):
    return torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_(True)


@pytest.mark.parametrize("diag", ["shared", "head", None, "values"])
@pytest.mark.parametrize("q_start,n_q", [(0, 13), (0, 7), (6, 5), (11, 1)])
@pytest.mark.parametrize("block", [4, 64])
@pytest.mark.parametrize("alibi", ["standard", "app-a"])
def test_fast_path_equals_eager_in_float64(diag, q_start, n_q, block, alibi):
    """The fast CPU path (causal query blocks, cached bias, diagonal-only self bias, and without a diagonal the
    fused kernel with its custom backward) gives the eager output and every gradient, fresh random inputs."""
    g = torch.Generator().manual_seed(q_start * 100 + n_q)
    B, K, d, D = 2, 3, 4, 12
    n_k = q_start + n_q  # ragged: n_q and n_k are not multiples of the block
    q, k, hn, sb = _fresh(g, B, K, n_q, d), _fresh(g, B, K, n_k, d), _fresh(g, B, n_k, D), _fresh(g, K)
    qd = {"shared": _fresh(g, B, n_q, D), "head": _fresh(g, B, K, n_q, D), None: None, "values": _fresh(g, B, n_q, D)}[diag]
    v = _fresh(g, B, K, n_k, d + D) if diag == "values" else None
    diagonal = None if qd is None else Diagonal(qd, hn)
    positions = Positions(alibi, K, sb)
    inputs = [t for t in (q, k, qd, hn, v, sb) if t is not None]
    weights = torch.randn(B, K, n_q, v.shape[-1] if v is not None else d, generator=g, dtype=torch.float64)
    results = []
    for fn in (core.cem_attention_eager, lambda *a, **kw: core.cem_attention_fast(*a, block=block, **kw)):
        out = fn(q, k, diagonal, positions, q_start=q_start, v=v)
        grads = torch.autograd.grad((out * weights).sum(), inputs, allow_unused=True)
        results.append([out, *grads])
    for a, b in zip(*results):
        if a is None:
            assert b is None or torch.count_nonzero(b) == 0
        else:
            torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("q_start,n_q", [(0, 70), (40, 1), (30, 9)])
def test_fused_kernel_in_low_precision_is_as_close_to_float64_as_the_blocked_path(dtype, q_start, n_q):
    """bf16 / fp16 without a diagonal run the fused CPU flash kernel (also in decoding); its output and every
    gradient are as close to the float64 eager result as the eager path in the same dtype."""
    g = torch.Generator().manual_seed(n_q)
    B, K, d = 2, 3, 16
    n_k = q_start + n_q
    q, k, sb = _fresh(g, B, K, n_q, d), _fresh(g, B, K, n_k, d), _fresh(g, K)
    weights = torch.randn(B, K, n_q, d, generator=g, dtype=torch.float64)

    def run(fn, dt):
        inputs = [t.detach().to(dt).requires_grad_(True) for t in (q, k, sb)]
        out = fn(inputs[0], inputs[1], None, Positions("standard", K, inputs[2]), q_start=q_start)
        grads = torch.autograd.grad((out * weights.to(dt)).sum(), inputs)
        return [t.double() for t in (out, *grads)]

    exact = run(core.cem_attention_eager, torch.float64)
    fused = run(core.cem_attention_fast, dtype)
    plain = run(core.cem_attention_eager, dtype)
    assert core._fused_ok(q.to(dtype), None, None)
    for e, f, b in zip(exact, fused, plain):
        scale = e.abs().max()
        assert (f - e).abs().max() <= 2 * (b - e).abs().max() + 4e-3 * scale


def test_fast_path_without_diagonal_uses_the_fused_kernel(monkeypatch):
    calls = []
    original = core.FusedKeyAttention.apply
    monkeypatch.setattr(core.FusedKeyAttention, "apply", lambda *a: calls.append(1) or original(*a))
    q = k = torch.randn(1, 2, 5, 4)
    core.cem_attention_fast(q, k, None, Positions("standard", 2, torch.randn(2)))
    assert calls == [1]


def test_trainer_prints_the_backend_that_runs(tmp_path, capsys, monkeypatch):
    """The default model (shared diagonal) on CPU runs the fast path, and the trainer says so."""
    import random

    from cem.training import load_run_config, train

    monkeypatch.setenv("CEM_CACHE_DIR", str(tmp_path / "cache"))
    rng = random.Random(0)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for split, n in (("train", 400), ("valid", 100), ("test", 100)):
        (corpus / f"{split}.txt").write_text(" ".join(rng.choice(["a", "bc", "def"]) for _ in range(n)))
    cfg = load_run_config(None, ["context=16", "tensorboard=false", "device=cpu"], data=str(corpus), preset="tiny",
                          arch="cem", batch_size=2, max_steps=1, eval_batches=1)  # fmt: skip
    train(cfg, tmp_path / "run", progress=True)
    assert "CEM attention backend on cpu: fast" in capsys.readouterr().err



@pytest.mark.parametrize("arch, overrides", [("llama", {}), ("llama", {"position": "alibi"}), ("cem", {"attn_backend": "sdpa"}),
                                             ("cem", {"attn_backend": "sdpa", "kq_diag": "none"})])
def test_cached_decoding_keeps_sdpa_off_cudnn_and_the_prefill_is_untouched(monkeypatch, arch, overrides):
    """Every SDPA call after cached keys runs under `sdpa_kernel(DECODE_SDPA_BACKENDS)` (no cuDNN attention,
    which rebuilds its plan at every new key length); the prefill keeps PyTorch's own choice; the cached
    logits still equal the full forward's."""
    from contextlib import contextmanager

    from cem.model import LanguageModel

    entered = []
    real = core.sdpa_kernel

    @contextmanager
    def recording(backends):
        entered.append(list(backends))
        with real(backends):
            yield

    monkeypatch.setattr(core, "sdpa_kernel", recording)
    torch.manual_seed(0)
    model = LanguageModel(model_config("tiny", arch, vocab_size=61, **overrides)).eval()
    n_attn = model.config.n_layers
    ids = torch.randint(0, 61, (2, 9))
    with torch.no_grad():
        full = model(ids)
        cache = model.new_cache(16)
        prefill = model(ids[:, :6], cache=cache)
        assert entered == []  # the full forward and the prefill: PyTorch's own choice
        steps = [model(ids[:, t : t + 1], cache=cache) for t in range(6, 9)]
    assert len(entered) >= 3 * n_attn and all(b == core.DECODE_SDPA_BACKENDS for b in entered)
    assert core.SDPBackend.CUDNN_ATTENTION not in core.DECODE_SDPA_BACKENDS
    torch.testing.assert_close(torch.cat([prefill, *steps], dim=1), full, rtol=1e-4, atol=1e-4)
