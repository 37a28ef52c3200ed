"""Decoding with the cache: cache bytes per token and single-token decode speed for Llama (keys and
values cached) against CEM (keys only; with a key-query diagonal the normalised context ĥ only, read once
per step by queries moved to ĥ's space), after a prefill of L tokens; ratios to Llama at the same context.

    python benchmarks/decode.py [--device auto|cpu|cuda] [--out FILE.md] [--preset 134M]
        [--contexts 2048 8192 32768] [--steps N] [--warmup N] [--batch 1] [--dtype auto|fp32|bf16|fp16 ...]
        [--modes eager static compiled] [--models NAME ...] [--split] [--prefill-chunk 2048] [--threads N] [--timer cpu|wall]

For each context L every model prefills a random prompt of L tokens into a fresh cache (in chunks of
--prefill-chunk tokens, which bounds prefill memory and does not change the cache), then decodes: each
timed step feeds one token per sequence through the whole model with the cache (logits included). The
models are stepped round-robin, one token each per round; tokens/s = batch / median step time, and the
ratio to Llama is paired per round (median [min-max]).

With `--fill tile` only the first --prefill-chunk tokens are prefilled and every cache buffer is then
filled up to L by repeating them (`tile_cache`): a decode step does the same work whatever the cached
values are, so this measures the step at L without the prefill's O(L²) time (hours at 32k on one CPU
thread); the cache has the same shape and bytes.

Every model runs at each of --dtype's dtypes (several: `--dtype fp32 bf16`) and --modes (eager: the
growing cache and the model's forward; static: a `StaticCache` and `static_step`; compiled: that step
through `compiled_step`, CUDA graphs on a GPU), all stepped round-robin in one run, so that every ratio is
measured in one run: each row against Llama at the same dtype and mode, and a second table each model at
its fastest setting against Llama at its fastest ("best against best"). On the CPU, --split profiles one
step of each and splits its time into the pass over the cached positions (every op with an operand of
context length: the attention's products, softmax and bias) and the rest (weights, MLP, head).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make `benchmarks.common` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from benchmarks.common import (
    DTYPES, Candidate, Report, Table, describe_error, dtype_name, fmt, fmt_paired, free_memory, interleaved, paired, parser, pick_dtype, ratio, setup,
)  # fmt: skip
from cem.model import LanguageModel, model_config
from cem.model.cache import StaticCache
from cem.model.generate import compiled_step, static_step

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
    "model", "dtype", "mode", "context", "batch", "cache B/token", "cache MiB", "ms/token", "tokens/s", "mem ×Llama",
    "tok/s ×Llama [min-max]", "cache pass ms", "rest ms", "note",
]  # fmt: skip
BEST_COLUMNS = ["model", "context", "best setting", "ms/token", "Llama's best", "Llama ms/token", "tok/s ×Llama best [min-max]"]
MODES = ("eager", "static", "compiled")


@torch.inference_mode()
def prefill(model: LanguageModel, prompt: torch.Tensor, max_len: int, chunk: int, static: bool = False):
    cache = StaticCache(max_len, prompt.device) if static else model.new_cache(max_len)
    for start in range(0, prompt.shape[1], chunk):
        model(prompt[:, start : start + chunk], cache=cache)
        if static:
            cache.advance(min(chunk, prompt.shape[1] - start))
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
    if isinstance(cache, StaticCache):
        cache.advance(context - n)


def decode_step(model: LanguageModel, token: torch.Tensor, cache, mode: str = "eager"):
    """One decoding step; static and compiled steps write at the same position every call (the same work)."""
    step = None if mode == "eager" else static_step if mode == "static" else compiled_step(token.device)

    def run():
        with torch.inference_mode():
            return model(token, cache=cache) if step is None else step(model, token, cache)

    return run


def time_split(run, context: int, max_len: int) -> tuple[float, float]:
    """Shares of one profiled call's CPU time in ops with an operand of `context` to `max_len` positions along a
    dimension (the pass over the cached positions) and in the others."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        run()
    cache = rest = 0.0
    for e in prof.events():
        over = any(isinstance(s, (list, tuple)) and any(isinstance(d, int) and context <= d <= max_len for d in s) for s in (e.input_shapes or []))
        cache, rest = (cache + e.self_cpu_time_total, rest) if over else (cache, rest + e.self_cpu_time_total)
    total = cache + rest or 1.0
    return cache / total, rest / total


