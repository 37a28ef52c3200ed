"""Token shards: a corpus split tokenised once into a memory-mapped `.bin` file with a `.json` description."""

from __future__ import annotations

import hashlib
import itertools
import json
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from cem.data.chunking import pieces
from cem.data.corpus import SPLITS, Corpus
from cem.data.fsutil import cache_root
from cem.io import atomic_write, read_json, sha256_file
from cem.data.tokenizers import Tokenizer

FORMAT_VERSION = 1
BATCH_CHARS = 4_000_000  # characters handed to one encode_batch call


@dataclass(frozen=True)
class TokenSplit:
    """Token ids of one split (each document followed by end-of-text) and the byte size of its text."""

    name: str
    tokens: np.ndarray
    n_bytes: int

    @property
    def n_tokens(self) -> int:
        """Number of tokens in the split."""
        return len(self.tokens)


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (vocab_size <= 65536), else uint32."""
    return np.dtype(np.uint16 if vocab_size <= 2**16 else np.uint32)


def token_cache_dir(corpus: Corpus, tokenizer: Tokenizer, root: str | Path | None = None) -> Path:
    """Default shard directory `<root or cache_root()>/tokens/<corpus fingerprint>-<tokenizer name hash>`."""
    name_hash = hashlib.sha256(tokenizer.name.encode()).hexdigest()[:16]
    return Path(root or cache_root()) / "tokens" / f"{corpus.fingerprint()[:16]}-{name_hash}"


def build_split(
    corpus: Corpus, tokenizer: Tokenizer, split: str, cache_dir: str | Path | None = None
) -> TokenSplit:
    """Tokenise `split` into `<cache_dir>/<split>.bin` once; later calls memory-map the cached file.

    Documents are concatenated, each followed by `tokenizer.eot_id`, without padding. The
    `.bin` is written atomically before its `.json`, and a shard is trusted only when the
    `.json` matches the corpus fingerprint, the tokenizer name, the `.bin` size and its SHA-256 (else it
    is rebuilt).
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {list(SPLITS)}")
    cache_dir = Path(cache_dir) if cache_dir is not None else token_cache_dir(corpus, tokenizer)
    bin_path, meta_path = cache_dir / f"{split}.bin", cache_dir / f"{split}.json"
    expected = {
        "format": FORMAT_VERSION,
        "corpus": corpus.name,
        "corpus_fingerprint": corpus.fingerprint(),
        "split": split,
        "tokenizer": tokenizer.name,
        "dtype": token_dtype(tokenizer.vocab_size).name,
    }
    meta = _cached_meta(meta_path, bin_path, expected)
    if meta is None:
        with atomic_write(bin_path) as f:
            n_tokens = _write_tokens(f, corpus, tokenizer, split)
        meta = {**expected, "n_tokens": n_tokens, "n_bytes": corpus.n_bytes(split), "sha256": sha256_file(bin_path)}
        with atomic_write(meta_path) as f:
            f.write(json.dumps(meta, indent=2).encode("utf-8"))
    tokens = np.memmap(bin_path, dtype=meta["dtype"], mode="r", shape=(meta["n_tokens"],))
    return TokenSplit(f"{corpus.name}/{split}", tokens, meta["n_bytes"])


def _cached_meta(meta_path: Path, bin_path: Path, expected: dict) -> dict | None:
    """The shard's metadata if the cached files match `expected` and each other, else None."""
    if not (meta_path.is_file() and bin_path.is_file()):
        return None
    try:
        meta = read_json(meta_path)
    except ValueError:  # a damaged cache is rebuilt
        return None
    if any(meta.get(k) != v for k, v in expected.items()) or not isinstance(meta.get("n_tokens"), int):
        return None
    if bin_path.stat().st_size != meta["n_tokens"] * np.dtype(meta["dtype"]).itemsize:
        return None
    if meta.get("sha256") != sha256_file(bin_path):  # e.g. zeroed or edited in place at the right size
        return None
    return meta


def _write_tokens(f, corpus: Corpus, tokenizer: Tokenizer, split: str) -> int:
    """Encode the split batch by batch into the open binary file `f`; returns the token count."""
    docs = corpus.splits[split]
    n_tokens = 0
    with tqdm(
        total=sum(map(len, docs)),
        unit="char",
        unit_scale=True,
        desc=f"tokenising {corpus.name}/{split}",
        file=sys.stderr,
        delay=2.0,
    ) as progress:
        for batch, ends_doc in piece_batches(docs):
            array, _ = encode_pieces(tokenizer, batch, ends_doc)
            f.write(array.tobytes())
            n_tokens += array.size
            progress.update(sum(map(len, batch)))
    return n_tokens


def encode_pieces(tokenizer: Tokenizer, batch: list[str], ends_doc: list[bool]) -> tuple[np.ndarray, np.ndarray]:
    """Token ids of the pieces, end-of-text after each document's last piece (`ends_doc`), as one array in
    `token_dtype`, and the number of ids each piece gave (its end-of-text included); ValueError for an
    id outside the vocabulary."""
    ids = tokenizer.encode_batch(batch)
    flat = itertools.chain.from_iterable(
        (*piece_ids, tokenizer.eot_id) if end else piece_ids for piece_ids, end in zip(ids, ends_doc)
    )
    array = np.fromiter(flat, dtype=np.int64)
    if array.size and (array.min() < 0 or array.max() >= tokenizer.vocab_size):
        raise ValueError(f"tokenizer {tokenizer.name!r} produced ids outside [0, {tokenizer.vocab_size})")
    lengths = np.array([len(piece_ids) + end for piece_ids, end in zip(ids, ends_doc)], dtype=np.int64)
    return array.astype(token_dtype(tokenizer.vocab_size)), lengths


def piece_batches(docs: Iterable[str]) -> Iterator[tuple[list[str], list[bool]]]:
    """Batches of document pieces of about BATCH_CHARS characters, flagging each document's last piece."""
    batch: list[str] = []
    ends_doc: list[bool] = []
    size = 0
    for doc in docs:
        doc_pieces = list(pieces(doc))
        for i, piece in enumerate(doc_pieces):
            batch.append(piece)
            ends_doc.append(i == len(doc_pieces) - 1)
            size += len(piece)
            if size >= BATCH_CHARS:
                yield batch, ends_doc
                batch, ends_doc, size = [], [], 0
    if batch:
        yield batch, ends_doc
