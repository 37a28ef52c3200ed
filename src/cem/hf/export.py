"""`export_hf`: write any cem model as a Hugging Face checkpoint directory.

A plain Llama (Llama attention with RoPE, SwiGLU MLP, no reuse) goes out in the native
`transformers.LlamaForCausalLM` format, loadable anywhere without cem. Every other model goes out in the
CEM format (`model_type: "cem"`): `AutoModelForCausalLM.from_pretrained(dir)` loads it after `import cem.hf`,
or with `trust_remote_code=True` through a two-line `modeling_cem.py` shim that imports `cem.hf` (so the
`cem` package must still be installed where the model is loaded; nothing from cem is copied).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from ..io import atomic_write_text, fix_modes, staged_folder
from ..model import LanguageModel
from .llama_export import export_llama, is_plain_llama
from .modeling import to_hf
from .tokenizer import save_tokenizer, special_token_ids, transformers_tokenizer

REMOTE_CODE_FILE = "modeling_cem.py"
AUTO_MAP = {
    "AutoConfig": "modeling_cem.CEMConfig",
    "AutoModelForCausalLM": "modeling_cem.CEMForCausalLM",
}
_INSTALL = 'pip install -e ".[hf]" in the cem clone; the unrelated PyPI package `cem` also installs a module named cem'
_SHIM = f'''"""Loads this checkpoint with the installed cem package ({_INSTALL}); written by cem.hf.export_hf."""

from cem.hf.modeling import CEMConfig, CEMForCausalLM

__all__ = ["CEMConfig", "CEMForCausalLM"]
'''
MODEL_CARD = "README.md"
UNKNOWN_TYPE = "has model type `cem` but Transformers does not recognize this architecture"  # transformers' error without `import cem.hf`


def _model_card(remote_code: bool) -> str:
    """The export's README.md: how to load the CEM format, and what transformers says when `import cem.hf` is missing."""
    remote = ("\nOr, without the import, `from_pretrained(folder, trust_remote_code=True)` runs this folder's `modeling_cem.py`, "
              "which imports `cem.hf` (cem must be installed all the same).\n") if remote_code else ""
    return f"""---
library_name: transformers
tags:
- cem
---

# A CEM language model (Causal Energy Minimization), exported by cem

This folder is in the CEM format (`model_type: "cem"`), which stock transformers does not know: run
`import cem.hf` before `AutoModelForCausalLM.from_pretrained`. It registers the format with transformers'
Auto classes (cem is the cem-transformers package: {_INSTALL}).

```python
import cem.hf  # noqa: F401 - registers the CEM format with the Auto classes
from transformers import AutoModelForCausalLM, AutoTokenizer

model = AutoModelForCausalLM.from_pretrained("path/to/this/folder")
tokenizer = AutoTokenizer.from_pretrained("path/to/this/folder")  # stock transformers, no cem needed
```

Without `import cem.hf`, transformers stops with "The checkpoint you are trying to load {UNKNOWN_TYPE} ...
update Transformers": updating transformers does not help; `import cem.hf` does.
{remote}"""


def export_hf(
    model: LanguageModel,
    out_dir: str | Path,
    *,
    tokenizer=None,
    format: str = "auto",
    remote_code: bool = False,
    bos_token_id: int | None = None,
    eos_token_id: int | None = None,
    pad_token_id: int | None = None,
) -> Path:
    """Write `model` to `out_dir` as a Hugging Face checkpoint; returns the directory.

    format: "auto" (Llama format for a plain Llama, else CEM), "llama" (ValueError if not a plain Llama)
    or "cem". remote_code (off by default): for the CEM format, also write `modeling_cem.py` and `auto_map`
    so that `trust_remote_code=True` loads it without `import cem.hf`; off, the folder holds no code, and
    `AutoTokenizer` loads its tokenizer with stock `transformers` (with `auto_map` it asks to run code). The tokenizer, when given, is
    saved alongside and its special token ids fill the ids not given; a cem tokenizer (a run's, e.g.
    `RunDir(run).load_tokenizer()`) is converted with `hf.tokenizer.to_transformers_tokenizer` so that
    `AutoTokenizer` loads the directory.
    """
    if format not in ("auto", "llama", "cem"):
        raise ValueError(f"format must be 'auto', 'llama' or 'cem', got {format!r}")
    tokenizer = transformers_tokenizer(tokenizer)
    # both formats are written into a temp folder beside out_dir and moved in at the end (config.json last): an
    # export cut short (a full disk, a file size limit, Ctrl-C) leaves out_dir as it was, not a folder without weights
    with _quiet_progress():
        if format == "llama" or (format == "auto" and is_plain_llama(model)):
            return export_llama(model, out_dir, tokenizer=tokenizer, bos_token_id=bos_token_id, eos_token_id=eos_token_id, pad_token_id=pad_token_id)
        with staged_folder(out_dir) as tmp:
            _export_cem(model, tmp, tokenizer, remote_code, bos_token_id, eos_token_id, pad_token_id)
    return Path(out_dir)


@contextlib.contextmanager
def _quiet_progress():
    """No "Writing model shards" progress bar from transformers' save_pretrained (one small file, and a
    command's stderr stays one line on failure); the previous setting comes back afterwards."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def _export_cem(model: LanguageModel, out: Path, tokenizer, remote_code: bool, bos_token_id, eos_token_id, pad_token_id) -> None:
    hf = to_hf(model)
    for key, value in special_token_ids(tokenizer, bos_token_id, eos_token_id, pad_token_id).items():
        if value is not None:
            setattr(hf.config, key, value)
            setattr(hf.generation_config, key, value)
    if remote_code:
        hf.config.auto_map = dict(AUTO_MAP)
    hf.save_pretrained(out)
    atomic_write_text(out / MODEL_CARD, _model_card(remote_code))
    fix_modes(out)
    if remote_code:
        atomic_write_text(out / REMOTE_CODE_FILE, _SHIM)  # a planted link is replaced, not written through
    if tokenizer is not None:
        save_tokenizer(tokenizer, out, model.config.context)
