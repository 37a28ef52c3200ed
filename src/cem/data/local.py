"""Corpora from local files: `.txt`, `.jsonl`/`.parquet` (`text` per row), or a directory of them.

A `.txt` file is read incrementally (`text_documents`: memory bounded by MAX_DOC_CHARS, whatever the file's
size) and cut into documents at blank lines, or at a given `separator`; a stretch of more than MAX_DOC_CHARS
characters without one is cut at a line end. A single `.txt` file given as the corpus is always cut so (at
line ends instead when it has fewer than `MIN_PARAGRAPHS` paragraphs); a `.txt` file in a directory is one
document unless it is larger than MAX_DOC_CHARS bytes or a separator is given. The documents are hashed
98/1/1 into train/valid/test, and a split left with few documents, or all from one file, is warned about
(`splitting.warn_thin_split`). Text is read in the given encoding (UTF-8 by default) and a file that does not
decode is refused, naming the file and the byte, never read with replacement characters.
"""

from __future__ import annotations

import codecs
import itertools
import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from cem.data.chunking import MAX_PIECE_CHARS, pieces
from cem.data.corpus import SPLITS, Corpus
from cem.data.splitting import hash_split, warn_thin_split

SUFFIXES = (".txt", ".jsonl", ".parquet")
# File stems that mark a split in a directory ("validation" is accepted for "valid").
_SPLIT_STEMS = {"train": ("train",), "valid": ("valid", "validation"), "test": ("test",)}
VALID_FRAC = TEST_FRAC = 0.01
MIN_PARAGRAPHS = 20
MAX_DOC_CHARS = MAX_PIECE_CHARS  # the longest document cut from a .txt file; a larger file in a folder is cut
READ_BYTES = 1 << 20  # a .txt file is read this many bytes at a time
_BLANK_LINES = re.compile(r"\n[ \t]*\n\s*")


class UndecodableText(ValueError):
    """Text that does not decode in the encoding given; the message names the option that sets it (`flag`)."""

    def __init__(self, where: object, encoding: str, offset: int, byte: bytes, flag: str = "--data-encoding") -> None:
        self.details = (where, encoding, offset, byte)
        super().__init__(f"{where} is not {encoding} text (byte {offset}: {byte!r}); "
                         f"give its encoding with {flag} NAME (e.g. {flag} latin-1)")

    def with_flag(self, flag: str) -> UndecodableText:
        """The same error naming `flag` (the option of the command in use) as the way to give the encoding."""
        return UndecodableText(*self.details, flag=flag)


def _undecodable(path: object, encoding: str, e: UnicodeError, data: bytes, base: int = 0) -> UndecodableText:
    """The UndecodableText of a decoding error `e` of `data` (which starts at byte `base` of `path`): at the byte a
    UnicodeDecodeError names, else (a codec that refuses the whole text, UTF-16 without its byte-order mark) at
    `data`'s first."""
    start = e.start if isinstance(e, UnicodeDecodeError) else 0
    return UndecodableText(path, encoding, base + start, bytes(data[start : start + 1]))


def _decode(path: object, data: bytes, encoding: str) -> str:
    try:
        return data.decode(encoding)
    except UnicodeError as e:
        raise _undecodable(path, encoding, e, data) from None


def _read_text(path: Path, encoding: str) -> Iterator[str]:
    """The text of a file, decoded READ_BYTES at a time."""
    decoder, offset = codecs.getincrementaldecoder(encoding)(), 0
    with open(path, "rb") as f:
        while True:
            data = f.read(READ_BYTES)
            pending = len(decoder.getstate()[0])
            try:
                yield decoder.decode(data, final=not data)
            except UnicodeError as e:
                raise _undecodable(path, encoding, e, getattr(e, "object", data), offset - pending) from None
            if not data:
                return
            offset += len(data)


def cut_documents(chunks: Iterable[str], separator: str | None = None) -> Iterator[str]:
    """The non-blank documents of the text that `chunks` concatenate to: the stretches between separators
    (blank lines when `separator` is None), each cut at line ends into pieces of at most MAX_DOC_CHARS."""
    if separator == "":
        raise ValueError("the document separator is empty")
    pattern = _BLANK_LINES if separator is None else re.compile(re.escape(separator))
    rest = ""
    for chunk in chunks:
        rest += chunk
        start = 0
        for m in pattern.finditer(rest):
            if m.end() == len(rest):  # the separator may go on in the next chunk
                break
            yield from _pieces(rest[start : m.start()])
            start = m.end()
        *whole, rest = pieces(rest[start:], MAX_DOC_CHARS) if len(rest) - start > MAX_DOC_CHARS else [rest[start:]]
        yield from filter(str.strip, whole)
    for doc in pattern.split(rest):
        yield from _pieces(doc)


