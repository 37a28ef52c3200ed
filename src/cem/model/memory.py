"""Predicted peak training memory per device (`cem info --memory`): will this run fit before it is launched?

    plan_memory(cfg, batch, seq, precision="bf16", gpus=1, parallel="none", checkpointing="none") -> MemoryPlan

Weights, gradients and AdamW state are counted from the parameters (fp32: 4, 4 and 8 bytes a parameter).
Activations are not a hand-written formula: `activation_bytes` builds a one-block model of `cfg` on the CPU and
counts what one training forward keeps for the backward pass (every tensor autograd saves, and the inputs and
captured tensors of each `torch.utils.checkpoint` call, deduplicated by storage; parameters excluded) at two
short lengths, under bf16 autocast when asked; that is linear in the number of tokens (the fused kernel keeps
O(L) per layer), so the block's and the rest of the model's counts are extrapolated to `batch` × `seq` and the
block's is multiplied by the number of layers. The CEM attention runs in the Triton kernel there (Triton's
interpreter), which saves what it saves on a GPU; without triton the CPU path is counted, a few percent more:
the attention kind says which kernel that is and what scratch it allocates (`SublayerKind.kernel`). A plan
records the path it counted (`MemoryPlan.attention`) and `path_note` says which, with the other path's peak.
All sizes are in GiB (2^30 bytes), the device's too: a GPU sold as "40 GB" holds 40 GiB.

Validated against one H100 (docs/benchmarks/gpu_h100.md: `cem-t2`, 134M, 2048 tokens, bf16, T = 1..4, each
checkpointing mode): activations and peak within 15% (what tests/model/test_memory.py checks; the worst
measured: 10% and 8%). Multi-GPU terms
(DDP's gradient buckets, FSDP2's shards and all-gathered blocks) follow PyTorch's defaults and have not been
measured.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass

import torch
import torch.utils.checkpoint

from ..checks import check_choice, check_positive_int
from ..device import PARALLEL, PRECISIONS
from ..layers import ATTENTION_KINDS, Inference
from .config import ModelConfig

PLANNED_PARALLEL = ("none", *PARALLEL)  # one device, or a torchrun run's way of sharing the model
PLANNED_PRECISIONS = tuple(p for p in PRECISIONS if p != "auto")  # a plan says which: bf16 autocast or fp32
GiB = 2**30
CUDA_CONTEXT_BYTES = 1 * GiB  # the CUDA context and the allocator's slack: outside torch's count, kept free in `fits`
_PROBE_TOKENS = (32, 64)  # at least the head width: fewer tokens take another path (`CEMAttention.folds`)


def _probe_tokens(cfg: ModelConfig) -> tuple[int, int]:
    """The two probe lengths: `_PROBE_TOKENS`, scaled up to start at the head width when it is larger."""
    n0 = max(_PROBE_TOKENS[0], cfg.head_dim)
    return n0, n0 * _PROBE_TOKENS[1] // _PROBE_TOKENS[0]


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes per device at the peak of a training step (the start of the backward pass, or a recomputed block)."""

    params: int  # the device's share of the fp32 weights (all of them, or its FSDP shard plus the gathered blocks)
    grads: int  # fp32 gradients (plus DDP's buckets)
    optimizer: int  # AdamW's two moments
    activations: int  # what the forward pass keeps for the backward pass (autocast's bf16 weight copies included)
    transient: int  # the largest short-lived allocation at the peak: the loss's gradient, a recomputed block, the kernel's score matrices
    attention: str | None = None  # the attention backend the activations were counted with (None: no fused kernel to choose)

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.activations + self.transient

    def fits(self, device_bytes: int) -> bool:
        """Whether the peak fits a device of `device_bytes`, leaving `CUDA_CONTEXT_BYTES` for the context."""
        return self.total + CUDA_CONTEXT_BYTES <= device_bytes

    def rows(self) -> list[tuple[str, int]]:
        return [("weights", self.params), ("gradients", self.grads), ("AdamW state", self.optimizer),
                ("activations", self.activations), ("transient", self.transient), ("peak", self.total)]  # fmt: skip


