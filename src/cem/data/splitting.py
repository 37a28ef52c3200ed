"""Deterministic assignment of documents to train/valid/test by hashing their keys."""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Sequence

FEW_DOCUMENTS = 5  # a hashed split with fewer documents than this is warned about


def hash_split(
    keys: Sequence[str], valid_frac: float, test_frac: float, source: str
) -> dict[str, list[int]]:
    """Indices of `keys` per split: rank keys by sha256, the lowest ranks go to test, then valid.

    Test and valid get `max(1, round(n * frac))` items each, train the rest, so with at
    least 3 keys every split is non-empty. Indices keep their original order within a split.
    """
    n = len(keys)
    if n < 3:
        raise ValueError(
            f"{source}: has {n} document(s), but at least 3 are needed to split it into "
            "train/valid/test; add documents or provide train/valid/test files"
        )
    order = sorted(range(n), key=lambda i: hashlib.sha256(keys[i].encode("utf-8")).digest())
    n_test = max(1, round(n * test_frac))
    n_valid = max(1, round(n * valid_frac))
    if n_test + n_valid >= n:
        raise ValueError(f"{source}: {n} documents are too few for the valid/test fractions")
    return {
        "train": sorted(order[n_test + n_valid :]),
        "valid": sorted(order[n_test : n_test + n_valid]),
        "test": sorted(order[:n_test]),
    }


def split_of(key: str, valid_frac: float, test_frac: float) -> str:
    """The split of one document of a stream too long to rank (`hash_split` ranks all keys): its key's
    sha256 read as a fraction u in [0, 1) puts it in test when u < test_frac, valid when u < test_frac +
    valid_frac, else train. The same key always lands in the same split; the split sizes are then about,
    not exactly, the fractions."""
    u = int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") / 2**64
    return "test" if u < test_frac else "valid" if u < test_frac + valid_frac else "train"


def warn_thin_split(source: str, split: str, n_docs: int, one_file: str | None, n_files: int) -> None:
    """One line on stderr when a hashed split got fewer than FEW_DOCUMENTS documents, or all of them from one
    file (`one_file`) of a corpus of `n_files` files: its loss would measure little more than that text."""
    if n_docs < FEW_DOCUMENTS:
        what = f"only {n_docs} document{'s' * (n_docs != 1)}" if n_docs else "no documents"
    elif one_file is not None and n_files > 1:
        what = f"all its {n_docs} documents from one file ({one_file}) of {n_files}"
    else:
        return
    print(f"warning: {source}: the {split} split has {what}; give more documents (or --doc-separator to cut files "
          "into more) or train/valid/test files", file=sys.stderr)
