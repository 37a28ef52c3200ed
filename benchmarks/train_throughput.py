"""Whole-model training throughput: tokens/s of a training step (forward, backward, AdamW step) and MFU
for Llama, CEM T=1 and CEM T=2, plus transformers' LlamaForCausalLM of the same shape as a peer of our
Llama; ratios to our Llama.

    python benchmarks/train_throughput.py [--device auto|cpu|cuda] [--out FILE.md] [--presets small 134M]
        [--seq-len N] [--batch B] [--steps N] [--warmup N] [--precision auto|bf16|fp32] [--compile]
        [--no-hf] [--threads N]

MFU = tokens/s × train_flops_per_token(cfg, seq_len) / peak, where peak is the device's matmul FLOP/s
measured by `cem.device.peak_flops` in this run (bf16 when training under bf16 autocast, fp32
otherwise). The four models of one preset are timed step by step, round-robin, on the same batch.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make `benchmarks.common` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from benchmarks.common import Candidate, Report, Table, fmt, free_memory, interleaved, parser, ratio, setup
from cem.model import LanguageModel, model_config
from cem.model.flops import train_flops_per_token
from cem.model.loss import next_token_loss
from cem.device import autocast_for, peak_flops, uses_bf16

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
}
COLUMNS = [
    "preset", "model", "params M", "seq", "batch", "GFLOP/token", "step ms", "tokens/s", "MFU %",
    "tok/s ×Llama", "MFU ×Llama", "note",
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
        cfg = model_config(preset, arch, context=max(base.context, seq), **overrides)
        torch.manual_seed(args.seed)
        entries.append((name, cfg, LanguageModel(cfg), ""))
        if name == LLAMA and not args.no_hf:
            try:
                entries.append((HF, cfg, hf_llama(entries[0][2]), ""))
            except Exception as exc:  # noqa: BLE001 - transformers missing or incompatible
                entries.append((HF, cfg, None, f"not built: {exc}"))

    cands = {}
    for name, cfg, model, note in entries:
        if model is None:
            continue
        model.to(device).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
        module = torch.compile(model) if args.compile else model
        if name == HF:
            loss_of = lambda m, x, y: next_token_loss(m(input_ids=x).logits, y)  # noqa: E731
        else:
            loss_of = lambda m, x, y: m(x, y)  # noqa: E731
        cands[name] = Candidate(train_step(module, loss_of, x, y, autocast, opt))
    print(f"{preset}: seq {seq}, batch {batch}", file=sys.stderr)
    timings = interleaved(cands, device, repeats=args.repeats, warmup=args.warmup)

    results = {}
    for name, cfg, model, note in entries:
        t = timings.get(name)
        ms = t.median if t else None
        tok_s = batch * seq / (ms / 1e3) if ms else None
        flops = train_flops_per_token(cfg, seq)
        mfu = tok_s * flops / peak if tok_s else None
        params = sum(p.numel() for p in model.parameters()) / 1e6 if model is not None else None
        results[name] = (cfg, params, flops, ms, tok_s, mfu, note or (t.error if t and t.error else ""))
    ref = results[LLAMA]
    rows = []
    for name, (cfg, params, flops, ms, tok_s, mfu, note) in results.items():
        rows.append([
            preset, name, fmt(params, ".4g"), seq, batch, fmt(flops / 1e9, ".4g"), fmt(ms), fmt(tok_s, ",.0f"),
            fmt(None if mfu is None else 100 * mfu), ratio(tok_s, ref[4]), ratio(mfu, ref[5]), note,
        ])  # fmt: skip
    del cands, entries
    free_memory(device)
    return rows


def main(argv: list[str] | None = None) -> Report:
    p = parser(__doc__.split("\n\n")[0], ("--steps", "--repeats"), "timed training steps per model (median reported)")
    p.add_argument("--presets", nargs="+", default=None, help=f"model size presets (GPU {GPU_PRESETS}, CPU {CPU_PRESETS})")
    p.add_argument("--seq-len", type=int, default=None, help=f"sequence length (default: the preset's context, at most {CPU_MAX_SEQ} on CPU)")
    p.add_argument("--batch", type=int, default=None, help=f"sequences per step (default GPU: {GPU_TOKENS} tokens / seq_len; CPU: {CPU_BATCH})")
    p.add_argument("--precision", default="auto", choices=["auto", "bf16", "fp32"], help="auto: bf16 autocast on a GPU that supports it")
    p.add_argument("--compile", action="store_true", help="torch.compile every model (compilation happens in the warm-up)")
    p.add_argument("--no-hf", action="store_true", help="leave out transformers' LlamaForCausalLM")
    args = p.parse_args(argv)
    device = setup(args, repeats=(20, 5), warmup=(3, 1))
    gpu = device.type == "cuda"
    presets = args.presets or list(GPU_PRESETS if gpu else CPU_PRESETS)
    bf16 = uses_bf16(args.precision, device)
    peak_dtype = torch.bfloat16 if bf16 else torch.float32
    print("measuring peak matmul FLOP/s", file=sys.stderr)
    peak = peak_flops(device, peak_dtype)

    table = Table(COLUMNS)
    for preset in presets:
        for row in bench_preset(args, device, preset, peak):
            table.add(*row)
    report = Report(
        "Training throughput: CEM vs Llama",
        device,
        settings={
            "precision": "bf16 autocast" if bf16 else "fp32", "compile": args.compile, "optimizer": "AdamW",
            "steps": args.repeats, "warm-up": args.warmup,
            f"measured peak ({'bf16' if bf16 else 'fp32'} matmul)": f"{peak / 1e12:.2f} TFLOP/s",
        },  # fmt: skip
        tables=[("", table)],
        notes=[
            "step ms: median over steps (forward, loss, backward, AdamW step), the models of a preset timed round-robin "
            "on the same batch; tokens/s = batch × seq / step time; ratios are to our Llama of the same preset.",
            "MFU = tokens/s × train FLOP/token (cem.model.flops: 3 × forward matmul FLOPs, attention at full sequence "
            "length) / the peak matmul FLOP/s measured above; the HF Llama is counted with our Llama's FLOPs.",
            "CEM is arch \"cem\" (CEM attention, kq_diag shared, and CEM MLP); T=2 sets attn_steps = mlp_steps = 2.",
        ],
    )
    report.emit(args.out)
    return report


if __name__ == "__main__":
    main()