def _kept_bytes(module: torch.nn.Module, args: tuple, bf16: bool) -> int:
    """Bytes one forward of `module` keeps for its backward pass: storages saved by autograd, and the tensors
    each `torch.utils.checkpoint.checkpoint` call holds (its arguments and what its function captures), each
    storage once, the module's parameters excluded."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    kept: dict[int, int] = {}

    def add(obj, depth: int = 0) -> None:
        if isinstance(obj, torch.Tensor):
            storage = obj.untyped_storage()
            if storage.data_ptr() not in params:
                kept[storage.data_ptr()] = storage.nbytes()
        elif depth < 3 and isinstance(obj, (tuple, list)):
            for o in obj:
                add(o, depth + 1)
        elif depth < 3 and callable(obj):  # a step function: the tensors its closure holds
            for cell in getattr(obj, "__closure__", None) or ():
                with contextlib.suppress(ValueError):  # an empty cell
                    add(cell.cell_contents, depth + 1)

    real = torch.utils.checkpoint.checkpoint

    def counting_checkpoint(fn, *a, **kw):
        add(fn)
        add(a)
        return real(fn, *a, **kw)

    def pack(t):
        add(t)
        return t

    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    torch.utils.checkpoint.checkpoint = counting_checkpoint
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast:
            module(*args)
    finally:
        torch.utils.checkpoint.checkpoint = real
    return sum(kept.values())


def _probe_backend(cfg: ModelConfig) -> str:
    """The attention backend the probes run: the kind's GPU training kernel where it can run here, else the config's."""
    kernel = ATTENTION_KINDS[cfg.attn.kind].kernel
    return kernel.backend if kernel is not None and kernel.available() else cfg.attn.backend


def other_backend(cfg: ModelConfig) -> str | None:
    """The attention backend a plan could count instead of `_probe_backend`'s: the config's own where the GPU
    kernel is counted (what a machine without triton counts), else None."""
    return cfg.attn.backend if _probe_backend(cfg) != cfg.attn.backend else None


def path_note(cfg: ModelConfig, plan: "MemoryPlan", other: "MemoryPlan | None" = None) -> str | None:
    """Which attention path `plan` counted, and `other`'s peak where it differs (None without a fused kernel)."""
    kernel = ATTENTION_KINDS[cfg.attn.kind].kernel
    if kernel is None:
        return None
    if plan.attention == kernel.backend:
        text = f"attention path counted: the fused {kernel.backend} kernel a CUDA run uses (in its interpreter here)"
    else:
        why = "not installed here" if not kernel.available() else f"attn_backend={cfg.attn.backend}"
        text = (f"attention path counted: attn_backend={plan.attention}, not the fused {kernel.backend} kernel a CUDA run uses "
                f"({why}; that kernel keeps a few percent less)")
    if other is not None and other.total != plan.total:
        text += f"; another backend, attn_backend={other.attention} without that kernel, would need a peak of {other.total / GiB:.2f} GiB (not the prediction)"
    return text


def deepest(cfg: ModelConfig) -> ModelConfig:
    """`cfg` at the largest training depth it can draw: with random depth (`train_depth` "model" or "layer") or a
    curriculum, every CEM layer at T = its deepest (`RecursionTraining.deepest`: a drawn T replaces each layer's
    own), else `cfg` itself. What the planner measures, so that a plan is deterministic and covers every batch
    (with deep supervision, one of its K forward passes: the plan is then below the peak)."""
    t = cfg.training
    if t.depth == "fixed":
        return cfg
    fixed = dataclasses.replace(t, depth="fixed", supervise_depths=0, monotonicity_weight=0.0, curriculum=type(t).curriculum)
    return cfg.at(Inference(steps=t.deepest())).replace(training=fixed)


def depth_note(cfg: ModelConfig) -> str | None:
    """What a plan of `cfg` says about a random training depth (None without one)."""
    t = cfg.training
    if t.depth == "fixed":
        return None
    supervised = f"; deep supervision runs {t.supervise_depths} such forward passes a batch, not planned" if t.supervise_depths else ""
    return (f"random training depth (train_depth={t.depth}, T in 1..{t.deepest()}): "
            f"planned for the deepest draw, T = {t.deepest()} in every CEM layer{supervised}")


