"""`parse_corpus` reads a corpus spec (a known name, a local path, or `hf:NAME[:CONFIG]`) into a `CorpusSpec`,
once; `load_corpus` turns one into a `Corpus`."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from cem.data.corpus import CORPUS_KINDS, HF_PREFIX, SPLITS, Corpus, CorpusSpec
from cem.data.fsutil import cache_root
from cem.data.hub import load_hf
from cem.data.local import load_local
from cem.data.named import (
    load_enwik8,
    load_python_stdlib,
    load_shakespeare,
    load_tinyshakespeare,
    load_tinystories,
    load_wikitext2,
)

__all__ = ["CORPUS_KINDS", "KNOWN_CORPORA", "SPLITS", "Corpus", "CorpusSpec", "load_corpus", "parse_corpus", "prepared_data_dir", "resolve_data_dir"]

_LOADERS: dict[str, Callable[[Path], Corpus]] = {
    "shakespeare": lambda data_dir: load_shakespeare(),
    "python-stdlib": lambda data_dir: load_python_stdlib(),
    "wikitext-2": load_wikitext2,
    "tinyshakespeare": load_tinyshakespeare,
    "tinystories": load_tinystories,
    "enwik8": load_enwik8,
}
KNOWN_CORPORA = tuple(_LOADERS)


def parse_corpus(spec: str | Path | CorpusSpec) -> CorpusSpec:
    """The `CorpusSpec` of `spec` (one already parsed is returned as it is): "hf" for `hf:NAME[:CONFIG]`, "named"
    for one of KNOWN_CORPORA, else "local"; ValueError for an `hf:` spec without a NAME."""
    if isinstance(spec, CorpusSpec):
        return spec
    text = os.fspath(spec)
    if text.startswith(HF_PREFIX):
        name, _, config = text.removeprefix(HF_PREFIX).partition(":")
        if not name:
            raise ValueError(f"expected 'hf:NAME' or 'hf:NAME:CONFIG', got {text!r}")
        return CorpusSpec(text, "hf", name, config or None)
    return CorpusSpec(text, "named" if text in _LOADERS else "local")


def prepared_data_dir() -> Path:
    """Where `cem data prepare` puts corpora when no data directory is named: `<cache root>/data`
    (`$CEM_CACHE_DIR/data`, else `~/.cache/cem/data`)."""
    return cache_root() / "data"


def prepare_target(data_dir: str | Path | None = None) -> Path:
    """The directory `cem data prepare` writes to: the argument, else `$CEM_DATA_DIR`, else `prepared_data_dir()`."""
    if data_dir is not None:
        return Path(data_dir).expanduser()
    env = os.environ.get("CEM_DATA_DIR")
    return Path(env).expanduser() if env else prepared_data_dir()


def resolve_data_dir(data_dir: str | Path | None = None, corpus: str | None = None) -> Path:
    """The data directory: the argument, else `$CEM_DATA_DIR`, else `./data` when it holds `corpus`'s folder
    (or exists, when no corpus is named), else `prepared_data_dir()` (where `cem data prepare` writes)."""
    if data_dir is not None or os.environ.get("CEM_DATA_DIR"):
        return prepare_target(data_dir)
    local = Path("data")
    if (local / corpus).is_dir() if corpus else local.is_dir():
        return local
    return prepared_data_dir()


def load_corpus(
    spec: str | Path | CorpusSpec, data_dir: str | Path | None = None, hf_max_docs: int | None = None, hf_max_bytes: int | None = None, encoding: str = "utf-8"
) -> Corpus:
    """Load a corpus by spec.

    `spec` is one of KNOWN_CORPORA (files looked up under `resolve_data_dir(data_dir)`),
    a local `.txt`/`.jsonl`/`.parquet` file or a directory of them, or `hf:NAME[:CONFIG]`
    for a Hugging Face dataset streamed for at most `hf_max_docs` documents per split and `hf_max_bytes`
    bytes of training text (`hub.load_hf`; None: no limit). `encoding` is that of
    local text files (a file that does not decode is refused).
    """
    spec = parse_corpus(spec)
    if spec.kind == "named":
        return _LOADERS[spec.text](resolve_data_dir(data_dir, spec.text))
    if spec.is_hf:
        return load_hf(spec, hf_max_docs, hf_max_bytes)
    path = spec.path
    if path.exists():
        return load_local(path, encoding)
    if os.sep in spec.text or path.suffix:
        raise FileNotFoundError(f"corpus path {spec.text!r} does not exist")
    raise ValueError(
        f"unknown corpus {spec.text!r}: use one of {', '.join(KNOWN_CORPORA)}, a path to a "
        ".txt/.jsonl/.parquet file or a directory of them, or hf:NAME[:CONFIG]"
    )
