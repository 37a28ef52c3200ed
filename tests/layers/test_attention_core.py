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


def test_the_old_name_fast_is_the_cpu_backend_with_a_note(monkeypatch):
    """`fast`, the CPU path's old name, is accepted everywhere a backend is named, with one FutureWarning, and runs "cpu"."""
    monkeypatch.setattr(core, "_RESOLVED", {})
    assert "fast" not in core.BACKENDS and core.RENAMED == {"fast": "cpu"}
    with pytest.warns(FutureWarning, match="attention backend 'fast' is now called 'cpu'"):
        layer = CEMAttention(16, 2, backend="fast")
    assert layer.resolved_backend("cpu") == "cpu"
    with pytest.warns(FutureWarning, match="attn_backend 'fast' is now called 'cpu'"):
        assert model_config("tiny", "cem", attn_backend="fast").attn.backend == "cpu"
    assert core.resolve_backend("fast", "cpu") == "cpu"


def test_resolution_on_cpu_and_its_cache(monkeypatch):
    monkeypatch.setattr(core, "_RESOLVED", {})
    assert CEMAttention(16, 2, kq_diag="shared").resolved_backend("cpu") == "cpu"
    assert CEMAttention(16, 2, kq_diag="per_head").resolved_backend("cpu") == "cpu"
    assert CEMAttention(16, 2, kq_diag="none", backend="flex").resolved_backend("cpu") == "flex"
    assert core._RESOLVED[("auto", "cpu", False)] == "cpu"
    calls = []
    monkeypatch.setattr(core, "_decide", lambda *a: calls.append(a) or "sdpa")
    core.resolve_backend("auto", "cpu")
    assert calls == []  # decided once, then read from the cache


@pytest.mark.parametrize("backend", ["eager", "sdpa", "auto", "cpu"])
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
    assert core.BACKENDS == ("auto", "eager", "sdpa", "flex", "triton", "cpu")
    assert [n for n, b in core.IMPLEMENTATIONS.items() if b.reads == "context"] == ["query_side", "query_side_cpu"]
    assert [n for n, b in core.IMPLEMENTATIONS.items() if not b.values] == ["triton"]
    assert [n for n, b in core.IMPLEMENTATIONS.items() if not b.has_backward("cpu")] == ["flex"]
    assert all(b.has_backward("cuda") for b in core.IMPLEMENTATIONS.values())
    monkeypatch.setattr(core, "HAS_TRITON", True)
    monkeypatch.setitem(core._TRITON_OK, "cuda", True)  # as if the CUDA self-check had passed
    assert [n for n, b in core.IMPLEMENTATIONS.items() if b.why_not("cpu") is None] == ["eager", "sdpa", "flex", "cpu", "query_side", "query_side_cpu"]
    assert [n for n, b in core.IMPLEMENTATIONS.items() if b.why_not("cuda") is None] == ["eager", "sdpa", "flex", "triton", "query_side"]
    assert core.IMPLEMENTATIONS["query_side_cpu"].why_not("cpu", torch.float32) == "needs bfloat16"
    assert core.IMPLEMENTATIONS["triton"].why_not("cpu") == "needs CUDA"
    choices = {(dev, values): core.auto_backend(dev, values) for dev in ("cpu", "cuda", "mps") for values in (False, True)}
    assert choices == {("cpu", False): "cpu", ("cpu", True): "cpu", ("cuda", False): "triton",
                       ("cuda", True): "sdpa", ("mps", False): "sdpa", ("mps", True): "sdpa"}  # fmt: skip
    monkeypatch.setitem(core._TRITON_OK, "cuda", False)  # the self-check failed
    assert core.auto_backend("cuda") == "sdpa"
    monkeypatch.setattr(core, "HAS_TRITON", False)
    monkeypatch.setitem(core._TRITON_OK, "cuda", True)
    assert core.auto_backend("cuda") == "sdpa"
    assert core.IMPLEMENTATIONS["triton"].why_not("cuda") == "triton is not installed (pip install triton)"
    with pytest.raises(RuntimeError, match="backend='triton' requested but triton is not installed"):
        core._decide("triton", "cuda", False)


def test_trainer_prints_the_backend_that_runs(tmp_path, capsys, monkeypatch):
    """The default model (shared diagonal) on CPU runs the CPU path, and the trainer says so."""
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
    assert "CEM attention backend on cpu: cpu" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["query_side", "query_side_cpu"])
@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("q_start", [0, 5])
def test_query_side_forms_equal_the_eager_path_in_float64(name, per_head, q_start):
    """Every implementation that reads the context ĥ and W_K gives the eager path's o^k (keys k = W_K ĥ) and Σ_j p_kj ĥ_j
    (values ĥ), and `query_side_energy` its energy, in float64; `cem_query_side` runs the one meant for the dtype."""
    g = torch.Generator().manual_seed(0)
    B, K, J, d = 2, 3, 2, 4
    D = K * d
    q, w_k, hn = (torch.randn(*shape, generator=g, dtype=torch.float64) for shape in ((B, K, J, d), (D, D), (B, q_start + J, D)))
    qd = torch.randn(*((B, K, J, D) if per_head else (B, J, D)), generator=g, dtype=torch.float64)
    positions = Positions("standard", K, torch.randn(K, generator=g, dtype=torch.float64))
    diag = Diagonal(qd, hn)
    k = (hn @ w_k.T).view(B, -1, K, d).transpose(1, 2)
    o_ref = core.cem_attention_eager(q, k, diag, positions, q_start)
    hn_ref = core.cem_attention_eager(q, k, diag, positions, q_start, v=hn.unsqueeze(1).expand(-1, K, -1, -1))
    o, o_hn = core.IMPLEMENTATIONS[name].run(q, w_k, diag, positions, q_start)
    torch.testing.assert_close(o, o_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(o_hn, hn_ref, rtol=1e-12, atol=1e-12)
    *outs, energy = core.query_side_energy(q, w_k, diag, positions, q_start)
    torch.testing.assert_close(energy, core.cem_attention_energy(q, k, diag, positions, q_start)[1], rtol=1e-12, atol=1e-12)
    assert all(torch.allclose(a, b, rtol=1e-12, atol=1e-12) for a, b in zip(outs, (o_ref, hn_ref)))


def test_the_query_side_on_the_cpu_in_bf16_is_its_cpu_form(monkeypatch):
    """The CPU-bf16 choice is the registry's: `cem_query_side` runs "query_side_cpu" for bf16 on the CPU only."""
    ran = []
    for name in core.QUERY_SIDE:
        impl = core.IMPLEMENTATIONS[name]
        monkeypatch.setitem(core.IMPLEMENTATIONS, name, core.Backend(lambda *a, name=name: ran.append(name) or (None, None),
                                                                       devices=impl.devices, dtypes=impl.dtypes, reads=impl.reads))
    for dtype in (torch.bfloat16, torch.float32, torch.float64):
        core.cem_query_side(torch.zeros(1, 2, 1, 4, dtype=dtype), None, None, None)
    assert ran == ["query_side_cpu", "query_side", "query_side"]
