"""The decoder language model: blocks that mix any attention kind with any MLP kind."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..layers import CEMMLP, CEMAttention, GatedMLP, LlamaAttention, Reuse, RMSNorm
from ..layers.steps import DescentLayer
from .cache import Cache
from .config import ModelConfig
from .loss import next_token_loss


def build_attention(cfg: ModelConfig) -> nn.Module:
    """The attention sublayer of `cfg`: CEM (eq. 12 with recursion) or Llama, optionally reused."""
    if cfg.attn == "cem":
        layer = CEMAttention(
            cfg.dim,
            cfg.n_heads,
            steps=cfg.attn_steps,
            step_size=cfg.attn_step_size,
            kq_diag=cfg.kq_diag,
            precond=cfg.attn_precond,
            precond_rank=cfg.attn_precond_rank,
            exact_gradient=cfg.exact_gradient,
            learn_step_size=cfg.learn_step_size,
            step_schedule=cfg.step_schedule,
            learned_steps=cfg.learned_steps(cfg.attn_steps),
            start=cfg.start,
            alibi=cfg.alibi,
            backend=cfg.attn_backend,
            eps=cfg.norm_eps,
        )
    else:
        layer = LlamaAttention(cfg.dim, cfg.n_heads, cfg.position, alibi=cfg.alibi, eps=cfg.norm_eps)
    return Reuse(layer, cfg.attn_reuse) if cfg.attn_reuse > 1 else layer


def build_mlp(cfg: ModelConfig) -> nn.Module:
    """The MLP sublayer of `cfg`: CEM (eq. 13 with recursion) or SwiGLU, optionally reused."""
    if cfg.mlp == "cem":
        layer = CEMMLP(
            cfg.dim,
            cfg.mlp_hidden,
            steps=cfg.mlp_steps,
            step_size=cfg.mlp_step_size,
            precond=cfg.mlp_precond,
            precond_rank=cfg.mlp_precond_rank,
            energy=cfg.mlp_energy,
            learn_step_size=cfg.learn_step_size,
            step_schedule=cfg.step_schedule,
            learned_steps=cfg.learned_steps(cfg.mlp_steps),
            start=cfg.start,
            eps=cfg.norm_eps,
        )
    else:
        layer = GatedMLP(cfg.dim, cfg.mlp_hidden, eps=cfg.norm_eps)
    return Reuse(layer, cfg.mlp_reuse) if cfg.mlp_reuse > 1 else layer


class Block(nn.Module):
    """h -> mlp(attn(h)); each sublayer carries its own norm and residual (Alg. 1, main block)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn = build_attention(cfg)
        self.mlp = build_mlp(cfg)

    def forward(self, h: Tensor, cache=None) -> Tensor:
        return self.mlp(self.attn(h, cache=cache))


class LanguageModel(nn.Module):
    """Token embedding, `n_layers` blocks, final RMSNorm, output head; `forward(ids) -> logits`."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.apply(self._init_weights)
        if cfg.tie_embeddings:
            self.head.weight = self.embed.weight

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=self.config.init_std)

    def check_ids(self, ids: Tensor, start: int = 0) -> None:
        """Raise ValueError unless `ids` is a (batch, seq) integer tensor of in-vocabulary ids that fits the context."""
        if ids.dim() != 2:
            raise ValueError(f"token ids must have shape (batch, seq), got shape {tuple(ids.shape)}")
        if ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
            raise ValueError(f"token ids must be an integer tensor, got dtype {ids.dtype}")
        if ids.shape[1] == 0:
            raise ValueError("token ids are empty: need at least one token")
        if start + ids.shape[1] > self.config.context:
            raise ValueError(
                f"sequence too long: {start + ids.shape[1]} tokens > the model's context of {self.config.context}"
            )
        if torch.compiler.is_compiling():
            return  # the value check would sync and break the graph; shapes were checked above
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= self.config.vocab_size:
            bad = lo if lo < 0 else hi
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {self.config.vocab_size})")

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
        over tokens, their sum, or per token (B, J) for reduction "mean", "sum" or "none".
        """
        self.check_ids(ids, 0 if cache is None else cache.length)
        if self.training and self.config.train_depth != "fixed":
            self.draw_depths()
        h = self.embed(ids)
        for i, block in enumerate(self.blocks):
            h = block(h, cache=None if cache is None else cache.slot(f"blocks.{i}.attn"))
        if last_only:
            h = h[:, -1:]
        logits = self.head(self.norm(h))
        return logits if targets is None else next_token_loss(logits, targets, reduction)

    def loss(self, ids: Tensor, targets: Tensor) -> Tensor:
        """Mean next-token cross-entropy in nats (`forward(ids, targets)`)."""
        return self(ids, targets)

    def new_cache(self, max_len: int | None = None) -> Cache:
        """An empty decoding cache for up to `max_len` (default: the context) positions."""
        return Cache(max_len or self.config.context)

    def descent_layers(self) -> list[DescentLayer]:
        """Every CEM layer (attention and MLP), whose `steps` and `step_size` are test-time knobs."""
        return [m for m in self.modules() if isinstance(m, DescentLayer)]

    @torch.compiler.disable
    def draw_depths(self) -> list[int]:
        """Random-depth training: T ~ uniform{1..train_depth_max} for this batch, one draw for the whole model
        (`train_depth="model"`) or one per CEM layer (`"layer"`), from torch's global generator (so a resumed
        run draws the same depths). Evaluation ignores the draws and uses each layer's `steps`."""
        layers = self.descent_layers()
        n = 1 if self.config.train_depth == "model" else len(layers)
        drawn = torch.randint(1, self.config.train_depth_max + 1, (n,)).tolist()
        for i, layer in enumerate(layers):
            layer.drawn_steps = drawn[0 if n == 1 else i]
        return drawn

    def set_steps(self, steps: int | None = None, attn_steps: int | None = None, mlp_steps: int | None = None) -> None:
        """Change the recursion depth T of CEM layers on a built or trained model (no retraining)."""
        for m in self.descent_layers():
            new = attn_steps if isinstance(m, CEMAttention) else mlp_steps
            if new is None:
                new = steps
            if new is not None:
                m.steps = new

    def live_steps(self) -> dict:
        """attn_steps / attn_step_size / mlp_steps / mlp_step_size as the CEM layers hold them now."""
        out: dict = {}
        for kind, is_attn in (("attn", True), ("mlp", False)):
            layers = [m for m in self.descent_layers() if isinstance(m, CEMAttention) == is_attn]
            if not layers:
                continue
            steps, sizes = {m.steps for m in layers}, {m.step_size for m in layers}
            if len(steps) > 1 or len(sizes) > 1:
                raise ValueError(
                    f"the {kind} CEM layers differ in steps {sorted(steps)} or step size {sorted(sizes)}; "
                    "a config holds one value per sublayer kind"
                )
            out[f"{kind}_steps"], out[f"{kind}_step_size"] = steps.pop(), sizes.pop()
        return out

    def current_config(self) -> ModelConfig:
        """The config with the recursion depths and step sizes the CEM layers run now (test-time changes)."""
        return self.config.replace(**self.live_steps())

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        steps: int | None = None,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """Sample continuations with the cache; see `cem.model.generate.generate`."""
        from .generate import generate

        return generate(self, prompt_ids, max_new_tokens, temperature, top_k, top_p, steps, generator)
