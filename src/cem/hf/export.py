"""`export_hf`: write any cem model as a Hugging Face checkpoint directory.

A plain Llama (Llama attention with RoPE, SwiGLU MLP, no reuse) goes out in the native
`transformers.LlamaForCausalLM` format, loadable anywhere without cem. Every other model goes out in the
CEM format (`model_type: "cem"`): `AutoModelForCausalLM.from_pretrained(dir)` loads it after `import cem.hf`,
or with `trust_remote_code=True` through a two-line `modeling_cem.py` shim that imports `cem.hf` (so the
`cem` package must still be installed where the model is loaded; nothing from cem is copied).
"""

from __future__ import annotations

from pathlib import Path

from ..data.tokenizers import EOT_TOKEN, ByteTokenizer, HFTokenizer, Tokenizer
from ..model import LanguageModel
from .llama_export import export_llama, is_plain_llama
from .modeling import to_hf

REMOTE_CODE_FILE = "modeling_cem.py"
AUTO_MAP = {
    "AutoConfig": "modeling_cem.CEMConfig",
    "AutoModelForCausalLM": "modeling_cem.CEMForCausalLM",
}
_SHIM = '''"""Loads this checkpoint with the installed cem package (pip install "cem-transformers[hf]"; the unrelated PyPI package `cem` also installs a module named cem); written by cem.hf.export_hf."""

from cem.hf.modeling import CEMConfig, CEMForCausalLM

__all__ = ["CEMConfig", "CEMForCausalLM"]
'''


def export_hf(
    model: LanguageModel,
    out_dir: str | Path,
    *,
    tokenizer=None,
    format: str = "auto",
    remote_code: bool = True,
    bos_token_id: int | None = None,
    eos_token_id: int | None = None,
    pad_token_id: int | None = None,
) -> Path:
    """Write `model` to `out_dir` as a Hugging Face checkpoint; returns the directory.

    format: "auto" (Llama format for a plain Llama, else CEM), "llama" (ValueError if not a plain Llama)
    or "cem". remote_code: for the CEM format, also write `modeling_cem.py` and `auto_map` so that
    `trust_remote_code=True` loads it without an explicit `import cem.hf`. The tokenizer, when given, is
    saved alongside and its special token ids fill the ids not given; a cem tokenizer (a run's, e.g.
    `RunDir(run).load_tokenizer()`) is converted with `to_transformers_tokenizer` so that `AutoTokenizer`
    loads the directory.
    """
    if format not in ("auto", "llama", "cem"):
        raise ValueError(f"format must be 'auto', 'llama' or 'cem', got {format!r}")
    if isinstance(tokenizer, Tokenizer):
        tokenizer = to_transformers_tokenizer(tokenizer)
    ids = {"bos_token_id": bos_token_id, "eos_token_id": eos_token_id, "pad_token_id": pad_token_id}
    if format == "llama" or (format == "auto" and is_plain_llama(model)):
        return export_llama(model, out_dir, tokenizer=tokenizer, **ids)
    out = Path(out_dir)
    hf = to_hf(model)
    for key, value in ids.items():
        if value is None and tokenizer is not None:
            value = getattr(tokenizer, key, None)
        if value is not None:
            setattr(hf.config, key, value)
            setattr(hf.generation_config, key, value)
    if remote_code:
        hf.config.auto_map = dict(AUTO_MAP)
    hf.save_pretrained(out)
    if remote_code:
        (out / REMOTE_CODE_FILE).write_text(_SHIM)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    return out



def to_transformers_tokenizer(tokenizer: Tokenizer):
    """A `transformers.PreTrainedTokenizerFast` with the same ids as a cem tokenizer; its end-of-text token
    is the eos (and pad) token. The byte tokenizer becomes a byte-level BPE without merges (ids 0-255 are
    the bytes, 256 is "<|endoftext|>"), so that `AutoTokenizer` reads it without cem."""
    import tokenizers as tk
    from transformers import PreTrainedTokenizerFast

    if isinstance(tokenizer, ByteTokenizer):
        alphabet = _bytes_to_unicode()
        backend = tk.Tokenizer(tk.models.BPE(vocab={alphabet[b]: b for b in range(256)}, merges=[]))
        backend.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        backend.decoder = tk.decoders.ByteLevel()
        backend.add_special_tokens([tk.AddedToken(EOT_TOKEN, special=True)])
        eot = EOT_TOKEN
    elif isinstance(tokenizer, HFTokenizer):
        backend = tk.Tokenizer.from_str(tokenizer.backend.to_str())
        eot = backend.id_to_token(tokenizer.eot_id)
    else:
        raise ValueError(f"cannot convert a {type(tokenizer).__name__} to a transformers tokenizer")
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=eot, pad_token=eot, bos_token=eot)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map, the alphabet of the ByteLevel pre-tokenizer."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {b: chr(b) for b in printable} | {b: chr(256 + i) for i, b in enumerate(others)}
