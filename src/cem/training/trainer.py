"""The training loop: the paper's recipe, checkpoints that resume exactly, progress, metrics, torchrun."""

from __future__ import annotations

import contextlib
import math
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from tqdm import tqdm

from ..data import SequenceSampler, build_split, get_tokenizer, load_corpus
from ..device import autocast_for, device_name, peak_flops, pick_device
from ..layers import CEMAttention
from ..model import LanguageModel, ModelConfig, parameter_breakdown
from ..model.params import chinchilla_tokens
from ..model.flops import train_flops_per_token
from .checkpoint import load_checkpoint, rng_state, save_checkpoint, set_rng_state
from .config import RunConfig, TrainConfig
from .distributed import DistInfo, all_reduce_mean, barrier, init_distributed, shutdown, wrap_model
from .evaluate import evaluate
from .metrics import MetricsLogger
from .rundir import RunDir, run_identity
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


def train(run: RunConfig, out: str | Path, resume: bool = False, progress: bool = True, stop_at: int | None = None):
    """Train, evaluate on the test split, write `results.json`; returns the results (or `Interrupted`).

    `stop_at` ends the run after that optimiser step with a checkpoint, without changing the schedule.
    """
    device = pick_device(run.train.device)
    info = init_distributed(device.type)
    if info.enabled and device.type == "cuda":  # torchrun: one GPU per process
        device = torch.device("cuda", info.local_rank)
        torch.cuda.set_device(device)
    try:
        return _train(run, RunDir(out), resume, progress and info.is_main, stop_at, device, info)
    finally:
        shutdown(info)


@dataclass
class TrainState:
    """Where training stands. With the model, optimiser, schedule, sampler and RNG states it is what a
    checkpoint holds, so that a resumed run continues bit for bit."""

    step: int = 0
    tokens_seen: int = 0
    elapsed_before: float = 0.0  # training seconds of earlier sessions of this run (before a resume)
    resumed_at: float = 0.0  # time.perf_counter() when this session's training loop began

    def elapsed(self) -> float:
        """Training seconds of the whole run so far."""
        return self.elapsed_before + time.perf_counter() - self.resumed_at


@dataclass
class _Session:
    """What one training session has built, handed from phase to phase."""

    run: RunConfig
    rundir: RunDir
    cfg: ModelConfig
    device: torch.device
    info: DistInfo
    splits: dict
    seq_len: int
    steps_total: int
    progress: bool
    model: LanguageModel  # the bare model (checkpoints, clipping, parameter counts)
    wrapped: torch.nn.Module  # what runs forward: the model under DDP / FSDP2 / torch.compile
    sampler: SequenceSampler
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    state: TrainState
    logger: MetricsLogger | None = None

    @property
    def sharded(self) -> bool:
        return self.info.enabled and self.run.train.parallel == "fsdp"

    @property
    def tokens_per_step(self) -> int:
        t = self.run.train
        return t.batch_size * t.grad_accum * self.info.world_size * self.seq_len


def _train(run: RunConfig, rundir: RunDir, resume: bool, progress: bool, stop_at: int | None, device, info: DistInfo):
    """The recipe: data, run directory, model, resume, optimiser, loop, final evaluation."""
    started = time.perf_counter()
    t = run.train
    corpus, tokenizer, splits = _load_data(t, info)
    cfg = run.model(tokenizer.vocab_size)
    seq_len = t.seq_len or cfg.context
    steps_total = total_steps(run, cfg, seq_len, info.world_size)
    identity = run_identity(run, cfg, tokenizer.name, corpus.fingerprint())
    _claim_run_dir(rundir, identity, run, steps_total, tokenizer, resume, info)

    torch.manual_seed(t.seed)  # every process builds the same initial weights
    model = LanguageModel(cfg).to(device)
    _announce_backend(model, device, progress)
    sampler = SequenceSampler(splits["train"], seq_len, seed=t.seed, rank=info.rank, world_size=info.world_size)
    restored = _restore(rundir, resume, model, sampler, info, steps_total, progress)
    if isinstance(restored, dict):
        return restored  # the run had finished: its results
    state, saved = restored
    wrapped, optimizer, scheduler = _build_optimizer(model, run, info, device, steps_total, saved)
    s = _Session(run, rundir, cfg, device, info, splits, seq_len, steps_total, progress,
                 model, wrapped, sampler, optimizer, scheduler, state)  # fmt: skip
    stopped = _loop(s, stop_at)
    if stopped is not None:
        return stopped
    return _finish(s, started, tokenizer.name)


