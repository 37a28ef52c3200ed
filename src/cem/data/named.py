"""Loaders for the named corpora: shakespeare and python-stdlib (embedded) and files under the data directory."""

from __future__ import annotations

import gzip
import hashlib
import os
from importlib import resources
import re
import sysconfig
import zipfile
import zlib
from pathlib import Path

from cem.data.corpus import SPLITS, Corpus
from cem.data.splitting import hash_split

# char-rnn's tinyshakespeare input.txt: `cem data prepare tinyshakespeare` requires it of the download, and the
# embedded shakespeare.txt.gz is the same bytes
TINYSHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"

STDLIB_MAX_BYTES = 8_000_000
_STDLIB_EXCLUDED_DIRS = {"site-packages", "test", "tests", "idlelib", "lib2to3", "__pycache__"}
# enwik8 train/valid/test sizes in bytes (the standard 90M/5M/5M split of its 10^8 bytes).
ENWIK8_SPLIT_BYTES = (90_000_000, 5_000_000, 5_000_000)
_WIKITEXT_TITLE = re.compile(r"^ = [^=].* = $", re.MULTILINE)
_TINYSTORIES_TRAIN = "TinyStories-train-first1000.txt"
_TINYSTORIES_VALID = "TinyStories-validation-head.txt"
_DATA_HINT = ("`cem data prepare NAME` fetches it, or `cem data prepare NAME --from DIR` copies it from a local folder "
              "of the same layout when offline (docs/data.md, section 'Data directory')")


def _require(data_dir: Path, corpus: str, *candidates: str) -> Path:
    """The first of `candidates` (relative to data_dir) that exists, else a FileNotFoundError saying where to put it."""
    for rel in candidates:
        if (data_dir / rel).is_file():
            return data_dir / rel
    wanted = " or ".join(str(data_dir / rel) for rel in candidates)
    raise FileNotFoundError(
        f"corpus {corpus!r} needs the file {candidates[0]} in the data directory, but {wanted} "
        f"does not exist. Put the file there, or point the data directory at a folder holding "
        f"{candidates[0]} with --data-dir or $CEM_DATA_DIR (now: {data_dir}); {_DATA_HINT.replace('NAME', corpus)}."
    )


def _read_text(path: Path) -> str:
    """UTF-8 text of a file; ValueError if it is empty."""
    text = path.read_text(encoding="utf-8")
    if not text:
        raise ValueError(f"{path} is empty")
    return text


def stdlib_paths(root: Path) -> list[str]:
    """Sorted POSIX paths, relative to `root`, of its `.py` files outside the excluded directories."""
    paths = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _STDLIB_EXCLUDED_DIRS]
        paths += [Path(dirpath, f).relative_to(root).as_posix() for f in filenames if f.endswith(".py")]
    return sorted(paths)


SHAKESPEARE_SPEECHES_PER_DOC = 10


def _gunzip(data: bytes, what: str, fix: str) -> bytes:
    """`data` decompressed; a ValueError naming `what` and saying `fix` when it is not a whole gzip file."""
    try:
        return gzip.decompress(data)
    except (EOFError, OSError, zlib.error) as e:  # cut short; not gzip (BadGzipFile is an OSError); a damaged stream
        raise ValueError(f"{what} is damaged: not a whole gzip file ({e or type(e).__name__}); {fix}") from None


def _embedded(name: str) -> bytes:
    """The bytes of the package's `embedded/NAME.txt.gz`, decompressed (a damaged file: one error naming it)."""
    path = resources.files("cem.data").joinpath(f"embedded/{name}.txt.gz")
    return _gunzip(path.read_bytes(), f"the embedded corpus {path}", "reinstall cem (pip install -e . in the clone)")


def embedded_shakespeare() -> str:
    """The embedded text (`embedded/shakespeare.txt.gz`): char-rnn's tinyshakespeare input.txt, checked against
    the sha256 `cem data prepare` requires of the download (`TINYSHAKESPEARE_SHA256`)."""
    data = _embedded("shakespeare")
    if hashlib.sha256(data).hexdigest() != TINYSHAKESPEARE_SHA256:
        raise ValueError("the embedded shakespeare.txt.gz is not char-rnn's tinyshakespeare input.txt (sha256 mismatch): "
                         "the installed cem package is damaged; reinstall it")
    return data.decode("utf-8")


def load_shakespeare() -> Corpus:
    """Tiny Shakespeare, embedded (`embedded/shakespeare.txt.gz`, public domain; see `embedded/NOTICE`).

    The text is cut after each blank line into speeches (7,224), and runs of SHAKESPEARE_SPEECHES_PER_DOC
    consecutive speeches are the documents (723; they concatenate back to the text exactly). The documents
    are hashed 90/5/5 by index (`hash_split`: 651 train, 36 valid, 36 test), so valid and test are
    scattered passages of the same plays, fixed for every Python version and machine.
    """
    speeches = re.split(r"(?<=\n\n)", embedded_shakespeare())
    n = SHAKESPEARE_SPEECHES_PER_DOC
    docs = ["".join(speeches[i : i + n]) for i in range(0, len(speeches), n)]
    parts = hash_split([str(i) for i in range(len(docs))], 0.05, 0.05, source="embedded shakespeare")
    return Corpus("shakespeare", {s: [docs[i] for i in parts[s]] for s in SPLITS})


