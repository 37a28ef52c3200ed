"""Whole-model training throughput: tokens/s of a training step (forward, backward, AdamW step) and MFU
for Llama, CEM T=1, CEM T=2 and cem-t2 (T=2 with preconditioners), plus transformers' LlamaForCausalLM of
the same shape as a peer of our Llama; ratios to our Llama, eager and compiled.

    python benchmarks/train_throughput.py [--device auto|cpu|cuda] [--out FILE.md] [--presets small 134M]
        [--seq-len N] [--batch B] [--steps N] [--warmup N] [--precision auto|bf16|fp32]
        [--compile off|on|both] [--models "CEM T=1" ...] [--no-hf] [--threads N] [--timer cpu|wall] [--profile]

MFU = tokens/s × train_flops_per_token(cfg, seq_len) / peak, where peak is the device's matmul FLOP/s
measured by `cem.device.peak_flops` in this run (bf16 when training under bf16 autocast, fp32
otherwise). All models of one preset (eager and compiled) are timed step by step, round-robin, on the same
batch; ratios are paired per round (median [min-max]) against our Llama run the same way (eager or compiled).
`--profile` adds, per model, the operators that take most of one eager step (torch.profiler, self CPU time).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make `benchmarks.common` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from benchmarks.common import Candidate, Report, Table, fmt, fmt_paired, free_memory, interleaved, paired, parser, setup
from cem.model import LanguageModel, model_config
from cem.model.flops import train_flops_per_token
from cem.model.loss import next_token_loss
from cem.device import PRECISIONS, autocast_for, peak_flops, uses_bf16

GPU_PRESETS = ("small", "134M")
CPU_PRESETS = ("small",)
CPU_MAX_SEQ = 1024
GPU_TOKENS = 16384  # default GPU batch: batch × seq_len = 16k tokens per step
CPU_BATCH = 4
LLAMA, HF = "Llama", "Llama (HF LlamaForCausalLM)"
MODELS = {  # name -> (arch, overrides); the HF peer is built from the Llama's shape
    LLAMA: ("llama", {}),
    "CEM T=1": ("cem", {}),
    "CEM T=2": ("cem", {"attn_steps": 2, "mlp_steps": 2}),
    "cem-t2": ("cem-t2", {}),
}
COMPILED = " (compiled)"
COLUMNS = [
    "preset", "model", "params M", "seq", "batch", "GFLOP/token", "step ms", "tokens/s", "MFU %",
    "tok/s ×Llama [min-max]", "note",
]  # fmt: skip


def hf_llama(ours: LanguageModel) -> torch.nn.Module:
    """transformers' LlamaForCausalLM of our Llama's exact shape (random init, SDPA attention, no KV cache)."""
    from transformers import LlamaForCausalLM

    from cem.hf.llama_export import llama_config

    config = llama_config(ours)
    config.use_cache = False
    config._attn_implementation = "sdpa"
    return LlamaForCausalLM(config)


def train_step(model, loss_of, x, y, autocast, opt):
    def step():
        with autocast:
            loss = loss_of(model, x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def bench_preset(args, device, preset: str, peak: float) -> list[list[object]]:
    base = model_config(preset, "llama")
    seq = args.seq_len or (min(base.context, CPU_MAX_SEQ) if device.type != "cuda" else base.context)
    batch = args.batch or (max(1, GPU_TOKENS // seq) if device.type == "cuda" else CPU_BATCH)
    autocast = autocast_for(args.precision, device)
    g = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(0, base.vocab_size, (batch, seq + 1), generator=g).to(device)
    x, y = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()

    entries = []  # (name, cfg, model | None, note)
    for name, (arch, overrides) in MODELS.items():
        if name != LLAMA and args.models and name not in args.models:
            continue
        cfg = model_config(preset, arch, context=max(base.context, seq), **overrides)
        torch.manual_seed(args.seed)
        entries.append((name, cfg, LanguageModel(cfg), ""))
        if name == LLAMA and not args.no_hf:
            try:
                entries.append((HF, cfg, hf_llama(entries[0][2]), ""))
            except Exception as exc:  # noqa: BLE001 - transformers missing or incompatible
                entries.append((HF, cfg, None, f"not built: {exc}"))

    cands, profiles = {}, {}
    for name, cfg, model, note in entries:
        if model is None:
            continue
        model.to(device).train()
        if name == HF:
            loss_of = lambda m, x, y: next_token_loss(m(input_ids=x).logits, y)  # noqa: E731
        else:
            loss_of = lambda m, x, y: m(x, y)  # noqa: E731
        for compiled in {"off": (False,), "on": (True,), "both": (False, True)}[args.compile]:
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
            module = torch.compile(model) if compiled else model
            cands[name + (COMPILED if compiled else "")] = Candidate(train_step(module, loss_of, x, y, autocast, opt))
        if args.profile:
            profiles[name] = profile_step(train_step(model, loss_of, x, y, autocast, torch.optim.AdamW(model.parameters(), lr=1e-4)))
    print(f"{preset}: seq {seq}, batch {batch}", file=sys.stderr)
    timings = interleaved(cands, device, repeats=args.repeats, warmup=args.warmup)

    rows = []
    for suffix in ("", COMPILED):
        ref = timings.get(LLAMA + suffix)
        for name, cfg, model, note in entries:
            t = timings.get(name + suffix)
            if t is None and (suffix or model is not None):
                continue
            ms = t.median if t else None
            tok_s = batch * seq / (ms / 1e3) if ms else None
            flops = train_flops_per_token(cfg, seq)
            mfu = tok_s * flops / peak if tok_s else None
            params = sum(p.numel() for p in model.parameters()) / 1e6 if model is not None else None
            note = note or (t.error if t and t.error else "")
            rows.append([
                preset, name + suffix, fmt(params, ".4g"), seq, batch, fmt(flops / 1e9, ".4g"), fmt(ms), fmt(tok_s, ",.0f"),
                fmt(None if mfu is None else 100 * mfu), fmt_paired(paired(t, ref, invert=True)), note,
            ])  # fmt: skip
    del cands, entries
    free_memory(device)
    return rows, profiles


def profile_step(step, top: int = 8) -> str:
    """The operators taking most self CPU time in one training step (after two untimed ones), as Markdown."""
    from torch.profiler import profile

    step(), step()
    with profile() as prof:
        step()
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in events)
    table = Table(["op", "calls", "self ms", "share %"])
    for e in events[:top]:
        table.add(e.key.replace("|", "/"), e.count, fmt(e.self_cpu_time_total / 1e3), fmt(100 * e.self_cpu_time_total / total, ".1f"))
    return f"one step: {total / 1e3:.1f} ms self CPU time\n\n" + table.markdown()


def main(argv: list[str] | None = None) -> Report:
    p = parser(__doc__.split("\n\n")[0], ("--steps", "--repeats"), "timed training steps per model (median reported)")
    p.add_argument("--presets", nargs="+", default=None, help=f"model size presets (GPU {GPU_PRESETS}, CPU {CPU_PRESETS})")
    p.add_argument("--seq-len", type=int, default=None, help=f"sequence length (default: the preset's context, at most {CPU_MAX_SEQ} on CPU)")
    p.add_argument("--batch", type=int, default=None, help=f"sequences per step (default GPU: {GPU_TOKENS} tokens / seq_len; CPU: {CPU_BATCH})")
    p.add_argument("--precision", default="auto", choices=PRECISIONS, help="auto: bf16 autocast on a GPU that supports it")
    p.add_argument("--compile", default="both", choices=["off", "on", "both"],
                   help="torch.compile: eager rows, compiled rows, or both (default; compilation happens in the warm-up)")
    p.add_argument("--profile", action="store_true", help="also profile one eager step per model (torch.profiler)")
    p.add_argument("--models", nargs="+", default=None, choices=[m for m in MODELS if m != LLAMA],
                   help="the CEM models to time (default all; our Llama, the reference of every ratio, always runs)")
    p.add_argument("--no-hf", action="store_true", help="leave out transformers' LlamaForCausalLM")
    args = p.parse_args(argv)
    device = setup(args, repeats=(20, 30), warmup=(3, 2))
    gpu = device.type == "cuda"
    presets = args.presets or list(GPU_PRESETS if gpu else CPU_PRESETS)
    bf16 = uses_bf16(args.precision, device)
    peak_dtype = torch.bfloat16 if bf16 else torch.float32
    print("measuring peak matmul FLOP/s", file=sys.stderr)
    peak = peak_flops(device, peak_dtype)

    table, profiles = Table(COLUMNS), {}
    for preset in presets:
        rows, prof = bench_preset(args, device, preset, peak)
        for row in rows:
            table.add(*row)
        profiles.update({f"{preset} {name}": text for name, text in prof.items()})
    report = Report(
        "Training throughput: CEM vs Llama",
        device,
        settings={
            "precision": "bf16 autocast" if bf16 else "fp32", "compile": args.compile, "timer": args.timer if device.type == "cpu" else "CUDA events", "threads": torch.get_num_threads(), "optimizer": "AdamW",
            "steps": args.repeats, "warm-up": args.warmup,
            f"measured peak ({'bf16' if bf16 else 'fp32'} matmul)": f"{peak / 1e12:.2f} TFLOP/s",
        },  # fmt: skip
        tables=[("", table)],
        notes=[
            "step ms: median over steps (forward, loss, backward, AdamW step; on the CPU process CPU time, one thread unless "
            "--threads), the models of a preset timed round-robin on the same batch; tokens/s = batch × seq / step time.",
            "tok/s ×Llama: per round, our Llama's step time / the model's (compiled rows: / the compiled Llama's), "
            "median [min-max] over the rounds.",
            "MFU = tokens/s × train FLOP/token (cem.model.flops: 3 × forward matmul FLOPs, attention at full sequence "
            "length) / the peak matmul FLOP/s measured above; the HF Llama is counted with our Llama's FLOPs.",
            "CEM is arch \"cem\" (CEM attention, kq_diag shared, and CEM MLP); T=2 sets attn_steps = mlp_steps = 2; "
            "cem-t2 is T=2 with diagonal-plus-low-rank preconditioners (the paper's best setting).",
        ],
    )
    for name, text in profiles.items():
        report.tables.append((f"Profile: {name}", _Raw(text)))
    report.emit(args.out)
    return report


class _Raw:
    """Pre-formatted Markdown in the place of a table."""

    def __init__(self, text: str) -> None:
        self.text = text

    def markdown(self) -> str:
        return self.text


if __name__ == "__main__":
    main()
