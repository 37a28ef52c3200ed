"""`transformers` wrappers for cem models: `CEMConfig`, `CEMForCausalLM`, `to_hf` and `from_hf`.

`CEMForCausalLM` holds a `cem.model.LanguageModel` under `.model` and calls it: there is no second copy of the
maths here. Through it a cem model gets `save_pretrained` / `AutoModelForCausalLM.from_pretrained`
(safetensors), the `transformers` generation API, and anything built on them (lm-evaluation-harness's HFLM).

`generate()` runs on cem's own cache (`cem.hf.cache.HFCache`, a `cem.model.Cache`): keys only for CEM
attention (with a key-query diagonal ĥ only, the same bytes), keys and values for Llama attention. The forward pass creates it
on the first call of a `generate` (with `use_cache=True`), returns it as `cache` (`past_key_values` before transformers 5.24), and `generate` hands
it back on every later step; the class opts out of `transformers`' default `DynamicCache`
(`_supports_default_dynamic_cache`), the route `transformers` keeps for models that bring their own cache.

Importing `cem.hf` registers the `"cem"` model type with `AutoConfig` and `AutoModelForCausalLM`.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import torch
from torch import Tensor
from transformers import AutoConfig, AutoModelForCausalLM, GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from ..layers import CEMAttention, Preconditioner
from ..layers.steps import Inference, StepSize
from ..model import Cache, LanguageModel, ModelConfig
from ..model.config import FLAT
from ..model.loss import next_token_loss
from .cache import HFCache, RowCache
from .llama_export import import_llama

try:  # the base class of transformers' own caches (DynamicCache, StaticCache, ...)
    from transformers.cache_utils import Cache as _TransformersCache
except ImportError:  # pragma: no cover - very old transformers
    _TransformersCache = ()

MODEL_TYPE = "cem"
# the output's cache field: `cache` since transformers 5.24 (`past_key_values` then warns on every forward), before it `past_key_values`
CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"
MODEL_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(ModelConfig))


class CEMConfig(PretrainedConfig):
    """A `transformers` config carrying every field of `cem.model.ModelConfig` under the same name (its nested
    parts as mappings, `ModelConfig.to_dict`; an older export's flat keys, `cem.model.FLAT`, are read too).

    The usual `transformers` names read (and write) the cem fields: `hidden_size` is `dim`,
    `num_hidden_layers` `n_layers`, `num_attention_heads` `n_heads`, `intermediate_size` `hidden_dim`,
    `max_position_embeddings` `context`, `rms_norm_eps` `norm_eps`, `initializer_range` `init_std` and
    `tie_word_embeddings` `tie_embeddings`. Values are validated as `ModelConfig` validates them.
    """

    model_type = MODEL_TYPE
    keys_to_ignore_at_inference = ["past_key_values", "cache"]
    attribute_map = {
        "hidden_size": "dim",
        "num_hidden_layers": "n_layers",
        "num_attention_heads": "n_heads",
        "intermediate_size": "hidden_dim",
        "max_position_embeddings": "context",
        "rms_norm_eps": "norm_eps",
        "initializer_range": "init_std",
        "tie_word_embeddings": "tie_embeddings",
    }

    def __init__(self, **kwargs) -> None:
        for hf_name, name in type(self).attribute_map.items():
            if hf_name in kwargs:
                value = kwargs.pop(hf_name)
                if name in kwargs and kwargs[name] != value:
                    raise ValueError(f"conflicting values for {name} ({kwargs[name]!r}) and {hf_name} ({value!r})")
                kwargs[name] = value
        cfg = ModelConfig.from_dict({name: kwargs.pop(name) for name in (*MODEL_FIELDS, *FLAT) if name in kwargs})  # validated
        for name, value in cfg.to_dict().items():
            setattr(self, name, value)
        # passed explicitly: older transformers default tie_word_embeddings to True in the base __init__
        super().__init__(tie_word_embeddings=cfg.tie_embeddings, **kwargs)

    def __getattr__(self, name: str):
        """A flat key (`cem.model.FLAT`, e.g. `attn_steps`) reads the nested setting it spells (so that
        `from_pretrained(path, attn_precond="diag")` finds it, as transformers looks for a config attribute)."""
        if name in FLAT and "attn" in self.__dict__:
            return self.to_model_config().flat(name)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def __setattr__(self, name: str, value) -> None:
        if name in FLAT and "attn" in self.__dict__ and not (name in MODEL_FIELDS and not isinstance(value, str)):
            for key, part in self.to_model_config().replace(**{name: value}).to_dict().items():  # validated
                super().__setattr__(key, part)
            return
        super().__setattr__(name, value)

    def to_model_config(self) -> ModelConfig:
        """The `cem.model.ModelConfig` of this config."""
        return ModelConfig.from_dict({name: getattr(self, name) for name in MODEL_FIELDS if hasattr(self, name)})

    @classmethod
    def from_model_config(cls, cfg: ModelConfig, **kwargs) -> "CEMConfig":
        """A `CEMConfig` with every field of `cfg` (and any extra `transformers` config keyword)."""
        return cls(**cfg.to_dict(), **kwargs)


class CEMPreTrainedModel(PreTrainedModel):
    config_class = CEMConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _no_split_modules = ["Block"]
    # gradient_checkpointing_enable() / activation_checkpointing_enable() set `Block.gradient_checkpointing`:
    # cem's own per-block checkpointing (`LanguageModel.set_activation_checkpointing("layer")`)
    supports_gradient_checkpointing = True

    @torch.no_grad()
    def _init_weights(self, module) -> None:
        """The init of `LanguageModel` (normal(0, init_std) for linear and embedding weights, RMSNorm gains 1,
        the CEM layers' own tensors by their `reset_parameters`: key-query diagonal and self bias 0,
        preconditioners, step gains 1).

        Only `transformers` calls this: on a model built from a config (where `LanguageModel` has already
        initialised every tensor, so this redraws the same distribution) and for tensors a checkpoint lacks,
        e.g. `from_pretrained(export, attn_precond="diag", learn_step_size=True)` (issue 20: they were left
        as uninitialised memory). `from_pretrained(..., output_loading_info=True)` lists them.
        """
        std = self.config.init_std
        if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
            torch.nn.init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, torch.nn.RMSNorm) and module.weight is not None:
            torch.nn.init.ones_(module.weight)
        elif isinstance(module, (CEMAttention, Preconditioner, StepSize)):
            module.reset_parameters()


class CEMForCausalLM(CEMPreTrainedModel, GenerationMixin):
    """A cem `LanguageModel` (under `.model`) as a `transformers` causal LM.

    `forward(input_ids, labels=None, cache=None, use_cache=None, attention_mask=None)` (`past_key_values`: the old name of `cache`) returns a
    `CausalLMOutputWithPast`: logits of every position, the loss when `labels` are given (the usual
    `transformers` shift: position i predicts labels[i + 1]; label -100 is ignored), and the cem cache as
    `cache` (`CACHE_FIELD`) when one is used (`use_cache=True`, or a cache passed in).
    """

    _tied_weights_keys = {"model.head.weight": "model.embed.weight"}

    def __init__(self, config: CEMConfig) -> None:
        super().__init__(config)
        self.model = LanguageModel(config.to_model_config())
        self.post_init()

    # -- transformers plumbing ------------------------------------------------------------------------------
    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        # The model brings its own cache (created by forward on the first generate step, like Mamba's).
        return False

    def get_input_embeddings(self) -> torch.nn.Embedding:
        return self.model.embed

    def set_input_embeddings(self, value: torch.nn.Embedding) -> None:
        self.model.embed = value

    def get_output_embeddings(self) -> torch.nn.Linear:
        return self.model.head

    def set_output_embeddings(self, value: torch.nn.Linear) -> None:
        self.model.head = value

    def new_cache(self, max_len: int | None = None) -> HFCache:
        """An empty cem cache (first allocation `max_len` positions, growing up to the context)."""
        context = self.config.context
        return HFCache(min(max_len or context, context), limit=context)

    def set_inference(self, inference: Inference) -> None:
        """`LanguageModel.set_inference` (T, adaptive and energy-guarded steps) on the wrapped model, then
        `sync_config`: later `generate` and forward calls use it, and `save_pretrained` saves it."""
        self.model.set_inference(inference)
        self.sync_config()

    def test_time(self, inference: Inference):
        """`LanguageModel.test_time` on the wrapped model: an `Inference` for one `with` block (`config`
        unchanged, as the model has its own back afterwards)."""
        return self.model.test_time(inference)

    def steps_used(self) -> dict:
        """`LanguageModel.steps_used`: average recursion steps per position since `reset_steps_used`."""
        return self.model.steps_used()

    def reset_steps_used(self) -> None:
        self.model.reset_steps_used()

    def sync_config(self) -> CEMConfig:
        """Copy the live recursion depths, step sizes and inference options of the CEM layers (changed
        with `set_inference` or by hand) into `config`, so that a saved model reloads as it runs now."""
        for name, value in self.model.current_config().to_dict().items():
            setattr(self.config, name, value)
        return self.config

    def save_pretrained(self, save_directory, *args, **kwargs):
        self.sync_config()
        return super().save_pretrained(save_directory, *args, **kwargs)

    # -- forward --------------------------------------------------------------------------------------------
    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        past_key_values=None,
        inputs_embeds: Tensor | None = None,
        labels: Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ):
        if past_key_values is None:  # transformers >= 5.24 passes the cache as `cache` (past_key_values deprecated)
            past_key_values = kwargs.pop("cache", None)
        if inputs_embeds is not None:
            raise ValueError("CEMForCausalLM takes token ids only (input_ids), not inputs_embeds")
        if input_ids is None:
            raise ValueError("CEMForCausalLM needs input_ids")
        if output_attentions or output_hidden_states:
            raise ValueError("CEMForCausalLM returns neither attentions nor hidden states")
        past = 0 if not isinstance(past_key_values, Cache) else past_key_values.length
        padding = _padding_kind(attention_mask, input_ids, past)
        cache = self._resolve_cache(past_key_values, use_cache, input_ids, rows=padding == "left")
        if isinstance(cache, RowCache) or padding == "left":
            logits = self._forward_rows(input_ids, _new_token_mask(attention_mask, input_ids), cache)
        else:
            if padding == "right" and cache is not None:
                raise ValueError("right-padded batches cannot be cached: pad on the left to generate")
            _check_position_ids(kwargs.pop("position_ids", None), input_ids, cache)
            logits = self.model(input_ids, cache=cache)

        loss = None
        if labels is not None:
            loss = causal_lm_loss(logits, labels, kwargs.get("num_items_in_batch"))
        out = CausalLMOutputWithPast(loss=loss, logits=logits, **{CACHE_FIELD: cache})
        if return_dict is None:
            return_dict = getattr(self.config, "return_dict", True)
        return out if return_dict else out.to_tuple()

    def _resolve_cache(self, past_key_values, use_cache: bool | None, input_ids: Tensor, rows: bool = False):
        """The cem cache to run with: the one passed in, a new one if `use_cache` (one per row for a
        left-padded batch), or None."""
        first = _first_allocation(input_ids.shape[1], self.config.context)
        if past_key_values is not None:
            if isinstance(past_key_values, Cache):  # HFCache, RowCache, or a plain cem cache (fine for forward)
                if rows and not isinstance(past_key_values, RowCache):
                    if past_key_values.length:
                        raise ValueError("a left-padded batch needs a RowCache (or no cache), not a filled HFCache")
                    return RowCache(input_ids.shape[0], first, limit=self.config.context)
                return past_key_values
            if isinstance(past_key_values, _TransformersCache) and past_key_values.get_seq_length() == 0:
                # a transformers cache created for us (by a transformers version that ignores
                # _supports_default_dynamic_cache): replace it, empty, by cem's own
                use_cache = True
            else:
                raise TypeError(
                    "past_key_values must be a cem cache (CEMForCausalLM.new_cache()), "
                    f"got {type(past_key_values).__name__}"
                )
        if not use_cache:
            return None
        if rows:
            return RowCache(input_ids.shape[0], first, limit=self.config.context)
        return self.new_cache(first)

    def _forward_rows(self, ids: Tensor, real: Tensor, cache: RowCache | None) -> Tensor:
        """Logits of a left-padded batch, one row at a time on its real tokens (zeros at padding)."""
        batch, n = ids.shape
        logits = None
        for r in range(batch):
            k = int(real[r].sum())
            if k and not bool(real[r, n - k :].all()):
                raise ValueError(_MASK_ERROR)
            row_cache = None if cache is None else cache.rows[r]
            if row_cache is not None and row_cache.length and k != n:
                raise ValueError(_MASK_ERROR)
            if k == 0:
                continue
            out = self.model(ids[r : r + 1, n - k :], cache=row_cache)[0]
            if logits is None:
                logits = out.new_zeros(batch, n, out.shape[-1])
            logits[r, n - k :] = out
        if logits is None:  # every row all padding
            logits = self.model.head.weight.new_zeros(batch, n, self.config.vocab_size)
        if cache is not None:
            cache.padded_length += n
        return logits


_MASK_ERROR = (
    "cem models take no general attention mask: a batch may be right-padded (scoring without a cache) or "
    "left-padded (generation), with each row's real tokens contiguous"
)


def _padding_kind(mask: Tensor | None, ids: Tensor, past: int) -> str:
    """'none' (no mask or all ones), 'left' (each row zeros then ones) or 'right' (ones then zeros, no
    past); ValueError for any other mask. Left-padded batches run row by row, each on its real tokens."""
    if mask is None:
        return "none"
    if mask.dim() != 2 or mask.shape[0] != ids.shape[0] or mask.shape[1] not in (ids.shape[1], past + ids.shape[1]):
        raise ValueError(
            f"attention_mask must have shape (batch, seq) or (batch, cached + seq), got {tuple(mask.shape)} "
            f"for input_ids {tuple(ids.shape)} with {past} cached positions"
        )
    mask = mask.to(torch.bool)
    if bool(mask.all()):
        return "none"
    steps = mask.int().diff(dim=1)
    if bool((steps >= 0).all()):
        return "left"
    if bool((steps <= 0).all()) and bool(mask[:, 0].all()) and mask.shape[1] == ids.shape[1] and past == 0:
        return "right"
    raise ValueError(_MASK_ERROR)


def _new_token_mask(mask: Tensor | None, ids: Tensor) -> Tensor:
    """Which of the new tokens are real (True) rather than padding: the last seq columns of the mask."""
    if mask is None:
        return torch.ones_like(ids, dtype=torch.bool)
    return mask[:, -ids.shape[1] :].to(torch.bool)


def _first_allocation(n: int, context: int) -> int:
    """Positions to allocate for a cache whose first call brings `n` tokens (it doubles when full)."""
    return min(context, max(64, 2 * n))


def causal_lm_loss(logits: Tensor, labels: Tensor, num_items_in_batch: int | Tensor | None = None) -> Tensor:
    """Next-token cross-entropy in float32 with the `transformers` shift: logits[:, i] scores labels[:, i + 1].

    Labels equal to -100 are ignored. The mean is over the counted tokens, or over `num_items_in_batch`
    when given (the `transformers` Trainer's gradient-accumulation convention).
    """
    logits, target = logits[:, :-1], labels[:, 1:].to(logits.device)
    if num_items_in_batch is None:
        return next_token_loss(logits, target)
    total = next_token_loss(logits, target, reduction="sum")
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(total.device)
    return total / num_items_in_batch


def _check_position_ids(position_ids: Tensor | None, ids: Tensor, cache) -> None:
    """Positions are implied by the cache length; accept explicit ones only if they agree."""
    if position_ids is None:
        return
    start = 0 if cache is None else cache.length
    expected = torch.arange(start, start + ids.shape[1], device=position_ids.device)
    if not bool((position_ids == expected).all()):
        raise ValueError("cem models take positions from the cache; position_ids must be start, start + 1, ...")


def to_hf(model: LanguageModel) -> CEMForCausalLM:
    """Wrap `model` as a `CEMForCausalLM` that *shares* its parameters (no copy; deep-copy first if needed).

    The config is the model's, with the recursion depths and step sizes the CEM layers have now.
    """
    if not isinstance(model, LanguageModel):
        raise TypeError(f"to_hf expects a cem.model.LanguageModel, got {type(model).__name__}")
    cfg = model.current_config()
    config = CEMConfig.from_model_config(cfg)
    config.dtype = next(model.parameters()).dtype
    with torch.device("meta"):  # no allocation and no init: the tensors are model's
        hf = CEMForCausalLM(config)
    hf.model = model
    hf.train(model.training)
    return hf


def from_hf(source, map_location: str | torch.device = "cpu") -> LanguageModel:
    """A cem `LanguageModel` from a `CEMForCausalLM` (its `.model`, shared, not copied), or from a directory
    written by `save_pretrained` / `export_hf`: the CEM format, or the `LlamaForCausalLM` format of
    `export_llama` (converted by `import_llama`)."""
    if isinstance(source, CEMForCausalLM):
        return source.model
    if isinstance(source, PreTrainedModel):
        return import_llama(source)
    path = Path(source)
    model_type = AutoConfig.from_pretrained(path).model_type
    if model_type == "llama":
        return import_llama(path).to(map_location)
    if model_type != MODEL_TYPE:
        raise ValueError(f"{path} holds a {model_type!r} model; from_hf reads 'cem' and 'llama' directories")
    hf = CEMForCausalLM.from_pretrained(path)
    return hf.model.to(map_location)


def register() -> None:
    """Register `"cem"` with `AutoConfig` and `AutoModelForCausalLM` (done on `import cem.hf`; idempotent)."""
    AutoConfig.register(MODEL_TYPE, CEMConfig, exist_ok=True)
    AutoModelForCausalLM.register(CEMConfig, CEMForCausalLM, exist_ok=True)
