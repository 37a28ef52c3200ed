"""The training loop: the paper's recipe, checkpoints that resume exactly, progress, metrics, torchrun."""

from __future__ import annotations

import contextlib
import json
import math
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from tqdm import tqdm

from ..data import SequenceSampler, build_split, get_tokenizer, load_corpus
from ..model import LanguageModel, ModelConfig, parameter_breakdown
from ..model.params import chinchilla_tokens
from ..model.flops import train_flops_per_token
from .checkpoint import find_checkpoint, load_checkpoint, rng_state, save_checkpoint, set_rng_state
from .config import RunConfig
from .distributed import all_reduce_mean, barrier, init_distributed, shutdown, wrap_model
from .evaluate import evaluate
from .hardware import peak_flops
from .metrics import MetricsLogger
from .schedule import cosine_schedule

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


class TrainingError(RuntimeError):
    """Training stopped on purpose (diverged loss); the message says what happened and what was kept."""


@dataclass
class Interrupted:
    """What `train` returns when SIGINT/SIGTERM stopped it after saving a checkpoint."""

    step: int
    signum: int
    checkpoint: Path


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(name)
    except RuntimeError:
        raise ValueError(f"unknown device {name!r}") from None


def autocast_for(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """bf16 autocast where asked (or, for "auto", on a GPU that supports it); else nothing."""
    if precision not in ("auto", "bf16", "fp32"):
        raise ValueError(f"unknown precision {precision!r}; expected auto, bf16 or fp32")
    use_bf16 = precision == "bf16" or (precision == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported())
    return torch.autocast(device.type, dtype=torch.bfloat16) if use_bf16 else contextlib.nullcontext()


def total_steps(run: RunConfig, cfg: ModelConfig, seq_len: int, world_size: int) -> int:
    """Optimiser steps from `max_steps`, a token count, or `chinchilla` (20 tokens per parameter of the
    matching Llama baseline, paper §4)."""
    t = run.train
    if t.max_steps is not None:
        return t.max_steps
    tokens_per_step = t.batch_size * t.grad_accum * world_size * seq_len
    if t.tokens is None:
        raise ValueError("no training budget: give max_steps or tokens (a number or 'chinchilla')")
    if str(t.tokens).lower() == "chinchilla":
        budget = chinchilla_tokens(t.preset, cfg.vocab_size, cfg.context)
    else:
        try:
            budget = int(float(t.tokens))
        except ValueError:
            raise ValueError(f"tokens must be a number or 'chinchilla', got {t.tokens!r}") from None
    return max(1, math.ceil(budget / tokens_per_step))


def param_groups(model: LanguageModel, weight_decay: float) -> list[dict]:
    """Weight decay on projection matrices and embeddings; none on gains, biases, the key-query diagonal,
    the preconditioners' diagonal p and step-size gains (they start at meaningful non-zero values or 0)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        is_matrix = p.dim() >= 2 and leaf not in ("kq_diag", "p")
        (decay if is_matrix else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def check_run_dir(out: Path, identity: dict, resume: bool) -> None:
    """Refuse to mix runs: an output directory holding a different run (or any run, without --resume)."""
    path = out / "run.json"
    if not path.exists():
        return
    try:
        existing = json.loads(path.read_text())
    except json.JSONDecodeError:
        raise ValueError(f"{path} is corrupted; choose another --out") from None
    for key, what in (("tokenizer", "tokenizer"), ("corpus", "corpus"), ("model", "model"), ("train", "training settings")):
        if existing.get(key) != identity.get(key):
            raise ValueError(f"output directory {out} already holds a different run ({what} differs); choose another --out")
    if not resume:
        raise ValueError(f"output directory {out} already holds this run; pass --resume to continue it or choose another --out")


def _lm_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x).flatten(0, 1).float(), y.flatten())


def train(run: RunConfig, out: str | Path, resume: bool = False, progress: bool = True, stop_at: int | None = None):
    """Train, evaluate on the test split, write `results.json`; returns the results (or `Interrupted`).

    `stop_at` ends the run after that optimiser step with a checkpoint, without changing the schedule.
    """
    t = run.train
    device = pick_device(t.device)
    info = init_distributed(device.type)
    if info.enabled and device.type == "cuda":
        device = torch.device("cuda", info.local_rank)
        torch.cuda.set_device(device)
    try:
        return _train(run, Path(out), resume, progress and info.is_main, stop_at, device, info)
    finally:
        shutdown(info)


def _train(run, out, resume, progress, stop_at, device, info):
    t = run.train
    started = time.perf_counter()
    corpus = load_corpus(t.data, t.data_dir)
    if info.is_main:  # the main process trains a BPE / tokenises first; the others then read its caches
        tokenizer = get_tokenizer(t.tokenizer, corpus)
        splits = {s: build_split(corpus, tokenizer, s) for s in ("train", "valid", "test")}
    barrier(info)
    if not info.is_main:
        tokenizer = get_tokenizer(t.tokenizer, corpus)
        splits = {s: build_split(corpus, tokenizer, s) for s in ("train", "valid", "test")}
    cfg = run.model(tokenizer.vocab_size)
    seq_len = t.seq_len or cfg.context
    steps_total = total_steps(run, cfg, seq_len, info.world_size)
    identity = {
        "model": cfg.to_dict(),
        "tokenizer": tokenizer.name,
        "corpus": corpus.fingerprint(),
        "train": {k: v for k, v in run.to_dict()["train"].items() if k not in _RUNTIME_KEYS},
    }
    out.mkdir(parents=True, exist_ok=True)
    check_run_dir(out, identity, resume)
    barrier(info)
    if info.is_main:
        (out / "run.json").write_text(json.dumps({**identity, "config": run.to_dict(), "total_steps": steps_total}, indent=2))
        tokenizer.save(out / "tokenizer")

    if cfg.attn == "cem" and cfg.attn_backend == "auto":
        from ..kernels import auto_backend  # on CUDA this runs the kernel's one-time self-check, eagerly

        chosen = auto_backend(device)
        if progress:
            print(f"CEM attention backend on {device}: {chosen}", file=sys.stderr)
    torch.manual_seed(t.seed)
    model = LanguageModel(cfg).to(device)
    sampler = SequenceSampler(splits["train"], seq_len, seed=t.seed, rank=info.rank, world_size=info.world_size)
    step, tokens_seen, elapsed_before, state = 0, 0, 0.0, None
    ckpt_dir = out / "ckpt"
    found = find_checkpoint(out) if resume else None
    if resume and found is None and (out / "results.json").exists():
        return json.loads((out / "results.json").read_text())  # already finished
    if found is not None:
        saved_model, state = load_checkpoint(found)
        model.load_state_dict(saved_model.state_dict())
        sampler.load_state_dict(state["sampler"][info.rank])
        set_rng_state(state["rng"][info.rank])
        step, tokens_seen, elapsed_before = state["step"], state["tokens_seen"], state["elapsed"]
        if progress:
            print(f"resumed from {found} at step {step}/{steps_total}", file=sys.stderr)
        if step >= steps_total and (out / "results.json").exists():
            return json.loads((out / "results.json").read_text())

    sharded = info.enabled and t.parallel == "fsdp"
    wrapped = wrap_model(model, info, t.parallel, device)  # FSDP2 shards in place: build the optimiser after
    optimizer = torch.optim.AdamW(
        param_groups(model, t.weight_decay), lr=t.lr, betas=(t.beta1, t.beta2), eps=t.eps, fused=device.type == "cuda"
    )
    scheduler = cosine_schedule(optimizer, steps_total, t.warmup_frac, t.final_lr_frac)
    if state is not None:
        if sharded:
            set_optimizer_state_dict(wrapped, optimizer, state["optimizer"], options=FULL)
        else:
            optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
    if t.compile:
        wrapped = torch.compile(wrapped)
    autocast = autocast_for(t.precision, device)
    logger = MetricsLogger(out, t.tensorboard, t.wandb_project if t.wandb else None, run.to_dict()) if info.is_main else None
    tokens_per_step = t.batch_size * t.grad_accum * info.world_size * seq_len
    flops_per_token = train_flops_per_token(cfg, seq_len)
    peak = peak_flops(device) if device.type == "cuda" else None

    stop_signal: list[int] = []
    handlers = _install_signal_handlers(stop_signal)

    def checkpoint() -> None:
        model_state = get_model_state_dict(model, options=FULL) if sharded else model.state_dict()
        optim_state = get_optimizer_state_dict(model, optimizer, options=FULL) if sharded else optimizer.state_dict()
        samplers = _gather(sampler.state_dict(), info)
        rngs = _gather(rng_state(), info)
        if info.is_main:
            state = {
                "step": step,
                "tokens_seen": tokens_seen,
                "elapsed": elapsed_before + time.perf_counter() - resumed_at,
                "optimizer": optim_state,
                "scheduler": scheduler.state_dict(),
                "sampler": samplers,
                "rng": rngs,
                "run": run.to_dict(),
            }
            save_checkpoint(ckpt_dir, cfg, model_state, state)
        barrier(info)

    resumed_at = time.perf_counter()
    bar = tqdm(total=steps_total, initial=step, disable=not progress, unit="step", dynamic_ncols=True, file=sys.stderr)
    window_start, window_tokens = time.perf_counter(), 0
    try:
        while step < steps_total:
            loss_sum = 0.0
            for micro in range(t.grad_accum):
                x, y = sampler.next_batch(t.batch_size)
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                sync = contextlib.nullcontext()
                if info.enabled and t.parallel == "ddp" and micro < t.grad_accum - 1:
                    sync = wrapped.no_sync()
                with sync:
                    with autocast:
                        loss = _lm_loss(wrapped, x, y) / t.grad_accum
                    loss.backward()
                loss_sum += loss.item()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
            loss_value = all_reduce_mean(loss_sum, info, device)
            if not math.isfinite(loss_value) or not torch.isfinite(grad_norm):
                last = find_checkpoint(out)
                kept = f"the last good checkpoint ({last}) is kept" if last else "no checkpoint had been written yet"
                raise TrainingError(
                    f"training diverged: loss {loss_value} / gradient norm {grad_norm.item()} at step {step + 1}; "
                    f"stopped without saving; {kept} (try a lower lr)"
                )
            lr = scheduler.get_last_lr()[0]
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            tokens_seen += tokens_per_step
            window_tokens += tokens_per_step
            if step % t.log_every == 0 or step == steps_total:
                now = time.perf_counter()
                tok_s = window_tokens / max(now - window_start, 1e-9)
                window_start, window_tokens = now, 0
                record = {"loss": loss_value, "lr": lr, "grad_norm": grad_norm.item(), "tokens_per_s": tok_s, "tokens": tokens_seen}
                if peak:
                    record["mfu"] = tok_s * flops_per_token / (peak * info.world_size)
                if logger:
                    logger.log(step, **record)
                bar.set_postfix(loss=f"{loss_value:.3f}", lr=f"{lr:.2e}", tok_s=f"{tok_s:,.0f}", **({"mfu": f"{record['mfu']:.1%}"} if peak else {}))
            bar.update(1)
            if t.eval_every and step % t.eval_every == 0 and step < steps_total:
                val = evaluate(wrapped, splits["valid"], seq_len, t.batch_size, device, t.eval_batches, autocast)
                if logger:
                    logger.log(step, val_loss=val["loss"], val_perplexity=val["perplexity"], val_bits_per_byte=val["bits_per_byte"])
                _say(bar, f"step {step}: val loss {val['loss']:.4f}, ppl {val['perplexity']:.2f}, bpb {val['bits_per_byte']:.4f}", progress)
            if stop_signal or (stop_at is not None and step >= stop_at and step < steps_total):
                checkpoint()
                if stop_signal:
                    _say(bar, f"stopped by signal {stop_signal[0]} at step {step}; checkpoint saved in {ckpt_dir}; continue with --resume", info.is_main)
                    return Interrupted(step, stop_signal[0], ckpt_dir)
                return Interrupted(step, 0, ckpt_dir)
            if t.save_every and step % t.save_every == 0 and step < steps_total:
                checkpoint()
        checkpoint()
    finally:
        bar.close()
        _restore_signal_handlers(handlers)
        if logger:
            logger.close()

    wall = elapsed_before + time.perf_counter() - resumed_at
    results = {"status": "finished", "steps": step, "tokens_seen": tokens_seen, "train_wall_time_s": wall}
    for split in ("valid", "test"):
        metrics = evaluate(wrapped, splits[split], seq_len, t.batch_size, device, None, autocast)
        results.update({f"{split}_{k}": v for k, v in metrics.items()})
    results.update(
        {
            "parameters": parameter_breakdown(model),
            "tokens_per_s": tokens_seen / max(wall, 1e-9),
            "wall_time_s": elapsed_before + time.perf_counter() - resumed_at,
            "total_time_s": time.perf_counter() - started,
            "device": _device_name(device),
            "world_size": info.world_size,
            "model": cfg.to_dict(),
            "config": run.to_dict(),
            "tokenizer": tokenizer.name,
            "data": t.data,
        }
    )
    if info.is_main:
        tmp = out / "results.json.tmp"
        tmp.write_text(json.dumps(results, indent=2))
        tmp.replace(out / "results.json")
        if progress:
            print(
                f"test loss {results['test_loss']:.4f}, perplexity {results['test_perplexity']:.2f}, "
                f"bits per byte {results['test_bits_per_byte']:.4f} ({wall:.0f} s training); results in {out / 'results.json'}",
                file=sys.stderr,
            )
    return results


# settings that may change between a run and its resumption without making it a different run
_RUNTIME_KEYS = {"device", "compile", "eval_every", "eval_batches", "log_every", "save_every", "wandb", "wandb_project", "tensorboard", "data_dir", "parallel"}


def _say(bar: tqdm, message: str, show: bool) -> None:
    """A message on stderr that does not break the progress bar."""
    if show:
        bar.write(message, file=sys.stderr)


def _gather(obj, info) -> list:
    """Every process's `obj`, in rank order (on every process)."""
    if not info.enabled:
        return [obj]
    out = [None] * info.world_size
    torch.distributed.all_gather_object(out, obj)
    return out


def _install_signal_handlers(flag: list[int]):
    """SIGINT/SIGTERM only set a flag: the loop saves a checkpoint at the end of the current step."""
    try:
        return {s: signal.signal(s, lambda signum, frame: flag.append(signum)) for s in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread: leave the handlers alone
        return {}


def _restore_signal_handlers(handlers: dict) -> None:
    for s, h in handlers.items():
        signal.signal(s, h)


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform

    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
