"""`cem.layers.sdpa`: every SDPA call of cem, kept off cuDNN attention in cached decoding."""

from contextlib import contextmanager

import pytest
import torch
from torch.nn.attention import SDPBackend

from cem.layers import sdpa as sdpa_module
from cem.layers.sdpa import DECODE_SDPA_BACKENDS
from cem.model import LanguageModel, model_config


@pytest.mark.parametrize("arch, overrides", [("llama", {}), ("llama", {"position": "alibi"}), ("cem", {"attn_backend": "sdpa"}),
                                             ("cem", {"attn_backend": "sdpa", "kq_diag": "none"})])
def test_cached_decoding_keeps_sdpa_off_cudnn_and_the_prefill_is_untouched(monkeypatch, arch, overrides):
    """Every SDPA call after cached keys runs under `sdpa_kernel(DECODE_SDPA_BACKENDS)` (no cuDNN attention,
    which rebuilds its plan at every new key length); the prefill keeps PyTorch's own choice; the cached
    logits still equal the full forward's."""
    entered = []
    real = sdpa_module.sdpa_kernel

    @contextmanager
    def recording(backends):
        entered.append(list(backends))
        with real(backends):
            yield

    monkeypatch.setattr(sdpa_module, "sdpa_kernel", recording)
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
    assert len(entered) >= 3 * n_attn and all(b == DECODE_SDPA_BACKENDS for b in entered)
    assert SDPBackend.CUDNN_ATTENTION not in DECODE_SDPA_BACKENDS
    torch.testing.assert_close(torch.cat([prefill, *steps], dim=1), full, rtol=1e-4, atol=1e-4)
