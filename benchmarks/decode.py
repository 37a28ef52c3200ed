"""Decoding with the cache: cache bytes per token and single-token decode speed for Llama (keys and
values cached) against CEM (keys only; with a key-query diagonal the normalised context ĥ only, read once
per step by queries moved to ĥ's space), after a prefill of L tokens; ratios to Llama at the same context.

    python benchmarks/decode.py [--device auto|cpu|cuda] [--out FILE.md] [--preset 134M]
        [--contexts 2048 8192 32768] [--steps N] [--warmup N] [--batch 1] [--dtype auto|fp32|bf16|fp16]
        [--prefill-chunk 2048] [--threads N] [--timer cpu|wall]

For each context L every model prefills a random prompt of L tokens into a fresh cache (in chunks of
--prefill-chunk tokens, which bounds prefill memory and does not change the cache), then decodes: each
timed step feeds one token per sequence through the whole model with the cache (logits included). The
models are stepped round-robin, one token each per round; tokens/s = batch / median step time, and the
ratio to Llama is paired per round (median [min-max]).

With `--fill tile` only the first --prefill-chunk tokens are prefilled and every cache buffer is then
filled up to L by repeating them (`tile_cache`): a decode step does the same work whatever the cached
values are, so this measures the step at L without the prefill's O(L²) time (hours at 32k on one CPU
thread); the cache has the same shape and bytes.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make `benchmarks.common` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from benchmarks.common import (
    Candidate, Report, Table, describe_error, dtype_name, fmt, fmt_paired, free_memory, interleaved, paired, parser, pick_dtype, ratio, setup,
)  # fmt: skip
from cem.model import LanguageModel, model_config

GPU_PRESET, CPU_PRESET = "134M", "small"
GPU_CONTEXTS = (2048, 8192, 32768)
CPU_CONTEXTS = (512, 1024, 2048)
LLAMA = "Llama"
MODELS = {  # name -> (arch, overrides)
    LLAMA: ("llama", {}),
    "CEM kq=none": ("cem", {"kq_diag": "none"}),
    "CEM kq=shared": ("cem", {"kq_diag": "shared"}),
    "CEM kq=per_head": ("cem", {"kq_diag": "per_head"}),
    "CEM T=2 kq=shared": ("cem", {"kq_diag": "shared", "attn_steps": 2, "mlp_steps": 2}),
    "cem-t2": ("cem-t2", {}),
}
COLUMNS = [
    "model", "context", "batch", "cache B/token", "cache MiB", "ms/token", "tokens/s", "mem ×Llama", "tok/s ×Llama [min-max]", "note",
]  # fmt: skip


@torch.inference_mode()
def prefill(model: LanguageModel, prompt: torch.Tensor, max_len: int, chunk: int):
    cache = model.new_cache(max_len)
    for start in range(0, prompt.shape[1], chunk):
        model(prompt[:, start : start + chunk], cache=cache)
    return cache


@torch.inference_mode()
def tile_cache(cache, context: int) -> None:
    """Fill every buffer of `cache` up to `context` positions by repeating its first `cache.length` ones."""
    n = cache.length
    for top in cache._slots.values():
        for slot in top.slots():
            for buf in slot.buffers.values():
                for start in range(n, context, n):
                    stop = min(context, start + n)
                    buf[..., start:stop, :] = buf[..., : stop - start, :]
            slot.length = context


def decode_step(model: LanguageModel, token: torch.Tensor, cache):
    def step():
        with torch.inference_mode():
            return model(token, cache=cache)

    return step


def bench_context(args, device, models: dict[str, LanguageModel], context: int) -> list[list[object]]:
    g = torch.Generator().manual_seed(args.seed)
    vocab = next(iter(models.values())).config.vocab_size
    prompt = torch.randint(0, vocab, (args.batch, context), generator=g).to(device)
    token = torch.randint(0, vocab, (args.batch, 1), generator=g).to(device)
    max_len = context + args.warmup + args.repeats
    caches, notes, cands = {}, {}, {}
    print(f"context {context}: prefill", file=sys.stderr)
    tiled = args.fill == "tile" and context > args.prefill_chunk
    for name, model in models.items():
        try:
            if tiled:
                caches[name] = prefill(model, prompt[:, : args.prefill_chunk], max_len, args.prefill_chunk)
                tile_cache(caches[name], context)
            else:
                caches[name] = prefill(model, prompt, max_len, args.prefill_chunk)
        except Exception as exc:  # noqa: BLE001 - e.g. out of memory at a long context
            notes[name] = f"prefill: {describe_error(exc)}"
            free_memory(device)
            continue
        cands[name] = Candidate(decode_step(model, token, caches[name]))
    timings = interleaved(cands, device, repeats=args.repeats, warmup=args.warmup)

    ref_bpt = caches[LLAMA].bytes_per_token() if LLAMA in caches else None
    rows = []
    for name in models:
        t = timings.get(name)
        ms = t.median if t else None
        bpt = caches[name].bytes_per_token() if name in caches else None
        mib = bpt * context * args.batch / 2**20 if bpt is not None else None
        tok_s = args.batch * 1e3 / ms if ms else None
        note = notes.get(name) or (t.error if t and t.error else "")
        speed = fmt_paired(paired(t, timings.get(LLAMA), invert=True))
        rows.append([name, context, args.batch, fmt(bpt, ","), fmt(mib, ".4g"), fmt(ms, ".3f"), fmt(tok_s, ",.1f"), ratio(bpt, ref_bpt), speed, note])
    del caches, cands
    free_memory(device)
    return rows


def main(argv: list[str] | None = None) -> Report:
    p = parser(__doc__.split("\n\n")[0], ("--steps", "--repeats"), "timed decode steps per model and context (median reported)")
    p.add_argument("--preset", default=None, help=f"model size preset (GPU {GPU_PRESET}, CPU {CPU_PRESET}); its context is raised to fit")
    p.add_argument("--contexts", type=int, nargs="+", default=None, help=f"prompt lengths L (GPU {GPU_CONTEXTS}, CPU {CPU_CONTEXTS})")
    p.add_argument("--batch", type=int, default=1, help="sequences decoded together")
    p.add_argument("--dtype", default="auto", choices=["auto", "fp32", "bf16", "fp16"], help="model and cache dtype (auto: bf16 on GPU, fp32 on CPU)")
    p.add_argument("--prefill-chunk", type=int, default=2048, help="prefill the prompt this many tokens at a time")
    p.add_argument("--fill", default="prefill", choices=["prefill", "tile"],
                   help="prefill: the whole prompt; tile: one chunk, the rest of the cache repeats it (same step cost, no O(L²) prefill)")
    args = p.parse_args(argv)
    device = setup(args, repeats=(200, 200), warmup=(10, 10))
    gpu = device.type == "cuda"
    dtype = pick_dtype(args.dtype, device)
    preset = args.preset or (GPU_PRESET if gpu else CPU_PRESET)
    contexts = args.contexts or list(GPU_CONTEXTS if gpu else CPU_CONTEXTS)
    if args.batch < 1 or args.prefill_chunk < 1 or min(contexts) < 1:
        raise SystemExit("--batch, --prefill-chunk and --contexts must be >= 1")
    fit = max(contexts) + args.warmup + args.repeats

    models = {}
    for name, (arch, overrides) in MODELS.items():
        cfg = model_config(preset, arch, **overrides)
        cfg = cfg.replace(context=max(cfg.context, fit))  # room for the prompt and the decoded tokens
        torch.manual_seed(args.seed)
        models[name] = LanguageModel(cfg).to(device, dtype).eval()

    table = Table(COLUMNS)
    for context in contexts:
        for row in bench_context(args, device, models, context):
            table.add(*row)
    report = Report(
        f"Decoding with the cache: CEM vs Llama (preset {preset})",
        device,
        settings={"dtype": dtype_name(dtype), "batch": args.batch, "decode steps": args.repeats, "warm-up steps": args.warmup,
                  "cache fill": "prefill" if args.fill == "prefill" else f"tile (prefill {args.prefill_chunk} tokens, repeated up to the context)",
                  "timer": args.timer if device.type == "cpu" else "CUDA events", "threads": torch.get_num_threads()},  # fmt: skip
        tables=[("", table)],
        notes=[
            "cache B/token: Cache.bytes_per_token() after the prefill (per sequence, all layers); cache MiB: that × context × batch.",
            "ms/token: median time of one decode step (one new token per sequence; on the CPU process CPU time, one thread "
            "unless --threads) over the steps after a prefill of `context` tokens, all models stepped round-robin; "
            "tokens/s = batch / ms. tok/s ×Llama: per round, Llama's step time / the model's, median [min-max].",
            "Llama caches keys and values; CEM caches keys only, or with a key-query diagonal ĥ only (the same bytes): "
            "a decode step reads it once, head k's logit being ĥ_j·(W_K^kᵀ q^k + d_k∘u) (CEMAttention.query_side).",
        ],
    )
    report.emit(args.out)
    return report


if __name__ == "__main__":
    main()
