"""Hugging Face integration: cem models as `transformers` models, Llama export, lm-evaluation-harness.

    import cem.hf                                   # registers the "cem" model type with the Auto classes
    hf = cem.hf.to_hf(model)                        # CEMForCausalLM sharing model's parameters
    cem.hf.export_hf(model, "out/")                 # LlamaForCausalLM format for plain Llama, else CEM format
    AutoModelForCausalLM.from_pretrained("out/")    # either format (CEM: after `import cem.hf`, or
                                                    # trust_remote_code=True with the shim export_hf writes)

Needs `transformers` (the `hf` extra); see docs/huggingface.md.
"""

try:
    import transformers  # noqa: F401
except ImportError as e:  # pragma: no cover - exercised only without transformers
    raise ImportError("cem.hf needs the transformers package: pip install -e '.[hf]' in the cem clone (or pip install transformers)") from e

from .cache import HFCache, RowCache
from .export import export_hf
from .llama_export import export_llama, import_llama, is_plain_llama
from .modeling import CEMConfig, CEMForCausalLM, causal_lm_loss, from_hf, register, to_hf

register()

__all__ = [
    "CEMConfig",
    "CEMForCausalLM",
    "HFCache",
    "RowCache",
    "causal_lm_loss",
    "export_hf",
    "export_llama",
    "from_hf",
    "import_llama",
    "is_plain_llama",
    "register",
    "to_hf",
]
