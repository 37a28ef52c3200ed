"""A run's training budget (paper §4): tokens per optimiser step, the tokens asked for and the optimiser
steps they take, worked out once per run (`Budget`); the text an hf: corpus streams for it; the default of
`cem train`."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..data import parse_corpus
from ..model import ModelConfig
from ..model.params import chinchilla_tokens
from .config import RunConfig, TrainConfig

DEFAULT_STEPS = 600  # `cem train`'s budget when neither max_steps nor tokens is given: minutes on a 2-core CPU
HF_BYTES_PER_TOKEN = 4  # text bytes streamed per training token of an hf: corpus (BPE: about 4 bytes a token)


@dataclass(frozen=True)
class Budget:
    """What a run trains for: tokens per optimiser step, the tokens asked for, and the steps."""

    tokens_per_step: int  # batch_size x grad_accum x processes x seq_len
    tokens: int  # max_steps steps' worth, a number, or the Chinchilla budget
    steps: int

    @classmethod
    def of(cls, t: TrainConfig, cfg: ModelConfig, seq_len: int, world_size: int = 1) -> Budget:
        """`max_steps` steps, else enough steps for `tokens`: a number, or `chinchilla`, 20 tokens per
        parameter of the matching Llama baseline with `cfg`'s vocabulary and context (paper §4)."""
        per_step = t.batch_size * t.grad_accum * world_size * seq_len
        if t.max_steps is not None:
            return cls(per_step, t.max_steps * per_step, t.max_steps)
        if t.tokens is None:
            raise ValueError("no training budget: give max_steps or tokens (a number or 'chinchilla')")
        if str(t.tokens).lower() == "chinchilla":
            tokens = chinchilla_tokens(t.preset, cfg.vocab_size, cfg.context)
        else:
            try:
                tokens = int(float(t.tokens))
            except ValueError:
                raise ValueError(f"tokens must be a number or 'chinchilla', got {t.tokens!r}") from None
        return cls(per_step, tokens, max(1, math.ceil(tokens / per_step)))

    @property
    def trained_tokens(self) -> int:
        """Tokens the steps train on (the last step may pass `tokens`)."""
        return self.steps * self.tokens_per_step


def with_default_steps(t: TrainConfig) -> None:
    """Give a config without a budget (neither max_steps nor tokens) DEFAULT_STEPS optimiser steps."""
    if t.max_steps is None and t.tokens is None:
        t.max_steps = DEFAULT_STEPS


def hf_bytes_for_budget(run: RunConfig, world_size: int = 1) -> int | None:
    """`hf_max_bytes`, else enough text for the training budget (HF_BYTES_PER_TOKEN per token, one epoch);
    None (no limit) for corpora other than hf: and without a budget. Worked out before the tokenizer is
    loaded, with `RunConfig.vocab_hint`."""
    t = run.train
    if not parse_corpus(t.data).is_hf or t.hf_max_bytes is not None:
        return t.hf_max_bytes
    if t.max_steps is None and t.tokens is None:
        return None
    cfg = run.model()
    return HF_BYTES_PER_TOKEN * Budget.of(t, cfg, t.seq_len or cfg.context, world_size).tokens
