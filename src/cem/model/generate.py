"""Incremental decoding with the cache: prefill the prompt once, then one token per forward pass."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..inductor import compiled
from ..layers.steps import Inference
from .cache import StaticCache

MAX_NEW_TOKENS = 1 << 24  # one call's output is held in memory: a bound on what a caller may ask for


def sample_next(
    logits: Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """One token id per row of `logits` (B, vocab): greedy at temperature 0, else top-k / nucleus sampling."""
    if not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature}")
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float()
    # shifted so the largest logit is 0: a tiny temperature sends the others to -inf, never to NaN
    logits = (logits - logits.amax(dim=-1, keepdim=True)) / temperature
    if top_k is not None:
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise ValueError(f"top_k must be an integer >= 1, got {top_k!r}")
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None:
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        probs = torch.softmax(sorted_logits, dim=-1)
        drop = probs.cumsum(-1) - probs > top_p  # keep the smallest prefix whose mass reaches top_p
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def static_step(model, ids: Tensor, cache: StaticCache) -> Tensor:
    """Logits (B, vocab) after the last of `ids` (B, J) fed on top of a `StaticCache`: the model's forward
    without its host-side checks and counters, so that a compiled step reads no host value that changes (no
    recompilation from step to step); the caller advances the cache."""
    h = model.embed(ids)
    for i, block in enumerate(model.blocks):
        h = block(h, cache=cache.slot(f"blocks.{i}.attn"))
    return model.head(model.norm(h[:, -1:]))[:, -1]


_COMPILED: dict[str, object] = {}


def compiled_step(device: torch.device):
    """`static_step` compiled once per device type: mode "reduce-overhead" (CUDA graphs) on a GPU, the
    default inductor mode on the CPU; one static-shape graph (fullgraph, dynamic=False)."""
    mode = "reduce-overhead" if device.type == "cuda" else "default"
    if mode not in _COMPILED:
        _COMPILED[mode] = compiled(static_step, mode=mode, fullgraph=True, dynamic=False)
    return _COMPILED[mode]


@torch.no_grad()
def generate(
    model,
    prompt_ids: Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    *,
    generator: torch.Generator | None = None,
    inference: Inference = Inference(),
    static: bool = False,
    compile: bool = False,
    eos_id: int | None = None,
) -> Tensor:
    """Prompt (B, J) or (J,) followed by `max_new_tokens` sampled ids (fewer with `eos_id`: sampling stops once
    every row has sampled it; a row that sampled it earlier goes on, so a caller cuts each row after its first
    `eos_id`), with `inference`'s test-time settings for this call only (`Inference(steps=3)`: the recursion T of
    every CEM layer, the test-time compute knob; `adaptive_tol`, `adaptive_rule`, `guard`; None keeps the model's):
    `LanguageModel.test_time`.

    Past the context the model sees a window: the prompt is cropped to its last `context` tokens, and when
    the cache is full it is rebuilt from the last `context - context // 4` tokens (one prefill every
    `context // 4` new tokens). Every architecture runs like this: RoPE models never see positions past
    the trained ones, and ALiBi / CEM models, whose biases depend only on distances, see a window of the
    most recent tokens. Within the context the output is unchanged (one cache, filled token by token).

    `static=True` decodes with a `StaticCache` (fixed shapes, keys past the position masked; the same tokens
    up to float rounding, exactly at temperature 0 in float64 tests); `compile=True` (implies static) runs
    each decoding step through `compiled_step` (CUDA graphs on a GPU), for fixed steps only (no adaptive_tol
    or guard)."""
    if not isinstance(prompt_ids, Tensor) or prompt_ids.dim() not in (1, 2):
        raise ValueError(f"the prompt must be a tensor of token ids, shape (J,) or (B, J); got {type(prompt_ids).__name__}"
                         + (f" of shape {tuple(prompt_ids.shape)}" if isinstance(prompt_ids, Tensor) else ""))
    squeeze = prompt_ids.dim() == 1
    ids = prompt_ids.unsqueeze(0) if squeeze else prompt_ids
    context = model.config.context
    model.check_ids(ids[:, -context:])
    ids = ids.long()  # the output holds the prompt and int64 samples (a uint16 prompt cannot be promoted)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or not 0 <= max_new_tokens <= MAX_NEW_TOKENS:
        raise ValueError(f"max_new_tokens must be an integer in [0, {MAX_NEW_TOKENS:,}], got {max_new_tokens!r}")
    keep = max(1, context - context // 4)
    with model.test_time(inference):
        was_training = model.training
        model.eval()
        try:
            window = ids[:, -context:]
            total = window.shape[1] + max_new_tokens - 1  # the last sampled token is never fed back
            static = static or compile
            if compile and any(m.adaptive_tol is not None or m.guard for m in model.descent_layers()):
                raise ValueError("compile=True decodes with fixed steps: turn adaptive_tol and guard off")
            step = compiled_step(ids.device) if compile else static_step

            def prefill(tokens: Tensor, max_len: int):
                cache = StaticCache(max_len, tokens.device) if static else model.new_cache(max_len)
                logits = model(tokens, cache=cache, last_only=True)[:, -1]
                if static:
                    cache.advance(tokens.shape[1])
                return cache, logits

            cache, logits = prefill(window, min(max(total, window.shape[1]), context))
            out = [ids]
            ended = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)  # rows that sampled eos_id
            for i in range(max_new_tokens):
                nxt = sample_next(logits, temperature, top_k, top_p, generator).unsqueeze(-1)
                out.append(nxt)
                if eos_id is not None:
                    ended |= nxt[:, 0] == eos_id
                if i == max_new_tokens - 1 or (eos_id is not None and bool(ended.all())):
                    break
                if cache.length >= cache.max_len:  # full: rebuild the cache from the most recent tokens
                    cache, logits = prefill(torch.cat(out, dim=1)[:, -keep:], context)
                elif static:
                    logits = step(model, nxt, cache).clone()  # a CUDA graph's output is overwritten by its next replay
                    cache.advance(1)
                else:
                    logits = model(nxt, cache=cache)[:, -1]
        finally:
            model.train(was_training)
    result = torch.cat(out, dim=1)
    return result.squeeze(0) if squeeze else result
