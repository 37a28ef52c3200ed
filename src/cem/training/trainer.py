"""The training loop: the paper's recipe, checkpoints that resume exactly, progress, metrics, torchrun."""

from __future__ import annotations

import contextlib
import logging
import math
import shlex
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from tqdm import tqdm

from ..data import SequenceSampler, TokenSplit, build_split, get_tokenizer, load_corpus, parse_corpus
from ..data.tokenshards import find_shards, fingerprint, load_shards
from ..inductor import compiled
from ..io import refuse_link
from ..device import autocast_for, device_name, peak_flops, pick_device
from ..provenance import provenance
from ..layers import CEMAttention
from ..model import LanguageModel, ModelConfig, parameter_breakdown
from ..model.flops import train_flops_per_token
from .budget import Budget, hf_bytes_for_budget
from .checkpoint import checkpoint_step, load_checkpoint, rng_state, save_checkpoint, set_rng_state
from .config import RunConfig, TrainConfig
from .distributed import DistInfo, all_reduce_mean, barrier, init_distributed, shutdown, wrap_model
from .evaluate import evaluate
from .guard import DivergenceGuard
from .metrics import MetricsLogger
from .rundir import RunDir, run_identity
from .schedule import cosine_schedule
from .throughput import Throughput

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)
LOG = logging.getLogger("cem.train")  # its handler is the run's log file while `train` runs (main process): `_open_log`
LOG.propagate = False  # the screen gets the messages from `_say` already


def resume_command(rundir: RunDir) -> str:
    """The command that continues the run in `rundir` (`cem train --resume` reads every setting from its run.json)."""
    return f"cem train --out {shlex.quote(str(rundir.path))} --resume"


class TrainingError(RuntimeError):
    """Training stopped on purpose (diverged loss); the message says what happened and what was kept."""


@dataclass
class Interrupted:
    """What `train` returns when SIGINT/SIGTERM stopped it after saving a checkpoint."""

    step: int
    signum: int
    checkpoint: Path


class NothingToDo(dict):
    """What `train` returns for a run that had finished already: its results (results.json); nothing was trained."""


