"""The `Corpus` container: a named set of documents for the train, valid and test splits."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

SPLITS = ("train", "valid", "test")


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
