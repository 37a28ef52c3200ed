"""Evaluation: mean next-token loss over a split, perplexity and bits per byte."""

from __future__ import annotations

import contextlib
import math
import sys

import torch
from tqdm import tqdm

from ..data import TokenSplit, eval_batch_count, iter_eval_batches
from ..data.loader import IGNORE


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,  # a LanguageModel, or it wrapped (DDP, FSDP, torch.compile)
    split: TokenSplit,
    seq_len: int,
    batch_size: int,
    device: torch.device,
    max_batches: int | None = None,
    autocast: contextlib.AbstractContextManager | None = None,
    progress: bool = False,
    desc: str = "evaluating",
    stride: int | None = None,
) -> dict:
    """Loss (nats/token), perplexity exp(loss) and bits per byte = loss · tokens / (bytes · ln 2).

    The bytes of the evaluated tokens are the split's bytes per token times the tokens evaluated, so bits
    per byte compare across tokenizers (exact when the whole split is evaluated). `progress` shows a bar
    on stderr. `stride` < `seq_len` scores every token with at least `seq_len - stride` tokens of context (sliding
    windows, `cem.data.iter_eval_batches`); without it the windows are disjoint, the context reset at each start.
    """
    if max_batches is not None and max_batches < 1:
        raise ValueError(f"max_batches must be >= 1 (or None for the whole split), got {max_batches}")
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    n_batches = eval_batch_count(split.n_tokens, seq_len, batch_size, stride)
    n_batches = n_batches if max_batches is None else min(max_batches, n_batches)
    batches = iter_eval_batches(split.tokens, seq_len, batch_size, max_batches=max_batches, stride=stride)
    for x, y in tqdm(batches, total=n_batches, desc=desc, unit="batch", disable=not progress, file=sys.stderr, leave=False, delay=1.0):
        x, y = x.to(device), y.to(device)
        with autocast or contextlib.nullcontext():
            total += model(x, y, reduction="sum").item()
        count += int((y != IGNORE).sum())
    model.train(was_training)
    if count == 0:
        raise ValueError(f"split {split.name!r} has {split.n_tokens} tokens, fewer than one sequence of {seq_len + 1}")
    loss = total / count
    bytes_evaluated = split.n_bytes * count / split.n_tokens
    return {
        "loss": loss,
        "perplexity": math.exp(min(loss, 700)),
        "bits_per_byte": loss * count / (bytes_evaluated * math.log(2)),
        "tokens": count,
    }