def param_groups(model: LanguageModel, weight_decay: float) -> list[dict]:
    """Weight decay on projection matrices and embeddings; none on gains, biases, the key-query diagonal,
    the preconditioners' diagonal p and step-size gains (they start at meaningful non-zero values or 0)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        is_matrix = p.dim() >= 2 and leaf not in ("kq_diag", "p")
        (decay if is_matrix else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def train(run: RunConfig, out: str | Path, resume: bool = False, progress: bool = True, stop_at: int | None = None, overwrite: bool = False):
    """Train, evaluate on the test split, write `results.json`; returns the results (`NothingToDo`, results
    too, for a run that had finished already), or `Interrupted`.

    `stop_at` ends the run after that optimiser step with a checkpoint, without changing the schedule.
    A directory that holds this run already (`RunDir.claim`): unfinished, it needs `resume`; finished, its
    results are returned (nothing to do), or, asked for more steps, it is extended from its final
    checkpoint (the cosine schedule is recomputed for the new total, so an extended run is not the run
    trained with the larger budget from the start). `overwrite` removes what the directory holds first.
    """
    run.train.validate()
    device = pick_device(run.train.device)
    if run.model().attn.backend == "triton" and device.type != "cuda":
        raise ValueError(f"attn_backend=triton needs a CUDA device (the run's device is {device}; on the CPU Triton would only run its slow interpreter); use attn_backend=auto")
    info = init_distributed(device.type)
    if info.enabled and device.type == "cuda":  # torchrun: one GPU per process
        device = torch.device("cuda", info.local_rank)
        torch.cuda.set_device(device)
    rundir = RunDir(out)
    if rundir.path.exists() and not rundir.path.is_dir():
        raise ValueError(f"output directory {rundir.path} is a file; choose a directory for --out")
    try:
        with rundir.lock() if info.is_main else contextlib.nullcontext():
            if overwrite and info.is_main:
                rundir.clear()
            barrier(info)
            return _train(run, rundir, resume, progress and info.is_main, stop_at, device, info)
    except Exception as e:
        LOG.info(f"stopped: {type(e).__name__}: {e}")  # a diverged run, a full disk ...: in the log too (once it is open)
        raise
    finally:
        _close_log()
        shutdown(info)


def _open_log(rundir: RunDir) -> None:
    """From now until `_close_log`, `LOG` (every `_say` message, a line per logged step) appends to the run's
    `log_file` (train.log), plain text with the time: the run folder keeps what the run printed, however it was started."""
    handler = logging.FileHandler(refuse_link(rundir.log_file), mode="a", encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%Y-%m-%d %H:%M:%S"))
    LOG.addHandler(handler)
    LOG.setLevel(logging.INFO)


def _close_log() -> None:
    for handler in list(LOG.handlers):
        LOG.removeHandler(handler)
        handler.close()


@dataclass
class TrainState:
    """Where training stands. With the model, optimiser, schedule, sampler and RNG states it is what a
    checkpoint holds, so that a resumed run continues bit for bit."""

    step: int = 0
    tokens_seen: int = 0
    elapsed_before: float = 0.0  # training seconds of earlier sessions of this run (before a resume)
    resumed_at: float = 0.0  # time.perf_counter() when this session's training loop began
    sessions: list = field(default_factory=list)  # the provenance of each training session so far (`cem.provenance`), with its first step

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
    budget: Budget
    progress: bool
    model: LanguageModel  # the bare model (checkpoints, clipping, parameter counts)
    wrapped: torch.nn.Module  # what runs forward: the model under DDP / FSDP2 / torch.compile
    sampler: SequenceSampler
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    state: TrainState
    guard: DivergenceGuard
    logger: MetricsLogger | None = None

    @property
    def sharded(self) -> bool:
        return self.info.enabled and self.run.train.parallel == "fsdp"


def _train(run: RunConfig, rundir: RunDir, resume: bool, progress: bool, stop_at: int | None, device, info: DistInfo):
    """The recipe: data, run directory, model, resume, optimiser, loop, final evaluation."""
    started = time.perf_counter()
    t = run.train
    data_fingerprint, tokenizer, splits = _load_data(run, info)
    cfg = run.model(tokenizer.vocab_size)
    seq_len = t.seq_len or cfg.context
    budget = Budget.of(t, cfg, seq_len, info.world_size)
    identity = run_identity(run, cfg, tokenizer.name, data_fingerprint)
    status = _claim_run_dir(rundir, identity, run, budget.steps, tokenizer, resume, info)
    if info.is_main:
        _open_log(rundir)
    if status == "finished":
        _say(f"{rundir.path} holds this run, finished ({rundir.results()['steps']} steps); nothing to do "
             f"(ask for more steps to extend it, or --overwrite to train it again)", progress)
        return NothingToDo(rundir.results())
    resume = resume or status == "extend"

    torch.manual_seed(t.seed)  # the global generator: random depths and anything else drawn in training
    model = LanguageModel(cfg, init_seed=t.seed).to(device)  # weights keyed by (seed, name): common random numbers
    model.set_activation_checkpointing(t.activation_checkpointing)  # before compile / DDP / FSDP2 wrap it
    _announce_backend(model, device, progress)
    sampler = SequenceSampler(splits["train"], seq_len, seed=t.seed, rank=info.rank, world_size=info.world_size)
    if t.batch_size > sampler.n_windows:
        raise ValueError(f"batch_size={t.batch_size} is more than the {sampler.n_windows} sequences of {seq_len} tokens in the train split")
    restored = _restore(rundir, resume, model, sampler, info, budget.steps, progress)
    if isinstance(restored, dict):
        return restored  # the run had finished: its results
    state, saved = restored
    wrapped, optimizer, scheduler = _build_optimizer(model, run, info, device, budget.steps, saved)
    guard = DivergenceGuard(t.diverge_factor, t.diverge_warmup, cfg.vocab_size)
    if saved is not None:
        guard.load_state_dict(saved.get("guard", {}))
    if guard.start_weight_norm is None:
        guard.start_weight_norm = _weight_norm(model).item()
    s = _Session(run, rundir, cfg, device, info, splits, seq_len, budget, progress,
                 model, wrapped, sampler, optimizer, scheduler, state, guard)  # fmt: skip
    stopped = _loop(s, stop_at)
    if stopped is not None:
        return stopped
    try:
        return _finish(s, started, tokenizer.name)
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM as the command line raises it: the trained weights are saved
        e.args = (f"during the final evaluation; the trained weights are saved in {rundir.ckpt_dir}: {resume_command(rundir)} evaluates them again",)
        _say(f"interrupted {e.args[0]}", False)
        raise


def _load_data(run: RunConfig, info: DistInfo):
    """The data's fingerprint, tokenizer and token splits: prepared token shards where there are some
    (`tokenshards.find_shards`), else the corpus loaded whole. The main process trains a BPE / tokenises
    first and writes the caches; the barrier keeps the others from racing it, and they then read those caches."""
    t = run.train
    data, budget_bytes = parse_corpus(t.data), hf_bytes_for_budget(run, info.world_size)
    shards = find_shards(data, t.tokenizer, t.data_dir, budget_bytes)
    if shards is not None:
        manifest, tokenizer, splits = load_shards(shards)
        return fingerprint(manifest), tokenizer, splits

    def load():
        tokenizer = get_tokenizer(t.tokenizer, corpus)
        return tokenizer, {split: build_split(corpus, tokenizer, split) for split in ("train", "valid", "test")}

    corpus = load_corpus(data, t.data_dir, t.hf_max_docs, budget_bytes, encoding=t.data_encoding)
    if info.is_main:
        tokenizer, splits = load()
    barrier(info)
    if not info.is_main:
        tokenizer, splits = load()
    return corpus.fingerprint(), tokenizer, splits


def _claim_run_dir(rundir: RunDir, identity: dict, run: RunConfig, steps_total: int, tokenizer, resume: bool, info: DistInfo) -> str:
    """Refuse a directory that holds another run (or this one, unfinished, without --resume), then record
    this run; returns `RunDir.claim`'s status. Every process checks before the main one writes, so none of
    them sees its own run.json as foreign."""
    rundir.path.mkdir(parents=True, exist_ok=True)
    status = rundir.claim(identity, resume, steps_total)
    barrier(info)
    if status == "extend" and rundir.checkpoint() is None:
        raise ValueError(f"{rundir.path}: cannot extend this finished run, its checkpoint is gone; pass --overwrite to train it again")
    if info.is_main and status != "finished":
        if status == "extend":
            rundir.start_extension()
        rundir.write_run(identity, run, steps_total, tokenizer)
    return status


def _announce_backend(model: LanguageModel, device: torch.device, progress: bool) -> None:
    """Say which backend the CEM attention core runs, as the layers resolve it (cached per device). On
    CUDA, resolving "auto" runs the Triton kernel's one-time self-check, eagerly, before torch.compile
    traces the model (inside a graph it cannot run)."""
    chosen = sorted({m.resolved_backend(device) for m in model.modules() if isinstance(m, CEMAttention)})
    if chosen:
        _say(f"CEM attention backend on {device}: {', '.join(chosen)}", progress)


def _restore(rundir: RunDir, resume: bool, model: LanguageModel, sampler: SequenceSampler, info: DistInfo, steps_total: int, progress: bool):
    """With --resume: the finished run's results, or (TrainState, saved trainer state) from the checkpoint
    with the model weights, this process's data position and RNG streams put back; else a fresh state."""
    found = rundir.checkpoint() if resume else None
    if resume and found is None and rundir.results() is not None:
        return NothingToDo(rundir.results())  # finished, and its checkpoint removed since
    if found is None:
        if resume:
            _say(f"--resume: no checkpoint in {rundir.path}; starting from step 0", info.is_main)
        return TrainState(), None
    saved_model, saved = load_checkpoint(found)
    try:
        model.load_state_dict(saved_model.state_dict())
    except RuntimeError:  # torch lists every tensor that differs (kilobytes); say which settings do
        mine = model.config.flat_dict()  # by flat key: `attn 'cem' there, 'llama' in run.json`
        diff = [f"{k} {v!r} there, {mine.get(k)!r} in run.json" for k, v in saved_model.config.flat_dict().items() if mine.get(k) != v]
        raise ValueError(f"checkpoint {found} holds another model than the run records: the architectures differ "
                         f"({'; '.join(diff[:3]) + ('; ...' if len(diff) > 3 else '') or 'tensor shapes'})") from None
    sampler.load_state_dict(saved["sampler"][info.rank])
    set_rng_state(saved["rng"][info.rank])
    state = TrainState(saved["step"], saved["tokens_seen"], saved["elapsed"], sessions=list(saved.get("sessions", [])))
    _say(f"resumed from {found} at step {state.step}/{steps_total}", progress)
    if state.step >= steps_total and rundir.results() is not None:
        return NothingToDo(rundir.results())
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
        # each run compiles afresh: in a process that trained other models before (a lane of runs), dynamo's
        # recompile limit is soon reached, and past it this model's forward would run eagerly without a word
        torch._dynamo.reset()
        wrapped = compiled(wrapped)
    return wrapped, optimizer, scheduler