def load_python_stdlib() -> Corpus:
    """The interpreter's stdlib `.py` files (sorted, capped at ~8 MB), one document each, hashed 96/2/2 by path.

    Skips site-packages, __pycache__ and test/tests/idlelib/lib2to3 directories; files are
    taken in sorted order of their relative path until the next would pass STDLIB_MAX_BYTES.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    keys, docs, total = [], [], 0
    for rel in stdlib_paths(root):
        data = (root / rel).read_bytes()
        if total + len(data) > STDLIB_MAX_BYTES:
            break
        total += len(data)
        keys.append(rel)
        docs.append(data.decode("utf-8", errors="replace"))
    parts = hash_split(keys, 0.02, 0.02, source=f"python stdlib at {root}")
    return Corpus("python-stdlib", {s: [docs[i] for i in parts[s]] for s in SPLITS})


def load_wikitext2(data_dir: Path) -> Corpus:
    """WikiText-2 from wikitext-2/{train,valid,test}.txt; one document per article, text kept as is.

    An article starts at its title line ` = Title = `; text before the first title joins the
    first article, so the documents concatenate back to the file exactly.
    """
    splits = {}
    for split in SPLITS:
        text = _read_text(_require(data_dir, "wikitext-2", f"wikitext-2/{split}.txt"))
        titles = [m.start() for m in _WIKITEXT_TITLE.finditer(text)]
        starts = [0] + titles[1:]
        splits[split] = [text[a:b] for a, b in zip(starts, starts[1:] + [len(text)])]
    return Corpus("wikitext-2", splits)


def load_tinyshakespeare(data_dir: Path) -> Corpus:
    """Tiny Shakespeare from tinyshakespeare/input.txt, else (no such file in the data directory) from the same
    text embedded in the package (`embedded_shakespeare`): characters split 90% train, 5% valid, 5% test, in order."""
    path = data_dir / "tinyshakespeare/input.txt"
    text = _read_text(path) if path.is_file() else embedded_shakespeare()
    a, b = len(text) * 90 // 100, len(text) * 95 // 100
    return Corpus("tinyshakespeare", {"train": [text[:a]], "valid": [text[a:b]], "test": [text[b:]]})


def load_tinystories(data_dir: Path) -> Corpus:
    """TinyStories subsets from tinystories/ (docs/data.md, 'Data directory'); text kept as is.

    Train: TinyStories-train-first1000.txt, where each story ends with a single newline and
    paragraphs are separated by blank lines; a document ends at a newline that is followed by
    a non-empty line (1,102 documents for the 1,000 stories, as a few stories hold single line
    breaks). Valid/test: TinyStories-validation-head.txt, whose stories and paragraphs are
    both separated by blank lines and so cannot be told apart; it is cut at the blank line
    that halves its blocks, the first half is valid and the second test, one document each.
    """
    train = _read_text(_require(data_dir, "tinystories", f"tinystories/{_TINYSTORIES_TRAIN}"))
    held_out = _read_text(_require(data_dir, "tinystories", f"tinystories/{_TINYSTORIES_VALID}"))
    stories = re.split(r"(?<=[^\n]\n)(?=[^\n])", train)
    block_starts = [0] + [m.end() for m in re.finditer(r"\n\n+", held_out) if m.end() < len(held_out)]
    if len(block_starts) < 2:
        raise ValueError(f"tinystories/{_TINYSTORIES_VALID}: need at least two blank-line separated stories")
    cut = block_starts[len(block_starts) // 2]
    return Corpus("tinystories", {"train": stories, "valid": [held_out[:cut]], "test": [held_out[cut:]]})


def load_enwik8(data_dir: Path) -> Corpus:
    """enwik8 from enwik8/enwik8 (or enwik8.zip / enwik8.gz): bytes split 90M/5M/5M, one document per split.

    The bytes are decoded as latin-1 so that one character is one byte of the file and the
    corpus's `n_bytes` is the byte count of the split (encoding="latin-1").
    """
    path = _require(data_dir, "enwik8", "enwik8/enwik8", "enwik8/enwik8.zip", "enwik8/enwik8.gz")
    if path.suffix == ".zip":
        with zipfile.ZipFile(path) as zf:
            data = zf.read("enwik8")
    elif path.suffix == ".gz":
        data = _gunzip(path.read_bytes(), str(path), "remove it and run `cem data prepare enwik8` again")
    else:
        data = path.read_bytes()
    n_train, n_valid, n_test = ENWIK8_SPLIT_BYTES
    if len(data) != n_train + n_valid + n_test:
        expected = n_train + n_valid + n_test
        raise ValueError(f"{path}: expected {expected:,} bytes of enwik8, got {len(data):,}")
    a, b = n_train, n_train + n_valid
    splits = {"train": [data[:a]], "valid": [data[a:b]], "test": [data[b:]]}
    texts = {s: [d.decode("latin-1") for d in docs] for s, docs in splits.items()}
    return Corpus("enwik8", texts, encoding="latin-1")
