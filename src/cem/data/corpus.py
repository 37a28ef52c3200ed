"""The `Corpus` container: a named set of documents for the train, valid and test splits; and `CorpusSpec`,
what names one (made by `cem.data.corpora.parse_corpus`)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

SPLITS = ("train", "valid", "test")
CORPUS_KINDS = ("named", "local", "hf")
HF_PREFIX = "hf:"


@dataclass(frozen=True)
class CorpusSpec:
    """A corpus spec, parsed once (`parse_corpus`): `text` as written (what names the corpus in records, shard
    folders and messages) and its `kind`: "named" (one of `KNOWN_CORPORA`), "local" (a file or folder, `path`)
    or "hf" (`hf:NAME[:CONFIG]`, a Hugging Face dataset streamed: `name` and `config`)."""

    text: str
    kind: str
    name: str = ""  # hf: the dataset NAME (an id, or a local directory)
    config: str | None = None  # hf: its CONFIG

    def __post_init__(self) -> None:
        if self.kind not in CORPUS_KINDS:
            raise ValueError(f"unknown corpus kind {self.kind!r}; expected one of {', '.join(map(repr, CORPUS_KINDS))}")

    @property
    def is_hf(self) -> bool:
        return self.kind == "hf"

    @property
    def label(self) -> str:
        """The text without the `hf:` prefix (NAME[:CONFIG] for a dataset)."""
        return self.text.removeprefix(HF_PREFIX) if self.is_hf else self.text

    def resolved(self) -> CorpusSpec:
        """A local spec named by its absolute path (as `cem train` records a local corpus)."""
        return CorpusSpec(str(self.path.resolve()), "local")

    @property
    def path(self) -> Path:
        """Where a local reading of the spec looks (a named corpus's text read as a path too, as before)."""
        return Path(self.text).expanduser()

    def __str__(self) -> str:
        return self.text


@dataclass
class Corpus:
    """Documents (plain strings) of a text corpus, per split.

    `encoding` is the byte encoding the text was read in; `n_bytes` counts bytes in it, so
    bits-per-byte is measured against the original files (UTF-8 everywhere except enwik8,
    which is read as latin-1 so that one character is one byte of the original file).
    """

    name: str
    splits: dict[str, list[str]]
    encoding: str = "utf-8"

    def __post_init__(self) -> None:
        if sorted(self.splits) != sorted(SPLITS):
            raise ValueError(
                f"corpus {self.name!r}: splits must be exactly {list(SPLITS)}, got {sorted(self.splits)}"
            )
        for split in SPLITS:
            if not any(self.splits[split]):
                raise ValueError(f"corpus {self.name!r}: split {split!r} is empty (no text)")

    def n_bytes(self, split: str) -> int:
        """Size in bytes of the split's documents (in `encoding`), the denominator of bits per byte."""
        return sum(len(doc.encode(self.encoding)) for doc in self.splits[split])

    def fingerprint(self) -> str:
        """sha256 (hex) of the encoding and every split's documents; changes whenever the text does."""
        h = hashlib.sha256(f"encoding={self.encoding}\n".encode())
        for split in SPLITS:
            docs = self.splits[split]
            h.update(f"{split}:{len(docs)}\n".encode())
            for doc in docs:
                data = doc.encode("utf-8", errors="surrogatepass")
                h.update(len(data).to_bytes(8, "little"))
                h.update(data)
        return h.hexdigest()