def bench_context(args, device, models: dict[tuple[str, str], LanguageModel], context: int) -> tuple[list[list[object]], list[list[object]]]:
    """Rows of the full table and of the best-against-best table at one context."""
    g = torch.Generator().manual_seed(args.seed)
    vocab = next(iter(models.values())).config.vocab_size
    prompt = torch.randint(0, vocab, (args.batch, context), generator=g).to(device)
    token = torch.randint(0, vocab, (args.batch, 1), generator=g).to(device)
    max_len = context + args.warmup + args.repeats + 1  # and one profiled step (--split)
    caches, notes, cands = {}, {}, {}
    print(f"context {context}: prefill", file=sys.stderr)
    tiled = args.fill == "tile" and context > args.prefill_chunk
    keys = [(name, dt, mode) for (name, dt) in models for mode in args.modes]
    for key in keys:
        name, dt, mode = key
        model = models[(name, dt)]
        try:
            if tiled:
                caches[key] = prefill(model, prompt[:, : args.prefill_chunk], max_len, args.prefill_chunk, static=mode != "eager")
                tile_cache(caches[key], context)
            else:
                caches[key] = prefill(model, prompt, max_len, args.prefill_chunk, static=mode != "eager")
        except Exception as exc:  # noqa: BLE001 - e.g. out of memory at a long context
            notes[key] = f"prefill: {describe_error(exc)}"
            free_memory(device)
            continue
        cands[key] = Candidate(decode_step(model, token, caches[key], mode))
    timings = interleaved(cands, device, repeats=args.repeats, warmup=args.warmup)
    splits = {k: time_split(c.run, context, max_len) for k, c in cands.items() if args.split and device.type == "cpu" and timings[k].median}

    rows = []
    for key in keys:
        name, dt, mode = key
        t, ref = timings.get(key), (LLAMA, dt, mode)
        ms = t.median if t else None
        bpt = caches[key].bytes_per_token() if key in caches else None
        ref_bpt = caches[ref].bytes_per_token() if ref in caches else None
        mib = bpt * context * args.batch / 2**20 if bpt is not None else None
        tok_s = args.batch * 1e3 / ms if ms else None
        note = notes.get(key) or (t.error if t and t.error else "")
        speed = fmt_paired(paired(t, timings.get(ref), invert=True))
        share = splits.get(key)
        cache_ms, rest_ms = (fmt(share[0] * ms, ".1f"), fmt(share[1] * ms, ".1f")) if share else ("-", "-")
        rows.append([name, dt, mode, context, args.batch, fmt(bpt, ","), fmt(mib, ".4g"), fmt(ms, ".3f"), fmt(tok_s, ",.1f"),
                     ratio(bpt, ref_bpt), speed, cache_ms, rest_ms, note])  # fmt: skip

    def best(name):
        done = [k for k in keys if k[0] == name and timings.get(k) and timings[k].median]
        return min(done, key=lambda k: timings[k].median) if done else None

    best_rows, ref = [], best(LLAMA)
    for name in dict.fromkeys(k[0] for k in keys):
        b = best(name)
        if b is None or ref is None:
            continue
        speed = fmt_paired(paired(timings[b], timings[ref], invert=True))
        best_rows.append([name, context, " ".join(b[1:]), fmt(timings[b].median, ".1f"), " ".join(ref[1:]), fmt(timings[ref].median, ".1f"), speed])
    del caches, cands
    free_memory(device)
    return rows, best_rows