def _load_data(t: TrainConfig, info: DistInfo):
    """Corpus, tokenizer and token splits. The main process trains a BPE / tokenises first and writes the
    caches; the barrier keeps the others from racing it, and they then read those caches."""

    def load():
        tokenizer = get_tokenizer(t.tokenizer, corpus)
        return tokenizer, {split: build_split(corpus, tokenizer, split) for split in ("train", "valid", "test")}

    corpus = load_corpus(t.data, t.data_dir)
    if info.is_main:
        tokenizer, splits = load()
    barrier(info)
    if not info.is_main:
        tokenizer, splits = load()
    return corpus, tokenizer, splits


def _claim_run_dir(rundir: RunDir, identity: dict, run: RunConfig, steps_total: int, tokenizer, resume: bool, info: DistInfo) -> None:
    """Refuse a directory that holds another run (or this one without --resume), then record this run.
    Every process checks before the main one writes, so none of them sees its own run.json as foreign."""
    rundir.path.mkdir(parents=True, exist_ok=True)
    rundir.claim(identity, resume)
    barrier(info)
    if info.is_main:
        rundir.write_run(identity, run, steps_total, tokenizer)


def _announce_backend(model: LanguageModel, device: torch.device, progress: bool) -> None:
    """Say which backend the CEM attention core runs, as the layers resolve it (cached per device). On
    CUDA, resolving "auto" runs the Triton kernel's one-time self-check, eagerly, before torch.compile
    traces the model (inside a graph it cannot run)."""
    chosen = sorted({m.resolved_backend(device) for m in model.modules() if isinstance(m, CEMAttention)})
    if chosen and progress:
        print(f"CEM attention backend on {device}: {', '.join(chosen)}", file=sys.stderr)


def _restore(rundir: RunDir, resume: bool, model: LanguageModel, sampler: SequenceSampler, info: DistInfo, steps_total: int, progress: bool):
    """With --resume: the finished run's results, or (TrainState, saved trainer state) from the checkpoint
    with the model weights, this process's data position and RNG streams put back; else a fresh state."""
    found = rundir.checkpoint() if resume else None
    if resume and found is None and rundir.results() is not None:
        return rundir.results()  # finished, and its checkpoint removed since
    if found is None:
        return TrainState(), None
    saved_model, saved = load_checkpoint(found)
    model.load_state_dict(saved_model.state_dict())
    sampler.load_state_dict(saved["sampler"][info.rank])
    set_rng_state(saved["rng"][info.rank])
    state = TrainState(saved["step"], saved["tokens_seen"], saved["elapsed"])
    if progress:
        print(f"resumed from {found} at step {state.step}/{steps_total}", file=sys.stderr)
    if state.step >= steps_total and rundir.results() is not None:
        return rundir.results()
    return state, saved


# On the CPU compilation pays only for long runs: on the shared 2-core CPU it takes about a minute per model
# (forward and backward graphs, again for evaluation) and saves 15-22% of a CEM step (6-8% of Llama's) of
# 0.1-0.3 s at the small preset, so it breaks even after roughly 2-3k steps (docs/LOG.md, issue 13).
CPU_COMPILE_MIN_STEPS = 3000


def compile_by_default(device: torch.device, steps_total: int) -> bool:
    """`compile=None`: torch.compile on CUDA; on the CPU only for runs of at least CPU_COMPILE_MIN_STEPS steps."""
    return device.type == "cuda" or steps_total >= CPU_COMPILE_MIN_STEPS


def _build_optimizer(model: LanguageModel, run: RunConfig, info: DistInfo, device: torch.device, steps_total: int, saved: dict | None):
    """Wrap the model for the processes (DDP / FSDP2), then AdamW and the schedule, restored when resuming.

    The optimiser is built after wrapping because FSDP2 shards the parameters in place: an optimiser built
    before would hold the unsharded tensors. torch.compile comes last, around the wrapped model."""
    t = run.train
    wrapped = wrap_model(model, info, t.parallel, device)
    optimizer = torch.optim.AdamW(
        param_groups(model, t.weight_decay), lr=t.lr, betas=(t.beta1, t.beta2), eps=t.eps, fused=device.type == "cuda"
    )
    scheduler = cosine_schedule(optimizer, steps_total, t.warmup_frac, t.final_lr_frac)
    if saved is not None:
        if info.enabled and t.parallel == "fsdp":  # the checkpoint holds the full state; load it shard by shard
            set_optimizer_state_dict(wrapped, optimizer, saved["optimizer"], options=FULL)
        else:
            optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
    if compile_by_default(device, steps_total) if t.compile is None else t.compile:
        wrapped = torch.compile(wrapped)
    return wrapped, optimizer, scheduler


