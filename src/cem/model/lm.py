"""The decoder language model: blocks that mix any attention kind with any MLP kind."""

from __future__ import annotations

import dataclasses
import hashlib
from contextlib import ExitStack, contextmanager

import torch
import torch.utils.checkpoint
from torch import Tensor, nn

from ..layers import ATTENTION_KINDS, MLP_KINDS, SUBLAYERS, Reuse, RMSNorm
from ..layers.precond import Preconditioner
from ..checks import check_choice
from ..layers.steps import DescentLayer, Inference, curriculum_depth, draw_depths, draw_supervised_depths, set_inference
from .cache import Cache
from .config import ModelConfig
from .generate import generate
from .loss import deep_supervision_loss, next_token_loss


def build_attention(cfg: ModelConfig) -> nn.Module:
    """The attention sublayer of `cfg`: its kind's layer (CEM, eq. 12 with recursion, or Llama), optionally reused."""
    layer = ATTENTION_KINDS[cfg.attn.kind].build(cfg.shape, cfg.attn)
    return Reuse(layer, cfg.attn.reuse) if cfg.attn.reuse > 1 else layer


def build_mlp(cfg: ModelConfig) -> nn.Module:
    """The MLP sublayer of `cfg`: its kind's layer (CEM, eq. 13 with recursion, or SwiGLU), optionally reused."""
    layer = MLP_KINDS[cfg.mlp.kind].build(cfg.shape, cfg.mlp)
    return Reuse(layer, cfg.mlp.reuse) if cfg.mlp.reuse > 1 else layer