def main(argv: list[str] | None = None) -> Report:
    p = parser(__doc__.split("\n\n")[0], ("--steps", "--repeats"), "timed decode steps per model and context (median reported)")
    p.add_argument("--preset", default=None, help=f"model size preset (GPU {GPU_PRESET}, CPU {CPU_PRESET}); its context is raised to fit")
    p.add_argument("--contexts", type=int, nargs="+", default=None, help=f"prompt lengths L (GPU {GPU_CONTEXTS}, CPU {CPU_CONTEXTS})")
    p.add_argument("--batch", type=int, default=1, help="sequences decoded together")
    p.add_argument("--dtype", nargs="+", default=["auto"], choices=["auto", "fp32", "bf16", "fp16"],
                   help="model and cache dtypes, each timed (auto: bf16 on GPU, fp32 on CPU)")
    p.add_argument("--modes", nargs="+", default=["eager"], choices=MODES,
                   help="eager: growing cache, the model's forward; static: StaticCache + static_step; compiled: that step compiled")
    p.add_argument("--models", nargs="+", default=None, choices=list(MODELS), metavar="NAME", help=f"the models (default all: {', '.join(MODELS)})")
    p.add_argument("--split", action="store_true", help="on the CPU, profile one step of each and split its time (cache pass, rest)")
    p.add_argument("--prefill-chunk", type=int, default=2048, help="prefill the prompt this many tokens at a time")
    p.add_argument("--fill", default="prefill", choices=["prefill", "tile"],
                   help="prefill: the whole prompt; tile: one chunk, the rest of the cache repeats it (same step cost, no O(L²) prefill)")
    args = p.parse_args(argv)
    device = setup(args, repeats=(200, 200), warmup=(10, 10))
    gpu = device.type == "cuda"
    dtypes = list(dict.fromkeys(dtype_name(pick_dtype(d, device)) for d in args.dtype))
    preset = args.preset or (GPU_PRESET if gpu else CPU_PRESET)
    contexts = args.contexts or list(GPU_CONTEXTS if gpu else CPU_CONTEXTS)
    if args.batch < 1 or args.prefill_chunk < 1 or min(contexts) < 1:
        raise SystemExit("--batch, --prefill-chunk and --contexts must be >= 1")
    fit = max(contexts) + args.warmup + args.repeats + 1
    names = list(dict.fromkeys([LLAMA, *(args.models or MODELS)]))
    if "compiled" in args.modes:  # one compiled step per model and dtype: room for all of them
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 4 * len(names) * len(dtypes))

    models = {}
    for name in names:
        arch, overrides = MODELS[name]
        cfg = model_config(preset, arch, **overrides)
        cfg = cfg.replace(context=max(cfg.context, fit))  # room for the prompt and the decoded tokens
        for dt in dtypes:
            torch.manual_seed(args.seed)
            models[(name, dt)] = LanguageModel(cfg).to(device, DTYPES[dt]).eval()

    table, best = Table(COLUMNS), Table(BEST_COLUMNS)
    for context in contexts:
        rows, best_rows = bench_context(args, device, models, context)
        for row in rows:
            table.add(*row)
        for row in best_rows:
            best.add(*row)
    report = Report(
        f"Decoding with the cache: CEM vs Llama (preset {preset})",
        device,
        settings={"dtypes": " ".join(dtypes), "modes": " ".join(args.modes), "batch": args.batch, "decode steps": args.repeats,
                  "warm-up steps": args.warmup,
                  "cache fill": "prefill" if args.fill == "prefill" else f"tile (prefill {args.prefill_chunk} tokens, repeated up to the context)",
                  "timer": args.timer if device.type == "cpu" else "CUDA events", "threads": torch.get_num_threads()},  # fmt: skip
        tables=[("Every setting (×Llama: Llama at the same dtype and mode)", table),
                ("Best against best (each model at its fastest dtype and mode, paired per round)", best)],
        notes=[
            "cache B/token: Cache.bytes_per_token() after the prefill (per sequence, all layers); cache MiB: that × context × batch.",
            "ms/token: median time of one decode step (one new token per sequence; on the CPU process CPU time, one thread "
            "unless --threads) over the steps after a prefill of `context` tokens, all models stepped round-robin; "
            "tokens/s = batch / ms. tok/s ×Llama: per round, Llama's step time / the model's, median [min-max].",
            "cache pass ms / rest ms (--split): the step's median split by the CPU-time shares of one profiled step: ops with an "
            "operand of context length (attention products over the cache, softmax, bias; CEM's fused CPU decode kernel in bf16) against "
            "the others (weights, MLP, head).",
            "Llama caches keys and values; CEM caches keys only, or with a key-query diagonal ĥ only (the same bytes): "
            "a decode step reads it once, head k's logit being ĥ_j·(W_K^kᵀ q^k + d_k∘u) (attention_core.cem_query_side).",
        ],
    )
    report.emit(args.out)
    return report


if __name__ == "__main__":
    main()