def activation_bytes(cfg: ModelConfig, batch: int, seq: int, precision: str = "bf16", checkpointing: str = "none",
                     backend: str | None = None) -> tuple[int, int]:
    """(activations of the whole model, activations of one block) for a training forward of `batch` × `seq`
    tokens, measured on a one-block model at two short lengths and extrapolated (see the module docstring),
    with the attention on `backend` (default `_probe_backend`); with random training depth, at the deepest draw (`deepest`)."""
    from .lm import LanguageModel

    check_choice("precision", precision, PLANNED_PRECISIONS)
    bf16 = precision == "bf16"
    cfg = deepest(cfg)
    probes = _probe_tokens(cfg)
    small = cfg.replace(n_layers=1, context=max(cfg.context, max(probes)))
    if "backend" in ATTENTION_KINDS[cfg.attn.kind].settings(cfg.attn):
        small = small.replace(attn_backend=backend or _probe_backend(cfg))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LanguageModel(small).train()
    model.set_activation_checkpointing(checkpointing)
    whole, block = [], []
    for n in probes:
        ids = torch.zeros(1, n, dtype=torch.long)
        whole.append(_kept_bytes(model, (ids, ids), bf16))
        h = torch.randn(1, n, cfg.dim, requires_grad=True)
        block.append(_kept_bytes(model.blocks[0], (h,), bf16))

    def at(counts: list[int], tokens: int) -> int:  # linear in the tokens, through the two probes
        (n0, n1), (c0, c1) = probes, counts
        return round(c0 + (c1 - c0) * (tokens - n0) / (n1 - n0))

    tokens = batch * seq
    per_block = at(block, tokens)
    return at(whole, tokens) - at(block, tokens) + cfg.n_layers * per_block, per_block


def plan_memory(
    cfg: ModelConfig,
    batch: int,
    seq: int,
    precision: str = "bf16",
    gpus: int = 1,
    parallel: str = "none",
    checkpointing: str = "none",
    backend: str | None = None,
) -> MemoryPlan:
    """Peak training memory per device for micro-batches of `batch` × `seq` tokens per device, the attention
    counted on `backend` (default `_probe_backend`); with random training depth, for the deepest draw (`deepest`)."""
    from .lm import CHECKPOINTING, LanguageModel

    check_positive_int("batch", batch)
    check_positive_int("seq", seq)
    check_positive_int("gpus", gpus)
    check_choice("parallel", parallel, PLANNED_PARALLEL)
    check_choice("checkpointing", checkpointing, CHECKPOINTING)
    if parallel == "none" and gpus > 1:
        raise ValueError(f"--gpus {gpus} needs --parallel ddp or fsdp")
    with torch.device("meta"):
        model = LanguageModel(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    block_params = sum(p.numel() for p in model.blocks[0].parameters())
    root_params = n_params - cfg.n_layers * block_params
    params, grads, optimizer = 4 * n_params, 4 * n_params, 8 * n_params
    if parallel == "ddp":
        grads *= 2  # DDP copies the gradients into its communication buckets
    elif parallel == "fsdp":  # fully_shard per block and at the root (cem.training.distributed), fp32 all-gathers
        params = 4 * n_params // gpus + 4 * root_params + 2 * 4 * block_params  # shard, the root, two gathered blocks
        grads = 4 * n_params // gpus + 2 * 4 * block_params  # shard, two unreduced blocks
        optimizer = 8 * n_params // gpus
    backend = backend or _probe_backend(cfg)
    activations, per_block = activation_bytes(cfg, batch, seq, precision, checkpointing, backend)
    elem = 2 if precision == "bf16" else 4
    transient = batch * seq * cfg.vocab_size * elem  # the logits' gradient at the start of the backward pass
    if checkpointing == "layer":  # one block recomputed in full
        transient = max(transient, activation_bytes(cfg, batch, seq, precision, "none", backend)[1])
    kernel = ATTENTION_KINDS[cfg.attn.kind].kernel
    if kernel is not None:  # what the attention kernel allocates at the peak (CEM: the diagonal's score matrix and Σ dS)
        transient = max(transient, kernel.scratch(deepest(cfg).attn, batch, seq, elem))
    return MemoryPlan(params, grads, optimizer, activations, transient, backend if kernel is not None else None)


def format_answer(plan: MemoryPlan, device_gib: float) -> str:
    """The plan's answer in a line: the predicted peak per device and whether it fits a device of `device_gib` GiB (2^30 bytes)."""
    fits = "fits" if plan.fits(int(device_gib * GiB)) else "does NOT fit"
    return (f"predicted peak training memory per device: {plan.total / GiB:.2f} GiB; {fits} a {device_gib:g} GiB device "
            f"(peak + {CUDA_CONTEXT_BYTES / GiB:g} GiB for the CUDA context: {(plan.total + CUDA_CONTEXT_BYTES) / GiB:.2f} GiB)")


def format_plan(plan: MemoryPlan) -> str:
    """The plan's terms as lines of text, in GiB (2^30 bytes), its peak last."""
    return "\n".join(f"  {name:12s} {value / GiB:8.2f} GiB" for name, value in plan.rows())
