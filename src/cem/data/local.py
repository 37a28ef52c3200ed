"""Corpora from local files: `.txt` (one document), `.jsonl`/`.parquet` (`text` per row), or a directory of them."""

from __future__ import annotations

import json
from pathlib import Path

from cem.data.corpus import SPLITS, Corpus
from cem.data.splitting import hash_split

SUFFIXES = (".txt", ".jsonl", ".parquet")
# File stems that mark a split in a directory ("validation" is accepted for "valid").
_SPLIT_STEMS = {"train": ("train",), "valid": ("valid", "validation"), "test": ("test",)}
VALID_FRAC = TEST_FRAC = 0.01


def read_documents(path: Path) -> list[str]:
    """Documents of one file; raises ValueError for an unsupported suffix or a file without text."""
    if path.suffix == ".txt":
        docs = [path.read_text(encoding="utf-8", errors="replace")]
    elif path.suffix == ".jsonl":
        docs = _read_jsonl(path)
    elif path.suffix == ".parquet":
        docs = _read_parquet(path)
    else:
        raise ValueError(f"{path}: unsupported file type {path.suffix!r} (use one of {', '.join(SUFFIXES)})")
    if not any(docs):
        raise ValueError(f"{path} is empty (no text)")
    return docs


def _read_jsonl(path: Path) -> list[str]:
    """The `text` field of every non-blank line of a JSON-lines file."""
    docs = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                raise ValueError(f"{path}:{lineno}: expected a JSON object with a string field 'text'")
            docs.append(row["text"])
    return docs


def _read_parquet(path: Path) -> list[str]:
    """The `text` column of a parquet file."""
    import pyarrow.parquet as pq

    schema = pq.read_schema(path)
    if "text" not in schema.names:
        raise ValueError(f"{path}: no 'text' column (columns: {schema.names})")
    return [t or "" for t in pq.read_table(path, columns=["text"]).column("text").to_pylist()]


def load_local(path: Path) -> Corpus:
    """Corpus from a file or directory; splits from train/valid/test files, else hashed 98/1/1 by document."""
    if path.is_dir():
        split_files = _split_files(path)
        if split_files:
            return Corpus(str(path), {s: read_documents(f) for s, f in split_files.items()})
        files = sorted(p for p in path.rglob("*") if p.suffix in SUFFIXES and p.is_file())
        if not files:
            raise ValueError(f"{path}: directory holds no {', '.join(SUFFIXES)} files")
    else:
        files = [path]
    docs, keys = [], []
    for file in files:
        file_docs = read_documents(file)
        rel = file.relative_to(path).as_posix() if path.is_dir() else file.name
        docs += file_docs
        keys += [f"{rel}#{i}" for i in range(len(file_docs))]
    parts = hash_split(keys, VALID_FRAC, TEST_FRAC, source=str(path))
    return Corpus(str(path), {s: [docs[i] for i in parts[s]] for s in SPLITS})


def _split_files(directory: Path) -> dict[str, Path]:
    """The train/valid/test files directly in `directory`, or {} when it has none of them."""
    found: dict[str, list[Path]] = {s: [] for s in SPLITS}
    for file in directory.iterdir():
        for split, stems in _SPLIT_STEMS.items():
            if file.stem in stems and file.suffix in SUFFIXES:
                found[split].append(file)
    if not any(found.values()):
        return {}
    for split, files in found.items():
        if len(files) != 1:
            names = [f.name for f in files] or "none"
            raise ValueError(
                f"{directory}: with split files, each of train/valid/test needs exactly one file "
                f"({', '.join(SUFFIXES)}); found for {split!r}: {names}"
            )
    return {s: files[0] for s, files in found.items()}
