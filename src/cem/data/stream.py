"""Document streams of a corpus of any size, per split, one document at a time (`cem data prepare` reads
them into token shards; `load_corpus` holds a small corpus whole instead).

A source is `hf:NAME[:CONFIG]` (Hugging Face `datasets`, streamed) or a local `.txt`/`.jsonl`/`.parquet`
file or folder of them, read incrementally (a `.txt` file is cut into documents as `cem.data.local` says,
so one file of any size streams in bounded memory). Splits follow `load_corpus` where they are named
(train/valid/test files of a folder; a dataset's "train", "validation"/"valid"/"dev" and "test"). A folder
whose every file is one document is ranked by file like `load_corpus` (at least one file per split).
Otherwise, since a stream cannot be ranked as a whole, each document goes to a split by the hash of its key
(`splitting.split_of`: about 1% valid, 1% test), and a dataset with one held-out split gives its
even-numbered documents to valid and its odd-numbered ones to test. A local split left with fewer than 5
documents, or all from one file of several, is warned about when its stream ends. `documents(split)` starts
a fresh stream each call, always in the same order; `documents(split, resume=stream.position())` continues a
stream where it stood (a dataset split read directly, through `datasets`' `IterableDataset.state_dict`:
whole files already read are not read again).
"""

from __future__ import annotations

import codecs
import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from cem.data.corpora import parse_corpus
from cem.data.corpus import CorpusSpec
from cem.data.hub import held_out_names, open_hf, texts
from cem.data.local import corpus_files, is_one_document, iter_documents, split_files
from cem.data.splitting import hash_split, split_of, warn_thin_split

VALID_FRAC = TEST_FRAC = 0.01


class Stream:
    """The documents of one split, one at a time; `position()` says where the stream stands (after the
    documents taken so far) as JSON-able data to resume from, or None where the source cannot say."""

    def __init__(self, docs: Iterator[str], position: Callable[[], Any] | None = None) -> None:
        self._docs, self._position = docs, position

    def __iter__(self) -> Stream:
        return self

    def __next__(self) -> str:
        return next(self._docs)

    def position(self) -> Any:
        return None if self._position is None else self._position()


DocumentStreams = Callable[..., Stream]  # documents(split, resume=None)


def open_streams(spec: str | CorpusSpec, encoding: str = "utf-8", separator: str | None = None) -> DocumentStreams:
    """`documents(split)` for the source `spec` (`separator`: what ends a document in local `.txt` files,
    blank lines by default); ValueError / FileNotFoundError naming it when it cannot be read."""
    spec = parse_corpus(spec)
    if spec.is_hf:
        return _hf_streams(spec)
    try:
        codecs.lookup(encoding)
    except LookupError:
        raise ValueError(f"unknown encoding {encoding!r}") from None
    path = spec.path
    if not path.exists():
        raise FileNotFoundError(f"corpus path {spec.text!r} does not exist (expected hf:NAME[:CONFIG] or a local file or folder)")
    return _local_streams(path, encoding, separator)


def _hashed(keyed: Callable[[], Iterator[tuple[str, str]]], split: str) -> Iterator[str]:
    """The documents of `split` among the (key, document) pairs, by the hash of their keys."""
    return (doc for key, doc in keyed() if split_of(key, VALID_FRAC, TEST_FRAC) == split)


def _local_streams(path: Path, encoding: str, separator: str | None) -> DocumentStreams:
    named = split_files(path) if path.is_dir() else {}
    for split, file in named.items():  # before any split is written: an empty valid.txt is found in seconds, not after the train split
        if next((doc for doc in iter_documents(file, encoding, separator) if doc.strip()), None) is None:
            raise ValueError(f"{file} is empty (no text, or only blank lines): the {split} split of {path} needs some")
    if named:
        return lambda split, resume=None: Stream(iter_documents(named[split], encoding, separator))
    files = corpus_files(path)
    ranked = None  # a folder whose every file is one document: the split of each file, ranked as `load_local` does
    if path.is_dir() and all(is_one_document(f, separator) for _, f in files):
        parts = hash_split([f"{rel}#0" for rel, _ in files], VALID_FRAC, TEST_FRAC, source=str(path))
        ranked = {k: s for s, ks in parts.items() for k in ks}

    def split_docs(split: str) -> Iterator[str]:
        """The split's documents, then a warning if they are few or all from one file."""
        n, sources = 0, set()
        for k, (rel, file) in enumerate(files):
            if ranked is not None and ranked[k] != split:
                continue  # a file of another split: not read
            for i, doc in enumerate(iter_documents(file, encoding, separator, alone=not path.is_dir())):
                if ranked is not None or split_of(f"{rel}#{i}", VALID_FRAC, TEST_FRAC) == split:
                    n += 1
                    if len(sources) < 2:
                        sources.add(rel)
                    yield doc
        warn_thin_split(str(path), split, n, sources.pop() if len(sources) == 1 else None, len(files))

    return lambda split, resume=None: Stream(split_docs(split))


def _hf_streams(spec: CorpusSpec) -> DocumentStreams:
    streams = open_hf(spec)
    held_out = held_out_names(streams)

    def documents(split: str, resume: Any = None) -> Stream:
        if len(held_out) == 2 or split == "train" and len(held_out) == 1:
            name = "train" if split == "train" else held_out[("valid", "test").index(split)]
            rows = streams[name]
            if resume is not None:
                rows.load_state_dict(resume)
            return Stream(texts(rows, f"{spec} {name}"), getattr(rows, "state_dict", None))
        if held_out:  # one held-out split: even-numbered documents are valid, odd-numbered ones test
            only = texts(streams[held_out[0]], f"{spec} {held_out[0]}")
            return Stream(itertools.islice(only, 0 if split == "valid" else 1, None, 2))
        keyed = lambda: ((str(i), doc) for i, doc in enumerate(texts(streams["train"], f"{spec} train")))  # noqa: E731
        return Stream(_hashed(keyed, split))

    return documents