def _loop(s: _Session, stop_at: int | None) -> Interrupted | None:
    """Optimiser steps until the budget is spent, with logging, validation and checkpoints; returns
    `Interrupted` when a signal or `stop_at` ends it early (after a checkpoint)."""
    t = s.run.train
    autocast = autocast_for(t.precision, s.device)
    s.logger = MetricsLogger(s.rundir.path, t.tensorboard, t.wandb_project if t.wandb else None, s.run.to_dict(), notices=s.progress) if s.info.is_main else None
    meter = Throughput(train_flops_per_token(s.cfg, s.seq_len), peak_flops(s.device) if s.device.type == "cuda" else None)
    stop_signal: list[int] = []
    handlers = _install_signal_handlers(stop_signal)
    s.state.resumed_at = time.perf_counter()
    s.state.sessions.append({**provenance(s.device), "compiled": hasattr(s.wrapped, "_orig_mod"), "from_step": s.state.step})
    _STDERR.broken = False
    _say(_what_is_trained(s), s.progress)
    bar = tqdm(total=s.budget.steps, initial=s.state.step, disable=not s.progress, unit="step", dynamic_ncols=True, file=_STDERR)
    first_step, timed_from = s.state.step, None
    try:
        while s.state.step < s.budget.steps:
            loss, grad_norm, lr = _optimizer_step(s, autocast)
            step = s.state.step
            meter.add(s.budget.tokens_per_step)
            if step % t.log_every == 0 or step == s.budget.steps:
                _log_step(s, bar, meter, loss=loss, lr=lr, grad_norm=grad_norm)
            elif step - first_step < t.log_every:  # until the first logged step: the latest loss on the bar
                bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", refresh=False)
            if step == first_step + 1:  # the first step pays one-time costs: the estimate times the ones after it
                timed_from = time.perf_counter()
            elif step == first_step + 1 + ESTIMATE_STEPS and step < s.budget.steps:
                _say(_expected_time(s, (time.perf_counter() - timed_from) / ESTIMATE_STEPS, step), s.progress)
            bar.update(1)
            if t.eval_every and step % t.eval_every == 0 and step < s.budget.steps:
                _validate(s, bar, autocast)
            if stop_signal or (stop_at is not None and step >= stop_at and step < s.budget.steps):
                _checkpoint(s)
                why = f"by signal {stop_signal[0]}" if stop_signal else "as asked (--stop-at)"
                _say(f"stopped at step {step} {why}; checkpoint saved in {s.rundir.ckpt_dir}; continue with: {resume_command(s.rundir)}",
                     s.info.is_main if stop_signal else s.progress)
                return Interrupted(step, stop_signal[0] if stop_signal else 0, s.rundir.ckpt_dir)
            if t.save_every and step % t.save_every == 0 and step < s.budget.steps:
                _checkpoint(s)
        _checkpoint(s)
    finally:
        bar.close()
        _restore_signal_handlers(handlers)
        if s.logger:
            s.logger.close()
    return None


