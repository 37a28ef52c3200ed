"""`cem.training.evaluate` against a direct computation: each target's loss from the model run on the context
its window gives it, disjoint windows and sliding ones."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from cem.data import TokenSplit
from cem.model import LanguageModel, model_config
from cem.training.evaluate import evaluate


@torch.no_grad()
def _direct(model, tokens: np.ndarray, context_start) -> float:
    """Mean over t = 1 .. n-1 of -log p(x_t | x_{b(t)} .. x_{t-1}), one forward a target, in float64."""
    total = 0.0
    for t in range(1, len(tokens)):
        ids = torch.as_tensor(tokens[context_start(t) : t], dtype=torch.long)[None]
        logp = torch.log_softmax(model(ids)[0, -1].double(), -1)
        total -= float(logp[int(tokens[t])])
    return total / (len(tokens) - 1)


CASES = [("llama", 75, 12, None), ("llama", 75, 12, 5), ("llama", 40, 9, 1), ("llama", 61, 10, 10), ("cem", 45, 10, 3)]


@pytest.mark.parametrize("arch,n_tokens,seq_len,stride", CASES)
def test_the_loss_is_each_targets_loss_given_its_windows_context(arch, n_tokens, seq_len, stride):
    torch.manual_seed(0)
    model = LanguageModel(model_config("tiny", arch, vocab_size=50, context=16)).eval()
    tokens = np.random.default_rng(1).integers(0, 50, n_tokens).astype(np.uint16)
    split = TokenSplit("toy/valid", tokens, n_bytes=n_tokens)
    got = evaluate(model, split, seq_len, 4, torch.device("cpu"), stride=stride)
    if stride is None:  # the context restarts at each disjoint window: x_{L floor((t-1)/L)} .. x_{t-1}
        start = lambda t: (t - 1) // seq_len * seq_len  # noqa: E731
    else:  # the first window (starts 0, stride, ..., and the one ending at the last token) that holds t scores it
        last = n_tokens - 1 - seq_len
        starts = sorted({*range(0, last + 1, stride), last})
        start = lambda t: min(s for s in starts if s + seq_len >= t)  # noqa: E731
    assert got["tokens"] == n_tokens - 1
    assert got["loss"] == pytest.approx(_direct(model, tokens, start), rel=1e-5)
    assert got["perplexity"] == pytest.approx(math.exp(got["loss"]))
