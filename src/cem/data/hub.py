"""Corpora streamed with Hugging Face `datasets`: `hf:NAME` or `hf:NAME:CONFIG` (NAME may be a local directory)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

from cem.data.corpus import SPLITS, Corpus, CorpusSpec
from cem.data.splitting import hash_split

_VALID_NAMES = ("validation", "valid", "dev")
VALID_FRAC = TEST_FRAC = 0.01


HELD_OUT_FRACTION = 0.02  # held-out splits stream at most this fraction of train's byte limit (at least 1 MB)


def load_hf(spec: CorpusSpec, max_docs: int | None = None, max_bytes: int | None = None) -> Corpus:
    """The `text` of the leading rows per split of `datasets.load_dataset(NAME, CONFIG, streaming=True)`:
    at most `max_docs` rows, and rows until `max_bytes` bytes of text for train (HELD_OUT_FRACTION of it,
    at least 1 MB, for the held-out splits). Rows are streamed, so only what is taken is downloaded.

    Splits: train <- "train"; valid <- "validation"/"valid"/"dev"; test <- "test". With only
    one of valid/test, that split's documents are halved in order (first half valid). With
    neither, train's documents are hashed 98/1/1 by index, like a local directory.
    """
    if max_docs is not None and max_docs < 1:
        raise ValueError(f"hf_max_docs must be at least 1, got {max_docs}")
    if max_bytes is not None and max_bytes < 1:
        raise ValueError(f"hf_max_bytes must be at least 1, got {max_bytes}")
    held_bytes = None if max_bytes is None else max(1_000_000, int(HELD_OUT_FRACTION * max_bytes))
    streams = open_hf(spec)
    train = _take_text(streams["train"], max_docs, max_bytes, f"{spec} train")
    held_out = [_take_text(streams[s], max_docs, held_bytes, f"{spec} {s}") for s in held_out_names(streams)]
    if len(held_out) == 2:
        splits = {"train": train, "valid": held_out[0], "test": held_out[1]}
    elif len(held_out) == 1:
        docs = held_out[0]
        if len(docs) < 2:
            raise ValueError(f"{spec}: the only held-out split has {len(docs)} document; need 2 to halve it")
        half = (len(docs) + 1) // 2
        splits = {"train": train, "valid": docs[:half], "test": docs[half:]}
    else:
        parts = hash_split([str(i) for i in range(len(train))], VALID_FRAC, TEST_FRAC, source=spec.text)
        splits = {s: [train[i] for i in parts[s]] for s in SPLITS}
    return Corpus(spec.text, splits)


def open_hf(spec: CorpusSpec) -> dict:
    """`datasets.load_dataset(NAME, CONFIG, streaming=True)` for `hf:NAME[:CONFIG]`: its splits as streams of
    rows (nothing is downloaded until rows are read); ValueError naming the spec when it cannot be opened or
    has no train split."""
    try:
        import datasets  # imported here: slow to import and only needed for hf: corpora
    except ImportError:
        raise ValueError(f"{spec}: hf: corpora need the datasets package (pip install datasets)") from None
    try:
        streams = datasets.load_dataset(spec.name, spec.config, streaming=True)
    except Exception as e:  # noqa: BLE001 - offline, unknown dataset, bad config: datasets raises many kinds
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ValueError(f"{spec}: datasets.load_dataset could not open it (offline, or no such dataset/config?): {type(e).__name__}: {first}") from None
    if "train" not in streams:
        raise ValueError(f"{spec}: dataset has no 'train' split (splits: {list(streams)})")
    return streams


def held_out_names(streams: dict) -> list[str]:
    """The dataset's held-out splits in the order valid, test: its first of "validation"/"valid"/"dev", and "test"."""
    return [s for s in _VALID_NAMES if s in streams][:1] + (["test"] if "test" in streams else [])


def texts(rows: Iterable[dict], source: str) -> Iterator[str]:
    """The `text` field of each row; ValueError naming `source` at a row without one."""
    for row in rows:
        text = row.get("text")
        if not isinstance(text, str):
            raise ValueError(f"{source}: rows need a string field 'text' (fields: {sorted(row)})")
        yield text


def _take_text(rows: Iterable[dict], max_docs: int | None, max_bytes: int | None, source: str) -> list[str]:
    """The `text` field of the first `max_docs` rows, stopping once `max_bytes` bytes of text are taken."""
    docs, size = [], 0
    for text in itertools.islice(texts(rows, source), max_docs):
        docs.append(text)
        size += len(text.encode("utf-8"))
        if max_bytes is not None and size >= max_bytes:
            break
    return docs