ESTIMATE_STEPS = 5  # steps timed, after the first, for the expected time `cem train` prints


def _what_is_trained(s: _Session) -> str:
    """The line a run starts with: the model, its size, the budget, the corpus, the device and the run folder."""
    t, b = s.run.train, s.budget
    start = f"from step {s.state.step} " if s.state.step else ""
    count = lambda n: f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n:,}"  # noqa: E731
    return (f"training {t.arch} {t.preset} ({count(parameter_breakdown(s.model)['total'])} parameters) on {t.data}: {start}{b.steps:,} steps "
            f"of {b.tokens_per_step:,} tokens ({count(b.trained_tokens)} tokens) on {s.device}, into {s.rundir.path}")


QUICK_RUN_S = 120  # a run expected to take longer is told how many steps take about this long


def _expected_time(s: _Session, per_step: float, step: int) -> str:
    """The expected training time of the steps left, from `per_step` seconds a step as measured, said as such;
    for a long run, the --max-steps that takes about QUICK_RUN_S."""
    left = per_step * (s.budget.steps - step)
    when = f"{left:.0f} s" if left < 90 else f"{left / 60:.0f} min" if left < 5400 else f"{left / 3600:.1f} h"
    quick = max(step + 1, round(QUICK_RUN_S / per_step, -1))
    shorter = f"; a quicker first run: --max-steps {quick:.0f} (about {QUICK_RUN_S / 60:.0f} min here)" if left > QUICK_RUN_S and quick < s.budget.steps else ""
    return (f"expected time: about {when} more for the {s.budget.steps - step:,} steps left ({per_step:.2f} s a step over steps "
            f"{step - ESTIMATE_STEPS + 1}-{step}; a busy machine takes longer), besides validation, checkpoints and the final evaluation{shorter}")


