"""Document streams of a corpus of any size, per split, one document at a time (`cem data prepare` reads
them into token shards; `load_corpus` holds a small corpus whole instead).

A source is `hf:NAME[:CONFIG]` (Hugging Face `datasets`, streamed) or a local `.txt`/`.jsonl`/`.parquet`
file or folder of them. Splits follow `load_corpus` where they are named (train/valid/test files of a
folder; a dataset's "train", "validation"/"valid"/"dev" and "test"); otherwise, since a stream cannot be
ranked as a whole, each document goes to a split by the hash of its key (`splitting.split_of`: about 1%
valid, 1% test), and a dataset with one held-out split gives its even-numbered documents to valid and
its odd-numbered ones to test. `documents(split)` starts a fresh stream each call, always in the same order;
`documents(split, resume=stream.position())` continues a stream where it stood (a dataset split read
directly, through `datasets`' `IterableDataset.state_dict`: whole files already read are not read again).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from cem.data.hub import held_out_names, open_hf, texts
from cem.data.local import SUFFIXES, split_files, iter_documents, split_text
from cem.data.splitting import split_of

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


def open_streams(spec: str, encoding: str = "utf-8") -> DocumentStreams:
    """`documents(split)` for the source `spec`; ValueError / FileNotFoundError naming it when it cannot be read."""
    if spec.startswith("hf:"):
        return _hf_streams(spec)
    path = Path(spec).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"corpus path {spec!r} does not exist (expected hf:NAME[:CONFIG] or a local file or folder)")
    return _local_streams(path, encoding)


def _hashed(keyed: Callable[[], Iterator[tuple[str, str]]], split: str) -> Iterator[str]:
    """The documents of `split` among the (key, document) pairs, by the hash of their keys."""
    return (doc for key, doc in keyed() if split_of(key, VALID_FRAC, TEST_FRAC) == split)


def _local_streams(path: Path, encoding: str) -> DocumentStreams:
    if path.is_dir():
        named = split_files(path)
        if named:
            return lambda split, resume=None: Stream(iter_documents(named[split], encoding))
        files = sorted(p for p in path.rglob("*") if p.suffix in SUFFIXES and p.is_file())
        if not files:
            raise ValueError(f"{path}: directory holds no {', '.join(SUFFIXES)} files")
    else:
        files = [path]

    def keyed() -> Iterator[tuple[str, str]]:
        for file in files:
            rel = file.relative_to(path).as_posix() if path.is_dir() else file.name
            docs = iter_documents(file, encoding)
            if file.suffix == ".txt" and not path.is_dir():  # one text file: its paragraphs (or lines)
                docs = iter(split_text(next(docs)))
            yield from ((f"{rel}#{i}", doc) for i, doc in enumerate(docs))

    return lambda split, resume=None: Stream(_hashed(keyed, split))


def _hf_streams(spec: str) -> DocumentStreams:
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