def _loop(s: _Session, stop_at: int | None) -> Interrupted | None:
    """Optimiser steps until the budget is spent, with logging, validation and checkpoints; returns
    `Interrupted` when a signal or `stop_at` ends it early (after a checkpoint)."""
    t = s.run.train
    autocast = autocast_for(t.precision, s.device)
    s.logger = MetricsLogger(s.rundir.path, t.tensorboard, t.wandb_project if t.wandb else None, s.run.to_dict()) if s.info.is_main else None
    meter = _Throughput(train_flops_per_token(s.cfg, s.seq_len), peak_flops(s.device) if s.device.type == "cuda" else None)
    stop_signal: list[int] = []
    handlers = _install_signal_handlers(stop_signal)
    s.state.resumed_at = time.perf_counter()
    bar = tqdm(total=s.steps_total, initial=s.state.step, disable=not s.progress, unit="step", dynamic_ncols=True, file=sys.stderr)
    try:
        while s.state.step < s.steps_total:
            loss, grad_norm, lr = _optimizer_step(s, autocast)
            step = s.state.step
            meter.add(s.tokens_per_step)
            if step % t.log_every == 0 or step == s.steps_total:
                _log_step(s, bar, meter, loss=loss, lr=lr, grad_norm=grad_norm)
            bar.update(1)
            if t.eval_every and step % t.eval_every == 0 and step < s.steps_total:
                _validate(s, bar, autocast)
            if stop_signal or (stop_at is not None and step >= stop_at and step < s.steps_total):
                _checkpoint(s)
                if stop_signal:
                    _say(bar, f"stopped by signal {stop_signal[0]} at step {step}; checkpoint saved in {s.rundir.ckpt_dir}; continue with --resume", s.info.is_main)
                return Interrupted(step, stop_signal[0] if stop_signal else 0, s.rundir.ckpt_dir)
            if t.save_every and step % t.save_every == 0 and step < s.steps_total:
                _checkpoint(s)
        _checkpoint(s)
    finally:
        bar.close()
        _restore_signal_handlers(handlers)
        if s.logger:
            s.logger.close()
    return None


def _optimizer_step(s: _Session, autocast) -> tuple[float, float, float]:
    """One optimiser step over `grad_accum` micro-batches; returns (loss, gradient norm, learning rate),
    the loss averaged over micro-batches and processes. A non-finite loss or gradient stops training
    before the optimiser touches the weights, so the last checkpoint stays the last good state."""
    t = s.run.train
    loss_sum = 0.0
    for micro in range(t.grad_accum):
        x, y = s.sampler.next_batch(t.batch_size)
        x, y = x.to(s.device, non_blocking=True), y.to(s.device, non_blocking=True)
        sync = contextlib.nullcontext()
        if s.info.enabled and t.parallel == "ddp" and micro < t.grad_accum - 1:
            sync = s.wrapped.no_sync()  # DDP all-reduces the gradients once, on the last micro-batch
        with sync:
            with autocast:
                loss = s.wrapped(x, y) / t.grad_accum
            loss.backward()
        loss_sum += loss.item()
    grad_norm = torch.nn.utils.clip_grad_norm_(s.model.parameters(), t.grad_clip)
    loss_value = all_reduce_mean(loss_sum, s.info, s.device)
    if not math.isfinite(loss_value) or not torch.isfinite(grad_norm):
        last = s.rundir.checkpoint()
        kept = f"the last good checkpoint ({last}) is kept" if last else "no checkpoint had been written yet"
        raise TrainingError(
            f"training diverged: loss {loss_value} / gradient norm {grad_norm.item()} at step {s.state.step + 1}; "
            f"stopped without saving; {kept} (try a lower lr)"
        )
    lr = s.scheduler.get_last_lr()[0]  # the rate this step uses
    s.optimizer.step()
    s.scheduler.step()
    s.optimizer.zero_grad(set_to_none=True)
    s.state.step += 1
    s.state.tokens_seen += s.tokens_per_step
    return loss_value, grad_norm.item(), lr