def _optimizer_step(s: _Session, autocast) -> tuple[float, float, float]:
    """One optimiser step over `grad_accum` micro-batches; returns (loss, gradient norm, learning rate),
    the loss averaged over micro-batches and processes. A diverged step (a non-finite loss or gradient, or
    weights blown up) stops training without saving, so the last checkpoint stays the last good state. The
    loss, gradient norm and weight norm are read on the host once, after the update: every host read stalls a
    GPU's queue (there were 2 + grad_accum a step)."""
    t = s.run.train
    loss_sum = torch.zeros((), dtype=torch.float64, device=s.device)  # the float64 sum of the float32 losses
    s.model.set_training_progress(s.state.step, s.budget.steps)  # a depth curriculum's T (`LanguageModel.draw_depths`)
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
        loss_sum += loss.detach().double()
    grad_norm = _full(torch.nn.utils.clip_grad_norm_(s.model.parameters(), t.grad_clip))
    lr = s.scheduler.get_last_lr()[0]  # the rate this step uses
    s.optimizer.step()
    s.scheduler.step()
    s.optimizer.zero_grad(set_to_none=True)
    loss_sum, grad_norm, weight_norm = torch.stack([loss_sum, grad_norm.double(), _weight_norm(s.model).double()]).tolist()
    loss_value = all_reduce_mean(loss_sum, s.info, s.device)
    problem = s.guard.problem(loss_value, grad_norm)
    if problem is not None:
        raise _diverged(s, f"at step {s.state.step + 1} {problem}")
    s.guard.add(loss_value, grad_norm)
    problem = s.guard.weight_problem(weight_norm)
    if problem is not None:
        raise _diverged(s, f"at step {s.state.step + 1}: the update made {problem}")
    s.state.step += 1
    s.state.tokens_seen += s.budget.tokens_per_step
    return loss_value, grad_norm, lr


def _weight_norm(model: torch.nn.Module) -> torch.Tensor:
    """The L2 norm of all parameters (of the full model when FSDP shards them), a scalar on their device."""
    return _full(torch.nn.utils.get_total_norm([p.detach() for p in model.parameters()]))