def _pieces(doc: str) -> Iterator[str]:
    return filter(str.strip, pieces(doc, MAX_DOC_CHARS))


def text_documents(path: Path, encoding: str = "utf-8", separator: str | None = None) -> Iterator[str]:
    """The documents of a `.txt` file (`cut_documents`), read incrementally: memory bounded by MAX_DOC_CHARS."""
    return cut_documents(_read_text(path, encoding), separator)


def single_file_documents(path: Path, encoding: str = "utf-8", separator: str | None = None) -> Iterator[str]:
    """The documents of a `.txt` file that is the whole corpus: its paragraphs (or pieces between `separator`s),
    or its non-blank lines when it has fewer than MIN_PARAGRAPHS paragraphs."""
    docs = text_documents(path, encoding, separator)
    head = list(itertools.islice(docs, MIN_PARAGRAPHS))
    if len(head) < MIN_PARAGRAPHS and separator is None:
        return iter([line for doc in head for line in doc.splitlines() if line.strip()])
    return itertools.chain(head, docs)


def is_one_document(path: Path, separator: str | None) -> bool:
    """Whether a file in a folder is one document: a `.txt` file of at most MAX_DOC_CHARS bytes, no separator given."""
    return path.suffix == ".txt" and separator is None and path.stat().st_size <= MAX_DOC_CHARS


def read_documents(path: Path, encoding: str = "utf-8", separator: str | None = None, alone: bool = False) -> list[str]:
    """Documents of one file (`iter_documents`); raises ValueError for an unsupported suffix, text that does
    not decode, or a file without text."""
    docs = list(iter_documents(path, encoding, separator, alone))
    if not any(doc.strip() for doc in docs):
        raise ValueError(f"{path} is empty (no text, or only blank lines)")
    return docs


def iter_documents(path: Path, encoding: str = "utf-8", separator: str | None = None, alone: bool = False) -> Iterator[str]:
    """The documents of one file, one at a time: a `.txt` file's as the module docstring says (`alone`: it is
    the whole corpus), a `.jsonl` file's `text` per line, a `.parquet` file's `text` column in record batches
    (memory bounded by the batch, not the file)."""
    if path.suffix == ".txt":
        if alone:
            yield from single_file_documents(path, encoding, separator)
        elif is_one_document(path, separator):
            yield _decode(path, path.read_bytes(), encoding)
        else:
            yield from text_documents(path, encoding, separator)
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
            except ValueError as e:  # an integer of more than 4300 digits
                raise ValueError(f"{path}:{lineno}: not readable JSON ({str(e).split(';')[0]})") from None
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


def corpus_files(path: Path) -> list[tuple[str, Path]]:
    """The files of a corpus without split files, each with its name in document keys (`rel#i`)."""
    if not path.is_dir():
        return [(path.name, path)]
    files = sorted(p for p in path.rglob("*") if p.suffix in SUFFIXES and p.is_file())
    if not files:
        raise ValueError(f"{path}: directory holds no {', '.join(SUFFIXES)} files")
    return [(f.relative_to(path).as_posix(), f) for f in files]


def load_local(path: Path, encoding: str = "utf-8", separator: str | None = None) -> Corpus:
    """Corpus from a file or directory; splits from train/valid/test files, else hashed 98/1/1 by document
    (`separator`: what ends a document in `.txt` files, as the module docstring says)."""
    named = split_files(path) if path.is_dir() else {}
    if named:
        return Corpus(str(path), {s: read_documents(f, encoding, separator) for s, f in named.items()}, encoding=encoding)
    files = corpus_files(path)
    docs, keys, origin = [], [], []
    for rel, file in files:
        file_docs = read_documents(file, encoding, separator, alone=not path.is_dir())
        docs += file_docs
        keys += [f"{rel}#{i}" for i in range(len(file_docs))]
        origin += [rel] * len(file_docs)
    parts = hash_split(keys, VALID_FRAC, TEST_FRAC, source=str(path))
    for split, indices in parts.items():
        sources = {origin[i] for i in indices}
        warn_thin_split(str(path), split, len(indices), sources.pop() if len(sources) == 1 else None, len(files))
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