class _Throughput:
    """Tokens per second since the last report, and the model FLOP utilisation when the peak is known."""

    def __init__(self, flops_per_token: int, peak: float | None) -> None:
        self.flops_per_token, self.peak = flops_per_token, peak
        self.start, self.tokens = time.perf_counter(), 0

    def add(self, tokens: int) -> None:
        self.tokens += tokens

    def report(self, world_size: int) -> dict:
        now = time.perf_counter()
        tok_s = self.tokens / max(now - self.start, 1e-9)
        self.start, self.tokens = now, 0
        out = {"tokens_per_s": tok_s}
        if self.peak:
            out["mfu"] = tok_s * self.flops_per_token / (self.peak * world_size)
        return out


def _log_step(s: _Session, bar: tqdm, meter: _Throughput, loss: float, lr: float, grad_norm: float) -> None:
    """One metrics record (main process) and the progress bar's summary."""
    speed = meter.report(s.info.world_size)
    record = {"loss": loss, "lr": lr, "grad_norm": grad_norm, "tokens_per_s": speed["tokens_per_s"], "tokens": s.state.tokens_seen}
    record.update({k: v for k, v in speed.items() if k == "mfu"})
    if s.logger:
        s.logger.log(s.state.step, **record)
    mfu = {"mfu": f"{record['mfu']:.1%}"} if "mfu" in record else {}
    bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{record['tokens_per_s']:,.0f}", **mfu)


def _validate(s: _Session, bar: tqdm, autocast) -> None:
    """Loss on a few validation batches (`eval_batches`), logged and shown."""
    t = s.run.train
    val = evaluate(s.wrapped, s.splits["valid"], s.seq_len, t.batch_size, s.device, t.eval_batches, autocast)
    if s.logger:
        s.logger.log(s.state.step, val_loss=val["loss"], val_perplexity=val["perplexity"], val_bits_per_byte=val["bits_per_byte"])
    _say(bar, f"step {s.state.step}: val loss {val['loss']:.4f}, ppl {val['perplexity']:.2f}, bpb {val['bits_per_byte']:.4f}", s.progress)


def _checkpoint(s: _Session) -> None:
    """Save everything a bit-exact resume needs. Every process takes part (FSDP2 gathers the full model
    and optimiser state; each process's sampler position and RNG streams are gathered); the main process
    writes, and the barrier keeps the others from running ahead of a checkpoint still being written."""
    model_state = get_model_state_dict(s.model, options=FULL) if s.sharded else s.model.state_dict()
    optim_state = get_optimizer_state_dict(s.model, s.optimizer, options=FULL) if s.sharded else s.optimizer.state_dict()
    samplers = _gather(s.sampler.state_dict(), s.info)
    rngs = _gather(rng_state(), s.info)
    if s.info.is_main:
        trainer_state = {
            "step": s.state.step,
            "tokens_seen": s.state.tokens_seen,
            "elapsed": s.state.elapsed(),
            "optimizer": optim_state,
            "scheduler": s.scheduler.state_dict(),
            "sampler": samplers,
            "rng": rngs,
            "run": s.run.to_dict(),
        }
        save_checkpoint(s.rundir.ckpt_dir, s.cfg, model_state, trainer_state)
    barrier(s.info)


def _finish(s: _Session, started: float, tokenizer_name: str) -> dict:
    """Evaluate on the whole validation and test splits and write results.json (main process)."""
    t = s.run.train
    autocast = autocast_for(t.precision, s.device)
    wall = s.state.elapsed()
    results = {"status": "finished", "steps": s.state.step, "tokens_seen": s.state.tokens_seen, "train_wall_time_s": wall}
    for split in ("valid", "test"):
        metrics = evaluate(s.wrapped, s.splits[split], s.seq_len, t.batch_size, s.device, None, autocast)
        results.update({f"{split}_{k}": v for k, v in metrics.items()})
    results.update(
        {
            "parameters": parameter_breakdown(s.model),
            "tokens_per_s": s.state.tokens_seen / max(wall, 1e-9),
            "wall_time_s": s.state.elapsed(),
            "total_time_s": time.perf_counter() - started,
            "device": device_name(s.device),
            "world_size": s.info.world_size,
            "model": s.cfg.to_dict(),
            "config": s.run.to_dict(),
            "tokenizer": tokenizer_name,
            "data": t.data,
        }
    )
    if s.info.is_main:
        s.rundir.write_results(results)
        if s.progress:
            print(
                f"test loss {results['test_loss']:.4f}, perplexity {results['test_perplexity']:.2f}, "
                f"bits per byte {results['test_bits_per_byte']:.4f} ({wall:.0f} s training); results in {s.rundir.results_json}",
                file=sys.stderr,
            )
    return results


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