def _full(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor: the full value of an FSDP-sharded (DTensor) one."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _diverged(s: _Session, what: str) -> TrainingError:
    """The error that stops a diverged run, saying which checkpoint is kept (never one from after the blow-up)."""
    last = s.rundir.checkpoint()
    step = checkpoint_step(last) if last is not None else None
    if last is None:
        kept = "no checkpoint had been written yet"
    else:
        kept = f"the last checkpoint, {last} (step {step}), written before the divergence, is kept"
    return TrainingError(
        f"training diverged {what}; stopped without saving; {kept}. Try a lower lr, or other settings "
        f"(diverge_factor=0 turns this check off)"
    )


def _log_step(s: _Session, bar: tqdm, meter: Throughput, loss: float, lr: float, grad_norm: float) -> None:
    """One metrics record (main process) and the progress bar's summary."""
    speed = meter.report(s.info.world_size)
    record = {"loss": loss, "lr": lr, "grad_norm": grad_norm, "tokens_per_s": speed["tokens_per_s"], "tokens": s.state.tokens_seen}
    record.update({k: v for k, v in speed.items() if k == "mfu"})
    if s.logger:
        s.logger.log(s.state.step, **record)
    mfu = {"mfu": f"{record['mfu']:.1%}"} if "mfu" in record else {}
    _say(f"step {s.state.step}/{s.budget.steps}: loss {loss:.4f}, lr {lr:.3e}, grad norm {grad_norm:.3f}, "
         f"{record['tokens_per_s']:,.0f} tokens/s" + "".join(f", mfu {v}" for v in mfu.values()), False)  # the bar shows it
    bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{record['tokens_per_s']:,.0f}", **mfu)


def _validate(s: _Session, bar: tqdm, autocast) -> None:
    """Loss on a few validation batches (`eval_batches`), logged and shown."""
    t = s.run.train
    val = evaluate(s.wrapped, s.splits["valid"], s.seq_len, t.batch_size, s.device, t.eval_batches, autocast)
    if s.logger:
        s.logger.log(s.state.step, val_loss=val["loss"], val_perplexity=val["perplexity"], val_bits_per_byte=val["bits_per_byte"])
    _say(f"step {s.state.step}: val loss {val['loss']:.4f}, ppl {val['perplexity']:.2f}, bpb {val['bits_per_byte']:.4f}", s.progress)


def _checkpoint(s: _Session) -> None:
    """Save everything a bit-exact resume needs. Every process takes part (FSDP2 gathers the full model
    and optimiser state; each process's sampler position and RNG streams are gathered); the main process
    writes, and the barrier keeps the others from running ahead of a checkpoint still being written."""
    model_state = get_model_state_dict(s.model, options=FULL) if s.sharded else s.model.state_dict()
    optim_state = get_optimizer_state_dict(s.model, s.optimizer, options=FULL) if s.sharded else s.optimizer.state_dict()
    _check_before_saving(s)
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
            "guard": s.guard.state_dict(),
            "run": s.run.to_dict(),
            "sessions": s.state.sessions,
        }
        save_checkpoint(s.rundir.ckpt_dir, s.cfg, model_state, trainer_state)
    barrier(s.info)


def _check_before_saving(s: _Session) -> None:
    """Never checkpoint a diverged state: the weights must be finite and their loss on the first validation
    batch within the divergence guard's bound (the update of the last step is only judged by the loss it
    leads to). Runs in eval mode without gradients, so it changes no RNG stream and no weight."""
    t = s.run.train
    if not t.diverge_factor:
        return
    probe = evaluate(s.wrapped, s.splits["valid"], s.seq_len, t.batch_size, s.device, 1, autocast_for(t.precision, s.device))["loss"]
    bound, why = s.guard.loss_bound()
    if not math.isfinite(probe) or probe > bound:
        raise _diverged(s, f"after step {s.state.step}: the loss on a validation batch, {probe:.4g}, exceeds {why}")


