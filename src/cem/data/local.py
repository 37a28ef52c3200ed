"""Corpora from local files: `.txt`, `.jsonl`/`.parquet` (`text` per row), or a directory of them.

A `.txt` file in a directory is one document. A single `.txt` file given as the corpus is cut into
documents at blank lines (paragraphs), or at line ends when it has fewer than `MIN_PARAGRAPHS`
paragraphs; its documents are then hashed 98/1/1 into train/valid/test like a directory's.
Text is read in the given encoding (UTF-8 by default) and a file that does not decode is refused,
naming the file and the byte, never read with replacement characters.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

from cem.data.corpus import SPLITS, Corpus
from cem.data.splitting import hash_split

SUFFIXES = (".txt", ".jsonl", ".parquet")
# File stems that mark a split in a directory ("validation" is accepted for "valid").
_SPLIT_STEMS = {"train": ("train",), "valid": ("valid", "validation"), "test": ("test",)}
VALID_FRAC = TEST_FRAC = 0.01
MIN_PARAGRAPHS = 20
_BLANK_LINES = re.compile(r"\n[ \t]*\n\s*")


def _decode(path: Path, data: bytes, encoding: str) -> str:
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as e:
        raise ValueError(
            f"{path} is not {encoding} text (byte {e.start}: {data[e.start:e.start + 1]!r}); "
            "give its encoding with data_encoding=NAME (e.g. data_encoding=latin-1)"
        ) from None


def split_text(text: str) -> list[str]:
    """A single text file's documents: its paragraphs (blank-line separated), or its non-blank lines when
    there are fewer than MIN_PARAGRAPHS paragraphs."""
    paragraphs = [p for p in _BLANK_LINES.split(text) if p.strip()]
    if len(paragraphs) >= MIN_PARAGRAPHS:
        return paragraphs
    return [line for line in text.splitlines() if line.strip()]


def read_documents(path: Path, encoding: str = "utf-8") -> list[str]:
    """Documents of one file; raises ValueError for an unsupported suffix, text that does not decode, or a
    file without text."""
    docs = list(iter_documents(path, encoding))
    if not any(docs):
        raise ValueError(f"{path} is empty (no text)")
    return docs


def iter_documents(path: Path, encoding: str = "utf-8") -> Iterator[str]:
    """The documents of one file, one at a time: a `.txt` file whole, a `.jsonl` file's `text` per line,
    a `.parquet` file's `text` column in record batches (memory bounded by the batch, not the file)."""
    if path.suffix == ".txt":
        yield _decode(path, path.read_bytes(), encoding)
    elif path.suffix == ".jsonl":
        yield from _iter_jsonl(path, encoding)
    elif path.suffix == ".parquet":
        yield from _iter_parquet(path)
    else:
        raise ValueError(f"{path}: unsupported file type {path.suffix!r} (use one of {', '.join(SUFFIXES)})")


def _iter_jsonl(path: Path, encoding: str = "utf-8") -> Iterator[str]:
    """The `text` field of every non-blank line of a JSON-lines file."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            line = _decode(f"{path}:{lineno}", raw.rstrip(b"\n"), encoding)
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not JSON ({e.msg} at column {e.colno})") from None
            except RecursionError:
                raise ValueError(f"{path}:{lineno}: a JSON value nested too deeply to read") from None
            if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                raise ValueError(f"{path}:{lineno}: expected a JSON object with a string field 'text'")
            yield row["text"]


PARQUET_BATCH_ROWS = 1024


def _iter_parquet(path: Path) -> Iterator[str]:
    """The `text` column of a parquet file, read in record batches."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        file = pq.ParquetFile(path)
        schema = file.schema_arrow
        if "text" not in schema.names:
            raise ValueError(f"{path}: no 'text' column (columns: {schema.names})")
        kind = schema.field("text").type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            raise ValueError(f"{path}: the 'text' column holds {kind}, not strings")
        for batch in file.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=["text"]):
            yield from (t or "" for t in batch.column("text").to_pylist())
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f"{path}: not a readable parquet file ({e})") from None


def load_local(path: Path, encoding: str = "utf-8") -> Corpus:
    """Corpus from a file or directory; splits from train/valid/test files, else hashed 98/1/1 by document."""
    if path.is_dir():
        named = split_files(path)
        if named:
            return Corpus(str(path), {s: read_documents(f, encoding) for s, f in named.items()}, encoding=encoding)
        files = sorted(p for p in path.rglob("*") if p.suffix in SUFFIXES and p.is_file())
        if not files:
            raise ValueError(f"{path}: directory holds no {', '.join(SUFFIXES)} files")
    else:
        files = [path]
    docs, keys = [], []
    for file in files:
        file_docs = read_documents(file, encoding)
        if file.suffix == ".txt" and not path.is_dir():
            file_docs = split_text(file_docs[0])
        rel = file.relative_to(path).as_posix() if path.is_dir() else file.name
        docs += file_docs
        keys += [f"{rel}#{i}" for i in range(len(file_docs))]
    parts = hash_split(keys, VALID_FRAC, TEST_FRAC, source=str(path))
    return Corpus(str(path), {s: [docs[i] for i in parts[s]] for s in SPLITS}, encoding=encoding)


def split_files(directory: Path) -> dict[str, Path]:
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