class Block(nn.Module):
    """h -> mlp(attn(h)); each sublayer carries its own norm and residual (Alg. 1, main block).

    With `gradient_checkpointing` (the name `transformers` sets through `gradient_checkpointing_enable`),
    a forward that records gradients keeps only the block's input and recomputes the rest in the backward
    pass (`torch.utils.checkpoint`, non-reentrant)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn = build_attention(cfg)
        self.mlp = build_mlp(cfg)
        self.gradient_checkpointing = False

    def forward(self, h: Tensor, cache=None) -> Tensor:
        if self.gradient_checkpointing and cache is None and torch.is_grad_enabled():
            return torch.utils.checkpoint.checkpoint(self._forward, h, use_reentrant=False)
        return self._forward(h, cache)

    def _forward(self, h: Tensor, cache=None) -> Tensor:
        return self.mlp(self.attn(h, cache=cache))


CHECKPOINTING = ("none", "layer", "step")  # activation checkpointing: off, per block, per recursion step


def parameter_generator(seed: int, name: str) -> torch.Generator:
    """A CPU generator keyed by (seed, parameter name): common random numbers across architectures. A
    wrapper's segment (`Reuse`'s `.layer`) is dropped, so a reused sublayer starts as the plain one."""
    key = f"{seed}/{name.replace('.layer.', '.')}".encode()
    return torch.Generator().manual_seed(int.from_bytes(hashlib.sha256(key).digest()[:8], "little") >> 1)


INDEX_DTYPES = (torch.int64, torch.int32, torch.int16, torch.uint8, torch.uint16, torch.uint32)  # token ids (token caches are uint16/uint32)


class LanguageModel(nn.Module):
    """Token embedding, `n_layers` blocks, final RMSNorm, output head; `forward(ids) -> logits`.

    With `init_seed`, every randomly initialised parameter is drawn from its own generator keyed by
    (init_seed, its name) (`parameter_generator`): two architectures built with one seed start with
    identical embeddings, head and every same-named, same-shaped weight (common random numbers for
    paired comparisons), whatever else each builds. Without it, torch's global generator draws them.
    """

    def __init__(self, cfg: ModelConfig, init_seed: int | None = None) -> None:
        super().__init__()
        self.config = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg.layer_config(i)) for i in range(cfg.n_layers))
        for i, block in enumerate(self.blocks):  # recursion in some blocks only (`recur_layers`): the others keep T = 1
            for m in block.modules():
                if isinstance(m, DescentLayer):
                    m.recurs = cfg.recurs(i)
        self.progress: tuple[int, int] | None = None  # (optimiser step, total steps) of training (`set_training_progress`)
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.init_weights(init_seed)
        if cfg.tie_embeddings:
            self.head.weight = self.embed.weight
        self.set_inference(cfg.inference)
        for m in self.descent_layers():
            m.track_fixed_point = cfg.training.fixed_point_weight > 0

    @torch.no_grad()
    def init_weights(self, seed: int | None = None) -> None:
        """Linear and embedding weights ~ N(0, init_std²); a low-rank preconditioner's U ~ N(0, 0.02²)
        (App. C.4); the other parameters keep their constant initial values. With `seed`, each weight is
        drawn from `parameter_generator(seed, name)`; without, the Linear and embedding weights are drawn
        from torch's global generator (U keeps its draw from construction)."""
        for module_name, module in self.named_modules():
            draws = {}
            if isinstance(module, (nn.Linear, nn.Embedding)):
                draws["weight"] = self.config.init_std
            elif isinstance(module, Preconditioner) and module.u is not None and seed is not None:
                draws["u"] = Preconditioner.U_INIT_STD
            for attr, std in draws.items():
                name = f"{module_name}.{attr}" if module_name else attr
                gen = None if seed is None else parameter_generator(seed, name)
                nn.init.normal_(getattr(module, attr), mean=0.0, std=std, generator=gen)

    def check_ids(self, ids: Tensor, start: int = 0) -> None:
        """Raise ValueError unless `ids` is a (batch, seq) integer tensor of in-vocabulary ids that fits the context."""
        if ids.dim() != 2:
            raise ValueError(f"token ids must have shape (batch, seq), got shape {tuple(ids.shape)}")
        if ids.dtype not in INDEX_DTYPES:
            raise ValueError(f"token ids must be an integer tensor, got dtype {ids.dtype}")
        if ids.shape[0] == 0:
            raise ValueError("token ids hold a batch of 0 sequences: need at least one")
        if ids.shape[1] == 0:
            raise ValueError("token ids are empty: need at least one token")
        if start + ids.shape[1] > self.config.context:
            raise ValueError(
                f"sequence too long: {start + ids.shape[1]} tokens > the model's context of {self.config.context}"
            )
        if torch.compiler.is_compiling():
            return  # the value check would sync and break the graph; shapes were checked above
        values = ids.long() if ids.dtype in (torch.uint16, torch.uint32) else ids  # min/max are not built for these
        lo, hi = torch.aminmax(values)
        try:  # no host read (on a GPU it stalled every forward until the device caught up): an asynchronous
            # device assertion there, an immediate error on the CPU, which then names the id
            torch._assert_async((lo >= 0) & (hi < self.config.vocab_size), "token id outside the vocabulary")
        except RuntimeError:
            bad = int(lo) if lo < 0 else int(hi)
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {self.config.vocab_size})") from None

    def forward(
        self,
        ids: Tensor,
        targets: Tensor | None = None,
        reduction: str = "mean",
        *,
        cache: Cache | None = None,
        last_only: bool = False,
    ) -> Tensor:
        """Logits (B, J, vocab) of the next token at every position; with a cache, only for the new ids;
        with `last_only`, only for the last position (B, 1, vocab), as generation needs after a prefill.

        With `targets` (B, J), the next-token cross-entropy in nats instead (`next_token_loss`): the mean
        over tokens, their sum, or per token (B, J) for reduction "mean", "sum" or "none". A training forward
        with reduction "mean" returns the training objective: with `supervise_depths` K > 0, the deep
        supervision objective over K drawn depths (`RecursionTraining`, `deep_supervision_loss`), else the mean
        loss; plus, with `fixed_point_weight` λ > 0, λ times the mean over CEM layers of their
        `fixed_point_residual` (of the last, deepest, forward).
        """
        self.check_ids(ids, 0 if cache is None else cache.length)
        if ids.dtype not in (torch.int64, torch.int32):  # e.g. uint16 straight from a token cache
            ids = ids.long()
        t = self.config.training
        objective = self.training and targets is not None and reduction == "mean" and torch.is_grad_enabled()
        if objective and t.supervise_depths:
            losses = []
            for depth in self.draw_supervised_depths():
                self._set_depth(depth)
                losses.append(next_token_loss(self._logits(ids, cache, last_only), targets))
            loss = deep_supervision_loss(torch.stack(losses), t.monotonicity_weight)
        else:
            if self.training and t.depth != "fixed":
                self.draw_depths()
            logits = self._logits(ids, cache, last_only)
            if targets is None:
                return logits
            loss = next_token_loss(logits, targets, reduction)
        if objective and t.fixed_point_weight > 0:
            loss = loss + t.fixed_point_weight * self.fixed_point_penalty()
        return loss

    def _logits(self, ids: Tensor, cache: Cache | None, last_only: bool) -> Tensor:
        """The blocks, the final norm and the head on `ids` (long)."""
        h = self.embed(ids)
        for i, block in enumerate(self.blocks):
            h = block(h, cache=None if cache is None else cache.slot(f"blocks.{i}.attn"))
        if last_only:
            h = h[:, -1:]
        return self.head(self.norm(h))

    def fixed_point_penalty(self) -> Tensor:
        """The mean over CEM layers of the relative size² of the step after their last one, from the last
        training forward (`DescentLayer.fixed_point_residual`; `fixed_point_weight` turns it on)."""
        residuals = [m.fixed_point_residual for m in self.descent_layers() if m.fixed_point_residual is not None]
        if not residuals:
            raise RuntimeError("no CEM layer holds a fixed-point residual: call a training forward with fixed_point_weight > 0 first")
        return torch.stack(residuals).mean()

    def loss(self, ids: Tensor, targets: Tensor) -> Tensor:
        """Mean next-token cross-entropy in nats (`forward(ids, targets)`)."""
        return self(ids, targets)

    def new_cache(self, max_len: int | None = None) -> Cache:
        """An empty decoding cache for up to `max_len` (default: the context) positions."""
        return Cache(max_len or self.config.context)

    def descent_layers(self) -> list[DescentLayer]:
        """Every CEM layer (attention and MLP), whose `steps` and `step_size` are test-time knobs."""
        return [m for m in self.modules() if isinstance(m, DescentLayer)]

    def recursing_layers(self) -> list[DescentLayer]:
        """The CEM layers whose T follows the training and test-time depths (all but those `recur_layers` keeps at 1)."""
        return [m for m in self.descent_layers() if m.recurs]

    @torch.compiler.disable
    def draw_depths(self) -> list[int]:
        """Random-depth training: T in 1..train_depth_max for this batch from `train_depth_dist` (uniform, or
        heavy-tailed with mean `train_depth_mean`), one draw for the whole model (`train_depth="model"`) or one
        per CEM layer (`"layer"`), from torch's global generator (so a resumed run draws the same depths); or,
        with `train_depth="curriculum"`, the curriculum's T at the training progress (`set_training_progress`).
        Evaluation ignores the draws and uses each layer's `steps`."""
        t = self.config.training
        layers = self.recursing_layers()
        if t.depth == "curriculum":
            if self.progress is None:
                raise ValueError("train_depth=curriculum grows T with the training progress: call "
                                 "model.set_training_progress(step, total_steps) before a training forward (the trainer does)")
            drawn = [curriculum_depth(t.curriculum, *self.progress)]
        else:
            drawn = draw_depths(t.depth_dist, 1 if t.depth == "model" else len(layers), t.depth_max, t.depth_mean)
        for i, layer in enumerate(layers):
            layer.drawn_steps = drawn[0 if len(drawn) == 1 else i]
        return drawn

    @torch.compiler.disable
    def draw_supervised_depths(self) -> list[int]:
        """The K depths of random deep supervision for this batch (`cem.layers.steps.draw_supervised_depths`)."""
        t = self.config.training
        return draw_supervised_depths(t.supervise_depths, t.depth_max)

    @torch.compiler.disable
    def _set_depth(self, depth: int) -> None:
        """Every recursing CEM layer at T = `depth` for the next training forward passes."""
        for layer in self.recursing_layers():
            layer.drawn_steps = depth

    def set_training_progress(self, step: int, total: int) -> None:
        """Tell the model where training is, for a depth curriculum: the next optimiser step `step` (0-based) of
        `total`. The trainer calls it before every step, from its own (restored) step, so a resumed run continues
        the curriculum where it was."""
        self.progress = (step, total)

    def set_activation_checkpointing(self, mode: str) -> None:
        """Recompute activations in the backward pass instead of keeping them (`CHECKPOINTING`): "layer"
        keeps each block's input only; "step" keeps the input of each recursion step of every CEM sublayer
        (`DescentLayer.checkpoint_steps`), so a layer's activation memory no longer grows with T (Llama
        sublayers, which have no steps, are then not checkpointed); "none" keeps everything. Gradients are
        unchanged (up to float rounding)."""
        check_choice("activation_checkpointing", mode, CHECKPOINTING)
        for module in self.modules():
            if isinstance(module, Block):
                module.gradient_checkpointing = mode == "layer"
            if isinstance(module, DescentLayer):
                module.checkpoint_steps = mode == "step"

    def set_inference(self, inference: Inference) -> None:
        """Set the test-time settings of every CEM layer for good (`cem.layers.set_inference`): T by kind from
        `inference`'s depths (None keeps it) and its inference options exactly as given (None is off): adaptive
        steps stop a position once its exit rule's quantity is <= `adaptive_tol` (the fixed T is then the
        maximum); `guard` > 0 halves a step that raises the energy up to `guard` times. The options run in eval
        mode or under `torch.no_grad()` only; `current_config` (and a saved model) records them."""
        set_inference(self, inference)

    @contextmanager
    def test_time(self, inference: Inference):
        """Run the `with` block at these test-time settings (an `Inference`; None keeps each CEM layer's own),
        the one way to change them for a while: checked when made, so no layer changes for a bad one;
        afterwards every layer has its own back."""
        if not isinstance(inference, Inference):
            raise ValueError(f"test-time settings must be an Inference, got {type(inference).__name__} {inference!r}")
        with ExitStack() as stack:
            for m in self.descent_layers():
                stack.enter_context(m.test_time(inference))
            yield self

    def reset_steps_used(self) -> None:
        """Zero every CEM layer's step counters (see `steps_used`)."""
        for m in self.descent_layers():
            m.reset_steps_used()

    def steps_used(self) -> dict:
        """Average recursion steps per position since `reset_steps_used` (or since the model was built):
        `attn`, `mlp` (over the CEM layers of that kind), `all` (over every CEM layer application) and
        `layers` (by module name); None where nothing ran. Read it after `evaluate(...)` with adaptive steps."""
        named = [(n, m) for n, m in self.named_modules() if isinstance(m, DescentLayer)]
        out: dict = {"layers": {n: m.steps_used() for n, m in named}}
        groups = {kind: [m for _, m in named if m.sublayer == kind] for kind in SUBLAYERS}
        for kind, group in {**groups, "all": [m for _, m in named]}.items():
            positions = sum(m.positions_total for m in group)
            out[kind] = float(sum(m.steps_total for m in group)) / positions if positions else None
        return out

    def current_config(self) -> ModelConfig:
        """The config with the recursion (T, η) and inference options the CEM layers run now (test-time changes);
        ValueError where layers of one sublayer kind differ (a config holds one value per kind)."""
        layers = self.descent_layers()
        options = {m.inference for m in layers}
        if len(options) > 1:
            raise ValueError(f"the CEM layers differ in their inference options {sorted(map(str, options))}; a config holds one value")
        changes: dict = {"inference": options.pop()} if options else {}
        for kind in SUBLAYERS:
            recursions = {m.recursion for m in layers if m.sublayer == kind and m.recurs}
            if len(recursions) > 1:
                raise ValueError(f"the {kind} CEM layers differ in their recursion (steps or step size) "
                                 f"{sorted((r.steps, r.step_size) for r in recursions)}; a config holds one value per sublayer kind")
            if recursions:
                changes[kind] = dataclasses.replace(getattr(self.config, kind), recursion=recursions.pop())
        return self.config.replace(**changes)

    generate = generate  # `cem.model.generate.generate` as a method: model.generate(prompt_ids, max_new_tokens, ...)