def _finish(s: _Session, started: float, tokenizer_name: str) -> dict:
    """Evaluate on the whole validation and test splits and write results.json (main process)."""
    t = s.run.train
    autocast = autocast_for(t.precision, s.device)
    wall = s.state.elapsed()
    results = {"status": "finished", "steps": s.state.step, "tokens_seen": s.state.tokens_seen, "train_wall_time_s": wall}
    for split in ("valid", "test"):
        n_tokens = final_eval_tokens(t, s.splits[split].n_tokens, s.seq_len, s.budget.trained_tokens)
        metrics = evaluate(s.wrapped, _leading(s.splits[split], n_tokens), s.seq_len, t.batch_size, s.device, None,
                           autocast, progress=s.progress, desc=f"final evaluation, {split}")
        results.update({f"{split}_{k}": v for k, v in metrics.items()})
        _say(f"final evaluation, {split}: loss {metrics['loss']:.4f}, perplexity {metrics['perplexity']:.2f}, "
             f"bits per byte {metrics['bits_per_byte']:.4f}", False)  # the progress bar showed it
        results[f"{split}_whole_split"] = n_tokens is None
    results.update(
        {
            "parameters": parameter_breakdown(s.model),
            "tokens_per_s": s.state.tokens_seen / max(wall, 1e-9),
            "wall_time_s": s.state.elapsed(),
            "total_time_s": time.perf_counter() - started,
            "device": device_name(s.device),
            "world_size": s.info.world_size,
            "provenance": provenance(s.device),  # of the process that finished it; each session's in "sessions"
            "sessions": s.state.sessions,
            "model": s.cfg.to_dict(),
            "config": s.run.to_dict(),
            "tokenizer": tokenizer_name,
            "data": t.data,
        }
    )
    if s.info.is_main:
        s.rundir.write_results(results)
        _say(f"test loss {results['test_loss']:.4f}, perplexity {results['test_perplexity']:.2f}, bits per byte "
             f"{results['test_bits_per_byte']:.4f} ({wall:.0f} s training); results in {s.rundir.results_json}", s.progress)
    return results


FINAL_EVAL_FRACTION = 0.05
FINAL_EVAL_MIN_WINDOWS = 64


def final_eval_tokens(t: TrainConfig, split_tokens: int, seq_len: int, train_tokens: int) -> int | None:
    """Tokens of a split (its leading ones) that the final evaluation covers, None for the whole split.
    `final_eval_tokens` when set (<= 0: the whole split); by default the whole split when it holds at
    most FINAL_EVAL_FRACTION of the training tokens (evaluating it then costs under 2% of the training
    compute), else that fraction of the training tokens, at least FINAL_EVAL_MIN_WINDOWS sequences.
    Token counts decide, not timings or batch sizes, so the choice is the same on every machine and for
    any number of processes."""
    if t.final_eval_tokens is not None:
        return t.final_eval_tokens if 0 < t.final_eval_tokens < split_tokens else None
    cap = max(math.ceil(FINAL_EVAL_FRACTION * train_tokens), FINAL_EVAL_MIN_WINDOWS * seq_len + 1)
    return None if split_tokens <= cap else cap


def _leading(split: TokenSplit, n_tokens: int | None) -> TokenSplit:
    """The first `n_tokens` tokens of `split` (all of it for None), with its bytes in proportion."""
    if n_tokens is None:
        return split
    return TokenSplit(split.name, split.tokens[:n_tokens], split.n_bytes * n_tokens / split.n_tokens)


class _QuietOnBrokenPipe:
    """stderr for the progress bar and the loop's messages: a write that fails turns the stream off instead of
    raising. `cem train ... | tee log` and Ctrl-C: the signal kills tee too, and the next progress write hit
    the dead pipe (BrokenPipeError) before the checkpoint was saved, losing the run; a message can never cost
    the checkpoint now."""

    def __init__(self, stream) -> None:
        self._stream = stream
        self.broken = False

    @property
    def stream(self):
        return sys.stderr if self._stream is None else self._stream

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                return self.stream.write(text)
            except (OSError, ValueError):  # EPIPE, EIO, or a closed file
                self.broken = True
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self.stream.flush()
            except (OSError, ValueError):
                self.broken = True

    def __getattr__(self, name):  # fileno, isatty, encoding ... for tqdm
        return getattr(self.stream, name)


_STDERR = _QuietOnBrokenPipe(None)  # whatever sys.stderr is at the time of the write (tests capture it)


def _say(message: str, show: bool) -> None:
    """A message for the run's log (`LOG`) and, if `show`, on stderr without breaking the progress bar (nor the
    run, if stderr is a dead pipe)."""
    LOG.info(message)
    if show:
        tqdm.write(message, file=_STDERR)


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
